// Chunked accumulation for convolutions (docs/spec.md §7.3): each of a convolution's three
// products written as a batch of matrix products over im2col columns, one per group, whose
// reductions then accumulate as the chunked matmul's do.
#include "compute_conv_chunked.hpp"

#include <ATen/ops/col2im.h>
#include <ATen/ops/im2col.h>

#include "compute_detail.hpp"

namespace fp8lab::nn::detail {

namespace {

// The im2col shape of one convolution: N images, G groups, K = (C/G)*kh*kw rows per group
// (ordered channel, kernel row, kernel column) and L output positions per image.
struct Lowering {
  std::int64_t n, groups, k, l, out_per_group;
  std::array<std::int64_t, 2> kernel, out;
};

Lowering lowering(at::IntArrayRef x, at::IntArrayRef w, const ConvGeometry& g) {
  Lowering s{};
  s.n = x[0];
  s.groups = g.groups;
  s.k = w[1] * w[2] * w[3];
  s.out_per_group = w[0] / g.groups;
  s.kernel = {w[2], w[3]};
  for (int d = 0; d < 2; ++d) s.out[d] = out_size(x[2 + d], w[2 + d], g.stride[d], g.padding[d], g.dilation[d]);
  s.l = s.out[0] * s.out[1];
  return s;
}

// x's columns as [G, K, N*L]: for group g, row (c, ky, kx) and column (n, oy, ox), the input
// value that kernel tap meets at that output position (zero in the padding).
torch::Tensor columns(const torch::Tensor& x, const Lowering& s, const ConvGeometry& g) {
  const torch::Tensor cols = at::im2col(widened(x).contiguous(), vec(s.kernel), vec(g.dilation), vec(g.padding),
                                        vec(g.stride));  // [N, G*K, L]
  return cols.view({s.n, s.groups, s.k, s.l}).permute({1, 2, 0, 3}).reshape({s.groups, s.k, s.n * s.l});
}

// An output-shaped tensor [N, O, Ho, Wo] as [G, O/G, N*L], columns ordered (n, oy, ox).
torch::Tensor output_matrix(const torch::Tensor& y, const Lowering& s) {
  return widened(y)
      .contiguous()
      .view({s.n, s.groups, s.out_per_group, s.l})
      .permute({1, 2, 0, 3})
      .reshape({s.groups, s.out_per_group, s.n * s.l});
}

torch::Tensor weight_matrix(const torch::Tensor& w, const Lowering& s) {
  return widened(w).contiguous().view({s.groups, s.out_per_group, s.k});
}

}  // namespace

torch::Tensor chunked_conv2d(const torch::Tensor& x, const torch::Tensor& w, const ConvGeometry& g, Compute c,
                             Compute* taken, const Accumulation& acc) {
  const Lowering s = lowering(x.sizes(), w.sizes(), g);
  // [G, O/G, K] x [G, K, N*L]: the sums over (c, ky, kx) chunked.
  const torch::Tensor y = matmul(weight_matrix(w, s), columns(x, s, g), c, taken, acc);
  return cl(
      y.view({w.size(0), s.n, s.l}).permute({1, 0, 2}).reshape({s.n, w.size(0), s.out[0], s.out[1]}));
}

ConvGrads chunked_conv2d_backward(const torch::Tensor& gy_dx, const torch::Tensor& gy_dw, const torch::Tensor& x,
                                  const torch::Tensor& w, const ConvGeometry& g, Compute c, bool want_dx,
                                  bool want_dw, const Accumulation& acc) {
  const Lowering s = lowering(x.sizes(), w.sizes(), g);
  ConvGrads out;
  if (want_dx) {
    // [G, K, O/G] x [G, O/G, N*L]: each column's sums over the output channels chunked, then
    // col2im adds the taps that read each input position, in (ky, kx) order.
    const torch::Tensor cols =
        matmul(weight_matrix(w, s).transpose(1, 2), output_matrix(gy_dx, s), c, &out.dx_path, acc);
    const torch::Tensor cols_nchw =
        cols.view({s.groups, s.k, s.n, s.l}).permute({2, 0, 1, 3}).reshape({s.n, s.groups * s.k, s.l});
    out.dx = cl(at::col2im(cols_nchw, {x.size(2), x.size(3)}, vec(s.kernel), vec(g.dilation),
                                      vec(g.padding), vec(g.stride)));
  }
  if (want_dw) {
    // [G, O/G, N*L] x [G, N*L, K]: the sums over (n, oy, ox) chunked.
    const torch::Tensor dw = matmul(output_matrix(gy_dw, s), columns(x, s, g).transpose(1, 2), c, &out.dw_path, acc);
    out.dw = dw.reshape(w.sizes());
  }
  return out;
}

}  // namespace fp8lab::nn::detail
