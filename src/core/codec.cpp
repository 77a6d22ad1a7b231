#include "fp8lab/core/codec.hpp"

#include <algorithm>
#include <bit>
#include <optional>
#include <cmath>
#include <limits>
#include <string>

#include "fp8lab/core/random.hpp"

namespace fp8lab {

namespace {

// |x| = sig * 2^xe with sig in [2^23, 2^24) (docs/spec.md §2.1, step 3): float32
// subnormals are normalised here, so xe + 23 is floor(log2 |x|) for every input.
//   float32 bits:  0 | eeeeeeee | fffffffffffffffffffffff
//   sig:           1fffffffffffffffffffffff   (24 bits, implicit bit made explicit)
struct Normalised {
  std::uint64_t sig;
  int xe;
};

Normalised normalise(std::uint32_t a) {
  const std::uint32_t exf = a >> 23;
  if (exf != 0) return {(a & 0x7fffffu) | 0x800000u, static_cast<int>(exf) - 150};
  const int s = std::countl_zero(a) - 8;
  return {static_cast<std::uint64_t>(a) << s, -149 - s};
}

// Stochastic rounding's decision: up (1) iff F_R + r_R >= 2^R, with F_R the top R bits of
// the fraction and r_R R random bits of element `index`: probability F_R / 2^R, the exact
// fraction when it has at most R bits.
std::uint64_t stochastic_up(std::uint64_t fraction_top_r, const QuantSpec& q, std::uint64_t index) {
  const int R = q.random_bits;
  const std::uint64_t r = random_bits(q.seed, index) >> (32 - R);
  return (fraction_top_r + r) >> R;
}

// Subnormals off: between 0 and the smallest positive value minpos = 2^-b * (1 + 2^-M)
// there is no binade grid, the neighbours are 0 and minpos. The magnitude code (0 or 1) of
// an |x| below minpos, or nothing when |x| >= minpos.
std::optional<std::uint64_t> round_below_minpos(const Normalised& x, const QuantSpec& q, std::uint64_t index) {
  const int M = q.format.man_bits;
  const std::uint64_t d = (1ull << M) + 1;  // minpos = d * 2^(-b-M)
  const int s = x.xe + q.format.bias + M;   // |x| / 2^(-b-M) = sig * 2^s
  const bool below = s >= 0 ? s <= 30 && (x.sig << s) < d : (-s >= 40) || x.sig < (d << -s);
  if (!below) return std::nullopt;
  switch (q.rounding) {
    case Rounding::toward_zero: return 0;
    case Rounding::nearest_even: {
      // up iff 2|x| > minpos; a tie goes to 0, the even code.
      const int s1 = s + 1;
      if (s1 >= 0) return (x.sig << s1) > d ? 1 : 0;
      return (-s1 >= 40) ? 0 : (x.sig > (d << -s1) ? 1 : 0);
    }
    case Rounding::nearest_away: {  // up iff 2|x| >= minpos: a tie goes up
      const int s1 = s + 1;
      if (s1 >= 0) return (x.sig << s1) >= d ? 1 : 0;
      return (-s1 >= 40) ? 0 : (x.sig >= (d << -s1) ? 1 : 0);
    }
    case Rounding::stochastic: {
      // F_R = floor(|x| / minpos * 2^R) = floor(sig * 2^(s+R) / d), exactly.
      const int sr = s + q.random_bits;
      const std::uint64_t num = sr >= 0 ? (x.sig << sr) : (-sr >= 64 ? 0 : x.sig >> -sr);
      return stochastic_up(num / d, q, index);
    }
  }
  return std::nullopt;
}

// sig rounded to a multiple of 2^drop, in units of 2^drop, by the rounding mode.
std::uint64_t round_quanta(std::uint64_t sig, int drop, const QuantSpec& q, std::uint64_t index) {
  if (drop == 0) return sig;
  const std::uint64_t trunc = drop >= 64 ? 0 : sig >> drop;
  const std::uint64_t rem = drop >= 64 ? sig : sig & ((1ull << drop) - 1);
  switch (q.rounding) {
    case Rounding::nearest_even: {
      // Ties go to the even significand: trunc's LSB is the mantissa LSB (or the implicit
      // bit when M = 0, so a tie between 2^e and 2^(e+1) goes up, as in IEEE 754).
      if (drop >= 64) return 0;
      const std::uint64_t half = 1ull << (drop - 1);
      return trunc + ((rem > half || (rem == half && (trunc & 1))) ? 1 : 0);
    }
    case Rounding::toward_zero: return trunc;
    case Rounding::nearest_away: {  // ties away from zero: up at half or more
      if (drop >= 64) return 0;
      return trunc + (rem >= (1ull << (drop - 1)) ? 1 : 0);
    }
    case Rounding::stochastic: {
      const int R = q.random_bits;
      const std::uint64_t top = drop <= R ? rem << (R - drop) : (drop - R >= 64 ? 0 : rem >> (drop - R));
      return trunc + stochastic_up(top, q, index);
    }
  }
  return trunc;
}

// Round a finite, non-zero magnitude (float32 bits `a`, sign cleared) to the format as if
// its exponent range had no upper limit (docs/spec.md §2.1, step 3). Returns the magnitude
// code, which may exceed max_code(): the caller handles overflow (step 4).
std::uint64_t round_magnitude(std::uint32_t a, const QuantSpec& q, std::uint64_t index) {
  const Format& f = q.format;
  const int M = f.man_bits;
  const Normalised x = normalise(a);
  if (!f.subnormals && f.zero)
    if (const auto code = round_below_minpos(x, q, index)) return *code;
  // The target exponent is floor(log2 |x|), or emin below the normal range; the quantum is
  // 2^(et - M), i.e. `drop` bits of sig lie below the target LSB.
  const int ex = x.xe + 23, emin = f.emin();
  const int et = std::max(ex, emin);
  const std::uint64_t n = round_quanta(x.sig, et - M - x.xe, q, index);  // drop >= 23 - M >= 0
  // The magnitude code. Below the normal range the code is n itself (n = 2^M is the
  // smallest normal, whose code is also 2^M). In the normal range n holds the implicit bit:
  // code = (exponent field << M) + n - 2^M, where a carry out of the mantissa
  // (n = 2^(M+1)) moves into the exponent field by the addition itself.
  if (ex < emin) return n;
  return (static_cast<std::uint64_t>(et + f.bias) << M) + n - (1ull << M);
}

}  // namespace

void require_codable(const Format& f) {
  if (!f.codable())
    throw Error("format " + to_string(f) + " is " + std::to_string(f.width()) +
                " bits wide: codes and kernels take at most 16 bits (E + M <= 15)");
}

namespace {
template <class Code>
void check_codes_of(const Code* codes, std::size_t n, const Format& f, const std::string& what) {
  const int width = f.width();
  if (width >= static_cast<int>(8 * sizeof(Code))) return;
  const unsigned top = ~0u << width;
  for (std::size_t i = 0; i < n; ++i)
    if (codes[i] & top)
      throw Error(what + ": value " + std::to_string(+codes[i]) + " at index " + std::to_string(i) + " is not a " +
                  std::to_string(width) + "-bit code of " + to_string(f));
}
}  // namespace

void check_codes(const std::uint8_t* codes, std::size_t n, const Format& f, const std::string& what) {
  check_codes_of(codes, n, f, what);
}
void check_codes(const std::uint16_t* codes, std::size_t n, const Format& f, const std::string& what) {
  check_codes_of(codes, n, f, what);
}

std::uint32_t encode(float x, const QuantSpec& q, std::uint64_t index, QuantCounts* counts) {
  const Format& f = q.format;
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(x);
  const bool neg = bits >> 31;
  const std::uint32_t a = bits & 0x7fffffffu;
  const std::uint32_t sign = neg ? f.sign_bit() : 0;
  QuantCounts local;
  QuantCounts& c = counts ? *counts : local;
  ++c.total;

  if (a > 0x7f800000u) {  // NaN
    ++c.nan;
    return f.has_nan() ? f.nan_code(neg) : 0;
  }
  if (neg && a != 0 && !f.sign) {  // below an unsigned format's range (docs/spec.md §1.4)
    ++c.overflow;
    if (f.has_nan()) {
      ++c.nan;
      return f.nan_code(false);
    }
    return 0;  // a finite unsigned format saturates at its lowest code
  }
  if (a == 0x7f800000u) {  // +-Inf: an earlier overflow that must stay visible
    ++c.overflow;
    if (f.has_inf()) return f.inf_code(neg);
    if (f.has_nan()) {
      ++c.nan;
      return f.nan_code(neg);
    }
    return sign | f.max_code();
  }
  if (a == 0 || (!f.zero && normalise(a).xe + 23 < -f.bias)) {  // zero, or below 2^-bias without zero
    if (!f.zero) ++c.underflow;
    return f.signed_zero() ? sign : 0;
  }

  const std::uint64_t mag = round_magnitude(a, q, index);
  if (mag > f.max_code()) {
    ++c.overflow;
    switch (q.overflow) {
      case Overflow::saturate: return sign | f.max_code();
      case Overflow::inf:
        if (f.has_inf()) return f.inf_code(neg);
        [[fallthrough]];  // validate() rejects this; behave as nan
      case Overflow::nan:
        if (f.has_nan()) {
          ++c.nan;
          return f.nan_code(neg);
        }
        return sign | f.max_code();  // a finite format has no NaN: it saturates
    }
  }
  if (mag == 0 && f.zero) {
    ++c.underflow;
    return f.signed_zero() ? sign : 0;
  }
  return sign | static_cast<std::uint32_t>(mag);
}

namespace {
// The float32 nearest to v. Below float32's normal range it is built from its bits: a
// conversion to a float32 subnormal gives 0 under flush-to-zero, which a run may set
// (docs/spec.md §2.2).
float to_float(double v) {
  const double a = std::fabs(v);
  if (!(a < 0x1p-126) || a == 0) return static_cast<float>(v);
  const float f = std::bit_cast<float>(static_cast<std::uint32_t>(std::nearbyint(a * 0x1p149)));
  return v < 0 ? -f : f;
}
}  // namespace

float decode(std::uint32_t code, const Format& f) {
  const bool neg = (code & f.sign_bit()) != 0;
  switch (f.classify(code)) {
    case Format::Class::nan: {
      const float qnan = std::numeric_limits<float>::quiet_NaN();
      return (f.signed_nan() && neg) ? -qnan : qnan;
    }
    case Format::Class::inf:
      return neg ? -std::numeric_limits<float>::infinity() : std::numeric_limits<float>::infinity();
    default: break;
  }
  const float v = to_float(f.magnitude(code & f.mag_mask()));
  return neg ? -v : v;
}

float quantize(float x, const QuantSpec& q, std::uint64_t index, QuantCounts* counts) {
  if (std::isnan(x) && !q.format.has_nan()) {
    if (counts) {
      ++counts->total;
      ++counts->nan;
    }
    return std::signbit(x) ? -std::numeric_limits<float>::quiet_NaN()
                           : std::numeric_limits<float>::quiet_NaN();
  }
  return decode(encode(x, q, index, counts), q.format);
}

}  // namespace fp8lab
