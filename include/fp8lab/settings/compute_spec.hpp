// How a run's quantized products compute and accumulate (docs/spec.md §7), as configs and
// recipe files name it: the compute path and the accumulation, with their names. Free of
// libtorch, so that the parsers of configs and recipes need only this (src/settings/compute_spec.cpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "fp8lab/core/dot_model.hpp"
#include "fp8lab/core/format.hpp"

namespace fp8lab::nn {

// How a layer's products run: `fp32` always in float32; `bf16` on bfloat16 operands (an
// error where an operand holds a value that is not a bfloat16 value, or the CPU has no
// bfloat16 products); `auto_` bf16 where both hold, fp32 otherwise.
enum class Compute { auto_, fp32, bf16 };
std::string_view to_string(Compute c);
Compute parse_compute(std::string_view s);  // throws Error naming the accepted values

// How a product's sums accumulate (docs/spec.md §7.3, §7.4). Plain (no chunk, no model): one
// float32 sum per output, in whatever order the engine takes. Chunked: the reduction
// dimension is cut into chunks of `chunk` consecutive elements (the last may be shorter);
// each chunk's sum is formed in float32, rounded to `partial` (nearest-even, saturating at
// its largest finite value), and the rounded chunk sums are added in float32 in chunk order.
// A dot model: every sum runs in the hardware model `model` (core/dot_model.hpp).
struct Accumulation {
  std::int64_t chunk = 0;
  Format partial{};
  std::optional<DotModel> model;
  bool chunked() const { return chunk > 0; }
  bool plain() const { return chunk == 0 && !model; }
  friend bool operator==(const Accumulation& a, const Accumulation& b) {
    return a.chunk == b.chunk && (a.chunk == 0 || a.partial == b.partial) && a.model == b.model;
  }
};
// "fp32" (plain), "FORMAT@CHUNK" such as "1.8.10@128" or "e5m2@32", or a dot model: a
// preset ("hopper-fp8") or "dot:KEY=VALUE:..." (core/dot_model.hpp).
std::string to_string(const Accumulation& a);
Accumulation parse_accumulation(std::string_view s);  // throws Error naming the problem

}  // namespace fp8lab::nn
