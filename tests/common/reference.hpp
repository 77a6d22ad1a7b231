// An independent, slow reference for rounding float32 to a format, written from docs/spec.md §2
// without the codec's bit arithmetic: it sorts the format's values and rounds by exact
// comparisons in double (every float32 and every format value is exact in double).
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <vector>

#include "fp8lab/core/format.hpp"
#include "fp8lab/core/random.hpp"

namespace fp8lab::ref {

struct Table {
  Format f;
  // vals[c] = value of magnitude code c for c = 0..max_code+1; the last entry is the value
  // the next code would have if the exponent range had no upper limit.
  std::vector<double> vals;

  explicit Table(const Format& fmt) : f(fmt) {
    const int M = f.man_bits, b = f.bias;
    const std::uint32_t top = f.max_code() + 1;
    vals.resize(top + 1);
    for (std::uint32_t c = 0; c <= top; ++c) {
      const std::uint32_t e = c >> M, m = c & ((1u << M) - 1);
      double v;
      if (f.exp_bits == 0) v = std::ldexp(static_cast<double>(c), 1 - b - M);
      else if (e == 0 && f.subnormals) v = std::ldexp(m / std::ldexp(1.0, M), 1 - b);
      else if (c == 0 && f.zero) v = 0.0;  // without zero, code 0 is 2^-b (next line)
      else v = std::ldexp(1.0 + m / std::ldexp(1.0, M), static_cast<int>(e) - b);
      vals[c] = v;
    }
  }
};

// floor(num / gap * 2^R) for exact doubles 0 <= num < gap, by integer arithmetic on
// their frexp mantissas.
inline std::uint64_t top_bits(double num, double gap, int R) {
  if (num == 0) return 0;
  int en, eg;
  const double fn = std::frexp(num, &en), fg = std::frexp(gap, &eg);
  const auto A = static_cast<unsigned __int128>(std::ldexp(fn, 53));
  const auto G = static_cast<unsigned __int128>(std::ldexp(fg, 53));
  const int s = (en - 53) - (eg - 53) + R;
  unsigned __int128 q;
  if (s >= 0) q = (A << s) / G;
  else q = (s <= -128 ? 0 : (A >> -s)) / G;
  return static_cast<std::uint64_t>(q);
}

// Encode per docs/spec.md §2.1, steps 1-5.
inline std::uint32_t encode(const Table& t, const QuantSpec& q, float x, std::uint64_t index) {
  const Format& f = t.f;
  const bool neg = std::signbit(x);
  const std::uint32_t S = neg ? f.sign_bit() : 0;
  const std::uint32_t maxc = f.max_code();
  auto nan_code = [&]() -> std::uint32_t {
    switch (f.policy) {
      case Policy::fnuz: return f.sign_bit();
      case Policy::fn: return S | f.mag_mask();
      case Policy::ieee:
        return S | (((1u << f.exp_bits) - 1) << f.man_bits) | (1u << (f.man_bits - 1));
      case Policy::finite: return 0;
    }
    return 0;
  };
  auto inf_code = [&] { return S | (((1u << f.exp_bits) - 1) << f.man_bits); };
  if (std::isnan(x)) return nan_code();
  if (neg && x != 0 && !f.sign) return f.policy == Policy::finite ? 0 : nan_code();  // below an unsigned range
  if (std::isinf(x)) {
    if (f.policy == Policy::ieee) return inf_code();
    if (f.policy == Policy::finite) return S | maxc;
    return nan_code();
  }
  const double ax = std::fabs(static_cast<double>(x));
  auto finish = [&](std::uint32_t k) -> std::uint32_t {
    if (k > maxc) {
      if (q.overflow == Overflow::saturate || f.policy == Policy::finite) return S | maxc;
      if (q.overflow == Overflow::inf) return inf_code();
      return nan_code();
    }
    if (k == 0 && f.policy == Policy::fnuz) return 0;
    return S | k;
  };
  const std::vector<double>& v = t.vals;
  std::uint32_t k;  // v[k] <= ax < v[k+1]
  if (ax >= v.back()) return finish(maxc + 1);
  if (ax < v[0]) return finish(0);  // without zero: nothing lies below code 0
  k = static_cast<std::uint32_t>(std::upper_bound(v.begin(), v.end(), ax) - v.begin()) - 1;
  if (v[k] == ax) return finish(k);
  const double lo = v[k], hi = v[k + 1];
  switch (q.rounding) {
    case Rounding::toward_zero: return finish(k);
    case Rounding::nearest_even: {
      const double mid = lo + (hi - lo) / 2;
      if (ax < mid) return finish(k);
      if (ax > mid) return finish(k + 1);
      // A tie: the even code; with M = 0 between two powers of two the larger one, whose
      // significand is even after the carry (IEEE 754).
      if (f.man_bits == 0 && lo > 0) return finish(k + 1);
      return finish((k % 2 == 0) ? k : k + 1);
    }
    case Rounding::nearest_away: return finish(ax < lo + (hi - lo) / 2 ? k : k + 1);
    case Rounding::stochastic: {
      const int R = q.random_bits;
      const std::uint64_t F = top_bits(ax - lo, hi - lo, R);
      const std::uint64_t r = random_bits(q.seed, index) >> (32 - R);
      return finish(F + r >= (std::uint64_t{1} << R) ? k + 1 : k);
    }
  }
  return 0;
}

// The formats of the exhaustive tests: every 8-bit shape (E + M = 7 signed, E + M = 8
// unsigned), every bias in [lo, hi], every policy that applies, subnormals on and off, and
// the unsigned formats without zero (which have subnormals off).
inline std::vector<Format> eight_bit_formats(int bias_lo = -8, int bias_hi = 48) {
  std::vector<Format> out;
  for (bool sign : {true, false})
    for (int E = 0; E <= (sign ? 7 : 8); ++E) {
      const int M = (sign ? 7 : 8) - E;
      for (int b = bias_lo; b <= bias_hi; ++b)
        for (Policy p : {Policy::fnuz, Policy::fn, Policy::ieee, Policy::finite})
          for (bool sub : {true, false})
            for (bool zero : {true, false}) {
              if ((p == Policy::fn || p == Policy::ieee) && E < 1) continue;
              if (p == Policy::ieee && M < 1) continue;
              if (!sub && E < 1) continue;
              if (!sign && p == Policy::fnuz) continue;
              if (!zero && (sign || sub)) continue;
              out.push_back(make_format(E, M, b, p, sub, sign, zero));
            }
    }
  return out;
}

// Random float32 inputs that reach every exponent, subnormals, specials and the format's grid.
struct InputGen {
  std::uint64_t state;
  explicit InputGen(std::uint64_t seed) : state(seed) {}
  std::uint64_t next() {
    state += 0x9e3779b97f4a7c15ull;
    return mix64(state);
  }
  float any_bits() { return std::bit_cast<float>(static_cast<std::uint32_t>(next())); }
  // Near a format value: v * (1 + small) or between neighbours.
  float near(const Table& t) {
    const std::uint64_t r = next();
    const std::size_t k = r % t.vals.size();
    double v = t.vals[k];
    const double up = k + 1 < t.vals.size() ? t.vals[k + 1] : v * 2;
    const double frac = static_cast<double>((r >> 20) & 0xffff) / 65536.0;
    double y = v + (up - v) * frac;
    if (r & (1ull << 40)) y = -y;
    return static_cast<float>(y);
  }
};

}  // namespace fp8lab::ref
