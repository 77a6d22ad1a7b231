#include "fp8lab/experiments/trainer.hpp"

#include <malloc.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "fp8lab/core/random.hpp"
#include "fp8lab/experiments/progress.hpp"
#include "fp8lab/nn/loss_scale.hpp"
#include "fp8lab/nn/modules.hpp"
#include "task.hpp"

namespace fp8lab::experiments {

namespace fs = std::filesystem;

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

// --- optimizer ----------------------------------------------------------------------------

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerConfig& o, std::vector<torch::Tensor> params) {
  if (o.name == "sgd")
    return std::make_unique<torch::optim::SGD>(
        params, torch::optim::SGDOptions(o.lr).momentum(o.momentum).nesterov(o.nesterov).weight_decay(o.weight_decay));
  if (o.name == "adam")
    return std::make_unique<torch::optim::Adam>(
        params, torch::optim::AdamOptions(o.lr).betas({o.beta1, o.beta2}).eps(o.eps).weight_decay(o.weight_decay));
  if (o.name == "adamw")
    return std::make_unique<torch::optim::AdamW>(
        params, torch::optim::AdamWOptions(o.lr).betas({o.beta1, o.beta2}).eps(o.eps).weight_decay(o.weight_decay));
  return std::make_unique<torch::optim::RMSprop>(
      params, torch::optim::RMSpropOptions(o.lr).alpha(o.alpha).eps(o.eps).momentum(o.momentum).weight_decay(o.weight_decay));
}

}  // namespace

double learning_rate(const TrainConfig& c, std::int64_t step, std::int64_t total, std::int64_t steps_per_epoch) {
  const auto& s = c.schedule;
  const double lr = c.optimizer.lr, t = static_cast<double>(step + 1);
  const double w = static_cast<double>(s.warmup_steps);
  if (s.name == "warmup-invsqrt") return lr * std::min(t / w, std::sqrt(w / t));
  if (s.warmup_steps > 0 && step < s.warmup_steps) return lr * t / w;
  if (s.name == "constant") return lr;
  if (s.name == "step") {
    double r = lr;
    for (double f : s.decay_at)
      if (step >= static_cast<std::int64_t>(f * static_cast<double>(total))) r *= s.factor;
    return r;
  }
  if (s.name == "linear") {
    const double left = static_cast<double>(total - step), span = static_cast<double>(total - s.warmup_steps);
    return lr * std::max(0.0, left / std::max(1.0, span));
  }
  // exponential, per (fractional) epoch after warm-up
  const double epoch = static_cast<double>(step - s.warmup_steps) / static_cast<double>(steps_per_epoch);
  return lr * std::pow(s.gamma, std::floor(epoch / s.every_epochs));
}

namespace {

// --- weights: EMA and averaging -----------------------------------------------------------

std::vector<torch::Tensor> state_tensors(torch::nn::Module& m) {
  std::vector<torch::Tensor> v;
  for (auto& p : m.parameters()) v.push_back(p);
  for (auto& b : m.buffers()) v.push_back(b);
  return v;
}

std::vector<torch::Tensor> snapshot(torch::nn::Module& m) {
  torch::NoGradGuard g;
  std::vector<torch::Tensor> v;
  for (auto& t : state_tensors(m)) v.push_back(t.detach().clone());
  return v;
}

void load_into(torch::nn::Module& m, const std::vector<torch::Tensor>& v) {
  torch::NoGradGuard g;
  auto dst = state_tensors(m);
  if (dst.size() != v.size()) throw Error("checkpoint: weight count does not match the model");
  for (std::size_t i = 0; i < v.size(); ++i) dst[i].copy_(v[i]);
}

void write_list(torch::serialize::OutputArchive& a, const std::string& key, const std::vector<torch::Tensor>& v) {
  torch::serialize::OutputArchive sub;
  for (std::size_t i = 0; i < v.size(); ++i) sub.write("t" + std::to_string(i), v[i]);
  a.write(key, sub);
}

std::vector<torch::Tensor> read_list(torch::serialize::InputArchive& a, const std::string& key, std::size_t n) {
  torch::serialize::InputArchive sub;
  a.read(key, sub);
  std::vector<torch::Tensor> v(n);
  for (std::size_t i = 0; i < n; ++i) sub.read("t" + std::to_string(i), v[i]);
  return v;
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
    int lo = kernels::ExpHistogram::kMaxExp + 1, hi = kernels::ExpHistogram::kMinExp - 1;
    for (int e = kernels::ExpHistogram::kMinExp; e <= kernels::ExpHistogram::kMaxExp; ++e)
      if (s.hist.at(e)) lo = std::min(lo, e), hi = std::max(hi, e);
    nlohmann::json h = {{"lo", lo <= hi ? lo : 0}, {"zero", s.hist.zero}, {"inf", s.hist.inf}, {"nan", s.hist.nan}};
    std::vector<std::uint64_t> c;
    for (int e = lo; e <= hi; ++e) c.push_back(s.hist.at(e));
    h["counts"] = c;
    r.histogram = h.dump();
    rows.push_back(std::move(r));
  }
  return rows;
}

using Trace = std::vector<std::tuple<std::int64_t, int, bool>>;

std::string short_num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3f", v);
  return b;
}

}  // namespace

TrainResult train(const TrainConfig& cfg, results::Store* store, const TrainOptions& opt) {
  validate(cfg);
  const auto t_start = std::chrono::steady_clock::now();
  const int threads = cfg.threads > 0 ? cfg.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  torch::set_num_threads(threads);  // libtorch defaults to one thread on this kind of machine
  at::globalContext().setFlushDenormal(cfg.train.flush_denormals);
  // Keep freed activation buffers in the heap rather than faulting fresh pages every step.
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);

  const std::string ckpt = checkpoint_path(cfg);
  const std::string cfg_json = to_json(cfg);
  TrainResult res;
  if (opt.checkpoints) res.checkpoint = ckpt;
  if (opt.resume && !opt.checkpoints) throw Error("--resume needs checkpoints");

  // What a checkpoint holds besides tensors.
  nlohmann::json meta;
  std::unique_ptr<torch::serialize::InputArchive> in;
  if (opt.resume) {
    if (!fs::exists(ckpt)) throw Error(ckpt + ": no checkpoint to resume from");
    in = std::make_unique<torch::serialize::InputArchive>();
    try {
      in->load_from(ckpt);
      c10::IValue m;
      in->read("meta", m);
      meta = nlohmann::json::parse(m.toStringRef());
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      throw Error(ckpt + ": not a readable fp8lab checkpoint (" + std::string(e.what()).substr(0, 200) + ")");
    }
    if (meta.value("schema", 0) != kCheckpointSchema)
      throw Error(ckpt + ": checkpoint schema " + std::to_string(meta.value("schema", 0)) + ", this fp8lab reads " +
                  std::to_string(kCheckpointSchema));
    if (meta.value("finished", false))
      throw Error(ckpt + ": this run has finished; there is nothing to resume (start afresh without --resume)");
    if (meta["config"].get<std::string>() != cfg_json) {
      const auto a = nlohmann::json::parse(meta["config"].get<std::string>()), b = nlohmann::json::parse(cfg_json);
      std::string diff;
      for (const auto& d : nlohmann::json::diff(a, b)) diff += (diff.empty() ? "" : ", ") + d["path"].get<std::string>();
      throw Error(ckpt + ": checkpoint was written with a different config (" + diff +
                  "); resume with the same config, or start afresh without --resume");
    }
  }

  std::int64_t run_id = 0;
  if (store) {
    if (in && meta.value("run_id", 0) > 0 && meta.value("store", std::string()) == fs::absolute(store->path()).string()) {
      run_id = meta["run_id"].get<std::int64_t>();
      store->resume_run(run_id, meta["step"].get<std::int64_t>());
    } else {
      results::RunInfo info;
      info.name = cfg.name;
      info.kind = cfg.task;
      info.config_json = cfg_json;
      info.recipe = cfg.quant.recipe;
      info.loss_scale = cfg.quant.loss_scale;
      info.seed = cfg.seed;
      run_id = store->begin_run(info);
    }
  }
  res.run_id = run_id;
  const double prior_seconds = in ? meta.value("seconds", 0.0) : 0.0;

  try {
    // --- set up -----------------------------------------------------------------------------
    const nn::Recipe recipe = nn::load_recipe(cfg.quant.recipe);
    nn::LossScaleConfig ls = nn::parse_loss_scale(cfg.quant.loss_scale);
    if (ls.method == nn::LossScaleMethod::logmax && recipe.base[nn::TensorKind::gx])
      ls.grad_format_max = recipe.base[nn::TensorKind::gx]->format.max_finite();
    if (ls.method == nn::LossScaleMethod::backoff) {
      const auto& g = recipe.base[nn::TensorKind::gx];
      if (g && g->overflow == Overflow::saturate && opt.progress)
        std::fprintf(stderr,
                     "warning: Backoff loss scaling only sees overflow as NaN/Inf, but this recipe's gradient "
                     "quantizer saturates: the scale will only grow. Use overflow nan (e.g. gx=1.5.2:33/rne/nan) "
                     "or LogMax.\n");
    }
    torch::manual_seed(cfg.seed);
    const std::unique_ptr<Task> task = make_task(cfg);
    torch::nn::Module& model = task->module();
    res.model_description = task->description();
    res.metric_name = task->metric_name(true);
    auto ctx = std::make_shared<nn::QuantContext>();
    ctx->seed = cfg.seed;
    ctx->stats_interval = cfg.train.stats_interval;
    const nn::QuantizedModel qm = nn::quantize_model(model, recipe, ctx);
    nn::LossScaler scaler(ls);
    auto optimizer = make_optimizer(cfg.optimizer, model.parameters());

    const std::int64_t n = task->train_size(), B = cfg.train.batch;
    const std::int64_t steps_per_epoch = (n + B - 1) / B;
    const std::int64_t total = cfg.train.steps > 0 ? cfg.train.steps : steps_per_epoch * cfg.train.epochs;
    const std::int64_t eval_every = cfg.train.eval_interval > 0 ? cfg.train.eval_interval : steps_per_epoch;
    const std::int64_t ckpt_every = cfg.train.checkpoint_interval > 0 ? cfg.train.checkpoint_interval : steps_per_epoch;
    res.total_steps = total;
    if (opt.progress)
      std::fprintf(stderr, "%s: %s, recipe %s, loss scaling %s, %lld steps, seed %llu%s\n",
                   cfg.name.c_str(), task->description().c_str(), cfg.quant.recipe.c_str(),
                   cfg.quant.loss_scale.c_str(), static_cast<long long>(total),
                   static_cast<unsigned long long>(cfg.seed),
                   in ? (" (resumed at step " + std::to_string(meta["step"].get<std::int64_t>()) + ")").c_str() : "");

    std::vector<torch::Tensor> ema;
    if (cfg.train.ema > 0) ema = snapshot(model);
    std::vector<std::vector<torch::Tensor>> recent;  // the last K checkpoints' weights
    std::int64_t step = 0;
    double loss_ema = 0;
    bool finished = false;
    Trace pending;  // loss-scale points not yet in the store

    if (in) {
      model.load(*in);
      torch::serialize::InputArchive oa;
      in->read("optimizer", oa);
      optimizer->load(oa);
      step = meta["step"].get<std::int64_t>();
      loss_ema = meta["loss_ema"].get<double>();
      scaler.set_state(meta["scaler"].get<std::vector<double>>());
      ctx->step = static_cast<std::uint64_t>(step);
      for (const auto& e : meta["evals"]) res.evals.emplace_back(e[0].get<std::int64_t>(), e[1].get<double>());
      const auto counts = meta["counts"];
      for (std::size_t i = 0; i < qm.layers.size(); ++i) {
        std::array<QuantCounts, nn::kKinds> c{};
        for (int k = 0; k < nn::kKinds; ++k) {
          const auto& v = counts.at(i).at(k);
          c[k] = {v[0].get<std::uint64_t>(), v[1].get<std::uint64_t>(), v[2].get<std::uint64_t>(), v[3].get<std::uint64_t>()};
        }
        qm.layers[i]->add_counts(c);
      }
      const std::size_t nt = state_tensors(model).size();
      if (!ema.empty()) ema = read_list(*in, "ema", nt);
      for (int k = 0; k < meta.value("recent", 0); ++k) recent.push_back(read_list(*in, "recent" + std::to_string(k), nt));
      if (!store)
        for (const auto& p : meta["trace"]) pending.emplace_back(p[0].get<std::int64_t>(), p[1].get<int>(), p[2].get<bool>());
      in.reset();
    }

    auto save_checkpoint = [&] {
      if (!opt.checkpoints) {
        if (store) store->log_loss_scale(run_id, pending);
        pending.clear();
        return;
      }
      torch::serialize::OutputArchive a;
      nlohmann::json m = {{"schema", kCheckpointSchema}, {"config", cfg_json}, {"step", step},
                          {"loss_ema", loss_ema}, {"scaler", scaler.state()}, {"run_id", run_id},
                          {"store", store ? fs::absolute(store->path()).string() : std::string()},
                          {"code_version", results::Store::code_version()},
                          {"seconds", prior_seconds + std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count()},
                          {"recent", recent.size()}, {"finished", finished}};
      m["evals"] = res.evals;
      nlohmann::json counts = nlohmann::json::array();
      for (const auto& l : qm.layers) {
        nlohmann::json lc = nlohmann::json::array();
        for (const auto& c : l->counts()) lc.push_back({c.total, c.overflow, c.underflow, c.nan});
        counts.push_back(lc);
      }
      m["counts"] = counts;
      if (store) {
        store->log_loss_scale(run_id, pending);  // the store holds the trace up to here
        pending.clear();
      } else {
        m["trace"] = pending;
      }
      a.write("meta", c10::IValue(m.dump()));
      model.save(a);
      torch::serialize::OutputArchive oa;
      optimizer->save(oa);
      a.write("optimizer", oa);
      if (!ema.empty()) write_list(a, "ema", ema);
      for (std::size_t k = 0; k < recent.size(); ++k) write_list(a, "recent" + std::to_string(k), recent[k]);
      // Atomic: a temp file in the same folder, then rename over the old checkpoint.
      const fs::path target = fs::absolute(ckpt);
      if (!target.parent_path().empty()) fs::create_directories(target.parent_path());
      const std::string tmp = target.string() + ".tmp";
      a.save_to(tmp);
      fs::rename(tmp, target);
    };

    double eval_seconds = 0, ckpt_seconds = 0;  // kept out of the throughput figure
    auto eval_weights = [&](const std::vector<torch::Tensor>* w, bool final) {
      const auto t0 = std::chrono::steady_clock::now();
      double acc = 0;
      if (!w) {
        acc = evaluate(*task, *ctx, final);
      } else {
        const auto current = snapshot(model);
        load_into(model, *w);
        acc = evaluate(*task, *ctx, final);
        load_into(model, current);
      }
      eval_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      return acc;
    };

    // --- the loop ---------------------------------------------------------------------------
    Progress bar(cfg.name.size() > 24 ? cfg.name.substr(0, 24) : cfg.name, total, "steps", step);
    const std::int64_t first_step = step;
    // Throughput counts the steps after this session's first (allocation, kernel selection).
    auto t_loop = std::chrono::steady_clock::now();
    std::int64_t samples = 0;
    torch::Tensor perm;
    std::int64_t perm_epoch = -1;
    while (step < total) {
      if ((opt.stop_after > 0 && step - first_step >= opt.stop_after) || stop_requested()) {
        res.status = "stopped";
        break;
      }
      const std::int64_t epoch = step / steps_per_epoch, within = step % steps_per_epoch;
      if (epoch != perm_epoch) {
        auto g = at::make_generator<at::CPUGeneratorImpl>(mix64(cfg.seed ^ mix64(0xE90C0000ULL + static_cast<std::uint64_t>(epoch))));
        perm = torch::randperm(n, g, torch::kInt64);
        perm_epoch = epoch;
      }
      // Every random draw of this step (dropout, stochastic depth, augmentation, mixup)
      // comes from streams seeded by (seed, step).
      const std::uint64_t step_seed = mix64(cfg.seed * 0x9E3779B97F4A7C15ULL + static_cast<std::uint64_t>(step));
      torch::manual_seed(step_seed);
      const double lr = learning_rate(cfg, step, total, steps_per_epoch);
      for (auto& g : optimizer->param_groups()) g.options().set_lr(lr);

      const torch::Tensor idx = perm.slice(0, within * B, std::min(n, (within + 1) * B));
      optimizer->zero_grad();
      const torch::Tensor loss = task->loss(idx, step_seed);
      (loss * scaler.scale()).backward();
      std::vector<torch::Tensor> grads;
      for (auto& p : model.parameters())
        if (p.grad().defined()) grads.push_back(p.grad());
      const nn::LossScaleStep s = scaler.update(grads);
      pending.emplace_back(step, static_cast<int>(std::lround(std::log2(s.scale))), s.skipped);
      const double lv = loss.item<double>();
      if (!std::isfinite(lv)) {
        // The loss is computed before scaling: a NaN/Inf here is a forward-pass divergence
        // that no loss scale can recover.
        res.status = "diverged";
        break;
      }
      if (!s.skipped) optimizer->step();
      if (!ema.empty() && !s.skipped) {
        torch::NoGradGuard g;
        const auto cur = state_tensors(model);
        for (std::size_t i = 0; i < cur.size(); ++i) {
          if (ema[i].is_floating_point()) ema[i].mul_(cfg.train.ema).add_(cur[i].detach(), 1 - cfg.train.ema);
          else ema[i].copy_(cur[i]);
        }
      }
      if (step == first_step) {
        t_loop = std::chrono::steady_clock::now();
        eval_seconds = ckpt_seconds = 0;
      }
      else samples += idx.size(0);
      loss_ema = step == 0 ? lv : 0.98 * loss_ema + 0.02 * lv;
      if (store && ctx->stats_interval > 0 && ctx->stats->size() > 0) store->log_stats(run_id, stat_rows(ctx->stats->take()));
      ++step;
      ctx->step = static_cast<std::uint64_t>(step);

      if (step % eval_every == 0 || step == total) {
        const double acc = eval_weights(ema.empty() ? nullptr : &ema, false);
        res.evals.emplace_back(step, acc);
        if (store) {
          store->log_metric(run_id, step, task->metric_name(false), acc);
          store->log_metric(run_id, step, "train_loss", loss_ema);
          store->log_metric(run_id, step, "log2_loss_scale", scaler.log2_scale());
        }
      }
      if (step % ckpt_every == 0 || step == total) {
        if (cfg.train.average_last > 0) {
          recent.push_back(snapshot(model));
          if (static_cast<int>(recent.size()) > cfg.train.average_last) recent.erase(recent.begin());
        }
        const auto t0 = std::chrono::steady_clock::now();
        if (step < total) save_checkpoint();
        ckpt_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      }
      if (opt.progress)
        bar.update(step, "epoch " + std::to_string(step / steps_per_epoch + (step % steps_per_epoch ? 1 : 0)) +
                             " loss " + short_num(loss_ema) + " scale 2^" + std::to_string(scaler.log2_scale()) +
                             " lr " + short_num(lr));
    }
    const double loop_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t_loop).count() - eval_seconds - ckpt_seconds;
    res.samples_per_second = loop_s > 0 ? static_cast<double>(samples) / loop_s : 0;

    if (res.status == "stopped") {
      save_checkpoint();
    } else if (res.status == "finished") {
      res.final_metric = res.evals.empty() ? 0 : res.evals.back().second;
      if (task->separate_final()) {
        res.final_metric = eval_weights(ema.empty() ? nullptr : &ema, true);
        if (store) store->log_metric(run_id, step, task->metric_name(true), res.final_metric);
      }
      if (cfg.train.average_last > 0 && recent.size() > 1) {
        std::vector<torch::Tensor> avg;
        for (std::size_t i = 0; i < recent[0].size(); ++i) {
          torch::Tensor t = recent[0][i].clone();
          if (t.is_floating_point()) {
            for (std::size_t k = 1; k < recent.size(); ++k) t.add_(recent[k][i]);
            t.div_(static_cast<double>(recent.size()));
          }
          avg.push_back(t);
        }
        res.final_metric = eval_weights(&avg, true);
        if (store) store->log_metric(run_id, step, task->metric_name(true) + "_averaged", res.final_metric);
      }
    }
    if (store && !pending.empty()) {
      store->log_loss_scale(run_id, pending);
      pending.clear();
    }
    if (opt.progress)
      bar.finish(res.status == "finished" ? res.metric_name + " " + short_num(res.final_metric) : res.status);
    res.final_train_loss = loss_ema;
    res.final_log2_scale = scaler.log2_scale();
    res.skipped_steps = scaler.skipped_steps();
    res.steps = step;
    for (const auto& l : qm.layers) {
      const auto c = l->counts();
      for (int k = 0; k < nn::kKinds; ++k) res.counts[k] += c[k];
    }
    res.seconds = prior_seconds + std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
    if (store) {
      store->log_metric(run_id, step, "samples_per_second", res.samples_per_second);
      store->finish_run(run_id, res.status,
                        res.status == "finished" ? std::optional<double>(res.final_metric) : std::nullopt,
                        res.metric_name, res.seconds);
    }
    if (res.status == "finished") {
      finished = true;
      save_checkpoint();  // the trained weights, kept for the user; --resume refuses it
    }
    return res;
  } catch (...) {
    if (store) store->finish_run(run_id, "failed", std::nullopt, res.metric_name, 0);
    throw;
  }
}

}  // namespace fp8lab::experiments
