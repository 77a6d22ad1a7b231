// BERT (Devlin et al. 2019): a Transformer encoder with learned position and segment
// embeddings, GELU feed-forward layers, and the two pre-training heads: masked language
// model (tied to the token embedding) and next-sentence prediction. Every matmul is
// quantized; embeddings, layer norms and softmax inputs stay float32.
#pragma once

#include "fp8lab/core/registry.hpp"

#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/normalization.h>

#include <string>
#include <vector>

#include "fp8lab/models/transformer.hpp"

namespace fp8lab::models {

struct BertOptions {
  std::int64_t vocab = 8000;
  std::int64_t hidden = 768, heads = 12, d_ff = 3072;
  int layers = 12;
  std::int64_t max_len = 512;
  double dropout = 0.1;
};
// bert-large (1024/16/4096, 24 layers: the paper's), bert-base (768/12/3072, 12),
// bert-tiny (128/2/512, 2: minutes on 2 cores).
// The named sizes (bert-large, -base, -tiny); preset() throws Error listing them.
const Registry<BertOptions>& bert_presets();
BertOptions bert_preset(const std::string& name);

struct BertImpl : torch::nn::Module {
  explicit BertImpl(BertOptions o = {});
  // ids, segments [B, L] int64 (pad id 0) -> (MLM logits [B, L, vocab], NSP logits [B, 2]).
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& ids, const torch::Tensor& segments);
  BertOptions options;
  torch::nn::Embedding tokens{nullptr}, positions{nullptr}, segments{nullptr};
  torch::nn::LayerNorm ln_embed{nullptr}, ln_mlm{nullptr};
  torch::nn::Dropout drop{nullptr};
  std::vector<EncoderLayer> layers;
  nn::QuantLinear mlm_dense{nullptr}, pooler{nullptr}, nsp{nullptr};
  nn::QuantTiedLinear mlm_out{nullptr};
  torch::Tensor mlm_bias;
};
TORCH_MODULE(Bert);

}  // namespace fp8lab::models
