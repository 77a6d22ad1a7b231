// The trainer: a run is built (task, model, quantizers, optimizer, loss scaler), resumed from
// its checkpoint if asked, stepped until it ends, and finished (final evaluation, record,
// checkpoint). What a run carries from step to step is one value, TrainState
// (train_state.hpp); its record in the store is a RunRecord (run_record.hpp).
#include "fp8lab/train/trainer.hpp"

#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <limits>
#include <optional>
#include <tuple>
#include <utility>

#include "fp8lab/core/files.hpp"
#include "fp8lab/core/random.hpp"
#include "fp8lab/core/text.hpp"
#include "fp8lab/core/progress.hpp"
#include "fp8lab/train/registry.hpp"
#include "fp8lab/train/world.hpp"
#include "fp8lab/nn/loss_scale.hpp"
#include "fp8lab/nn/modules.hpp"
#include "fp8lab/nn/runtime.hpp"
#include "micro_batches.hpp"
#include "fp8lab/train/stat_rows.hpp"
#include "run_record.hpp"
#include "task.hpp"
#include "train_state.hpp"

namespace fp8lab::train {

double ema_decay(double ema, std::int64_t step) {
  return std::min(ema, static_cast<double>(1 + step) / static_cast<double>(10 + step));
}

using results::RunStatus;

std::string checkpoint_path(const settings::TrainConfig& cfg) {
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

// How many steps the run takes and when it evaluates and checkpoints.
struct Plan {
  std::int64_t examples = 0, batch = 0, steps_per_epoch = 0, total = 0, eval_every = 0, checkpoint_every = 0;
};

Plan plan_of(const settings::TrainConfig& cfg, std::int64_t examples) {
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
nn::LossScaleConfig loss_scaling_of(const settings::TrainConfig& cfg, const nn::Recipe& recipe, bool warn) {
  const nn::LossScaleConfig ls = nn::with_recipe_target(cfg.quant.loss_scale.value, recipe);
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
  Trainer(const settings::TrainConfig& cfg, const TrainOptions& opt, const std::string& config_json, RunRecord& record);
  void resume(Checkpoint& checkpoint);
  void run();
  TrainResult finish();
  Evaluation evaluate_restored(bool reference_decoding);  // after resume()

 private:
  bool stop_now() const;
  bool stop_after_step() const;
  torch::Tensor batch_of(std::int64_t step);
  RunStatus train_step();
  double set_learning_rate(std::int64_t step);
  double gradients(const torch::Tensor& idx, std::uint64_t step_seed);
  nn::LossScaleStep unscale_and_check(std::int64_t step);
  void count_step(std::int64_t step, std::int64_t samples, double loss);
  std::vector<std::array<QuantCounts, nn::kKinds>> run_counts();
  void update_ema(std::int64_t step);
  void after_step(double lr);
  void evaluate_now();
  void checkpoint_now();
  void save();
  double evaluate_weights(const Weights* w, bool final);
  struct FinalEvaluations {
    std::vector<std::pair<std::string, double>> metrics;  // (name, value), parts after each metric
    std::optional<double> metric;                          // the last metric evaluated
    std::string metric_name;                               // its name ("test_bleu_averaged", ...)
  };
  FinalEvaluations final_evaluations(bool reuse_last);
  std::pair<std::string, double> final_metric();

  const settings::TrainConfig& cfg_;
  const TrainOptions opt_;
  World* const world_;
  const bool writer_;  // writes the store and checkpoints: the only process, or rank 0
  const std::string config_json_;
  RunRecord& record_;
  std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();

  std::unique_ptr<Task> task_;
  std::shared_ptr<nn::QuantContext> ctx_;
  nn::QuantizedModel qm_;
  std::optional<nn::LossScaler> scaler_;
  std::optional<MicroBatches> micro_;  // the step's shards (one, unless train.micro_batches > 1 or a world)
  bool agreed_stop_ = false;           // a data-parallel run's processes agreed to stop
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

Trainer::Trainer(const settings::TrainConfig& cfg, const TrainOptions& opt, const std::string& config_json, RunRecord& record)
    : cfg_(cfg),
      opt_(opt),
      world_(opt.world),
      writer_(!opt.world || opt.world->rank() == 0),
      config_json_(config_json),
      record_(record) {
  const nn::Recipe& recipe = cfg.quant.recipe.value;
  const nn::LossScaleConfig ls = loss_scaling_of(cfg, recipe, opt.progress);
  torch::manual_seed(cfg.seed);  // the model's initial weights
  task_ = make_task(cfg);
  ctx_ = std::make_shared<nn::QuantContext>();
  ctx_->seed = cfg.seed;
  ctx_->stats_interval = cfg.train.stats_interval;
  ctx_->compute = compute_of(cfg.quant);
  ctx_->accumulate = accumulation_of(cfg.quant);
  qm_ = nn::quantize_model(task_->module(), recipe, ctx_);
  const nn::KindQuant& grad_comm = cfg.quant.grad_comm.value;
  if (cfg.train.micro_batches > 1 || world_ || grad_comm) {
    for (const auto& l : qm_.layers)
      for (const auto& q : l->quant.q)
        if (q && q->history > 0)
          throw Error("layer '" + l->name + "': delayed scaling (amax history) with train.micro_batches > 1 or " +
                      "several processes is not supported: each shard would keep its own history");
  }
  micro_.emplace(task_->module(), cfg.train.micro_batches, world_, grad_comm, opt.bucket_bytes);
  scaler_.emplace(ls);
  optimizer_ = optimizers().at(cfg.optimizer.name)(cfg.optimizer, task_->module().parameters());
  plan_ = plan_of(cfg, task_->train_size());
  if (cfg.train.ema > 0) state_.ema = snapshot(task_->module());
  state_.run_id = record.id();
  state_.store = record.store_path();
  state_.processes = world_ ? world_->size() : 1;
}

void Trainer::resume(Checkpoint& checkpoint) {
  checkpoint.restore(task_->module(), *optimizer_);
  const TrainState& saved = checkpoint.state();
  if (saved.counts.size() != qm_.layers.size() || (cfg_.train.ema > 0) != !saved.ema.empty() ||
      (!saved.histories.empty() && saved.histories.size() != qm_.layers.size()))
    throw Error(checkpoint_path(cfg_) + ": checkpoint does not fit the model");
  const std::int64_t run_id = state_.run_id;
  const std::string store = state_.store;
  const int processes = state_.processes;
  state_ = saved;
  state_.run_id = run_id;  // the record this process writes to
  state_.store = store;
  if (saved.processes != processes && writer_)
    std::fprintf(stderr,
                 "%s: the checkpoint was written by %d process%s, the run goes on with %d: the same run, since both "
                 "divide train.micro_batches = %d\n",
                 cfg_.name.c_str(), saved.processes, saved.processes == 1 ? "" : "es", processes,
                 cfg_.train.micro_batches);
  state_.processes = processes;
  scaler_->set_state(state_.scaler);
  ctx_->step = static_cast<std::uint64_t>(state_.step);
  for (std::size_t i = 0; i < qm_.layers.size(); ++i) {
    if (writer_) qm_.layers[i]->stats.add_counts(state_.counts[i]);  // the others' counts are added to rank 0's
    try {
      if (!state_.histories.empty()) qm_.layers[i]->amax.restore(state_.histories[i]);
    } catch (const Error& e) {
      throw Error(checkpoint_path(cfg_) + ": " + e.what());
    }
  }
}

bool Trainer::stop_now() const {
  if (world_) return agreed_stop_;
  return (opt_.stop_after > 0 && state_.step - first_step_ >= opt_.stop_after) || stop_requested();
}

// This process's wish to stop once the current step is taken (a data-parallel run's
// processes stop together, at the first step after which any of them wishes it).
bool Trainer::stop_after_step() const {
  return (opt_.stop_after > 0 && state_.step + 1 - first_step_ >= opt_.stop_after) || stop_requested();
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

// The quantized layers' counts of the whole run: this process's, plus the other processes'
// in a data-parallel run (summed exactly, as integers).
std::vector<std::array<QuantCounts, nn::kKinds>> Trainer::run_counts() {
  std::vector<std::array<QuantCounts, nn::kKinds>> counts;
  for (const auto& l : qm_.layers) counts.push_back(l->stats.counts());
  if (!world_) return counts;
  std::vector<std::int64_t> flat;
  for (const auto& layer : counts)
    for (const auto& c : layer)
      for (std::uint64_t v : {c.total, c.overflow, c.underflow, c.nan}) flat.push_back(static_cast<std::int64_t>(v));
  const std::vector<std::int64_t> sum = world_->sum(flat, "the sum of the quantizers' counts");
  std::size_t i = 0;
  for (auto& layer : counts)
    for (auto& c : layer) {
      c.total = static_cast<std::uint64_t>(sum[i++]);
      c.overflow = static_cast<std::uint64_t>(sum[i++]);
      c.underflow = static_cast<std::uint64_t>(sum[i++]);
      c.nan = static_cast<std::uint64_t>(sum[i++]);
    }
  return counts;
}

void Trainer::update_ema(std::int64_t step) {
  torch::NoGradGuard g;
  const double d = ema_decay(cfg_.train.ema, step);
  const auto cur = state_tensors(task_->module());
  for (std::size_t i = 0; i < cur.size(); ++i) {
    if (state_.ema[i].is_floating_point()) state_.ema[i].mul_(d).add_(cur[i].detach(), 1 - d);
    else state_.ema[i].copy_(cur[i]);
  }
}

// One optimizer step: its seed and learning rate, the batch, the gradients (of the loss
// times the loss scale), the unscale and overflow check, the step itself, the bookkeeping.
// Every random draw of the step (dropout, stochastic depth, augmentation, mixup) comes from
// streams seeded by (seed, step), so a resumed run takes exactly the steps of an
// uninterrupted one.
RunStatus Trainer::train_step() {
  const std::int64_t step = state_.step;
  const std::uint64_t step_seed = mix64(cfg_.seed * 0x9E3779B97F4A7C15ULL + static_cast<std::uint64_t>(step));
  torch::manual_seed(step_seed);
  const double lr = set_learning_rate(step);
  const torch::Tensor idx = batch_of(step);
  const double loss = gradients(idx, step_seed);
  const nn::LossScaleStep s = unscale_and_check(step);
  // The loss is computed before scaling: a NaN/Inf here is a forward-pass divergence that no
  // loss scale can recover.
  if (!std::isfinite(loss)) return RunStatus::diverged;
  if (!s.skipped) optimizer_->step();
  if (!state_.ema.empty() && !s.skipped) update_ema(step);
  count_step(step, idx.size(0), loss);
  after_step(lr);
  return RunStatus::running;
}

double Trainer::set_learning_rate(std::int64_t step) {
  const double lr = learning_rate(cfg_, step, plan_.total, plan_.steps_per_epoch);
  for (auto& g : optimizer_->param_groups()) g.options().set_lr(lr);
  return lr;
}

// The gradients of the batch's loss times the loss scale, in the parameters' .grad: this
// process's shards of the batch `idx`, each from the step's starting buffers with its own
// streams, then the exchange and the sum (micro_batches.hpp; one shard is the plain step).
// Returns the batch's mean loss (NaN when a shard's is not finite).
double Trainer::gradients(const torch::Tensor& idx, std::uint64_t step_seed) {
  micro_->begin_step();
  const bool stop = stop_after_step();
  for (int m = micro_->first(); m < micro_->first() + micro_->count(); ++m) {
    const std::uint64_t seed = micro_seed(step_seed, m);
    micro_->before(m, mix64(seed ^ 0x6C0F5EEDULL));
    const auto [begin, end] = micro_range(idx.size(0), cfg_.train.micro_batches, m);
    double loss = 0;
    if (end > begin) {
      torch::manual_seed(seed);
      ctx_->micro = static_cast<std::uint32_t>(m);
      const torch::Tensor l = task_->loss(idx.slice(0, begin, end), seed);
      (l * scaler_->scale()).backward();
      loss = l.item<double>();
    }
    micro_->after(m, loss, end - begin, stop);
  }
  ctx_->micro = 0;
  const MicroBatches::Step r = micro_->reduce();
  agreed_stop_ = r.stop;
  return r.loss_finite ? r.loss : std::numeric_limits<double>::quiet_NaN();
}

// The gradients divided by the loss scale, checked for NaN/Inf; the scale's trace.
nn::LossScaleStep Trainer::unscale_and_check(std::int64_t step) {
  std::vector<torch::Tensor> grads;
  for (auto& p : task_->module().parameters())
    if (p.grad().defined()) grads.push_back(p.grad());
  const nn::LossScaleStep s = scaler_->update(grads);
  state_.trace.emplace_back(step, static_cast<int>(std::lround(std::log2(s.scale))), s.skipped);
  return s;
}

// The step's samples and loss into the throughput and the loss average, the statistics
// into the record, and the step number on.
void Trainer::count_step(std::int64_t step, std::int64_t samples, double loss) {
  if (step == first_step_) {
    loop_started_ = std::chrono::steady_clock::now();
    eval_seconds_ = checkpoint_seconds_ = 0;
  } else {
    samples_ += samples;
  }
  state_.loss_ema = step == 0 ? loss : 0.98 * state_.loss_ema + 0.02 * loss;
  if (ctx_->stats_interval > 0 && ctx_->stats->size() > 0) record_.log_stats(stat_rows(ctx_->stats->take()));
  ctx_->step = static_cast<std::uint64_t>(++state_.step);
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
  for (const auto& [name, value] : task_->metric_parts()) record_.log_metric(state_.step, name, value);
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
  state_.counts = run_counts();  // a collective: every process of a data-parallel run calls save()
  record_.flush_trace(state_.trace);
  if (!writer_) state_.trace.clear();  // rank 0 keeps the trace
  if (!opt_.checkpoints || !writer_) return;
  state_.scaler = scaler_->state();
  state_.histories.clear();
  for (const auto& l : qm_.layers) state_.histories.push_back(l->amax.get());
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
    const std::string procs = world_ ? std::to_string(world_->size()) + " processes x " : "";
    const std::string micro = cfg_.train.micro_batches > 1
                                  ? ", batch " + std::to_string(cfg_.train.batch) + " as " +
                                        std::to_string(cfg_.train.micro_batches) + " micro-batches"
                                  : "";
    std::fprintf(stderr, "%s: %s, recipe %s, loss scaling %s, %lld steps, seed %llu%s%s; %s%d threads%s\n",
                 cfg_.name.c_str(), task_->description().c_str(), cfg_.quant.recipe.text.c_str(),
                 cfg_.quant.loss_scale.text.c_str(), static_cast<long long>(plan_.total),
                 static_cast<unsigned long long>(cfg_.seed), micro.c_str(),
                 first_step_ > 0 ? (" (resumed at step " + std::to_string(first_step_) + ")").c_str() : "",
                 procs.c_str(), nn::current_torch_settings().threads, blas.empty() ? "" : (", OpenBLAS " + blas).c_str());
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

// The run's final evaluations on the final set (the test set where the task has one), each
// metric followed by its parts: the EMA weights' (the trained ones without EMA), unless
// `reuse_last`; then, if on, the average of the last checkpoints' weights, "_averaged".
Trainer::FinalEvaluations Trainer::final_evaluations(bool reuse_last) {
  FinalEvaluations out;
  const std::string name = task_->metric_name(true);
  auto evaluate = [&](const Weights* w, const std::string& suffix) {
    const double metric = evaluate_weights(w, true);
    out.metrics.emplace_back(name + suffix, metric);
    for (const auto& [part, value] : task_->metric_parts()) out.metrics.emplace_back(part + suffix, value);
    out.metric = metric;
    out.metric_name = name + suffix;
  };
  if (!reuse_last) evaluate(state_.ema.empty() ? nullptr : &state_.ema, "");
  if (cfg_.train.average_last > 0 && state_.recent.size() > 1) {
    const Weights avg = average(state_.recent);
    evaluate(&avg, "_averaged");
  }
  return out;
}

// The final metric and its name: the last of final_evaluations (the averaged weights' where
// the run averages its last checkpoints: "test_bleu_averaged"), which reuses the last
// periodic evaluation where the task has no separate final one; all of them are logged.
std::pair<std::string, double> Trainer::final_metric() {
  const FinalEvaluations f = final_evaluations(!task_->separate_final());
  for (const auto& [name, value] : f.metrics) record_.log_metric(state_.step, name, value);
  if (f.metric) return {f.metric_name, *f.metric};
  return {task_->metric_name(true), state_.evals.empty() ? 0 : state_.evals.back().second};
}

// `fp8lab evaluate`: every final evaluation, the first one included, timed.
Evaluation Trainer::evaluate_restored(bool reference_decoding) {
  task_->use_reference_decoding(reference_decoding);
  const auto t0 = std::chrono::steady_clock::now();
  Evaluation e;
  e.step = state_.step;
  e.model_description = task_->description();
  e.metrics = final_evaluations(false).metrics;
  e.seconds = seconds_since(t0);
  e.outputs = task_->outputs();
  return e;
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
  if (status_ == RunStatus::finished) {
    const double before = eval_seconds_;
    std::tie(res.metric_name, res.final_metric) = final_metric();
    res.final_eval_seconds = eval_seconds_ - before;
    record_.log_metric(state_.step, "final_eval_seconds", res.final_eval_seconds);
  }
  res.eval_seconds = eval_seconds_;
  record_.flush_trace(state_.trace);
  const std::vector<std::array<QuantCounts, nn::kKinds>> counts = run_counts();
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
  res.weights_fnv = kFnvBasis;
  for (const torch::Tensor& t : state_tensors(task_->module())) {
    const torch::Tensor c = t.detach().contiguous();
    res.weights_fnv = fnv1a(res.weights_fnv, c.data_ptr(), static_cast<std::size_t>(c.nbytes()));
  }
  std::vector<std::int64_t> products;  // per layer: float32, bfloat16
  for (const auto& l : qm_.layers) {
    const auto [fp32, bf16] = l->products.counts();
    products.push_back(fp32);
    products.push_back(bf16);
  }
  if (world_) products = world_->sum(products, "the sum of the product counts");
  for (std::size_t i = 0; i < qm_.layers.size(); ++i) {
    for (int k = 0; k < nn::kKinds; ++k) res.counts[k] += counts[i][k];
    // Which path each layer's products took: the share on bfloat16, in the run record.
    const std::int64_t fp32 = products[2 * i], bf16 = products[2 * i + 1];
    res.products_fp32 += fp32;
    res.products_bf16 += bf16;
    if (fp32 + bf16 > 0)
      record_.log_metric(state_.step, "bf16_product_share/" + qm_.layers[i]->name,
                         static_cast<double>(bf16) / static_cast<double>(fp32 + bf16));
  }
  if (world_) {
    const std::int64_t steps = std::max<std::int64_t>(1, state_.step - first_step_);
    res.processes = world_->size();
    res.comm_seconds_per_step = world_->stats().seconds / static_cast<double>(steps);
    res.comm_bytes_per_step = static_cast<double>(world_->stats().bytes_sent) / static_cast<double>(steps);
    res.comm_gradient_bytes_per_step = static_cast<double>(micro_->gradient_bytes_sent()) / static_cast<double>(steps);
    record_.log_metric(state_.step, "processes", world_->size());
    record_.log_metric(state_.step, "comm_seconds_per_step", res.comm_seconds_per_step);
    record_.log_metric(state_.step, "comm_bytes_per_step", res.comm_bytes_per_step);
    record_.log_metric(state_.step, "comm_gradient_bytes_per_step", res.comm_gradient_bytes_per_step);
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

namespace {

// Rank 0's checks before a data-parallel run starts (the checkpoint lock, the checkpoint to
// resume from or the refusal to overwrite one), agreed by every process: each either gets
// the checkpoint's bytes from rank 0 or throws rank 0's error. The processes' configs must
// be the same.
void start_together(World& world, const std::string& config_json, std::string error, std::string checkpoint_bytes,
                    std::optional<Checkpoint>& checkpoint, const std::string& path) {
  world.require_same(fnv1a(kFnvBasis, config_json.data(), config_json.size()), "config");
  const std::string verdict = world.broadcast(error, "the start of the run");
  if (!verdict.empty()) throw Error(world.rank() == 0 ? verdict : "rank 0: " + verdict);
  checkpoint_bytes = world.broadcast(checkpoint_bytes, "the checkpoint to resume from");
  if (world.rank() != 0 && !checkpoint_bytes.empty())
    checkpoint.emplace(Checkpoint::kArchive, path + " (from rank 0)", std::move(checkpoint_bytes), config_json);
}

}  // namespace

TrainResult train(const settings::TrainConfig& given, results::Store* store, const TrainOptions& opt) {
  // A config built in code completes as one read from text: settings it leaves unset from
  // its recipe file, else their defaults; then the checks.
  settings::TrainConfig cfg = given;
  complete_config(cfg);
  if (opt.resume && !opt.checkpoints) throw Error("--resume needs checkpoints");
  if (opt.resume && opt.restart) throw Error("--resume and --restart exclude each other");
  World* const world = opt.world;
  const bool writer = !world || world->rank() == 0;
  if (world) check_process_count(cfg.train.micro_batches, world->size());
  if (!writer && store) throw Error("a data-parallel run's rank " + std::to_string(world->rank()) +
                                    " writes no store: only rank 0 records the run");
  const nn::ScopedTorchSettings settings({cfg.threads, cfg.train.flush_denormals});
  const std::string config_json = to_json(cfg);
  std::optional<CheckpointLock> lock;
  std::optional<Checkpoint> checkpoint;
  std::string error;
  if (opt.checkpoints && writer) {
    try {
      lock.emplace(checkpoint_path(cfg));
      if (opt.resume) checkpoint.emplace(checkpoint_path(cfg), config_json);
      else if (!opt.restart) refuse_unfinished_checkpoint(checkpoint_path(cfg));
    } catch (const Error& e) {
      if (!world) throw;
      error = e.what();
    }
  }
  if (world)
    start_together(*world, config_json, error, checkpoint ? checkpoint->bytes() : std::string(), checkpoint,
                   checkpoint_path(cfg));
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

Evaluation evaluate_checkpoint(const settings::TrainConfig& given, const EvaluateOptions& opt) {
  settings::TrainConfig cfg = given;
  complete_config(cfg);
  const nn::ScopedTorchSettings settings({cfg.threads, cfg.train.flush_denormals});
  const std::string config_json = to_json(cfg);
  Checkpoint checkpoint(opt.checkpoint.empty() ? checkpoint_path(cfg) : opt.checkpoint, config_json,
                        Checkpoint::Use::evaluate);
  RunRecord record(nullptr, cfg, config_json, nullptr);
  TrainOptions to;
  to.progress = false;
  to.checkpoints = false;
  Trainer trainer(cfg, to, config_json, record);
  trainer.resume(checkpoint);
  return trainer.evaluate_restored(opt.reference_decoding);
}

void check_process_count(int micro_batches, int processes) {
  if (micro_batches >= 1 && processes >= 1 && micro_batches % processes == 0) return;
  const std::string n = std::to_string(processes);
  throw Error("train.micro_batches = " + std::to_string(micro_batches) + " cannot be shared by " + n +
              " processes: it must be a multiple of " + n + "; add --set train.micro_batches=" + n +
              " (the global batch as " + n + " shards: the same run on any process count that divides it)");
}


}  // namespace fp8lab::train
