// The element kernels' per-target code (Highway's -inl.h layout): included, once per
// target, by every unit that dispatches to them (quantize.cpp, scaled.cpp) after
// hwy/foreach_target.h. The arithmetic is the scalar codec's (src/core/codec.cpp) done on
// 32-bit lanes without normalising float32 subnormals: that is exact as long as the
// format's smallest normal exponent emin is >= -126 (then a float32 subnormal input always
// lies in the format's subnormal range, where only its distance to 0 matters). Formats
// outside that window, wider than 16 bits, without subnormals, unsigned or without zero
// (the scale formats, a small fraction of a block-scaled tensor), or reaching past
// float32's range use the scalar codec (see Params::fast).
//
// Per-target include guard, as Highway's own -inl.h files have it.
#if defined(FP8LAB_KERNELS_QUANTIZE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef FP8LAB_KERNELS_QUANTIZE_INL_H_
#undef FP8LAB_KERNELS_QUANTIZE_INL_H_
#else
#define FP8LAB_KERNELS_QUANTIZE_INL_H_
#endif

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "hwy/cache_control.h"
#include "hwy/highway.h"

#include "fp8lab/core/codec.hpp"
#include "fp8lab/core/random.hpp"
#include "fp8lab/core/scaled.hpp"

#ifndef FP8LAB_KERNELS_PARAMS_ONCE
#define FP8LAB_KERNELS_PARAMS_ONCE
namespace fp8lab::kernels::detail {

// Everything a kernel needs, derived once per call from the QuantSpec. Plain data.
struct Params {
  bool fast;                 // the SIMD path applies
  Rounding rounding;
  std::uint32_t M;           // mantissa bits
  std::uint32_t eminb;       // emin + 127: float32 biased exponent of the format's emin
  std::uint32_t max_code;    // largest finite magnitude code
  std::uint32_t code_sign_shift;  // 32 - width: moves the float sign bit to the code's
  bool unsigned_zero;        // fnuz: a zero result is +0
  // Overflow of a finite value: magnitude to store, or NaN/Inf.
  std::uint32_t ovf_mag;     // saturate (and finite formats in nan mode): max_code
  bool ovf_to_nan, ovf_to_inf;
  bool inf_to_nan, inf_to_inf;  // what an Inf input becomes (else +-max)
  std::uint32_t nan_base, nan_sign_mask;  // NaN code = nan_base | (sign & nan_sign_mask)
  std::uint32_t inf_mag;
  // Float32 bits of results.
  std::uint32_t max_bits;    // max finite
  std::uint32_t minsub_bits; // smallest subnormal 2^(emin - M)
  std::uint32_t fnan_sign_mask;  // fake quantization: sign kept on NaN (not for fnuz)
  std::uint32_t random_mask; // top R bits
  std::uint64_t seed;
  // The all-normal path: every lane at or above 2^emin rounds on the float bits directly.
  std::uint32_t min_normal_bits;  // float32 bits of 2^emin
  std::uint32_t S;                // 23 - M: float mantissa bits below the format's LSB
  std::uint32_t half_m1;          // 2^(S-1) - 1
  std::uint32_t low_mask;         // 2^S - 1
  std::uint32_t code_offset;      // (emin + 126) << M: float exponent field -> code field
  std::uint32_t sr_keep;          // stochastic: mask keeping the top K = min(R, S) fraction bits
  std::uint32_t sr_shift_r, sr_shift_l;  // random bits r >> (32 - K) << (S - K)
  // Nearest-even on a saturating format by float32 addition (RoundByAddition, which takes
  // precedence over `small`): the quantum's power of two C lies in float32's normal range
  // for every value up to the format's largest (2^(emin - M + 23) to 2^(emax + 23 - M)),
  // and no float32 subnormal can round to a nonzero value, so the result does not depend on
  // the caller's flush-to-zero or denormals-are-zero setting (docs/spec.md §2.2).
  bool by_addition;
  // Formats of at most 8 magnitudes (4-bit and smaller, M >= 1) under nearest-even or
  // toward-zero rounding: the magnitude code is the number of breakpoints at or below |x|,
  // its value a table look-up (no subnormal special case: most of an E2M1 block is subnormal).
  bool small;
  std::uint32_t small_above[8];  // code > k iff |x| bits > small_above[k] (k <= max_code; else ~0)
  std::uint32_t small_bits[16];  // float32 bits of magnitude code k (k <= max_code)
  // A finite overflow becomes +-max (neither NaN nor Inf).
  bool saturates() const { return !ovf_to_nan && !ovf_to_inf; }
};

// The smallest float32 bits of |x| whose magnitude code exceeds k under the codec's
// rounding (docs/spec.md §2): past the midpoint to the next value (at it for an odd k, the
// tie going to the even code), or at the next value when truncating. Above the largest
// code the next value is one quantum past it: 2^(ilogb(v) - M) in v's binade, or the fixed
// 2^(1 - bias - M) of a format without exponent bits (an integer grid, no binades).
inline std::uint32_t first_above(const Format& f, std::uint32_t k, Rounding r) {
  const double v = f.magnitude(k);
  const auto quantum = [&] { return f.exp_bits == 0 ? 1 - f.bias - f.man_bits : std::ilogb(v) - f.man_bits; };
  const double next = k < f.max_code() ? f.magnitude(k + 1) : v + std::ldexp(1.0, quantum());
  if (r == Rounding::toward_zero) return std::bit_cast<std::uint32_t>(static_cast<float>(next));
  const auto mid = std::bit_cast<std::uint32_t>(static_cast<float>((v + next) / 2));  // exact
  if (r == Rounding::nearest_away) return mid;  // every tie goes up
  return k % 2 == 1 ? mid : mid + 1;
}

inline Params make_params(const QuantSpec& q) {
  const Format& f = q.format;
  Params p{};
  p.rounding = q.rounding;
  p.M = static_cast<std::uint32_t>(f.man_bits);
  const int emin = f.emin();
  p.fast = f.codable() && f.subnormals && f.sign && f.zero && emin >= -126 &&
           f.max_finite() <= static_cast<double>(std::numeric_limits<float>::max());
  p.eminb = static_cast<std::uint32_t>(emin + 127);
  p.max_code = f.max_code();
  p.code_sign_shift = static_cast<std::uint32_t>(32 - f.width());
  p.unsigned_zero = !f.signed_zero();
  const bool nan_mode = q.overflow == Overflow::nan && f.has_nan();
  const bool inf_mode = q.overflow == Overflow::inf && f.has_inf();
  p.ovf_to_nan = nan_mode;
  p.ovf_to_inf = inf_mode;
  p.ovf_mag = p.max_code;
  p.inf_to_inf = f.has_inf();
  p.inf_to_nan = !f.has_inf() && f.has_nan();
  p.nan_base = f.has_nan() ? f.nan_code(false) : 0;
  p.nan_sign_mask = f.signed_nan() ? f.sign_bit() : 0;
  p.inf_mag = f.has_inf() ? f.inf_code(false) : 0;
  if (p.fast) {
    p.max_bits = std::bit_cast<std::uint32_t>(static_cast<float>(f.max_finite()));
    p.minsub_bits = std::bit_cast<std::uint32_t>(static_cast<float>(f.min_positive()));
  }
  p.fnan_sign_mask = f.policy == Policy::fnuz ? 0u : 0x80000000u;
  p.random_mask = ~0u << (32 - q.random_bits);
  if (p.fast) {
    p.min_normal_bits = p.eminb << 23;
    p.S = 23u - p.M;
    p.half_m1 = (1u << (p.S - 1)) - 1;
    p.low_mask = (1u << p.S) - 1;
    p.code_offset = (p.eminb - 1) << p.M;
    const std::uint32_t K = std::min<std::uint32_t>(q.random_bits, p.S);
    p.sr_keep = ~((1u << (p.S - K)) - 1);
    p.sr_shift_r = 32 - K;
    p.sr_shift_l = p.S - K;
  }
  p.by_addition = p.fast && p.saturates() && q.rounding == Rounding::nearest_even && emin - f.man_bits >= -125 &&
                  std::ilogb(f.max_finite()) + 23 - f.man_bits <= 127;
  p.small = p.fast && f.man_bits >= 1 && p.max_code <= 7 && q.rounding != Rounding::stochastic;
  for (std::uint32_t k = 0; k < 8; ++k) p.small_above[k] = ~0u;
  for (std::uint32_t k = 0; k < 16; ++k) p.small_bits[k] = 0;
  if (p.small)
    for (std::uint32_t k = 0; k <= p.max_code; ++k) {
      p.small_above[k] = first_above(f, k, q.rounding) - 1;
      p.small_bits[k] = std::bit_cast<std::uint32_t>(static_cast<float>(f.magnitude(k)));
    }
  p.seed = q.seed;
  return p;
}

}  // namespace fp8lab::kernels::detail
#endif

HWY_BEFORE_NAMESPACE();
namespace fp8lab::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using detail::Params;

using D32 = hn::ScalableTag<std::uint32_t>;
using V32 = hn::Vec<D32>;

// Per-lane random bits: hash32(hash32(i ^ k0) ^ k1), as fp8lab::random_bits.
HWY_INLINE V32 Hash32(D32 d, V32 x) {
  x = hn::Xor(x, hn::ShiftRight<16>(x));
  x = hn::Mul(x, hn::Set(d, 0x7feb352du));
  x = hn::Xor(x, hn::ShiftRight<15>(x));
  x = hn::Mul(x, hn::Set(d, 0x846ca68bu));
  return hn::Xor(x, hn::ShiftRight<16>(x));
}

struct Lanes {
  V32 code;   // full code (sign included)
  V32 fbits;  // float32 bits of the fake-quantized value
  bool overflow = false;  // some lane overflowed (NaN inputs aside): counted as overflow
};

// One vector's rounded magnitudes: the magnitude code (when wanted), the float32 bits of
// the rounded magnitude, the lanes that overflow and those whose result is zero.
struct Rounded {
  V32 mag, v;
  hn::Mask<D32> ovf, zero_res;
  bool any_zero;  // some lane's result may be zero
};

// Every lane is in the normal range (or above it) or zero: the quantum is a fixed number S
// of float mantissa bits, so round the float bits themselves; a carry out of the mantissa
// moves into the exponent by the addition, as in the codec. A zero lane rounds to float
// bits 0 (the added bits stay below the S dropped ones); its code, which the subtraction
// below would wrap, is forced to 0.
template <Rounding kMode, bool kWantCode>
HWY_INLINE Rounded RoundNormal(D32 d, const Params& p, V32 a, V32 r, hn::Mask<D32> is_zero) {
  const V32 one = hn::Set(d, 1u);
  V32 rounded;
  if constexpr (kMode == Rounding::nearest_even) {
    // The tie-breaking bit is the mantissa LSB; with M = 0 it is the implicit bit (1),
    // not the float exponent's LSB that sits at bit S.
    const V32 lsb = hn::And(hn::Or(hn::ShiftRightSame(a, static_cast<int>(p.S)), hn::Set(d, p.M == 0 ? 1u : 0u)), one);
    rounded = hn::Add(a, hn::Add(hn::Set(d, p.half_m1), lsb));
  } else if constexpr (kMode == Rounding::nearest_away) {
    rounded = hn::Add(a, hn::Set(d, p.half_m1 + 1));  // half a quantum: a tie carries
  } else if constexpr (kMode == Rounding::toward_zero) {
    rounded = a;
  } else {
    // Add K random bits at the top of the S-bit fraction (the fraction's bits below them
    // dropped first): the carry happens with probability F_K / 2^K.
    const V32 rb = hn::ShiftLeftSame(hn::ShiftRightSame(r, static_cast<int>(p.sr_shift_r)),
                                     static_cast<int>(p.sr_shift_l));
    rounded = hn::Add(hn::And(a, hn::Set(d, p.sr_keep)), rb);
  }
  Rounded out;
  out.v = hn::AndNot(hn::Set(d, p.low_mask), rounded);
  // Above 2^emin the float bits and the codes are in the same order: overflow is v past the
  // largest finite value's bits (NaN and Inf inputs included), and the only zero results
  // are the zero inputs (so nothing underflows here).
  out.ovf = hn::Gt(out.v, hn::Set(d, p.max_bits));
  out.zero_res = is_zero;
  out.any_zero = !hn::AllFalse(d, is_zero);
  out.mag = hn::Zero(d);
  if constexpr (kWantCode) {
    out.mag = hn::Sub(hn::ShiftRightSame(rounded, static_cast<int>(p.S)), hn::Set(d, p.code_offset));
    if (out.any_zero) out.mag = hn::IfThenZeroElse(is_zero, out.mag);
  }
  return out;
}

// Stochastic rounding's carry on the general path: F is the fraction below the target LSB
// aligned to the top of a 32-bit word (drop <= 32: sig << (32 - drop); drop > 32:
// sig >> (drop - 32)); round up iff (F & topR) + (r & topR) carries out of 32 bits.
HWY_INLINE V32 StochasticCarry(D32 d, const Params& p, V32 sig, V32 drop_raw, V32 r) {
  const V32 c32 = hn::Set(d, 32u);
  V32 F = hn::Shl(sig, hn::Sub(c32, hn::Min(drop_raw, c32)));
  const auto deep = hn::Gt(drop_raw, c32);
  if (HWY_UNLIKELY(!hn::AllFalse(d, deep))) {
    const V32 sr = hn::Min(hn::Sub(hn::Min(drop_raw, hn::Set(d, 63u)), c32), hn::Set(d, 31u));
    F = hn::IfThenElse(deep, hn::Shr(sig, sr), F);
  }
  const V32 tm = hn::Set(d, p.random_mask);
  const V32 fm = hn::And(F, tm);
  const V32 sum = hn::Add(fm, hn::And(r, tm));
  return hn::IfThenElseZero(hn::Lt(sum, fm), hn::Set(d, 1u));
}

// Any lane, subnormal range included. Float32 fields: e1 = max(biased exponent, 1), so
// that sig = a - ((e1-1) << 23) is the significand with its implicit bit (normals) or the
// raw fraction (subnormals), and |x| = sig * 2^(e1 - 150) in both cases.
//   a:    0 | eeeeeeee | fffffffffffffffffffffff
//   sig:             1 | fffffffffffffffffffffff   (0 | f... for subnormals)
template <Rounding kMode, bool kCount>
HWY_INLINE Rounded RoundAny(D32 d, const Params& p, V32 a, V32 r, hn::Mask<D32> is_zero, QuantCounts* counts) {
  const hn::RebindToSigned<D32> di;
  const V32 one = hn::Set(d, 1u);
  const V32 zero = hn::Zero(d);
  const V32 exf = hn::ShiftRight<23>(a);
  const V32 e1 = hn::Max(exf, one);
  const V32 base = hn::ShiftLeft<23>(hn::Sub(e1, one));
  const V32 sig = hn::Sub(a, base);
  const auto eminb = hn::Set(di, static_cast<std::int32_t>(p.eminb));
  const auto ie1 = hn::BitCast(di, e1);
  // Below the normal range the quantum stays 2^(emin - M): `below` more bits drop.
  const V32 below = hn::BitCast(d, hn::Max(hn::Sub(eminb, ie1), hn::Zero(di)));
  const V32 above = hn::BitCast(d, hn::Max(hn::Sub(ie1, eminb), hn::Zero(di)));
  const V32 drop_raw = hn::Add(hn::Set(d, 23u - p.M), below);
  const V32 drop = hn::Min(drop_raw, hn::Set(d, 31u));  // shifts stay defined on every target
  V32 n;  // rounded magnitude in quanta of 2^(max(ex, emin) - M)
  if constexpr (kMode == Rounding::nearest_even) {
    // sig + (half - 1) + lsb, then drop: ties go to the even quantum count.
    const V32 half_m1 = hn::Sub(hn::Shl(one, hn::Sub(drop, one)), one);
    const V32 lsb = hn::And(hn::Shr(sig, drop), one);
    n = hn::Shr(hn::Add(sig, hn::Add(half_m1, lsb)), drop);
  } else if constexpr (kMode == Rounding::nearest_away) {
    // sig + half, then drop: ties go up. Where drop was clamped to 31 (|x| far below the
    // smallest subnormal), sig < 2^24 stays below 2^30 + 2^24 < 2^31: 0, as exact.
    n = hn::Shr(hn::Add(sig, hn::Shl(one, hn::Sub(drop, one))), drop);
  } else if constexpr (kMode == Rounding::toward_zero) {
    n = hn::Shr(sig, drop);
  } else {
    n = hn::Add(hn::Shr(sig, drop), StochasticCarry(d, p, sig, drop_raw, r));
  }
  Rounded out;
  out.mag = hn::Add(hn::ShiftLeftSame(above, static_cast<int>(p.M)), n);
  // Value bits: within x's binade the quanta are linear in the float bits (drop <= 23);
  // further down the only candidates are 0 and the smallest subnormal.
  out.v = hn::Add(base, hn::Shl(n, drop));
  const auto tiny = hn::Gt(drop_raw, hn::Set(d, 23u));
  if (HWY_UNLIKELY(!hn::AllFalse(d, tiny)))
    out.v = hn::IfThenElse(tiny, hn::IfThenZeroElse(hn::Eq(n, zero), hn::Set(d, p.minsub_bits)), out.v);
  // mag = (exponent field above emin << M) + n; see codec.cpp's round_magnitude.
  // Non-finite inputs have exf = 255, hence a huge `mag`: they are inside `ovf` too.
  out.ovf = hn::Gt(out.mag, hn::Set(d, p.max_code));
  out.zero_res = hn::Eq(out.mag, zero);
  out.any_zero = true;
  if constexpr (kCount) counts->underflow += hn::CountTrue(d, hn::AndNot(is_zero, out.zero_res));
  return out;
}

// Params::small formats: the magnitude code counts the breakpoints below |x| (NaN and Inf
// bits lie above them all, so they overflow as on the other paths).
template <bool kCount>
HWY_INLINE Rounded RoundSmall(D32 d, const Params& p, V32 a, hn::Mask<D32> is_zero, QuantCounts* counts) {
  V32 mag = hn::Zero(d);
  for (int k = 0; k < 8; ++k) mag = hn::Sub(mag, hn::VecFromMask(d, hn::Gt(a, hn::Set(d, p.small_above[k]))));
  Rounded out;
  const V32 max_code = hn::Set(d, p.max_code);
  out.mag = mag;
  out.v = hn::TableLookupLanes(hn::LoadU(d, p.small_bits), hn::IndicesFromVec(d, hn::Min(mag, max_code)));
  out.ovf = hn::Gt(mag, max_code);
  out.zero_res = hn::Eq(mag, hn::Zero(d));
  out.any_zero = true;
  if constexpr (kCount) counts->underflow += hn::CountTrue(d, hn::AndNot(is_zero, out.zero_res));
  return out;
}

// Nearest-even on any finite lane, subnormal range included, by float32 addition: with t
// the larger of |x|'s binade and 2^emin, C = 2^(exponent of t + 23 - M) has its unit in the
// last place at the lane's quantum 2^(exponent of t - M), so fl32(|x| + C) rounds |x| to a
// multiple of the quantum, ties to the even multiple (C's significand is 1), and
// fl32((|x| + C) - C) is that multiple exactly. The magnitude code is the number of quanta,
// the bits of |x| + C past C's, plus the binades above emin times 2^M. A lane whose C would
// be Inf or negative (|x| far past the format's largest value) gives a result past the
// largest value's bits or NaN bits, so it lands in `ovf` as every overflow does; its code is
// patched by the caller.
template <bool kWantCode>
HWY_INLINE Rounded RoundByAddition(D32 d, const Params& p, V32 a) {
  const hn::RebindToFloat<D32> df;
  const V32 t = hn::Max(hn::And(a, hn::Set(d, 0x7f800000u)), hn::Set(d, p.min_normal_bits));
  const V32 c = hn::Add(t, hn::Set(d, p.S << 23));
  const auto cf = hn::BitCast(df, c);
  const auto sum = hn::Add(hn::BitCast(df, a), cf);
  Rounded out;
  out.v = hn::BitCast(d, hn::Sub(sum, cf));
  out.ovf = hn::Gt(out.v, hn::Set(d, p.max_bits));
  out.zero_res = hn::Eq(out.v, hn::Zero(d));
  out.any_zero = true;
  out.mag = hn::Zero(d);
  if constexpr (kWantCode)
    out.mag = hn::Add(hn::ShiftRightSame(hn::Sub(t, hn::Set(d, p.min_normal_bits)), static_cast<int>(p.S)),
                      hn::Sub(hn::BitCast(d, sum), c));
  return out;
}

// The lanes of a saturating format's rounded magnitudes q (no NaN or Inf input): the
// overflowing lanes take +-max without a branch, as PatchSpecials would give them.
template <bool kWantCode, bool kWantFloat, bool kCount>
HWY_INLINE Lanes Saturated(D32 d, const Params& p, const Rounded& q, V32 sign_kept, QuantCounts* counts) {
  Lanes out{hn::Zero(d), hn::Zero(d), false};
  if constexpr (kWantCode)
    out.code = hn::Or(hn::IfThenElse(q.ovf, hn::Set(d, p.ovf_mag), q.mag),
                      hn::ShiftRightSame(sign_kept, static_cast<int>(p.code_sign_shift)));
  if constexpr (kWantFloat) out.fbits = hn::Or(hn::IfThenElse(q.ovf, hn::Set(d, p.max_bits), q.v), sign_kept);
  out.overflow = !hn::AllFalse(d, q.ovf);
  if constexpr (kCount)
    if (HWY_UNLIKELY(out.overflow)) counts->overflow += hn::CountTrue(d, q.ovf);
  return out;
}

// Some lane of the float32 bits xb is NaN or Inf.
HWY_INLINE bool Special(D32 d, V32 xb) {
  return !hn::AllFalse(d, hn::Gt(hn::And(xb, hn::Set(d, 0x7fffffffu)), hn::Set(d, 0x7f7fffffu)));
}

// Rare: overflow, NaN or Inf somewhere in the vector. Their lanes get the overflow, Inf or
// NaN results of the format's policy and overflow mode.
template <bool kWantCode, bool kWantFloat, bool kCount>
HWY_INLINE void PatchSpecials(D32 d, const Params& p, V32 a, V32 sign, hn::Mask<D32> ovf, Lanes& out,
                              QuantCounts* counts) {
  const V32 one = hn::Set(d, 1u);
  const auto no = hn::Lt(one, one);  // all-false mask
  const auto is_nan = hn::Gt(a, hn::Set(d, 0x7f800000u));
  const auto is_inf = hn::Eq(a, hn::Set(d, 0x7f800000u));
  const auto nan_res = hn::Or(
      is_nan, hn::Or(p.inf_to_nan ? is_inf : no, p.ovf_to_nan ? hn::AndNot(is_inf, ovf) : no));
  const auto inf_res =
      hn::Or(p.inf_to_inf ? is_inf : no, p.ovf_to_inf ? hn::AndNot(is_nan, ovf) : no);
  if constexpr (kWantCode) {
    const V32 csign = hn::ShiftRightSame(sign, static_cast<int>(p.code_sign_shift));
    V32 code = hn::IfThenElse(ovf, hn::Or(csign, hn::Set(d, p.ovf_mag)), out.code);
    code = hn::IfThenElse(inf_res, hn::Or(csign, hn::Set(d, p.inf_mag)), code);
    out.code = hn::IfThenElse(
        nan_res, hn::Or(hn::Set(d, p.nan_base), hn::And(csign, hn::Set(d, p.nan_sign_mask))),
        code);
  }
  if constexpr (kWantFloat) {
    V32 v = hn::IfThenElse(ovf, hn::Or(sign, hn::Set(d, p.max_bits)), out.fbits);
    v = hn::IfThenElse(inf_res, hn::Or(sign, hn::Set(d, 0x7f800000u)), v);
    out.fbits = hn::IfThenElse(
        nan_res, hn::Or(hn::Set(d, 0x7fc00000u), hn::And(sign, hn::Set(d, p.fnan_sign_mask))), v);
  }
  if constexpr (kCount) {
    counts->overflow += hn::CountTrue(d, hn::AndNot(is_nan, ovf));
    counts->nan += hn::CountTrue(d, nan_res);
  }
}

// The codec on one vector of float32 bits. idx_lo: low 32 bits of each element's index.
// The common case (finite results in range, not far below the smallest subnormal) runs
// straight through; overflow, NaN/Inf inputs and tiny results take branches that are
// rare in real tensors (each tested per vector with one mask test).
template <Rounding kMode, bool kWantCode, bool kWantFloat, bool kCount>
HWY_INLINE Lanes ProcessGeneral(D32 d, const Params& p, V32 xb, V32 idx_lo, fp8lab::StreamKey key,
                         QuantCounts* counts) {
  const V32 zero = hn::Zero(d);
  const V32 a = hn::And(xb, hn::Set(d, 0x7fffffffu));
  const V32 sign = hn::Xor(xb, a);
  V32 r = zero;  // random bits (stochastic only)
  if constexpr (kMode == Rounding::stochastic)
    r = Hash32(d, hn::Xor(Hash32(d, hn::Xor(idx_lo, hn::Set(d, key.k0))), hn::Set(d, key.k1)));
  // Zeros (half of every ReLU output and of the gradients flowing back through it) do not
  // leave the fast path: they are the one sub-normal-range value whose result is known.
  const auto is_zero = hn::Eq(a, zero);
  const Rounded q = (kMode != Rounding::stochastic && hn::Lanes(d) >= 8 && p.small)
                        ? RoundSmall<kCount>(d, p, a, is_zero, counts)
                    : HWY_LIKELY(hn::AllFalse(d, hn::AndNot(is_zero, hn::Lt(a, hn::Set(d, p.min_normal_bits)))))
                        ? RoundNormal<kMode, kWantCode>(d, p, a, r, is_zero)
                        : RoundAny<kMode, kCount>(d, p, a, r, is_zero, counts);
  const V32 sign_kept = (p.unsigned_zero && q.any_zero) ? hn::IfThenZeroElse(q.zero_res, sign) : sign;
  // Saturating formats without NaN or Inf inputs in the vector: the common case, where a
  // block's largest value rounds past the format's largest, as under MX's floor rule.
  if (p.saturates() && HWY_LIKELY(!Special(d, xb))) return Saturated<kWantCode, kWantFloat, kCount>(d, p, q, sign_kept, counts);
  Lanes out{zero, zero, false};
  if constexpr (kWantCode) out.code = hn::Or(q.mag, hn::ShiftRightSame(sign_kept, static_cast<int>(p.code_sign_shift)));
  if constexpr (kWantFloat) out.fbits = hn::Or(q.v, sign_kept);
  if (HWY_UNLIKELY(!hn::AllFalse(d, q.ovf))) {
    PatchSpecials<kWantCode, kWantFloat, kCount>(d, p, a, sign, q.ovf, out, counts);
    out.overflow = !hn::AllFalse(d, hn::AndNot(hn::Gt(a, hn::Set(d, 0x7f800000u)), q.ovf));
  }
  return out;
}

// ProcessGeneral out of line: the rare vectors of a loop whose common case is
// ProcessByAddition, which then keeps its values in registers.
template <Rounding kMode, bool kWantCode, bool kWantFloat, bool kCount>
HWY_NOINLINE Lanes ProcessRare(D32 d, const Params& p, V32 xb, V32 idx_lo, fp8lab::StreamKey key,
                               QuantCounts* counts) {
  return ProcessGeneral<kMode, kWantCode, kWantFloat, kCount>(d, p, xb, idx_lo, key, counts);
}

// Nearest-even on a saturating format (Params::by_addition) when no lane is NaN or Inf
// (Special): one path for every lane, zeros, subnormal results and overflow included,
// without a branch.
template <bool kWantCode, bool kWantFloat, bool kCount>
HWY_INLINE Lanes ProcessByAddition(D32 d, const Params& p, V32 xb, QuantCounts* counts) {
  const V32 a = hn::And(xb, hn::Set(d, 0x7fffffffu));
  const V32 sign = hn::Xor(xb, a);
  const Rounded q = RoundByAddition<kWantCode>(d, p, a);
  const V32 sign_kept = p.unsigned_zero ? hn::IfThenZeroElse(q.zero_res, sign) : sign;
  if constexpr (kCount) {  // rare: counted where some lane has one
    const auto underflow = hn::AndNot(hn::Eq(a, hn::Zero(d)), q.zero_res);
    if (HWY_UNLIKELY(!hn::AllFalse(d, underflow))) counts->underflow += hn::CountTrue(d, underflow);
  }
  return Saturated<kWantCode, kWantFloat, kCount>(d, p, q, sign_kept, counts);
}

// One vector through the codec, handed to emit(lanes): with kAdd (Params::by_addition),
// ProcessByAddition unless a lane is NaN or Inf. The two calls of emit keep the common
// path's lanes in registers (a shared return value would go through memory).
template <Rounding kMode, bool kWantCode, bool kWantFloat, bool kCount, bool kAdd, class Emit>
HWY_INLINE void Process(D32 d, const Params& p, V32 xb, V32 idx_lo, fp8lab::StreamKey key, QuantCounts* counts,
                        const Emit& emit) {
  if constexpr (kAdd) {
    if (HWY_UNLIKELY(Special(d, xb)))
      emit(ProcessRare<kMode, kWantCode, kWantFloat, kCount>(d, p, xb, idx_lo, key, counts));
    else
      emit(ProcessByAddition<kWantCode, kWantFloat, kCount>(d, p, xb, counts));
  } else {
    emit(ProcessGeneral<kMode, kWantCode, kWantFloat, kCount>(d, p, xb, idx_lo, key, counts));
  }
}

// Drive Process over [0, n) (element indices index0 + i); `emit(i, lanes)` stores a full
// vector, `emit_one(i)` handles one tail element with the scalar codec (which counts it).
template <Rounding kMode, bool kWantCode, bool kWantFloat, bool kCount, bool kAdd, class Emit,
          class EmitOne>
HWY_INLINE void Loop(const Params& params, const float* x, std::size_t n, std::uint64_t index0,
                     QuantCounts* counts, const Emit& emit, const EmitOne& emit_one) {
  // A local copy: the output stores could alias `params` as far as the compiler knows, so
  // it would reload every field and rebuild every constant vector after each store.
  const Params p = params;
  const D32 d;
  const std::size_t N = hn::Lanes(d);
  const hn::RebindToFloat<D32> df;
  // Counted into a local that stays in registers: through `counts` the compiler would
  // store the sums every vector, since the output stores (uint8_t) may alias them.
  QuantCounts local;
  std::size_t i = 0;
  while (i < n) {
    // Segments never cross a multiple of 2^32 in the global index: one key per segment.
    const std::uint64_t g = index0 + i;
    const std::uint64_t to_boundary = ((g | 0xffffffffull) + 1) - g;
    const std::size_t seg_end =
        static_cast<std::size_t>(std::min<std::uint64_t>(n, i + to_boundary));
    const fp8lab::StreamKey key = fp8lab::stream_key(p.seed, g);
    // Iota is a scalar loop in some Highway versions: build it once, then add N.
    V32 idx = hn::Iota(d, static_cast<std::uint32_t>(index0 + i));
    const V32 step = hn::Set(d, static_cast<std::uint32_t>(N));
    for (; i + N <= seg_end; i += N) {
      const V32 xb = hn::BitCast(d, hn::LoadU(df, x + i));
      Process<kMode, kWantCode, kWantFloat, kCount, kAdd>(d, p, xb, idx, key, &local,
                                                          [&](const Lanes& l) { emit(i, l); });
      idx = hn::Add(idx, step);
      if constexpr (kCount) local.total += N;
    }
    for (; i < seg_end; ++i) emit_one(i);
  }
  if constexpr (kCount) *counts += local;
}

// Stores one vector of codes (each < 2^16, and < 2^8 for uint8_t) as T.
template <typename T>
HWY_INLINE void StoreCodes(V32 code, T* HWY_RESTRICT out) {
#if HWY_TARGET <= HWY_AVX3
  // One truncating vpmovdb/vpmovdw: Highway's DemoteTo packs, masks and permutes (4 ops).
  if constexpr (sizeof(T) == 1)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm512_cvtepi32_epi8(code.raw));
  else
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm512_cvtepi32_epi16(code.raw));
#else
  const hn::Rebind<T, D32> dn;
  const hn::RebindToSigned<D32> di;
  hn::StoreU(hn::DemoteTo(dn, hn::BitCast(di, code)), dn, out);
#endif
}

// The loop for p's rounding: nearest-even by addition where Params::by_addition says so.
template <bool kCount, class Fn>
HWY_INLINE void DispatchMode(const Params& p, const Fn& fn) {
  switch (p.rounding) {
    case Rounding::nearest_even:
      if (p.by_addition) fn.template operator()<Rounding::nearest_even, kCount, true>();
      else fn.template operator()<Rounding::nearest_even, kCount, false>();
      break;
    case Rounding::toward_zero: fn.template operator()<Rounding::toward_zero, kCount, false>(); break;
    case Rounding::stochastic: fn.template operator()<Rounding::stochastic, kCount, false>(); break;
    case Rounding::nearest_away: fn.template operator()<Rounding::nearest_away, kCount, false>(); break;
  }
}

inline void QuantizeRange(const Params& p, const QuantSpec& q, const float* x, float* y,
                   std::size_t n, std::uint64_t index0, QuantCounts* counts) {
  const hn::RebindToFloat<D32> df;
  auto run = [&]<Rounding kMode, bool kCount, bool kAdd>() {
    Loop<kMode, false, true, kCount, kAdd>(
        p, x, n, index0, counts,
        [&](std::size_t i, const Lanes& l) { hn::StoreU(hn::BitCast(df, l.fbits), df, y + i); },
        [&](std::size_t i) { y[i] = fp8lab::quantize(x[i], q, index0 + i, counts); });
  };
  if (counts) DispatchMode<true>(p, run);
  else DispatchMode<false>(p, run);
}

template <typename T>
HWY_INLINE void EncodeRangeT(const Params& p, const QuantSpec& q, const float* x, T* out,
                             std::size_t n, std::uint64_t index0, QuantCounts* counts) {
  auto run = [&]<Rounding kMode, bool kCount, bool kAdd>() {
    Loop<kMode, true, false, kCount, kAdd>(
        p, x, n, index0, counts, [&](std::size_t i, const Lanes& l) { StoreCodes(l.code, out + i); },
        [&](std::size_t i) {
          out[i] = static_cast<T>(fp8lab::encode(x[i], q, index0 + i, counts));
        });
  };
  if (counts) DispatchMode<true>(p, run);
  else DispatchMode<false>(p, run);
}

inline void QuantizeEncodeRange8(const Params& p, const QuantSpec& q, const float* x, float* y,
                          std::uint8_t* out, std::size_t n, std::uint64_t index0,
                          QuantCounts* counts) {
  const hn::RebindToFloat<D32> df;
  auto run = [&]<Rounding kMode, bool kCount, bool kAdd>() {
    Loop<kMode, true, true, kCount, kAdd>(
        p, x, n, index0, counts,
        [&](std::size_t i, const Lanes& l) {
          hn::StoreU(hn::BitCast(df, l.fbits), df, y + i);
          StoreCodes(l.code, out + i);
        },
        [&](std::size_t i) {
          out[i] = static_cast<std::uint8_t>(fp8lab::encode(x[i], q, index0 + i, counts));
          y[i] = fp8lab::quantize(x[i], q, index0 + i);
        });
  };
  if (counts) DispatchMode<true>(p, run);
  else DispatchMode<false>(p, run);
}

inline void EncodeRange8(const Params& p, const QuantSpec& q, const float* x, std::uint8_t* out,
                  std::size_t n, std::uint64_t index0, QuantCounts* counts) {
  EncodeRangeT(p, q, x, out, n, index0, counts);
}
inline void EncodeRange16(const Params& p, const QuantSpec& q, const float* x, std::uint16_t* out,
                   std::size_t n, std::uint64_t index0, QuantCounts* counts) {
  EncodeRangeT(p, q, x, out, n, index0, counts);
}

// Block-scaled quantization (docs/spec.md §6.3): y = Q(v) * after[b] and the codes of Q(v),
// with v = x * before[b] (power-of-two factors, E8M0) or v = x / before[b] (kDivide: any
// other scale), b = i / block, in one pass, each vector inside one block (block a multiple
// of the vector width). Counts as the element kernel on v, plus `flushed`: values v flushes
// to zero; hot[b] set where an element of block b overflows (the block saturates).
constexpr std::size_t kPrefetchAhead = 4096;
template <Rounding kMode, bool kWantCode, bool kCount, bool kAdd, bool kDivide>
HWY_INLINE void LoopPow2(const Params& params, const QuantSpec& q, const float* x, float* y, std::uint8_t* codes,
                         std::size_t n, std::size_t block, const float* before, const float* after,
                         std::uint64_t index0, QuantCounts* counts, std::uint8_t* hot, std::uint64_t* flushed) {
  const Params p = params;
  const D32 d;
  const hn::RebindToFloat<D32> df;
  const std::size_t N = hn::Lanes(d);
  const auto fzero = hn::Zero(df);
  QuantCounts local;
  std::uint64_t fl = 0;
  std::size_t i = 0;
  while (i < n) {
    const std::uint64_t g = index0 + i;
    const std::uint64_t to_boundary = ((g | 0xffffffffull) + 1) - g;
    const std::size_t seg_end = static_cast<std::size_t>(std::min<std::uint64_t>(n, i + to_boundary));
    const fp8lab::StreamKey key = fp8lab::stream_key(p.seed, g);
    V32 idx = hn::Iota(d, static_cast<std::uint32_t>(index0 + i));
    const V32 step = hn::Set(d, static_cast<std::uint32_t>(N));
    // The block of element i, kept without a division per vector: b = i / block.
    std::size_t b = i / block, block_end = (b + 1) * block;
    bool hot_b = false;  // some element of block b overflowed (stored when the block ends)
    for (; i + N <= seg_end; i += N) {
      if (i == block_end) {
        hot[b] |= static_cast<std::uint8_t>(hot_b);
        hot_b = false;
        ++b;
        block_end += block;
      }
      // The next chunk of the caller (kPrefetchAhead values on) streams in while this one
      // computes, instead of after it.
      hwy::Prefetch(x + i + kPrefetchAhead);
      const auto xf = hn::LoadU(df, x + i);
      auto vf = kDivide ? hn::Div(xf, hn::Set(df, before[b])) : hn::Mul(xf, hn::Set(df, before[b]));
      // A finite x whose scaled value lies past float32's range saturates (docs/spec.md §6.3).
      const auto vinf = hn::IsInf(vf);
      if (HWY_UNLIKELY(!hn::AllFalse(df, vinf)))
        vf = hn::IfThenElse(hn::And(vinf, hn::IsFinite(xf)),
                            hn::CopySign(hn::Set(df, std::numeric_limits<float>::max()), vf), vf);
      // Flushed: a nonzero x whose scaled value is zero (only where some lane of v is zero).
      const auto vzero = hn::Eq(vf, fzero);
      if (HWY_UNLIKELY(!hn::AllFalse(df, vzero))) fl += hn::CountTrue(df, hn::AndNot(hn::Eq(xf, fzero), vzero));
      Process<kMode, kWantCode, true, kCount, kAdd>(d, p, hn::BitCast(d, vf), idx, key, &local, [&](const Lanes& l) {
        hot_b |= l.overflow;
        hn::StoreU(hn::Mul(hn::BitCast(df, l.fbits), hn::Set(df, after[b])), df, y + i);
        if constexpr (kWantCode) StoreCodes(l.code, codes + i);
      });
      idx = hn::Add(idx, step);
      if constexpr (kCount) local.total += N;
    }
    hot[b] |= static_cast<std::uint8_t>(hot_b);
    for (; i < seg_end; ++i) {  // only at a 2^32 boundary of the stream index
      const std::size_t b = i / block;
      const float v = fp8lab::saturate_scaled(kDivide ? x[i] / before[b] : x[i] * before[b], x[i]);
      fl += v == 0 && x[i] != 0;
      QuantCounts one;
      const std::uint32_t code = fp8lab::encode(v, q, index0 + i, &one);
      hot[b] |= static_cast<std::uint8_t>(one.overflow > 0);
      if constexpr (kCount) local += one;
      if constexpr (kWantCode) codes[i] = static_cast<std::uint8_t>(code);
      y[i] = fp8lab::quantize(v, q, index0 + i) * after[b];
    }
  }
  if constexpr (kCount) *counts += local;
  *flushed += fl;
}

inline bool QuantizePow2Blocks(const Params& p, const QuantSpec& q, const float* x, float* y, std::uint8_t* codes,
                        std::size_t n, std::size_t block, const float* before, const float* after, bool divide,
                        std::uint64_t index0, QuantCounts* counts, std::uint8_t* hot, std::uint64_t* flushed) {
  const D32 d;
  if (block == 0 || block % hn::Lanes(d) != 0 || n % block != 0) return false;
  auto run = [&]<Rounding kMode, bool kCount, bool kAdd>() {
    const auto go = [&]<bool kDivide>() {
      if (codes)
        LoopPow2<kMode, true, kCount, kAdd, kDivide>(p, q, x, y, codes, n, block, before, after, index0, counts, hot, flushed);
      else
        LoopPow2<kMode, false, kCount, kAdd, kDivide>(p, q, x, y, codes, n, block, before, after, index0, counts, hot, flushed);
    };
    if (divide) go.template operator()<true>();
    else go.template operator()<false>();
  };
  if (counts) DispatchMode<true>(p, run);
  else DispatchMode<false>(p, run);
  return true;
}

// Decode by table look-up: the table holds the float32 of every code of the format.
template <typename T>
HWY_INLINE void DecodeRangeT(const float* table, std::uint32_t mask, const T* codes,
                             float* y, std::size_t n) {
  const D32 d;
  const hn::Rebind<T, D32> dn;
  const hn::RebindToSigned<D32> di;
  const hn::RebindToFloat<D32> df;
  const std::size_t N = hn::Lanes(d);
  const V32 m = hn::Set(d, mask);
  std::size_t i = 0;
  for (; i + N <= n; i += N) {
    const V32 c = hn::And(hn::PromoteTo(d, hn::LoadU(dn, codes + i)), m);
    hn::StoreU(hn::GatherIndex(df, table, hn::BitCast(di, c)), df, y + i);
  }
  for (; i < n; ++i) y[i] = table[codes[i] & mask];
}

inline void DecodeRange8(const float* table, std::uint32_t mask, const std::uint8_t* codes, float* y,
                  std::size_t n) {
  DecodeRangeT(table, mask, codes, y, n);
}
inline void DecodeRange16(const float* table, std::uint32_t mask, const std::uint16_t* codes, float* y,
                   std::size_t n) {
  DecodeRangeT(table, mask, codes, y, n);
}

// Decode to bfloat16: the float32 look-up's top halves (the caller has checked that every
// value of the table is a bfloat16 value).
inline void DecodeBf16Range8(const float* table, std::uint32_t mask, const std::uint8_t* codes, std::uint16_t* y,
                      std::size_t n) {
  const D32 d;
  const hn::Rebind<std::uint8_t, D32> d8;
  const hn::Rebind<std::uint16_t, D32> d16;
  const hn::RebindToSigned<D32> di;
  const std::size_t N = hn::Lanes(d);
  const V32 m = hn::Set(d, mask);
  const auto* bits = reinterpret_cast<const std::uint32_t*>(table);
  std::size_t i = 0;
  for (; i + N <= n; i += N) {
    const V32 c = hn::And(hn::PromoteTo(d, hn::LoadU(d8, codes + i)), m);
    const V32 v = hn::GatherIndex(d, bits, hn::BitCast(di, c));
    hn::StoreU(hn::TruncateTo(d16, hn::ShiftRight<16>(v)), d16, y + i);
  }
  for (; i < n; ++i) y[i] = static_cast<std::uint16_t>(bits[codes[i] & mask] >> 16);
}

// One chunk through the element kernel on this thread: y = Q(x) and, where `codes` is given,
// the codes: the vector loop where the format has it (p.fast), else the scalar codec
// element by element (counts from the codes where they are made, else from the values).
inline void QuantizeChunk(const Params& p, const QuantSpec& q, const float* x, float* y, std::uint8_t* codes,
                          std::size_t n, std::uint64_t index0, QuantCounts* counts) {
  if (p.fast && codes) return QuantizeEncodeRange8(p, q, x, y, codes, n, index0, counts);
  if (p.fast) return QuantizeRange(p, q, x, y, n, index0, counts);
  for (std::size_t i = 0; i < n; ++i) {
    if (codes) codes[i] = static_cast<std::uint8_t>(fp8lab::encode(x[i], q, index0 + i, counts));
    y[i] = fp8lab::quantize(x[i], q, index0 + i, codes ? nullptr : counts);
  }
}

// The top half of each float's bits (its bfloat16 value where it is one); returns the OR of
// the bottom halves (0: every value was a bfloat16 value).
inline std::uint32_t TopHalves(const float* x, std::uint16_t* y, std::size_t n) {
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

// Q(x) as bfloat16 into y (and the codes where given): QuantizeChunk into `buffer` (n
// floats, left in cache for the second step), then its top halves; returns the OR of their
// bottom halves, as TopHalves.
inline std::uint32_t QuantizeBf16Chunk(const Params& p, const QuantSpec& q, const float* x, std::uint16_t* y,
                                       std::uint8_t* codes, std::size_t n, std::uint64_t index0, QuantCounts* counts,
                                       float* buffer) {
  QuantizeChunk(p, q, x, buffer, codes, n, index0, counts);
  return TopHalves(buffer, y, n);
}

}  // namespace fp8lab::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
