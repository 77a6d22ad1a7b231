// The trainer behind `fp8lab train` and `fp8lab quickstart`: a TrainConfig in, a trained
// model and a recorded run out. One step reads:
//   x, y   = batch(step)                         (per-epoch permutation, augmentation, mixup)
//   loss   = cross_entropy(model(x), y)          (quantized layers per the recipe)
//   backward(loss * scale);  unscale, check      (loss scaling: skip on overflow)
//   optimizer.step(lr(step));  ema.update()
// Every random choice of step s is drawn from streams seeded by (seed, s), so a run resumed
// from a checkpoint takes exactly the steps the uninterrupted run takes.
//
// A run changes no process-wide state behind its caller: libtorch's thread count and the
// CPU's flush-to-zero mode are set from the config (threads, train.flush_denormals) for the
// run's duration and restored when train() returns (nn/runtime.hpp).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "fp8lab/core/codec.hpp"
#include "fp8lab/core/stop.hpp"  // request_stop: a running trainer stops at the next step
#include "fp8lab/train/registry.hpp"  // load_train_config: the configs train() takes
#include "fp8lab/settings/recipe.hpp"
#include "fp8lab/results/store.hpp"

namespace fp8lab::train {

class World;  // world.hpp

struct TrainOptions {
  bool resume = false;          // continue from the checkpoint (an error if there is none)
  bool restart = false;         // start afresh even over an unfinished run's checkpoint
                                // (without it, such a checkpoint is an error naming both choices)
  std::int64_t stop_after = 0;  // > 0: stop after this many steps of this process, with a
                                // checkpoint and status stopped (resume later)
  bool progress = true;         // the progress bar on stderr
  bool checkpoints = true;      // write checkpoints (false: a run that cannot be resumed)
  // The processes of a data-parallel run (world.hpp), every one calling train() with the
  // same config; null: this process alone. Rank 0 alone writes the store and checkpoints
  // (the others pass no store) and reads the checkpoint to resume from, which it sends to
  // the others. train.micro_batches must be a multiple of the world's size.
  World* world = nullptr;
  // Gradients leave in buckets of about this many bytes (float32), overlapping the backward
  // pass with one shard per process (docs/training.md); 0: all after the backward pass.
  std::int64_t bucket_bytes = std::int64_t{1} << 20;
};

struct TrainResult {
  results::RunStatus status = results::RunStatus::finished;  // finished, diverged, stopped
  std::string metric_name = "test_accuracy";  // with "_averaged" where it is the averaged weights'
  double final_metric = 0;          // top-1 accuracy, percent (of the EMA / averaged weights if on)
  std::vector<std::pair<std::int64_t, double>> evals;  // (step, metric)
  double final_train_loss = 0;      // moving average of the training loss
  int final_log2_scale = 0;
  std::uint64_t skipped_steps = 0;
  std::int64_t steps = 0, total_steps = 0;
  std::array<QuantCounts, nn::kKinds> counts{};  // summed over quantized layers and steps
  // Products of the quantized layers by the path they took (quant.compute, docs/spec.md §7),
  // summed over layers and steps of this call.
  std::int64_t products_fp32 = 0, products_bf16 = 0;
  double seconds = 0;            // wall time, over every process a resumed run ran in
  double samples_per_second = 0; // training throughput of this call: the steps after its
                                 // first, without evaluation and checkpoint time
  double eval_seconds = 0;        // wall time of this call's evaluations, the final one included
  double final_eval_seconds = 0;  // of the final evaluation alone (translation: decoding the test
                                  // set; with train.average_last, both of its evaluations)
  // Data-parallel runs: this process's time in collectives and bytes it sent, per step of
  // this call (0 for one process).
  double comm_seconds_per_step = 0;
  double comm_bytes_per_step = 0;
  double comm_gradient_bytes_per_step = 0;  // of which gradients (codes and scales)
  int processes = 1;
  // FNV-1a 64 over the final model's parameters and buffers, in module order: two runs
  // ended with the same weights exactly when these agree (up to hash collisions).
  std::uint64_t weights_fnv = 0;
  std::int64_t run_id = 0;       // in the store, when one was given
  std::string model_description;
  std::string checkpoint;        // the checkpoint file written, if any
};

// Trains per `cfg`. With a store the run is recorded as it goes; an exception marks it
// failed before propagating. A NaN/Inf loss that loss scaling cannot recover ends it as
// diverged (not an exception).
TrainResult train(const settings::TrainConfig& cfg, results::Store* store = nullptr, const TrainOptions& opt = {});

// The decay of the weights' moving average after step `step` (0-based) with train.ema =
// `ema`: min(ema, (1 + step) / (10 + step)), the warm-up of TensorFlow's
// ExponentialMovingAverage with num_updates (the EfficientNet reference's). A fixed 0.999
// would keep a quarter of the initial weights and batch-norm statistics after 1,400 steps.
double ema_decay(double ema, std::int64_t step);

// The evaluation of a run's checkpoint (finished or not): its weights (the EMA weights if
// train.ema is on), then the average of its last checkpoints' weights if train.average_last
// is on, each on the final evaluation's data (translation: the test set).
struct EvaluateOptions {
  std::string checkpoint;            // "" : the config's (checkpoint_path)
  bool reference_decoding = false;   // translation: the reference decoders (recomputing)
};
struct Evaluation {
  std::int64_t step = 0;                                  // the checkpoint's
  std::vector<std::pair<std::string, double>> metrics;    // (name, value): test_bleu[, test_bleu_averaged]
  double seconds = 0;                                     // wall time of the evaluations
  std::vector<std::string> outputs;                       // of the last (translation: hypotheses)
  std::string model_description;
};
// The config must be the run's, except in the keys Checkpoint::evaluation_keys() names
// (train.beam, data.test_limit, quant.compute, ...); anything else is an Error naming them.
Evaluation evaluate_checkpoint(const settings::TrainConfig& cfg, const EvaluateOptions& opt = {});

// Throws Error unless `processes` can share train.micro_batches = `micro_batches` (a
// multiple of it), saying which value to set.
void check_process_count(int micro_batches, int processes);

// The learning rate of 0-based `step` of `total` under the config's schedule.
double learning_rate(const settings::TrainConfig& cfg, std::int64_t step, std::int64_t total, std::int64_t steps_per_epoch);

// The checkpoint path a config uses: train.checkpoint, or "<name>.ckpt".
std::string checkpoint_path(const settings::TrainConfig& cfg);

}  // namespace fp8lab::train
