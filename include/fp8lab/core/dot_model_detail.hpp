// The dot-product model's integer form, shared by model_dot and the matrix kernel
// (kernels/dot_model.hpp), which splits each operand once rather than once per product.
#pragma once

#include <cstddef>
#include <cstdint>

#include "fp8lab/core/dot_model.hpp"

namespace fp8lab::dot_detail {

enum class Special : std::uint8_t { none, inf, nan };
// A float32 as m * 2^e (|m| < 2^24, m = 0 for zeros), or an infinity (m its sign) or NaN.
struct Split {
  std::int32_t m = 0;
  std::int32_t e = 0;
  Special special = Special::none;
};
Split split(float x);

// sum * 2^q rounded into the model's accumulator (acc_bits, acc_nearest, float32's range).
float round_into_accumulator(__int128 sum, int q, const DotModel& m);

// The model's dot product of n split operands (DotModel, docs/spec.md §7.4). `specials`
// false: the caller knows that no operand is an infinity or NaN (the scan for them skipped).
float model_dot(const Split* a, const Split* b, std::int64_t n, const DotModel& m, bool specials = true);
// Whether any of the n operands is an infinity or NaN.
bool any_special(const Split* x, std::size_t n);

}  // namespace fp8lab::dot_detail
