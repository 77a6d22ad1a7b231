// Transformer building blocks (Vaswani et al. 2017) with every matmul quantized: the
// projections are QuantLinear, attention's Q K^T and A V are QuantMatmul. Layer norm and
// softmax inputs stay float32.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/normalization.h>

#include "fp8lab/nn/modules.hpp"

namespace fp8lab::models {

struct MultiheadAttentionImpl : torch::nn::Module {
  MultiheadAttentionImpl(std::int64_t d_model, std::int64_t heads);
  // q: [B, Lq, D], kv: [B, Lk, D]; mask (optional) broadcastable to [B, H, Lq, Lk], true =
  // masked out.
  torch::Tensor forward(const torch::Tensor& q, const torch::Tensor& kv,
                        const torch::Tensor& mask = {});
  std::int64_t d_model, heads;
  nn::QuantLinear wq{nullptr}, wk{nullptr}, wv{nullptr}, wo{nullptr};
  nn::QuantMatmul scores{nullptr}, context{nullptr};
};
TORCH_MODULE(MultiheadAttention);

struct EncoderLayerImpl : torch::nn::Module {
  EncoderLayerImpl(std::int64_t d_model, std::int64_t heads, std::int64_t d_ff, double dropout);
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& mask = {});
  MultiheadAttention attn{nullptr};
  nn::QuantLinear ff1{nullptr}, ff2{nullptr};
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  torch::nn::Dropout drop{nullptr};
};
TORCH_MODULE(EncoderLayer);

}  // namespace fp8lab::models
