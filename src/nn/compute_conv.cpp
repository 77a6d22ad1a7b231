// Convolutions of the compute layer (docs/spec.md §7): forward, backward data and backward
// weights on bfloat16 operands with float32 accumulation and output, through oneDNN.
#include <array>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include <oneapi/dnnl/dnnl.hpp>

#include "compute_conv_chunked.hpp"
#include "dnnl_bridge.hpp"
#include "fp8lab/core/format.hpp"
#include "fp8lab/nn/compute.hpp"
#include "fp8lab/nn/tensor_quant.hpp"

namespace fp8lab::nn {

namespace {

using detail::engine;
using detail::out_size;
using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;
using dims = dnnl::memory::dims;

enum class Pass { forward, input_grad, weight_grad };

// A convolution's shapes and geometry: what a primitive is created for.
struct ConvKey {
  Pass pass;
  std::int64_t n, c, h, w, o, kh, kw, oh, ow;
  ConvGeometry g;
  auto tie() const {
    return std::tie(pass, n, c, h, w, o, kh, kw, oh, ow, g.stride, g.padding, g.dilation, g.groups);
  }
  bool operator<(const ConvKey& k) const { return tie() < k.tie(); }
};

// One argument of a primitive: its layout as torch holds it (plain NCHW / OIHW) and as the
// primitive wants it, with the reorder between them where they differ.
struct Arg {
  int id;
  dnnl::memory::desc user, inner;
  dnnl::reorder reorder;  // user -> inner for inputs, inner -> user for the output
  bool reordered() const { return !(user == inner); }
};

struct ConvPrim {
  dnnl::primitive prim;
  std::array<Arg, 3> args;  // two inputs, then the output
};

// Activations (inputs, outputs and their gradients) are channels-last, the layout of
// oneDNN's matrix-engine convolutions: the tensors the products return are channels-last,
// so the next layer's operands need no reorder.
dnnl::memory::desc activation(const ConvKey& k, bool output, dt type) {
  return output ? dnnl::memory::desc({k.n, k.o, k.oh, k.ow}, type, tag::nhwc)
                : dnnl::memory::desc({k.n, k.c, k.h, k.w}, type, tag::nhwc);
}

// Weights [O, C/g, kh, kw] as torch lays them; oneDNN's grouped form [g, O/g, C/g, kh, kw]
// is the same bytes.
dnnl::memory::desc weights(const ConvKey& k, dt type) {
  const std::int64_t g = k.g.groups;
  if (g == 1) return dnnl::memory::desc({k.o, k.c, k.kh, k.kw}, type, tag::oihw);
  return dnnl::memory::desc({g, k.o / g, k.c / g, k.kh, k.kw}, type, tag::goihw);
}

dnnl::memory::desc any_like(const dnnl::memory::desc& d) {
  return dnnl::memory::desc(d.dims(), d.data_type(), tag::any);
}

Arg make_arg(int id, const dnnl::memory::desc& user, const dnnl::memory::desc& inner, bool output) {
  Arg a{id, user, inner, {}};
  if (a.reordered())
    a.reorder = output ? dnnl::reorder(dnnl::reorder::primitive_desc(engine(), inner, engine(), user))
                       : dnnl::reorder(dnnl::reorder::primitive_desc(engine(), user, engine(), inner));
  return a;
}

// The primitive with activations as given (channels-last) and weights in the layout it
// prefers; `any_layout` leaves the activations' layouts to oneDNN too (for the rare
// geometry without a channels-last implementation).
ConvPrim create(const ConvKey& k, bool any_layout) {
  const dims strides{k.g.stride[0], k.g.stride[1]};
  const dims dilates{k.g.dilation[0] - 1, k.g.dilation[1] - 1};  // oneDNN counts the gaps
  const dims pad_l{k.g.padding[0], k.g.padding[1]};
  // The right padding that makes oneDNN's output size torch's (which rounds down).
  const dims pad_r{(k.oh - 1) * k.g.stride[0] + (k.kh - 1) * k.g.dilation[0] + 1 - k.h - k.g.padding[0],
                   (k.ow - 1) * k.g.stride[1] + (k.kw - 1) * k.g.dilation[1] + 1 - k.w - k.g.padding[1]};
  const auto x16 = activation(k, false, dt::bf16), y16 = activation(k, true, dt::bf16);
  const auto x32 = activation(k, false, dt::f32), y32 = activation(k, true, dt::f32);
  const auto w16 = weights(k, dt::bf16), w32 = weights(k, dt::f32);
  const auto act = [&](const dnnl::memory::desc& d) { return any_layout ? any_like(d) : d; };
  const auto algo = dnnl::algorithm::convolution_direct;
  const dnnl::convolution_forward::primitive_desc fwd(
      dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, algo, act(x16), any_like(w16), act(y32),
                                      strides, dilates, pad_l, pad_r),
      engine());
  switch (k.pass) {
    case Pass::forward:
      return {dnnl::convolution_forward(fwd),
              {make_arg(DNNL_ARG_SRC, x16, fwd.src_desc(), false),
               make_arg(DNNL_ARG_WEIGHTS, w16, fwd.weights_desc(), false),
               make_arg(DNNL_ARG_DST, y32, fwd.dst_desc(), true)}};
    case Pass::input_grad: {
      const dnnl::convolution_backward_data::primitive_desc pd(
          dnnl::convolution_backward_data::desc(algo, act(x32), any_like(w16), act(y16), strides, dilates, pad_l,
                                                pad_r),
          engine(), fwd);
      return {dnnl::convolution_backward_data(pd),
              {make_arg(DNNL_ARG_DIFF_DST, y16, pd.diff_dst_desc(), false),
               make_arg(DNNL_ARG_WEIGHTS, w16, pd.weights_desc(), false),
               make_arg(DNNL_ARG_DIFF_SRC, x32, pd.diff_src_desc(), true)}};
    }
    case Pass::weight_grad: {
      const dnnl::convolution_backward_weights::primitive_desc pd(
          dnnl::convolution_backward_weights::desc(algo, act(x16), any_like(w32), act(y16), strides, dilates,
                                                   pad_l, pad_r),
          engine(), fwd);
      return {dnnl::convolution_backward_weights(pd),
              {make_arg(DNNL_ARG_DIFF_DST, y16, pd.diff_dst_desc(), false),
               make_arg(DNNL_ARG_SRC, x16, pd.src_desc(), false),
               make_arg(DNNL_ARG_DIFF_WEIGHTS, w32, pd.diff_weights_desc(), true)}};
    }
  }
  throw Error("convolution: unknown pass");
}

ConvPrim create(const ConvKey& k) {
  try {
    return create(k, false);
  } catch (const dnnl::error&) {  // no implementation for channels-last activations
    return create(k, true);
  }
}

const ConvPrim& primitive(const ConvKey& k) {
  static std::mutex m;
  static std::map<ConvKey, ConvPrim> cache;
  std::lock_guard<std::mutex> lk(m);
  auto it = cache.find(k);
  if (it == cache.end()) it = cache.emplace(k, create(k)).first;
  return it->second;
}

// A buffer for a primitive's own layout of an argument.
dnnl::memory scratch(const dnnl::memory::desc& d, std::vector<torch::Tensor>& keep) {
  keep.push_back(torch::empty({static_cast<std::int64_t>(d.get_size())}, torch::kUInt8));
  return dnnl::memory(d, engine(), keep.back().data_ptr());
}

// Runs the primitive on two bfloat16 inputs, writing the float32 output `out` (as the
// user descriptions lay them), through the reorders the primitive's layouts need.
void run(const ConvPrim& p, const torch::Tensor& in0, const torch::Tensor& in1, torch::Tensor& out) {
  dnnl::stream s(engine());
  std::vector<torch::Tensor> keep;
  std::unordered_map<int, dnnl::memory> args;
  const torch::Tensor* inputs[2] = {&in0, &in1};
  for (int i = 0; i < 2; ++i) {
    const Arg& a = p.args[static_cast<std::size_t>(i)];
    dnnl::memory user(a.user, engine(), inputs[i]->data_ptr());
    if (!a.reordered()) {
      args.emplace(a.id, user);
      continue;
    }
    dnnl::memory inner = scratch(a.inner, keep);
    a.reorder.execute(s, user, inner);
    args.emplace(a.id, inner);
  }
  const Arg& o = p.args[2];
  dnnl::memory user(o.user, engine(), out.data_ptr());
  dnnl::memory inner = o.reordered() ? scratch(o.inner, keep) : user;
  args.emplace(o.id, inner);
  p.prim.execute(s, args);
  if (o.reordered()) o.reorder.execute(s, inner, user);
  s.wait();
}

ConvKey key_of(Pass pass, at::IntArrayRef x, at::IntArrayRef w, const ConvGeometry& g) {
  TORCH_CHECK(x.size() == 4 && w.size() == 4 && g.groups >= 1 && x[1] == w[1] * g.groups && w[0] % g.groups == 0,
              "convolution: NCHW input and [O, C/groups, kh, kw] weights expected");
  return {pass, x[0], x[1], x[2], x[3], w[0], w[2], w[3],
          out_size(x[2], w[2], g.stride[0], g.padding[0], g.dilation[0]),
          out_size(x[3], w[3], g.stride[1], g.padding[1], g.dilation[1]), g};
}

// The bfloat16 forms of one call's operands, each converted once however many of the
// call's products read it. An operand given as bfloat16 is its own form.
class Forms {
 public:
  const std::optional<torch::Tensor>& of(const torch::Tensor& t, torch::MemoryFormat f) {
    for (const Entry& e : seen_)
      if (e.impl == t.unsafeGetTensorImpl() && e.format == f) return e.form;
    const torch::Tensor laid = t.contiguous(f);
    seen_.push_back({t.unsafeGetTensorImpl(), f,
                     laid.scalar_type() == torch::kBFloat16 ? std::optional<torch::Tensor>(laid) : exact_bf16(laid)});
    return seen_.back().form;
  }

 private:
  struct Entry {
    const c10::TensorImpl* impl;
    torch::MemoryFormat format;
    std::optional<torch::Tensor> form;
  };
  std::deque<Entry> seen_;  // references stay valid as it grows
};

// The product on bfloat16 forms of `a` (an activation or its gradient) and `b` (the
// weights, or for weight gradients the input), nullopt where either holds a value that is
// not a bfloat16 value, into a float32 tensor of `out_sizes`: channels-last for
// activations' gradients and outputs, contiguous for weight gradients.
std::optional<torch::Tensor> convolve(const ConvKey& k, const torch::Tensor& a, const torch::Tensor& b,
                                      at::IntArrayRef out_sizes, Forms& forms) {
  detail::require_bf16_products("a convolution");
  TORCH_CHECK(detail::float_or_bf16(a) && detail::float_or_bf16(b),
              "convolution: float32 or bfloat16 operands expected");
  const bool weight_grad = k.pass == Pass::weight_grad;
  torch::Tensor out = torch::empty(
      out_sizes, a.options().dtype(torch::kFloat).memory_format(weight_grad ? torch::MemoryFormat::Contiguous
                                                                              : torch::MemoryFormat::ChannelsLast));
  if (out.numel() == 0) return out;
  if (a.numel() == 0 || b.numel() == 0) return out.zero_();
  const auto& a16 = forms.of(a, torch::MemoryFormat::ChannelsLast);
  if (!a16) return std::nullopt;
  const auto& b16 = forms.of(b, weight_grad ? torch::MemoryFormat::ChannelsLast : torch::MemoryFormat::Contiguous);
  if (!b16) return std::nullopt;
  run(primitive(k), *a16, *b16, out);
  return out;
}

}  // namespace

std::optional<torch::Tensor> conv2d_bf16(const torch::Tensor& x, const torch::Tensor& w, const ConvGeometry& g) {
  const ConvKey k = key_of(Pass::forward, x.sizes(), w.sizes(), g);
  Forms forms;
  return convolve(k, x, w, {k.n, k.o, k.oh, k.ow}, forms);
}

namespace {

void check_grad(const ConvKey& k, const torch::Tensor& gy) {
  TORCH_CHECK(gy.sizes() == at::IntArrayRef({k.n, k.o, k.oh, k.ow}), "convolution: gradient of the wrong shape");
}

std::optional<torch::Tensor> input_grad(const torch::Tensor& gy, const torch::Tensor& w, at::IntArrayRef x_sizes,
                                        const ConvGeometry& g, Forms& forms) {
  const ConvKey k = key_of(Pass::input_grad, x_sizes, w.sizes(), g);
  check_grad(k, gy);
  return convolve(k, gy, w, x_sizes, forms);
}

std::optional<torch::Tensor> weight_grad(const torch::Tensor& gy, const torch::Tensor& x, at::IntArrayRef w_sizes,
                                         const ConvGeometry& g, Forms& forms) {
  const ConvKey k = key_of(Pass::weight_grad, x.sizes(), w_sizes, g);
  check_grad(k, gy);
  return convolve(k, gy, x, w_sizes, forms);
}

// The float32 path's operands: float32 (a bfloat16 operand widened, exactly), and
// channels-last activations.
using detail::cl;
using detail::vec;
using detail::widened;

}  // namespace

std::optional<torch::Tensor> conv2d_input_grad_bf16(const torch::Tensor& gy, const torch::Tensor& w,
                                                    at::IntArrayRef x_sizes, const ConvGeometry& g) {
  Forms forms;
  return input_grad(gy, w, x_sizes, g, forms);
}

std::optional<torch::Tensor> conv2d_weight_grad_bf16(const torch::Tensor& gy, const torch::Tensor& x,
                                                     at::IntArrayRef w_sizes, const ConvGeometry& g) {
  Forms forms;
  return weight_grad(gy, x, w_sizes, g, forms);
}

torch::Tensor conv2d(const torch::Tensor& x, const torch::Tensor& w, const ConvGeometry& g, Compute c,
                     Compute* taken, const Accumulation& acc) {
  if (acc.chunked()) return detail::chunked_conv2d(x, w, g, c, taken, acc);
  return detail::choose_path(
      c, taken, "a convolution", [&] { return conv2d_bf16(x, w, g); },
      [&] { return torch::conv2d(cl(x), widened(w), {}, vec(g.stride), vec(g.padding), vec(g.dilation), g.groups); });
}

ConvGrads conv2d_backward(const torch::Tensor& gy_dx, const torch::Tensor& gy_dw, const torch::Tensor& x,
                          const torch::Tensor& w, const ConvGeometry& g, Compute c, bool want_dx, bool want_dw,
                          const Accumulation& acc) {
  if (acc.chunked()) return detail::chunked_conv2d_backward(gy_dx, gy_dw, x, w, g, c, want_dx, want_dw, acc);
  Forms forms;  // shared: gy_dx is often gy_dw, and each is converted once
  const auto fp32 = [&](const torch::Tensor& gy, bool dx) {
    return at::convolution_backward(cl(gy), cl(x), widened(w), c10::nullopt, vec(g.stride), vec(g.padding),
                                    vec(g.dilation), false, {0, 0}, g.groups, {dx, !dx, false});
  };
  ConvGrads out;
  if (want_dx)
    out.dx = detail::choose_path(
        c, &out.dx_path, "a convolution", [&] { return input_grad(gy_dx, w, x.sizes(), g, forms); },
        [&] { return std::get<0>(fp32(gy_dx, true)); });
  if (want_dw)
    out.dw = detail::choose_path(
        c, &out.dw_path, "a convolution", [&] { return weight_grad(gy_dw, x, w.sizes(), g, forms); },
        [&] { return std::get<1>(fp32(gy_dw, false)); });
  return out;
}

}  // namespace fp8lab::nn
