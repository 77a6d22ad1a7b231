// The optimizers and learning-rate schedules a config names (registry.hpp).
#include <torch/torch.h>

#include <cmath>

#include "fp8lab/train/registry.hpp"
#include "fp8lab/train/trainer.hpp"

namespace fp8lab::train {

namespace {

std::unique_ptr<torch::optim::Optimizer> make_sgd(const settings::OptimizerConfig& o, std::vector<torch::Tensor> params) {
  return std::make_unique<torch::optim::SGD>(
      params, torch::optim::SGDOptions(o.lr).momentum(o.momentum).nesterov(o.nesterov).weight_decay(o.weight_decay));
}
std::unique_ptr<torch::optim::Optimizer> make_adam(const settings::OptimizerConfig& o, std::vector<torch::Tensor> params) {
  return std::make_unique<torch::optim::Adam>(
      params, torch::optim::AdamOptions(o.lr).betas({o.beta1, o.beta2}).eps(o.eps).weight_decay(o.weight_decay));
}
std::unique_ptr<torch::optim::Optimizer> make_adamw(const settings::OptimizerConfig& o, std::vector<torch::Tensor> params) {
  return std::make_unique<torch::optim::AdamW>(
      params, torch::optim::AdamWOptions(o.lr).betas({o.beta1, o.beta2}).eps(o.eps).weight_decay(o.weight_decay));
}
std::unique_ptr<torch::optim::Optimizer> make_rmsprop(const settings::OptimizerConfig& o, std::vector<torch::Tensor> params) {
  return std::make_unique<torch::optim::RMSprop>(
      params,
      torch::optim::RMSpropOptions(o.lr).alpha(o.alpha).eps(o.eps).momentum(o.momentum).weight_decay(o.weight_decay));
}

double lr_constant(const settings::TrainConfig& c, std::int64_t, std::int64_t, std::int64_t) { return c.optimizer.lr; }

double lr_step(const settings::TrainConfig& c, std::int64_t step, std::int64_t total, std::int64_t) {
  double r = c.optimizer.lr;
  for (double f : c.schedule.decay_at)
    if (step >= static_cast<std::int64_t>(f * static_cast<double>(total))) r *= c.schedule.factor;
  return r;
}

double lr_warmup_invsqrt(const settings::TrainConfig& c, std::int64_t step, std::int64_t, std::int64_t) {
  const double t = static_cast<double>(step + 1), w = static_cast<double>(c.schedule.warmup_steps);
  return c.optimizer.lr * std::min(t / w, std::sqrt(w / t));
}

double lr_linear(const settings::TrainConfig& c, std::int64_t step, std::int64_t total, std::int64_t) {
  const double left = static_cast<double>(total - step), span = static_cast<double>(total - c.schedule.warmup_steps);
  return c.optimizer.lr * std::max(0.0, left / std::max(1.0, span));
}

// Per (fractional) epoch after warm-up.
double lr_exponential(const settings::TrainConfig& c, std::int64_t step, std::int64_t, std::int64_t steps_per_epoch) {
  const double epoch = static_cast<double>(step - c.schedule.warmup_steps) / static_cast<double>(steps_per_epoch);
  return c.optimizer.lr * std::pow(c.schedule.gamma, std::floor(epoch / c.schedule.every_epochs));
}

}  // namespace

const Registry<OptimizerFactory>& optimizers() {
  static const Registry<OptimizerFactory> r(
      "optimizer", {{"sgd", make_sgd}, {"adam", make_adam}, {"adamw", make_adamw}, {"rmsprop", make_rmsprop}});
  return r;
}

const Registry<ScheduleInfo>& schedules() {
  static const Registry<ScheduleInfo> r("schedule", {{"constant", {lr_constant}},
                                                     {"step", {lr_step}},
                                                     {"warmup-invsqrt", {lr_warmup_invsqrt, true, true}},
                                                     {"linear", {lr_linear}},
                                                     {"exponential", {lr_exponential}}});
  return r;
}

double learning_rate(const settings::TrainConfig& c, std::int64_t step, std::int64_t total, std::int64_t steps_per_epoch) {
  const ScheduleInfo& s = schedules().at(c.schedule.name);
  const std::int64_t w = c.schedule.warmup_steps;
  if (!s.own_warmup && w > 0 && step < w) return c.optimizer.lr * static_cast<double>(step + 1) / static_cast<double>(w);
  return s.lr(c, step, total, steps_per_epoch);
}

}  // namespace fp8lab::train
