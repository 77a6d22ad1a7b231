// The element kernels' entry points: each dispatches to its per-target code (quantize-inl.h,
// compiled once per Highway target and chosen at run time) once per range of its runner's
// threads (quantize_bf16 once per 16 KiB chunk, which stays in L1 between its two steps).

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/kernels/quantize.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/cache_control.h"
#include "hwy/highway.h"

#include "fp8lab/core/codec.hpp"
#include "fp8lab/core/random.hpp"
#include "fp8lab/kernels/kernels.hpp"

#include "src/kernels/quantize-inl.h"

#if HWY_ONCE
#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "fp8lab/kernels/threads.hpp"

namespace fp8lab::kernels {

HWY_EXPORT(QuantizeChunk);
HWY_EXPORT(TopHalves);
HWY_EXPORT(QuantizeBf16Chunk);
HWY_EXPORT(EncodeRange8);
HWY_EXPORT(EncodeRange16);
HWY_EXPORT(DecodeRange8);
HWY_EXPORT(DecodeRange16);
HWY_EXPORT(DecodeBf16Range8);

namespace {

constexpr std::size_t kAlign = 1024;  // range boundaries for threads: whole cache lines

// Runs body(begin, end, counts*) over parallel ranges and sums the per-range counts.
template <class Body>
void run_ranges(const Runner& run, std::size_t n, QuantCounts* counts, const Body& body) {
  std::mutex m;
  run.parallel_for(n, kAlign, [&](std::size_t b, std::size_t e) {
    QuantCounts local;
    body(b, e, counts ? &local : nullptr);
    if (counts) {
      std::lock_guard<std::mutex> lk(m);
      *counts += local;
    }
  });
}

std::shared_ptr<const std::vector<float>> decode_table(const Format& f) {
  static std::mutex m;
  static std::map<std::uint64_t, std::shared_ptr<const std::vector<float>>> cache;
  const std::uint64_t key = (std::uint64_t(std::uint8_t(f.exp_bits)) << 40) |
                            (std::uint64_t(std::uint8_t(f.man_bits)) << 32) |
                            (std::uint64_t(std::uint16_t(f.bias)) << 16) |
                            (std::uint64_t(f.policy) << 8) | (std::uint64_t(f.zero) << 2) |
                            (std::uint64_t(f.sign) << 1) | std::uint64_t(f.subnormals);
  std::lock_guard<std::mutex> lk(m);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  auto t = std::make_shared<std::vector<float>>(std::size_t{1} << f.width());
  for (std::uint32_t c = 0; c < t->size(); ++c) (*t)[c] = decode(c, f);
  if (cache.size() > 64) cache.clear();
  cache.emplace(key, t);
  return t;
}

}  // namespace

bool has_fast_path(const Format& f) {
  QuantSpec q;
  q.format = f;
  return detail::make_params(q).fast;
}

void quantize(const float* x, float* y, std::size_t n, const QuantSpec& q, std::uint64_t index_offset,
              QuantCounts* counts, const Runner& run) {
  validate(q);
  const detail::Params p = detail::make_params(q);
  run_ranges(run, n, counts, [&](std::size_t b, std::size_t e, QuantCounts* c) {
    HWY_DYNAMIC_DISPATCH(QuantizeChunk)(p, q, x + b, y + b, nullptr, e - b, index_offset + b, c);
  });
}

// Codes of q's format must fit integers of `bits` bits.
static void require_code_bits(const QuantSpec& q, int bits) {
  validate(q);
  require_codable(q.format);
  if (q.format.width() > bits)
    throw Error("format " + to_string(q.format) + " is " + std::to_string(q.format.width()) +
                " bits wide: its codes do not fit " + std::to_string(bits) + "-bit integers");
}

template <typename T>
static void encode_impl(const float* x, T* codes, std::size_t n, const QuantSpec& q, std::uint64_t index_offset,
                        QuantCounts* counts, const Runner& run) {
  require_code_bits(q, 8 * static_cast<int>(sizeof(T)));
  const detail::Params p = detail::make_params(q);
  run_ranges(run, n, counts, [&](std::size_t b, std::size_t e, QuantCounts* c) {
    if (p.fast) {
      if constexpr (sizeof(T) == 1)
        HWY_DYNAMIC_DISPATCH(EncodeRange8)(p, q, x + b, codes + b, e - b, index_offset + b, c);
      else
        HWY_DYNAMIC_DISPATCH(EncodeRange16)(p, q, x + b, codes + b, e - b, index_offset + b, c);
    } else {
      for (std::size_t i = b; i < e; ++i)
        codes[i] = static_cast<T>(fp8lab::encode(x[i], q, index_offset + i, c));
    }
  });
}

void encode(const float* x, std::uint8_t* codes, std::size_t n, const QuantSpec& q, std::uint64_t index_offset,
            QuantCounts* counts, const Runner& run) {
  encode_impl(x, codes, n, q, index_offset, counts, run);
}
void encode(const float* x, std::uint16_t* codes, std::size_t n, const QuantSpec& q, std::uint64_t index_offset,
            QuantCounts* counts, const Runner& run) {
  encode_impl(x, codes, n, q, index_offset, counts, run);
}

void quantize_and_encode(const float* x, float* y, std::uint8_t* codes, std::size_t n, const QuantSpec& q,
                         std::uint64_t index_offset, QuantCounts* counts, const Runner& run) {
  require_code_bits(q, 8);
  const detail::Params p = detail::make_params(q);
  run_ranges(run, n, counts, [&](std::size_t b, std::size_t e, QuantCounts* c) {
    HWY_DYNAMIC_DISPATCH(QuantizeChunk)(p, q, x + b, y + b, codes + b, e - b, index_offset + b, c);
  });
}

bool to_bf16_exact(const float* x, std::uint16_t* y, std::size_t n, const Runner& run) {
  std::atomic<bool> exact{true};
  run.parallel_for(n, 4096, [&](std::size_t b, std::size_t e) {
    if (HWY_DYNAMIC_DISPATCH(TopHalves)(x + b, y + b, e - b) != 0) exact.store(false, std::memory_order_relaxed);
  });
  return exact.load();
}

bool quantize_bf16(const float* x, std::uint16_t* y, std::uint8_t* codes, std::size_t n, const QuantSpec& q,
                   std::uint64_t index_offset, QuantCounts* counts, const Runner& run) {
  if (codes) require_code_bits(q, 8);
  else validate(q);
  const detail::Params p = detail::make_params(q);
  constexpr std::size_t kChunk = 4096;  // 16 KiB of float32: stays in L1 between the two steps
  std::atomic<bool> exact{true};
  run_ranges(run, n, counts, [&](std::size_t b, std::size_t e, QuantCounts* c) {
    alignas(64) float buffer[kChunk];
    for (std::size_t i = b; i < e; i += kChunk) {
      const std::size_t len = std::min(kChunk, e - i);
      if (HWY_DYNAMIC_DISPATCH(QuantizeBf16Chunk)(p, q, x + i, y + i, codes ? codes + i : nullptr, len,
                                                  index_offset + i, c, buffer) != 0)
        exact.store(false, std::memory_order_relaxed);
    }
  });
  return exact.load();
}

template <typename T>
static void decode_impl(const T* codes, float* y, std::size_t n, const Format& f, const Runner& run) {
  validate(f);
  require_codable(f);
  const auto table = decode_table(f);
  const std::uint32_t mask = static_cast<std::uint32_t>(table->size() - 1);
  run.parallel_for(n, kAlign, [&](std::size_t b, std::size_t e) {
    if constexpr (sizeof(T) == 1)
      HWY_DYNAMIC_DISPATCH(DecodeRange8)(table->data(), mask & 0xffu, codes + b, y + b, e - b);
    else
      HWY_DYNAMIC_DISPATCH(DecodeRange16)(table->data(), mask, codes + b, y + b, e - b);
  });
}

void decode(const std::uint8_t* codes, float* y, std::size_t n, const Format& f, const Runner& run) {
  decode_impl(codes, y, n, f, run);
}
void decode(const std::uint16_t* codes, float* y, std::size_t n, const Format& f, const Runner& run) {
  decode_impl(codes, y, n, f, run);
}

bool decode_bf16(const std::uint8_t* codes, std::uint16_t* y, std::size_t n, const Format& f, const Runner& run) {
  validate(f);
  require_codable(f);
  if (f.width() > 8) throw Error("decode_bf16: format " + to_string(f) + " is wider than 8 bits");
  const auto table = decode_table(f);
  for (float v : *table) {
    std::uint32_t b;
    std::memcpy(&b, &v, 4);
    if ((b & 0xFFFFu) != 0) return false;
  }
  const std::uint32_t mask = static_cast<std::uint32_t>(table->size() - 1) & 0xffu;
  run.parallel_for(n, kAlign, [&](std::size_t b, std::size_t e) {
    HWY_DYNAMIC_DISPATCH(DecodeBf16Range8)(table->data(), mask, codes + b, y + b, e - b);
  });
  return true;
}

std::uint64_t ExpHistogram::total() const {
  std::uint64_t t = zero + inf + nan;
  for (auto b : bins) t += b;
  return t;
}

ExpHistogram& ExpHistogram::operator+=(const ExpHistogram& o) {
  for (int i = 0; i < kBins; ++i) bins[i] += o.bins[i];
  zero += o.zero;
  inf += o.inf;
  nan += o.nan;
  return *this;
}

ExpRange nonzero_range(const ExpHistogram& h) {
  int lo = ExpHistogram::kMaxExp + 1, hi = ExpHistogram::kMinExp - 1;
  for (int e = ExpHistogram::kMinExp; e <= ExpHistogram::kMaxExp; ++e)
    if (h.at(e)) lo = std::min(lo, e), hi = std::max(hi, e);
  ExpRange r;
  if (lo > hi) return r;
  r.lo = lo;
  for (int e = lo; e <= hi; ++e) r.counts.push_back(h.at(e));
  return r;
}

ExpHistogram exponent_histogram(const float* x, std::size_t n, const Runner& run) {
  ExpHistogram total;
  std::mutex m;
  run.parallel_for(n, kAlign, [&](std::size_t b, std::size_t e) {
    // Four interleaved tables over the 8-bit exponent field break the dependency chain
    // of repeated increments; the rare subnormals and non-finite values branch off.
    std::uint64_t t[4][256] = {};
    ExpHistogram h;
    std::size_t i = b;
    for (; i + 4 <= e; i += 4) {
      for (int k = 0; k < 4; ++k) {
        std::uint32_t a;
        std::memcpy(&a, x + i + k, 4);
        a &= 0x7fffffffu;
        const std::uint32_t ef = a >> 23;
        ++t[k][ef];
        if ((ef == 0 && a != 0) || ef == 255) {
          if (ef == 255) (a == 0x7f800000u ? h.inf : h.nan)++;
          else ++h.at(-118 - std::countl_zero(a));  // floor(log2(a * 2^-149))
        }
      }
    }
    for (; i < e; ++i) {
      std::uint32_t a;
      std::memcpy(&a, x + i, 4);
      a &= 0x7fffffffu;
      const std::uint32_t ef = a >> 23;
      ++t[0][ef];
      if ((ef == 0 && a != 0) || ef == 255) {
        if (ef == 255) (a == 0x7f800000u ? h.inf : h.nan)++;
        else ++h.at(-118 - std::countl_zero(a));
      }
    }
    std::uint64_t sub = 0;
    for (int ex = ExpHistogram::kMinExp; ex < -126; ++ex) sub += h.at(ex);
    h.zero = t[0][0] + t[1][0] + t[2][0] + t[3][0] - sub;
    for (int ef = 1; ef < 255; ++ef) h.at(ef - 127) = t[0][ef] + t[1][ef] + t[2][ef] + t[3][ef];
    std::lock_guard<std::mutex> lk(m);
    total += h;
  });
  return total;
}

std::vector<std::string> available_targets() {
  std::vector<std::string> out;
  hwy::SetSupportedTargetsForTest(0);
  for (std::int64_t t : hwy::SupportedAndGeneratedTargets()) out.emplace_back(hwy::TargetName(t));
  return out;
}

void use_target(const std::string& name) {
  hwy::SetSupportedTargetsForTest(0);
  if (!name.empty()) {
    bool found = false;
    for (std::int64_t t : hwy::SupportedAndGeneratedTargets()) {
      if (name == hwy::TargetName(t)) {
        hwy::SetSupportedTargetsForTest(t);
        found = true;
        break;
      }
    }
    if (!found) throw Error("SIMD target '" + name + "' is not available on this machine");
  }
  hwy::GetChosenTarget().DeInit();
}

std::string current_target() {
  const std::vector<std::int64_t> ts = hwy::SupportedAndGeneratedTargets();
  return ts.empty() ? "" : hwy::TargetName(ts.front());
}

}  // namespace fp8lab::kernels
#endif  // HWY_ONCE
