// The compute layer of quantized products (docs/spec.md §7): which engine runs a layer's
// matrix products. Quantized operands whose values are all bfloat16 values run on bfloat16
// inputs with float32 accumulation and float32 output through oneDNN, on the CPU's matrix
// engine (AMX-BF16) or its AVX512-BF16 instructions; the product of two bfloat16 values is
// exact in float32, so the result is the float32 product's up to the order of summation.
#pragma once

#include <string_view>

#include <torch/torch.h>

#include "fp8lab/core/format.hpp"

namespace fp8lab::nn {

// How a layer's products run: `fp32` always in float32; `bf16` on bfloat16 operands (an
// error where their values are not bfloat16 values or the CPU has no bfloat16 products);
// `auto_` bf16 where both hold, fp32 otherwise.
enum class Compute { auto_, fp32, bf16 };
std::string_view to_string(Compute c);
Compute parse_compute(std::string_view s);  // throws Error naming the accepted values

// Whether this CPU runs bfloat16 products natively (AMX-BF16 or AVX512-BF16), as oneDNN
// sees it: ONEDNN_MAX_CPU_ISA set below AVX512_CORE_BF16 hides them.
bool bf16_products_available();

// Whether every finite value of `f` is a bfloat16 value: at most 7 mantissa bits and every
// value between bfloat16's smallest subnormal 2^-133 and its largest finite value.
bool exact_in_bf16(const Format& f);

// The path a product takes: `fp32` or `bf16` (auto_ resolved by the rule above, from
// whether both operands are exact in bfloat16). Throws Error for bf16 where it cannot run.
Compute resolve(Compute requested, bool operands_exact_in_bf16);

// a [M, K] times b [K, N], float32 tensors whose values are bfloat16 values, on bfloat16
// inputs with float32 accumulation and output: [M, N] float32. Operands may be
// non-contiguous (b transposed is read as it lies). The oneDNN primitive of each shape is
// created once per process. Throws Error if the CPU has no bfloat16 products.
torch::Tensor matmul_bf16(const torch::Tensor& a, const torch::Tensor& b);

}  // namespace fp8lab::nn
