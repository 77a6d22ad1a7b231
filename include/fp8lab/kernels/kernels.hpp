// Bulk quantization kernels for float32 arrays: fake quantization, encode to codes, decode,
// and a log2 exponent histogram. Quantize, encode and decode are SIMD (Highway, chosen at
// run time for this CPU); the histogram is scalar code (four interleaved count tables over
// the exponent field, about a third of the streaming rate: docs/benchmarks.md), since it runs
// only on statistics steps. All are multithreaded above a size threshold. Every kernel is
// bit-exact with the scalar codec (fp8lab/core/codec.hpp) on every target, for any thread
// count: stochastic rounding draws the random bits of element i from (seed, index_offset +
// i) only.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "fp8lab/core/codec.hpp"
#include "fp8lab/core/format.hpp"

namespace fp8lab::kernels {

// y[i] = quantize(x[i], q, index_offset + i). In place when x == y. Any valid format (also
// wider than 16 bits). Counts are accumulated into *counts when given (same pass).
void quantize(const float* x, float* y, std::size_t n, const QuantSpec& q,
              std::uint64_t index_offset = 0, QuantCounts* counts = nullptr);

// codes[i] = encode(x[i], q, index_offset + i). The format must be at most 8 bits wide for
// uint8_t codes and at most 16 for uint16_t codes (Error otherwise).
void encode(const float* x, std::uint8_t* codes, std::size_t n, const QuantSpec& q,
            std::uint64_t index_offset = 0, QuantCounts* counts = nullptr);
void encode(const float* x, std::uint16_t* codes, std::size_t n, const QuantSpec& q,
            std::uint64_t index_offset = 0, QuantCounts* counts = nullptr);

// Both at once, in one pass: y[i] = quantize(x[i]) and codes[i] = encode(x[i]) (the float
// form a layer computes with and the 8-bit form it saves for backward). Width <= 8.
void quantize_and_encode(const float* x, float* y, std::uint8_t* codes, std::size_t n,
                         const QuantSpec& q, std::uint64_t index_offset = 0,
                         QuantCounts* counts = nullptr);

// One pass of block-scaled quantization (docs/spec.md §6.3), on the calling thread: with
// v = x[i] * before[b] (power-of-two factors, E8M0) or, with `divide`, v = x[i] / before[b]
// (any other scale X = before[b]), b = i / block: y[i] = quantize(v) * after[b] and codes[i]
// (when codes is not null) the code of quantize(v); stream index index_offset + i. Counts as
// quantize() on the v, plus *flushed: the nonzero x whose v is zero; hot[b] |= 1 where an
// element of block b overflows (counted as overflow: the block saturates). Returns false,
// doing nothing, where this path does not apply (block not a multiple of the SIMD width, n
// not of block, a format without the SIMD path): the caller then takes separate passes.
bool quantize_scaled_blocks(const float* x, float* y, std::uint8_t* codes, std::size_t n, std::size_t block,
                            const float* before, const float* after, bool divide, const QuantSpec& q,
                            std::uint64_t index_offset, QuantCounts* counts, std::uint8_t* hot, std::uint64_t* flushed);

// Largest magnitudes as float32 bits with the sign cleared (they order as the magnitudes
// do; Inf is 0x7F800000 and NaN above it), on the calling thread: of x[0, n), and of each
// of `count` blocks of `block` values x[k block, (k + 1) block) into tops[k]. read_ahead:
// prefetch in software too (a pass that only reads; a caller that prefetches already, or
// reads from cache, goes faster without).
std::uint32_t magnitude_top(const float* x, std::size_t n);
void block_magnitude_tops(const float* x, std::size_t count, std::size_t block, std::uint32_t* tops,
                          bool read_ahead = false);

// y[i] = the top 16 bits of x[i]: its bfloat16 value where x[i] is a bfloat16 value.
// Returns whether every x[i] is one (the bottom 16 bits of all are zero); y is written
// either way.
bool to_bf16_exact(const float* x, std::uint16_t* y, std::size_t n);
// Q(x) as bfloat16 bits in y and, where `codes` is given, its 8-bit codes (as
// quantize_and_encode), in one pass over x: each chunk is quantized into an L1-resident
// float32 buffer and its top halves stored. Returns whether every Q(x) was a bfloat16
// value (where not, y is incomplete).
bool quantize_bf16(const float* x, std::uint16_t* y, std::uint8_t* codes, std::size_t n, const QuantSpec& q,
                   std::uint64_t index_offset = 0, QuantCounts* counts = nullptr);

// y[i] = decode(codes[i], f). Bits above the format's width are ignored.
void decode(const std::uint8_t* codes, float* y, std::size_t n, const Format& f);
void decode(const std::uint16_t* codes, float* y, std::size_t n, const Format& f);
// y[i] = the bfloat16 bits of decode(codes[i], f), for formats of at most 8 bits; false,
// with nothing written, where some value of f is not a bfloat16 value.
bool decode_bf16(const std::uint8_t* codes, std::uint16_t* y, std::size_t n, const Format& f);

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
ExpHistogram exponent_histogram(const float* x, std::size_t n);
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

// While alive, kernel calls on this thread run on this thread only: for callers that
// already split the work over their own threads (e.g. libtorch's at::parallel_for), so
// that two thread pools do not compete for the same cores.
class SerialScope {
 public:
  SerialScope();
  ~SerialScope();
  SerialScope(const SerialScope&) = delete;
  SerialScope& operator=(const SerialScope&) = delete;

 private:
  bool previous_;
};

// While alive, parallel kernel work started on this thread runs on the caller's own thread
// pool instead of the kernels' pool: the work is cut into `parts` ranges as the kernels' pool
// would cut it for that many threads, and `run(parts, part)` must call part(i) once for
// every i in [0, parts), on any threads (libtorch's at::parallel_for, say). For callers
// whose pool would otherwise spin beside the kernels' one. Results do not depend on it.
class ExternalThreads {
 public:
  using Runner = std::function<void(std::size_t parts, const std::function<void(std::size_t)>& part)>;
  ExternalThreads(int parts, Runner run);
  ~ExternalThreads();
  ExternalThreads(const ExternalThreads&) = delete;
  ExternalThreads& operator=(const ExternalThreads&) = delete;

 private:
  int parts_;
  Runner run_;
  const ExternalThreads* previous_;
  friend void parallel_for(std::size_t, std::size_t, const std::function<void(std::size_t, std::size_t)>&);
};

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
