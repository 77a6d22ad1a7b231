// Loss scaling as a setting (docs/spec.md §5): the method and its parameters, parsed from
// and printed to their one-line form. No libtorch: the config layer and the fuzz targets
// use it; the scaler that runs it is loss_scale.hpp.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "fp8lab/settings/recipe.hpp"

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
  friend bool operator==(const LossScaleConfig&, const LossScaleConfig&) = default;
};

// METHOD[:KEY=VALUE,...]: "none", "static:22" (log2 of the scale), "backoff",
// "backoff:init=16,interval=2000,factor=2", "logmax:c=1,init=10,beta1=0.99,beta2=0.999,max=57344";
// min_log2 and max_log2 for every method but none. Errors name the text and the key.
LossScaleConfig parse_loss_scale(std::string_view text);
// The one-line form, every value that differs from the method's default written out:
// parse_loss_scale(to_string(c)) == c.
std::string to_string(const LossScaleConfig& c);

// LogMax aims at the largest value of the recipe's gradient format (grad_x's, when it has a
// fixed bias); a scaled gradient quantizer has no fixed range to aim at, so the configured
// target stays.
LossScaleConfig with_recipe_target(LossScaleConfig c, const Recipe& recipe);
// Backoff only sees overflow as NaN/Inf: with a fixed-bias gradient quantizer that
// saturates, the scale can only grow.
bool backoff_blind_to_overflow(const LossScaleConfig& c, const Recipe& recipe);

}  // namespace fp8lab::nn
