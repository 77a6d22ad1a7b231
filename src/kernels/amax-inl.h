// Largest magnitudes as float32 bits with the sign cleared (per-target code, Highway's -inl.h
// layout, included by scaled.cpp once per target):
// for non-negative floats the bits order as the values do, with Inf above every finite value
// and NaN above Inf, so one unsigned maximum finds the amax and flags a non-finite value.
#include <algorithm>
#include <bit>
#include <cstdint>

// Per-target include guard, as Highway's own -inl.h files have it.
#if defined(FP8LAB_KERNELS_AMAX_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef FP8LAB_KERNELS_AMAX_INL_H_
#undef FP8LAB_KERNELS_AMAX_INL_H_
#else
#define FP8LAB_KERNELS_AMAX_INL_H_
#endif

#include "hwy/cache_control.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace fp8lab::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using D32 = hn::ScalableTag<std::uint32_t>;

// Values read ahead of the one being reduced: a read-only pass keeps more lines in flight
// than the hardware prefetcher alone.
constexpr std::size_t kAhead = 2048;

HWY_INLINE std::uint32_t ScalarTop(const float* x, std::size_t n) {
  std::uint32_t top = 0;
  for (std::size_t i = 0; i < n; ++i) top = std::max(top, std::bit_cast<std::uint32_t>(x[i]) & 0x7FFFFFFFu);
  return top;
}

// The largest of x[0, n).
inline std::uint32_t MagnitudeTop(const float* x, std::size_t n) {
  const D32 d;
  const std::size_t N = hn::Lanes(d);
  const auto mask = hn::Set(d, 0x7FFFFFFFu);
  auto m0 = hn::Zero(d), m1 = hn::Zero(d);  // two chains to hide the max latency
  std::size_t i = 0;
  const auto* bits = reinterpret_cast<const std::uint32_t*>(x);
  for (; i + 2 * N <= n; i += 2 * N) {
    hwy::Prefetch(bits + i + kAhead);
    m0 = hn::Max(m0, hn::And(hn::LoadU(d, bits + i), mask));
    m1 = hn::Max(m1, hn::And(hn::LoadU(d, bits + i + N), mask));
  }
  const std::uint32_t top = hn::GetLane(hn::MaxOfLanes(d, hn::Max(m0, m1)));
  return std::max(top, ScalarTop(x + i, n - i));
}

#if HWY_TARGET <= HWY_AVX3
// Lane j of the result: the largest lane of m[j] (unsigned), for sixteen vectors at once.
// Each level halves the vectors and the lanes left per vector: 32-bit, then 64-bit
// interleaves within 128-bit blocks, then two shuffles of 128-bit blocks.
HWY_INLINE __m512i TopsOf16(const __m512i* m) {
  __m512i c[8], e[4], g[2];
  for (int j = 0; j < 8; ++j)  // per block of 4 lanes: [a0 v a2, b0 v b2, a1 v a3, b1 v b3]
    c[j] = _mm512_max_epu32(_mm512_unpacklo_epi32(m[2 * j], m[2 * j + 1]), _mm512_unpackhi_epi32(m[2 * j], m[2 * j + 1]));
  for (int j = 0; j < 4; ++j)  // per block of 4 lanes: one partial each of 4 vectors
    e[j] = _mm512_max_epu32(_mm512_unpacklo_epi64(c[2 * j], c[2 * j + 1]), _mm512_unpackhi_epi64(c[2 * j], c[2 * j + 1]));
  for (int j = 0; j < 2; ++j)  // blocks: [E01, E23, F01, F23]
    g[j] = _mm512_max_epu32(_mm512_shuffle_i32x4(e[2 * j], e[2 * j + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                            _mm512_shuffle_i32x4(e[2 * j], e[2 * j + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_max_epu32(_mm512_shuffle_i32x4(g[0], g[1], _MM_SHUFFLE(2, 0, 2, 0)),
                          _mm512_shuffle_i32x4(g[0], g[1], _MM_SHUFFLE(3, 1, 3, 1)));
}
#endif

// Of each of `count` blocks of `block` values x[k block, (k + 1) block) into tops[k].
// read_ahead: prefetch in software too (a pass that only reads; a caller that prefetches
// already, or reads from cache, goes faster without).
inline void BlockTops(const float* x, std::size_t count, std::size_t block, std::uint32_t* tops, bool read_ahead) {
  const D32 d;
  const std::size_t N = hn::Lanes(d);
  const auto* bits = reinterpret_cast<const std::uint32_t*>(x);
  if (block % N != 0) {
    for (std::size_t k = 0; k < count; ++k) tops[k] = ScalarTop(x + k * block, block);
    return;
  }
  const auto mask = hn::Set(d, 0x7FFFFFFFu);
  // Block k's vector of lane maxima (its largest magnitude is their largest).
  const auto lane_maxima = [&](std::size_t k) {
    const std::uint32_t* b = bits + k * block;
    if (read_ahead) {
      hwy::Prefetch(b + kAhead);
      if (block > N) hwy::Prefetch(b + kAhead + N);
    }
    auto m = hn::Zero(d);
    for (std::size_t i = 0; i < block; i += N) m = hn::Max(m, hn::And(hn::LoadU(d, b + i), mask));
    return m;
  };
  std::size_t k = 0;
#if HWY_TARGET <= HWY_AVX3
  // Sixteen blocks at a time, reduced together (TopsOf16) instead of one horizontal
  // maximum each.
  for (; k + 16 <= count; k += 16) {
    __m512i m[16];
    for (std::size_t j = 0; j < 16; ++j) m[j] = lane_maxima(k + j).raw;
    _mm512_storeu_si512(tops + k, TopsOf16(m));
  }
#endif
  for (; k < count; ++k) tops[k] = hn::GetLane(hn::MaxOfLanes(d, lane_maxima(k)));
}

}  // namespace fp8lab::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
