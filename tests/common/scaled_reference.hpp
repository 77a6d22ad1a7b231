// An independent, slow reference for scaled quantization (docs/spec.md §6), written from the
// spec without fp8lab's scale code: scales by linear scans over every scale value, elements
// by rounding against the element format's sorted values times the scale (tests/common/
// reference.hpp), with the OCP MX spec's emax table typed in.
#pragma once

#include <cmath>
#include <cstdint>
#include <bit>
#include <limits>
#include <optional>
#include <vector>

#include "fp8lab/core/scaled.hpp"
#include "reference.hpp"

namespace fp8lab::ref {

// The OCP MX spec's table of emax per element type (and 0 for the spec's MXINT8).
inline int ocp_emax(const Format& e) {
  if (e == parse_format("e4m3fn")) return 8;
  if (e == parse_format("e5m2")) return 15;
  if (e == parse_format("e3m2fn")) return 4;
  if (e == parse_format("e2m3fn")) return 2;
  if (e == parse_format("e2m1fn")) return 2;
  if (e == parse_format("1.0.7:finite")) return 0;
  return std::ilogb(Table(e).vals[e.max_code()]);  // other formats: from the sorted values
}

inline std::uint32_t float_bits(float f) { return std::bit_cast<std::uint32_t>(f); }

// Values of an 8-bit scale format by code, up to its largest finite one.
inline std::vector<double> scale_values(ScaleFormat k) {
  std::vector<double> v;
  if (k == ScaleFormat::e8m0)
    for (int c = 0; c < 255; ++c) v.push_back(std::ldexp(1.0, c - 127));
  else
    v = Table(make_format(4, 3, 7, Policy::fn, true, false, true)).vals, v.pop_back();
  return v;
}

// The scale code for a positive finite amax and tensor scale ts, the amax scaled to element
// value `target` (0: the element format's largest).
inline std::uint32_t scale_code(const ScaledSpec& s, double amax, double ts, double target = 0) {
  const Format& e = s.element.format;
  const double max_e = target > 0 ? target : Table(e).vals[e.max_code()];
  if (s.scale == ScaleFormat::fp32) {
    if (s.rule == ScaleRule::floor) {
      int k = -400;
      while (std::ldexp(ts, k + 1) <= amax) ++k;
      const double target = std::ldexp(1.0, k - ocp_emax(e));
      if (target > std::numeric_limits<float>::max()) return float_bits(std::numeric_limits<float>::max());
      float f = static_cast<float>(target);
      if (f > target) f = std::nextafter(f, 0.0f);
      return float_bits(f);
    }
    const double t = amax / (ts * max_e);
    float f = std::min(static_cast<float>(t), std::numeric_limits<float>::max());
    auto ok = [&](float v) { return static_cast<long double>(v) * ts * max_e >= amax; };
    while (!ok(f) && f < std::numeric_limits<float>::max()) f = std::nextafter(f, INFINITY);
    while (f > 0 && ok(std::nextafter(f, 0.0f))) f = std::nextafter(f, 0.0f);
    if (s.rule == ScaleRule::ceil || f == 0) return float_bits(f);
    const float below = std::nextafter(f, 0.0f);
    const long double up = static_cast<long double>(f) * ts * max_e - amax;
    const long double down = amax - static_cast<long double>(below) * ts * max_e;
    if (down < up || (down == up && float_bits(below) % 2 == 0)) return float_bits(below);
    return float_bits(f);
  }
  const std::vector<double> v = scale_values(s.scale);
  const auto last = static_cast<std::uint32_t>(v.size() - 1);
  if (s.rule == ScaleRule::floor) {
    int k = -400;
    while (std::ldexp(ts, k + 1) <= amax) ++k;
    const double target = std::ldexp(1.0, k - ocp_emax(e));
    std::optional<std::uint32_t> best;
    for (std::uint32_t c = 0; c <= last; ++c)
      if (v[c] <= target) best = c;
    return best.value_or(0);
  }
  for (std::uint32_t c = 0; c <= last; ++c) {
    if (v[c] * ts * max_e < amax) continue;
    if (s.rule == ScaleRule::ceil || c == 0) return c;
    const long double up = static_cast<long double>(v[c]) * ts * max_e - amax;
    const long double down = amax - static_cast<long double>(v[c - 1]) * ts * max_e;
    if (down < up || (down == up && (c - 1) % 2 == 0)) return c - 1;
    return c;
  }
  return last;  // above the range: the largest
}

inline double scale_value(const ScaledSpec& s, std::uint32_t code) {
  if (s.scale == ScaleFormat::fp32) return std::bit_cast<float>(code);
  return scale_values(s.scale)[code];
}

// Element code and value of x in a group with scale X (a float32; pow2: X = 2^k exactly).
struct ElementOut {
  std::uint32_t code;
  float value;
};
// t: the element format's Table.
inline ElementOut element(const ScaledSpec& s, const Table& t, float x, double X, std::uint64_t index) {
  const Format& e = s.element.format;
  if (s.scale == ScaleFormat::e8m0 && !s.tensor_scale) {
    // Exact: round x against the element values times X.
    Table scaled = t;
    for (double& v : scaled.vals) v *= X;
    const std::uint32_t c = encode(scaled, s.element, x, index);
    if (std::isnan(x)) return {c, x};
    return {c, static_cast<float>(std::copysign(scaled.vals[c & e.mag_mask()], (c & e.sign_bit()) ? -1.0 : 1.0))};
  }
  if (X == 0) {
    const std::uint32_t c = encode(t, s.element, std::signbit(x) ? -0.0f : 0.0f, index);
    return {c, std::isnan(x) ? x : (std::signbit(x) ? -0.0f : 0.0f)};
  }
  const auto v = static_cast<float>(static_cast<double>(x) / X);
  const std::uint32_t c = encode(t, s.element, v, index);
  if (std::isnan(x)) return {c, x};
  const double mag = t.vals[c & e.mag_mask()];
  return {c, static_cast<float>(std::copysign(mag, (c & e.sign_bit()) ? -1.0 : 1.0) * X)};
}

// Four Over Six (docs/spec.md §6.10) from its definition: of the rule's scales for the
// element values 6 and 4, the one whose elements' values have the smaller sum of squared
// errors (summed in double in the group's order; 6 on a tie). `group`: the group's values
// with their stochastic-rounding indices, in row-major order; every value finite, amax > 0.
struct IndexedValue {
  float x;
  std::uint64_t index;
};
inline std::uint32_t four_over_six_code(const ScaledSpec& s, const Table& t, const std::vector<IndexedValue>& group,
                                        double amax, float ts) {
  const auto error = [&](std::uint32_t code) {
    const double X = s.tensor_scale ? static_cast<float>(scale_value(s, code) * ts) : scale_value(s, code);
    double sum = 0;
    for (const IndexedValue& v : group) {
      const double d = static_cast<double>(element(s, t, v.x, X, v.index).value) - v.x;
      sum += d * d;
    }
    return sum;
  };
  const std::uint32_t six = scale_code(s, amax, ts, 6.0), four = scale_code(s, amax, ts, 4.0);
  return error(four) < error(six) ? four : six;
}

}  // namespace fp8lab::ref
