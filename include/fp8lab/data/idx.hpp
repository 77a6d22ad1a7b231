// IDX files (the MNIST / Fashion-MNIST format), plain or gzip-compressed, validated as
// they are read: magic number, element type, dimensions and size, label range. Errors
// name the file and the byte offset.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <torch/types.h>

#include "fp8lab/data/idx_array.hpp"

namespace fp8lab::data {

// Reads an IDX file of unsigned bytes (gzip or not). `expected_rank` (if > 0) is checked.
IdxArray read_idx(const std::string& path, int expected_rank = 0);

// A labelled image set held as bytes: images [N, C, H, W] uint8, labels [N] int64.
// (Batches are converted to float32 when drawn; see data/images.hpp.)
struct ImageSet {
  torch::Tensor images, labels;
  std::int64_t num_classes = 0;
  std::int64_t size() const { return labels.defined() ? labels.size(0) : 0; }
};

// MNIST-layout folder: {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz].
// `train` picks the training or test split. Checks that the counts agree and labels are
// below `num_classes`.
ImageSet load_mnist_folder(const std::string& dir, bool train, std::int64_t num_classes = 10);

// The image and label files of one split of an MNIST-layout folder; throws Error naming
// what is missing.
std::pair<std::string, std::string> mnist_paths(const std::string& dir, bool train);

// Where Debian's dataset-fashion-mnist package puts Fashion-MNIST.
inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

}  // namespace fp8lab::data
