// A GPT-style language model: a decoder-only Transformer with pre-norm blocks (layer norm
// before attention and before the MLP, as GPT-2), causal self-attention, learned position
// embeddings, a GELU or SwiGLU MLP, a final layer norm and an output projection tied to
// the token embedding. Every matmul is quantized (QuantLinear, attention's QuantMatmul,
// the tied QuantTiedLinear head); embeddings, layer norms and softmax inputs stay float32.
#pragma once

#include "fp8lab/core/registry.hpp"

#include <torch/nn/module.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/normalization.h>

#include <string>
#include <string_view>
#include <vector>

#include "fp8lab/models/transformer.hpp"

namespace fp8lab::models {

enum class Mlp { gelu, swiglu };
std::string_view to_string(Mlp m);
Mlp parse_mlp(std::string_view s);  // throws Error listing the choices

struct GptOptions {
  std::int64_t vocab = 8000;
  std::int64_t d_model = 256, heads = 4;
  std::int64_t d_ff = 1024;  // GELU: the hidden width; SwiGLU: the width of each of its two branches
  int layers = 6;
  std::int64_t max_len = 128;  // the context length
  double dropout = 0.1;
  Mlp mlp = Mlp::gelu;
};
// gpt-tiny (128/4 heads, 4 layers, GELU 512; about 1.8 M parameters with 8,000 tokens),
// gpt-small (256/4 heads, 6 layers, GELU 1024; about 6.8 M), gpt-small-swiglu (the same with
// a SwiGLU MLP of width 688, about as many parameters).
const Registry<GptOptions>& gpt_presets();
GptOptions gpt_preset(const std::string& name);

struct GptBlockImpl : torch::nn::Module {
  explicit GptBlockImpl(const GptOptions& o);
  // x [B, L, D]; mask [1, 1, L, L] causal (true = masked).
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& mask);
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  MultiheadAttention attn{nullptr};
  // GELU: ff2(gelu(ff1 x)); SwiGLU: ff2(silu(ff1 x) * gate x).
  nn::QuantLinear ff1{nullptr}, gate{nullptr}, ff2{nullptr};
  torch::nn::Dropout drop{nullptr};
  Mlp mlp;
};
TORCH_MODULE(GptBlock);

struct GptImpl : torch::nn::Module {
  explicit GptImpl(GptOptions o = {});
  // ids [B, L] int64, L <= max_len -> logits [B, L, vocab] of each next token.
  torch::Tensor forward(const torch::Tensor& ids);
  GptOptions options;
  torch::nn::Embedding tokens{nullptr}, positions{nullptr};
  torch::nn::Dropout drop{nullptr};
  std::vector<GptBlock> blocks;
  torch::nn::LayerNorm ln_f{nullptr};
  nn::QuantTiedLinear head{nullptr};
};
TORCH_MODULE(Gpt);

}  // namespace fp8lab::models
