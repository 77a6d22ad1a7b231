// Convolutions of the compute layer (docs/spec.md §7): forward, backward data and backward
// weights on bfloat16 operands with float32 accumulation and output, through oneDNN
// (the library of onednn/onednn_api.h).
#include <array>
#include <deque>
#include <string>
#include <vector>

#include "compute_conv_chunked.hpp"
#include "compute_detail.hpp"
#include "fp8lab/core/error.hpp"
#include "fp8lab/nn/compute.hpp"
#include "fp8lab/nn/tensor_quant.hpp"

namespace fp8lab::nn {

namespace {

using detail::out_size;

enum class Pass {
  forward = FP8LAB_CONV_FORWARD,
  input_grad = FP8LAB_CONV_INPUT_GRAD,
  weight_grad = FP8LAB_CONV_WEIGHT_GRAD
};

// A convolution's pass, shapes and geometry: what the library creates a primitive for.
struct ConvKey {
  Pass pass;
  std::int64_t n, c, h, w, o, kh, kw, oh, ow;
  ConvGeometry g;
};

fp8lab_conv_shape shape_of(const ConvKey& k) {
  fp8lab_conv_shape s{k.n, k.c, k.h, k.w, k.o, k.kh, k.kw, k.oh, k.ow, {}, {}, {}, k.g.groups};
  for (int d = 0; d < 2; ++d) {
    s.stride[d] = k.g.stride[d];
    s.padding[d] = k.g.padding[d];
    s.dilation[d] = k.g.dilation[d];
  }
  return s;
}

// Runs the pass on two bfloat16 inputs, writing the float32 output `out`.
void run(const ConvKey& k, const torch::Tensor& in0, const torch::Tensor& in1, torch::Tensor& out) {
  const fp8lab_conv_shape shape = shape_of(k);
  detail::check_onednn(
      detail::onednn().conv(static_cast<int>(k.pass), &shape, in0.data_ptr(), in1.data_ptr(), out.data_ptr<float>()));
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
  run(k, *a16, *b16, out);
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
  if (!acc.plain()) return detail::chunked_conv2d(x, w, g, c, taken, acc);
  return detail::choose_path(
      c, taken, "a convolution", [&] { return conv2d_bf16(x, w, g); },
      [&] { return torch::conv2d(cl(x), widened(w), {}, vec(g.stride), vec(g.padding), vec(g.dilation), g.groups); });
}

ConvGrads conv2d_backward(const torch::Tensor& gy_dx, const torch::Tensor& gy_dw, const torch::Tensor& x,
                          const torch::Tensor& w, const ConvGeometry& g, Compute c, bool want_dx, bool want_dw,
                          const Accumulation& acc) {
  if (!acc.plain()) return detail::chunked_conv2d_backward(gy_dx, gy_dw, x, w, g, c, want_dx, want_dw, acc);
  Forms forms;  // shared: gy_dx is often gy_dw, and each is converted once
  const auto fp32 = [&](const torch::Tensor& gy, bool dx) {
    return at::convolution_backward(cl(gy), cl(x), widened(w), std::nullopt, vec(g.stride), vec(g.padding),
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
