// ResNet for CIFAR-sized images (He et al. 2016, section 4.2): depth 6n+2 (20, 32, 56), three
// stages of n basic blocks with 16, 32, 64 channels. Every convolution and the classifier
// are quantized layers (float32 until a recipe is applied).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>

#include "fp8lab/nn/modules.hpp"

namespace fp8lab::models {

struct BasicBlockImpl : torch::nn::Module {
  BasicBlockImpl(std::int64_t in, std::int64_t out, std::int64_t stride);
  torch::Tensor forward(const torch::Tensor& x);
  nn::QuantConv2d conv1{nullptr}, conv2{nullptr}, shortcut{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr}, bn2{nullptr}, bn_sc{nullptr};
};
TORCH_MODULE(BasicBlock);

struct CifarResNetOptions {
  int depth = 20;           // 6n + 2
  int in_channels = 3;
  int num_classes = 10;
  int width = 16;           // channels of the first stage
};

struct CifarResNetImpl : torch::nn::Module {
  explicit CifarResNetImpl(CifarResNetOptions o = {});
  torch::Tensor forward(const torch::Tensor& x);
  CifarResNetOptions options;
  nn::QuantConv2d stem{nullptr};
  torch::nn::BatchNorm2d bn{nullptr};
  torch::nn::Sequential stage1{nullptr}, stage2{nullptr}, stage3{nullptr};
  nn::QuantLinear fc{nullptr};
};
TORCH_MODULE(CifarResNet);

}  // namespace fp8lab::models
