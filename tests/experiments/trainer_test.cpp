// The trainer on a generated MNIST-layout folder: finished and diverged runs, recorded in
// the store.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "../common/testutil.hpp"
#include "fp8lab/experiments/trainer.hpp"
#include "fp8lab/results/store.hpp"

using namespace fp8lab;
namespace fs = std::filesystem;

namespace {
void write_idx(const fs::path& p, std::vector<std::uint32_t> dims, const std::vector<std::uint8_t>& data) {
  std::ofstream o(p, std::ios::binary);
  const char head[4] = {0, 0, 8, static_cast<char>(dims.size())};
  o.write(head, 4);
  for (auto d : dims)
    for (int k = 3; k >= 0; --k) o.put(static_cast<char>((d >> (8 * k)) & 0xff));
  o.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
}
// Two classes told apart by brightness: learnable in a few steps.
fs::path make_folder() {
  const fs::path d = test::temp_dir("fp8lab_trainer");
  for (const char* split : {"train", "t10k"}) {
    const std::uint32_t n = 64;
    std::vector<std::uint8_t> img(n * 8 * 8), lab(n);
    for (std::uint32_t i = 0; i < n; ++i) {
      lab[i] = static_cast<std::uint8_t>(i % 2);
      for (int k = 0; k < 64; ++k) img[i * 64 + k] = static_cast<std::uint8_t>(lab[i] ? 200 + (k % 50) : (k * 3) % 60);
    }
    write_idx(d / (std::string(split) + "-images-idx3-ubyte"), {n, 8, 8}, img);
    write_idx(d / (std::string(split) + "-labels-idx1-ubyte"), {n}, lab);
  }
  return d;
}
experiments::ImageTrainConfig small(const fs::path& d) {
  experiments::ImageTrainConfig c;
  c.data_dir = d.string();
  c.num_classes = 2;
  c.width = 4;
  c.epochs = 3;
  c.batch = 16;
  c.threads = 1;
  c.progress = false;
  c.recipe = "resnet32-mixed";
  return c;
}
}  // namespace

TEST(Trainer, FinishesLearnsAndRecords) {
  const fs::path d = make_folder();
  results::Store store((d / "r.db").string());
  const auto r = experiments::train_image_classifier(small(d), &store, "unit");
  EXPECT_EQ(r.status, "finished");
  EXPECT_EQ(r.epoch_accuracy.size(), 3u);
  EXPECT_GT(r.test_accuracy, 90.0);
  EXPECT_EQ(r.steps, 12u);
  const auto runs = store.runs({.name = "unit"});
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].status, "finished");
  EXPECT_EQ(store.metric(runs[0].id, "test_accuracy").size(), 3u);
  EXPECT_EQ(store.loss_scale_trace(runs[0].id).size(), 12u);
  EXPECT_NE(runs[0].config_json.find("\"recipe\":\"resnet32-mixed\""), std::string::npos);
}

TEST(Trainer, DivergenceIsRecordedNotACrash) {
  const fs::path d = make_folder();
  results::Store store((d / "r.db").string());
  auto c = small(d);
  c.recipe = "fp32";
  c.lr = 1e12;  // blows up within a few steps
  const auto r = experiments::train_image_classifier(c, &store, "boom");
  EXPECT_EQ(r.status, "diverged");
  EXPECT_EQ(store.runs({.name = "boom"})[0].status, "diverged");
}

TEST(Trainer, BadConfigFailsTheRunCleanly) {
  const fs::path d = make_folder();
  results::Store store((d / "r.db").string());
  auto c = small(d);
  c.depth = 9;  // not 6n+2
  EXPECT_THROW(experiments::train_image_classifier(c, &store, "bad"), Error);
  EXPECT_EQ(store.runs({.name = "bad"})[0].status, "failed");
}
