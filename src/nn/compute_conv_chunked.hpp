// Convolutions with a chunked accumulation (internal to src/nn; docs/spec.md §7.3): the
// three products lowered to im2col matrix products, each reduction chunked as matmul()'s.
#pragma once

#include <torch/torch.h>

#include "fp8lab/nn/compute.hpp"

namespace fp8lab::nn::detail {

// conv2d() with `acc` chunked: the sums over (channel, ky, kx) of each group.
torch::Tensor chunked_conv2d(const torch::Tensor& x, const torch::Tensor& w, const ConvGeometry& g, Compute c,
                             Compute* taken, const Accumulation& acc);

// conv2d_backward() with `acc` chunked: grad_x's sums over each group's output channels
// (the kernel taps that read an input position then added in float32 in (ky, kx) order),
// grad_w's over (image, output row, output column).
ConvGrads chunked_conv2d_backward(const torch::Tensor& gy_dx, const torch::Tensor& gy_dw, const torch::Tensor& x,
                                  const torch::Tensor& w, const ConvGeometry& g, Compute c, bool want_dx,
                                  bool want_dw, const Accumulation& acc);

}  // namespace fp8lab::nn::detail
