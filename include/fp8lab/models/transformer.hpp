// Transformer building blocks (Vaswani et al. 2017) with every matmul quantized: the
// projections are QuantLinear, attention's Q K^T and A V are QuantMatmul. Layer norm and
// softmax inputs stay float32.
#pragma once

#include "fp8lab/core/registry.hpp"

#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>

#include <string>
#include <vector>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/normalization.h>

#include "fp8lab/nn/modules.hpp"

namespace fp8lab::models {

// The keys and values of an attention, split into heads: [B, H, L, d_model / heads].
struct KeysValues {
  torch::Tensor k, v;
};

struct MultiheadAttentionImpl : torch::nn::Module {
  MultiheadAttentionImpl(std::int64_t d_model, std::int64_t heads);
  // q: [B, Lq, D], kv: [B, Lk, D]; mask (optional) broadcastable to [B, H, Lq, Lk], true =
  // masked out. The same as attend(queries(q), keys_values(kv), mask).
  torch::Tensor forward(const torch::Tensor& q, const torch::Tensor& kv,
                        const torch::Tensor& mask = {});
  // The parts of forward, for decoding with a cache of earlier positions' keys and values:
  // the scaled queries [B, H, Lq, dh] of q [B, Lq, D]; the keys and values of kv [B, Lk, D];
  // the attention output [B, Lq, D].
  torch::Tensor queries(const torch::Tensor& q);
  KeysValues keys_values(const torch::Tensor& kv);
  torch::Tensor attend(const torch::Tensor& queries, const KeysValues& kv, const torch::Tensor& mask = {});
  std::int64_t d_model, heads;
  nn::QuantLinear wq{nullptr}, wk{nullptr}, wv{nullptr}, wo{nullptr};
  nn::QuantMatmul scores{nullptr}, context{nullptr};
};
TORCH_MODULE(MultiheadAttention);

struct EncoderLayerImpl : torch::nn::Module {
  // gelu: BERT's feed-forward activation (the Transformer's is ReLU).
  EncoderLayerImpl(std::int64_t d_model, std::int64_t heads, std::int64_t d_ff, double dropout, bool gelu = false);
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& mask = {});
  MultiheadAttention attn{nullptr};
  nn::QuantLinear ff1{nullptr}, ff2{nullptr};
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  torch::nn::Dropout drop{nullptr};
  bool gelu = false;
};
TORCH_MODULE(EncoderLayer);

struct DecoderLayerImpl : torch::nn::Module {
  DecoderLayerImpl(std::int64_t d_model, std::int64_t heads, std::int64_t d_ff, double dropout);
  // self_mask: [1, 1, T, T] causal (true = masked); memory_mask: [B, 1, 1, S] source padding.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& memory, const torch::Tensor& self_mask,
                        const torch::Tensor& memory_mask);
  // One decoding step: x [R, 1, D] is the newest position, whose keys and values are
  // appended to `self_kv` (the earlier positions'); `memory_kv` is
  // cross_attn->keys_values(memory). self_mask [R, 1, 1, t]: padding among the t positions.
  torch::Tensor step(const torch::Tensor& x, KeysValues& self_kv, const KeysValues& memory_kv,
                     const torch::Tensor& self_mask, const torch::Tensor& memory_mask);
  MultiheadAttention self_attn{nullptr}, cross_attn{nullptr};
  nn::QuantLinear ff1{nullptr}, ff2{nullptr};
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr}, ln3{nullptr};
  torch::nn::Dropout drop{nullptr};
};
TORCH_MODULE(DecoderLayer);

// The Transformer encoder-decoder for translation over one shared (joint) vocabulary: the
// embedding (float32: a table lookup, not a matmul) is scaled by sqrt(d_model) and tied
// to the output projection, which is a quantized matmul like every other.
struct TransformerOptions {
  std::int64_t vocab = 8000;
  std::int64_t d_model = 512, heads = 8, d_ff = 2048;
  int encoder_layers = 6, decoder_layers = 6;
  double dropout = 0.1;
  std::int64_t max_len = 512;
};

// What decoding keeps between steps, one row per hypothesis: the encoder's keys and values
// for every decoder layer's cross-attention (computed once), every decoder layer's
// self-attention keys and values of the positions so far, and the tokens fed so far.
struct DecoderCache {
  torch::Tensor memory_mask;          // [R, 1, 1, S]: source padding
  std::vector<KeysValues> memory_kv;  // per decoder layer, [R, H, S, dh]
  std::vector<KeysValues> self_kv;    // per decoder layer, [R, H, t, dh]
  torch::Tensor tokens;               // [R, t] int64
  std::int64_t rows() const { return tokens.size(0); }
};
// "transformer-base" (the paper's: 512/8/2048, 6+6), "transformer-small" (256/4/1024,
// 3+3), "transformer-tiny" (128/4/512, 2+2: minutes on 2 cores), "transformer-micro"
// (64/4/256, 2+2: the seed-heavy studies).
// The named sizes (transformer-base, -small, -tiny, -micro); preset() throws Error listing them.
const Registry<TransformerOptions>& transformer_presets();
TransformerOptions transformer_preset(const std::string& name);

struct TransformerImpl : torch::nn::Module {
  explicit TransformerImpl(TransformerOptions o = {});
  // src [B, S], tgt_in [B, T] int64 token ids (0 = padding) -> logits [B, T, vocab].
  torch::Tensor forward(const torch::Tensor& src, const torch::Tensor& tgt_in);
  torch::Tensor encode(const torch::Tensor& src);  // memory [B, S, D]
  torch::Tensor decode(const torch::Tensor& tgt_in, const torch::Tensor& memory, const torch::Tensor& src);
  // Incremental decoding: a cache for `memory` = encode(src) with no positions yet; then
  // each step feeds one token per row [R] and returns the logits of the next [R, vocab]
  // (what decode() gives for the last position of the tokens fed so far); select_rows
  // keeps (and repeats) the cache's rows `rows` [R'] int64, in that order.
  DecoderCache start_decoding(const torch::Tensor& memory, const torch::Tensor& src);
  torch::Tensor decode_step(DecoderCache& cache, const torch::Tensor& tokens);
  static void select_rows(DecoderCache& cache, const torch::Tensor& rows);
  // Greedy decoding from <s> (bos) until </s> (eos) or max_len tokens; ids without bos/eos.
  // Every sentence of src at once, with the decoder cache.
  std::vector<std::vector<int>> greedy(const torch::Tensor& src, int max_len, int bos, int eos);
  // Beam search with the GNMT length penalty ((5 + len) / 6)^alpha: every sentence of src
  // at once, each hypothesis a row of the decoder cache.
  std::vector<std::vector<int>> beam_search(const torch::Tensor& src, int beam, int max_len, int bos, int eos,
                                            double alpha = 0.6);
  // The reference decoders, for tests: the same searches recomputing the decoder over the
  // whole prefix at every step, beam search one sentence at a time on its unpadded source.
  // Their outputs are the cached decoders' (docs/training.md, "Decoding"); they take time
  // quadratic in the output length.
  std::vector<std::vector<int>> greedy_reference(const torch::Tensor& src, int max_len, int bos, int eos);
  std::vector<std::vector<int>> beam_search_reference(const torch::Tensor& src, int beam, int max_len, int bos,
                                                      int eos, double alpha = 0.6);
  TransformerOptions options;
  torch::nn::Embedding embed{nullptr};
  std::vector<EncoderLayer> encoder;
  std::vector<DecoderLayer> decoder;
  torch::nn::Dropout drop{nullptr};
  nn::QuantTiedLinear out{nullptr};
  torch::Tensor positions;  // sinusoidal encodings [max_len, D] (a buffer)
};
TORCH_MODULE(Transformer);

}  // namespace fp8lab::models
