// The scalar reference codec (docs/spec.md §2): round a float32 to a format, encode it to a code,
// decode a code. Every fast path in fp8lab is tested bit-exact against these functions.
#pragma once

#include <cstdint>

#include "fp8lab/core/format.hpp"

namespace fp8lab {

// What happened to one value; kernels sum these.
struct QuantCounts {
  std::uint64_t total = 0;      // values seen
  std::uint64_t overflow = 0;   // finite input whose rounded magnitude exceeded max, or +-Inf input
  std::uint64_t underflow = 0;  // non-zero finite input that became zero ("flushed to zero")
  std::uint64_t nan = 0;        // result is NaN (NaN input, overflow in nan mode, Inf->NaN),
                                // and NaN inputs of a `finite` format (stored as +0)
  QuantCounts& operator+=(const QuantCounts& o) {
    total += o.total;
    overflow += o.overflow;
    underflow += o.underflow;
    nan += o.nan;
    return *this;
  }
  friend bool operator==(const QuantCounts&, const QuantCounts&) = default;
};

// Encode x to a code of q.format (width <= 16). `index` is the element's index in its
// tensor: it selects the stochastic-rounding random bits (with q.seed). `counts`, when
// given, is incremented.
std::uint32_t encode(float x, const QuantSpec& q, std::uint64_t index = 0,
                     QuantCounts* counts = nullptr);

// Decode a code to the float32 nearest its value (every value of a format whose range fits
// float32 is exact). NaN codes give a quiet NaN, with the code's sign where the policy has
// signed NaNs; Inf codes give +-Inf.
float decode(std::uint32_t code, const Format& f);

// Fake quantization: decode(encode(x)), except that a NaN input stays NaN in a `finite`
// format (which has no NaN code) so that it stays visible. Works for any valid format,
// also those wider than 16 bits (fp32, for analysis).
float quantize(float x, const QuantSpec& q, std::uint64_t index = 0,
               QuantCounts* counts = nullptr);

// Convenience: nearest-even, saturating.
inline float quantize(float x, const Format& f) {
  QuantSpec q;
  q.format = f;
  return quantize(x, q);
}

// Throws Error if the format is too wide for codes (width > 16).
void require_codable(const Format& f);

// Throws Error naming `what` and the index of the first of the `n` codes that is not a
// code of `f` (a bit set above its width, e.g. 0xFF for 4-bit E2M1): such a code decodes
// to nothing. The codes of the CLI's files and of Python's tensors pass through it.
void check_codes(const std::uint8_t* codes, std::size_t n, const Format& f, const std::string& what);
void check_codes(const std::uint16_t* codes, std::size_t n, const Format& f, const std::string& what);

}  // namespace fp8lab
