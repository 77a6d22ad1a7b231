// A training run as one value (private to src/train): TrainState is everything a run
// carries from one step to the next besides the model's and the optimizer's own state, and
// a checkpoint is the run's config, its TrainState, the model and the optimizer, written
// and read by the one pair of functions below.
#pragma once

#include <torch/torch.h>

#include <array>
#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "fp8lab/core/codec.hpp"
#include "fp8lab/nn/ops.hpp"
#include "fp8lab/settings/recipe.hpp"

namespace fp8lab::train {

// 2: TrainState as one JSON value beside the model, optimizer, EMA and recent weights; the
// file is one header line (`fp8lab-checkpoint bytes=N fnv1a64=H`) and the archive, whose
// length and checksum are verified before anything is read from it.
inline constexpr int kCheckpointSchema = 2;

using LossScaleTrace = std::vector<std::tuple<std::int64_t, int, bool>>;  // (step, log2 scale, skipped)
using Weights = std::vector<torch::Tensor>;  // a model's parameters then buffers

struct TrainState {
  std::int64_t step = 0;        // steps taken
  double loss_ema = 0;          // moving average of the training loss
  std::vector<double> scaler;   // nn::LossScaler::state()
  std::vector<std::pair<std::int64_t, double>> evals;        // (step, metric)
  std::vector<std::array<QuantCounts, nn::kKinds>> counts;   // per quantized layer, all steps
  std::vector<std::vector<nn::AmaxHistories::History>> histories;  // per quantized layer: delayed scaling
  Weights ema;                  // moving average of the weights (empty: off)
  std::vector<Weights> recent;  // the last K checkpoints' weights, for averaging
  LossScaleTrace trace;         // loss-scale points not yet in a results store
  double seconds = 0;           // wall time of the run's earlier processes
  std::int64_t run_id = 0;      // the run's record ...
  std::string store;            // ... in this store (absolute path; "" : none)
  bool finished = false;        // a finished run's checkpoint: kept, never resumed
  int processes = 1;            // the data-parallel processes that wrote the checkpoint
};

// Writes the checkpoint atomically (a partial file never replaces `path`).
void save_checkpoint(const std::string& path, const std::string& config_json, const TrainState& state,
                     torch::nn::Module& model, torch::optim::Optimizer& optimizer);

// A checkpoint read back: its TrainState now, the model and optimizer once they are built.
class Checkpoint {
 public:
  // What the checkpoint is read for: to resume its run, or to evaluate its weights (a
  // finished run's too, with a config that may differ in the keys evaluation_keys() names).
  enum class Use { resume, evaluate };
  // Throws Error naming `path` when it is missing, unreadable, damaged (length or checksum),
  // of another schema (naming both versions), finished (to resume), or written with a
  // config other than `config_json` (naming the keys that differ).
  Checkpoint(const std::string& path, const std::string& config_json, Use use = Use::resume);
  // The same checks on a checkpoint's archive already in memory (bytes() of another
  // process's Checkpoint); `name` stands for the file in errors.
  struct Archive {};
  static constexpr Archive kArchive{};
  Checkpoint(Archive, const std::string& name, std::string archive, const std::string& config_json);
  // The config keys that change how a model is evaluated but not how it was trained
  // ("train.beam", ...): an evaluation's config may set them otherwise.
  static const std::vector<std::string>& evaluation_keys();

  const std::string& bytes() const { return bytes_; }  // the archive, checked

  const TrainState& state() const { return state_; }
  // Loads the model's and the optimizer's state.
  void restore(torch::nn::Module& model, torch::optim::Optimizer& optimizer);

 private:
  void read(const std::string& config_json, Use use);

  std::string path_;
  std::string bytes_;  // the archive's bytes, which archive_ reads from
  torch::serialize::InputArchive archive_;
  TrainState state_;
};

// Refuses to start a run afresh over the checkpoint of a run that has not finished
// (stopped, killed, or still running): the error names `path`, its step, and the two
// choices, --resume or --restart. No file, or a finished run's checkpoint: nothing to say.
void refuse_unfinished_checkpoint(const std::string& path);

// An exclusive claim on a checkpoint path for one run: `<path>.lock`, locked with flock and
// holding the owner's pid. A second run on the same path, in this process or another, is
// refused with the owner named. Released when the object goes; the lock file stays.
class CheckpointLock {
 public:
  explicit CheckpointLock(const std::string& checkpoint);
  ~CheckpointLock();
  CheckpointLock(const CheckpointLock&) = delete;
  CheckpointLock& operator=(const CheckpointLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace fp8lab::train
