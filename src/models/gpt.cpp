#include "fp8lab/models/gpt.hpp"

#include <torch/torch.h>

#include <cmath>

namespace fp8lab::models {

std::string_view to_string(Mlp m) { return m == Mlp::gelu ? "gelu" : "swiglu"; }

Mlp parse_mlp(std::string_view s) {
  for (Mlp m : {Mlp::gelu, Mlp::swiglu})
    if (s == to_string(m)) return m;
  throw Error("MLP '" + std::string(s) + "' is neither gelu nor swiglu");
}

const Registry<GptOptions>& gpt_presets() {
  static const Registry<GptOptions> r = [] {
    GptOptions tiny, small, swiglu;
    tiny.d_model = 128, tiny.heads = 4, tiny.d_ff = 512, tiny.layers = 4;
    small.d_model = 256, small.heads = 4, small.d_ff = 1024, small.layers = 6;
    swiglu = small;
    swiglu.mlp = Mlp::swiglu, swiglu.d_ff = 688;  // 3 x 256 x 688 ~ 2 x 256 x 1024 weights
    return Registry<GptOptions>("language model", {{"gpt-tiny", tiny}, {"gpt-small", small}, {"gpt-small-swiglu", swiglu}});
  }();
  return r;
}

GptOptions gpt_preset(const std::string& name) { return gpt_presets().at(name); }

GptBlockImpl::GptBlockImpl(const GptOptions& o) : mlp(o.mlp) {
  ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.d_model})));
  attn = register_module("attn", MultiheadAttention(o.d_model, o.heads));
  ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.d_model})));
  ff1 = register_module("ff1", nn::QuantLinear(o.d_model, o.d_ff));
  if (mlp == Mlp::swiglu) gate = register_module("gate", nn::QuantLinear(o.d_model, o.d_ff));
  ff2 = register_module("ff2", nn::QuantLinear(o.d_ff, o.d_model));
  drop = register_module("drop", torch::nn::Dropout(o.dropout));
}

torch::Tensor GptBlockImpl::forward(const torch::Tensor& x, const torch::Tensor& mask) {
  const torch::Tensor h = ln1->forward(x);
  torch::Tensor y = x + drop->forward(attn->forward(h, h, mask));
  const torch::Tensor z = ln2->forward(y);
  const torch::Tensor hidden =
      mlp == Mlp::gelu ? torch::gelu(ff1->forward(z)) : torch::silu(ff1->forward(z)) * gate->forward(z);
  return y + drop->forward(ff2->forward(hidden));
}

GptImpl::GptImpl(GptOptions o) : options(o) {
  tokens = register_module("tokens", torch::nn::Embedding(o.vocab, o.d_model));
  positions = register_module("positions", torch::nn::Embedding(o.max_len, o.d_model));
  torch::nn::init::normal_(tokens->weight, 0.0, 0.02);
  torch::nn::init::normal_(positions->weight, 0.0, 0.02);
  drop = register_module("drop", torch::nn::Dropout(o.dropout));
  for (int i = 0; i < o.layers; ++i) blocks.push_back(register_module("block" + std::to_string(i), GptBlock(o)));
  ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.d_model})));
  head = register_module("head", nn::QuantTiedLinear(tokens->weight));
  // GPT-2's initialisation: weights N(0, 0.02), the projections into the residual stream
  // scaled by 1/sqrt(2 x layers); biases zero.
  torch::NoGradGuard g;
  const double residual = 0.02 / std::sqrt(2.0 * o.layers);
  for (auto& b : blocks) {
    for (nn::QuantLinear l : {b->attn->wq, b->attn->wk, b->attn->wv, b->attn->wo, b->ff1, b->gate, b->ff2}) {
      if (!l) continue;
      const bool into_residual = l.get() == b->attn->wo.get() || l.get() == b->ff2.get();
      l->weight.normal_(0.0, into_residual ? residual : 0.02);
      if (l->bias.defined()) l->bias.zero_();
    }
  }
}

torch::Tensor GptImpl::forward(const torch::Tensor& ids) {
  const std::int64_t L = ids.size(1);
  if (L > options.max_len)
    throw Error("a sequence of " + std::to_string(L) + " tokens is longer than the context of " +
                std::to_string(options.max_len));
  const torch::Tensor pos = torch::arange(L, torch::kInt64);
  torch::Tensor x = drop->forward(tokens->forward(ids) + positions->forward(pos));
  const torch::Tensor mask = torch::ones({L, L}, torch::kBool).triu(1).unsqueeze(0).unsqueeze(0);
  for (auto& b : blocks) x = b->forward(x, mask);
  return head->forward(ln_f->forward(x));
}

}  // namespace fp8lab::models
