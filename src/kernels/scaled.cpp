// Scaled quantization on the element kernels (docs/spec.md §6), compiled once per Highway
// target (this file includes itself through hwy/foreach_target.h, with the element kernels'
// and the amax kernels' per-target code, quantize-inl.h and amax-inl.h): a call dispatches
// once, and every chunk runs the element kernel of that target directly. A group's scale X
// turns into a multiplication before and after the element kernel: v = x * 2^-e and
// y = q(v) * 2^e for E8M0 scales (both exact where the reference shifts the element bias,
// and rounded once where it decodes to a float32 subnormal), v = x / X and y = q(v) * X
// otherwise, exactly the reference's float32 operations.
#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cmath>
#include <limits>
#include <mutex>
#include <optional>
#include <type_traits>
#include <vector>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/kernels/scaled.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

#include "fp8lab/kernels/kernels.hpp"
#include "fp8lab/kernels/scaled.hpp"
#include "fp8lab/kernels/threads.hpp"
#include "src/kernels/amax-inl.h"
#include "src/kernels/quantize-inl.h"

#ifndef FP8LAB_KERNELS_SCALED_ONCE
#define FP8LAB_KERNELS_SCALED_ONCE
namespace fp8lab::kernels::detail {
// Whether a spec's scales are powers of two applied as factors (E8M0 without a tensor scale).
inline bool power_of_two(const ScaledSpec& s) { return s.power_of_two_elements(); }
// The value of each 8-bit code of an E8M0 or UE4M3 scale (NaN for a NaN code), without a
// tensor scale: scale_from_code's, tabulated once per process.
inline const float* scale_code_values(ScaleFormat f) {
  const auto table = [](ScaleFormat sf) {
    ScaledSpec s;
    s.scale = sf;
    std::array<float, 256> t{};
    for (std::uint32_t c = 0; c < 256; ++c) t[c] = scale_from_code(s, c, 1.0f).value;
    return t;
  };
  static const std::array<float, 256> e8m0 = table(ScaleFormat::e8m0), ue4m3 = table(ScaleFormat::ue4m3);
  return f == ScaleFormat::e8m0 ? e8m0.data() : ue4m3.data();
}
}  // namespace fp8lab::kernels::detail
#endif

HWY_BEFORE_NAMESPACE();
namespace fp8lab::kernels::HWY_NAMESPACE {
using detail::power_of_two;

namespace {

// One pass of block-scaled quantization on this thread (QuantizePow2Blocks, quantize-inl.h):
// with v = x[i] * before[b] (power-of-two factors, E8M0) or, with `divide`, v = x[i] /
// before[b], b = i / block: y[i] = quantize(v) * after[b] and codes[i] (when codes is not
// null); counts as quantize() on the v, plus *flushed: the nonzero x whose v is zero;
// hot[b] |= 1 where an element of block b overflows. False, doing nothing, where this path
// does not apply (the element format without the SIMD path, a block not a multiple of the
// SIMD width): the caller then takes separate passes.
bool ScaledBlocks(const detail::Params& p, const float* x, float* y, std::uint8_t* codes, std::size_t n,
                  std::size_t block, const float* before, const float* after, bool divide, const QuantSpec& q,
                  std::uint64_t index_offset, QuantCounts* counts, std::uint8_t* hot, std::uint64_t* flushed) {
  if (!p.fast) return false;
  return QuantizePow2Blocks(p, q, x, y, codes, n, block, before, after, divide, index_offset, counts, hot, flushed);
}

}  // namespace


namespace {

constexpr std::size_t kChunk = 4096;  // elements per element-kernel call (L1/L2 resident)


// The factor v = x * before, and y = q * after (power-of-two scales), or the divisor X.
struct Scaling {
  GroupScale g;
  float before = 1, after = 1;
};

// 2^e as a float32 (0 below the smallest subnormal), built from its bits.
float pow2f(int e) {
  if (e >= -126) return std::bit_cast<float>(static_cast<std::uint32_t>(e + 127) << 23);
  return e >= -149 ? std::bit_cast<float>(1u << (e + 149)) : 0.0f;
}

Scaling scaling_of(const ScaledSpec& s, const GroupScale& g) {
  Scaling sc{g};
  if (power_of_two(s) && !g.nan) {  // E8M0 exponents lie in [-127, 127]
    sc.before = pow2f(-g.exponent);
    sc.after = pow2f(g.exponent);
  }
  return sc;
}

// A block's scale decided on a fast path from the bits of its largest magnitude.
struct BlockScale {
  std::uint32_t code = 0;
  float before = 1, after = 1;  // v = x * before (E8M0) or x / before; y = q * after
  bool overflow = false;        // a scale overflow to count
  bool zero = false;            // every value ±0 (a zero group, counted as one)
};

// A block of zeros (largest magnitude bits 0): scale code 0, as choose_scale gives it, and
// its elements ±0 scaled by 1 and unscaled by 0, which keeps their signs (docs/spec.md §6.2).
constexpr BlockScale kZeroBlock{0, 1.0f, 0.0f, false, true};

// E8M0 block scales under the floor or ceil rule straight from a block's largest magnitude
// bits, for a normal float32 amax whose scale exponent lies in E8M0's range: what
// scale_group gives then (docs/spec.md §6.2), without its general path.
class FastPow2 {
 public:
  static constexpr bool kDivide = false;
  explicit FastPow2(const ScaledSpec& s) {
    enabled_ = power_of_two(s) && s.granularity == Granularity::block && s.rule != ScaleRule::nearest;
    ceil_ = s.rule == ScaleRule::ceil;
    const float max_e = static_cast<float>(s.element.format.max_finite());
    emax_ = element_emax(s.element.format);
    max_mantissa_ = std::bit_cast<std::uint32_t>(max_e) & 0x7FFFFFu;
  }
  // floor: floor(log2 amax) - emax; ceil: the smallest e with 2^e max_e >= amax, i.e. one
  // more when amax's significand exceeds max_e's.
  std::optional<BlockScale> decide(std::uint32_t top) const {
    if (enabled_ && top == 0) return kZeroBlock;
    if (!enabled_ || top < 0x00800000u || top >= 0x7F800000u) return std::nullopt;
    int e = static_cast<int>(top >> 23) - 127 - emax_;
    if (ceil_ && (top & 0x7FFFFFu) > max_mantissa_) ++e;
    if (e < -127 || e > 127) return std::nullopt;
    return BlockScale{static_cast<std::uint32_t>(e + 127), pow2f(-e), pow2f(e), false};
  }
  bool enabled() const { return enabled_; }
  // decide() for the blocks of whole vectors of [0, count), a vector of blocks at a time:
  // codes, factors before and after, the zero blocks counted into `zeros` and the largest top
  // into `chunk_top`. The number of blocks decided (the caller decides the rest), or nullopt,
  // with the outputs partly written, where some block needs the general path.
  std::optional<std::size_t> decide_vectors(const std::uint32_t* tops, std::size_t count, std::uint32_t* codes,
                                            float* before, float* after, std::uint64_t& zeros,
                                            std::uint32_t& chunk_top) const {
    if (!enabled_) return std::nullopt;
    const D32 d;
    const hn::RebindToSigned<D32> di;
    const hn::RebindToFloat<D32> df;
    const std::size_t N = hn::Lanes(d);
    auto top_max = hn::Zero(d);
    std::size_t k = 0;
    for (; k + N <= count; k += N) {
      const auto top = hn::LoadU(d, tops + k);
      const auto zero = hn::Eq(top, hn::Zero(d));
      // Subnormal, Inf or NaN amaxes take the general path.
      const auto odd = hn::AndNot(zero, hn::Or(hn::Gt(hn::Set(d, 0x00800000u), top), hn::Gt(top, hn::Set(d, 0x7F7FFFFFu))));
      auto e = hn::Sub(hn::BitCast(di, hn::ShiftRight<23>(top)), hn::Set(di, 127 + emax_));
      if (ceil_)  // one more where the significand exceeds max_e's (a mask lane is -1)
        e = hn::Sub(e, hn::VecFromMask(di, hn::RebindMask(di, hn::Gt(hn::And(top, hn::Set(d, 0x7FFFFFu)),
                                                                    hn::Set(d, max_mantissa_)))));
      const auto outside = hn::RebindMask(d, hn::Or(hn::Gt(hn::Set(di, -127), e), hn::Gt(e, hn::Set(di, 127))));
      if (!hn::AllFalse(d, hn::Or(odd, hn::AndNot(zero, outside)))) return std::nullopt;
      // pow2f of -e and e: 2^-127 is the subnormal 1 << 22.
      const auto sub127 = hn::Set(di, 1 << 22);
      const auto b_bits = hn::IfThenElse(hn::Eq(e, hn::Set(di, 127)), sub127, hn::ShiftLeft<23>(hn::Sub(hn::Set(di, 127), e)));
      const auto a_bits = hn::IfThenElse(hn::Eq(e, hn::Set(di, -127)), sub127, hn::ShiftLeft<23>(hn::Add(e, hn::Set(di, 127))));
      hn::StoreU(hn::IfThenZeroElse(zero, hn::BitCast(d, hn::Add(e, hn::Set(di, 127)))), d, codes + k);
      hn::StoreU(hn::IfThenElse(hn::RebindMask(df, zero), hn::Set(df, 1.0f), hn::BitCast(df, b_bits)), df, before + k);
      hn::StoreU(hn::IfThenZeroElse(hn::RebindMask(df, zero), hn::BitCast(df, a_bits)), df, after + k);
      zeros += hn::CountTrue(d, zero);
      top_max = hn::Max(top_max, top);
    }
    chunk_top = std::max(chunk_top, hn::GetLane(hn::MaxOfLanes(d, top_max)));
    return k;
  }

 private:
  bool enabled_ = false, ceil_ = false;
  int emax_ = 0;
  std::uint32_t max_mantissa_ = 0;
};

// UE4M3 block scales (NVFP4's, with or without the tensor scale) looked up in the tensor's
// ScaleSteps table: choose_scale's code for a finite non-zero amax whose scale is not zero.
class FastSteps {
 public:
  static constexpr bool kDivide = true;
  FastSteps(const ScaledSpec& s, float ts) {
    if (s.granularity == Granularity::block && !s.four_over_six) steps_ = ScaleSteps::make(s, ts);
    // The quartet arithmetic gives a zero block the scale 1 (docs/spec.md §6.13).
    if (s.arithmetic == ScaleArithmetic::quartet) zero_.code = encode(1.0f, QuantSpec{scale_format(s.scale)});
  }
  std::optional<BlockScale> decide(std::uint32_t top) const {
    if (steps_ && top == 0) return zero_;
    if (!steps_ || top >= 0x7F800000u) return std::nullopt;
    const std::uint32_t c = steps_->code(top);
    const float X = steps_->value(c);
    if (c == 0 || !(X > 0)) return std::nullopt;  // scale underflow: the general path counts it
    return BlockScale{c, X, X, steps_->overflow(top)};
  }
  bool enabled() const { return steps_.has_value(); }

 private:
  std::optional<ScaleSteps> steps_;
  BlockScale zero_ = kZeroBlock;
};

// Four Over Six's UE4M3 block scales (docs/spec.md §6.10): each block's two candidate codes
// looked up in ScaleSteps tables for 6 and for 4 (what choose_scale gives for each), the
// choice made by the worker on both candidates' values (its decide_blocks for this class).
// Blocks whose candidate scale is 0 take the general path.
class FastFourOverSix {
 public:
  static constexpr bool kDivide = true;
  FastFourOverSix(const ScaledSpec& s, float ts) {
    if (s.four_over_six && s.granularity == Granularity::block && s.scale == ScaleFormat::ue4m3) {
      six_ = ScaleSteps::make(s, ts, 6.0);
      four_ = ScaleSteps::make(s, ts, 4.0);
    }
  }
  // One candidate of a finite non-zero block: its code and X (0: the general path decides).
  struct Candidate {
    std::uint32_t code;
    float X;
  };
  Candidate six(std::uint32_t top) const { return candidate(*six_, top); }
  Candidate four(std::uint32_t top) const { return candidate(*four_, top); }
  bool overflow(std::uint32_t top, bool four) const { return (four ? four_ : six_)->overflow(top); }
  bool enabled() const { return six_ && four_; }

 private:
  static Candidate candidate(const ScaleSteps& t, std::uint32_t top) {
    const std::uint32_t c = t.code(top);
    return {c, c == 0 ? 0.0f : t.value(c)};
  }
  std::optional<ScaleSteps> six_, four_;
};

// Float32 block scales (DeepSeek's tiles) without a tensor scale: the rule's scale of
// amax / max_e is that quotient in float32, correctly rounded as the rule says (nearest:
// the division itself; ceil: up where it rounded down; floor: a power of two from amax's
// exponent), for a normal finite amax whose scale is a positive finite float.
class FastF32 {
 public:
  static constexpr bool kDivide = true;
  explicit FastF32(const ScaledSpec& s) {
    enabled_ = s.scale == ScaleFormat::fp32 && s.granularity == Granularity::block && !s.tensor_scale &&
               s.arithmetic == ScaleArithmetic::exact && !s.four_over_six;
    rule_ = s.rule;
    max_e_ = static_cast<float>(s.element.format.max_finite());
    emax_ = element_emax(s.element.format);
  }
  std::optional<BlockScale> decide(std::uint32_t top) const {
    if (enabled_ && top == 0) return kZeroBlock;
    if (!enabled_ || top < 0x00800000u || top >= 0x7F800000u) return std::nullopt;
    const float amax = std::bit_cast<float>(top);
    float sc;
    if (rule_ == ScaleRule::floor) {
      sc = pow2f(static_cast<int>(top >> 23) - 127 - emax_);
    } else {
      sc = amax / max_e_;
      if (rule_ == ScaleRule::ceil && static_cast<double>(sc) * max_e_ < amax)
        sc = std::nextafter(sc, std::numeric_limits<float>::infinity());
    }
    if (!(sc > 0) || !std::isfinite(sc)) return std::nullopt;
    return BlockScale{std::bit_cast<std::uint32_t>(sc), sc, sc, false};
  }
  bool enabled() const { return enabled_; }

 private:
  bool enabled_ = false;
  ScaleRule rule_ = ScaleRule::floor;
  float max_e_ = 1;
  int emax_ = 0;
};

Scaling scaling_of(const BlockScale& b, bool pow2) {
  Scaling sc;
  sc.g.code = b.code;
  if (pow2) {
    sc.g.exponent = static_cast<int>(b.code) - 127;
    sc.g.value = b.after;
    sc.before = b.before;
    sc.after = b.after;
  } else {
    sc.g.value = b.before;
  }
  return sc;
}

// dst[r * dst_stride + c] = src[c * src_stride + r] for r < rows, c < cols: a tile of a
// matrix copied out of its transpose, 4x4 blocks at a time in 128-bit vectors.
void TransposeTile(const float* src, std::size_t src_stride, float* dst, std::size_t dst_stride, std::size_t rows,
                   std::size_t cols) {
  std::size_t r4 = 0, c4 = 0;
#if HWY_TARGET != HWY_SCALAR
  namespace hn = hwy::HWY_NAMESPACE;
  const hn::Full128<float> df;
  const hn::Repartition<std::uint64_t, decltype(df)> du;
  r4 = rows / 4 * 4;
  c4 = cols / 4 * 4;
  for (std::size_t c = 0; c < c4; c += 4)
    for (std::size_t r = 0; r < r4; r += 4) {
      const float* s0 = src + c * src_stride + r;
      const auto a = hn::LoadU(df, s0), b = hn::LoadU(df, s0 + src_stride);
      const auto cc = hn::LoadU(df, s0 + 2 * src_stride), d = hn::LoadU(df, s0 + 3 * src_stride);
      const auto ab_lo = hn::BitCast(du, hn::InterleaveLower(df, a, b)), cd_lo = hn::BitCast(du, hn::InterleaveLower(df, cc, d));
      const auto ab_hi = hn::BitCast(du, hn::InterleaveUpper(df, a, b)), cd_hi = hn::BitCast(du, hn::InterleaveUpper(df, cc, d));
      float* d0 = dst + r * dst_stride + c;
      hn::StoreU(hn::BitCast(df, hn::InterleaveLower(du, ab_lo, cd_lo)), df, d0);
      hn::StoreU(hn::BitCast(df, hn::InterleaveUpper(du, ab_lo, cd_lo)), df, d0 + dst_stride);
      hn::StoreU(hn::BitCast(df, hn::InterleaveLower(du, ab_hi, cd_hi)), df, d0 + 2 * dst_stride);
      hn::StoreU(hn::BitCast(df, hn::InterleaveUpper(du, ab_hi, cd_hi)), df, d0 + 3 * dst_stride);
    }
#endif
  for (std::size_t c = 0; c < cols; ++c)  // the edges the blocks left
    for (std::size_t r = c < c4 ? r4 : 0; r < rows; ++r) dst[r * dst_stride + c] = src[c * src_stride + r];
}

// The input values by flat offset into the matrix: element i at data[i - first]. A whole
// row-major matrix is {x, 0}; a chunk copied out of a transposed one is {buffer, its offset}.
struct Input {
  Input(const float* d, std::size_t f = 0) : data(d), first(f) {}  // NOLINT: a plain pointer is {x, 0}
  const float* at(std::size_t i) const { return data + (i - first); }
  const float* data;
  std::size_t first;
};

// One contiguous piece of a group inside a row.
struct Piece {
  std::size_t begin, len;  // flat offsets
  std::size_t group;
};

class Worker {
 public:
  // fused_block: the block size when every chunk is made of whole E8M0 blocks (0: never).
  Worker(const ScaledSpec& s, const ScaledOut& out, const ScaledCall& call, bool count, std::size_t fused_block = 0)
      : s_(s),
        out_(out),
        call_(call),
        count_(count),
        max_e_(static_cast<float>(s.element.format.max_finite())),
        p_(detail::make_params(s.element)),
        fused_block_(s.dither_scale ? 0 : fused_block),  // dither-scale: the element pass's own steps
        // A tensor scale goes with E8M0 or UE4M3 scales only (validate): codes below 256.
        unit_(out.without_tensor_scale && s.tensor_scale ? detail::scale_code_values(s.scale) : nullptr) {}

  // Quantizes pieces (back to back in memory, in order; they may span rows) with their scalings.
  void run(Input x, const std::vector<Piece>& pieces, const std::vector<Scaling>& scalings) {
    if (run_fused(x, pieces, scalings)) return;
    const std::size_t b = pieces.front().begin, n = pieces.back().begin + pieces.back().len - b;
    v_.resize(n);
    q_.resize(out_.values ? 0 : n);
    for (std::size_t k = 0; k < pieces.size(); ++k) scale_in(x, pieces[k], scalings[k], b);
    float* y = out_.values ? out_.values + b : q_.data();
    QuantCounts qc;
    QuantCounts* c = count_ ? &qc : nullptr;
    QuantizeChunk(p_, s_.element, v_.data(), y, out_.codes ? out_.codes + b : nullptr, n, call_.index_offset + b, c);
    for (std::size_t k = 0; k < pieces.size(); ++k) scale_out(pieces[k], scalings[k], b, y);
    emit_bf16(y, b, n);
    counts.elements += qc;
  }

  // The chunk's values just written at y (flat offset `begin`, still in cache) as bfloat16,
  // where ScaledOut asks for them.
  void emit_bf16(const float* y, std::size_t begin, std::size_t n) {
    if (bf16_to_) dropped |= TopHalves(y, bf16_to_ + (begin - bf16_first_), n);
    else if (out_.bf16) dropped |= TopHalves(y, out_.bf16 + begin, n);
  }
  // From now on, the bfloat16 form of flat offset i goes to to[i - first] (a tile's buffer).
  void send_bf16_to(std::uint16_t* to, std::size_t first) {
    bf16_to_ = to;
    bf16_first_ = first;
  }

  // `count` whole blocks of fused_block_ values from flat offset `begin` (block index
  // begin / fused_block_ on), each with a scale decided from its bits by `fast` (FastPow2,
  // FastSteps): the largest magnitudes, the scales and one vector pass, with no per-block
  // objects. False, with nothing counted, when some block needs the general path.
  // `tops`: the blocks' largest magnitude bits when already known (null: found here).
  template <class Fast>
  bool run_fast_blocks(Input x, std::size_t begin, std::size_t count, const Fast& fast,
                       std::uint32_t* scale_codes, float& part_amax, const std::uint32_t* tops) {
    const std::size_t B = fused_block_;
    if (B == 0) return false;
    codes_.resize(count);
    before_.resize(count);
    after_.resize(count);
    hot_.assign(count, 0);
    std::uint32_t chunk_top = 0;
    std::uint64_t overflows = 0, zeros = 0;
    if (!tops) {
      tops_.resize(count);
      BlockTops(x.at(begin), count, B, tops_.data(), false);
      tops = tops_.data();
    }
    if (!decide_blocks(fast, x.at(begin), begin, tops, count, chunk_top, overflows, zeros)) return false;
    const std::size_t n = count * B;
    q_.resize(out_.values ? 0 : n);
    float* y = out_.values ? out_.values + begin : q_.data();
    QuantCounts qc;
    std::uint64_t flushed = 0;
    if (!ScaledBlocks(p_, x.at(begin), y, out_.codes ? out_.codes + begin : nullptr, n, B, before_.data(),
                                after_.data(), Fast::kDivide, s_.element, call_.index_offset + begin,
                                count_ ? &qc : nullptr, hot_.data(), &flushed)) {
      fused_block_ = 0;
      return false;
    }
    emit_bf16(y, begin, n);
    if (scale_codes) std::copy(codes_.begin(), codes_.end(), scale_codes + begin / B);
    counts.groups += count;
    counts.zero_groups += zeros;
    counts.scale_overflow += overflows;
    counts.elements += qc;
    counts.elements.underflow += flushed;
    part_amax = std::max(part_amax, std::bit_cast<float>(chunk_top));
    if (count_)
      for (std::size_t k = 0; k < count; ++k)
        if (hot_[k]) saturated_.push_back(begin / B + k);
    return true;
  }

  // The scales of `count` blocks (values from flat offset `begin`, largest magnitudes `tops`)
  // into codes_, before_ and after_, by `fast` from the largest magnitudes alone; false where
  // some block needs the general path.
  template <class Fast>
  bool decide_blocks(const Fast& fast, const float* /*xs*/, std::size_t /*begin*/, const std::uint32_t* tops,
                     std::size_t count, std::uint32_t& chunk_top, std::uint64_t& overflows, std::uint64_t& zeros) {
    std::size_t k = 0;
    if constexpr (std::is_same_v<Fast, FastPow2>)
      if (!unit_) {
        const auto done = fast.decide_vectors(tops, count, codes_.data(), before_.data(), after_.data(), zeros, chunk_top);
        if (!done) return false;
        k = *done;
      }
    for (; k < count; ++k) {
      const std::uint32_t top = tops[k];
      const auto d = fast.decide(top);
      if (!d) return false;
      codes_[k] = d->code;
      before_[k] = d->before;
      after_[k] = factor_of(d->code, d->after);
      overflows += d->overflow;
      zeros += d->zero;
      chunk_top = std::max(chunk_top, top);
    }
    return true;
  }

  // decide_blocks for Four Over Six (docs/spec.md §6.10), from the blocks' values xs: both
  // candidates' values by the element kernel (x / X, rounded with the random bits of each
  // element's index, times X: the reference's operations), then each block's choice by
  // four_over_six_keeps_four on them. A zero block is kZeroBlock (scale code 0).
  bool decide_blocks(const FastFourOverSix& fast, const float* xs, std::size_t begin, const std::uint32_t* tops,
                     std::size_t count, std::uint32_t& chunk_top, std::uint64_t& overflows, std::uint64_t& zeros) {
    const std::size_t B = fused_block_, n = count * B;
    six_.resize(count);
    four_.resize(count);
    for (std::size_t k = 0; k < count; ++k) {
      if (tops[k] >= 0x7F800000u) return false;  // NaN or Inf: the general path
      if (tops[k] == 0) {
        six_[k] = four_[k] = {0, 1.0f};  // both candidates read back as zeros; the block keeps code 0
        continue;
      }
      six_[k] = fast.six(tops[k]);
      four_[k] = fast.four(tops[k]);
      if (six_[k].X == 0 || four_[k].X == 0) return false;  // a scale of 0: the general path
    }
    candidates_.resize(4 * n);
    float* const v6 = candidates_.data();
    float* const v4 = v6 + n;
    float* const y6 = v4 + n;
    float* const y4 = y6 + n;
    for (std::size_t k = 0; k < count; ++k) {
      const float X6 = six_[k].X, X4 = four_[k].X;
      const float* x = xs + k * B;
      for (std::size_t i = 0; i < B; ++i) {
        v6[k * B + i] = saturate_scaled(x[i] / X6, x[i]);
        v4[k * B + i] = saturate_scaled(x[i] / X4, x[i]);
      }
    }
    QuantizeChunk(p_, s_.element, v6, y6, nullptr, n, call_.index_offset + begin, nullptr);
    QuantizeChunk(p_, s_.element, v4, y4, nullptr, n, call_.index_offset + begin, nullptr);
    for (std::size_t k = 0; k < count; ++k) {
      const std::uint32_t top = tops[k];
      chunk_top = std::max(chunk_top, top);
      if (top == 0) {
        codes_[k] = kZeroBlock.code;
        before_[k] = kZeroBlock.before;
        after_[k] = kZeroBlock.after;
        ++zeros;
        continue;
      }
      const float X6 = six_[k].X, X4 = four_[k].X;
      for (std::size_t i = k * B; i < (k + 1) * B; ++i) {
        y6[i] *= X6;
        y4[i] *= X4;
      }
      const bool four = four_over_six_keeps_four(xs + k * B, y6 + k * B, y4 + k * B, B);
      const FastFourOverSix::Candidate& kept = four ? four_[k] : six_[k];
      codes_[k] = kept.code;
      before_[k] = kept.X;
      after_[k] = factor_of(kept.code, kept.X);
      overflows += fast.overflow(top, four);
    }
    return true;
  }

  // `len` values from flat offset `begin`, all of group `group` with scaling `sc` (a tensor's
  // one group): whole vectors in one pass of the block kernel, the rest as a piece.
  void run_uniform(Input x, std::size_t begin, std::size_t len, const Scaling& sc, std::size_t group) {
    const bool pow2 = power_of_two(s_);
    const GroupScale& g = sc.g;
    const std::size_t whole = len / 16 * 16;  // whole vectors on every target
    if (whole > 0 && !g.nan && !s_.dither_scale && (pow2 || (!g.zero && g.value > 0))) {
      before_.assign(1, before_of(sc));
      after_.assign(1, pow2 ? sc.after : factor_of(g.code, g.value));
      hot_.assign(1, 0);
      q_.resize(out_.values ? 0 : whole);
      float* y = out_.values ? out_.values + begin : q_.data();
      QuantCounts qc;
      std::uint64_t flushed = 0;
      if (ScaledBlocks(p_, x.at(begin), y, out_.codes ? out_.codes + begin : nullptr, whole, whole,
                                 before_.data(), after_.data(), divides(), s_.element, call_.index_offset + begin,
                                 count_ ? &qc : nullptr, hot_.data(), &flushed)) {
        emit_bf16(y, begin, whole);
        counts.elements += qc;
        counts.elements.underflow += flushed;
        if (count_ && hot_[0]) saturated_.push_back(group);
        begin += whole;
        len -= whole;
      }
    }
    if (len > 0) run(x, {Piece{begin, len, group}}, {sc});
  }

  ScaledCounts counts;
  std::uint32_t dropped = 0;  // the OR of the bottom halves emit_bf16 dropped

 private:
  // What a group's quantized elements are multiplied by: X, its GroupScale::value, or with
  // ScaledOut::without_tensor_scale the value of its scale code alone (docs/spec.md §6.7).
  float factor_of(std::uint32_t code, float X) const { return unit_ ? unit_[code & 0xFFu] : X; }
  // Whether the element pass divides x by the group's factor (its value X) rather than
  // multiplying (E8M0's power of two; torchao's reciprocal, docs/spec.md §6.9).
  bool divides() const { return !power_of_two(s_) && !s_.multiplies(); }
  // The factor the element pass divides or multiplies x by.
  float before_of(const Scaling& sc) const {
    return power_of_two(s_) ? sc.before : s_.multiplies() ? sc.g.reciprocal : sc.g.value;
  }

  // Whole blocks, none of them NaN (nor, for scales other than E8M0, all zero or of scale
  // zero): scaling, quantization and unscaling in one pass (ScaledBlocks).
  // False where that path does not apply.
  bool run_fused(Input x, const std::vector<Piece>& pieces, const std::vector<Scaling>& scalings) {
    if (fused_block_ == 0) return false;
    const bool pow2 = power_of_two(s_);
    for (std::size_t k = 0; k < pieces.size(); ++k) {
      const GroupScale& g = scalings[k].g;
      if (pieces[k].len != fused_block_ || g.nan || (!pow2 && (g.zero || !(g.value > 0)))) return false;
    }
    const std::size_t b = pieces.front().begin, n = pieces.size() * fused_block_;
    before_.resize(pieces.size());
    after_.resize(pieces.size());
    hot_.assign(pieces.size(), 0);
    for (std::size_t k = 0; k < pieces.size(); ++k) {
      before_[k] = before_of(scalings[k]);
      after_[k] = pow2 ? scalings[k].after : factor_of(scalings[k].g.code, scalings[k].g.value);
    }
    q_.resize(out_.values ? 0 : n);
    float* y = out_.values ? out_.values + b : q_.data();
    QuantCounts qc;
    std::uint64_t flushed = 0;
    if (!ScaledBlocks(p_, x.at(b), y, out_.codes ? out_.codes + b : nullptr, n, fused_block_, before_.data(),
                                after_.data(), divides(), s_.element, call_.index_offset + b, count_ ? &qc : nullptr,
                                hot_.data(), &flushed)) {
      fused_block_ = 0;  // not on this target or format: the separate passes from now on
      return false;
    }
    emit_bf16(y, b, n);
    counts.elements += qc;
    counts.elements.underflow += flushed;
    if (count_)
      for (std::size_t k = 0; k < pieces.size(); ++k)
        if (hot_[k]) saturated_.push_back(pieces[k].group);
    return true;
  }

  void scale_in(Input x, const Piece& p, const Scaling& sc, std::size_t b) {
    float* v = v_.data() + (p.begin - b);
    const float* xs = x.at(p.begin);
    const GroupScale& g = sc.g;
    if (g.nan) {
      std::fill(v, v + p.len, 0.0f);
    } else if (power_of_two(s_)) {
      std::uint64_t flushed = 0;  // x * 2^-e below float32's range: the reference flushes them too
      for (std::size_t i = 0; i < p.len; ++i) {
        v[i] = saturate_scaled(xs[i] * sc.before, xs[i]);
        flushed += (v[i] == 0) & (xs[i] != 0);
      }
      counts.elements.underflow += flushed;
    } else if (g.zero || (g.value == 0 && !s_.multiplies())) {  // te's zero scale: its elements x * r
      std::uint64_t flushed = 0;
      for (std::size_t i = 0; i < p.len; ++i) {
        v[i] = std::isnan(xs[i]) ? xs[i] : std::copysign(0.0f, xs[i]);
        flushed += xs[i] != 0 && !std::isnan(xs[i]);
      }
      counts.elements.underflow += flushed;
    } else if (s_.dither_scale) {
      std::uint64_t flushed = 0;
      for (std::size_t i = 0; i < p.len; ++i) {
        v[i] = dither_scaled(xs[i], g.exponent);
        flushed += (v[i] == 0) & (xs[i] != 0);
      }
      counts.elements.underflow += flushed;
    } else {
      std::uint64_t flushed = 0;
      for (std::size_t i = 0; i < p.len; ++i) {
        v[i] = saturate_scaled(s_.multiplies() ? xs[i] * g.reciprocal : xs[i] / g.value, xs[i]);
        flushed += (v[i] == 0) & (xs[i] != 0);
      }
      counts.elements.underflow += flushed;
    }
  }

  void scale_out(const Piece& p, const Scaling& sc, std::size_t b, float* y_chunk) {
    float* y = y_chunk + (p.begin - b);
    const GroupScale& g = sc.g;
    if (g.nan) {
      std::fill(y, y + p.len, std::numeric_limits<float>::quiet_NaN());
      if (out_.codes) {
        const Format& e = s_.element.format;
        std::fill(out_.codes + p.begin, out_.codes + p.begin + p.len,
                  static_cast<std::uint8_t>(e.has_nan() ? e.nan_code(false) : 0));
      }
      counts.elements.nan += p.len;
      return;
    }
    if (s_.dither_scale && !g.zero) {
      for (std::size_t i = 0; i < p.len; ++i) y[i] = dither_value(y[i], g.exponent);
    } else {
      const float f = power_of_two(s_) ? sc.after : (g.zero ? 0.0f : factor_of(g.code, g.value));
      for (std::size_t i = 0; i < p.len; ++i) y[i] *= f;
    }
    if (count_) saturation(p, b);
  }

  // Whether an element of the piece overflowed (only elements with |v| > max can): the
  // scalar codec on those few decides, as the reference counts.
  void saturation(const Piece& p, std::size_t b) {
    const float* v = v_.data() + (p.begin - b);
    bool any = false;  // a loop compilers vectorize; NaN compares false
    for (std::size_t i = 0; i < p.len; ++i) any |= std::fabs(v[i]) > max_e_;
    if (!any) return;
    for (std::size_t i = 0; i < p.len; ++i)
      if (!(std::fabs(v[i]) <= max_e_) && !std::isnan(v[i])) {
        QuantCounts one;
        (void)encode(v[i], s_.element, call_.index_offset + p.begin + i, &one);
        if (one.overflow) {
          saturated_.push_back(p.group);
          return;
        }
      }
  }

 public:
  std::vector<std::size_t> saturated_;

 private:
  const ScaledSpec& s_;
  const ScaledOut& out_;
  const ScaledCall& call_;
  bool count_;
  float max_e_;
  detail::Params p_;  // the element kernel's parameters
  std::size_t fused_block_ = 0;
  const float* unit_ = nullptr;  // by scale code: its value without the tensor scale (without_tensor_scale)
  std::uint16_t* bf16_to_ = nullptr;  // send_bf16_to's buffer, or null: out_.bf16
  std::size_t bf16_first_ = 0;
  std::vector<float> v_, q_, before_, after_, candidates_;
  std::vector<FastFourOverSix::Candidate> six_, four_;  // Four Over Six's candidates (decide_blocks)
  std::vector<std::uint32_t> codes_, tops_;
  std::vector<std::uint8_t> hot_;
};

struct Shared {
  std::mutex m;
  ScaledCounts counts;
  std::vector<std::size_t> saturated;  // groups, possibly listed more than once
  float amax = 0;
  std::uint32_t dropped = 0;
  void add(Worker& w, float amax_part) {
    std::lock_guard<std::mutex> lk(m);
    counts += w.counts;
    dropped |= w.dropped;
    saturated.insert(saturated.end(), w.saturated_.begin(), w.saturated_.end());
    amax = std::max(amax, amax_part);
  }
};

// amax_of on the SIMD maximum of the magnitude bits (the scalar loop only where some value
// is NaN or Inf).
Amax simd_amax(const float* x, std::size_t n) {
  const std::uint32_t top = MagnitudeTop(x, n);
  if (top < 0x7F800000u) return Amax{std::bit_cast<float>(top), false};
  return amax_of(x, n);
}

// Largest finite |x| and non-finite flag of every group (pass 1, for groups that span
// rows or a whole row).
std::vector<Amax> group_amaxes(const Runner& run, const float* x, const BlockLayout& l) {
  std::vector<Amax> result(l.groups());
  std::mutex m;
  run.parallel_for(l.rows * l.cols, l.cols, [&](std::size_t b, std::size_t e) {
    std::vector<Amax> part(l.groups());
    for (std::size_t r = b / l.cols; r < e / l.cols; ++r)
      for (std::size_t gc = 0; gc < l.grid_cols(); ++gc) {
        const std::size_t c0 = gc * l.block_cols, c1 = std::min(l.cols, c0 + l.block_cols);
        const Amax a = simd_amax(x + r * l.cols + c0, c1 - c0);
        Amax& t = part[(r / l.block_rows) * l.grid_cols() + gc];
        t.value = std::max(t.value, a.value);
        t.nonfinite |= a.nonfinite;
      }
    std::lock_guard<std::mutex> lk(m);
    for (std::size_t g = 0; g < part.size(); ++g) {
      result[g].value = std::max(result[g].value, part[g].value);
      result[g].nonfinite |= part[g].nonfinite;
    }
  });
  return result;
}

// The tensor's largest finite magnitude.
float largest_finite(const Runner& run, const float* x, std::size_t n) {
  std::mutex m;
  float result = 0;
  run.parallel_for(n, kChunk, [&](std::size_t b, std::size_t e) {
    const float part = simd_amax(x + b, e - b).value;
    std::lock_guard<std::mutex> lk(m);
    result = std::max(result, part);
  });
  return result;
}

// The largest magnitude bits of every block of `block` values (n a multiple of it).
std::vector<std::uint32_t> all_block_tops(const Runner& run, const float* x, std::size_t n, std::size_t block) {
  std::vector<std::uint32_t> tops(n / block);
  run.parallel_for(n, block, [&](std::size_t b, std::size_t e) {
    BlockTops(x + b, (e - b) / block, block, tops.data() + b / block, true);
  });
  return tops;
}

// The largest finite magnitude of blocks whose largest magnitude bits are `tops`.
float largest_finite(const float* x, std::size_t block, const std::vector<std::uint32_t>& tops) {
  std::uint32_t top = 0;
  for (const std::uint32_t t : tops) top = std::max(top, t);
  if (top < 0x7F800000u) return std::bit_cast<float>(top);
  float result = 0;  // some block holds NaN or Inf
  for (std::size_t k = 0; k < tops.size(); ++k)
    result = std::max(result, tops[k] < 0x7F800000u ? std::bit_cast<float>(tops[k]) : amax_of(x + k * block, block).value);
  return result;
}

}  // namespace

namespace {

// The fast scale paths, at most one of them enabled for a spec: E8M0 from the bits of the
// largest magnitude, UE4M3 from the ScaleSteps table, float32 scales.
struct FastScales {
  FastPow2 pow2;
  FastSteps steps;
  FastF32 f32;
  FastFourOverSix four_over_six;
  FastScales(const ScaledSpec& s, float tensor_scale)
      : pow2(s), steps(s, tensor_scale), f32(s), four_over_six(s, tensor_scale) {}
  // A block's scale from its largest magnitude's bits where a fast path decides it.
  std::optional<BlockScale> decide(std::uint32_t top) const {
    if (pow2.enabled()) return pow2.decide(top);
    if (steps.enabled()) return steps.decide(top);
    if (f32.enabled()) return f32.decide(top);
    return std::nullopt;
  }
};

// One call of scaled_quantize, in its steps (run): the amaxes a scale needs first, the
// tensor scale, the scales of groups that span rows, one pass over the elements, the
// counts. Every pass splits the work with the runner and gathers into `shared_`.
// `transposed`: x holds the matrix's transpose, [cols, rows] row-major (only where
// reads_transposed() holds).
class ScaledPass {
 public:
  ScaledPass(const float* x, std::size_t rows, std::size_t cols, const ScaledSpec& s, const ScaledOut& out,
             const ScaledCall& call, bool count, const Runner& run, bool transposed = false,
             Bf16Layout bf16_layout = Bf16Layout::matrix)
      : run_(run),
        x_(x), rows_(rows), cols_(cols), n_(rows * cols), s_(s), out_(out), call_(call), count_(count),
        transposed_(transposed), bf16_as_input_(out.bf16 && bf16_layout == Bf16Layout::input),
        l_(block_layout(s, rows, cols)), per_block_(s.granularity == Granularity::block),
        fused_block_(!per_block_                     ? 0
                     : cols <= l_.block_cols         ? cols
                     : cols % l_.block_cols == 0     ? l_.block_cols
                                                     : 0) {}

  // Whether the pass can read the matrix from its transpose: 1xK blocks whose rows are whole
  // blocks (or shorter than one), the case of the element pass that works block by block.
  bool reads_transposed() const { return per_block_ && fused_block_ != 0; }

  // The tensor's amax (scaled_quantize's result); adds the counts to `counts`.
  float run(ScaledCounts* counts) {
    prepare();
    quantize_elements();
    return finish(counts);
  }

  // Both forms of one matrix in one read (scaled_quantize_both): this pass quantizes x_
  // [rows_, cols_] along its rows, `t` the same memory read as the transpose of its matrix
  // ([cols_, rows_]). Where both work block by block on the same fast scale path, each strip
  // of rows of x_ is quantized by this pass, then transposed in cache for `t`; else the two
  // passes run one after the other. Returns both amaxes; adds each pass's counts to its own.
  std::pair<float, float> run_both(ScaledPass& t, ScaledCounts* counts, ScaledCounts* t_counts) {
    prepare();
    t.prepare(amax_before_elements());
    const FastScales fast(s_, ts_.value), t_fast(t.s_, t.ts_.value);
    const bool joint = fused_block_ != 0 && !transposed_ && t.transposed_ && t.reads_transposed() &&
                       t.x_ == x_ && t.rows_ == cols_ && t.cols_ == rows_;
    if (joint && fast.pow2.enabled() && t_fast.pow2.enabled()) joint_blocks(t, fast.pow2, t_fast.pow2);
    else if (joint && fast.steps.enabled() && t_fast.steps.enabled()) joint_blocks(t, fast.steps, t_fast.steps);
    else if (joint && fast.f32.enabled() && t_fast.f32.enabled()) joint_blocks(t, fast.f32, t_fast.f32);
    else {
      quantize_elements();
      t.quantize_elements();
    }
    const float amax = finish(counts);
    return {amax, t.finish(t_counts)};
  }

  // The tensor's amax, where the pass finds it before the elements (a tensor scale or an
  // amax history): a pass over the same values along the other axis needs no pass of its own.
  std::optional<float> amax_before_elements() const {
    if (per_block_ && (s_.tensor_scale || s_.history > 0)) return current_;
    return std::nullopt;
  }

 private:
  // What the element pass needs first: the amaxes, the tensor scale, the scales of groups
  // that span rows.
  // `known`: the tensor's amax where the caller has it (else call_.known_amax).
  void prepare(std::optional<float> known = std::nullopt) {
    find_amaxes(known ? known : call_.known_amax);
    const bool delayed = s_.history > 0 && call_.delayed_amax && *call_.delayed_amax > 0;
    const float tensor_amax = delayed ? *call_.delayed_amax : current_;
    ts_ = tensor_scale_for(s_, tensor_amax);
    if (out_.tensor_scale) *out_.tensor_scale = ts_.value;
    if (!per_block_) scale_spanning_groups(delayed && s_.granularity == Granularity::tensor, tensor_amax);
  }

  // After the element pass: the amax, the counts, whether the bfloat16 form is exact.
  float finish(ScaledCounts* counts) {
    if (per_block_ && !s_.tensor_scale && s_.history == 0) current_ = shared_.amax;
    std::sort(shared_.saturated.begin(), shared_.saturated.end());
    shared_.counts.saturated_groups =
        std::unique(shared_.saturated.begin(), shared_.saturated.end()) - shared_.saturated.begin();
    if (counts) *counts += shared_.counts;
    if (out_.bf16_exact) *out_.bf16_exact = shared_.dropped == 0;
    return current_;
  }

  // Pass 1 where a scale needs it: the amaxes of groups that span rows or whole rows, or the
  // tensor's amax (from the blocks' largest magnitudes where rows are whole blocks) when
  // blocks take a tensor scale or keep an amax history.
  void find_amaxes(std::optional<float> known_amax) {
    if (!per_block_) {
      amaxes_ = group_amaxes(run_, x_, l_);
      for (const Amax& a : amaxes_) current_ = std::max(current_, a.value);
    } else if (s_.tensor_scale || s_.history > 0) {
      if (known_amax) {
        current_ = *known_amax;
      } else if (fused_block_ != 0 && !transposed_) {
        tops_ = all_block_tops(run_, x_, n_, fused_block_);
        current_ = largest_finite(x_, fused_block_, tops_);
      } else {
        current_ = largest_finite(run_, x_, n_);
      }
    }
  }

  void scale_spanning_groups(bool from_history, float tensor_amax) {
    for (std::size_t g = 0; g < amaxes_.size(); ++g) {
      const std::size_t r0 = g / l_.grid_cols() * l_.block_rows, c0 = g % l_.grid_cols() * l_.block_cols;
      const GroupValues values{x_ + r0 * cols_ + c0, std::min(l_.block_rows, rows_ - r0),
                               std::min(l_.block_cols, cols_ - c0), cols_, call_.index_offset + r0 * cols_ + c0,
                               cols_};
      const GroupScale gs = scale_group(s_, amaxes_[g], ts_, &shared_.counts,
                                        from_history ? std::optional<float>(tensor_amax) : std::nullopt, &values);
      group_scalings_.push_back(scaling_of(s_, gs));
      if (out_.scale_codes) out_.scale_codes[g] = gs.code;
    }
  }

  // The element pass: rows of whole blocks on a fast scale path, one scale for everything,
  // or chunks of pieces (the general case).
  void quantize_elements() {
    const FastScales fast(s_, ts_.value);
    if (transposed_) {
      if (fast.steps.enabled()) transposed_blocks(fast.steps);
      else if (fast.f32.enabled()) transposed_blocks(fast.f32);
      else if (fast.four_over_six.enabled()) transposed_blocks(fast.four_over_six);
      else transposed_blocks(fast.pow2);  // where it is not enabled either, every block takes the general path
      return;
    }
    if (fused_block_ != 0 && fast.pow2.enabled()) whole_blocks(fast.pow2);
    else if (fused_block_ != 0 && fast.steps.enabled()) whole_blocks(fast.steps);
    else if (fused_block_ != 0 && fast.f32.enabled()) whole_blocks(fast.f32);
    else if (fused_block_ != 0 && fast.four_over_six.enabled()) whole_blocks(fast.four_over_six);
    else if (s_.granularity == Granularity::tensor) uniform();
    else run_.parallel_for(n_, 1, [&](std::size_t b, std::size_t e) { chunks(b, e, fast); });
  }

  // The pieces of a worker's chunks, run once about kChunk elements have gathered.
  struct Gathered {
    std::vector<Piece> pieces;
    std::vector<Scaling> scalings;
    std::size_t pending = 0;
    float part_amax = 0;
    void flush(Worker& w, Input x) {
      if (!pieces.empty()) w.run(x, pieces, scalings);
      pieces.clear();
      scalings.clear();
      pending = 0;
    }
  };

  // Rows of whole blocks with a fast scale path: chunks of whole blocks, group = flat / block.
  template <class Fast>
  void whole_blocks(const Fast& fast) {
    const std::size_t B = fused_block_, per_chunk = std::max<std::size_t>(1, kChunk / B);
    run_.parallel_for(n_, B, [&](std::size_t b, std::size_t e) {
      Worker w(s_, out_, call_, count_, fused_block_);
      Gathered g;
      for (std::size_t k0 = b / B; k0 < e / B; k0 += per_chunk) {
        const std::size_t count = std::min(per_chunk, e / B - k0);
        if (!w.run_fast_blocks(x_, k0 * B, count, fast, out_.scale_codes, g.part_amax,
                               tops_.empty() ? nullptr : &tops_[k0]))
          general_blocks(w, x_, k0 * B, count, g);
      }
      shared_.add(w, g.part_amax);
    });
  }

  // `count` whole blocks from flat offset `begin`, each scaled from its amax: the general
  // path, where a fast one does not decide every block of a chunk.
  void general_blocks(Worker& w, Input x, std::size_t begin, std::size_t count, Gathered& g) {
    const std::size_t B = fused_block_;
    for (std::size_t at = begin; at < begin + count * B; at += B) {
      const Amax a = amax_of(x.at(at), B);
      g.part_amax = std::max(g.part_amax, a.value);
      const GroupValues values{x.at(at), 1, B, B, call_.index_offset + at, 0};
      const GroupScale gs = scale_group(s_, a, ts_, &w.counts, std::nullopt, &values);
      if (out_.scale_codes) out_.scale_codes[at / B] = gs.code;
      g.pieces.push_back({at, B, at / B});
      g.scalings.push_back(scaling_of(s_, gs));
    }
    g.flush(w, x);
  }

  // The element pass reading the matrix from its transpose x_ ([cols_, rows_]): tiles of up
  // to kTileRows rows and about kChunk elements are copied out of it transposed, into a buffer
  // that stays in cache, and each row of a tile is quantized as whole_blocks quantizes a chunk
  // (groups and stochastic-rounding indices by flat offset in the matrix, as there).
  template <class Fast>
  void transposed_blocks(const Fast& fast) {
    constexpr std::size_t kTileRows = 16;
    const std::size_t B = fused_block_, tr = std::min(rows_, kTileRows);
    const std::size_t tc = cols_ <= B ? cols_ : std::max(B, kChunk / tr / B * B);
    const std::size_t grid_r = (rows_ + tr - 1) / tr, grid_c = (cols_ + tc - 1) / tc;
    run_.parallel_for(grid_r * grid_c * kChunk, kChunk, [&](std::size_t b, std::size_t e) {
      Worker w(s_, out_, call_, count_, fused_block_);
      Gathered g;
      std::vector<float> tile(tr * tc);
      std::vector<std::uint16_t> tile16(bf16_as_input_ ? tr * tc : 0);
      for (std::size_t t = b / kChunk; t < e / kChunk; ++t) {
        // Tiles down the rows first: consecutive tiles read on along the same lines of x_.
        const std::size_t r0 = t % grid_r * tr, c0 = t / grid_r * tc;
        transposed_tile(w, g, fast, r0, std::min(rows_, r0 + tr), c0, std::min(cols_, c0 + tc), tile, tile16);
      }
      shared_.add(w, g.part_amax);
    });
  }

  // Rows [r0, r1) and columns [c0, c1) of the matrix (c1 - c0 whole blocks, or the rows' only
  // block), copied out of x_ transposed into `tile` and quantized row by row there.
  template <class Fast>
  void transposed_tile(Worker& w, Gathered& g, const Fast& fast, std::size_t r0, std::size_t r1, std::size_t c0,
                       std::size_t c1, std::vector<float>& tile, std::vector<std::uint16_t>& tile16) {
    const std::size_t B = fused_block_, w_c = c1 - c0;
    TransposeTile(x_ + c0 * rows_ + r0, rows_, tile.data(), w_c, r1 - r0, w_c);
    for (std::size_t r = r0; r < r1; ++r) {
      const Input row(tile.data() + (r - r0) * w_c, r * cols_ + c0);
      if (bf16_as_input_) w.send_bf16_to(tile16.data() + (r - r0) * w_c, r * cols_ + c0);
      if (!w.run_fast_blocks(row, r * cols_ + c0, w_c / B, fast, out_.scale_codes, g.part_amax, nullptr))
        general_blocks(w, row, r * cols_ + c0, w_c / B, g);
    }
    if (bf16_as_input_)  // back to x_'s layout: out_.bf16[c * rows_ + r]
      for (std::size_t c = c0; c < c1; ++c)
        for (std::size_t r = r0; r < r1; ++r) out_.bf16[c * rows_ + r] = tile16[(r - r0) * w_c + (c - c0)];
  }

  // run_both's joint element pass: strips of rows of x_ (t's tiles' columns: whole blocks of
  // t), each quantized here chunk by chunk as whole_blocks does, then, while in cache, t's
  // tiles over the same rows, as t.transposed_blocks does. Groups, indices and counts are
  // each pass's own, so the outputs are the two passes' run one after the other, bit for bit.
  template <class Fast>
  void joint_blocks(ScaledPass& t, const Fast& fast, const Fast& t_fast) {
    constexpr std::size_t kTileRows = 16;
    const std::size_t B = fused_block_, per_chunk = std::max<std::size_t>(1, kChunk / B);
    const std::size_t tB = t.fused_block_, tr = std::min(t.rows_, kTileRows);
    const std::size_t strip = t.cols_ <= tB ? t.cols_ : std::max(tB, kChunk / tr / tB * tB);  // rows of x_
    const std::size_t strips = (rows_ + strip - 1) / strip;
    run_.parallel_for(strips * kChunk, kChunk, [&](std::size_t b, std::size_t e) {
      Worker w(s_, out_, call_, count_, fused_block_), tw(t.s_, t.out_, t.call_, t.count_, t.fused_block_);
      Gathered g, tg;
      std::vector<float> tile(tr * strip);
      std::vector<std::uint16_t> tile16(t.bf16_as_input_ ? tr * strip : 0);
      for (std::size_t k = b / kChunk; k < e / kChunk; ++k) {
        const std::size_t p0 = k * strip, p1 = std::min(rows_, p0 + strip);
        const std::size_t first = p0 * cols_ / B, last = p1 * cols_ / B;  // this pass's blocks
        for (std::size_t k0 = first; k0 < last; k0 += per_chunk) {
          const std::size_t count = std::min(per_chunk, last - k0);
          if (!w.run_fast_blocks(x_, k0 * B, count, fast, out_.scale_codes, g.part_amax,
                                 tops_.empty() ? nullptr : &tops_[k0]))
            general_blocks(w, x_, k0 * B, count, g);
        }
        for (std::size_t r0 = 0; r0 < t.rows_; r0 += tr)
          t.transposed_tile(tw, tg, t_fast, r0, std::min(t.rows_, r0 + tr), p0, p1, tile, tile16);
      }
      shared_.add(w, g.part_amax);
      t.shared_.add(tw, tg.part_amax);
    });
  }

  // One scale for everything: chunks of whole vectors in one pass each.
  void uniform() {
    run_.parallel_for(n_, kChunk, [&](std::size_t b, std::size_t e) {
      Worker w(s_, out_, call_, count_);
      for (std::size_t c = b; c < e; c += kChunk) w.run_uniform(x_, c, std::min(kChunk, e - c), group_scalings_[0], 0);
      shared_.add(w, 0);
    });
  }

  // Every chunk whose first element lies in [b, e): whole blocks of one row, at most kChunk
  // elements (or one block when longer). Short rows' chunks are gathered (they lie back to
  // back) so that the element kernel runs on about kChunk elements at a time, whatever the
  // row length.
  void chunks(std::size_t b, std::size_t e, const FastScales& fast) {
    const std::size_t chunk = per_block_ ? std::max(l_.block_cols, kChunk / l_.block_cols * l_.block_cols) : kChunk;
    const std::size_t per_row = (cols_ + chunk - 1) / chunk;
    Worker w(s_, out_, call_, count_, fused_block_);
    Gathered g;
    for (std::size_t r = b / cols_; r < rows_ && r * cols_ < e; ++r)
      for (std::size_t k = 0; k < per_row; ++k) {
        const std::size_t c0 = k * chunk, start = r * cols_ + c0;
        if (start < b || start >= e) continue;
        const std::size_t c1 = std::min(cols_, c0 + chunk);
        for (std::size_t c = c0; c < c1;) c = add_piece(r, c, c1, fast, w, g);
        g.pending += c1 - c0;
        if (g.pending >= kChunk) g.flush(w, x_);
      }
    g.flush(w, x_);
    shared_.add(w, g.part_amax);
  }

  // The piece of row `r` from column `c` to the end of its group or `c1`, with its scaling
  // (a block's decided from its bits where a fast path can, else from its amax); returns
  // where the next piece starts.
  std::size_t add_piece(std::size_t r, std::size_t c, std::size_t c1, const FastScales& fast, Worker& w, Gathered& g) {
    const std::size_t gc = c / l_.block_cols, cend = std::min(c1, (gc + 1) * l_.block_cols);
    const std::size_t group = (r / l_.block_rows) * l_.grid_cols() + gc;
    g.pieces.push_back({r * cols_ + c, cend - c, group});
    if (!per_block_) {
      g.scalings.push_back(group_scalings_[group]);
      return cend;
    }
    const float* xb = x_ + r * cols_ + c;
    const std::uint32_t top = MagnitudeTop(xb, cend - c);  // largest magnitude's bits
    const auto d = fast.decide(top);
    if (d && !d->zero) {  // the common case, decided from the bits (a zero block: its GroupScale below)
      ++w.counts.groups;
      w.counts.scale_overflow += d->overflow;
      g.part_amax = std::max(g.part_amax, std::bit_cast<float>(top));
      if (out_.scale_codes) out_.scale_codes[group] = d->code;
      g.scalings.push_back(scaling_of(*d, fast.pow2.enabled()));
    } else {
      const Amax a = amax_of(xb, cend - c);
      g.part_amax = std::max(g.part_amax, a.value);
      const GroupValues values{xb, 1, cend - c, cend - c, call_.index_offset + r * cols_ + c, 0};
      const GroupScale gs = scale_group(s_, a, ts_, &w.counts, std::nullopt, &values);
      if (out_.scale_codes) out_.scale_codes[group] = gs.code;
      g.scalings.push_back(scaling_of(s_, gs));
    }
    return cend;
  }

  const Runner& run_;
  const float* x_;
  std::size_t rows_, cols_, n_;
  const ScaledSpec& s_;
  const ScaledOut& out_;
  const ScaledCall& call_;
  bool count_;
  bool transposed_;
  bool bf16_as_input_;  // the bfloat16 form in x_'s layout: each tile's transposed back
  BlockLayout l_;
  bool per_block_;
  std::size_t fused_block_;  // rows of whole blocks (or rows shorter than a block): the block; else 0
  std::vector<Amax> amaxes_;           // of groups that span rows or whole rows
  std::vector<std::uint32_t> tops_;    // of every block, where pass 1 took the tensor's amax from them
  std::vector<Scaling> group_scalings_;  // of groups that span rows or whole rows
  float current_ = 0;                  // the tensor's amax
  TensorScale ts_;                     // the tensor scale
  Shared shared_;
};

}  // namespace

// scaled_quantize for this target (the checks are the caller's).
// MS-EDEN (docs/spec.md §6.13): the quartet arithmetic's quantization without the correction
// (codes and scales, into buffers where the caller wants none), then eden_correct_rows on
// parts of the rows (a window never spans two).
float EdenQuantize(const float* x, std::size_t rows, std::size_t cols, const ScaledSpec& s, const ScaledOut& out,
                   const ScaledCall& call, ScaledCounts* counts, const Runner& run) {
  std::vector<std::uint8_t> own_codes(out.codes ? 0 : rows * cols);
  std::vector<std::uint32_t> own_scales(out.scale_codes ? 0 : block_layout(s, rows, cols).groups());
  float ts = 1;
  ScaledOut first;
  first.codes = out.codes ? out.codes : own_codes.data();
  first.scale_codes = out.scale_codes ? out.scale_codes : own_scales.data();
  first.tensor_scale = &ts;
  const float amax = ScaledPass(x, rows, cols, s, first, call, counts != nullptr, run).run(counts);
  if (out.tensor_scale) *out.tensor_scale = ts;
  std::mutex m;
  ScaledCounts total;
  std::atomic<bool> exact{true};
  run.parallel_for(rows * cols, cols, [&](std::size_t b, std::size_t e) {
    ScaledCounts part;
    if (!eden_correct_rows(x, b / cols, e / cols, cols, s, ts, first.codes, first.scale_codes, out, call, &part))
      exact.store(false);
    const std::lock_guard<std::mutex> lock(m);
    total += part;
  });
  if (counts) *counts += total;
  if (out.bf16_exact) *out.bf16_exact = exact.load();
  return amax;
}

float ScaledQuantize(const float* x, std::size_t rows, std::size_t cols, const ScaledSpec& s, const ScaledOut& out,
                     const ScaledCall& call, ScaledCounts* counts, const Runner& run) {
  if (s.eden != 0) return EdenQuantize(x, rows, cols, s, out, call, counts, run);
  return ScaledPass(x, rows, cols, s, out, call, counts != nullptr, run).run(counts);
}

// The bfloat16 top halves of the float32 tile [rows, cols] (row-major) stored transposed:
// element (r, c) at yt[c * yt_stride + r]; `scratch` holds rows * cols floats. Returns the
// OR of the dropped bottom halves.
std::uint32_t StoreTransposedBf16(const float* tile, std::size_t rows, std::size_t cols, std::uint16_t* yt,
                                  std::size_t yt_stride, float* scratch) {
  TransposeTile(tile, cols, scratch, rows, cols, rows);
  if (yt_stride == rows) return TopHalves(scratch, yt, rows * cols);
  std::uint32_t dropped = 0;
  for (std::size_t c = 0; c < cols; ++c) dropped |= TopHalves(scratch + c * rows, yt + c * yt_stride, rows);
  return dropped;
}

// scaled_quantize_transposed for this target: tiles of xt where the pass can read them (not
// under MS-EDEN, whose correction reads the matrix), else a transposed copy first.
float ScaledQuantizeTransposed(const float* xt, std::size_t rows, std::size_t cols, const ScaledSpec& s,
                               const ScaledOut& out, const ScaledCall& call, ScaledCounts* counts, const Runner& run,
                               Bf16Layout bf16_layout) {
  if (s.eden == 0) {
    ScaledPass pass(xt, rows, cols, s, out, call, counts != nullptr, run, true, bf16_layout);
    if (pass.reads_transposed()) return pass.run(counts);
  }
  std::vector<float> x(rows * cols);
  run.parallel_for(rows * cols, cols, [&](std::size_t b, std::size_t e) {
    TransposeTile(xt + b / cols, rows, x.data() + b, cols, (e - b) / cols, cols);
  });
  if (!out.bf16 || bf16_layout == Bf16Layout::matrix) return ScaledQuantize(x.data(), rows, cols, s, out, call, counts, run);
  std::vector<std::uint16_t> b16(rows * cols);  // the matrix's form, then transposed into out.bf16
  ScaledOut to_matrix = out;
  to_matrix.bf16 = b16.data();
  const float amax = ScaledQuantize(x.data(), rows, cols, s, to_matrix, call, counts, run);
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t c = 0; c < cols; ++c) out.bf16[c * rows + r] = b16[r * cols + c];
  return amax;
}

// scaled_quantize_both for this target.
std::pair<float, float> ScaledQuantizeBoth(const float* x, std::size_t rows, std::size_t cols, const ScaledSpec& s,
                                           const ScaledOut& out, const ScaledCall& call, ScaledCounts* counts,
                                           const ScaledSpec& t_s, const ScaledOut& t_out, const ScaledCall& t_call,
                                           ScaledCounts* t_counts, const Runner& run, Bf16Layout t_bf16_layout) {
  // The transposed form by its own call (a copy, or MS-EDEN's correction), after the first's.
  const auto then_transposed = [&](float amax) {
    ScaledCall same = t_call;
    same.known_amax = amax;
    return std::pair<float, float>{amax,
                                   ScaledQuantizeTransposed(x, cols, rows, t_s, t_out, same, t_counts, run, t_bf16_layout)};
  };
  if (s.eden != 0) return then_transposed(EdenQuantize(x, rows, cols, s, out, call, counts, run));
  ScaledPass pass(x, rows, cols, s, out, call, counts != nullptr, run);
  ScaledPass probe(x, cols, rows, t_s, t_out, t_call, t_counts != nullptr, run, true, t_bf16_layout);
  if (!probe.reads_transposed()) return then_transposed(pass.run(counts));
  return pass.run_both(probe, counts, t_counts);
}

}  // namespace fp8lab::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace fp8lab::kernels {

HWY_EXPORT(ScaledQuantize);
HWY_EXPORT(ScaledQuantizeTransposed);
HWY_EXPORT(ScaledQuantizeBoth);
HWY_EXPORT(StoreTransposedBf16);
using detail::power_of_two;

namespace {
// The checks of both entry points: false where there is nothing to quantize (the outputs
// of an empty matrix are then written).
bool check_scaled_call(const char* what, const ScaledSpec& s, std::size_t rows, std::size_t cols,
                       const ScaledOut& out, const ScaledCall& call, ScaledCounts* counts) {
  validate(s);
  if (!s.scaled())
    throw Error(std::string(what) + ": '" + to_string(s) +
                "' has no scale (a fixed-bias format); quantize it with kernels::quantize");
  if (rows * cols != 0) return true;
  if (out.bf16_exact) *out.bf16_exact = true;
  (void)scaled_quantize_reference(nullptr, rows, cols, s, out, call, counts);
  return false;
}

}  // namespace

float scaled_quantize(const float* x, std::size_t rows, std::size_t cols, const ScaledSpec& s,
                      const ScaledOut& out, const ScaledCall& call, ScaledCounts* counts, const Runner& run) {
  if (!check_scaled_call("scaled_quantize", s, rows, cols, out, call, counts)) return 0;
  return HWY_DYNAMIC_DISPATCH(ScaledQuantize)(x, rows, cols, s, out, call, counts, run);
}

float scaled_quantize_transposed(const float* xt, std::size_t rows, std::size_t cols, const ScaledSpec& s,
                                 const ScaledOut& out, const ScaledCall& call, ScaledCounts* counts,
                                 const Runner& run, Bf16Layout bf16_layout) {
  if (!check_scaled_call("scaled_quantize_transposed", s, rows, cols, out, call, counts)) return 0;
  return HWY_DYNAMIC_DISPATCH(ScaledQuantizeTransposed)(xt, rows, cols, s, out, call, counts, run, bf16_layout);
}

std::pair<float, float> scaled_quantize_both(const float* x, std::size_t rows, std::size_t cols, const ScaledSpec& s,
                                             const ScaledOut& out, const ScaledCall& call, ScaledCounts* counts,
                                             const ScaledSpec& t_s, const ScaledOut& t_out, const ScaledCall& t_call,
                                             ScaledCounts* t_counts, const Runner& run, Bf16Layout t_bf16_layout) {
  ScaledSpec same_seed = t_s;
  same_seed.element.seed = s.element.seed;
  if (!(same_seed == s))
    throw Error("scaled_quantize_both: the two forms' specs differ beyond their seeds ('" + to_string(s) + "', '" +
                to_string(t_s) + "')");
  const bool some = check_scaled_call("scaled_quantize_both", s, rows, cols, out, call, counts);
  if (!check_scaled_call("scaled_quantize_both", t_s, cols, rows, t_out, t_call, t_counts) || !some) return {0.0f, 0.0f};
  return HWY_DYNAMIC_DISPATCH(ScaledQuantizeBoth)(x, rows, cols, s, out, call, counts, t_s, t_out, t_call, t_counts,
                                                  run, t_bf16_layout);
}

namespace {

// The factor of every group, once: the scale (2^exponent for E8M0) or NaN.
std::vector<float> group_factors(const ScaledSpec& s, const std::uint32_t* scale_codes, float tensor_scale,
                                 const BlockLayout& l) {
  std::vector<float> factor(l.groups());
  for (std::size_t g = 0; g < factor.size(); ++g) {
    const GroupScale gs = scale_from_code(s, scale_codes[g], tensor_scale);
    factor[g] = gs.nan              ? std::numeric_limits<float>::quiet_NaN()
                : power_of_two(s)   ? std::ldexp(1.0f, gs.exponent)
                : s.eden != 0       ? scale_from_code(s, scale_codes[g], 1.0f).value  // times ts after
                                    : gs.value;
  }
  return factor;
}

// Every row of a scaled decode, decoded by the element kernel and multiplied by its groups'
// factors, then handed to done(r, row). Rows go to y + r * cols, or, where y is null, through
// a buffer of one row owned by each part of the loop (converted by done while in cache).
template <class Done>
void decode_rows(const std::uint8_t* codes, const std::uint32_t* scale_codes, float tensor_scale, std::size_t rows,
                 std::size_t cols, const ScaledSpec& s, const Runner& run, float* y, const Done& done) {
  const Format& e = s.element.format;
  const BlockLayout l = block_layout(s, rows, cols);
  const std::vector<float> factor = group_factors(s, scale_codes, tensor_scale, l);
  const Runner serial = Runner::serial();  // a part's rows, on its thread
  run.parallel_for(rows * cols, cols, [&](std::size_t b, std::size_t end) {
    std::vector<float> buffer(y == nullptr ? cols : 0);
    for (std::size_t r = b / cols; r < end / cols; ++r) {
      float* yr = y == nullptr ? buffer.data() : y + r * cols;
      decode(codes + r * cols, yr, cols, e, serial);
      const float* f = factor.data() + (r / l.block_rows) * l.grid_cols();
      for (std::size_t gc = 0; gc < l.grid_cols(); ++gc) {
        const std::size_t c0 = gc * l.block_cols, c1 = std::min(cols, c0 + l.block_cols);
        const float fg = f[gc];
        if (std::isnan(fg)) {
          std::fill(yr + c0, yr + c1, fg);
        } else if (s.dither_scale) {  // fg = 2^e
          const int ex = std::ilogb(fg);
          for (std::size_t c = c0; c < c1; ++c) yr[c] = dither_value(yr[c], ex);
        } else if (s.eden != 0) {
          for (std::size_t c = c0; c < c1; ++c) yr[c] = quartet_value(yr[c], fg, tensor_scale);
        } else {
          for (std::size_t c = c0; c < c1; ++c) yr[c] *= fg;
        }
      }
      done(r, yr);
    }
  });
}

}  // namespace

bool scaled_decode_bf16(const std::uint8_t* codes, const std::uint32_t* scale_codes, float tensor_scale,
                        std::size_t rows, std::size_t cols, const ScaledSpec& s, std::uint16_t* y, const Runner& run) {
  if (s.dither_scale) return false;  // values divided by 3: not bfloat16 values in general
  validate(s);
  if (!s.scaled()) throw Error("scaled_decode_bf16: '" + to_string(s) + "' has no scale (a fixed-bias format)");
  if (rows * cols == 0) return true;
  std::atomic<bool> exact{true};
  decode_rows(codes, scale_codes, tensor_scale, rows, cols, s, run, nullptr,
              [&](std::size_t r, const float* row) {
                if (!to_bf16_exact(row, y + r * cols, cols, Runner::serial())) exact.store(false, std::memory_order_relaxed);
              });
  return exact.load();
}

bool scaled_decode_bf16_transposed(const std::uint8_t* codes, const std::uint32_t* scale_codes, float tensor_scale,
                                   std::size_t rows, std::size_t cols, const ScaledSpec& s, std::uint16_t* yt,
                                   const Runner& run) {
  if (s.dither_scale) return false;  // values divided by 3: not bfloat16 values in general
  validate(s);
  if (!s.scaled())
    throw Error("scaled_decode_bf16_transposed: '" + to_string(s) + "' has no scale (a fixed-bias format)");
  if (rows * cols == 0) return true;
  const Format& e = s.element.format;
  const BlockLayout l = block_layout(s, rows, cols);
  const std::vector<float> factor = group_factors(s, scale_codes, tensor_scale, l);
  // Tiles of kTileRows rows and kTileCols columns: decoded and scaled in cache, then stored
  // transposed (a run of up to kTileRows values per column).
  constexpr std::size_t kTileRows = 16, kTileCols = 256;
  const std::size_t grid_r = (rows + kTileRows - 1) / kTileRows, grid_c = (cols + kTileCols - 1) / kTileCols;
  std::atomic<std::uint32_t> dropped{0};
  const Runner serial = Runner::serial();
  run.parallel_for(grid_r * grid_c * 4096, 4096, [&](std::size_t b, std::size_t end) {
    std::vector<float> tile(kTileRows * kTileCols), scratch(kTileRows * kTileCols);
    std::uint32_t bits = 0;
    for (std::size_t t = b / 4096; t < end / 4096; ++t) {
      const std::size_t r0 = t % grid_r * kTileRows, r1 = std::min(rows, r0 + kTileRows);
      const std::size_t c0 = t / grid_r * kTileCols, c1 = std::min(cols, c0 + kTileCols), w = c1 - c0;
      for (std::size_t r = r0; r < r1; ++r) {
        float* yr = tile.data() + (r - r0) * w;
        decode(codes + r * cols + c0, yr, w, e, serial);
        const float* f = factor.data() + (r / l.block_rows) * l.grid_cols();
        for (std::size_t c = c0; c < c1;) {  // a group's run of columns at a time
          const std::size_t g = c / l.block_cols, g_end = std::min(c1, (g + 1) * l.block_cols);
          const float fg = f[g];
          float* y = yr + (c - c0);
          if (std::isnan(fg)) std::fill(y, y + (g_end - c), fg);
          else if (s.eden != 0)
            for (std::size_t i = 0; i < g_end - c; ++i) y[i] = quartet_value(y[i], fg, tensor_scale);
          else
            for (std::size_t i = 0; i < g_end - c; ++i) y[i] *= fg;
          c = g_end;
        }
      }
      bits |= HWY_DYNAMIC_DISPATCH(StoreTransposedBf16)(tile.data(), r1 - r0, w, yt + c0 * rows + r0, rows,
                                                        scratch.data());
    }
    dropped.fetch_or(bits, std::memory_order_relaxed);
  });
  return dropped.load() == 0;
}

void scaled_decode(const std::uint8_t* codes, const std::uint32_t* scale_codes, float tensor_scale,
                   std::size_t rows, std::size_t cols, const ScaledSpec& s, float* y, const Runner& run) {
  validate(s);
  const Format& e = s.element.format;
  if (rows * cols == 0) return;
  if (!s.scaled()) {
    run.parallel_for(rows * cols, 1, [&](std::size_t b, std::size_t end) {
      decode(codes + b, y + b, end - b, e, Runner::serial());
    });
    return;
  }
  decode_rows(codes, scale_codes, tensor_scale, rows, cols, s, run, y, [](std::size_t, const float*) {});
}

}  // namespace fp8lab::kernels
#endif  // HWY_ONCE
