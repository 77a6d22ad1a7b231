// Image classifiers beyond the CIFAR ResNet: ResNet-18/34/50 (He et al. 2016, ImageNet
// layout) and EfficientNet-B0..B7 (Tan & Le 2019: MBConv blocks with depthwise
// convolutions, squeeze-excitation and swish; B1..B7 by width/depth scaling), and one
// factory that builds any of them, the CIFAR ResNets included, from a preset name.
// Every convolution and linear layer is quantized (QuantConv2d / QuantLinear); batch norm
// stays float32.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/dropout.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "fp8lab/nn/modules.hpp"

namespace fp8lab::models {

// --- ResNet-18/34/50 ----------------------------------------------------------------------

struct BottleneckImpl : torch::nn::Module {
  BottleneckImpl(std::int64_t in, std::int64_t mid, std::int64_t stride);
  torch::Tensor forward(const torch::Tensor& x);
  nn::QuantConv2d conv1{nullptr}, conv2{nullptr}, conv3{nullptr}, shortcut{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr}, bn2{nullptr}, bn3{nullptr}, bn_sc{nullptr};
};
TORCH_MODULE(Bottleneck);

struct ResNetOptions {
  int depth = 18;  // 18, 34 (basic blocks) or 50 (bottlenecks)
  int in_channels = 3;
  int num_classes = 1000;
  int width = 64;            // channels of the first stage
  bool small_input = false;  // 3x3 stride-1 stem without max pooling (CIFAR-sized images)
};

struct ResNetImpl : torch::nn::Module {
  explicit ResNetImpl(ResNetOptions o = {});
  torch::Tensor forward(const torch::Tensor& x);
  ResNetOptions options;
  nn::QuantConv2d stem{nullptr};
  torch::nn::BatchNorm2d bn{nullptr};
  std::vector<torch::nn::Sequential> stages;  // layer1..layer4
  nn::QuantLinear fc{nullptr};
};
TORCH_MODULE(ResNet);

// --- EfficientNet ---------------------------------------------------------------------------

struct MBConvImpl : torch::nn::Module {
  MBConvImpl(std::int64_t in, std::int64_t out, std::int64_t expand, std::int64_t kernel, std::int64_t stride,
             double se_ratio, double drop_connect, double bn_momentum);
  torch::Tensor forward(const torch::Tensor& x);
  std::int64_t in, out, stride;
  double drop_connect;
  nn::QuantConv2d expand_conv{nullptr}, depthwise{nullptr}, se_reduce{nullptr}, se_expand{nullptr},
      project{nullptr};
  torch::nn::BatchNorm2d bn0{nullptr}, bn1{nullptr}, bn2{nullptr};
};
TORCH_MODULE(MBConv);

struct EfficientNetOptions {
  double width_mult = 1.0, depth_mult = 1.0;
  double dropout = 0.2;        // before the classifier
  double drop_connect = 0.2;   // stochastic depth, rising linearly to this over the blocks
  int in_channels = 3;
  int num_classes = 1000;
  int stem_stride = 2;         // 1 for small images
  // Batch norm's running statistics: x <- (1 - m) x + m batch (PyTorch's convention). The
  // reference's 0.01 (TensorFlow decay 0.99) averages about 100 steps: it lags behind the
  // weights of a run of a few thousand steps; 0.1 (PyTorch's default) suits those.
  double bn_momentum = 0.01;
};
// The paper's coefficients: b0 (1.0, 1.0, 224, 0.2) ... b4 (1.4, 1.8, 380, 0.4) ... b7.
EfficientNetOptions efficientnet_preset(int b);

struct EfficientNetImpl : torch::nn::Module {
  explicit EfficientNetImpl(EfficientNetOptions o = {});
  torch::Tensor forward(const torch::Tensor& x);
  EfficientNetOptions options;
  nn::QuantConv2d stem{nullptr}, head{nullptr};
  torch::nn::BatchNorm2d bn_stem{nullptr}, bn_head{nullptr};
  torch::nn::Sequential blocks{nullptr};
  torch::nn::Dropout drop{nullptr};
  nn::QuantLinear fc{nullptr};
};
TORCH_MODULE(EfficientNet);

// --- Factory --------------------------------------------------------------------------------

struct ImageModelSpec {
  std::string name = "resnet20";  // resnet8/20/32/44/56/110 (CIFAR), resnet18/34/50,
                                  // efficientnet-b0..b7
  int in_channels = 3;
  int num_classes = 10;
  int image_size = 32;
  int width = 0;             // CIFAR/ImageNet ResNet first-stage width (0: the preset's)
  double width_mult = 0;     // EfficientNet overrides (0: the preset's)
  double depth_mult = 0;
  double dropout = -1;       // (-1: the preset's)
  double bn_momentum = 0;    // EfficientNet's batch norm (0: the preset's)
};

struct ImageModel {
  std::shared_ptr<torch::nn::Module> module;
  std::function<torch::Tensor(const torch::Tensor&)> forward;
  std::string description;  // e.g. "resnet20 (width 16, 0.27 M parameters)"
};

// Throws Error listing the presets for an unknown name.
ImageModel make_image_model(const ImageModelSpec& spec);
std::vector<std::string> image_model_presets();

// Lays every 4-D parameter (the convolution weights) of `m` out channels-last, in place and
// with the same values: with channels-last inputs, libtorch's CPU convolutions then run on
// oneDNN's NHWC kernels, its fastest float32 path, and return channels-last activations.
void to_channels_last(torch::nn::Module& m);

}  // namespace fp8lab::models
