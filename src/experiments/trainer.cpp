#include "fp8lab/experiments/trainer.hpp"

#include <malloc.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <thread>

#include "fp8lab/data/idx.hpp"
#include "fp8lab/experiments/progress.hpp"
#include "fp8lab/models/resnet.hpp"
#include "fp8lab/nn/loss_scale.hpp"
#include "fp8lab/nn/modules.hpp"

namespace fp8lab::experiments {

namespace {

double evaluate(models::CifarResNet& model, const data::ImageSet& set) {
  torch::NoGradGuard no_grad;
  model->eval();
  std::int64_t correct = 0;
  for (std::int64_t b = 0; b < set.size(); b += 1000) {
    const std::int64_t e = std::min(set.size(), b + 1000);
    const auto pred = model->forward(set.images.slice(0, b, e)).argmax(1);
    correct += pred.eq(set.labels.slice(0, b, e)).sum().item<std::int64_t>();
  }
  model->train();
  return 100.0 * static_cast<double>(correct) / static_cast<double>(set.size());
}

std::string scale_text(int log2) { return "scale 2^" + std::to_string(log2); }

}  // namespace

std::string to_json(const ImageTrainConfig& c) {
  nlohmann::json j = {{"data_dir", c.data_dir}, {"num_classes", c.num_classes}, {"model", "cifar-resnet"},
                      {"depth", c.depth}, {"width", c.width}, {"recipe", c.recipe},
                      {"loss_scale", c.loss_scale}, {"epochs", c.epochs}, {"batch", c.batch},
                      {"optimizer", "sgd"}, {"lr", c.lr}, {"momentum", c.momentum},
                      {"weight_decay", c.weight_decay}, {"lr_decay_at", c.lr_decay_at},
                      {"train_limit", c.train_limit}, {"seed", c.seed}, {"threads", c.threads}};
  return j.dump();
}

namespace {
ImageTrainResult train_impl(const ImageTrainConfig& cfg, results::Store* store, std::int64_t run_id);
}  // namespace

ImageTrainResult train_image_classifier(const ImageTrainConfig& cfg, results::Store* store,
                                        const std::string& run_name) {
  std::int64_t run_id = 0;
  if (store) {
    results::RunInfo info;
    info.name = run_name;
    info.kind = "image-classification";
    info.config_json = to_json(cfg);
    info.recipe = cfg.recipe;
    info.loss_scale = cfg.loss_scale;
    info.seed = cfg.seed;
    run_id = store->begin_run(info);
  }
  try {
    ImageTrainResult r = train_impl(cfg, store, run_id);
    r.run_id = run_id;
    if (store)
      store->finish_run(run_id, r.status,
                        r.status == "finished" ? std::optional<double>(r.test_accuracy) : std::nullopt,
                        "test_accuracy", r.seconds);
    return r;
  } catch (...) {
    if (store) store->finish_run(run_id, "failed", std::nullopt, "test_accuracy", 0);
    throw;
  }
}

namespace {
ImageTrainResult train_impl(const ImageTrainConfig& cfg, results::Store* store, std::int64_t run_id) {
  const auto t0 = std::chrono::steady_clock::now();
  const int threads = cfg.threads > 0 ? cfg.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  torch::set_num_threads(threads);  // libtorch defaults to one thread on this kind of machine
  // Keep freed activation buffers in the heap rather than faulting fresh pages every step.
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  if (cfg.epochs < 1 || cfg.batch < 1) throw Error("epochs and batch must be >= 1");

  const nn::Recipe recipe = nn::load_recipe(cfg.recipe);
  nn::LossScaleConfig ls = nn::parse_loss_scale(cfg.loss_scale);
  if (ls.method == nn::LossScaleMethod::logmax && recipe.base[nn::TensorKind::gx])
    ls.grad_format_max = recipe.base[nn::TensorKind::gx]->format.max_finite();

  data::ImageSet train = data::load_mnist_folder(cfg.data_dir, true, cfg.num_classes);
  const data::ImageSet test = data::load_mnist_folder(cfg.data_dir, false, cfg.num_classes);
  if (cfg.train_limit > 0 && cfg.train_limit < train.size()) {
    train.images = train.images.slice(0, 0, cfg.train_limit);
    train.labels = train.labels.slice(0, 0, cfg.train_limit);
  }
  // Normalise with the training set's statistics.
  const double mean = train.images.mean().item<double>(), sd = train.images.std().item<double>();
  train.images = (train.images - mean) / sd;
  data::ImageSet test_n = test;
  test_n.images = (test.images - mean) / sd;

  torch::manual_seed(cfg.seed);
  models::CifarResNetOptions mo;
  mo.depth = cfg.depth;
  mo.width = cfg.width;
  mo.in_channels = static_cast<int>(train.images.size(1));
  mo.num_classes = cfg.num_classes;
  models::CifarResNet model(mo);
  auto ctx = std::make_shared<nn::QuantContext>();
  ctx->seed = cfg.seed;
  const nn::QuantizedModel qm = nn::quantize_model(*model, recipe, ctx);
  nn::LossScaler scaler(ls);
  torch::optim::SGD opt(model->parameters(),
                        torch::optim::SGDOptions(cfg.lr).momentum(cfg.momentum).weight_decay(cfg.weight_decay));

  const std::int64_t n = train.size();
  const std::int64_t steps_per_epoch = (n + cfg.batch - 1) / cfg.batch;
  const std::int64_t total = steps_per_epoch * cfg.epochs;
  ImageTrainResult res;
  std::vector<std::tuple<std::int64_t, int, bool>> trace;  // the loss-scale trace
  Progress bar(recipe.name.size() > 24 ? recipe.name.substr(0, 24) : recipe.name, total);
  std::int64_t step = 0;
  double loss_ema = 0;
  for (int epoch = 0; epoch < cfg.epochs && res.status == "finished"; ++epoch) {
    const torch::Tensor perm = torch::randperm(n, torch::kInt64);
    for (std::int64_t b = 0; b < n; b += cfg.batch, ++step) {
      // Step decay at fractions of training, as in the paper's ResNet runs.
      double lr = cfg.lr;
      for (double f : cfg.lr_decay_at)
        if (step >= static_cast<std::int64_t>(f * total)) lr *= 0.1;
      for (auto& g : opt.param_groups()) static_cast<torch::optim::SGDOptions&>(g.options()).lr(lr);

      const torch::Tensor idx = perm.slice(0, b, std::min(n, b + cfg.batch));
      const torch::Tensor x = train.images.index_select(0, idx), t = train.labels.index_select(0, idx);
      opt.zero_grad();
      const torch::Tensor loss = torch::nn::functional::cross_entropy(model->forward(x), t);
      (loss * scaler.scale()).backward();
      std::vector<torch::Tensor> grads;
      for (auto& p : model->parameters()) grads.push_back(p.grad());
      const nn::LossScaleStep s = scaler.update(grads);
      trace.emplace_back(step, static_cast<int>(std::lround(std::log2(s.scale))), s.skipped);
      const double lv = loss.item<double>();
      if (!std::isfinite(lv)) {
        // The loss is computed before scaling: a NaN/Inf here is a forward-pass divergence
        // that no loss scale can recover.
        res.status = "diverged";
        break;
      }
      if (!s.skipped) opt.step();
      ctx->step++;
      loss_ema = step == 0 ? lv : 0.98 * loss_ema + 0.02 * lv;
      if (cfg.progress)
        bar.update(step + 1, "epoch " + std::to_string(epoch + 1) + " loss " +
                                 std::to_string(loss_ema).substr(0, 5) + " " + scale_text(scaler.log2_scale()));
    }
    res.epoch_accuracy.push_back(evaluate(model, test_n));
    if (store) store->log_metric(run_id, step, "test_accuracy", res.epoch_accuracy.back());
  }
  if (store) {
    store->log_metric(run_id, step, "train_loss", loss_ema);
    store->log_loss_scale(run_id, trace);
  }
  if (cfg.progress) bar.finish("test accuracy " + std::to_string(res.epoch_accuracy.empty() ? 0.0 : res.epoch_accuracy.back()).substr(0, 5) + " %");
  res.test_accuracy = res.epoch_accuracy.empty() ? 0 : res.epoch_accuracy.back();
  res.final_train_loss = loss_ema;
  res.final_log2_scale = scaler.log2_scale();
  res.skipped_steps = scaler.skipped_steps();
  res.steps = static_cast<std::uint64_t>(step);
  for (const auto& l : qm.layers) {
    const auto c = l->counts();
    for (int k = 0; k < nn::kKinds; ++k) res.counts[k] += c[k];
  }
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}
}  // namespace

}  // namespace fp8lab::experiments
