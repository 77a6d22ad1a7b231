// The state of one quantized layer (docs/spec.md §4): its quantizers, with their random
// streams and delayed scaling's histories, its counts and statistics, and its product path;
// and the context every layer of a model shares.
#pragma once

#include <ATen/core/ivalue.h>
#include <torch/types.h>

#include <array>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "fp8lab/core/codec.hpp"
#include "fp8lab/kernels/kernels.hpp"
#include "fp8lab/nn/compute.hpp"
#include "fp8lab/nn/tensor_quant.hpp"
#include "fp8lab/settings/recipe.hpp"

namespace fp8lab::nn {

// One record of the tensor statistics hooks.
struct TensorStats {
  std::uint64_t step = 0;
  std::string layer;
  TensorKind kind = TensorKind::a;
  kernels::ExpHistogram hist;  // of the tensor before quantization
  QuantCounts counts;          // what quantizing it did (total only when the kind is fp32)
  float absmax = 0;
  // Scaled quantizers: the group figures (saturated, zero, NaN groups, scale range) and a
  // histogram of the groups' scales by their exponent.
  bool scaled = false;
  ScaledCounts groups;
  kernels::ExpHistogram scale_hist;
};

// A scaled operand kept for backward (docs/spec.md §6.6): the codes and scales of its
// quantization for the backward product (or its float32 values when codes are not kept),
// and how to turn them back into a tensor of the operand's shape.
struct SavedScaled : torch::CustomClassHolder {
  TensorKind kind = TensorKind::a;
  bool backward_form = false;  // quantized by the kind's backward form (LayerQuant::backward_form)
  bool scales_apart = false;  // restored as elements and scales (ProductOperand::scales)
  ScaledTensor q;
  MatrixView view;
  std::vector<std::int64_t> shape;
};

class StatsLog {
 public:
  void add(TensorStats s);
  std::vector<TensorStats> take();  // and clear
  std::size_t size() const;

 private:
  mutable std::mutex m_;
  std::vector<TensorStats> records_;
};

// Shared by every quantized layer of a model.
struct QuantContext {
  std::uint64_t seed = 0;             // run seed: stochastic rounding streams derive from it
  std::atomic<std::uint64_t> step{0}; // the trainer advances it once per optimizer step
  // The shard of the step's batch being computed when a step runs its batch as several
  // micro-batches (train.micro_batches): each draws its own streams and numbers its own
  // calls, so a shard's quantization is the same on whichever process computes it. 0 is the
  // whole batch's streams; statistics record shard 0 only.
  std::atomic<std::uint32_t> micro{0};
  // What the ops keep for backward. Activations (whose memory grows with the batch): their
  // 8-bit codes, else float32 Q(x). Weights: float32 Q(w) unless save_weight_codes (one
  // copy of the model, held from forward to backward; codes cost a decode pass per step).
  // Results are bit-identical either way.
  bool save_codes = true;
  bool save_weight_codes = false;
  int stats_interval = 0;             // record statistics every N steps; 0: off
  bool recording = true;              // false: quantize without counts or statistics (evaluation)
  std::shared_ptr<StatsLog> stats = std::make_shared<StatsLog>();
  std::atomic<std::int64_t> saved_bytes{0};         // activations saved for backward, bytes
  std::atomic<std::int64_t> saved_weight_bytes{0};  // weights' quantized copies, bytes
  std::atomic<std::int64_t> in_place{0};     // gradients quantized in their own memory
  // How the products of quantized layers run (docs/spec.md §7); fp32 is libtorch's float32
  // product, bit for bit as before.
  Compute compute = Compute::fp32;
  // How the sums of products accumulate (docs/spec.md §7.3); plain is float32.
  Accumulation accumulate;
  // Whether products go through the compute layer rather than libtorch's own float32 ops.
  bool layer_products() const { return compute != Compute::fp32 || !accumulate.plain(); }
};

// How the compute layer's products take a scaled operand (LayerState::operand_tensor).
enum class OperandLayout : std::uint8_t {
  as_float32,  // contiguous, as the float32 path lays it out (a matrix product's sums may
               // depend on its operands' layouts)
  any,         // as its matrix lies (a convolution lays its operands out itself)
};

// A backward product of an op, for the Hadamard transform (docs/spec.md §6.6): none (a
// forward product, or one the transform cannot go on), grad_x's or grad_w's.
enum class BackwardProduct : std::uint8_t { none, grad_x, grad_w };

// How an op uses its incoming gradient (LayerState::quantize_grad).
struct GradUse {
  // The op's backward products are products over the columns of both operands' matrices
  // (linear, matmul; not convolution), so the random Hadamard transform may apply.
  bool hadamard = false;
  // The kind of the operand g meets in grad_x's product (linear: w; matmul: a).
  TensorKind dx_partner = TensorKind::w;
  // Both go to the compute layer's products only; where bf16_codes(gx), they are the
  // bfloat16 tensor decoded from g's codes.
  bool for_products = false;
  OperandLayout layout = OperandLayout::as_float32;  // scaled: how the products take them
  // The op's products take float32 group scales on their output (LayerState::scales_apart).
  bool scales_apart = false;
};

// A quantized operand as a product takes it (docs/spec.md §6.7): its values, and the factor
// the product's output is multiplied by, the tensor scale its values leave out (1 where they
// leave none out).
struct ProductOperand {
  torch::Tensor t;
  float factor = 1;
  // Float32 group scales the values leave out, which the product applies to its chunks'
  // partial sums (docs/spec.md §6.8), per row of the operand's matrix: undefined where the
  // values carry their scales.
  ReductionScales scales;
};

// What one scaled quantization of a LayerState makes and records.
struct ScaledOutputs {
  bool values = true;     // the fake-quantized float32 matrix
  bool codes = false;     // element and scale codes (what backward keeps)
  bool count = true;      // counts and statistics: false for a second quantization of a
                          // tensor already counted (its backward operand)
  // The random Hadamard transform of this backward product's operands first (none: no
  // transform; LayerState::hadamard_applies).
  BackwardProduct hadamard = BackwardProduct::none;
  // Where the values are all bfloat16 values, they as bfloat16 instead of the float32 values
  // (ScaledForms::bf16); where some is not, the float32 values.
  bool bf16 = false;
  // A product's operand: where the quantizer puts its tensor scale on the product's output
  // (ScaledSpec::tensor_scale_on_output), values without it (ScaledTensor::output_factor).
  bool operand = false;
  // Quantized by the kind's backward form (LayerQuant::backward_form) rather than its own.
  bool backward_form = false;
};

// The numbering of a layer's calls within a step and the seeds of its random streams
// (docs/numerics.md, "Quantized training"): one stream per step, micro-batch, call, tensor
// kind and operand.
class LayerStreams {
 public:
  LayerStreams(const QuantContext& ctx, std::uint64_t layer_seed) : ctx_(ctx), layer_seed_(layer_seed) {}
  // The next call of the layer in this step and micro-batch (a layer may run several times).
  std::uint32_t begin_call();
  // The stream seed of one tensor: fresh per step, call, kind and operand.
  std::uint64_t seed_for(TensorKind k, std::uint32_t call, std::uint32_t operand = 0) const;
  // The random Hadamard transform's n signs for one backward product of one call: fresh per
  // step, the same for both of the product's operands (and in forward and backward).
  std::vector<float> hadamard_signs_for(std::uint32_t call, BackwardProduct product, int n) const;

 private:
  const QuantContext& ctx_;
  const std::uint64_t layer_seed_;
  mutable std::mutex m_;
  std::uint64_t call_step_ = ~std::uint64_t{0};
  std::uint32_t call_micro_ = 0, calls_ = 0;
};

// Delayed scaling's amax histories of a layer, one per kind and operand (docs/spec.md §6.3).
class AmaxHistories {
 public:
  AmaxHistories(const QuantContext& ctx, const LayerQuant& quant, const std::string& layer)
      : ctx_(ctx), quant_(quant), layer_(layer) {}
  // The call's scale inputs: the history's amax where the kind keeps one.
  ScaledCall scaled_call(TensorKind k, std::uint32_t operand) const;
  // A quantization's amax into the history (training only: evaluation uses it, never moves it).
  void push(TensorKind k, std::uint32_t operand, float amax);

  // As a checkpoint keeps them.
  struct History {
    TensorKind kind;
    std::uint32_t operand;
    std::vector<float> amaxes;  // oldest first
    friend bool operator==(const History&, const History&) = default;
  };
  std::vector<History> get() const;
  void restore(const std::vector<History>& h);  // throws Error on a kind without one

 private:
  const QuantContext& ctx_;
  const LayerQuant& quant_;
  const std::string& layer_;
  mutable std::mutex m_;
  std::map<std::pair<int, std::uint32_t>, AmaxHistory> histories_;
};

// What quantizing a tensor did, for a layer's counts and its statistics records.
struct QuantizeRecord {
  const torch::Tensor& input;                 // the tensor before quantization
  QuantCounts counts;                         // its elements' counts
  const ScaledCounts* groups = nullptr;       // scaled quantizers: the group figures
  const ScaledTensor* scaled = nullptr;       //   and the scales
};

// A layer's overflow counts per kind (cumulative) and its tensor statistics (on statistics
// steps, into the context's log).
class LayerStats {
 public:
  LayerStats(const QuantContext& ctx, const LayerQuant& quant, const std::string& layer)
      : ctx_(ctx), quant_(quant), layer_(layer) {}
  std::array<QuantCounts, kKinds> counts() const;
  void reset_counts();
  void add_counts(const std::array<QuantCounts, kKinds>& c);  // restoring them from a checkpoint
  // Whether call `call` of this step records a histogram.
  bool due(std::uint32_t call) const;
  // One quantization of kind k: into the counts and, when due, a record (none in evaluation).
  void record(TensorKind k, const QuantizeRecord& q, std::uint32_t call);

 private:
  const QuantContext& ctx_;
  const LayerQuant& quant_;
  const std::string& layer_;
  mutable std::mutex m_;
  std::array<QuantCounts, kKinds> counts_{};
};

// A layer's products of quantized operands on the context's compute path (docs/spec.md §7),
// counted by the path each took.
class LayerProducts {
 public:
  explicit LayerProducts(const QuantContext& ctx) : ctx_(ctx) {}
  // A matmul, and a convolution's forward, backward-data and backward-weights products.
  torch::Tensor matmul(const torch::Tensor& a, const torch::Tensor& b);
  // A product with float32 scales on its output (nn::matmul_scaled).
  torch::Tensor matmul_scaled(const torch::Tensor& a, const ReductionScales& sa, const torch::Tensor& b,
                              const ReductionScales& sb);
  torch::Tensor conv(const torch::Tensor& x, const torch::Tensor& w, const ConvGeometry& g);
  ConvGrads conv_backward(const torch::Tensor& gy_dx, const torch::Tensor& gy_dw, const torch::Tensor& x,
                          const torch::Tensor& w, const ConvGeometry& g, bool want_dx, bool want_dw);
  // Products run so far on each path: {float32, bfloat16}.
  std::pair<std::int64_t, std::int64_t> counts() const { return {fp32_.load(), bf16_.load()}; }

 private:
  const QuantContext& ctx_;
  void count(Compute taken) { ++(taken == Compute::bf16 ? bf16_ : fp32_); }
  std::atomic<std::int64_t> fp32_{0}, bf16_{0};
};

// Which operand of its op a tensor is (its own random stream) and how its saved form is used
// (LayerState::quantize_and_save).
struct SaveAs {
  std::uint32_t operand = 0;
  bool for_products = false;  // read by the compute layer's products only
};

// An operand of a product under scaled quantizers (LayerState::quantize_scaled_operand).
struct ScaledOperand {
  MatrixView fwd, bwd;        // the forward product's and the backward product's matrices
  std::uint32_t operand = 0;  // which operand of the op: its own random stream
  // The backward product this operand's bwd form is for, where the Hadamard transform may
  // apply (linear layers, matmuls); none elsewhere.
  BackwardProduct product = BackwardProduct::none;
  // Read by the compute layer's products only: Q_k(t) is then bfloat16 where its values are
  // (LayerState::operand_tensor), laid out as `layout` says.
  bool for_products = false;
  OperandLayout layout = OperandLayout::as_float32;
  // The op's products apply float32 group scales to their output (matmul_scaled: linear
  // layers and matmuls), so the operand may leave them out (LayerState::scales_apart).
  bool scales_apart = false;
};

// A quantized op's layer: its quantizers (the recipe's spec for each kind, the random
// streams, the amax histories), its statistics and its product path, and the quantization
// of the op's tensors that uses them (ops.cpp's autograd functions call these).
struct LayerState : torch::CustomClassHolder {
  LayerState(std::string name, const LayerQuant& q, std::shared_ptr<QuantContext> ctx, int index);
  LayerState(const LayerState&) = delete;
  LayerState& operator=(const LayerState&) = delete;

  const std::string name;  // module path
  const int index;         // position among the model's quantized layers
  const LayerQuant quant;
  const std::shared_ptr<QuantContext> ctx;
  LayerStreams streams;
  AmaxHistories amax;
  LayerStats stats;
  LayerProducts products;

  bool scaled(TensorKind k) const { return quant[k] && quant[k]->scaled(); }
  // Whether k has a backward form of its own (LayerQuant::backward_form): its backward
  // product's operand is then that quantizer's, its forward product's quant[k]'s.
  bool has_backward_form(TensorKind k) const { return quant.backward_form(k).has_value(); }
  // Whether the operand of kind k that a backward product reads is scaled: its backward form
  // where it has one, else its own quantizer.
  bool scaled_backward(TensorKind k) const { return has_backward_form(k) || scaled(k); }
  // The scaled quantizer of k, or of its backward form (which the caller knows is scaled).
  const ScaledSpec& spec(TensorKind k, bool backward_form = false) const {
    return *(backward_form ? quant.backward_form(k) : quant[k]);
  }
  // Whether Q_k's values reach this layer's products as bfloat16 decoded from 8-bit codes:
  // the compute path may take bfloat16 on this CPU, and k's quantizer is an element
  // format of at most 8 bits whose values are all bfloat16 values (docs/spec.md §7.2).
  bool bf16_codes(TensorKind k) const;
  // Whether the random Hadamard transform applies to the operands of a backward product
  // whose other operand (beside g) is of kind `partner`: asked for on that product, and both
  // quantizers scaled (docs/spec.md §6.6).
  bool hadamard_applies(BackwardProduct product, TensorKind partner) const {
    const bool on = product == BackwardProduct::grad_w ||
                    (product == BackwardProduct::grad_x && quant.hadamard_on == HadamardProducts::backward);
    return on && quant.hadamard > 0 && scaled_backward(partner) && scaled(TensorKind::gx);
  }
  // The signs of the Hadamard transform on one backward product of a call, as
  // quant.hadamard_signs says: the call's random ones, all +1 (none) or TransformerEngine's.
  std::vector<float> hadamard_signs(std::uint32_t call, BackwardProduct product) const;
  // Whether k's operands leave their float32 group scales to the product (docs/spec.md §6.8):
  // the quantizer puts them on the output and the op's products can (`op_can`).
  bool scales_apart(TensorKind k, bool op_can) const { return op_can && scaled(k) && quant[k]->scales_on_output(); }

  // Q_k(t): fake-quantized float32 (t itself when the kind is float32); counts and, on
  // statistics steps, a record.
  torch::Tensor quantize(TensorKind k, const torch::Tensor& t, std::uint32_t call, std::uint32_t operand = 0);
  // Q_k(t) for a tensor the caller owns and will not read again (a gradient handed to
  // backward, one just computed): overwritten in place when nothing else refers to its
  // storage, which spares a fresh tensor and a pass over memory; else as quantize().
  // `refs`: the references the caller's own handles hold (1: a local tensor; for the
  // gradient a backward receives, backward_grad_refs()).
  torch::Tensor quantize_owned(TensorKind k, torch::Tensor t, std::uint32_t call, std::int64_t refs = 1);
  // Q_k(t) for the forward pass and what to save for backward (codes when possible).
  // With `for_products` (the op's products all go through the compute layer), where the
  // kind's values reach the products as bfloat16 (bf16_codes()), Q_k(t) is the bfloat16
  // tensor decoded from the codes: no float32 copy is made.
  std::pair<torch::Tensor, torch::Tensor> quantize_and_save(TensorKind k, const torch::Tensor& t,
                                                            std::uint32_t call, SaveAs how = {});
  // Inverse of the saved form: float32 Q_k(t).
  torch::Tensor restore(TensorKind k, const torch::Tensor& saved) const;
  // A saved operand restored for this layer's products: bfloat16 where the compute path may
  // take bfloat16 and the operand was saved as 8-bit codes of a format whose values are all
  // bfloat16 values (decoded straight to bfloat16), float32 otherwise (as restore()).
  torch::Tensor restore_for_product(TensorKind k, const torch::Tensor& saved) const;

  // Scaled quantizers (docs/spec.md §6.6): every operand of a product is quantized from
  // float32 with its blocks along that product's reduction dimension, the columns of a
  // MatrixView.
  // Q_k(t) for the forward product, and the operand's quantization for the backward
  // product as backward keeps it. Where the quantizer puts its tensor scale on the product's
  // output (docs/spec.md §6.7), the operand's values leave it out and its factor holds it.
  std::pair<ProductOperand, c10::intrusive_ptr<SavedScaled>> quantize_scaled_operand(TensorKind k,
                                                                                    const torch::Tensor& t,
                                                                                    std::uint32_t call,
                                                                                    const ScaledOperand& o);
  // Where k has a backward form (has_backward_form): Q_k(t) for the forward product (its
  // own quantizer's, which need not be scaled; an operand as quantize_scaled_operand's), and
  // the backward form's quantization of t for the backward product, as backward keeps it,
  // from t itself with its own stream and amax.
  // `values`: where not null, also Q_k(t) itself as float32 of t's shape (the values the
  // forward product reads, its tensor and group scales applied), for bwd_from = forward.
  ProductOperand quantize_forward_operand(TensorKind k, const torch::Tensor& t, std::uint32_t call,
                                          const ScaledOperand& o, torch::Tensor* values = nullptr);
  c10::intrusive_ptr<SavedScaled> quantize_backward_form(TensorKind k, const torch::Tensor& t, std::uint32_t call,
                                                         const ScaledOperand& o);
  // The saved operand as a tensor of its shape, contiguous, with its factor; with
  // `for_products` (read by the compute layer's products only) as operand_tensor gives it.
  ProductOperand restore(const SavedScaled& saved, bool for_products = false,
                         OperandLayout layout = OperandLayout::as_float32) const;
  // The incoming gradient quantized for the grad_x product (blocks along `for_dx`) and for
  // the grad_w product (along `for_dw`), each with its factor. A fixed-bias or float32 gx
  // quantizer gives the one tensor quantize_owned() gives, twice. Scaled, with
  // use.for_products, both as operand_tensor gives them (laid out as use.layout).
  std::pair<ProductOperand, ProductOperand> quantize_grad(torch::Tensor g, const MatrixView& for_dx,
                                                          const MatrixView& for_dw, std::uint32_t call,
                                                          std::int64_t refs, GradUse use = {});
  // Q_k(t) of a tensor that is no product's operand (the weight gradient), blocks along `v`.
  torch::Tensor quantize_along(TensorKind k, torch::Tensor t, const MatrixView& v, std::uint32_t call);

 private:
  // Whether the values of k's scaled operands may all be bfloat16 values, so that the compute
  // layer's products may run on them: a bfloat16 compute path on this CPU, an element format
  // of at most 7 mantissa bits, and block scales that add few significant bits (E8M0: none;
  // UE4M3: at most 4, exact beside E2M1, E2M3, E3M2 and E4M3 elements) with no float32
  // tensor scale folded into the values. The values themselves decide the rest, at conversion.
  // `backward_form`: of k's backward form.
  bool scaled_bf16(TensorKind k, bool backward_form = false) const;
  // The operand of a quantization whose float32 group scales stay apart: its elements alone
  // (bfloat16 where for_products and the compute path may take it) laid out as shape under
  // v, and its scales (a per-tensor scale as the factor).
  ProductOperand apart_operand(TensorKind k, const ScaledTensor& q, at::IntArrayRef shape, const MatrixView& v,
                               bool for_products, bool backward_form = false) const;
  // A saved backward operand of kind k (of its backward form with `backward_form`) before its
  // quantization: what it is and how it is restored; and its bytes, once quantized, counted.
  c10::intrusive_ptr<SavedScaled> saved_operand(TensorKind k, const torch::Tensor& t, const ScaledOperand& o,
                                                bool backward_form) const;
  void count_saved(const SavedScaled& saved) const;
  // A forward product's operand from its quantization f (apart: its group scales apart).
  ProductOperand forward_operand(TensorKind k, const ScaledTensor& f, const torch::Tensor& t, const ScaledOperand& o,
                                 bool apart) const;
  // The contiguous tensor of shape `shape` whose matrix under v is m (from_matrix), as an
  // operand of this layer's products: with `for_products`, bfloat16 where scaled_bf16(k) and
  // every value of m is a bfloat16 value (converted in m's own layout, then laid out as
  // shape: half the bytes of laying out float32, and the products' own conversion spared),
  // float32 otherwise. The same values in the same layout either way, so the same products.
  // An m already in bfloat16 (the quantizer's ScaledForms::bf16) is only laid out.
  // OperandLayout::any, where every kind the products read is scaled_bf16: the bfloat16
  // tensor as a view of its matrix, with no copy at all (a convolution then lays it out for
  // oneDNN as it would the contiguous one; should a float32 product run instead, because some
  // value lay outside bfloat16's range, it would read this layout).
  torch::Tensor operand_tensor(TensorKind k, const torch::Tensor& m, at::IntArrayRef shape, const MatrixView& v,
                               bool for_products, OperandLayout layout, bool backward_form = false) const;
  // One scaled quantization of t under view v, from stream `stream`.
  ScaledTensor quantize_scaled(TensorKind k, const torch::Tensor& t, const MatrixView& v, std::uint32_t call,
                               std::uint32_t stream, const ScaledCall& sc, ScaledOutputs out = {});
  // The same on t's matrix m (the Hadamard transform, if any, already applied).
  ScaledTensor quantize_scaled_matrix(TensorKind k, const torch::Tensor& t, const torch::Tensor& m, std::uint32_t call,
                                      std::uint32_t stream, const ScaledCall& sc, const ScaledOutputs& out);
  // Where out asked for the bfloat16 form with float32 values to fall back on and some value
  // was no bfloat16 value: q's float32 values, quantized again from its matrix m.
  void values_where_not_bf16(TensorKind k, ScaledTensor& q, const torch::Tensor& m, std::uint64_t seed,
                             const ScaledCall& sc, const ScaledOutputs& out) const;
  // Two quantizations of t along different axes (a product's operand and its backward form):
  // quantize_scaled under `first`, then under `second` with the first's amax known. In one
  // read (scaled_quantize_matrix_both) where the second's matrix is the transpose of the
  // first's and neither takes the Hadamard transform; the same bits either way.
  struct ScaledQuantization {
    const MatrixView& view;
    std::uint32_t stream;
    ScaledOutputs out;
  };
  std::pair<ScaledTensor, ScaledTensor> quantize_scaled_twice(TensorKind k, const torch::Tensor& t, std::uint32_t call,
                                                              const ScaledCall& sc, const ScaledQuantization& first,
                                                              const ScaledQuantization& second);
  // Q_k(t) as bfloat16 and, with `codes`, its 8-bit codes (bf16_codes(k) holds).
  std::pair<torch::Tensor, torch::Tensor> encode_for_products(TensorKind k, const torch::Tensor& t,
                                                              std::uint32_t call, std::uint32_t operand, bool codes);
  bool saves_codes(TensorKind k) const { return k == TensorKind::w ? ctx->save_weight_codes : ctx->save_codes; }
  std::atomic<std::int64_t>& saved_bytes(TensorKind k) const {
    return k == TensorKind::w ? ctx->saved_weight_bytes : ctx->saved_bytes;
  }
};

using LayerStatePtr = c10::intrusive_ptr<LayerState>;
// A layer's state; a null context gets a fresh one.
LayerStatePtr make_layer_state(std::string name, const LayerQuant& q, std::shared_ptr<QuantContext> ctx,
                               int index = 0);

// How many references the autograd engine and the custom-function machinery hold to the
// gradient a backward receives when nothing else does (measured once on a probe graph, as
// it depends on libtorch's internals): a gradient also handed to another node (through an
// add, say) has more, and is never overwritten.
std::int64_t backward_grad_refs();


}  // namespace fp8lab::nn
