// Loss scaling (docs/spec.md §5): the loss is multiplied by alpha = 2^k before backward; the
// gradients are divided by alpha in float32 before the optimizer step.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fp8lab/nn/recipe.hpp"

namespace fp8lab::nn {

enum class LossScaleMethod : std::uint8_t { none, fixed, backoff, logmax };
std::string_view to_string(LossScaleMethod m);

struct LossScaleConfig {
  LossScaleMethod method = LossScaleMethod::none;
  int init_log2 = 0;          // alpha = 2^init_log2 at the start (the static scale for `fixed`)
  int min_log2 = -64, max_log2 = 64;
  // Backoff: on NaN/Inf skip the step and divide alpha by 2^backoff_log2_factor; after
  // `interval` clean steps in a row multiply it by the same.
  int interval = 2000;
  int backoff_log2_factor = 1;
  // LogMax: log2 alpha = floor(log2(grad_format_max) - (mu + c sigma)), with mu and sigma
  // of l = log2 max|grad_w| estimated by bias-corrected exponential moving averages
  // (rate beta1 for the mean, beta2 for the variance, as OpenSeq2Seq's LogMax scaler).
  double c = 0;
  double beta1 = 0.99, beta2 = 0.999;
  double grad_format_max = 57344.0;  // largest value of the gradient format
};

// "none", "static:22", "backoff", "backoff:init=16,interval=2000", "logmax:c=1,init=10", ...
LossScaleConfig parse_loss_scale(std::string_view text);
std::string to_string(const LossScaleConfig& c);

// LogMax aims at the largest value of the recipe's gradient format (grad_x's, when it has a
// fixed bias); a scaled gradient quantizer has no fixed range to aim at, so the configured
// target stays.
LossScaleConfig with_recipe_target(LossScaleConfig c, const Recipe& recipe);
// Backoff only sees overflow as NaN/Inf: with a fixed-bias gradient quantizer that
// saturates, the scale can only grow.
bool backoff_blind_to_overflow(const LossScaleConfig& c, const Recipe& recipe);

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
