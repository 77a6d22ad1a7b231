// Quantized matmul and convolution as autograd functions (docs/spec.md §4, the paper's Figure 1):
//   forward   y = f(Q_a(x), Q_w(w))                      (float32 accumulation)
//   backward  gq = Q_gx(dL/dy)
//             dL/dx = f_x'(gq, Q_w(w))      dL/dw = Q_gw(f_w'(Q_a(x), gq))
// The bias gradient is the float32 sum of dL/dy. Attention matmuls quantize both operands
// with the activation quantizer. The tensors saved for backward are the 8-bit codes of
// Q_a(x) and Q_w(w) (16-bit for wider formats), decoded in backward: bit-identical to
// saving float32, a quarter of the memory.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <vector>

#include "fp8lab/nn/layer_state.hpp"

namespace fp8lab::nn {

// y = x w^T + b over the last dimension of x (b may be undefined).
torch::Tensor quant_linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                           const LayerStatePtr& st);
// 2-D convolution, NCHW, with groups (depthwise when groups == channels).
torch::Tensor quant_conv2d(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                           std::vector<std::int64_t> stride, std::vector<std::int64_t> padding,
                           std::vector<std::int64_t> dilation, std::int64_t groups,
                           const LayerStatePtr& st);
// A convolution of 1 to 3 spatial dimensions ([N, C, S...]), transposed or not, with
// groups: at::convolution's arguments, each per-axis one given once or per axis. Its
// products are float32 (a context whose compute or accumulation is not fp32 is refused).
torch::Tensor quant_conv(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                         std::vector<std::int64_t> stride, std::vector<std::int64_t> padding,
                         std::vector<std::int64_t> dilation, bool transposed,
                         std::vector<std::int64_t> output_padding, std::int64_t groups, const LayerStatePtr& st);
// torch::matmul(a, b) with both operands in the activation format (attention's Q K^T, A V).
torch::Tensor quant_matmul(const torch::Tensor& a, const torch::Tensor& b, const LayerStatePtr& st);

// The same products split in two calls, outside autograd's graph (torch.compile's custom
// ops, python/fp8lab/torch/_compiled.py): a forward returns the product and a handle, a 0-d
// int64 tensor that owns what backward needs (it is freed with the handle); quant_backward
// takes the output's gradient and the handle, and returns the gradients of the forward's
// tensor inputs (x, w, b or a, b), undefined where `needs` says no. Same checks, quantizers,
// streams, counts and bits as the functions above.
struct SplitForward {
  torch::Tensor y, handle;
};
SplitForward quant_linear_forward(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                                  const LayerStatePtr& st);
SplitForward quant_conv2d_forward(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                                  std::vector<std::int64_t> stride, std::vector<std::int64_t> padding,
                                  std::vector<std::int64_t> dilation, std::int64_t groups,
                                  const LayerStatePtr& st);
SplitForward quant_conv_forward(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                                std::vector<std::int64_t> stride, std::vector<std::int64_t> padding,
                                std::vector<std::int64_t> dilation, bool transposed,
                                std::vector<std::int64_t> output_padding, std::int64_t groups,
                                const LayerStatePtr& st);
SplitForward quant_matmul_forward(const torch::Tensor& a, const torch::Tensor& b, const LayerStatePtr& st);
std::vector<torch::Tensor> quant_backward(const torch::Tensor& g, const torch::Tensor& handle,
                                          const std::vector<bool>& needs);

}  // namespace fp8lab::nn
