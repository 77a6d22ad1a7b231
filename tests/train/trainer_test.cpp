// The trainer on synthetic data: finished, diverged and failed runs in the store; resume
// gives exactly the uninterrupted run; checkpoints refuse a changed config.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "../common/testutil.hpp"
#include "configs.hpp"
#include "../../src/train/train_state.hpp"
#include "fp8lab/study/sweep.hpp"
#include "fp8lab/train/trainer.hpp"
#include "fp8lab/nn/compute.hpp"
#include "fp8lab/results/store.hpp"

using namespace fp8lab;
namespace fs = std::filesystem;
using test::error_of;

namespace {
fs::path dir() { return test::temp_dir("fp8lab_trainer"); }

settings::TrainConfig small(const std::string& name) { return test::small_config(name, dir()); }

train::TrainOptions quiet() {
  train::TrainOptions o;
  o.progress = false;
  return o;
}

settings::TrainConfig busy(const std::string& name) { return test::busy_config(name, dir()); }
}  // namespace

TEST(Trainer, FinishesLearnsAndRecords) {
  results::Store store((dir() / "r1.db").string());
  const auto r = train::train(small("unit"), &store, quiet());
  EXPECT_EQ(r.status, results::RunStatus::finished);
  EXPECT_EQ(r.steps, 24);
  EXPECT_EQ(r.evals.size(), 3u);
  EXPECT_GT(r.final_metric, 90.0);
  const auto runs = store.runs({.name = "unit"});
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].status, results::RunStatus::finished);
  EXPECT_DOUBLE_EQ(*runs[0].final_metric, r.final_metric);
  EXPECT_EQ(store.metric(runs[0].id, "test_accuracy").size(), 3u);
  EXPECT_EQ(store.loss_scale_trace(runs[0].id).size(), 24u);
  EXPECT_NE(runs[0].config_json.find("\"recipe\":\"resnet32-mixed\""), std::string::npos);
  EXPECT_GT(r.counts[static_cast<int>(nn::TensorKind::a)].total, 0u);
  // The final checkpoint holds the trained weights, and refuses to be resumed.
  EXPECT_TRUE(fs::exists(r.checkpoint));
  EXPECT_FALSE(fs::exists(r.checkpoint + ".tmp"));
  train::TrainOptions o = quiet();
  o.resume = true;
  EXPECT_NE(error_of([&] { train::train(small("unit"), nullptr, o); }).find("has finished"), std::string::npos);
}

TEST(Trainer, EveryOptimizerAndScheduleLearns) {
  for (const char* opt : {"sgd", "adam", "adamw", "rmsprop"}) {
    for (const char* sched : {"constant", "step", "warmup-invsqrt", "linear", "exponential"}) {
      auto c = small(std::string("o_") + opt + sched);
      c.optimizer.name = opt;
      c.optimizer.lr = std::string(opt) == "sgd" ? 0.1 : 0.01;
      if (std::string(opt) == "rmsprop") c.optimizer.momentum = 0, c.optimizer.lr = 0.003;
      c.schedule.name = sched;
      c.schedule.warmup_steps = 4;
      c.quant.recipe = settings::recipe_setting("fp32");
      const auto r = train::train(c, nullptr, quiet());
      EXPECT_EQ(r.status, results::RunStatus::finished) << opt << " " << sched;
      EXPECT_GT(r.final_metric, 75.0) << opt << " " << sched;
    }
  }
}

TEST(Trainer, LearningRateSchedules) {
  settings::TrainConfig c;
  c.optimizer.lr = 1.0;
  c.schedule.name = "step";
  c.schedule.decay_at = {0.5, 0.75};
  EXPECT_DOUBLE_EQ(train::learning_rate(c, 49, 100, 10), 1.0);
  EXPECT_DOUBLE_EQ(train::learning_rate(c, 50, 100, 10), 0.1);
  EXPECT_NEAR(train::learning_rate(c, 75, 100, 10), 0.01, 1e-15);
  c.schedule.name = "warmup-invsqrt";
  c.schedule.warmup_steps = 4;
  EXPECT_DOUBLE_EQ(train::learning_rate(c, 0, 100, 10), 0.25);   // 1/4
  EXPECT_DOUBLE_EQ(train::learning_rate(c, 3, 100, 10), 1.0);    // peak at the warm-up's end
  EXPECT_DOUBLE_EQ(train::learning_rate(c, 15, 100, 10), 0.5);   // sqrt(4/16)
  c.schedule.name = "linear";
  EXPECT_DOUBLE_EQ(train::learning_rate(c, 1, 100, 10), 0.5);    // warm-up 2/4
  EXPECT_DOUBLE_EQ(train::learning_rate(c, 52, 100, 10), 0.5);   // (100-52)/(100-4)
  c.schedule.name = "exponential";
  c.schedule.gamma = 0.5;
  c.schedule.every_epochs = 2;
  EXPECT_DOUBLE_EQ(train::learning_rate(c, 4 + 19, 100, 10), 1.0);  // 1.9 epochs after warm-up
  EXPECT_DOUBLE_EQ(train::learning_rate(c, 4 + 20, 100, 10), 0.5);
  EXPECT_DOUBLE_EQ(train::learning_rate(c, 4 + 45, 100, 10), 0.25);
}

// One run straight through, one stopped twice and resumed, each with its own store.
void check_resume_equals_uninterrupted(const std::string& model, const std::string& recipe = "") {
  const fs::path d = dir();
  const std::string tag = model + (recipe.empty() ? "" : "-scaled");
  fs::remove(d / ("u" + tag + ".db"));
  fs::remove(d / ("s" + tag + ".db"));
  results::Store s1((d / ("u" + tag + ".db")).string()), s2((d / ("s" + tag + ".db")).string());
  auto c = busy("resume" + tag);
  c.model.name = model;
  if (!recipe.empty()) {
    c.quant.recipe = settings::recipe_setting(recipe);
    c.quant.loss_scale = settings::loss_scale_setting("none");
  }
  if (model.rfind("efficientnet", 0) == 0) {
    // Dropout and stochastic depth draw from the global generator.
    c.model.width_mult = 0.25;
    c.model.depth_mult = 0.3;
    c.model.dropout = 0.3;
  }
  const auto full = train::train(c, &s1, quiet());
  ASSERT_EQ(full.status, results::RunStatus::finished);
  // The final metric is the averaged weights' (average_last = 2), and says so.
  EXPECT_EQ(full.metric_name, "test_accuracy_averaged");
  EXPECT_EQ(s1.runs()[0].metric_name, "test_accuracy_averaged");
  EXPECT_DOUBLE_EQ(s1.metric(s1.runs()[0].id, "test_accuracy_averaged").at(0).second, full.final_metric);
  c.train.checkpoint = (d / ("resume2" + tag + ".ckpt")).string();
  train::TrainOptions o = quiet();
  o.stop_after = 7;  // not on a checkpoint or evaluation boundary
  auto r = train::train(c, &s2, o);
  EXPECT_EQ(r.status, results::RunStatus::stopped);
  EXPECT_EQ(r.steps, 7);
  EXPECT_EQ(s2.runs()[0].status, results::RunStatus::stopped);
  o.resume = true;
  o.stop_after = 9;
  r = train::train(c, &s2, o);
  EXPECT_EQ(r.status, results::RunStatus::stopped);
  EXPECT_EQ(r.steps, 16);
  o.stop_after = 0;
  r = train::train(c, &s2, o);
  ASSERT_EQ(r.status, results::RunStatus::finished);
  EXPECT_EQ(r.steps, full.steps);
  EXPECT_EQ(r.final_metric, full.final_metric);
  EXPECT_EQ(r.final_train_loss, full.final_train_loss);  // bitwise: the same steps were taken
  EXPECT_EQ(r.evals, full.evals);
  EXPECT_EQ(r.final_log2_scale, full.final_log2_scale);
  EXPECT_EQ(r.skipped_steps, full.skipped_steps);
  for (int k = 0; k < nn::kKinds; ++k) {
    EXPECT_EQ(r.counts[k].total, full.counts[k].total);
    EXPECT_EQ(r.counts[k].underflow, full.counts[k].underflow);
    EXPECT_EQ(r.counts[k].overflow, full.counts[k].overflow);
  }
  // The store of the interrupted run holds what the uninterrupted one does: one run, the
  // same metrics, trace and statistics, no duplicates.
  ASSERT_EQ(s2.runs().size(), 1u);
  const auto id1 = s1.runs()[0].id, id2 = s2.runs()[0].id;
  EXPECT_EQ(s2.runs()[0].status, results::RunStatus::finished);
  EXPECT_EQ(s1.metric(id1, "test_accuracy"), s2.metric(id2, "test_accuracy"));
  EXPECT_EQ(s1.metric(id1, "train_loss"), s2.metric(id2, "train_loss"));
  EXPECT_EQ(s1.loss_scale_trace(id1), s2.loss_scale_trace(id2));
  EXPECT_EQ(s1.loss_scale_trace(id1).size(), static_cast<std::size_t>(full.steps));
  const auto st1 = s1.stats(id1), st2 = s2.stats(id2);
  ASSERT_EQ(st1.size(), st2.size());
  ASSERT_FALSE(st1.empty());
  for (std::size_t i = 0; i < st1.size(); ++i) {
    EXPECT_EQ(st1[i].step, st2[i].step);
    EXPECT_EQ(st1[i].histogram, st2[i].histogram);
  }
}

// model.channels_last changes no value that fp8lab computes: with the products on the
// compute layer (which runs convolutions channels-last in either case, docs/spec.md §7.2)
// a run with augmentation, mixup, cutmix, stochastic rounding and loss scaling is the same
// bit for bit in both layouts; in float32 the two differ only in the order of sums.
TEST(Trainer, ChannelsLastChangesNoQuantizedValue) {
  const auto run = [](const std::string& name, bool channels_last, const std::string& compute) {
    auto c = busy(name);
    c.train.epochs = 1;
    c.model.width = 16;
    c.data.synthetic_channels = 3;
    c.data.image_size = 16;
    c.model.channels_last = channels_last;
    c.quant.compute = nn::parse_compute(compute);
    return train::train(c, nullptr, quiet());
  };
  const auto nchw = run("layout-nchw", false, "fp32"), nhwc = run("layout-nhwc", true, "fp32");
  ASSERT_EQ(nchw.status, results::RunStatus::finished);
  ASSERT_EQ(nhwc.status, results::RunStatus::finished);
  EXPECT_NEAR(nhwc.final_train_loss, nchw.final_train_loss, 1e-3 * std::abs(nchw.final_train_loss));
  // Different sums: the layout reached libtorch's convolutions (oneDNN's NHWC kernels sum in
  // another order than its blocked NCHW ones on these 16-64-channel layers).
  EXPECT_NE(nhwc.final_train_loss, nchw.final_train_loss);
  if (!nn::bf16_products_available()) GTEST_SKIP() << "no bfloat16 products on this CPU (auto is fp32 here)";
  const auto a = run("layout-nchw-auto", false, "auto"), b = run("layout-nhwc-auto", true, "auto");
  EXPECT_EQ(a.final_train_loss, b.final_train_loss);
  EXPECT_EQ(a.evals, b.evals);
  for (int k = 0; k < nn::kKinds; ++k) EXPECT_EQ(a.counts[k].underflow, b.counts[k].underflow);
}

TEST(Trainer, MovingAverageDecayWarmsUp) {
  // TensorFlow's ExponentialMovingAverage with num_updates: min(decay, (1 + n) / (10 + n)).
  EXPECT_DOUBLE_EQ(train::ema_decay(0.999, 0), 0.1);
  EXPECT_DOUBLE_EQ(train::ema_decay(0.999, 90), 0.91);
  EXPECT_DOUBLE_EQ(train::ema_decay(0.999, 8990), 0.999);  // 8991/9000 = 0.999 exactly
  EXPECT_DOUBLE_EQ(train::ema_decay(0.999, 100000), 0.999);
  EXPECT_DOUBLE_EQ(train::ema_decay(0.5, 0), 0.1);
  EXPECT_DOUBLE_EQ(train::ema_decay(0.5, 10), 0.5);
  // After 1,400 steps the initial weights' share of the average is their product.
  double init_share = 1;
  for (std::int64_t n = 0; n < 1400; ++n) init_share *= train::ema_decay(0.999, n);
  EXPECT_LT(init_share, 1e-3);  // a fixed 0.999 leaves 0.999^1400 = 0.25
}

TEST(Trainer, ResumeEqualsUninterrupted) {
  check_resume_equals_uninterrupted("resnet8");
  check_resume_equals_uninterrupted("efficientnet-b0");
}

// Delayed scaling's amax histories travel in the checkpoint: without them the resumed steps
// would scale from a fresh history and differ. Block scales and stochastic rounding too.
TEST(Trainer, ResumeEqualsUninterruptedWithDelayedAndBlockScaling) {
  check_resume_equals_uninterrupted(
      "resnet8", "a=e4m3_delayed,w=mxfp8_e4m3,gx=e5m2@tensor:fp32:nearest:delayed-4/stochastic,gw=nvfp4");
}

TEST(Trainer, KilledRunResumesFromItsLastCheckpoint) {
  // A process that dies between checkpoints leaves metrics after the checkpoint in the
  // store; resuming drops them and redoes the steps.
  const fs::path d = dir();
  results::Store s1((d / "k1.db").string());
  auto c = busy("killed");
  const auto full = train::train(c, &s1, quiet());
  auto c2 = busy("killed");
  c2.train.checkpoint = (d / "killed2.ckpt").string();
  results::Store s2((d / "k2.db").string());
  train::TrainOptions o = quiet();
  o.stop_after = 8;  // checkpoint at 8 ...
  train::train(c2, &s2, o);
  fs::copy_file(c2.train.checkpoint, d / "at8.ckpt", fs::copy_options::overwrite_existing);
  o.resume = true;
  o.stop_after = 3;  // ... runs on to 11 (evaluation at 10) ...
  train::train(c2, &s2, o);
  fs::copy_file(d / "at8.ckpt", c2.train.checkpoint, fs::copy_options::overwrite_existing);  // ... "killed" after 8
  o.stop_after = 0;
  const auto r = train::train(c2, &s2, o);
  EXPECT_EQ(r.final_metric, full.final_metric);
  EXPECT_EQ(s1.metric(s1.runs()[0].id, "test_accuracy"), s2.metric(s2.runs()[0].id, "test_accuracy"));
  EXPECT_EQ(s1.loss_scale_trace(s1.runs()[0].id), s2.loss_scale_trace(s2.runs()[0].id));
}

TEST(Trainer, ResumeRefusesAChangedConfigOrNoCheckpoint) {
  auto c = small("changed");
  train::TrainOptions o = quiet();
  o.stop_after = 3;
  train::train(c, nullptr, o);
  c.optimizer.lr = 0.5;
  o.resume = true;
  const std::string e = error_of([&] { train::train(c, nullptr, o); });
  EXPECT_NE(e.find("different config"), std::string::npos) << e;
  EXPECT_NE(e.find("/optimizer/lr"), std::string::npos) << e;
  auto c2 = small("never-started");
  EXPECT_NE(error_of([&] { train::train(c2, nullptr, o); }).find("no checkpoint"), std::string::npos);
  // A corrupt checkpoint is an error naming the file, not a crash.
  std::ofstream(c2.train.checkpoint) << "not a checkpoint";
  EXPECT_NE(error_of([&] { train::train(c2, nullptr, o); }).find(c2.train.checkpoint), std::string::npos);
}

TEST(Trainer, AnUnfinishedRunsCheckpointIsNeverOverwrittenSilently) {
  auto c = small("unfinished");
  train::TrainOptions o = quiet();
  o.stop_after = 3;
  train::train(c, nullptr, o);
  const auto stopped_bytes = std::filesystem::file_size(c.train.checkpoint);
  o.stop_after = 0;
  const std::string e = error_of([&] { train::train(c, nullptr, o); });
  EXPECT_NE(e.find(c.train.checkpoint + ": holds the checkpoint of an unfinished run (step 3)"), std::string::npos)
      << e;
  EXPECT_NE(e.find("--resume"), std::string::npos) << e;
  EXPECT_NE(e.find("--restart"), std::string::npos) << e;
  EXPECT_EQ(std::filesystem::file_size(c.train.checkpoint), stopped_bytes);
  o.restart = true;  // on purpose: the stopped run is discarded
  EXPECT_EQ(train::train(c, nullptr, o).status, results::RunStatus::finished);
  o.restart = false;  // a finished run's checkpoint may be replaced
  EXPECT_EQ(train::train(c, nullptr, o).status, results::RunStatus::finished);
}

TEST(Trainer, TwoRunsNeverShareACheckpoint) {
  auto c = small("locked");
  train::CheckpointLock held(c.train.checkpoint);  // as a running run holds it
  const std::string e = error_of([&] { train::train(c, nullptr, quiet()); });
  EXPECT_NE(e.find("another run is using this checkpoint (process " + std::to_string(::getpid()) + ")"),
            std::string::npos)
      << e;
  // Another name of the same checkpoint (a symbolic link, a spelling through "..") takes
  // the same lock.
  const fs::path link = dir() / "locked-link.ckpt";
  fs::remove(link);
  fs::create_symlink(fs::absolute(c.train.checkpoint), link);
  for (const std::string& other : {link.string(), (dir() / ".." / dir().filename() / "locked.ckpt").string()}) {
    auto d = small("other");
    d.train.checkpoint = other;
    EXPECT_NE(error_of([&] { train::train(d, nullptr, quiet()); }).find("another run is using this checkpoint"),
              std::string::npos)
        << other;
  }
}

TEST(Trainer, DivergenceIsRecordedNotACrash) {
  results::Store store((dir() / "r2.db").string());
  auto c = small("boom");
  c.quant.recipe = settings::recipe_setting("fp32");
  c.optimizer.lr = 1e6;  // the largest accepted: blows up within a few steps
  const auto r = train::train(c, &store, quiet());
  EXPECT_EQ(r.status, results::RunStatus::diverged);
  EXPECT_EQ(store.runs({.name = "boom"})[0].status, results::RunStatus::diverged);
}

TEST(Trainer, BadRecipeIsRefusedBeforeAnythingIsRecorded) {
  results::Store store((dir() / "r3.db").string());
  // A recipe is parsed where the config is read: a bad one never reaches train().
  const std::string e = error_of([&] { (void)settings::recipe_setting("a=1.4.3,q=1"); });
  EXPECT_NE(e.find("quant.recipe"), std::string::npos) << e;
  const std::string set = error_of([&] { (void)train::parse_train_config("", "t", {"quant.recipe=a=1.4.3,q=1"}); });
  EXPECT_NE(set.find("quant.recipe"), std::string::npos) << set;
  EXPECT_NE(set.find("unknown key 'q'"), std::string::npos) << set;
  EXPECT_TRUE(store.runs({.name = "bad"}).empty());
}

TEST(Trainer, AFailureDuringTheRunIsRecordedAsFailed) {
  results::Store store((dir() / "r4.db").string());
  auto c = small("nodata");
  c.data.name = "mnist";
  c.data.dir = (dir() / "no-such-folder").string();  // valid config, fails when the data loads
  EXPECT_THROW(train::train(c, &store, quiet()), Error);
  ASSERT_EQ(store.runs({.name = "nodata"}).size(), 1u);
  EXPECT_EQ(store.runs({.name = "nodata"})[0].status, results::RunStatus::failed);
}

namespace {
// A word-for-word "translation" corpus: English words mapped to Spanish ones, same order.
fs::path word_corpus() {
  const fs::path d = dir() / "words";
  fs::create_directories(d);
  const std::vector<std::string> en = {"god", "light", "earth", "water", "day", "night", "man", "king"},
                                 es = {"dios", "luz", "tierra", "agua", "dia", "noche", "hombre", "rey"};
  std::uint64_t x = 12345;
  auto next = [&] { return (x = x * 6364136223846793005ULL + 1442695040888963407ULL) >> 33; };
  for (const auto& [split, n] : std::vector<std::pair<std::string, int>>{{"train", 2000}, {"dev", 40}, {"test", 40}}) {
    std::ofstream fe(d / (split + ".en")), fs_(d / (split + ".es"));
    for (int i = 0; i < n; ++i) {
      const int len = 3 + static_cast<int>(next() % 3);
      for (int k = 0; k < len; ++k) {
        const auto w = next() % en.size();
        fe << (k ? " " : "") << en[w];
        fs_ << (k ? " " : "") << es[w];
      }
      fe << "\n";
      fs_ << "\n";
    }
  }
  return d;
}
}  // namespace

TEST(Trainer, TranslationLearnsAWordMapping) {
  if (std::system("command -v spm_train >/dev/null 2>&1") != 0) GTEST_SKIP() << "sentencepiece tools not installed";
  settings::TrainConfig c;
  c.name = "words";
  c.task = "translation";
  c.model.name = "transformer-tiny";
  c.model.dropout = 0;
  c.data.name = "parallel";
  c.data.dir = word_corpus().string();
  c.data.vocab_size = 40;
  c.data.max_tokens = 16;
  c.optimizer.name = "adam";
  c.optimizer.lr = 0.002;
  c.optimizer.beta2 = 0.98;
  c.optimizer.weight_decay = 0;
  c.schedule.name = "warmup-invsqrt";
  c.schedule.warmup_steps = 20;
  c.train.steps = 160;
  c.train.batch = 32;
  c.train.eval_interval = 80;
  c.quant.recipe = settings::recipe_setting("transformer-mixed");
  c.threads = 2;
  c.train.checkpoint = (dir() / "words.ckpt").string();
  results::Store store((dir() / "tr.db").string());
  const auto r = train::train(c, &store, quiet());
  ASSERT_EQ(r.status, results::RunStatus::finished);
  EXPECT_EQ(r.metric_name, "test_bleu");
  EXPECT_EQ(r.evals.size(), 2u);
  EXPECT_GT(r.final_metric, 50.0);  // a word-for-word mapping is well on its way after 160 steps
  const auto id = store.runs({.name = "words"})[0].id;
  EXPECT_EQ(store.metric(id, "dev_bleu").size(), 2u);
  EXPECT_EQ(store.metric(id, "test_bleu").size(), 1u);
}

namespace {
// A word-for-word corpus in folder `name` whose lines are one word a side, except that with
// `long_every` > 0 every long_every-th line has 20 words on its English side and the next
// one 20 on its Spanish side: far over 16 tokens whatever the pieces.
fs::path length_corpus(const std::string& name, int long_every) {
  const fs::path d = dir() / name;
  fs::create_directories(d);
  const std::vector<std::string> en = {"god", "light", "earth", "water"}, es = {"dios", "luz", "tierra", "agua"};
  const auto words = [](const std::string& w, int n) {
    std::string s = w;
    for (int k = 1; k < n; ++k) s += " " + w;
    return s;
  };
  for (const auto& [split, n] : std::vector<std::pair<std::string, int>>{{"train", 120}, {"dev", 12}, {"test", 12}}) {
    std::ofstream fe(d / (split + ".en")), fs_(d / (split + ".es"));
    for (int i = 0; i < n; ++i) {
      const auto w = static_cast<std::size_t>(i) % en.size();
      const bool long_en = long_every == 0 || i % long_every == 1, long_es = long_every > 0 && i % long_every == 2;
      fe << words(en[w], long_en ? 20 : 1) << "\n";
      fs_ << words(es[w], long_es ? 20 : 1) << "\n";
    }
  }
  return d;
}
}  // namespace

TEST(Trainer, TranslationDropsLongPairsOnRequest) {
  if (std::system("command -v spm_train >/dev/null 2>&1") != 0) GTEST_SKIP() << "sentencepiece tools not installed";
  settings::TrainConfig c;
  c.name = "lengths";
  c.task = "translation";
  c.model.name = "transformer-micro";
  c.data.name = "parallel";
  c.data.dir = length_corpus("lengths", 4).string();
  c.data.vocab_size = 24;
  c.data.max_tokens = 16;
  c.optimizer.name = "adam";
  c.train.steps = 1;
  c.train.batch = 8;
  c.threads = 1;
  c.train.checkpoint = (dir() / "lengths.ckpt").string();
  const auto pairs_of = [&](const settings::TrainConfig& cfg) {
    std::filesystem::remove(cfg.train.checkpoint);
    const std::string d = train::train(cfg, nullptr, quiet()).model_description;
    return d.substr(d.rfind(" ("));
  };
  // Truncated: every pair stays. Dropped: the lines with a long English (i % 4 == 1) or a
  // long Spanish side (i % 4 == 2), half of each split.
  EXPECT_EQ(pairs_of(c), " (120 train pairs, 12 dev, 12 test)");
  c.data.drop_long = true;
  EXPECT_EQ(pairs_of(c), " (60 train pairs, 6 dev, 6 test)");
  // The limits count the pairs that remain.
  c.data.train_limit = 50;
  c.data.test_limit = 4;
  EXPECT_EQ(pairs_of(c), " (50 train pairs, 4 dev, 4 test)");
  // The key is written only when set, so that earlier runs keep their identity.
  EXPECT_NE(settings::to_json(c).find("\"drop_long\":true"), std::string::npos);
  c.data.drop_long = false;
  EXPECT_EQ(settings::to_json(c).find("drop_long"), std::string::npos);
  // Nothing left is an error naming the split and the limit; the key is for translation only.
  c.data.drop_long = true;
  c.data.dir = length_corpus("all-long", 0).string();
  const std::string e = error_of([&] { train::train(c, nullptr, quiet()); });
  EXPECT_NE(e.find("data.drop_long: no pair of " + (dir() / "all-long" / "train").string() + ".{en,es}"),
            std::string::npos) << e;
  EXPECT_NE(e.find("data.max_tokens = 16"), std::string::npos) << e;
  settings::TrainConfig img = small("img");
  img.data.drop_long = true;
  EXPECT_NE(error_of([&] { train::train(img, nullptr, quiet()); }).find("data.drop_long is for translation"),
            std::string::npos);
}

namespace {
// A "document" (train.txt, dev.txt in folder `name`) whose sentences follow a fixed cycle of five.
fs::path cyclic_text(const std::string& name, int train_lines, int dev_lines) {
  const fs::path d = dir() / name;
  fs::create_directories(d);
  const std::vector<std::string> s = {"in the beginning god created the heaven", "and the earth was without form",
                                      "and darkness was upon the deep", "and god said let there be light",
                                      "and there was light and it was good"};
  for (const auto& [file, n] : std::vector<std::pair<std::string, int>>{{"train.txt", train_lines}, {"dev.txt", dev_lines}}) {
    std::ofstream o(d / file);
    for (int i = 0; i < n; ++i) o << s[static_cast<std::size_t>(i) % s.size()] << "\n";
  }
  return d;
}

// 60 steps of AdamW on the text in `d` (vocabulary 50, 32 tokens), evaluated every 20.
settings::TrainConfig text_config(const std::string& name, const std::string& task, const std::string& model,
                                     const fs::path& d) {
  settings::TrainConfig c;
  c.name = name;
  c.task = task;
  c.model.name = model;
  c.model.dropout = 0;
  c.data.name = "text";
  c.data.dir = d.string();
  c.data.vocab_size = 50;
  c.data.max_tokens = 32;
  c.optimizer.name = "adamw";
  c.optimizer.lr = 0.003;
  c.optimizer.weight_decay = 0.01;
  c.schedule.name = "linear";
  c.schedule.warmup_steps = 10;
  c.train.steps = 60;
  c.train.eval_interval = 20;
  c.threads = 2;
  c.train.checkpoint = (dir() / (name + ".ckpt")).string();
  return c;
}
}  // namespace

TEST(Trainer, BertPretrainingLossFalls) {
  if (std::system("command -v spm_train >/dev/null 2>&1") != 0) GTEST_SKIP() << "sentencepiece tools not installed";
  // Both the masked words and the next sentence are predictable.
  settings::TrainConfig c = text_config("bert", "bert", "bert-tiny", cyclic_text("text", 600, 60));
  c.train.batch = 32;
  c.quant.recipe = settings::recipe_setting("bert-mixed");
  results::Store store((dir() / "bert.db").string());
  const auto r = train::train(c, &store, quiet());
  ASSERT_EQ(r.status, results::RunStatus::finished);
  EXPECT_EQ(r.metric_name, "mlm_nsp_loss");
  ASSERT_EQ(r.evals.size(), 3u);
  EXPECT_LT(r.evals.back().second, r.evals.front().second - 0.5) << r.evals.front().second;
  EXPECT_LT(r.final_metric, std::log(50.0) + std::log(2.0));  // below the uniform guess
  // Each evaluation also stores its two parts, which add up to the metric.
  const auto id = store.runs({.name = "bert"})[0].id;
  const auto mlm = store.metric(id, "mlm_loss"), nsp = store.metric(id, "nsp_loss");
  ASSERT_EQ(mlm.size(), 3u);
  ASSERT_EQ(nsp.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_NEAR(mlm[i].second + nsp[i].second, r.evals[i].second, 1e-9);
    EXPECT_GT(mlm[i].second, 0.0);
    EXPECT_GT(nsp[i].second, 0.0);
  }
}

TEST(Trainer, LanguageModelPerplexityFalls) {
  if (std::system("command -v spm_train >/dev/null 2>&1") != 0) GTEST_SKIP() << "sentencepiece tools not installed";
  // After the first few tokens of a block the rest is predictable, so the validation
  // perplexity must fall far below the vocabulary's size.
  settings::TrainConfig c = text_config("lm", "language-model", "gpt-tiny", cyclic_text("lm", 800, 100));
  c.train.batch = 16;
  c.quant.recipe = settings::recipe_setting("transformer-mixed");
  const auto r = train::train(c, nullptr, quiet());
  ASSERT_EQ(r.status, results::RunStatus::finished);
  EXPECT_EQ(r.metric_name, "val_perplexity");
  ASSERT_EQ(r.evals.size(), 3u);
  EXPECT_GT(r.evals.front().second, 1.0);
  EXPECT_LT(r.evals.back().second, r.evals.front().second);
  EXPECT_LT(r.final_metric, 3.0) << "the cycle is predictable";
  EXPECT_TRUE(study::lower_is_better(r.metric_name));
  // A context longer than the text is an error naming the file.
  c.data.max_tokens = 4000;
  c.name = "lm-long";
  EXPECT_NE(test::error_of([&] { train::train(c, nullptr, quiet()); }).find("dev.txt: fewer than 4001 tokens"),
            std::string::npos);
}
