#include "fp8lab/nn/loss_scale.hpp"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "fp8lab/core/error.hpp"

namespace fp8lab::nn {

LossScaler::LossScaler(LossScaleConfig cfg) : cfg_(cfg) {
  set_log2(cfg_.method == LossScaleMethod::none ? 0 : cfg_.init_log2);
}

void LossScaler::set_log2(int k) { log2_ = std::clamp(k, cfg_.min_log2, cfg_.max_log2); }

double LossScaler::scale() const { return std::ldexp(1.0, log2_); }

std::vector<double> LossScaler::state() const {
  return {static_cast<double>(log2_), static_cast<double>(clean_), static_cast<double>(skipped_),
          static_cast<double>(steps_), ema1_, ema_x_, ema_x2_, corr1_, corr2_};
}

void LossScaler::set_state(const std::vector<double>& s) {
  if (s.size() != 9) throw Error("loss scaler state: expected 9 numbers, got " + std::to_string(s.size()));
  log2_ = static_cast<int>(s[0]);
  clean_ = static_cast<std::uint64_t>(s[1]);
  skipped_ = static_cast<std::uint64_t>(s[2]);
  steps_ = static_cast<std::uint64_t>(s[3]);
  ema1_ = s[4], ema_x_ = s[5], ema_x2_ = s[6], corr1_ = s[7], corr2_ = s[8];
}

double LossScaler::mu() const { return corr1_ < 1 ? ema1_ / (1 - corr1_) : 0; }
double LossScaler::sigma() const {
  if (corr2_ >= 1) return 0;
  const double m = ema_x_ / (1 - corr2_), m2 = ema_x2_ / (1 - corr2_);
  return std::sqrt(std::max(0.0, m2 - m * m));
}

LossScaleStep LossScaler::update_from(double l, bool overflow) {
  LossScaleStep s;
  s.scale = scale();
  s.overflow = overflow;
  s.log2_max_grad = l;
  ++steps_;
  switch (cfg_.method) {
    case LossScaleMethod::none:
    case LossScaleMethod::fixed:
      s.skipped = false;  // no recovery: a NaN reaches the optimizer (and the run diverges)
      break;
    case LossScaleMethod::backoff:
      if (overflow) {
        s.skipped = true;
        clean_ = 0;
        set_log2(log2_ - cfg_.backoff_log2_factor);
      } else if (++clean_ >= static_cast<std::uint64_t>(cfg_.interval)) {
        clean_ = 0;
        set_log2(log2_ + cfg_.backoff_log2_factor);
      }
      break;
    case LossScaleMethod::logmax:
      if (overflow) {
        // Gradients saturate under LogMax, so a NaN/Inf is a real overflow: skip and back off.
        s.skipped = true;
        set_log2(log2_ - 1);
        break;
      }
      if (std::isfinite(l)) {
        ema1_ = cfg_.beta1 * ema1_ + (1 - cfg_.beta1) * l;
        corr1_ *= cfg_.beta1;
        ema_x_ = cfg_.beta2 * ema_x_ + (1 - cfg_.beta2) * l;
        ema_x2_ = cfg_.beta2 * ema_x2_ + (1 - cfg_.beta2) * l * l;
        corr2_ *= cfg_.beta2;
        const double k = std::floor(std::log2(cfg_.grad_format_max) - (mu() + cfg_.c * sigma()));
        set_log2(static_cast<int>(std::clamp(k, -1e6, 1e6)));
      }
      break;
  }
  if (s.skipped) ++skipped_;
  return s;
}

LossScaleStep LossScaler::update(const std::vector<torch::Tensor>& grads) {
  torch::NoGradGuard no_grad;
  const double alpha = scale();
  bool overflow = false;
  double maxabs = 0;
  for (const auto& g : grads) {
    if (!g.defined() || g.numel() == 0) continue;
    const double m = g.abs().max().item<double>();  // NaN propagates through max
    if (!std::isfinite(m)) overflow = true;
    else maxabs = std::max(maxabs, m);
  }
  if (alpha != 1.0)
    for (const auto& g : grads)
      if (g.defined()) const_cast<torch::Tensor&>(g).div_(alpha);
  const double l = maxabs > 0 ? std::log2(maxabs / alpha) : -std::numeric_limits<double>::infinity();
  return update_from(l, overflow);
}

}  // namespace fp8lab::nn
