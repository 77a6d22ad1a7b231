#include "fp8lab/data/idx.hpp"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>

#include <torch/torch.h>

#include "fp8lab/core/error.hpp"
#include "io.hpp"

namespace fp8lab::data {


namespace {
using io::fail;
using io::slurp;

std::string find(const std::string& dir, const std::string& stem) {
  for (const std::string& name : {stem + ".gz", stem}) {
    const std::filesystem::path p = std::filesystem::path(dir) / name;
    if (std::filesystem::exists(p)) return p.string();
  }
  throw Error(dir + ": no " + stem + "[.gz] (expected an MNIST-layout folder, e.g. " +
              kFashionMnistDir + " from Debian's dataset-fashion-mnist)");
}

}  // namespace

IdxArray read_idx(const std::string& path, int expected_rank) {
  return io::parse_idx(slurp(path), path, expected_rank);
}

std::pair<std::string, std::string> mnist_paths(const std::string& dir, bool train) {
  const std::string split = train ? "train" : "t10k";
  return {find(dir, split + "-images-idx3-ubyte"), find(dir, split + "-labels-idx1-ubyte")};
}

ImageSet load_mnist_folder(const std::string& dir, bool train, std::int64_t num_classes) {
  const auto [ip, lp] = mnist_paths(dir, train);
  const IdxArray img = read_idx(ip, 3), lab = read_idx(lp, 1);
  if (img.dims[0] != lab.dims[0])
    throw Error(ip + ": " + std::to_string(img.dims[0]) + " images but " + lp + " has " +
                std::to_string(lab.dims[0]) + " labels");
  const std::size_t header = 4 + 4;
  for (std::size_t i = 0; i < lab.data.size(); ++i)
    if (lab.data[i] >= num_classes)
      fail(lp, header + i, "label " + std::to_string(lab.data[i]) + " is not below " + std::to_string(num_classes));
  const auto n = static_cast<std::int64_t>(img.dims[0]);
  const auto h = static_cast<std::int64_t>(img.dims[1]), w = static_cast<std::int64_t>(img.dims[2]);
  ImageSet s;
  s.num_classes = num_classes;
  s.images = torch::from_blob(const_cast<std::uint8_t*>(img.data.data()), {n, 1, h, w}, torch::kUInt8).clone();
  s.labels = torch::from_blob(const_cast<std::uint8_t*>(lab.data.data()), {n}, torch::kUInt8).to(torch::kInt64);
  return s;
}

}  // namespace fp8lab::data
