// The compute layer of quantized products (docs/spec.md §7): which engine runs a layer's
// matrix products. Quantized operands whose values are all bfloat16 values run on bfloat16
// inputs with float32 accumulation and float32 output through oneDNN, on the CPU's matrix
// engine (AMX-BF16) or its AVX512-BF16 instructions; the product of two bfloat16 values is
// exact in float32, so the result is the float32 product's up to the order of summation.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <torch/torch.h>

#include "fp8lab/core/format.hpp"
#include "fp8lab/settings/compute_spec.hpp"

namespace fp8lab::nn {

// Whether this CPU runs bfloat16 products natively (AMX-BF16 or AVX512-BF16), as oneDNN
// sees it: ONEDNN_MAX_CPU_ISA set below AVX512_CORE_BF16 hides them.
bool bf16_products_available();

// Whether every finite value of `f` is a bfloat16 value: at most 7 mantissa bits and every
// value between bfloat16's smallest subnormal 2^-133 and its largest finite value. The
// operands of such formats always take the bf16 path under auto (where the CPU has it).
bool exact_in_bf16(const Format& f);

// a [M, K] times b [K, N] (float32) on bfloat16 inputs with float32 accumulation and
// output, or nullopt, with nothing computed, where an operand holds a value that is not a
// bfloat16 value (checked as the operands are converted). Operands may be transposed
// views (read as they lie). The oneDNN primitive of each shape and layout is created once
// per process. Throws Error if the CPU has no bfloat16 products.
std::optional<torch::Tensor> matmul_bf16(const torch::Tensor& a, const torch::Tensor& b);

// The same for batches of matrices: a [B, M, K] times b [B, K, N], each matrix row- or
// column-major.
std::optional<torch::Tensor> bmm_bf16(const torch::Tensor& a, const torch::Tensor& b);

// torch::matmul(a, b) on the path `c` asks for (above): 2-D matrices, and batches whose
// leading dimensions agree; broadcast batches and vectors run in float32 (bf16: an error).
// `taken`, when given, receives the path used (fp32 or bf16). With a chunked accumulation
// the sums over a's last dimension (b's second-last) accumulate as `acc` says, each
// chunk's product on the path `c` asks for. With a dot model (§7.4) every output is the
// model's dot product of float32 operands (any shapes torch::matmul takes, broadcast
// batches included); `c` does not apply and the path is fp32.
torch::Tensor matmul(const torch::Tensor& a, const torch::Tensor& b, Compute c, Compute* taken = nullptr,
                     const Accumulation& acc = {});

// An operand's float32 group scales along a product's reduction (docs/spec.md §6.8): `s`
// [..., rows, groups] holds one scale per row of the operand's matrix (a's M rows, b's N
// columns) and group of `group` consecutive reduction positions (the last group may be
// shorter). Undefined `s`: every scale is 1.
struct ReductionScales {
  torch::Tensor s;
  std::int64_t group = 0;
  bool defined() const { return s.defined(); }
};
// a [..., M, K] times b [..., K, N] with the scales on the output (§6.8): the reduction is cut
// into chunks of gcd(a's group, b's group) positions (a group of an undefined side: all of
// K), inside each of which every row of a and every column of b has one scale; each chunk's
// float32 partial sums are formed on the path `c` asks for (summed as `acc` says), then
// scaled and added in chunk order by kernels::scaled_chunk_sum. Leading dimensions
// broadcast; `taken` as matmul's (bf16 only where every chunk took it).
torch::Tensor matmul_scaled(const torch::Tensor& a, const ReductionScales& sa, const torch::Tensor& b,
                            const ReductionScales& sb, Compute c, Compute* taken = nullptr,
                            const Accumulation& acc = {});

// A 2-D convolution's geometry, as torch::conv2d takes it.
struct ConvGeometry {
  std::array<std::int64_t, 2> stride{1, 1}, padding{0, 0}, dilation{1, 1};
  std::int64_t groups = 1;
};

// torch::conv2d(x, w) (no bias; x NCHW, w [O, C/groups, kh, kw]) on bfloat16 inputs with
// float32 accumulation and a channels-last float32 output (the layout of the matrix
// engine's convolutions, which the next layer then reads without a reorder), or nullopt where an operand holds a value that is not a
// bfloat16 value. Every geometry torch::conv2d takes (stride, padding, dilation, groups,
// depthwise). The oneDNN primitive of each shape, and the reorders into the layouts it
// prefers, are created once per process. Throws Error if the CPU has no bfloat16 products.
std::optional<torch::Tensor> conv2d_bf16(const torch::Tensor& x, const torch::Tensor& w, const ConvGeometry& g);

// The convolution's gradient with respect to its input (sizes `x_sizes`; channels-last)
// from the output's gradient `gy`, and with respect to its weights (sizes `w_sizes`;
// contiguous): the backward-data and backward-weights products, on bfloat16 operands as
// above.
std::optional<torch::Tensor> conv2d_input_grad_bf16(const torch::Tensor& gy, const torch::Tensor& w,
                                                    at::IntArrayRef x_sizes, const ConvGeometry& g);
std::optional<torch::Tensor> conv2d_weight_grad_bf16(const torch::Tensor& gy, const torch::Tensor& x,
                                                     at::IntArrayRef w_sizes, const ConvGeometry& g);

// The convolution on the path `c` asks for, as matmul() above; fp32 is libtorch's
// torch::conv2d, with channels-last activations. Operands may be given as bfloat16. With a
// chunked accumulation or a dot model the convolution runs as im2col matrix products, one
// per group, whose sums over (channel, ky, kx) accumulate as `acc` says (docs/spec.md §7.3, §7.4).
torch::Tensor conv2d(const torch::Tensor& x, const torch::Tensor& w, const ConvGeometry& g, Compute c,
                     Compute* taken = nullptr, const Accumulation& acc = {});

// Its two backward products on the paths `c` asks for: grad_x from `gy_dx` and grad_w from
// `gy_dw` (often the same tensor, then converted to bfloat16 once), each where wanted, with
// the path each took; fp32 is libtorch's at::convolution_backward. With a chunked
// accumulation, grad_x's sums over output channels and grad_w's over (image, output
// position) accumulate as `acc` says (docs/spec.md §7.3).
struct ConvGrads {
  torch::Tensor dx, dw;
  Compute dx_path = Compute::fp32, dw_path = Compute::fp32;
};
ConvGrads conv2d_backward(const torch::Tensor& gy_dx, const torch::Tensor& gy_dw, const torch::Tensor& x,
                          const torch::Tensor& w, const ConvGeometry& g, Compute c, bool want_dx, bool want_dw,
                          const Accumulation& acc = {});

}  // namespace fp8lab::nn
