// Loss scaling (docs/spec.md §5): the loss is multiplied by alpha = 2^k before backward; the
// gradients are divided by alpha in float32 before the optimizer step. The setting itself
// (method, parameters, their one-line form) is loss_scale_spec.hpp.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <vector>

#include "fp8lab/settings/loss_scale_spec.hpp"

namespace fp8lab::nn {

struct LossScaleStep {
  double scale = 1;         // alpha the gradients were scaled by (and are now unscaled from)
  bool overflow = false;    // a gradient held NaN or Inf
  bool skipped = false;     // the optimizer step must be skipped
  double log2_max_grad = 0; // log2 max |grad| after unscaling (-inf if all zero)
};

class LossScaler {
 public:
  explicit LossScaler(LossScaleConfig cfg = {});
  double scale() const;  // alpha for this step's loss
  int log2_scale() const { return log2_; }
  // After backward on loss * scale(): checks `grads` for NaN/Inf, divides them by alpha in
  // place, decides whether the step is taken and sets alpha for the next step.
  LossScaleStep update(const std::vector<torch::Tensor>& grads);
  // The same decision from a given log2 max |grad| (unscaled) and overflow flag; what
  // update() calls after looking at the tensors. Exposed for tests and replay.
  LossScaleStep update_from(double log2_max_grad, bool overflow);
  std::uint64_t skipped_steps() const { return skipped_; }
  std::uint64_t steps() const { return steps_; }
  const LossScaleConfig& config() const { return cfg_; }
  double mu() const;
  // The whole mutable state as numbers (for checkpoints); set_state(state()) restores it.
  std::vector<double> state() const;
  void set_state(const std::vector<double>& s);
  double sigma() const;

 private:
  void set_log2(int k);
  LossScaleConfig cfg_;
  int log2_ = 0;
  std::uint64_t clean_ = 0, skipped_ = 0, steps_ = 0;
  double ema1_ = 0, ema_x_ = 0, ema_x2_ = 0, corr1_ = 1, corr2_ = 1;
};

}  // namespace fp8lab::nn
