// Bulk quantization kernels for float32 arrays: fake quantization, encode to codes, decode,
// and a log2 exponent histogram. Quantize, encode and decode are SIMD (Highway, chosen at
// run time for this CPU); the histogram is scalar code (four interleaved count tables over
// the exponent field, about a third of the streaming rate: docs/benchmarks.md), since it runs
// only on statistics steps. All are multithreaded above a size threshold. Every kernel is
// bit-exact with the scalar codec (fp8lab/core/codec.hpp) on every target, for any thread
// count: stochastic rounding draws the random bits of element i from (seed, index_offset +
// i) only. Each takes the Runner of its parallel work (threads.hpp; default: the kernels'
// pool).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "fp8lab/core/codec.hpp"
#include "fp8lab/core/format.hpp"
#include "fp8lab/kernels/threads.hpp"

namespace fp8lab::kernels {

// y[i] = quantize(x[i], q, index_offset + i). In place when x == y. Any valid format (also
// wider than 16 bits). Counts are accumulated into *counts when given (same pass).
void quantize(const float* x, float* y, std::size_t n, const QuantSpec& q, std::uint64_t index_offset = 0,
              QuantCounts* counts = nullptr, const Runner& run = {});

// codes[i] = encode(x[i], q, index_offset + i). The format must be at most 8 bits wide for
// uint8_t codes and at most 16 for uint16_t codes (Error otherwise).
void encode(const float* x, std::uint8_t* codes, std::size_t n, const QuantSpec& q, std::uint64_t index_offset = 0,
            QuantCounts* counts = nullptr, const Runner& run = {});
void encode(const float* x, std::uint16_t* codes, std::size_t n, const QuantSpec& q, std::uint64_t index_offset = 0,
            QuantCounts* counts = nullptr, const Runner& run = {});

// Both at once, in one pass: y[i] = quantize(x[i]) and codes[i] = encode(x[i]) (the float
// form a layer computes with and the 8-bit form it saves for backward). Width <= 8.
void quantize_and_encode(const float* x, float* y, std::uint8_t* codes, std::size_t n, const QuantSpec& q,
                         std::uint64_t index_offset = 0, QuantCounts* counts = nullptr, const Runner& run = {});

// y[i] = the top 16 bits of x[i]: its bfloat16 value where x[i] is a bfloat16 value.
// Returns whether every x[i] is one (the bottom 16 bits of all are zero); y is written
// either way.
bool to_bf16_exact(const float* x, std::uint16_t* y, std::size_t n, const Runner& run = {});
// Q(x) as bfloat16 bits in y and, where `codes` is given, its 8-bit codes (as
// quantize_and_encode), in one pass over x: each chunk is quantized into an L1-resident
// float32 buffer and its top halves stored. Returns whether every Q(x) was a bfloat16
// value (where not, y is incomplete).
bool quantize_bf16(const float* x, std::uint16_t* y, std::uint8_t* codes, std::size_t n, const QuantSpec& q,
                   std::uint64_t index_offset = 0, QuantCounts* counts = nullptr, const Runner& run = {});

// y[i] = decode(codes[i], f). Bits above the format's width are ignored.
void decode(const std::uint8_t* codes, float* y, std::size_t n, const Format& f, const Runner& run = {});
void decode(const std::uint16_t* codes, float* y, std::size_t n, const Format& f, const Runner& run = {});
// y[i] = the bfloat16 bits of decode(codes[i], f), for formats of at most 8 bits; false,
// with nothing written, where some value of f is not a bfloat16 value.
bool decode_bf16(const std::uint8_t* codes, std::uint16_t* y, std::size_t n, const Format& f,
                 const Runner& run = {});

// Histogram of floor(log2 |x|) over every float32 exponent, -149 (smallest subnormal) to
// 127, plus zeros, infinities and NaNs.
struct ExpHistogram {
  static constexpr int kMinExp = -149;
  static constexpr int kMaxExp = 127;
  static constexpr int kBins = kMaxExp - kMinExp + 1;
  std::array<std::uint64_t, kBins> bins{};
  std::uint64_t zero = 0, inf = 0, nan = 0;
  std::uint64_t& at(int exponent) { return bins[exponent - kMinExp]; }
  std::uint64_t at(int exponent) const { return bins[exponent - kMinExp]; }
  std::uint64_t total() const;
  ExpHistogram& operator+=(const ExpHistogram& o);
  friend bool operator==(const ExpHistogram&, const ExpHistogram&) = default;
};
ExpHistogram exponent_histogram(const float* x, std::size_t n, const Runner& run = {});
// The bins from the lowest to the highest exponent with a count: counts[i] is the count of
// exponent lo + i ({0, {}} for a histogram without finite nonzero values).
struct ExpRange {
  int lo = 0;
  std::vector<std::uint64_t> counts;
};
ExpRange nonzero_range(const ExpHistogram& h);

// Threads used by the kernels (default: the hardware's). Above kParallelThreshold
// elements a call is split over the threads.
void set_num_threads(int n);
int num_threads();
inline constexpr std::size_t kParallelThreshold = std::size_t{1} << 16;

// SIMD targets compiled in and supported by this CPU, best first (e.g. "AVX3", "AVX2",
// "SSE4", "EMU128"); for tests and benchmarks.
std::vector<std::string> available_targets();
// Restrict dispatch to one of available_targets(); "" restores the best.
void use_target(const std::string& name);
// The target the next call will use.
std::string current_target();

// Whether the format takes the SIMD path (otherwise the scalar codec runs per element).
bool has_fast_path(const Format& f);

}  // namespace fp8lab::kernels
