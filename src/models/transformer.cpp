#include "fp8lab/models/transformer.hpp"

#include <torch/torch.h>

#include <cmath>

namespace fp8lab::models {

MultiheadAttentionImpl::MultiheadAttentionImpl(std::int64_t d, std::int64_t h) : d_model(d), heads(h) {
  if (d % h != 0) throw Error("attention: d_model " + std::to_string(d) + " is not a multiple of heads " + std::to_string(h));
  wq = register_module("wq", nn::QuantLinear(d, d));
  wk = register_module("wk", nn::QuantLinear(d, d));
  wv = register_module("wv", nn::QuantLinear(d, d));
  wo = register_module("wo", nn::QuantLinear(d, d));
  scores = register_module("scores", nn::QuantMatmul());
  context = register_module("context", nn::QuantMatmul());
}

torch::Tensor MultiheadAttentionImpl::forward(const torch::Tensor& q, const torch::Tensor& kv,
                                              const torch::Tensor& mask) {
  const std::int64_t B = q.size(0), Lq = q.size(1), Lk = kv.size(1), dh = d_model / heads;
  auto split = [&](const torch::Tensor& t, std::int64_t L) {
    return t.view({B, L, heads, dh}).transpose(1, 2);  // [B, H, L, dh]
  };
  const torch::Tensor Q = split(wq->forward(q), Lq) / std::sqrt(static_cast<double>(dh));
  const torch::Tensor K = split(wk->forward(kv), Lk);
  const torch::Tensor V = split(wv->forward(kv), Lk);
  torch::Tensor s = scores->forward(Q, K.transpose(-2, -1));  // [B, H, Lq, Lk]
  if (mask.defined()) s = s.masked_fill(mask, -1e9);
  const torch::Tensor a = torch::softmax(s, -1);  // softmax input stays float32
  const torch::Tensor c = context->forward(a, V).transpose(1, 2).reshape({B, Lq, d_model});
  return wo->forward(c);
}

EncoderLayerImpl::EncoderLayerImpl(std::int64_t d, std::int64_t h, std::int64_t d_ff, double p) {
  attn = register_module("attn", MultiheadAttention(d, h));
  ff1 = register_module("ff1", nn::QuantLinear(d, d_ff));
  ff2 = register_module("ff2", nn::QuantLinear(d_ff, d));
  ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
  ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
  drop = register_module("drop", torch::nn::Dropout(p));
}

torch::Tensor EncoderLayerImpl::forward(const torch::Tensor& x, const torch::Tensor& mask) {
  // Post-norm, as the original Transformer base.
  torch::Tensor y = ln1->forward(x + drop->forward(attn->forward(x, x, mask)));
  return ln2->forward(y + drop->forward(ff2->forward(torch::relu(ff1->forward(y)))));
}

}  // namespace fp8lab::models
