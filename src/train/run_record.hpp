// A training run's record in the results store (private to src/train): begun or taken
// up again when the run starts, written to as it goes, closed with its status. Without a
// store every call does nothing, and the loss-scale trace stays with the run's state.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "fp8lab/settings/config.hpp"
#include "fp8lab/results/store.hpp"
#include "train_state.hpp"

namespace fp8lab::train {

class RunRecord {
 public:
  // The record of `resumed` when it was written into this same store, else a new one.
  RunRecord(results::Store* store, const settings::TrainConfig& cfg, const std::string& config_json, const TrainState* resumed);

  std::int64_t id() const { return id_; }
  std::string store_path() const;  // absolute; "" without a store

  void log_metric(std::int64_t step, const std::string& name, double value);
  void log_stats(const std::vector<results::Store::StatRow>& rows);
  // Moves the points of `trace` into the store (without one they stay in `trace`).
  void flush_trace(LossScaleTrace& trace);
  void finish(results::RunStatus status, std::optional<double> metric, const std::string& metric_name,
              double seconds);

 private:
  results::Store* store_;
  std::int64_t id_ = 0;
};

}  // namespace fp8lab::train
