#include "fp8lab/nn/ops.hpp"

#include <ATen/ATen.h>
#include <torch/torch.h>

#include <memory>
#include <mutex>
#include <unordered_map>

#include "fp8lab/nn/tensor_quant.hpp"

namespace fp8lab::nn {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

// What a product keeps from its forward to its backward when it runs outside autograd's own
// graph (split_forward, the custom ops of torch.compile): the part of AutogradContext the
// ops use, so that both run the same forward and backward code.
class PlainContext {
 public:
  decltype(AutogradContext::saved_data) saved_data;
  void save_for_backward(variable_list v) { saved_ = std::move(v); }
  variable_list get_saved_variables() const { return saved_; }
  bool needs_input_grad(std::size_t i) const { return i < needs.size() && needs[i]; }
  std::vector<bool> needs;  // set by split_backward from its caller's autograd

 private:
  variable_list saved_;
};

template <class Ctx>
LayerStatePtr state_of(Ctx* ctx) {
  return c10::static_intrusive_pointer_cast<LayerState>(ctx->saved_data["st"].toCapsule());
}

// ---- the matrices products read (docs/spec.md §6.6) -------------------------------------
// The columns of each are the product's reduction dimension: scaled quantizers block along
// them.

MatrixView last_dim() { return {}; }
// [d0, ..., dn] -> [dn, d0 * ... * d(n-1)]: reduction over every dimension but the last.
MatrixView all_but_last(std::int64_t dims) {
  MatrixView v;
  v.perm.push_back(dims - 1);
  for (std::int64_t d = 0; d + 1 < dims; ++d) v.perm.push_back(d);
  v.cols_dims = static_cast<int>(dims - 1);
  return v;
}
// [..., m, n] -> [..., n, m]: reduction over the second-last dimension.
MatrixView second_last(std::int64_t dims) {
  MatrixView v;
  for (std::int64_t d = 0; d < dims; ++d) v.perm.push_back(d);
  std::swap(v.perm[static_cast<std::size_t>(dims - 1)], v.perm[static_cast<std::size_t>(dims - 2)]);
  return v;
}
// The views of a convolution's tensors of `dims` dimensions ([N, C, S...] activations and
// gradients, [A, B, k...] weights), S and k of 1 to 3 positions.
// [d0, d1, d2, ...] -> [d0, d2, ..., d1]: the second dimension moved last.
std::vector<std::int64_t> second_last_out(std::int64_t dims) {
  std::vector<std::int64_t> perm{0};
  for (std::int64_t d = 2; d < dims; ++d) perm.push_back(d);
  perm.push_back(1);
  return perm;
}
// [N, C, S...] -> [N*S, C]: reduction over channels.
MatrixView channels(std::int64_t dims) { return {{}, second_last_out(dims), 1}; }
// [N, C, S...] -> [C, N*S]: reduction over batch and positions (the weight gradient's).
MatrixView batch_positions(std::int64_t dims) {
  std::vector<std::int64_t> perm{1, 0};
  for (std::int64_t d = 2; d < dims; ++d) perm.push_back(d);
  return {{}, perm, static_cast<int>(dims - 1)};
}
// A weight [A, B, k...] -> [A, k*B], B fastest: a convolution's forward reduction
// ([O, C/g, k...]: over input channels and kernel positions).
MatrixView weight_rows(std::int64_t dims) { return {{}, second_last_out(dims), static_cast<int>(dims - 1)}; }
// A weight [A, B, k...] in `groups` groups of A -> [groups*B, k*A/groups], A fastest: the
// reduction over A within each group and the kernel positions (a convolution's grad_x).
MatrixView weight_groups(const torch::Tensor& w, std::int64_t groups) {
  std::vector<std::int64_t> view{groups, w.size(0) / groups};
  for (std::int64_t d = 1; d < w.dim(); ++d) view.push_back(w.size(d));
  return {view, second_last_out(w.dim() + 1), static_cast<int>(w.dim() - 1)};
}

struct Operand {
  const torch::Tensor& t;
  TensorKind kind;
  std::uint32_t index;  // which operand of the op: selects its own random stream
  MatrixView fwd, bwd;  // its matrices in the forward and the backward product
  // The backward product its bwd form is for, where the Hadamard transform may apply (linear
  // layers and matmuls: their backward products pair the operands' columns one to one).
  BackwardProduct product = BackwardProduct::none;
  bool scales_apart = false;  // the op's products take float32 group scales on their output (linear, matmul)
};

std::string saved_key(int i) { return "scaled" + std::to_string(i); }

// A product's output times its operands' factors, the tensor scales their values leave out
// (docs/spec.md §6.7): y * fl32(fa * fb) in float32, in place (y itself where that is 1).
torch::Tensor times_factors(torch::Tensor y, float fa, float fb) {
  const float f = fa * fb;
  return f == 1.0f ? y : y.mul_(f);
}

// An operand's group scales for a product that reads its tensor t (its leading dimensions
// the batch's) with `rows` rows in the scales' sense: a first operand's t.size(-2), a
// second's t.size(-1) (the scales are per row of the operand's matrix, docs/spec.md §6.8).
ReductionScales batched(const ReductionScales& s, const torch::Tensor& t, std::int64_t rows) {
  if (!s.defined()) return s;
  std::vector<std::int64_t> shape(t.sizes().begin(), t.sizes().end() - 2);
  shape.insert(shape.end(), {rows, -1});
  return {s.s.reshape(shape), s.group};
}

// a b for the operands x (a: its tensor as the product reads it, [..., M, K]) and y (b,
// [..., K, N]): with either's float32 group scales apart, nn::matmul_scaled (through the
// layer's compute path where `layer_products`, else in float32); otherwise the plain
// product. Then the factors.
torch::Tensor operand_product(LayerState& st, const ProductOperand& x, const torch::Tensor& a, const ProductOperand& y,
                              const torch::Tensor& b) {
  const bool layer_products = st.ctx->layer_products();
  torch::Tensor p;
  if (x.scales.defined() || y.scales.defined()) {
    const ReductionScales sa = batched(x.scales, a, a.size(-2)), sb = batched(y.scales, b, b.size(-1));
    p = layer_products ? st.products.matmul_scaled(a, sa, b, sb) : matmul_scaled(a, sa, b, sb, Compute::fp32);
  } else {
    p = layer_products ? st.products.matmul(a, b) : a.matmul(b);
  }
  return times_factors(std::move(p), x.factor, y.factor);
}

// Forward prologue shared by the ops: Q(first), Q(second), and what backward needs (the
// saved forms, the layer state, the call number). Returns the two quantized operands.
// `for_products`: the op's products all go through the compute layer, which then may
// receive bfloat16 operands (LayerState::quantize_and_save).
template <class Ctx>
std::pair<ProductOperand, ProductOperand> quantize_operands(Ctx* ctx,
                                                          const LayerStatePtr& st, Operand a,
                                                          Operand b, bool for_products,
                                                          OperandLayout layout = OperandLayout::as_float32) {
  const std::uint32_t call = st->streams.begin_call();
  std::array<ProductOperand, 2> q;
  std::array<torch::Tensor, 2> saved;
  for (int i = 0; i < 2; ++i) {
    const Operand& o = i == 0 ? a : b;
    const ScaledOperand so{o.fwd, o.bwd, o.index, o.product, for_products, layout, o.scales_apart};
    if (st->has_backward_form(o.kind)) {  // two quantizers: the forward's, and the backward form's
      const bool from_forward = st->quant.bwd_from == BackwardSource::forward;
      torch::Tensor forward_values;
      q[i] = st->quantize_forward_operand(o.kind, o.t, call, so, from_forward ? &forward_values : nullptr);
      ctx->saved_data[saved_key(i)] = c10::IValue::make_capsule(
          st->quantize_backward_form(o.kind, from_forward ? forward_values : o.t, call, so));
    } else if (st->scaled(o.kind)) {
      auto [y, keep] = st->quantize_scaled_operand(o.kind, o.t, call, so);
      q[i] = std::move(y);
      ctx->saved_data[saved_key(i)] = c10::IValue::make_capsule(std::move(keep));
    } else {
      std::tie(q[i].t, saved[i]) = st->quantize_and_save(o.kind, o.t, call, {o.index, for_products});
    }
  }
  ctx->save_for_backward({saved[0], saved[1]});
  ctx->saved_data["st"] = c10::IValue::make_capsule(st);
  ctx->saved_data["call"] = static_cast<std::int64_t>(call);
  return {q[0], q[1]};
}

// Backward prologue: the layer state, the call number and the two quantized operands.
struct Saved {
  LayerStatePtr st;
  std::uint32_t call;
  ProductOperand a, b;
};
// `for_products`: the operands are read by the compute layer's products only, which take
// them as bfloat16 where they may (LayerState::restore_for_product).
template <class Ctx>
Saved restore_operands(Ctx* ctx, TensorKind ka, TensorKind kb, bool for_products = false,
                       OperandLayout layout = OperandLayout::as_float32) {
  Saved s{state_of(ctx), static_cast<std::uint32_t>(ctx->saved_data["call"].toInt()), {}, {}};
  const auto saved = ctx->get_saved_variables();
  const auto restore = [&](int i, TensorKind k) {
    const auto it = ctx->saved_data.find(saved_key(i));
    if (it == ctx->saved_data.end()) {
      const torch::Tensor& t = saved[static_cast<std::size_t>(i)];
      return ProductOperand{for_products ? s.st->restore_for_product(k, t) : s.st->restore(k, t)};
    }
    return s.st->restore(*c10::static_intrusive_pointer_cast<SavedScaled>(it->second.toCapsule()), for_products, layout);
  };
  s.a = restore(0, ka);
  s.b = restore(1, kb);
  return s;
}

// `t` as a matrix of its last dimension's rows, [leading elements, last]: also where the
// last dimension is 0 (a Linear with no inputs or outputs, which torch runs), where
// reshape({-1, 0}) cannot say how many rows.
torch::Tensor as_rows(const torch::Tensor& t) {
  std::int64_t rows = 1;
  for (std::int64_t d = 0; d + 1 < t.dim(); ++d) rows *= t.size(d);
  return t.reshape({rows, t.dim() > 0 ? t.size(-1) : 1});
}

// The values of t as a tensor autograd does not take for a view. torch::linear returns a view
// for a contiguous 3-d input with a bias (addmm, then view), as does reshaping a product's
// rows: an autograd Function's output that is a view refuses in-place ops (wav2vec2's
// masked assignment), where torch's own linear allows them. The same memory, no copy.
torch::Tensor not_a_view(const torch::Tensor& t) { return t.is_view() ? at::_unsafe_view(t, t.sizes()) : t; }

class LinearFn : public torch::autograd::Function<LinearFn> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& w,
                               const torch::Tensor& b, LayerStatePtr st) {
    return run(ctx, x, w, b, std::move(st));
  }
  template <class Ctx>
  static torch::Tensor run(Ctx* ctx, const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                           LayerStatePtr st) {
    const auto [xq, wq] =
        quantize_operands(ctx, st,
                          {x, TensorKind::a, 0, last_dim(), all_but_last(x.dim()), BackwardProduct::grad_w, true},
                          {w, TensorKind::w, 0, last_dim(), second_last(2), BackwardProduct::grad_x, true},
                          st->ctx->layer_products());
    const bool fp32 = !st->ctx->layer_products();
    const bool scales = xq.scales.defined() || wq.scales.defined();
    if (fp32 && !scales && xq.factor * wq.factor == 1.0f)
      return not_a_view(torch::linear(xq.t, wq.t, b.numel() > 0 ? b : torch::Tensor()));
    // Other paths: the product (through the compute layer), its factors, then the bias.
    std::vector<std::int64_t> shape(xq.t.sizes().begin(), xq.t.sizes().end());
    shape.back() = wq.t.size(0);
    torch::Tensor y;
    if (fp32 && !scales)
      y = times_factors(torch::linear(xq.t, wq.t), xq.factor, wq.factor);
    else
      y = operand_product(*st, xq, as_rows(xq.t), wq, wq.t.t()).reshape(shape);
    y = not_a_view(std::move(y));
    return b.numel() > 0 ? y.add_(b) : y;
  }

  template <class Ctx>
  static variable_list backward(Ctx* ctx, variable_list grads) {
    const bool layer_products = state_of(ctx)->ctx->layer_products();
    const auto [st, call, xq_saved, wq] = restore_operands(ctx, TensorKind::a, TensorKind::w, layer_products);
    torch::Tensor g = std::move(grads[0]);
    const std::int64_t in_f = wq.t.size(1);
    torch::Tensor dx, dw, db;
    // The bias gradient is of the float32 gradient: before g may be quantized in place. (The
    // stand-in for "no bias" never needs one; a bias of no elements, Linear(n, 0), does.)
    if (ctx->needs_input_grad(2)) db = as_rows(g).sum(0);
    const std::vector<std::int64_t> g_shape(g.sizes().begin(), g.sizes().end());
    const std::int64_t g_dims = g.dim();
    const auto [g_for_dx, g_for_dw] = st->quantize_grad(std::move(g), last_dim(), all_but_last(g_dims), call,
                                                        backward_grad_refs(),
                                                        {.hadamard = true, .for_products = layer_products,
                                                         .scales_apart = true});
    // The same products libtorch's addmm/mm backward forms, so that with float32
    // quantizers the gradients are bit-identical to torch::linear's.
    if (ctx->needs_input_grad(0)) {
      dx = operand_product(*st, g_for_dx, as_rows(g_for_dx.t), wq, wq.t);
      std::vector<std::int64_t> shape = g_shape;
      shape.back() = in_f;
      dx = dx.reshape(shape);
    }
    if (ctx->needs_input_grad(1)) {
      const torch::Tensor p = operand_product(*st, xq_saved, as_rows(xq_saved.t).t(), g_for_dw, as_rows(g_for_dw.t));
      dw = st->quantize_along(TensorKind::gw, p.t().contiguous(), last_dim(), call);
    }
    return {dx, dw, db, torch::Tensor()};
  }
};

ConvGeometry geometry(const std::vector<std::int64_t>& stride, const std::vector<std::int64_t>& padding,
                      const std::vector<std::int64_t>& dilation, std::int64_t groups) {
  return {{stride[0], stride[1]}, {padding[0], padding[1]}, {dilation[0], dilation[1]}, groups};
}

// Whether libtorch's own weight gradient of this convolution would run the kernel that
// corrupts the heap: torch 2.13's oneDNN (jit_avx512_common_1x1_convolution_bwd_weights),
// for a 1x1 convolution with a stride above 1 and fewer than 16 input channels in
// channels-last, writes out of bounds at batch sizes such as 3, 5, 7 and 21 (a CIFAR
// ResNet of width 4 or 8: its shortcut projections), and the process dies in malloc.
bool onednn_1x1_strided_grad_w_bug(const torch::Tensor& x, const torch::Tensor& w,
                                   const std::vector<std::int64_t>& stride, const std::vector<std::int64_t>& padding) {
  return w.size(2) == 1 && w.size(3) == 1 && (stride[0] > 1 || stride[1] > 1) && padding[0] == 0 &&
         padding[1] == 0 && x.size(1) < 16 &&
         (x.suggest_memory_format() == torch::MemoryFormat::ChannelsLast ||
          w.suggest_memory_format() == torch::MemoryFormat::ChannelsLast);
}

// libtorch's gradients (dx, dw) of a convolution for the output gradient g. A 1x1
// convolution with stride s and no padding reads only the input's positions (s i, s j):
// where the kernel above would run, its weight gradient is taken as the stride-1 product of
// those positions, which is the same sum.
std::pair<torch::Tensor, torch::Tensor> torch_conv_backward(const torch::Tensor& g, const torch::Tensor& x,
                                                            const torch::Tensor& w,
                                                            const std::vector<std::int64_t>& stride,
                                                            const std::vector<std::int64_t>& padding,
                                                            const std::vector<std::int64_t>& dilation,
                                                            std::int64_t groups, bool want_dx, bool want_dw) {
  const auto call = [&](const torch::Tensor& in, const std::vector<std::int64_t>& st, bool dx, bool dw) {
    return at::convolution_backward(g, in, w, std::nullopt, st, padding, dilation, false, {0, 0}, groups,
                                    {dx, dw, false});
  };
  if (!want_dw || !onednn_1x1_strided_grad_w_bug(x, w, stride, padding)) {
    auto r = call(x, stride, want_dx, want_dw);
    return {std::get<0>(r), std::get<1>(r)};
  }
  torch::Tensor dx;
  if (want_dx) dx = std::get<0>(call(x, stride, true, false));
  const torch::Tensor picked = x.slice(2, 0, x.size(2), stride[0])
                                   .slice(3, 0, x.size(3), stride[1])
                                   .contiguous(x.suggest_memory_format());
  return {dx, std::get<1>(call(picked, {1, 1}, false, true))};
}

class Conv2dFn : public torch::autograd::Function<Conv2dFn> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& w,
                               const torch::Tensor& b, std::vector<std::int64_t> stride,
                               std::vector<std::int64_t> padding,
                               std::vector<std::int64_t> dilation, std::int64_t groups,
                               LayerStatePtr st) {
    return run(ctx, x, w, b, std::move(stride), std::move(padding), std::move(dilation), groups, std::move(st));
  }
  template <class Ctx>
  static torch::Tensor run(Ctx* ctx, const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                           std::vector<std::int64_t> stride, std::vector<std::int64_t> padding,
                           std::vector<std::int64_t> dilation, std::int64_t groups, LayerStatePtr st) {
    const auto [xq, wq] = quantize_operands(ctx, st, {x, TensorKind::a, 0, channels(4), batch_positions(4)},
                                            {w, TensorKind::w, 0, weight_rows(4), weight_groups(w, groups)},
                                            st->ctx->layer_products(), OperandLayout::any);
    ctx->saved_data["stride"] = stride;
    ctx->saved_data["padding"] = padding;
    ctx->saved_data["dilation"] = dilation;
    ctx->saved_data["groups"] = groups;
    const bool fp32 = !st->ctx->layer_products();
    if (fp32 && xq.factor * wq.factor == 1.0f)
      return torch::conv2d(xq.t, wq.t, b.numel() > 0 ? b : torch::Tensor(), stride, padding, dilation, groups);
    // Other paths: the product (through the compute layer), its factors, then the bias.
    torch::Tensor p = fp32 ? torch::conv2d(xq.t, wq.t, {}, stride, padding, dilation, groups)
                           : st->products.conv(xq.t, wq.t, geometry(stride, padding, dilation, groups));
    torch::Tensor y = times_factors(std::move(p), xq.factor, wq.factor);
    return b.numel() > 0 ? y.add_(b.reshape({1, -1, 1, 1})) : y;
  }

  template <class Ctx>
  static variable_list backward(Ctx* ctx, variable_list grads) {
    // With the compute layer, the saved operands are read by its products only.
    const bool layer_products = state_of(ctx)->ctx->layer_products();
    const auto [st, call, xq, wq] = restore_operands(ctx, TensorKind::a, TensorKind::w, layer_products, OperandLayout::any);
    torch::Tensor g = std::move(grads[0]);
    const auto stride = ctx->saved_data["stride"].toIntVector();
    const auto padding = ctx->saved_data["padding"].toIntVector();
    const auto dilation = ctx->saved_data["dilation"].toIntVector();
    const std::int64_t groups = ctx->saved_data["groups"].toInt();
    torch::Tensor db;
    if (layer_products && ctx->needs_input_grad(2)) {
      db = g.sum({0, 2, 3});  // of the float32 g, before it may be quantized in place
    } else if (ctx->needs_input_grad(2)) {
      // libtorch's own bias reduction of the float32 g (so that float32 quantizers match
      // exactly), before g may be quantized in place.
      const std::vector<std::int64_t> bias_sizes{wq.t.size(0)};
      db = std::get<2>(at::convolution_backward(g, xq.t, wq.t, bias_sizes, stride, padding, dilation,
                                                false, {0, 0}, groups, {false, false, true}));
    }
    const auto [g_for_dx, g_for_dw] = st->quantize_grad(std::move(g), channels(4), batch_positions(4), call,
                                                        backward_grad_refs(),
                                                        {.for_products = layer_products, .layout = OperandLayout::any});
    const auto backward = [&](const torch::Tensor& gq, bool want_dx, bool want_dw) {
      return torch_conv_backward(gq, xq.t, wq.t, stride, padding, dilation, groups, want_dx, want_dw);
    };
    torch::Tensor dx, dw;
    if (layer_products) {  // the compute layer's products
      ConvGrads r = st->products.conv_backward(g_for_dx.t, g_for_dw.t, xq.t, wq.t,
                                               geometry(stride, padding, dilation, groups), ctx->needs_input_grad(0),
                                               ctx->needs_input_grad(1));
      dx = std::move(r.dx);
      dw = std::move(r.dw);
    } else if (g_for_dx.t.is_same(g_for_dw.t)) {  // one quantized gradient: one call, as libtorch's own backward
      std::tie(dx, dw) = backward(g_for_dx.t, ctx->needs_input_grad(0), ctx->needs_input_grad(1));
    } else {
      if (ctx->needs_input_grad(0)) dx = backward(g_for_dx.t, true, false).first;
      if (ctx->needs_input_grad(1)) dw = backward(g_for_dw.t, false, true).second;
    }
    if (dx.defined()) dx = times_factors(std::move(dx), g_for_dx.factor, wq.factor);
    if (dw.defined()) dw = times_factors(std::move(dw), g_for_dw.factor, xq.factor);
    if (dw.defined()) dw = st->quantize_along(TensorKind::gw, std::move(dw), weight_rows(4), call);
    return {dx, dw, db, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(),
            torch::Tensor()};
  }
};

// ---- N-d and transposed convolutions ----------------------------------------------------

struct ConvParams {
  std::vector<std::int64_t> stride, padding, dilation, output_padding;
  bool transposed = false;
  std::int64_t groups = 1;
};

// The weight's matrices: forward and grad_x's. A convolution's weight [O, C/g, k...] reduces
// over C/g and k going forward and over O within a group for grad_x; a transposed one's
// [C, O/g, k...] the other way round.
std::pair<MatrixView, MatrixView> weight_views(const torch::Tensor& w, const ConvParams& c) {
  MatrixView rows = weight_rows(w.dim()), groups = weight_groups(w, c.groups);
  return c.transposed ? std::pair{groups, rows} : std::pair{rows, groups};
}

class ConvNdFn : public torch::autograd::Function<ConvNdFn> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& w,
                               const torch::Tensor& b, std::vector<std::int64_t> stride,
                               std::vector<std::int64_t> padding, std::vector<std::int64_t> dilation,
                               std::vector<std::int64_t> output_padding, bool transposed, std::int64_t groups,
                               LayerStatePtr st) {
    return run(ctx, x, w, b, std::move(stride), std::move(padding), std::move(dilation), std::move(output_padding),
               transposed, groups, std::move(st));
  }
  template <class Ctx>
  static torch::Tensor run(Ctx* ctx, const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                           std::vector<std::int64_t> stride, std::vector<std::int64_t> padding,
                           std::vector<std::int64_t> dilation, std::vector<std::int64_t> output_padding,
                           bool transposed, std::int64_t groups, LayerStatePtr st) {
    const ConvParams c{stride, padding, dilation, output_padding, transposed, groups};
    const auto [wf, wb] = weight_views(w, c);
    const auto [xq, wq] = quantize_operands(ctx, st, {x, TensorKind::a, 0, channels(x.dim()), batch_positions(x.dim())},
                                            {w, TensorKind::w, 0, wf, wb}, false);
    ctx->saved_data["stride"] = stride;
    ctx->saved_data["padding"] = padding;
    ctx->saved_data["dilation"] = dilation;
    ctx->saved_data["output_padding"] = output_padding;
    ctx->saved_data["transposed"] = transposed;
    ctx->saved_data["groups"] = groups;
    if (xq.factor * wq.factor == 1.0f)
      return at::convolution(xq.t, wq.t, b.numel() > 0 ? b : torch::Tensor(), stride, padding, dilation, transposed,
                             output_padding, groups);
    // The product, its factors, then the bias.
    torch::Tensor y = times_factors(at::convolution(xq.t, wq.t, torch::Tensor(), stride, padding, dilation,
                                                    transposed, output_padding, groups),
                                    xq.factor, wq.factor);
    if (b.numel() == 0) return y;
    std::vector<std::int64_t> bias_shape(static_cast<std::size_t>(y.dim()), 1);
    bias_shape[1] = -1;
    return y.add_(b.reshape(bias_shape));
  }

  template <class Ctx>
  static variable_list backward(Ctx* ctx, variable_list grads) {
    const auto [st, call, xq, wq] = restore_operands(ctx, TensorKind::a, TensorKind::w);
    const ConvParams c{ctx->saved_data["stride"].toIntVector(), ctx->saved_data["padding"].toIntVector(),
                       ctx->saved_data["dilation"].toIntVector(), ctx->saved_data["output_padding"].toIntVector(),
                       ctx->saved_data["transposed"].toBool(), ctx->saved_data["groups"].toInt()};
    torch::Tensor g = std::move(grads[0]);
    const auto conv_backward = [&](const torch::Tensor& gq, std::array<bool, 3> want) {
      const std::vector<std::int64_t> bias_sizes{gq.size(1)};
      return at::convolution_backward(gq, xq.t, wq.t, want[2] ? at::OptionalIntArrayRef(bias_sizes) : std::nullopt,
                                      c.stride, c.padding, c.dilation, c.transposed, c.output_padding, c.groups,
                                      want);
    };
    torch::Tensor db;  // libtorch's reduction of the float32 g, before g may be quantized in place
    if (ctx->needs_input_grad(2)) db = std::get<2>(conv_backward(g, {false, false, true}));
    const auto [g_for_dx, g_for_dw] = st->quantize_grad(std::move(g), channels(xq.t.dim()),
                                                        batch_positions(xq.t.dim()), call, backward_grad_refs(), {});
    torch::Tensor dx, dw;
    if (g_for_dx.t.is_same(g_for_dw.t)) {
      auto r = conv_backward(g_for_dx.t, {ctx->needs_input_grad(0), ctx->needs_input_grad(1), false});
      dx = std::get<0>(r);
      dw = std::get<1>(r);
    } else {
      if (ctx->needs_input_grad(0)) dx = std::get<0>(conv_backward(g_for_dx.t, {true, false, false}));
      if (ctx->needs_input_grad(1)) dw = std::get<1>(conv_backward(g_for_dw.t, {false, true, false}));
    }
    if (dx.defined()) dx = times_factors(std::move(dx), g_for_dx.factor, wq.factor);
    if (dw.defined()) dw = times_factors(std::move(dw), g_for_dw.factor, xq.factor);
    if (dw.defined()) dw = st->quantize_along(TensorKind::gw, std::move(dw), weight_views(wq.t, c).first, call);
    return {dx, dw, db, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(),
            torch::Tensor(), torch::Tensor()};
  }
};

class MatmulFn : public torch::autograd::Function<MatmulFn> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& a, const torch::Tensor& b,
                               LayerStatePtr st) {
    return run(ctx, a, b, std::move(st));
  }
  template <class Ctx>
  static torch::Tensor run(Ctx* ctx, const torch::Tensor& a, const torch::Tensor& b, LayerStatePtr st) {
    const auto [aq, bq] =
        quantize_operands(ctx, st,
                          {a, TensorKind::a, 0, last_dim(), second_last(a.dim()), BackwardProduct::grad_w, true},
                          {b, TensorKind::a, 1, second_last(b.dim()), last_dim(), BackwardProduct::grad_x, true},
                          st->ctx->layer_products());
    return operand_product(*st, aq, aq.t, bq, bq.t);
  }

  template <class Ctx>
  static variable_list backward(Ctx* ctx, variable_list grads) {
    const bool layer_products = state_of(ctx)->ctx->layer_products();
    const auto [st, call, aq, bq] = restore_operands(ctx, TensorKind::a, TensorKind::a, layer_products);
    const std::int64_t g_dims = grads[0].dim();
    const auto [g_for_da, g_for_db] = st->quantize_grad(std::move(grads[0]), last_dim(), second_last(g_dims), call,
                                                        backward_grad_refs(),
                                                        {.hadamard = true, .dx_partner = TensorKind::a,
                                                         .for_products = layer_products, .scales_apart = true});
    torch::Tensor da, db;
    // Each product with its factors before any broadcast batch is summed.
    if (ctx->needs_input_grad(0))
      da = at::sum_to(operand_product(*st, g_for_da, g_for_da.t, bq, bq.t.transpose(-2, -1)), aq.t.sizes());
    if (ctx->needs_input_grad(1))
      db = at::sum_to(operand_product(*st, aq, aq.t.transpose(-2, -1), g_for_db, g_for_db.t), bq.t.sizes());
    return {da, db, torch::Tensor()};
  }
};

// The probe of backward_grad_refs(): its backward sees the gradient as the ops' do.
class RefProbeFn : public torch::autograd::Function<RefProbeFn> {
 public:
  static torch::Tensor forward(AutogradContext*, const torch::Tensor& x) { return x.clone(); }
  static variable_list backward(AutogradContext*, variable_list grads) {
    torch::Tensor g = std::move(grads[0]);  // as the ops take it
    probe_refs = g.storage().use_count() == 1 ? g.use_count() : 0;
    return {g};
  }
  static inline std::int64_t probe_refs = 0;
};

// A convolution's per-axis parameter: two values, or one for both axes.
std::vector<std::int64_t> pair_of(const std::vector<std::int64_t>& v, const char* what, const std::string& layer) {
  if (v.size() == 1) return {v[0], v[0]};
  if (v.size() != 2)
    throw Error("quant_conv2d '" + layer + "': " + what + " takes one or two values, got " + std::to_string(v.size()));
  return v;
}

void check_cpu_float(const torch::Tensor& t, const char* op, const char* what) {
  if (!t.defined()) return;
  if (!t.device().is_cpu() || t.scalar_type() != torch::kFloat32)
    throw Error(std::string(op) + ": " + what + " must be a float32 CPU tensor");
}

}  // namespace

std::int64_t backward_grad_refs() {
  static const std::int64_t refs = [] {
    // (x * 2) hands the probe a fresh gradient that nothing else holds. 0 (never in place)
    // if the probe saw anything else.
    try {
      c10::InferenceMode off(false);
      torch::AutoGradMode on(true);
      const torch::Tensor x = torch::ones({4}, torch::requires_grad());
      (RefProbeFn::apply(x) * 2).sum().backward();
      return RefProbeFn::probe_refs;
    } catch (const std::exception&) {
      return std::int64_t{0};
    }
  }();
  return refs;
}

namespace {

// A product's layer state: given (None from Python is no layer, refused by name).
void check_layer(const LayerStatePtr& st, const char* op) {
  if (!st) throw Error(std::string(op) + ": no layer state given (make one with fp8lab.torch.layer)");
}

// A bias fits `outputs` output features (or channels): none, or a vector of that many.
void check_bias(const torch::Tensor& b, std::int64_t outputs, const std::string& where) {
  if (b.defined() && (b.dim() != 1 || b.size(0) != outputs))
    throw Error(where + "a bias of shape " + c10::str(b.sizes()) + " for " + std::to_string(outputs) + " outputs");
}

// The positions a convolution gives along each spatial axis, each at least 1, as torch
// computes them (F.conv*d and F.conv_transpose*d); an input smaller than the (dilated) kernel,
// or an output padding torch refuses, is an error naming the axis.
void check_conv_geometry(const torch::Tensor& x, const torch::Tensor& w, const std::vector<std::int64_t>& stride,
                         const std::vector<std::int64_t>& padding, const std::vector<std::int64_t>& dilation,
                         const std::vector<std::int64_t>& output_padding, bool transposed, const std::string& where) {
  for (std::size_t i = 0; i < stride.size(); ++i) {
    const std::int64_t in = x.size(static_cast<std::int64_t>(i) + 2), k = w.size(static_cast<std::int64_t>(i) + 2);
    if (stride[i] < 1 || dilation[i] < 1 || padding[i] < 0 || dilation[i] > (std::int64_t{1} << 30) ||
        stride[i] > (std::int64_t{1} << 30) || padding[i] > (std::int64_t{1} << 30))
      throw Error(where + "stride and dilation must be in 1..2^30, padding in 0..2^30 (axis " + std::to_string(i) + ")");
    const std::int64_t span = dilation[i] * (k - 1) + 1;  // the dilated kernel
    const std::int64_t out = transposed ? (in - 1) * stride[i] - 2 * padding[i] + span + output_padding[i]
                                        : (in + 2 * padding[i] - span) / stride[i] + 1;
    if (transposed && (output_padding[i] < 0 || output_padding[i] >= std::max(stride[i], dilation[i])))
      throw Error(where + "output_padding " + std::to_string(output_padding[i]) + " on axis " + std::to_string(i) +
                  " must be below the stride or the dilation");
    if ((!transposed && in + 2 * padding[i] < span) || out < 1)
      throw Error(where + "the input's " + std::to_string(in) + " positions on axis " + std::to_string(i) +
                  " (padding " + std::to_string(padding[i]) + ") give no output for a kernel spanning " +
                  std::to_string(span));
  }
}

}  // namespace

namespace {

// ---- the checked arguments of each product: the same for both ways of running it --------

// Autograd functions take no undefined tensors: an empty one stands for "no bias".
torch::Tensor bias_or_empty(const torch::Tensor& b) { return b.defined() ? b : torch::empty({0}); }

void check_linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b, const LayerStatePtr& st) {
  check_layer(st, "quant_linear");
  check_cpu_float(x, "quant_linear", "input");
  check_cpu_float(w, "quant_linear", "weight");
  if (w.dim() != 2 || x.dim() < 1 || x.size(-1) != w.size(1))
    throw Error("quant_linear '" + st->name + "': input's last dimension " +
                std::to_string(x.dim() ? x.size(-1) : 0) + " does not match weight " +
                std::to_string(w.size(0)) + "x" + std::to_string(w.size(1)));
  check_bias(b, w.size(0), "quant_linear '" + st->name + "': ");
}

// A convolution's geometry as its op takes it: one value per spatial axis.
struct ConvArgs {
  std::vector<std::int64_t> stride, padding, dilation, output_padding;
};

ConvArgs check_conv2d(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                      std::vector<std::int64_t> stride, std::vector<std::int64_t> padding,
                      std::vector<std::int64_t> dilation, std::int64_t groups, const LayerStatePtr& st) {
  check_layer(st, "quant_conv2d");
  check_cpu_float(x, "quant_conv2d", "input");
  check_cpu_float(w, "quant_conv2d", "weight");
  if (x.dim() != 4 || w.dim() != 4 || x.size(1) != w.size(1) * groups)
    throw Error("quant_conv2d '" + st->name + "': expected NCHW input with " +
                std::to_string(w.size(1) * groups) + " channels");
  if (groups < 1 || w.size(0) % groups != 0)
    throw Error("quant_conv2d '" + st->name + "': groups " + std::to_string(groups) + " does not divide the " +
                std::to_string(w.size(0)) + " output channels");
  const std::string where = "quant_conv2d '" + st->name + "': ";
  check_bias(b, w.size(0), where);
  ConvArgs a{pair_of(stride, "stride", st->name), pair_of(padding, "padding", st->name),
             pair_of(dilation, "dilation", st->name), {0, 0}};
  check_conv_geometry(x, w, a.stride, a.padding, a.dilation, a.output_padding, false, where);
  return a;
}

ConvArgs check_conv(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                    std::vector<std::int64_t> stride, std::vector<std::int64_t> padding,
                    std::vector<std::int64_t> dilation, bool transposed, std::vector<std::int64_t> output_padding,
                    std::int64_t groups, const LayerStatePtr& st) {
  check_layer(st, "quant_conv");
  check_cpu_float(x, "quant_conv", "input");
  check_cpu_float(w, "quant_conv", "weight");
  const std::string where = "quant_conv '" + st->name + "': ";
  if (x.dim() < 3 || x.dim() > 5 || w.dim() != x.dim())
    throw Error(where + "expected an input and a weight of 3 to 5 dimensions (batch, channels, 1 to 3 positions), got " +
                std::to_string(x.dim()) + " and " + std::to_string(w.dim()));
  if (st->ctx->layer_products())
    throw Error(where + "N-d and transposed convolutions run float32 products: compute and accumulate other than "
                "fp32 apply to linear layers, 2-d convolutions and matmuls");
  if (groups < 1 || w.size(0) % groups != 0)
    throw Error(where + "groups " + std::to_string(groups) + " does not divide the weight's " +
                std::to_string(w.size(0)) + " channels");
  const std::int64_t in = transposed ? w.size(0) : w.size(1) * groups;
  if (x.size(1) != in)
    throw Error(where + "the input has " + std::to_string(x.size(1)) + " channels, the weight takes " +
                std::to_string(in));
  const std::size_t D = static_cast<std::size_t>(x.dim() - 2);
  const auto per_axis = [&](std::vector<std::int64_t> v, const char* what) {
    if (v.size() == 1) v.assign(D, v[0]);
    if (v.size() != D)
      throw Error(where + what + " takes one value or " + std::to_string(D) + ", got " + std::to_string(v.size()));
    return v;
  };
  ConvArgs a{per_axis(std::move(stride), "stride"), per_axis(std::move(padding), "padding"),
             per_axis(std::move(dilation), "dilation"), per_axis(std::move(output_padding), "output_padding")};
  check_bias(b, transposed ? w.size(1) * groups : w.size(0), where);
  check_conv_geometry(x, w, a.stride, a.padding, a.dilation, a.output_padding, transposed, where);
  return a;
}

void check_matmul(const torch::Tensor& a, const torch::Tensor& b, const LayerStatePtr& st) {
  check_layer(st, "quant_matmul");
  check_cpu_float(a, "quant_matmul", "first operand");
  check_cpu_float(b, "quant_matmul", "second operand");
  bool fits = a.dim() >= 2 && b.dim() >= 2 && a.size(-1) == b.size(-2);
  for (std::int64_t i = 3; fits && i <= std::min(a.dim(), b.dim()); ++i)  // batch axes broadcast
    fits = a.size(-i) == b.size(-i) || a.size(-i) == 1 || b.size(-i) == 1;
  if (!fits)
    throw Error("quant_matmul '" + st->name + "': shapes " + c10::str(a.sizes()) + " and " + c10::str(b.sizes()) +
                " do not multiply");
}

// ---- split products: forward and backward as two calls, joined by a handle --------------

// What one split forward keeps for its backward. The handle tensor owns it: it is freed with
// the handle (by whoever held it: torch.compile's saved tensors), and a backward finds it by
// the id the handle holds.
struct SplitState {
  std::int64_t id = 0;
  std::size_t inputs = 0;  // the forward's tensor inputs: the gradients backward returns
  PlainContext ctx;
  variable_list (*backward)(PlainContext*, variable_list) = nullptr;
};

class SplitRegistry {
 public:
  static SplitRegistry& get() {
    static SplitRegistry* r = new SplitRegistry;  // never destroyed: handles may outlive static destruction
    return *r;
  }
  void add(SplitState* s) {  // gives s its id
    std::lock_guard<std::mutex> lock(m_);
    s->id = ++next_;
    live_[s->id] = s;
  }
  void remove(std::int64_t id) {
    std::lock_guard<std::mutex> lock(m_);
    live_.erase(id);
  }
  SplitState* find(std::int64_t id) {
    std::lock_guard<std::mutex> lock(m_);
    const auto it = live_.find(id);
    return it == live_.end() ? nullptr : it->second;
  }

 private:
  std::mutex m_;
  std::int64_t next_ = 0;
  std::unordered_map<std::int64_t, SplitState*> live_;
};

template <class Fn, class... Args>
SplitForward split_forward(std::size_t inputs, Args&&... args) {
  auto state = std::make_unique<SplitState>();
  state->inputs = inputs;
  state->backward = [](PlainContext* c, variable_list g) { return Fn::backward(c, std::move(g)); };
  torch::Tensor y = Fn::run(&state->ctx, std::forward<Args>(args)...);
  SplitState* s = state.release();
  SplitRegistry::get().add(s);
  torch::Tensor handle = torch::from_blob(
      &s->id, {}, [s](void*) { SplitRegistry::get().remove(s->id); delete s; }, torch::kInt64);
  return {std::move(y), std::move(handle)};
}

}  // namespace

torch::Tensor quant_linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                           const LayerStatePtr& st) {
  check_linear(x, w, b, st);
  return LinearFn::apply(x, w, bias_or_empty(b), st);
}

torch::Tensor quant_conv2d(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                           std::vector<std::int64_t> stride, std::vector<std::int64_t> padding,
                           std::vector<std::int64_t> dilation, std::int64_t groups,
                           const LayerStatePtr& st) {
  ConvArgs a = check_conv2d(x, w, b, std::move(stride), std::move(padding), std::move(dilation), groups, st);
  return Conv2dFn::apply(x, w, bias_or_empty(b), a.stride, a.padding, a.dilation, groups, st);
}

torch::Tensor quant_conv(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                         std::vector<std::int64_t> stride, std::vector<std::int64_t> padding,
                         std::vector<std::int64_t> dilation, bool transposed,
                         std::vector<std::int64_t> output_padding, std::int64_t groups, const LayerStatePtr& st) {
  ConvArgs a = check_conv(x, w, b, std::move(stride), std::move(padding), std::move(dilation), transposed,
                          std::move(output_padding), groups, st);
  return ConvNdFn::apply(x, w, bias_or_empty(b), a.stride, a.padding, a.dilation, a.output_padding, transposed,
                         groups, st);
}

torch::Tensor quant_matmul(const torch::Tensor& a, const torch::Tensor& b, const LayerStatePtr& st) {
  check_matmul(a, b, st);
  return MatmulFn::apply(a, b, st);
}

SplitForward quant_linear_forward(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                                  const LayerStatePtr& st) {
  check_linear(x, w, b, st);
  return split_forward<LinearFn>(3, x, w, bias_or_empty(b), st);
}

SplitForward quant_conv2d_forward(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                                  std::vector<std::int64_t> stride, std::vector<std::int64_t> padding,
                                  std::vector<std::int64_t> dilation, std::int64_t groups,
                                  const LayerStatePtr& st) {
  ConvArgs a = check_conv2d(x, w, b, std::move(stride), std::move(padding), std::move(dilation), groups, st);
  return split_forward<Conv2dFn>(3, x, w, bias_or_empty(b), a.stride, a.padding, a.dilation, groups, st);
}

SplitForward quant_conv_forward(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                                std::vector<std::int64_t> stride, std::vector<std::int64_t> padding,
                                std::vector<std::int64_t> dilation, bool transposed,
                                std::vector<std::int64_t> output_padding, std::int64_t groups,
                                const LayerStatePtr& st) {
  ConvArgs a = check_conv(x, w, b, std::move(stride), std::move(padding), std::move(dilation), transposed,
                          std::move(output_padding), groups, st);
  return split_forward<ConvNdFn>(3, x, w, bias_or_empty(b), a.stride, a.padding, a.dilation, a.output_padding,
                                 transposed, groups, st);
}

SplitForward quant_matmul_forward(const torch::Tensor& a, const torch::Tensor& b, const LayerStatePtr& st) {
  check_matmul(a, b, st);
  return split_forward<MatmulFn>(2, a, b, st);
}

std::vector<torch::Tensor> quant_backward(const torch::Tensor& g, const torch::Tensor& handle,
                                          const std::vector<bool>& needs) {
  if (!handle.defined() || handle.dim() != 0 || handle.scalar_type() != torch::kInt64 || !handle.device().is_cpu())
    throw Error("quant_backward: the handle must be the 0-d int64 tensor a split forward returned");
  SplitState* s = SplitRegistry::get().find(handle.item<std::int64_t>());
  if (s == nullptr)
    throw Error("quant_backward: no saved forward for this handle (it was freed, or not made by a split forward)");
  if (needs.size() != s->inputs)
    throw Error("quant_backward: " + std::to_string(needs.size()) + " gradient flags for a product of " +
                std::to_string(s->inputs) + " tensor inputs");
  s->ctx.needs = needs;
  variable_list grads = s->backward(&s->ctx, {g});
  grads.resize(s->inputs);
  return grads;
}

}  // namespace fp8lab::nn
