#include "fp8lab/models/bert.hpp"

#include <torch/torch.h>

namespace fp8lab::models {

const Registry<BertOptions>& bert_presets() {
  static const Registry<BertOptions> r = [] {
    BertOptions base, large, tiny;
    large.hidden = 1024, large.heads = 16, large.d_ff = 4096, large.layers = 24;
    tiny.hidden = 128, tiny.heads = 2, tiny.d_ff = 512, tiny.layers = 2;
    return Registry<BertOptions>("BERT model", {{"bert-large", large}, {"bert-base", base}, {"bert-tiny", tiny}});
  }();
  return r;
}

BertOptions bert_preset(const std::string& name) { return bert_presets().at(name); }

BertImpl::BertImpl(BertOptions o) : options(o) {
  auto emb = [&](std::int64_t n) {
    auto e = torch::nn::Embedding(n, o.hidden);
    torch::nn::init::normal_(e->weight, 0.0, 0.02);  // BERT's initialiser range
    return e;
  };
  tokens = register_module("tokens", emb(o.vocab));
  positions = register_module("positions", emb(o.max_len));
  segments = register_module("segments", emb(2));
  ln_embed = register_module("ln_embed", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.hidden}).eps(1e-12)));
  drop = register_module("drop", torch::nn::Dropout(o.dropout));
  for (int i = 0; i < o.layers; ++i)
    layers.push_back(register_module("layer" + std::to_string(i), EncoderLayer(o.hidden, o.heads, o.d_ff, o.dropout, true)));
  mlm_dense = register_module("mlm_dense", nn::QuantLinear(o.hidden, o.hidden));
  ln_mlm = register_module("ln_mlm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.hidden}).eps(1e-12)));
  mlm_out = register_module("mlm_out", nn::QuantTiedLinear(tokens->weight));
  mlm_bias = register_parameter("mlm_bias", torch::zeros({o.vocab}));
  pooler = register_module("pooler", nn::QuantLinear(o.hidden, o.hidden));
  nsp = register_module("nsp", nn::QuantLinear(o.hidden, 2));
}

std::pair<torch::Tensor, torch::Tensor> BertImpl::forward(const torch::Tensor& ids, const torch::Tensor& segs) {
  const std::int64_t L = ids.size(1);
  if (L > options.max_len)
    throw Error("BERT input of " + std::to_string(L) + " tokens is longer than max_len " + std::to_string(options.max_len));
  torch::Tensor x = tokens->forward(ids) + positions->forward(torch::arange(L, torch::kInt64)).unsqueeze(0) +
                    segments->forward(segs);
  x = drop->forward(ln_embed->forward(x));
  const torch::Tensor mask = ids.eq(0).unsqueeze(1).unsqueeze(1);  // [B,1,1,L]: padding
  for (auto& l : layers) x = l->forward(x, mask);
  const torch::Tensor h = ln_mlm->forward(torch::gelu(mlm_dense->forward(x)));
  const torch::Tensor mlm = mlm_out->forward(h) + mlm_bias;
  const torch::Tensor pooled = torch::tanh(pooler->forward(x.select(1, 0)));  // [CLS]
  return {mlm, nsp->forward(pooled)};
}

}  // namespace fp8lab::models
