// Quantizing libtorch tensors with the bulk kernels (CPU, float32).
#pragma once

#include <torch/types.h>

#include <array>
#include <span>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "fp8lab/core/codec.hpp"
#include "fp8lab/core/format.hpp"
#include "fp8lab/core/scaled.hpp"

namespace fp8lab::nn {

// The work is split over libtorch's own threads (at::parallel_for), so that the kernels
// do not compete with libtorch's pool for the cores; results do not depend on the split.
//
// A new float32 tensor: every element fake-quantized with q (its seed replaced by `seed`;
// element i of the flattened tensor uses stream index i). Without stochastic rounding a
// dense input (channels-last, say) is read as it lies and the result laid out like it;
// with stochastic rounding the result is contiguous. The same for the functions below.
torch::Tensor fake_quantize(const torch::Tensor& t, const QuantSpec& q, std::uint64_t seed,
                            QuantCounts* counts = nullptr);
// fake_quantize in place: t (a float32 CPU tensor, contiguous, or dense without stochastic
// rounding) is overwritten by Q(t).
void fake_quantize_(torch::Tensor& t, const QuantSpec& q, std::uint64_t seed,
                    QuantCounts* counts = nullptr);
// Codes of the same shape: uint8 for formats up to 8 bits, int16 (holding the uint16
// code bits) up to 16 bits.
torch::Tensor encode_tensor(const torch::Tensor& t, const QuantSpec& q, std::uint64_t seed,
                            QuantCounts* counts = nullptr);
torch::Tensor decode_tensor(const torch::Tensor& codes, const Format& f);
// The bfloat16 form of a float32 tensor, with its sizes and strides where it is dense as it
// lies (contiguous, channels-last, a matrix's transpose, ...; other layouts are made
// contiguous first), or nullopt where some value is not a bfloat16 value (the compute
// layer's check that an operand may take the bfloat16 path, docs/spec.md §7).
std::optional<torch::Tensor> exact_bf16(const torch::Tensor& t);
// fake_quantize with a bfloat16 result (and, with `with_codes`, the 8-bit codes too), in
// one pass over t: no float32 copy of Q(t) is made. nullopt where some value of Q(t) is not
// a bfloat16 value (not for a format exact in bfloat16).
struct BfQuantized {
  torch::Tensor values, codes;  // codes undefined without with_codes
};
std::optional<BfQuantized> quantize_bf16_tensor(const torch::Tensor& t, const QuantSpec& q, std::uint64_t seed,
                                                bool with_codes, QuantCounts* counts = nullptr);
// decode_tensor to bfloat16, for 8-bit codes: nullopt where some value of f is not a
// bfloat16 value.
std::optional<torch::Tensor> decode_tensor_bf16(const torch::Tensor& codes, const Format& f);
// fake_quantize and encode_tensor in one pass: {float32 Q(t), its codes}.
std::pair<torch::Tensor, torch::Tensor> quantize_and_encode_tensor(const torch::Tensor& t,
                                                                   const QuantSpec& q,
                                                                   std::uint64_t seed,
                                                                   QuantCounts* counts = nullptr);

// ---- scaled quantization (docs/spec.md §6) ------------------------------------------------

// How a product reads an operand, as the matrix [rows, cols] whose cols are the product's
// reduction dimension (the one scaled quantization blocks along): the tensor viewed as
// `view` (empty: its own shape), permuted by `perm` (empty: unchanged), then flattened with
// the last `cols_dims` dimensions as the columns.
struct MatrixView {
  std::vector<std::int64_t> view, perm;
  int cols_dims = 1;
};
// The contiguous matrix of t under v.
torch::Tensor to_matrix(const torch::Tensor& t, const MatrixView& v);
// The matrix of t under v as scaled_quantize_matrix reads it without a copy: a view where it
// is the transpose of a contiguous matrix (is_transposed_matrix), else contiguous.
torch::Tensor matrix_of(const torch::Tensor& t, const MatrixView& v);
// Whether m is the transpose of a contiguous matrix ([rows, cols] with strides [1, rows]),
// more than one row and column.
bool is_transposed_matrix(const torch::Tensor& m);
// The inverse: a contiguous tensor of shape `shape` from its matrix m under v.
torch::Tensor from_matrix(const torch::Tensor& m, at::IntArrayRef shape, const MatrixView& v);
// The same as a view of m where one exists (a permuted v gives a permuted layout), else a copy.
torch::Tensor matrix_as(const torch::Tensor& m, at::IntArrayRef shape, const MatrixView& v);

// The random Hadamard transform of size n = signs.size() (16, 32, 64 or 128) along the rows
// of the float32 matrix m, in place: each run of n columns x becomes H (s * x) * fl32(1 /
// sqrt(n)), H the nxn Sylvester Hadamard matrix and s the signs; a last run shorter than n
// stays as it is. The transform is orthonormal, so applied to both operands of a product
// along their reduction dimension it leaves the product unchanged in exact arithmetic, while
// it spreads outliers over n values. Float32 butterflies in a fixed order: the same bits on
// every machine (docs/spec.md §6.6).
void hadamard_(torch::Tensor& m, std::span<const float> signs);
// n signs (+1 or -1) drawn from `seed`: sign i from bit i % 64 of mix64(seed + i / 64).
std::vector<float> hadamard_signs(std::uint64_t seed, int n);

// A scaled quantization of a matrix: what the kernels wrote.
struct ScaledTensor {
  torch::Tensor values;  // float32 [rows, cols], when asked for
  torch::Tensor codes;   // uint8 [rows, cols], when asked for
  torch::Tensor scales;  // int32 [groups] holding the uint32 scale codes (row-major grid)
  torch::Tensor bf16;    // bfloat16 [rows, cols], when asked for and every value is one
  float tensor_scale = 1;
  float amax = 0;        // the tensor's largest finite |x| (delayed scaling's history takes it)
  bool transposed = false;  // read from the matrix's transpose (is_transposed_matrix)
  // values, bf16 and the decodes leave the tensor scale out (ScaledForms::without_tensor_scale
  // with a tensor scale): a product applies output_factor() to its output instead.
  bool without_tensor_scale = false;
  // What a product of this operand multiplies its output by (docs/spec.md §6.7): the tensor
  // scale where the values leave it out, else 1.
  float output_factor() const { return without_tensor_scale ? tensor_scale : 1.0f; }
  // The tensor scale the values and decodes carry.
  float value_tensor_scale() const { return without_tensor_scale ? 1.0f : tensor_scale; }
};
// Which forms of a scaled quantization to make (ScaledTensor).
struct ScaledForms {
  bool values = false;  // float32
  bool codes = false;
  bool bf16 = false;    // the values as bfloat16, where every one is a bfloat16 value
  // The bfloat16 form laid out as the matrix lies: where it is the transpose of a contiguous
  // matrix, the form is too (strides [1, rows]), so that a product reading the tensor in its
  // own layout (channels-last, say) gets it without a transposed copy.
  bool bf16_as_given = false;
  // For a product that applies the tensor scale to its output (ScaledSpec::
  // tensor_scale_on_output): values and bf16 are each element times its block scale alone.
  bool without_tensor_scale = false;
};
// Quantizes the 2-D float32 tensor m with s (its stochastic seed replaced by `seed`) on the
// kernels' own threads (kernels::scaled_quantize; kernels::scaled_quantize_transposed where m
// is the transpose of a contiguous matrix, read as it lies). The outputs are contiguous. The bfloat16 form, asked for alone, costs
// no float32 output: each chunk's values are converted while in cache.
ScaledTensor scaled_quantize_matrix(const torch::Tensor& m, const ScaledSpec& s, std::uint64_t seed,
                                    const ScaledCall& call, ScaledForms forms, ScaledCounts* counts = nullptr);
// Whether t is the transpose of the contiguous matrix m (the same memory read as [cols, rows]).
bool is_transpose_of(const torch::Tensor& t, const torch::Tensor& m);
// One form of scaled_quantize_matrix_both: the seed, call, forms and counts of its quantization.
struct ScaledForm {
  std::uint64_t seed = 0;
  ScaledCall call;
  ScaledForms forms;
  ScaledCounts* counts = nullptr;
};
// Both forms of the contiguous float32 matrix m in one read (kernels::scaled_quantize_both):
// scaled_quantize_matrix(m, s, ...) under rows_form and scaled_quantize_matrix(m.t(), s, ...)
// under cols_form, bit for bit, the second with the first's amax as its known amax.
std::pair<ScaledTensor, ScaledTensor> scaled_quantize_matrix_both(const torch::Tensor& m, const ScaledSpec& s,
                                                                  const ScaledForm& rows_form,
                                                                  const ScaledForm& cols_form);
// The float32 values [rows, cols] of q's codes and scales.
torch::Tensor scaled_decode_matrix(const ScaledTensor& q, const ScaledSpec& s);
// The same as bfloat16, where every value is a bfloat16 value (else nullopt); laid out as the
// quantized matrix lay (strides [1, rows] where q.transposed).
std::optional<torch::Tensor> scaled_decode_matrix_bf16(const ScaledTensor& q, const ScaledSpec& s);

}  // namespace fp8lab::nn
