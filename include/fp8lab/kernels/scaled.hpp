// Scaled and block-scaled quantization of float32 arrays (docs/spec.md §6) on the SIMD
// kernels: each group's amax, its scale, then the element kernel on the scaled values, in
// cache-sized chunks of the rows, on the runner's threads (threads.hpp). Bit-exact with
// fp8lab::scaled_quantize_reference (values, codes, scales and counts) for every SIMD target
// and thread count.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>

#include "fp8lab/core/scaled.hpp"
#include "fp8lab/kernels/threads.hpp"

namespace fp8lab::kernels {

// As scaled_quantize_reference: x is row-major [rows, cols], groups run along the rows.
// Returns the tensor's largest finite |x|. `s` must have a scale (s.scaled()): a fixed-bias
// format is kernels::quantize's, and is refused here with an Error.
float scaled_quantize(const float* x, std::size_t rows, std::size_t cols, const ScaledSpec& s,
                      const ScaledOut& out, const ScaledCall& call = {}, ScaledCounts* counts = nullptr,
                      const Runner& run = {});
// The same on the matrix [rows, cols] given by its transpose xt ([cols, rows] row-major): the
// outputs of scaled_quantize on the transposed copy, bit for bit, with no such copy where the
// blocks are 1xK and each row is whole blocks or shorter than one (MX, NVFP4, 1x128 tiles):
// tiles of xt are transposed in cache and quantized there. Other specs take the copy.
// `bf16_layout`: where the bfloat16 form (ScaledOut::bf16) goes: row-major [rows, cols] like
// the other outputs, or in xt's layout ([cols, rows] row-major, as a product that reads the
// input as it lies wants it).
enum class Bf16Layout : std::uint8_t { matrix, input };
float scaled_quantize_transposed(const float* xt, std::size_t rows, std::size_t cols, const ScaledSpec& s,
                                 const ScaledOut& out, const ScaledCall& call = {},
                                 ScaledCounts* counts = nullptr, const Runner& run = {},
                                 Bf16Layout bf16_layout = Bf16Layout::matrix);

// Both forms of the row-major matrix x [rows, cols] in one read: `out` as scaled_quantize
// (x, rows, cols, s, out, call, counts) writes it, and `t_out` as scaled_quantize_transposed
// (x, cols, rows, t_s, t_out, t_call, t_counts, run, t_bf16_layout) writes it (the matrix
// [cols, rows] that x is the transpose of: blocks along x's columns), bit for bit, counts
// included. Where both forms are 1xK blocks on the same fast scale path, each strip of x's
// rows is quantized along its rows and then transposed in cache for the other form (the
// "dim0/dim1 casts" of a tensor that two products read along different axes); else the two
// calls run one after the other. The specs may differ in their stochastic seeds only (an
// Error otherwise). Returns both amaxes.
std::pair<float, float> scaled_quantize_both(const float* x, std::size_t rows, std::size_t cols, const ScaledSpec& s,
                                             const ScaledOut& out, const ScaledCall& call, ScaledCounts* counts,
                                             const ScaledSpec& t_s, const ScaledOut& t_out, const ScaledCall& t_call,
                                             ScaledCounts* t_counts, const Runner& run = {},
                                             Bf16Layout t_bf16_layout = Bf16Layout::matrix);

// As scaled_decode_reference: the values of element codes [rows, cols] and their scales
// (layout.groups() codes, row-major grid), bit-exact with it; the element kernel decodes a
// row's codes, then each group's values are multiplied by its scale.
void scaled_decode(const std::uint8_t* codes, const std::uint32_t* scale_codes, float tensor_scale,
                   std::size_t rows, std::size_t cols, const ScaledSpec& s, float* y, const Runner& run = {});
// The same values as bfloat16 (the top half of each float32 value, decoded a row at a time in
// cache); returns whether every value was a bfloat16 value (y is then exact; dither-scale:
// false, nothing decoded, its values being divided by 3). A scaled s only.
bool scaled_decode_bf16(const std::uint8_t* codes, const std::uint32_t* scale_codes, float tensor_scale,
                        std::size_t rows, std::size_t cols, const ScaledSpec& s, std::uint16_t* y,
                        const Runner& run = {});
// The same, written transposed: yt is [cols, rows] row-major (yt[c * rows + r] is element
// (r, c)), the layout of the input a transposed quantization read.
bool scaled_decode_bf16_transposed(const std::uint8_t* codes, const std::uint32_t* scale_codes, float tensor_scale,
                                   std::size_t rows, std::size_t cols, const ScaledSpec& s, std::uint16_t* yt,
                                   const Runner& run = {});

// The sum of a product's chunks with float32 scales on the output (docs/spec.md §6.8): for
// each of `batch` matrices and each output (m, n),
//   c = fl32(s_0 * p_0), then c = fma(s_j, p_j, c) for j = 1 .. chunks-1 (one rounding each),
//   s_j = fl32(row_scales[j][m] * col_scales[j][n]),
// with parts [batch, chunks, rows, cols] (p_j: chunk j's float32 partial sums), row_scales
// [batch, chunks, rows], col_scales [batch, chunks, cols] and out [batch, rows, cols], all
// row-major. With `first` false, c starts as out holds it and every chunk is added (a later
// group of chunks). The same bits on every SIMD target and for any runner.
struct ChunkSumShape {
  std::size_t batch = 1, chunks = 1, rows = 0, cols = 0;
};
void scaled_chunk_sum(const float* parts, const float* row_scales, const float* col_scales, float* out,
                      const ChunkSumShape& shape, bool first, const Runner& run = {});

}  // namespace fp8lab::kernels
