#include "fp8lab/models/transformer.hpp"

#include <torch/torch.h>
#include <algorithm>
#include <numeric>

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

torch::Tensor MultiheadAttentionImpl::queries(const torch::Tensor& q) {
  const std::int64_t dh = d_model / heads;
  return wq->forward(q).view({q.size(0), q.size(1), heads, dh}).transpose(1, 2) / std::sqrt(static_cast<double>(dh));
}

KeysValues MultiheadAttentionImpl::keys_values(const torch::Tensor& kv) {
  const std::int64_t B = kv.size(0), L = kv.size(1), dh = d_model / heads;
  auto split = [&](const torch::Tensor& t) { return t.view({B, L, heads, dh}).transpose(1, 2); };  // [B, H, L, dh]
  KeysValues r;
  r.k = split(wk->forward(kv));
  r.v = split(wv->forward(kv));
  return r;
}

torch::Tensor MultiheadAttentionImpl::attend(const torch::Tensor& Q, const KeysValues& kv, const torch::Tensor& mask) {
  const std::int64_t B = Q.size(0), Lq = Q.size(2);
  torch::Tensor s = scores->forward(Q, kv.k.transpose(-2, -1));  // [B, H, Lq, Lk]
  if (mask.defined()) s = s.masked_fill(mask, -1e9);
  const torch::Tensor a = torch::softmax(s, -1);  // softmax input stays float32
  const torch::Tensor c = context->forward(a, kv.v).transpose(1, 2).reshape({B, Lq, d_model});
  return wo->forward(c);
}

torch::Tensor MultiheadAttentionImpl::forward(const torch::Tensor& q, const torch::Tensor& kv,
                                              const torch::Tensor& mask) {
  const torch::Tensor Q = queries(q);
  return attend(Q, keys_values(kv), mask);
}

EncoderLayerImpl::EncoderLayerImpl(std::int64_t d, std::int64_t h, std::int64_t d_ff, double p, bool use_gelu)
    : gelu(use_gelu) {
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
  const torch::Tensor hidden = ff1->forward(y);
  return ln2->forward(y + drop->forward(ff2->forward(gelu ? torch::gelu(hidden) : torch::relu(hidden))));
}

}  // namespace fp8lab::models

namespace fp8lab::models {

DecoderLayerImpl::DecoderLayerImpl(std::int64_t d, std::int64_t h, std::int64_t d_ff, double p) {
  self_attn = register_module("self_attn", MultiheadAttention(d, h));
  cross_attn = register_module("cross_attn", MultiheadAttention(d, h));
  ff1 = register_module("ff1", nn::QuantLinear(d, d_ff));
  ff2 = register_module("ff2", nn::QuantLinear(d_ff, d));
  ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
  ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
  ln3 = register_module("ln3", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
  drop = register_module("drop", torch::nn::Dropout(p));
}

torch::Tensor DecoderLayerImpl::forward(const torch::Tensor& x, const torch::Tensor& memory,
                                        const torch::Tensor& self_mask, const torch::Tensor& memory_mask) {
  torch::Tensor y = ln1->forward(x + drop->forward(self_attn->forward(x, x, self_mask)));
  y = ln2->forward(y + drop->forward(cross_attn->forward(y, memory, memory_mask)));
  return ln3->forward(y + drop->forward(ff2->forward(torch::relu(ff1->forward(y)))));
}

torch::Tensor DecoderLayerImpl::step(const torch::Tensor& x, KeysValues& self_kv, const KeysValues& memory_kv,
                                     const torch::Tensor& self_mask, const torch::Tensor& memory_mask) {
  // forward()'s operations for one position, in the same order.
  const torch::Tensor Q = self_attn->queries(x);
  const KeysValues now = self_attn->keys_values(x);
  self_kv.k = self_kv.k.defined() ? torch::cat({self_kv.k, now.k}, 2) : now.k;
  self_kv.v = self_kv.v.defined() ? torch::cat({self_kv.v, now.v}, 2) : now.v;
  torch::Tensor y = ln1->forward(x + drop->forward(self_attn->attend(Q, self_kv, self_mask)));
  y = ln2->forward(y + drop->forward(cross_attn->attend(cross_attn->queries(y), memory_kv, memory_mask)));
  return ln3->forward(y + drop->forward(ff2->forward(torch::relu(ff1->forward(y)))));
}

const Registry<TransformerOptions>& transformer_presets() {
  static const Registry<TransformerOptions> r = [] {
    TransformerOptions base, small, tiny, micro;
    small.d_model = 256, small.heads = 4, small.d_ff = 1024, small.encoder_layers = 3, small.decoder_layers = 3;
    tiny.d_model = 128, tiny.heads = 4, tiny.d_ff = 512, tiny.encoder_layers = 2, tiny.decoder_layers = 2;
    micro.d_model = 64, micro.heads = 4, micro.d_ff = 256, micro.encoder_layers = 2, micro.decoder_layers = 2;
    return Registry<TransformerOptions>("translation model", {{"transformer-base", base},
                                                              {"transformer-small", small},
                                                              {"transformer-tiny", tiny},
                                                              {"transformer-micro", micro}});
  }();
  return r;
}

TransformerOptions transformer_preset(const std::string& name) { return transformer_presets().at(name); }

TransformerImpl::TransformerImpl(TransformerOptions o) : options(o) {
  embed = register_module("embed", torch::nn::Embedding(torch::nn::EmbeddingOptions(o.vocab, o.d_model).padding_idx(0)));
  torch::nn::init::normal_(embed->weight, 0.0, std::pow(static_cast<double>(o.d_model), -0.5));
  {
    torch::NoGradGuard g;
    embed->weight[0].zero_();
  }
  for (int i = 0; i < o.encoder_layers; ++i)
    encoder.push_back(register_module("enc" + std::to_string(i), EncoderLayer(o.d_model, o.heads, o.d_ff, o.dropout)));
  for (int i = 0; i < o.decoder_layers; ++i)
    decoder.push_back(register_module("dec" + std::to_string(i), DecoderLayer(o.d_model, o.heads, o.d_ff, o.dropout)));
  drop = register_module("drop", torch::nn::Dropout(o.dropout));
  out = register_module("out", nn::QuantTiedLinear(embed->weight));
  // PE(pos, 2i) = sin(pos / 10000^(2i/D)), PE(pos, 2i+1) = cos(...)
  const torch::Tensor pos = torch::arange(o.max_len, torch::kFloat64).unsqueeze(1);
  const torch::Tensor div = torch::exp(torch::arange(0, o.d_model, 2, torch::kFloat64) *
                                       (-std::log(10000.0) / static_cast<double>(o.d_model)));
  torch::Tensor pe = torch::zeros({o.max_len, o.d_model}, torch::kFloat64);
  pe.slice(1, 0, o.d_model, 2).copy_(torch::sin(pos * div));
  pe.slice(1, 1, o.d_model, 2).copy_(torch::cos(pos * div).slice(1, 0, o.d_model / 2));
  positions = register_buffer("positions", pe.to(torch::kFloat32));
}

namespace {
torch::Tensor padding_mask(const torch::Tensor& ids) { return ids.eq(0).unsqueeze(1).unsqueeze(1); }  // [B,1,1,L]
torch::Tensor causal_mask(std::int64_t t) {
  return torch::ones({t, t}, torch::kBool).triu(1).unsqueeze(0).unsqueeze(0);  // [1,1,T,T]
}
}  // namespace

torch::Tensor TransformerImpl::encode(const torch::Tensor& src) {
  if (src.size(1) > options.max_len)
    throw Error("source of " + std::to_string(src.size(1)) + " tokens is longer than max_len " + std::to_string(options.max_len));
  const double scale = std::sqrt(static_cast<double>(options.d_model));
  torch::Tensor x = drop->forward(embed->forward(src) * scale + positions.slice(0, 0, src.size(1)));
  const torch::Tensor mask = padding_mask(src);
  for (auto& l : encoder) x = l->forward(x, mask);
  return x;
}

torch::Tensor TransformerImpl::decode(const torch::Tensor& tgt_in, const torch::Tensor& memory, const torch::Tensor& src) {
  if (tgt_in.size(1) > options.max_len)
    throw Error("target of " + std::to_string(tgt_in.size(1)) + " tokens is longer than max_len " + std::to_string(options.max_len));
  const double scale = std::sqrt(static_cast<double>(options.d_model));
  torch::Tensor y = drop->forward(embed->forward(tgt_in) * scale + positions.slice(0, 0, tgt_in.size(1)));
  const torch::Tensor self_mask = causal_mask(tgt_in.size(1)).logical_or(padding_mask(tgt_in));
  const torch::Tensor mem_mask = padding_mask(src);
  for (auto& l : decoder) y = l->forward(y, memory, self_mask, mem_mask);
  return out->forward(y);
}

torch::Tensor TransformerImpl::forward(const torch::Tensor& src, const torch::Tensor& tgt_in) {
  return decode(tgt_in, encode(src), src);
}

DecoderCache TransformerImpl::start_decoding(const torch::Tensor& memory, const torch::Tensor& src) {
  DecoderCache c;
  c.memory_mask = padding_mask(src);
  for (auto& l : decoder) {
    c.memory_kv.push_back(l->cross_attn->keys_values(memory));
    c.self_kv.emplace_back();
  }
  c.tokens = torch::empty({src.size(0), 0}, torch::kInt64);
  return c;
}

torch::Tensor TransformerImpl::decode_step(DecoderCache& c, const torch::Tensor& tokens) {
  const std::int64_t t = c.tokens.size(1);  // the new token's position
  if (t + 1 > options.max_len)
    throw Error("target of " + std::to_string(t + 1) + " tokens is longer than max_len " + std::to_string(options.max_len));
  c.tokens = torch::cat({c.tokens, tokens.view({-1, 1})}, 1);
  const double scale = std::sqrt(static_cast<double>(options.d_model));
  torch::Tensor y = drop->forward(embed->forward(tokens.view({-1, 1})) * scale + positions.slice(0, t, t + 1));
  const torch::Tensor self_mask = padding_mask(c.tokens);  // the newest position sees every earlier one
  for (std::size_t i = 0; i < decoder.size(); ++i)
    y = decoder[i]->step(y, c.self_kv[i], c.memory_kv[i], self_mask, c.memory_mask);
  return out->forward(y).select(1, 0);
}

void TransformerImpl::select_rows(DecoderCache& c, const torch::Tensor& rows) {
  auto pick = [&](torch::Tensor& x) {
    if (x.defined()) x = x.index_select(0, rows);
  };
  pick(c.memory_mask);
  pick(c.tokens);
  for (auto* kvs : {&c.memory_kv, &c.self_kv})
    for (KeysValues& kv : *kvs) pick(kv.k), pick(kv.v);
}

namespace {

// One sentence's beam: its live hypotheses (each with its row of the decoder's batch) and
// its finished ones. advance() is one step of the search; best() its answer.
struct Hyp {
  std::vector<int> ids;
  double logp = 0;
  std::int64_t row = 0;  // the row whose next-token log-probabilities extend it
};

struct Beam {
  std::vector<Hyp> live, finished;
  bool done = false;

  // Each row's `beam` best next tokens of `logits` [rows, vocab], ranked by the logits with
  // ties to the lower token (as argmax, and so greedy decoding, breaks them), and their
  // log-probabilities: (vals, idx), each [rows, beam]. torch::topk leaves the order of equal
  // values open, and ranking by the log-probabilities could merge logits they round together.
  // The ranking is that of a stable descending sort (NaN first, as torch sorts it), found by
  // a partial sort of each row: O(vocab log beam) instead of a full sort of the vocabulary.
  static std::pair<torch::Tensor, torch::Tensor> candidates(const torch::Tensor& logits, int beam) {
    const torch::Tensor l = logits.to(torch::kFloat).contiguous();
    const std::int64_t rows = l.size(0), vocab = l.size(1);
    if (beam < 1 || beam > vocab)
      throw Error("beam search: a beam of " + std::to_string(beam) + " over a vocabulary of " + std::to_string(vocab));
    torch::Tensor idx = torch::empty({rows, beam}, torch::kInt64);
    std::vector<std::int64_t> order(static_cast<std::size_t>(vocab));
    for (std::int64_t r = 0; r < rows; ++r) {
      const float* v = l.data_ptr<float>() + r * vocab;
      const auto before = [v](std::int64_t a, std::int64_t b) {
        const bool na = std::isnan(v[a]), nb = std::isnan(v[b]);
        if (na != nb) return na;
        if (!na && v[a] != v[b]) return v[a] > v[b];
        return a < b;
      };
      std::iota(order.begin(), order.end(), std::int64_t{0});
      std::partial_sort(order.begin(), order.begin() + beam, order.end(), before);
      std::copy(order.begin(), order.begin() + beam, idx.data_ptr<std::int64_t>() + r * beam);
    }
    return {torch::log_softmax(logits, -1).gather(-1, idx), idx};
  }

  // `logp` [rows, >= beam]: the top log-probabilities and `idx` their tokens, row h.row for
  // live hypothesis h. Keeps the best `beam` extensions; those ending in eos finish.
  void advance(const torch::TensorAccessor<float, 2>& vals, const torch::TensorAccessor<std::int64_t, 2>& idx,
               int beam, int eos) {
    std::vector<Hyp> cand;
    for (const Hyp& parent : live)
      for (int k = 0; k < beam; ++k) {
        Hyp h = parent;
        h.ids.push_back(static_cast<int>(idx[parent.row][k]));
        h.logp += static_cast<double>(vals[parent.row][k]);
        cand.push_back(std::move(h));
      }
    std::stable_sort(cand.begin(), cand.end(), [](const Hyp& a, const Hyp& c) { return a.logp > c.logp; });
    live.clear();
    for (auto& h : cand) {
      if (static_cast<int>(live.size()) >= beam) break;
      if (h.ids.back() == eos) {
        if (static_cast<int>(finished.size()) < beam) finished.push_back(h);
      } else {
        live.push_back(std::move(h));
      }
    }
    if (static_cast<int>(finished.size()) >= beam || live.empty()) done = true;
  }

  // The best hypothesis by the GNMT length penalty, unfinished ones counting too (out of
  // length); its ids without bos and eos.
  std::vector<int> best(double alpha, int eos) {
    for (auto& h : live) finished.push_back(std::move(h));
    live.clear();
    const Hyp* top = nullptr;
    double top_score = -1e300;
    for (const auto& h : finished) {
      const std::size_t n_tok = h.ids.size() - 1;  // without bos
      const double sc = h.logp / std::pow((5.0 + static_cast<double>(n_tok)) / 6.0, alpha);
      if (sc > top_score) top_score = sc, top = &h;
    }
    std::vector<int> ids;
    for (std::size_t k = 1; k < top->ids.size(); ++k)
      if (top->ids[k] != eos) ids.push_back(top->ids[k]);
    return ids;
  }
};

}  // namespace

std::vector<std::vector<int>> TransformerImpl::greedy(const torch::Tensor& src, int max_len, int bos, int eos) {
  torch::NoGradGuard g;
  const std::int64_t B = src.size(0);
  DecoderCache cache = start_decoding(encode(src), src);
  std::vector<std::vector<int>> out(static_cast<std::size_t>(B));
  std::vector<std::int64_t> sentence(static_cast<std::size_t>(B));  // of each row
  for (std::int64_t b = 0; b < B; ++b) sentence[static_cast<std::size_t>(b)] = b;
  torch::Tensor next = torch::full({B}, bos, torch::kInt64);
  for (int t = 0; t < max_len && !sentence.empty(); ++t) {
    const torch::Tensor best = decode_step(cache, next).argmax(-1).contiguous();  // [R]
    const auto* bp = best.data_ptr<std::int64_t>();
    std::vector<std::int64_t> keep, kept_sentence;
    for (std::size_t r = 0; r < sentence.size(); ++r) {
      if (bp[r] == eos) continue;  // finished: its row leaves the batch
      out[static_cast<std::size_t>(sentence[r])].push_back(static_cast<int>(bp[r]));
      keep.push_back(static_cast<std::int64_t>(r));
      kept_sentence.push_back(sentence[r]);
    }
    const torch::Tensor rows = torch::tensor(keep, torch::kInt64);
    if (keep.size() < sentence.size()) select_rows(cache, rows);
    next = best.index_select(0, rows);
    sentence = std::move(kept_sentence);
  }
  return out;
}

std::vector<std::vector<int>> TransformerImpl::beam_search(const torch::Tensor& src, int beam, int max_len, int bos,
                                                           int eos, double alpha) {
  torch::NoGradGuard g;
  const std::int64_t B = src.size(0);
  DecoderCache cache = start_decoding(encode(src), src);
  std::vector<Beam> beams(static_cast<std::size_t>(B));
  for (std::int64_t b = 0; b < B; ++b) beams[static_cast<std::size_t>(b)].live.push_back({{bos}, 0.0, b});
  torch::Tensor next = torch::full({B}, bos, torch::kInt64);
  for (int t = 0; t < max_len && cache.rows() > 0; ++t) {
    const auto [vals, idx] = Beam::candidates(decode_step(cache, next), beam);  // [R, beam]
    const auto va = vals.accessor<float, 2>();
    const auto ia = idx.accessor<std::int64_t, 2>();
    std::vector<std::int64_t> parents, tokens;
    for (Beam& bm : beams) {
      if (bm.done) continue;
      bm.advance(va, ia, beam, eos);
      if (bm.done) continue;
      for (Hyp& h : bm.live) {  // the new hypotheses' rows: their parents', in order
        parents.push_back(h.row);
        h.row = static_cast<std::int64_t>(tokens.size());
        tokens.push_back(h.ids.back());
      }
    }
    select_rows(cache, torch::tensor(parents, torch::kInt64));
    next = torch::tensor(tokens, torch::kInt64);
  }
  std::vector<std::vector<int>> result;
  for (Beam& bm : beams) result.push_back(bm.best(alpha, eos));
  return result;
}

std::vector<std::vector<int>> TransformerImpl::greedy_reference(const torch::Tensor& src, int max_len, int bos,
                                                                int eos) {
  torch::NoGradGuard g;
  const std::int64_t B = src.size(0);
  const torch::Tensor memory = encode(src);
  torch::Tensor ys = torch::full({B, 1}, bos, torch::kInt64);
  std::vector<std::vector<int>> out(B);
  std::vector<bool> done(B, false);
  std::int64_t left = B;
  for (int t = 0; t < max_len && left > 0; ++t) {
    const torch::Tensor next = decode(ys, memory, src).select(1, -1).argmax(-1);  // [B]
    const auto* np = next.data_ptr<std::int64_t>();
    for (std::int64_t b = 0; b < B; ++b) {
      if (done[b]) continue;
      if (np[b] == eos) {
        done[b] = true;
        --left;
      } else {
        out[b].push_back(static_cast<int>(np[b]));
      }
    }
    ys = torch::cat({ys, next.unsqueeze(1)}, 1);
  }
  return out;
}

std::vector<std::vector<int>> TransformerImpl::beam_search_reference(const torch::Tensor& src, int beam, int max_len,
                                                                     int bos, int eos, double alpha) {
  torch::NoGradGuard g;
  std::vector<std::vector<int>> result;
  for (std::int64_t b = 0; b < src.size(0); ++b) {
    // Drop the sentence's padding so the encoder sees only its tokens.
    torch::Tensor s = src[b];
    const std::int64_t len = s.ne(0).sum().item<std::int64_t>();
    s = s.slice(0, 0, std::max<std::int64_t>(1, len)).unsqueeze(0);
    const torch::Tensor memory = encode(s);
    Beam bm;
    bm.live.push_back({{bos}, 0.0, 0});
    for (int t = 0; t < max_len && !bm.done; ++t) {
      const auto n = static_cast<std::int64_t>(bm.live.size());
      torch::Tensor ys = torch::empty({n, static_cast<std::int64_t>(bm.live[0].ids.size())}, torch::kInt64);
      for (std::int64_t i = 0; i < n; ++i)
        for (std::size_t k = 0; k < bm.live[i].ids.size(); ++k) ys[i][static_cast<std::int64_t>(k)] = bm.live[i].ids[k];
      const auto [vals, idx] =
          Beam::candidates(decode(ys, memory.expand({n, -1, -1}), s.expand({n, -1})).select(1, -1), beam);
      bm.advance(vals.accessor<float, 2>(), idx.accessor<std::int64_t, 2>(), beam, eos);
      for (std::int64_t i = 0; i < static_cast<std::int64_t>(bm.live.size()); ++i) bm.live[i].row = i;
    }
    result.push_back(bm.best(alpha, eos));
  }
  return result;
}

}  // namespace fp8lab::models
