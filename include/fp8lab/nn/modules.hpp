// Quantized layers as libtorch modules, and conversion of an existing model in place.
#pragma once

#include <torch/nn/cloneable.h>
#include <torch/nn/module.h>
#include <torch/nn/options/conv.h>
#include <torch/nn/options/linear.h>
#include <torch/nn/pimpl.h>

#include <memory>
#include <string>
#include <vector>

#include "fp8lab/nn/ops.hpp"
#include "fp8lab/settings/recipe.hpp"

namespace fp8lab::nn {

// A layer whose quantizers a recipe sets. Without a state it runs in float32 through the
// same autograd function (all kinds float32).
struct Quantized {
  LayerStatePtr state;
  virtual ~Quantized() = default;
};

struct QuantLinearImpl : torch::nn::Cloneable<QuantLinearImpl>, Quantized {
  explicit QuantLinearImpl(torch::nn::LinearOptions options);
  QuantLinearImpl(std::int64_t in, std::int64_t out) : QuantLinearImpl(torch::nn::LinearOptions(in, out)) {}
  // Adopts existing parameter tensors (used by quantize_model).
  QuantLinearImpl(torch::nn::LinearOptions options, torch::Tensor weight, torch::Tensor bias);
  void reset() override;  // libtorch's Linear initialisation
  torch::Tensor forward(const torch::Tensor& x);
  void pretty_print(std::ostream& os) const override;
  torch::nn::LinearOptions options;
  torch::Tensor weight, bias;
};
TORCH_MODULE(QuantLinear);

struct QuantConv2dImpl : torch::nn::Cloneable<QuantConv2dImpl>, Quantized {
  explicit QuantConv2dImpl(torch::nn::Conv2dOptions options);
  QuantConv2dImpl(torch::nn::Conv2dOptions options, torch::Tensor weight, torch::Tensor bias);
  void reset() override;  // libtorch's Conv2d initialisation
  torch::Tensor forward(const torch::Tensor& x);
  void pretty_print(std::ostream& os) const override;
  torch::nn::Conv2dOptions options;
  torch::Tensor weight, bias;
};
TORCH_MODULE(QuantConv2d);

// y = x w^T where w is another module's parameter (tied input and output embeddings). The
// weight is not registered here, so an optimizer sees it once.
struct QuantTiedLinearImpl : torch::nn::Cloneable<QuantTiedLinearImpl>, Quantized {
  explicit QuantTiedLinearImpl(torch::Tensor w) : weight(std::move(w)) {}
  void reset() override {}
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight;
};
TORCH_MODULE(QuantTiedLinear);

// torch::matmul of two activations (attention's Q K^T and A V).
struct QuantMatmulImpl : torch::nn::Cloneable<QuantMatmulImpl>, Quantized {
  QuantMatmulImpl() = default;
  void reset() override {}
  torch::Tensor forward(const torch::Tensor& a, const torch::Tensor& b);
};
TORCH_MODULE(QuantMatmul);

// Result of quantize_model: every quantized layer, in model order.
struct QuantizedModel {
  std::shared_ptr<QuantContext> ctx;
  std::vector<LayerStatePtr> layers;
  const LayerStatePtr& layer(const std::string& path) const;  // throws Error if absent
};

// Gives every quantized layer of `model` (QuantLinear, QuantConv2d, QuantMatmul, found by
// module path in registration order) its quantizers from `recipe`. Inside
// torch::nn::Sequential containers, plain torch::nn::Linear and Conv2d layers are first
// converted in place to QuantLinear / QuantConv2d sharing the same parameter tensors.
//
// A plain Linear/Conv2d held in a member variable of a user module cannot be swapped: the
// member keeps pointing at the old layer, which libtorch's C++ API gives no way to change,
// so it would silently stay float32. quantize_model throws Error naming such layers;
// declare them as QuantLinear / QuantConv2d (drop-in: same options, same initialisation,
// float32 until a recipe is applied). It also throws for an override pattern that matches
// no layer.
QuantizedModel quantize_model(torch::nn::Module& model, const Recipe& recipe,
                              std::shared_ptr<QuantContext> ctx = nullptr);

}  // namespace fp8lab::nn
