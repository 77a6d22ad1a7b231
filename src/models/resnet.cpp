#include "fp8lab/models/resnet.hpp"

#include <torch/torch.h>

namespace fp8lab::models {

namespace {
torch::nn::Conv2dOptions conv3x3(std::int64_t in, std::int64_t out, std::int64_t stride) {
  return torch::nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false);
}
}  // namespace

BasicBlockImpl::BasicBlockImpl(std::int64_t in, std::int64_t out, std::int64_t stride) {
  conv1 = register_module("conv1", nn::QuantConv2d(conv3x3(in, out, stride)));
  bn1 = register_module("bn1", torch::nn::BatchNorm2d(out));
  conv2 = register_module("conv2", nn::QuantConv2d(conv3x3(out, out, 1)));
  bn2 = register_module("bn2", torch::nn::BatchNorm2d(out));
  if (stride != 1 || in != out) {
    // Projection shortcut (option B): a quantized 1x1 convolution.
    shortcut = register_module(
        "shortcut", nn::QuantConv2d(torch::nn::Conv2dOptions(in, out, 1).stride(stride).bias(false)));
    bn_sc = register_module("bn_sc", torch::nn::BatchNorm2d(out));
  }
}

torch::Tensor BasicBlockImpl::forward(const torch::Tensor& x) {
  torch::Tensor y = torch::relu(bn1->forward(conv1->forward(x)));
  y = bn2->forward(conv2->forward(y));
  const torch::Tensor s = shortcut ? bn_sc->forward(shortcut->forward(x)) : x;
  return torch::relu(y + s);
}

CifarResNetImpl::CifarResNetImpl(CifarResNetOptions o) : options(o) {
  if (o.depth < 8 || (o.depth - 2) % 6 != 0)
    throw Error("CIFAR ResNet depth must be 6n+2 with n >= 1 (20, 32, 56, ...), got " +
                std::to_string(o.depth));
  const int n = (o.depth - 2) / 6;
  const std::int64_t w = o.width;
  stem = register_module("stem", nn::QuantConv2d(conv3x3(o.in_channels, w, 1)));
  bn = register_module("bn", torch::nn::BatchNorm2d(w));
  auto stage = [&](std::int64_t in, std::int64_t out, std::int64_t stride) {
    torch::nn::Sequential s;
    for (int i = 0; i < n; ++i) s->push_back(BasicBlock(i == 0 ? in : out, out, i == 0 ? stride : 1));
    return s;
  };
  stage1 = register_module("stage1", stage(w, w, 1));
  stage2 = register_module("stage2", stage(w, 2 * w, 2));
  stage3 = register_module("stage3", stage(2 * w, 4 * w, 2));
  fc = register_module("fc", nn::QuantLinear(4 * w, o.num_classes));
}

torch::Tensor CifarResNetImpl::forward(const torch::Tensor& x) {
  torch::Tensor y = torch::relu(bn->forward(stem->forward(x)));
  y = stage3->forward(stage2->forward(stage1->forward(y)));
  y = torch::adaptive_avg_pool2d(y, {1, 1}).flatten(1);
  return fc->forward(y);
}

}  // namespace fp8lab::models
