// Training an image classifier with a quantization recipe and loss scaling: the loop the
// quickstart (and later `fp8lab train`) runs.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "fp8lab/core/codec.hpp"
#include "fp8lab/nn/recipe.hpp"
#include "fp8lab/results/store.hpp"

namespace fp8lab::experiments {

struct ImageTrainConfig {
  std::string data_dir = "/usr/share/datasets/fashion-mnist";  // MNIST-layout folder
  int num_classes = 10;
  int depth = 8;            // CIFAR ResNet depth 6n+2
  int width = 16;
  std::string recipe = "fp32";
  std::string loss_scale = "none";
  int epochs = 2;
  int batch = 128;
  double lr = 0.1, momentum = 0.9, weight_decay = 5e-4;
  std::vector<double> lr_decay_at = {0.5, 0.75};  // fractions of training; lr *= 0.1 at each
  std::int64_t train_limit = 0;  // use the first N training images (0: all)
  std::uint64_t seed = 1;
  int threads = 0;  // 0: all cores
  bool progress = true;
};

struct ImageTrainResult {
  std::string status = "finished";  // or "diverged"
  double test_accuracy = 0;         // top-1, percent
  double final_train_loss = 0;
  int final_log2_scale = 0;
  std::uint64_t skipped_steps = 0, steps = 0;
  std::array<QuantCounts, nn::kKinds> counts{};  // summed over layers and steps
  double seconds = 0;
  std::vector<double> epoch_accuracy;
  std::int64_t run_id = 0;  // in the store, when one was given
};

// The configuration as JSON (what the store records).
std::string to_json(const ImageTrainConfig& cfg);

// Trains and evaluates after every epoch. With a store, the run is recorded as it goes
// (status "running", per-epoch test accuracy, the loss-scale trace, then the final status
// and metric); an exception marks it "failed" before propagating.
ImageTrainResult train_image_classifier(const ImageTrainConfig& cfg, results::Store* store = nullptr,
                                        const std::string& run_name = "train");

}  // namespace fp8lab::experiments
