// Image classification data: CIFAR-10/100 binary files, MNIST-layout folders, image folders
// (one subfolder per class, JPEG/PNG), synthetic sets for tests, and batches drawn from
// them with per-channel normalisation and augmentation (random crop with padding,
// horizontal flip). Loaders validate what they read; errors name the file and the offset.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/types.h>

#include "fp8lab/data/idx.hpp"

namespace fp8lab::data {

// CIFAR-10 (`classes` 10: data_batch_1..5.bin, test_batch.bin; records of 1 label byte +
// 3072 pixel bytes) or CIFAR-100 (`classes` 100: train.bin, test.bin; records of a coarse
// and a fine label byte + 3072; the fine label is used). `dir` may be the folder holding
// the files or its parent (cifar-10-batches-bin / cifar-100-binary).
ImageSet load_cifar(const std::string& dir, bool train, int classes);

// A learnable synthetic set: each class has a fixed random pattern; an image is its class
// pattern plus noise. Deterministic in `seed`.
ImageSet synthetic_images(std::int64_t n, std::int64_t channels, std::int64_t size, std::int64_t classes,
                          std::uint64_t seed);

struct Augment {
  int crop_padding = 0;  // random crop of the original size after zero-padding by this much
  bool flip = false;     // random horizontal flip
};
Augment parse_augment(const std::string& text);  // "", "none", "crop", "flip", "crop+flip", "crop:2+flip"

// A source of labelled images that batches can be drawn from by index.
class ImageSource {
 public:
  virtual ~ImageSource() = default;
  virtual std::int64_t size() const = 0;
  virtual std::int64_t num_classes() const = 0;
  virtual std::array<std::int64_t, 3> shape() const = 0;  // C, H, W
  // Images [B, C, H, W] uint8 and labels [B] int64 for `indices` (int64 [B]).
  virtual std::pair<torch::Tensor, torch::Tensor> bytes(const torch::Tensor& indices) const = 0;
};

// An in-memory set.
std::shared_ptr<ImageSource> memory_source(ImageSet set);

// An image folder: `dir/<class>/<image>.{jpg,jpeg,png}`, classes in sorted name order;
// images are decoded when drawn, resized (shorter side) and centre-cropped to `size`.
// Throws Error naming the folder when it has no classes or a class has no images.
std::shared_ptr<ImageSource> image_folder_source(const std::string& dir, std::int64_t size);

// Batches as float32: (bytes / 255 - mean) / std per channel, then augmentation.
class ImageBatcher {
 public:
  // mean/std are per channel; empty: computed from `source` (all of it, in chunks).
  explicit ImageBatcher(std::shared_ptr<ImageSource> source, std::vector<double> mean = {},
                        std::vector<double> std = {});
  const ImageSource& source() const { return *src_; }
  const std::vector<double>& mean() const { return mean_; }
  const std::vector<double>& std() const { return std_; }
  // Deterministic in `gen` (used only when `aug` asks for randomness).
  std::pair<torch::Tensor, torch::Tensor> batch(const torch::Tensor& indices, const Augment& aug,
                                                torch::Generator* gen = nullptr) const;

 private:
  std::shared_ptr<ImageSource> src_;
  std::vector<double> mean_, std_;
  torch::Tensor mean_t_, std_t_;  // the same as float32 [1, C, 1, 1]
};

// Random crop (after zero padding) and horizontal flip of a float batch [B, C, H, W].
torch::Tensor augment(const torch::Tensor& x, const Augment& aug, torch::Generator& gen);

}  // namespace fp8lab::data
