#include <gtest/gtest.h>
#include <sys/stat.h>

#include <zlib.h>

#include <filesystem>
#include <fstream>

#include <torch/torch.h>

#include "../common/testutil.hpp"
#include "fp8lab/core/error.hpp"
#include "fp8lab/data/idx.hpp"

using namespace fp8lab;
namespace fs = std::filesystem;

namespace {
fs::path tmpdir() { return test::temp_dir("fp8lab_idx"); }
std::string idx_bytes(std::vector<std::uint32_t> dims, const std::vector<std::uint8_t>& data) {
  std::string s = {0, 0, 8, static_cast<char>(dims.size())};
  for (auto d : dims)
    for (int k = 3; k >= 0; --k) s += static_cast<char>((d >> (8 * k)) & 0xff);
  s.append(data.begin(), data.end());
  return s;
}
void write(const fs::path& p, const std::string& s, bool gz) {
  if (gz) {
    gzFile f = gzopen(p.string().c_str(), "wb");
    gzwrite(f, s.data(), static_cast<unsigned>(s.size()));
    gzclose(f);
  } else {
    std::ofstream(p, std::ios::binary) << s;
  }
}
using test::error_of;
// A generated MNIST-layout folder: n images of h x w, labels i % classes.
fs::path make_set(int n, int h, int w, int classes, bool gz) {
  const fs::path d = tmpdir() / (gz ? "gz" : "plain");
  fs::create_directories(d);
  std::vector<std::uint8_t> img(static_cast<std::size_t>(n * h * w)), lab(n);
  for (std::size_t i = 0; i < img.size(); ++i) img[i] = static_cast<std::uint8_t>(i * 7);
  for (int i = 0; i < n; ++i) lab[i] = static_cast<std::uint8_t>(i % classes);
  const std::string ext = gz ? ".gz" : "";
  write(d / ("train-images-idx3-ubyte" + ext), idx_bytes({std::uint32_t(n), std::uint32_t(h), std::uint32_t(w)}, img), gz);
  write(d / ("train-labels-idx1-ubyte" + ext), idx_bytes({std::uint32_t(n)}, lab), gz);
  return d;
}
}  // namespace

TEST(Idx, LoadsGeneratedSetsPlainAndGzip) {
  for (bool gz : {false, true}) {
    const fs::path d = make_set(5, 4, 3, 10, gz);
    const auto s = data::load_mnist_folder(d.string(), true);
    ASSERT_EQ(s.images.sizes(), (std::vector<std::int64_t>{5, 1, 4, 3}));
    EXPECT_EQ(s.labels[3].item<std::int64_t>(), 3);
    EXPECT_EQ(s.images.scalar_type(), torch::kUInt8);
    EXPECT_EQ(s.images.view(-1)[2].item<int>(), 14);
  }
  fs::remove_all(tmpdir());
}

TEST(Idx, BadFilesNameFileAndOffset) {
  const fs::path d = tmpdir();
  // Only regular files are read: a FIFO would wait forever, a folder read as "corrupt data".
  ASSERT_EQ(::mkfifo((d / "fifo").c_str(), 0600), 0);
  EXPECT_NE(error_of([&] { data::read_idx((d / "fifo").string(), 3); }).find("fifo: is not a regular file"),
            std::string::npos);
  fs::create_directories(d / "folder");
  EXPECT_NE(error_of([&] { data::read_idx((d / "folder").string(), 3); }).find("folder: is a folder"),
            std::string::npos);
  const std::string good = idx_bytes({2, 2, 2}, std::vector<std::uint8_t>(8, 1));
  write(d / "trunc", good.substr(0, good.size() - 3), false);
  std::string e = error_of([&] { data::read_idx((d / "trunc").string(), 3); });
  EXPECT_NE(e.find("offset 16"), std::string::npos) << e;
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;
  EXPECT_NE(e.find("trunc"), std::string::npos) << e;
  std::string bad = good;
  bad[0] = 7;
  write(d / "magic", bad, false);
  EXPECT_NE(error_of([&] { data::read_idx((d / "magic").string()); }).find("bad magic"), std::string::npos);
  bad = good;
  bad[2] = 0x0d;  // float data
  write(d / "type", bad, false);
  EXPECT_NE(error_of([&] { data::read_idx((d / "type").string()); }).find("not unsigned byte"), std::string::npos);
  write(d / "rank", good, false);
  EXPECT_NE(error_of([&] { data::read_idx((d / "rank").string(), 1); }).find("expected 1"), std::string::npos);
  // A corrupted gzip stream.
  write(d / "c.gz", good, true);
  std::string gzb;
  {
    std::ifstream in(d / "c.gz", std::ios::binary);
    gzb.assign(std::istreambuf_iterator<char>(in), {});
  }
  for (std::size_t i = 12; i < gzb.size() - 8; ++i) gzb[i] = static_cast<char>(gzb[i] ^ 0x5a);
  write(d / "c.gz", gzb, false);
  EXPECT_NE(error_of([&] { data::read_idx((d / "c.gz").string()); }), "");
  // Labels out of range and count mismatch.
  const fs::path s = make_set(12, 2, 2, 12, false);  // label 10 at index 10
  e = error_of([&] { data::load_mnist_folder(s.string(), true, 10); });
  EXPECT_NE(e.find("label 10 is not below 10"), std::string::npos) << e;
  EXPECT_NE(e.find("offset 18"), std::string::npos) << e;
  EXPECT_NE(error_of([&] { data::load_mnist_folder((d / "nothing").string(), true); }).find("no train-images"),
            std::string::npos);
  fs::remove_all(d);
}

TEST(Idx, FashionMnistFromDebian) {
  if (!fs::exists(data::kFashionMnistDir)) GTEST_SKIP() << "dataset-fashion-mnist not installed";
  const auto test = data::load_mnist_folder(data::kFashionMnistDir, false);
  EXPECT_EQ(test.size(), 10000);
  EXPECT_EQ(test.images.sizes(), (std::vector<std::int64_t>{10000, 1, 28, 28}));
  EXPECT_EQ(std::get<0>(at::_unique(test.labels)).numel(), 10);
  EXPECT_EQ(test.images.max().item<int>(), 255);  // real images use the full byte range
}
