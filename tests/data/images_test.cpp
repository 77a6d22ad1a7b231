// CIFAR binary files, image folders, synthetic sets, normalisation and augmentation.
#include <gtest/gtest.h>
#include <stb/stb_image_write.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>

#include "../common/testutil.hpp"
#include "fp8lab/data/images.hpp"

using namespace fp8lab;
namespace fs = std::filesystem;
using test::error_of;

namespace {
fs::path tmp() { return test::temp_dir("fp8lab_images"); }

// n CIFAR records; pixel bytes encode (record, offset) so misplaced bytes show.
std::string cifar_records(int n, int label_bytes, int classes) {
  std::string s;
  for (int i = 0; i < n; ++i) {
    if (label_bytes == 2) s.push_back(static_cast<char>(i % 20));
    s.push_back(static_cast<char>(i % classes));
    for (int k = 0; k < 3072; ++k) s.push_back(static_cast<char>((i * 7 + k) & 0xff));
  }
  return s;
}
void write(const fs::path& p, const std::string& bytes) { std::ofstream(p, std::ios::binary) << bytes; }
}  // namespace

TEST(Cifar, LoadsTenAndHundred) {
  const fs::path d = tmp() / "c10" / "cifar-10-batches-bin";
  fs::create_directories(d);
  for (int b = 1; b <= 5; ++b) write(d / ("data_batch_" + std::to_string(b) + ".bin"), cifar_records(3, 1, 10));
  write(d / "test_batch.bin", cifar_records(4, 1, 10));
  const auto tr = data::load_cifar((tmp() / "c10").string(), true, 10);  // the parent folder works too
  EXPECT_EQ(tr.size(), 15);
  EXPECT_EQ(tr.images.sizes(), (std::vector<std::int64_t>{15, 3, 32, 32}));
  EXPECT_EQ(tr.labels[4].item<std::int64_t>(), 1);  // second file, second record
  // Channel-major layout: byte k of a record is channel k / 1024, row (k % 1024) / 32.
  EXPECT_EQ(tr.images[1][2][3][4].item<int>(), (1 * 7 + 2 * 1024 + 3 * 32 + 4) & 0xff);
  const auto te = data::load_cifar(d.string(), false, 10);
  EXPECT_EQ(te.size(), 4);

  const fs::path h = tmp() / "c100";
  fs::create_directories(h);
  write(h / "train.bin", cifar_records(30, 2, 100));
  write(h / "test.bin", cifar_records(5, 2, 100));
  const auto c = data::load_cifar(h.string(), true, 100);
  EXPECT_EQ(c.size(), 30);
  EXPECT_EQ(c.labels[25].item<std::int64_t>(), 25);  // the fine label
  EXPECT_EQ(c.images[2][0][0][0].item<int>(), 14);
}

TEST(Cifar, BadFilesNameFileAndOffset) {
  const fs::path h = tmp() / "bad100";
  fs::create_directories(h);
  std::string recs = cifar_records(3, 2, 100);
  write(h / "train.bin", recs.substr(0, recs.size() - 10));
  std::string e = error_of([&] { data::load_cifar(h.string(), true, 100); });
  EXPECT_NE(e.find("train.bin: offset 6148"), std::string::npos) << e;
  EXPECT_NE(e.find("not a multiple of the record size 3074"), std::string::npos) << e;
  recs[3074 + 1] = static_cast<char>(100);  // the second record's fine label
  write(h / "train.bin", recs);
  e = error_of([&] { data::load_cifar(h.string(), true, 100); });
  EXPECT_NE(e.find("offset 3075: label 100 is not below 100"), std::string::npos) << e;
  write(h / "train.bin", "");
  EXPECT_NE(error_of([&] { data::load_cifar(h.string(), true, 100); }).find("empty"), std::string::npos);
  e = error_of([&] { data::load_cifar(h.string(), false, 100); });
  EXPECT_NE(e.find("no test.bin"), std::string::npos) << e;
  EXPECT_NE(error_of([&] { data::load_cifar(h.string(), true, 7); }).find("10 or 100"), std::string::npos);
}

TEST(ImageFolder, DecodesResizesAndLabels) {
  const fs::path d = tmp() / "folder";
  for (const char* cls : {"cat", "dog"}) fs::create_directories(d / cls);
  // A 40x20 red PNG (class 0) and a 10x30 blue JPEG (class 1); a stray text file is ignored.
  std::vector<unsigned char> red(40 * 20 * 3), blue(10 * 30 * 3);
  for (std::size_t i = 0; i < red.size(); i += 3) red[i] = 250;
  for (std::size_t i = 0; i < blue.size(); i += 3) blue[i + 2] = 240;
  ASSERT_TRUE(stbi_write_png((d / "cat" / "a.png").c_str(), 40, 20, 3, red.data(), 40 * 3));
  ASSERT_TRUE(stbi_write_jpg((d / "dog" / "b.JPG").c_str(), 10, 30, 3, blue.data(), 95));
  write(d / "dog" / "notes.txt", "x");
  const auto src = data::image_folder_source(d.string(), 16);
  EXPECT_EQ(src->size(), 2);
  EXPECT_EQ(src->num_classes(), 2);
  const auto [x, y] = src->bytes(torch::tensor({1, 0}, torch::kInt64));
  EXPECT_EQ(x.sizes(), (std::vector<std::int64_t>{2, 3, 16, 16}));
  EXPECT_EQ(y[0].item<std::int64_t>(), 1);
  EXPECT_EQ(y[1].item<std::int64_t>(), 0);
  EXPECT_EQ(x[1][0].min().item<int>(), 250);  // red channel of the PNG, exact
  EXPECT_EQ(x[1][2].max().item<int>(), 0);
  EXPECT_GT(x[0][2].min().item<int>(), 225);  // blue JPEG, lossy
  // Errors: a corrupt image names its file; folders without classes or images.
  write(d / "cat" / "z.png", "not a png");
  const auto src2 = data::image_folder_source(d.string(), 16);
  const std::string e = error_of([&] { src2->bytes(torch::tensor({1}, torch::kInt64)); });
  EXPECT_NE(e.find("z.png: cannot decode"), std::string::npos) << e;
  fs::create_directories(d / "empty_class");
  EXPECT_NE(error_of([&] { data::image_folder_source(d.string(), 16); }).find("has no .jpg"), std::string::npos);
  EXPECT_NE(error_of([&] { data::image_folder_source((d / "cat").string(), 16); }).find("at least two"),
            std::string::npos);
}

TEST(Batcher, NormalisesPerChannel) {
  const auto set = data::synthetic_images(64, 3, 8, 4, 1);
  data::ImageBatcher b(data::memory_source(set));
  const auto [x, y] = b.batch(torch::arange(64, torch::kInt64), {});
  // Statistics come from the same 64 images: each channel has mean 0 and std 1.
  const auto m = x.transpose(0, 1).reshape({3, -1});
  for (int c = 0; c < 3; ++c) {
    EXPECT_NEAR(m[c].mean().item<double>(), 0.0, 1e-5);
    EXPECT_NEAR(m[c].std(false).item<double>(), 1.0, 1e-4);
  }
  EXPECT_TRUE(y.equal(set.labels));
  EXPECT_NE(error_of([&] { data::ImageBatcher(data::memory_source(set), {0.5}, {0.2}); }).find("1 means for 3"),
            std::string::npos);
}

TEST(Augment, CropAndFlipAreDeterministicAndShapePreserving) {
  const torch::Tensor x = torch::arange(2 * 1 * 4 * 4, torch::kFloat32).view({2, 1, 4, 4});
  auto g1 = at::make_generator<at::CPUGeneratorImpl>(5), g2 = at::make_generator<at::CPUGeneratorImpl>(5);
  const auto a = data::augment(x, data::parse_augment("crop:1+flip"), g1);
  const auto b = data::augment(x, data::parse_augment("crop:1+flip"), g2);
  EXPECT_TRUE(a.equal(b));
  EXPECT_EQ(a.sizes(), x.sizes());
  // Without padding a crop is the identity; flip only mirrors rows: every output row is
  // an input row or its mirror image.
  auto g3 = at::make_generator<at::CPUGeneratorImpl>(9);
  const auto f = data::augment(x, data::parse_augment("flip"), g3);
  for (int i = 0; i < 2; ++i)
    EXPECT_TRUE(f[i].equal(x[i]) || f[i].equal(x[i].flip({2}))) << i;
  // With padding p each image is a shifted copy: its values are input values or 0.
  auto g4 = at::make_generator<at::CPUGeneratorImpl>(3);
  const auto c = data::augment(x + 1, data::parse_augment("crop:2"), g4);
  EXPECT_EQ(c.sum().item<float>() <= (x + 1).sum().item<float>(), true);
  const auto p = data::parse_augment("crop+flip");
  EXPECT_EQ(p.crop_padding, 4);
  EXPECT_TRUE(p.flip);
  EXPECT_NE(error_of([] { data::parse_augment("crop:-1"); }).find("bad crop padding"), std::string::npos);
}

TEST(Synthetic, DeterministicAndClassDependent) {
  const auto a = data::synthetic_images(20, 2, 6, 5, 42), b = data::synthetic_images(20, 2, 6, 5, 42);
  EXPECT_TRUE(a.images.equal(b.images));
  EXPECT_EQ(a.labels[7].item<std::int64_t>(), 2);
  EXPECT_FALSE(a.images.equal(data::synthetic_images(20, 2, 6, 5, 43).images));
}

TEST(Synthetic, ASetBeyondTheMemoryBudgetIsRefusedBeforeAllocating) {
  // 2^24 images of 64x1024x1024 would be petabytes: refused by size, not by std::bad_alloc.
  const std::string e = error_of([] { data::synthetic_images(std::int64_t{1} << 24, 64, 1024, 10, 1); });
  EXPECT_NE(e.find("more than the memory budget"), std::string::npos) << e;
}
