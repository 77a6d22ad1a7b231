// A run as one value: TrainState and the model and optimizer go through a checkpoint and
// come back equal, field by field; checkpoints of another schema, of another config or of a
// finished run are refused by name.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <random>
#include <sstream>

#include "../../src/train/train_state.hpp"
#include "../common/testutil.hpp"
#include "fp8lab/core/files.hpp"
#include "fp8lab/train/trainer.hpp"

using namespace fp8lab;
namespace fs = std::filesystem;
using test::error_of;

namespace {
fs::path dir() { return test::temp_dir("fp8lab_run_state"); }

train::TrainState full_state() {
  train::TrainState s;
  s.step = 17;
  s.loss_ema = 0.123456789;
  s.scaler = {3, 1.5, 7, -2};
  s.evals = {{5, 51.25}, {10, 61.5}};
  std::array<QuantCounts, nn::kKinds> layer{};
  for (int k = 0; k < nn::kKinds; ++k) layer[k] = {100u + k, 1u + k, 2u + k, 3u + k};
  s.counts = {layer, layer};
  s.ema = {torch::randn({3}), torch::arange(4)};
  s.recent = {{torch::randn({3}), torch::arange(4)}, {torch::randn({3}), torch::arange(4) * 2}};
  s.trace = {{15, 12, false}, {16, 11, true}};
  s.seconds = 42.5;
  s.run_id = 9;
  s.store = "/tmp/some.db";
  return s;
}

void expect_same_weights(const train::Weights& a, const train::Weights& b) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << i;
}
}  // namespace

TEST(RunState, CheckpointRoundTripsEveryField) {
  torch::manual_seed(1);
  const std::string path = (dir() / "state.ckpt").string();
  torch::nn::Linear model(3, 2);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  model->forward(torch::randn({4, 3})).sum().backward();
  opt.step();  // momentum buffers to save
  const train::TrainState s = full_state();
  train::save_checkpoint(path, "{\"a\":1}", s, *model, opt);

  train::Checkpoint c(path, "{\"a\":1}");
  const auto& r = c.state();
  EXPECT_EQ(r.step, s.step);
  EXPECT_EQ(r.loss_ema, s.loss_ema);
  EXPECT_EQ(r.scaler, s.scaler);
  EXPECT_EQ(r.evals, s.evals);
  ASSERT_EQ(r.counts.size(), s.counts.size());
  for (std::size_t l = 0; l < s.counts.size(); ++l)
    for (int k = 0; k < nn::kKinds; ++k) {
      EXPECT_EQ(r.counts[l][k].total, s.counts[l][k].total);
      EXPECT_EQ(r.counts[l][k].overflow, s.counts[l][k].overflow);
      EXPECT_EQ(r.counts[l][k].underflow, s.counts[l][k].underflow);
      EXPECT_EQ(r.counts[l][k].nan, s.counts[l][k].nan);
    }
  expect_same_weights(r.ema, s.ema);
  ASSERT_EQ(r.recent.size(), s.recent.size());
  for (std::size_t k = 0; k < s.recent.size(); ++k) expect_same_weights(r.recent[k], s.recent[k]);
  EXPECT_EQ(r.trace, s.trace);
  EXPECT_EQ(r.seconds, s.seconds);
  EXPECT_EQ(r.run_id, s.run_id);
  EXPECT_EQ(r.store, s.store);
  EXPECT_FALSE(r.finished);

  torch::nn::Linear model2(3, 2);
  torch::optim::SGD opt2(model2->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  c.restore(*model2, opt2);
  EXPECT_TRUE(torch::equal(model2->weight, model->weight));
  EXPECT_TRUE(torch::equal(model2->bias, model->bias));
  // The same next step: the momentum came back too.
  for (auto* m : {&model, &model2}) {
    torch::manual_seed(2);
    (*m)->zero_grad();
    (*m)->forward(torch::randn({4, 3})).sum().backward();
  }
  opt.step();
  opt2.step();
  EXPECT_TRUE(torch::equal(model2->weight, model->weight));

  // Refused: another config, naming the key; a finished run.
  const std::string e = error_of([&] { train::Checkpoint(path, "{\"a\":2}"); });
  EXPECT_NE(e.find("different config (/a)"), std::string::npos) << e;
  train::TrainState done = s;
  done.finished = true;
  train::save_checkpoint(path, "{\"a\":1}", done, *model, opt);
  EXPECT_NE(error_of([&] { train::Checkpoint(path, "{\"a\":1}"); }).find("has finished"), std::string::npos);
}

TEST(RunState, ADamagedCheckpointIsRefusedWithTheFileNamed) {
  const std::string path = (dir() / "damaged.ckpt").string();
  torch::manual_seed(1);
  torch::nn::Linear model(64, 64);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
  train::save_checkpoint(path, "{}", full_state(), *model, opt);
  const std::string good = read_file(path);
  auto expect_refused = [&](const std::string& bytes, const std::string& what) {
    write_file_atomic(path, bytes);
    const std::string e = error_of([&] { train::Checkpoint(path, "{}"); });
    EXPECT_NE(e.find(path + ": damaged checkpoint: "), std::string::npos) << e;
    EXPECT_NE(e.find(what), std::string::npos) << e;
  };
  // 256 random bytes in the middle of a tensor, one flipped bit, a truncated or extended file.
  std::string noisy = good;
  std::mt19937 rng(7);
  for (std::size_t i = 0; i < 256; ++i) noisy[good.size() / 2 + i] = static_cast<char>(rng());
  expect_refused(noisy, "checksum");
  std::string flipped = good;
  flipped[good.size() - 100] ^= 0x10;
  expect_refused(flipped, "checksum");
  expect_refused(good.substr(0, good.size() - 1), "truncated or appended to");
  expect_refused(good + "x", "truncated or appended to");
  write_file_atomic(path, good);
  EXPECT_NO_THROW(train::Checkpoint(path, "{}"));
}

// A checkpoint file must start with its integrity line: without it (schema 1 wrote none;
// a deleted line; an empty or random file) it is refused before libtorch reads it, and a
// framed archive of another schema names both versions.
TEST(RunState, CheckpointsWithoutTheirIntegrityLineOrOfAnotherSchemaAreRefused) {
  // What schema 1 wrote: the run's numbers as JSON under "meta", the model at the root.
  const std::string path = (dir() / "schema1.ckpt").string();
  torch::serialize::OutputArchive a;
  a.write("meta", c10::IValue(std::string(R"({"schema": 1, "config": "{}", "step": 3, "finished": false})")));
  a.write("weight", torch::zeros({2}));
  std::ostringstream archive;
  a.save_to(archive);
  settings::TrainConfig c;
  c.name = "old";
  c.train.checkpoint = path;
  train::TrainOptions o;
  o.resume = true;
  o.progress = false;
  for (const std::string& body : {archive.str(), std::string(), std::string(4096, '\x5a')}) {
    write_file_atomic(path, body);
    const std::string e = error_of([&] { train::train(c, nullptr, o); });
    EXPECT_NE(e.find(path + ": not an fp8lab checkpoint: it does not start with the integrity line"), std::string::npos)
        << e;
    EXPECT_EQ(e.find("libtorch"), std::string::npos) << e;
  }
  write_file_atomic(path, checksum_frame("fp8lab-checkpoint ", archive.str()));
  const std::string e = error_of([&] { train::train(c, nullptr, o); });
  EXPECT_NE(e.find(path + ": checkpoint schema 1, this fp8lab reads schema 2"), std::string::npos) << e;
}
