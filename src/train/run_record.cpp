#include "run_record.hpp"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "fp8lab/train/stat_rows.hpp"

namespace fp8lab::train {

namespace fs = std::filesystem;

RunRecord::RunRecord(results::Store* store, const settings::TrainConfig& cfg, const std::string& config_json,
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

namespace {

// {"lo": e_lo, "counts": [n(e_lo), ..., n(e_hi)]}: the histogram's bins from its lowest to
// its highest nonzero exponent (lo 0 and no counts when empty).
nlohmann::json exponent_range(const kernels::ExpHistogram& hist) {
  const kernels::ExpRange r = kernels::nonzero_range(hist);
  return {{"lo", r.lo}, {"counts", r.counts}};
}

}  // namespace

std::vector<results::Store::StatRow> stat_rows(std::vector<nn::TensorStats> records) {
  std::vector<results::Store::StatRow> rows;
  for (const auto& s : records) {
    results::Store::StatRow r;
    r.step = static_cast<std::int64_t>(s.step);
    r.layer = s.layer;
    r.kind = std::string(nn::to_string(s.kind));
    r.total = s.counts.total;
    r.overflow = s.counts.overflow;
    r.underflow = s.counts.underflow;
    r.nan = s.counts.nan;
    r.absmax = s.absmax;
    nlohmann::json h = exponent_range(s.hist);
    h["zero"] = s.hist.zero;
    h["inf"] = s.hist.inf;
    h["nan"] = s.hist.nan;
    if (s.scaled) {  // block-level figures (docs/spec.md §6.6)
      const ScaledCounts& g = s.groups;
      h["groups"] = {{"total", g.groups},       {"saturated", g.saturated_groups},
                     {"zero", g.zero_groups},   {"nan", g.nan_groups},
                     {"scale_underflow", g.scale_underflow}, {"scale_overflow", g.scale_overflow}};
      h["scales"] = exponent_range(s.scale_hist);
    }
    r.histogram = h.dump();
    rows.push_back(std::move(r));
  }
  return rows;
}

}  // namespace fp8lab::train
