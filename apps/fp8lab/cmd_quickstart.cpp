// fp8lab quickstart: the main job. Trains a small ResNet on Fashion-MNIST with the float32
// baseline and the paper's 1.4.3/1.5.2 recipe and prints both side by side.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "commands.hpp"
#include "fp8lab/data/idx.hpp"
#include "fp8lab/train/trainer.hpp"
#include "table.hpp"

namespace fp8lab::cli {

namespace {
struct QuickstartArgs {
  std::string data_dir = data::kFashionMnistDir;
  int depth = 8, width = 16, epochs = 2, batch = 128, threads = 0;
  double lr = 0.1;
  std::int64_t limit = 0;
  std::uint64_t seed = 1;
  std::vector<std::string> recipes = {"fp32", "resnet32-mixed"};
  std::vector<std::string> loss_scales = {};
  std::string db = "results.db";
};

void run_quickstart(QuickstartArgs a) {
  if (!a.loss_scales.empty() && a.loss_scales.size() != a.recipes.size())
    throw Error("--loss-scale takes one value per recipe (" + std::to_string(a.recipes.size()) + ")");
  // Every recipe and loss scaling parsed before the first run: a typo in the last one is an
  // error now, not after the others have trained.
  std::vector<settings::Spelled<nn::Recipe>> recipes;
  std::vector<settings::Spelled<nn::LossScaleConfig>> loss_scales;
  for (std::size_t i = 0; i < a.recipes.size(); ++i) {
    recipes.push_back(settings::recipe_setting(a.recipes[i]));
    if (!a.loss_scales.empty()) loss_scales.push_back(settings::loss_scale_setting(a.loss_scales[i]));
  }
  data::mnist_paths(a.data_dir, true);
  data::mnist_paths(a.data_dir, false);
  settings::TrainConfig base;
  base.name = "quickstart";
  base.model.name = "resnet" + std::to_string(a.depth);
  base.model.width = a.width;
  // Fashion-MNIST's own folder under its own name; any other folder of the same layout as "mnist".
  const bool fashion = a.data_dir == data::kFashionMnistDir;
  base.data.name = fashion ? "fashion-mnist" : "mnist";
  base.data.dir = fashion ? "" : a.data_dir;
  base.data.train_limit = a.limit;
  base.train.epochs = a.epochs;
  base.train.batch = a.batch;
  base.optimizer.lr = a.lr;
  base.seed = a.seed;
  base.threads = a.threads;
  train::validate(base);
  results::Store store(a.db);
  std::fprintf(stderr, "fp8lab quickstart: CIFAR ResNet-%d (width %d) on %s, %d epochs, batch %d, seed %llu\n",
               a.depth, a.width, a.data_dir.c_str(), a.epochs, a.batch, static_cast<unsigned long long>(a.seed));
  Table t({"recipe", "status", "test_accuracy_pct", "train_loss", "final_loss_scale", "skipped_steps",
           "a_underflow_pct", "w_underflow_pct", "gx_underflow_pct", "gw_underflow_pct", "overflow_pct",
           "seconds"});
  for (std::size_t i = 0; i < a.recipes.size(); ++i) {
    settings::TrainConfig cfg = base;
    cfg.quant.recipe = recipes[i];
    if (!loss_scales.empty()) cfg.quant.loss_scale = loss_scales[i];
    train::TrainOptions opt;
    opt.checkpoints = false;  // a few minutes' demo: nothing to resume
    const auto r = train::train(cfg, &store, opt);
    std::uint64_t ovf = 0, tot = 0;
    for (const auto& c : r.counts) {
      ovf += c.overflow;
      tot += c.total;
    }
    auto under = [&](nn::TensorKind k) {
      const auto& c = r.counts[static_cast<int>(k)];
      return pct(c.underflow, c.total);
    };
    t.add({a.recipes[i], std::string(results::to_string(r.status)), fmt_f(r.final_metric, 2), fmt_f(r.final_train_loss, 4),
           "2^" + std::to_string(r.final_log2_scale), std::to_string(r.skipped_steps),
           under(nn::TensorKind::a), under(nn::TensorKind::w), under(nn::TensorKind::gx),
           under(nn::TensorKind::gw), pct(ovf, tot), fmt_f(r.seconds, 1)});
  }
  std::printf("\n");
  t.print(false);
  std::printf("\nunderflow: non-zero values flushed to zero by each tensor kind's quantizer; "
              "overflow: values beyond the format's max (saturated); fp32 kinds show 0.\n"
              "Recorded in %s: see `fp8lab runs --db %s`.\n", a.db.c_str(), a.db.c_str());
}
}  // namespace

void register_quickstart(CLI::App& app) {
  auto args = std::make_shared<QuickstartArgs>();
  auto* cmd = app.add_subcommand(
      "quickstart", "Train a small ResNet on Fashion-MNIST in float32 and with the paper's 8-bit recipe");
  cmd->add_option("--data", args->data_dir, "MNIST-layout folder")->capture_default_str();
  cmd->add_option("--recipe", args->recipes, "Recipes to compare (presets, lines or .toml files)")
      ->capture_default_str();
  cmd->add_option("--loss-scale", args->loss_scales, "Loss scaling per recipe (none, static:K, backoff, logmax:c=1)");
  cmd->add_option("--epochs", args->epochs, "Epochs")->capture_default_str();
  cmd->add_option("--batch", args->batch, "Batch size")->capture_default_str();
  cmd->add_option("--depth", args->depth, "ResNet depth (6n+2)")->capture_default_str();
  cmd->add_option("--width", args->width, "Channels of the first stage")->capture_default_str();
  cmd->add_option("--lr", args->lr, "Learning rate")->capture_default_str();
  cmd->add_option("--limit", args->limit, "Use the first N training images (0: all)")
      ->capture_default_str();
  cmd->add_option("--seed", args->seed, "Seed")->capture_default_str();
  cmd->add_option("--threads", args->threads, "Threads (0: all cores)")->capture_default_str();
  cmd->add_option("--db", args->db, "Results store (SQLite)")->capture_default_str();
  cmd->callback([args] { run_quickstart(*args); });
}

}  // namespace fp8lab::cli
