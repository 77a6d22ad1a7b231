#include "run_record.hpp"

#include <filesystem>

namespace fp8lab::experiments {

namespace fs = std::filesystem;

RunRecord::RunRecord(results::Store* store, const TrainConfig& cfg, const std::string& config_json,
                     const TrainState* resumed)
    : store_(store) {
  if (!store_) return;
  if (resumed && resumed->run_id > 0 && resumed->store == store_path()) {
    id_ = resumed->run_id;
    store_->resume_run(id_, resumed->step);
    return;
  }
  results::RunInfo info;
  info.name = cfg.name;
  info.kind = cfg.task;
  info.config_json = config_json;
  info.recipe = cfg.quant.recipe.text;
  info.loss_scale = cfg.quant.loss_scale.text;
  info.seed = cfg.seed;
  id_ = store_->begin_run(info);
}

std::string RunRecord::store_path() const { return store_ ? fs::absolute(store_->path()).string() : std::string(); }

void RunRecord::log_metric(std::int64_t step, const std::string& name, double value) {
  if (store_) store_->log_metric(id_, step, name, value);
}

void RunRecord::log_stats(const std::vector<results::Store::StatRow>& rows) {
  if (store_ && !rows.empty()) store_->log_stats(id_, rows);
}

void RunRecord::flush_trace(LossScaleTrace& trace) {
  if (!store_ || trace.empty()) return;
  store_->log_loss_scale(id_, trace);
  trace.clear();
}

void RunRecord::finish(results::RunStatus status, std::optional<double> metric, const std::string& metric_name,
                       double seconds) {
  if (store_) store_->finish_run(id_, status, metric, metric_name, seconds);
}

}  // namespace fp8lab::experiments
