// The trainer: a run is built (task, model, quantizers, optimizer, loss scaler), resumed from
// its checkpoint if asked, stepped until it ends, and finished (final evaluation, record,
// checkpoint). What a run carries from step to step is one value, TrainState
// (train_state.hpp); its record in the store is a RunRecord (run_record.hpp).
#include "fp8lab/experiments/trainer.hpp"

#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>

#include "fp8lab/core/random.hpp"
#include "fp8lab/core/text.hpp"
#include "fp8lab/experiments/progress.hpp"
#include "fp8lab/experiments/registry.hpp"
#include "fp8lab/nn/loss_scale.hpp"
#include "fp8lab/nn/modules.hpp"
#include "fp8lab/nn/runtime.hpp"
#include "run_record.hpp"
#include "task.hpp"
#include "train_state.hpp"

namespace fp8lab::experiments {

using results::RunStatus;

namespace {
std::atomic<bool> g_stop{false};
}  // namespace

void request_stop() { g_stop.store(true); }
bool stop_requested() { return g_stop.load(); }
void clear_stop_request() { g_stop.store(false); }

std::string checkpoint_path(const TrainConfig& cfg) {
  return cfg.train.checkpoint.empty() ? cfg.name + ".ckpt" : cfg.train.checkpoint;
}

namespace {

// --- weights: EMA and averaging -----------------------------------------------------------

Weights state_tensors(torch::nn::Module& m) {
  Weights v;
  for (auto& p : m.parameters()) v.push_back(p);
  for (auto& b : m.buffers()) v.push_back(b);
  return v;
}

Weights snapshot(torch::nn::Module& m) {
  torch::NoGradGuard g;
  Weights v;
  for (auto& t : state_tensors(m)) v.push_back(t.detach().clone());
  return v;
}

void load_into(torch::nn::Module& m, const Weights& v) {
  torch::NoGradGuard g;
  auto dst = state_tensors(m);
  if (dst.size() != v.size()) throw Error("checkpoint: weight count does not match the model");
  for (std::size_t i = 0; i < v.size(); ++i) dst[i].copy_(v[i]);
}

// --- evaluation ---------------------------------------------------------------------------

double evaluate(Task& task, nn::QuantContext& ctx, bool final) {
  torch::NoGradGuard no_grad;
  // Evaluation must not disturb training: its quantizer calls use their own step number
  // (so training's stochastic-rounding call numbering is unchanged) and record neither
  // counts nor statistics.
  const std::uint64_t step = ctx.step.load();
  ctx.step = ~std::uint64_t{0} - 1;
  ctx.recording = false;
  task.module().eval();
  const double metric = task.evaluate(final);
  task.module().train();
  ctx.step = step;
  ctx.recording = true;
  return metric;
}

// {"lo": e_lo, "counts": [n(e_lo), ..., n(e_hi)]}: the histogram's bins from its lowest to
// its highest nonzero exponent (lo 0 and no counts when empty).
nlohmann::json exponent_range(const kernels::ExpHistogram& hist) {
  const kernels::ExpRange r = kernels::nonzero_range(hist);
  return {{"lo", r.lo}, {"counts", r.counts}};
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// How many steps the run takes and when it evaluates and checkpoints.
struct Plan {
  std::int64_t examples = 0, batch = 0, steps_per_epoch = 0, total = 0, eval_every = 0, checkpoint_every = 0;
};

Plan plan_of(const TrainConfig& cfg, std::int64_t examples) {
  Plan p;
  p.examples = examples;
  p.batch = cfg.train.batch;
  p.steps_per_epoch = (examples + p.batch - 1) / p.batch;
  p.total = cfg.train.steps > 0 ? cfg.train.steps : p.steps_per_epoch * cfg.train.epochs;
  p.eval_every = cfg.train.eval_interval > 0 ? cfg.train.eval_interval : p.steps_per_epoch;
  p.checkpoint_every = cfg.train.checkpoint_interval > 0 ? cfg.train.checkpoint_interval : p.steps_per_epoch;
  return p;
}

// The loss scaling of the config, with LogMax's target taken from the recipe's gradient format.
nn::LossScaleConfig loss_scaling_of(const TrainConfig& cfg, const nn::Recipe& recipe, bool warn) {
  const nn::LossScaleConfig ls = nn::with_recipe_target(nn::parse_loss_scale(cfg.quant.loss_scale), recipe);
  if (warn && nn::backoff_blind_to_overflow(ls, recipe))
    std::fprintf(stderr,
                 "warning: Backoff loss scaling only sees overflow as NaN/Inf, but this recipe's gradient "
                 "quantizer saturates: the scale will only grow. Use overflow nan (e.g. gx=1.5.2:33/rne/nan) "
                 "or LogMax.\n");
  return ls;
}

Weights average(const std::vector<Weights>& sets) {
  Weights avg;
  for (std::size_t i = 0; i < sets[0].size(); ++i) {
    torch::Tensor t = sets[0][i].clone();
    if (t.is_floating_point()) {
      for (std::size_t k = 1; k < sets.size(); ++k) t.add_(sets[k][i]);
      t.div_(static_cast<double>(sets.size()));
    }
    avg.push_back(t);
  }
  return avg;
}

// One run from build to finish.
class Trainer {
 public:
  Trainer(const TrainConfig& cfg, const TrainOptions& opt, const std::string& config_json, RunRecord& record);
  void resume(Checkpoint& checkpoint);
  void run();
  TrainResult finish();

 private:
  bool stop_now() const;
  torch::Tensor batch_of(std::int64_t step);
  RunStatus train_step();
  void update_ema();
  void after_step(double lr);
  void evaluate_now();
  void checkpoint_now();
  void save();
  double evaluate_weights(const Weights* w, bool final);
  double final_metric();

  const TrainConfig& cfg_;
  const TrainOptions opt_;
  const std::string config_json_;
  RunRecord& record_;
  std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();

  std::unique_ptr<Task> task_;
  std::shared_ptr<nn::QuantContext> ctx_;
  nn::QuantizedModel qm_;
  std::optional<nn::LossScaler> scaler_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  Plan plan_;
  TrainState state_;
  RunStatus status_ = RunStatus::finished;

  torch::Tensor perm_;  // this epoch's order of the examples
  std::int64_t perm_epoch_ = -1;
  std::int64_t first_step_ = 0, samples_ = 0;  // throughput: the steps after this process's first
  std::chrono::steady_clock::time_point loop_started_;
  double eval_seconds_ = 0, checkpoint_seconds_ = 0;  // kept out of the throughput figure
  std::optional<Progress> bar_;
};

Trainer::Trainer(const TrainConfig& cfg, const TrainOptions& opt, const std::string& config_json, RunRecord& record)
    : cfg_(cfg), opt_(opt), config_json_(config_json), record_(record) {
  const nn::Recipe recipe = nn::load_recipe(cfg.quant.recipe);
  const nn::LossScaleConfig ls = loss_scaling_of(cfg, recipe, opt.progress);
  torch::manual_seed(cfg.seed);  // the model's initial weights
  task_ = make_task(cfg);
  ctx_ = std::make_shared<nn::QuantContext>();
  ctx_->seed = cfg.seed;
  ctx_->stats_interval = cfg.train.stats_interval;
  ctx_->compute = nn::parse_compute(cfg.quant.compute);
  ctx_->accumulate = nn::parse_accumulation(cfg.quant.accumulate);
  qm_ = nn::quantize_model(task_->module(), recipe, ctx_);
  scaler_.emplace(ls);
  optimizer_ = optimizers().at(cfg.optimizer.name)(cfg.optimizer, task_->module().parameters());
  plan_ = plan_of(cfg, task_->train_size());
  if (cfg.train.ema > 0) state_.ema = snapshot(task_->module());
  state_.run_id = record.id();
  state_.store = record.store_path();
}

void Trainer::resume(Checkpoint& checkpoint) {
  checkpoint.restore(task_->module(), *optimizer_);
  const TrainState& saved = checkpoint.state();
  if (saved.counts.size() != qm_.layers.size() || (cfg_.train.ema > 0) != !saved.ema.empty() ||
      (!saved.histories.empty() && saved.histories.size() != qm_.layers.size()))
    throw Error(checkpoint_path(cfg_) + ": checkpoint does not fit the model");
  const std::int64_t run_id = state_.run_id;
  const std::string store = state_.store;
  state_ = saved;
  state_.run_id = run_id;  // the record this process writes to
  state_.store = store;
  scaler_->set_state(state_.scaler);
  ctx_->step = static_cast<std::uint64_t>(state_.step);
  for (std::size_t i = 0; i < qm_.layers.size(); ++i) {
    qm_.layers[i]->add_counts(state_.counts[i]);
    try {
      if (!state_.histories.empty()) qm_.layers[i]->restore_histories(state_.histories[i]);
    } catch (const Error& e) {
      throw Error(checkpoint_path(cfg_) + ": " + e.what());
    }
  }
}

bool Trainer::stop_now() const {
  return (opt_.stop_after > 0 && state_.step - first_step_ >= opt_.stop_after) || stop_requested();
}

// The example indices of `step`: a slice of its epoch's permutation, drawn from (seed, epoch).
torch::Tensor Trainer::batch_of(std::int64_t step) {
  const std::int64_t epoch = step / plan_.steps_per_epoch, within = step % plan_.steps_per_epoch;
  if (epoch != perm_epoch_) {
    auto g = at::make_generator<at::CPUGeneratorImpl>(
        mix64(cfg_.seed ^ mix64(0xE90C0000ULL + static_cast<std::uint64_t>(epoch))));
    perm_ = torch::randperm(plan_.examples, g, torch::kInt64);
    perm_epoch_ = epoch;
  }
  return perm_.slice(0, within * plan_.batch, std::min(plan_.examples, (within + 1) * plan_.batch));
}

void Trainer::update_ema() {
  torch::NoGradGuard g;
  const auto cur = state_tensors(task_->module());
  for (std::size_t i = 0; i < cur.size(); ++i) {
    if (state_.ema[i].is_floating_point()) state_.ema[i].mul_(cfg_.train.ema).add_(cur[i].detach(), 1 - cfg_.train.ema);
    else state_.ema[i].copy_(cur[i]);
  }
}

// One step: forward, scaled backward, loss-scale check, optimizer step. Every random draw
// of the step (dropout, stochastic depth, augmentation, mixup) comes from streams seeded by
// (seed, step), so a resumed run takes exactly the steps of an uninterrupted one.
RunStatus Trainer::train_step() {
  const std::int64_t step = state_.step;
  const std::uint64_t step_seed = mix64(cfg_.seed * 0x9E3779B97F4A7C15ULL + static_cast<std::uint64_t>(step));
  torch::manual_seed(step_seed);
  const double lr = learning_rate(cfg_, step, plan_.total, plan_.steps_per_epoch);
  for (auto& g : optimizer_->param_groups()) g.options().set_lr(lr);
  const torch::Tensor idx = batch_of(step);
  optimizer_->zero_grad();
  const torch::Tensor loss = task_->loss(idx, step_seed);
  (loss * scaler_->scale()).backward();
  std::vector<torch::Tensor> grads;
  for (auto& p : task_->module().parameters())
    if (p.grad().defined()) grads.push_back(p.grad());
  const nn::LossScaleStep s = scaler_->update(grads);
  state_.trace.emplace_back(step, static_cast<int>(std::lround(std::log2(s.scale))), s.skipped);
  const double lv = loss.item<double>();
  // The loss is computed before scaling: a NaN/Inf here is a forward-pass divergence that no
  // loss scale can recover.
  if (!std::isfinite(lv)) return RunStatus::diverged;
  if (!s.skipped) optimizer_->step();
  if (!state_.ema.empty() && !s.skipped) update_ema();
  if (step == first_step_) {
    loop_started_ = std::chrono::steady_clock::now();
    eval_seconds_ = checkpoint_seconds_ = 0;
  } else {
    samples_ += idx.size(0);
  }
  state_.loss_ema = step == 0 ? lv : 0.98 * state_.loss_ema + 0.02 * lv;
  if (ctx_->stats_interval > 0 && ctx_->stats->size() > 0) record_.log_stats(stat_rows(ctx_->stats->take()));
  ctx_->step = static_cast<std::uint64_t>(++state_.step);
  after_step(lr);
  return RunStatus::running;
}

void Trainer::after_step(double lr) {
  const std::int64_t step = state_.step;
  if (step % plan_.eval_every == 0 || step == plan_.total) evaluate_now();
  if (step % plan_.checkpoint_every == 0 || step == plan_.total) checkpoint_now();
  if (opt_.progress) {
    const std::int64_t epoch = step / plan_.steps_per_epoch + (step % plan_.steps_per_epoch ? 1 : 0);
    bar_->update(step, "epoch " + std::to_string(epoch) + " loss " + fixed(state_.loss_ema, 3) + " scale 2^" +
                           std::to_string(scaler_->log2_scale()) + " lr " + fixed(lr, 3));
  }
}

void Trainer::evaluate_now() {
  const double metric = evaluate_weights(state_.ema.empty() ? nullptr : &state_.ema, false);
  state_.evals.emplace_back(state_.step, metric);
  record_.log_metric(state_.step, task_->metric_name(false), metric);
  record_.log_metric(state_.step, "train_loss", state_.loss_ema);
  record_.log_metric(state_.step, "log2_loss_scale", scaler_->log2_scale());
}

void Trainer::checkpoint_now() {
  if (cfg_.train.average_last > 0) {
    state_.recent.push_back(snapshot(task_->module()));
    if (static_cast<int>(state_.recent.size()) > cfg_.train.average_last) state_.recent.erase(state_.recent.begin());
  }
  const auto t0 = std::chrono::steady_clock::now();
  if (state_.step < plan_.total) save();
  checkpoint_seconds_ += seconds_since(t0);
}

// The trace into the store, then (with checkpoints on) the run's state to its checkpoint.
void Trainer::save() {
  record_.flush_trace(state_.trace);
  if (!opt_.checkpoints) return;
  state_.scaler = scaler_->state();
  state_.counts.clear();
  for (const auto& l : qm_.layers) state_.counts.push_back(l->counts());
  state_.histories.clear();
  for (const auto& l : qm_.layers) state_.histories.push_back(l->histories());
  const double before = state_.seconds;
  state_.seconds += seconds_since(started_);
  save_checkpoint(checkpoint_path(cfg_), config_json_, state_, task_->module(), *optimizer_);
  state_.seconds = before;
}

// The metric of weights `w` (nullptr: the model's own). Evaluation must not disturb
// training: its quantizer calls use their own step number (so training's stochastic-rounding
// call numbering is unchanged) and record neither counts nor statistics.
double Trainer::evaluate_weights(const Weights* w, bool final) {
  const auto t0 = std::chrono::steady_clock::now();
  torch::nn::Module& model = task_->module();
  const Weights current = w ? snapshot(model) : Weights{};
  if (w) load_into(model, *w);
  const double metric = evaluate(*task_, *ctx_, final);
  if (w) load_into(model, current);
  eval_seconds_ += seconds_since(t0);
  return metric;
}

void Trainer::run() {
  first_step_ = state_.step;
  loop_started_ = std::chrono::steady_clock::now();
  if (opt_.progress) {
    const std::string blas = nn::blas_core();
    std::fprintf(stderr, "%s: %s, recipe %s, loss scaling %s, %lld steps, seed %llu%s; %d threads%s\n",
                 cfg_.name.c_str(), task_->description().c_str(), cfg_.quant.recipe.c_str(),
                 cfg_.quant.loss_scale.c_str(), static_cast<long long>(plan_.total),
                 static_cast<unsigned long long>(cfg_.seed),
                 first_step_ > 0 ? (" (resumed at step " + std::to_string(first_step_) + ")").c_str() : "",
                 nn::current_torch_settings().threads, blas.empty() ? "" : (", OpenBLAS " + blas).c_str());
    bar_.emplace(cfg_.name.size() > 24 ? cfg_.name.substr(0, 24) : cfg_.name, plan_.total, "steps", first_step_);
  }
  while (state_.step < plan_.total) {
    if (stop_now()) {
      status_ = RunStatus::stopped;
      return;
    }
    if (train_step() == RunStatus::diverged) {
      status_ = RunStatus::diverged;
      return;
    }
  }
}

// The final metric: the last evaluation, or the task's separate final evaluation, of the
// EMA weights if on; then of the average of the last K checkpoints' weights if on.
double Trainer::final_metric() {
  double metric = state_.evals.empty() ? 0 : state_.evals.back().second;
  if (task_->separate_final()) {
    metric = evaluate_weights(state_.ema.empty() ? nullptr : &state_.ema, true);
    record_.log_metric(state_.step, task_->metric_name(true), metric);
  }
  if (cfg_.train.average_last > 0 && state_.recent.size() > 1) {
    const Weights avg = average(state_.recent);
    metric = evaluate_weights(&avg, true);
    record_.log_metric(state_.step, task_->metric_name(true) + "_averaged", metric);
  }
  return metric;
}

TrainResult Trainer::finish() {
  const double loop_seconds = seconds_since(loop_started_) - eval_seconds_ - checkpoint_seconds_;
  TrainResult res;
  res.status = status_;
  res.samples_per_second = loop_seconds > 0 ? static_cast<double>(samples_) / loop_seconds : 0;
  res.metric_name = task_->metric_name(true);
  res.model_description = task_->description();
  if (opt_.checkpoints) res.checkpoint = checkpoint_path(cfg_);
  if (status_ == RunStatus::stopped) save();
  if (status_ == RunStatus::finished) res.final_metric = final_metric();
  record_.flush_trace(state_.trace);
  if (opt_.progress)
    bar_->finish(status_ == RunStatus::finished ? res.metric_name + " " + fixed(res.final_metric, 3)
                                                : std::string(to_string(status_)));
  res.evals = state_.evals;
  res.final_train_loss = state_.loss_ema;
  res.final_log2_scale = scaler_->log2_scale();
  res.skipped_steps = scaler_->skipped_steps();
  res.steps = state_.step;
  res.total_steps = plan_.total;
  res.run_id = record_.id();
  for (const auto& l : qm_.layers) {
    const auto c = l->counts();
    for (int k = 0; k < nn::kKinds; ++k) res.counts[k] += c[k];
    // Which path each layer's products took: the share on bfloat16, in the run record.
    const auto [fp32, bf16] = l->products();
    res.products_fp32 += fp32;
    res.products_bf16 += bf16;
    if (fp32 + bf16 > 0)
      record_.log_metric(state_.step, "bf16_product_share/" + l->name,
                         static_cast<double>(bf16) / static_cast<double>(fp32 + bf16));
  }
  res.seconds = state_.seconds + seconds_since(started_);
  record_.log_metric(state_.step, "samples_per_second", res.samples_per_second);
  record_.finish(status_, status_ == RunStatus::finished ? std::optional<double>(res.final_metric) : std::nullopt,
                 res.metric_name, res.seconds);
  if (status_ == RunStatus::finished) {
    state_.finished = true;
    save();  // the trained weights, kept for the user; --resume refuses them
  }
  return res;
}

}  // namespace

TrainResult train(const TrainConfig& cfg, results::Store* store, const TrainOptions& opt) {
  validate(cfg);
  if (opt.resume && !opt.checkpoints) throw Error("--resume needs checkpoints");
  if (opt.resume && opt.restart) throw Error("--resume and --restart exclude each other");
  const nn::ScopedTorchSettings settings({cfg.threads, cfg.train.flush_denormals});
  const std::string config_json = to_json(cfg);
  std::optional<CheckpointLock> lock;
  std::optional<Checkpoint> checkpoint;
  if (opt.checkpoints) {
    lock.emplace(checkpoint_path(cfg));
    if (opt.resume) checkpoint.emplace(checkpoint_path(cfg), config_json);
    else if (!opt.restart) refuse_unfinished_checkpoint(checkpoint_path(cfg));
  }
  RunRecord record(store, cfg, config_json, checkpoint ? &checkpoint->state() : nullptr);
  try {
    Trainer trainer(cfg, opt, config_json, record);
    if (checkpoint) trainer.resume(*checkpoint);
    trainer.run();
    return trainer.finish();
  } catch (...) {
    record.finish(RunStatus::failed, std::nullopt, "", 0);
    throw;
  }
}

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

}  // namespace fp8lab::experiments
