// float32 to bfloat16 for values that are bfloat16 values: the top half of each float's
// bits, with a check that the bottom half is zero (compiled once per Highway target).
#include <algorithm>
#include <atomic>
#include <mutex>
#include <cstdint>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/kernels/bf16.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

#include "fp8lab/kernels/kernels.hpp"
#include "fp8lab/kernels/threads.hpp"

HWY_BEFORE_NAMESPACE();
namespace fp8lab::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Returns the OR of the bottom halves (0: every value was a bfloat16 value).
std::uint32_t TopHalves(const float* x, std::uint16_t* y, std::size_t n) {
  const hn::ScalableTag<std::uint32_t> d;
  const hn::Rebind<std::uint16_t, decltype(d)> d16;
  const std::size_t N = hn::Lanes(d);
  const auto* bits = reinterpret_cast<const std::uint32_t*>(x);
  const auto low = hn::Set(d, 0xFFFFu);
  auto dropped = hn::Zero(d);
  std::size_t i = 0;
  for (; i + N <= n; i += N) {
    const auto v = hn::LoadU(d, bits + i);
    dropped = hn::Or(dropped, hn::And(v, low));
    hn::StoreU(hn::TruncateTo(d16, hn::ShiftRight<16>(v)), d16, y + i);
  }
  std::uint32_t rest = 0;
  for (; i < n; ++i) {
    rest |= bits[i] & 0xFFFFu;
    y[i] = static_cast<std::uint16_t>(bits[i] >> 16);
  }
  return rest | hn::GetLane(hn::MaxOfLanes(d, dropped));
}

}  // namespace fp8lab::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace fp8lab::kernels {

HWY_EXPORT(TopHalves);

bool to_bf16_exact(const float* x, std::uint16_t* y, std::size_t n, const Runner& run) {
  std::atomic<bool> exact{true};
  run.parallel_for(n, 4096, [&](std::size_t b, std::size_t e) {
    if (HWY_DYNAMIC_DISPATCH(TopHalves)(x + b, y + b, e - b) != 0) exact.store(false, std::memory_order_relaxed);
  });
  return exact.load();
}

bool quantize_bf16(const float* x, std::uint16_t* y, std::uint8_t* codes, std::size_t n, const QuantSpec& q,
                   std::uint64_t index_offset, QuantCounts* counts, const Runner& run) {
  validate(q);
  constexpr std::size_t kChunk = 4096;  // 16 KiB of float32: stays in L1 between the two steps
  std::atomic<bool> exact{true};
  std::mutex m;
  const Runner serial = Runner::serial();  // for the per-chunk calls below, on this part's thread
  run.parallel_for(n, kChunk, [&](std::size_t b, std::size_t e) {
    alignas(64) float buffer[kChunk];
    QuantCounts local;
    QuantCounts* c = counts ? &local : nullptr;
    for (std::size_t i = b; i < e; i += kChunk) {
      const std::size_t len = std::min(kChunk, e - i);
      if (codes) quantize_and_encode(x + i, buffer, codes + i, len, q, index_offset + i, c, serial);
      else quantize(x + i, buffer, len, q, index_offset + i, c, serial);
      if (HWY_DYNAMIC_DISPATCH(TopHalves)(buffer, y + i, len) != 0) exact.store(false, std::memory_order_relaxed);
    }
    if (counts) {
      const std::lock_guard<std::mutex> lk(m);
      *counts += local;
    }
  });
  return exact.load();
}

}  // namespace fp8lab::kernels
#endif
