// Number formats as data: one trivially copyable value describes any 1.E.M format with
// any exponent bias and one special-value policy (docs/spec.md §1). Every derived
// figure (max finite, smallest subnormal, NaN code, ...) is computed from these fields.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fp8lab/core/error.hpp"

namespace fp8lab {

// Which codes are non-finite and how NaN is encoded (docs/spec.md §1.3).
enum class Policy : std::uint8_t {
  fnuz,    // the paper's: one NaN code (sign 1, all else 0), no Inf, one zero
  fn,      // OCP e4m3fn: exponent and mantissa all ones is NaN (either sign), no Inf
  ieee,    // exponent all ones: Inf (mantissa 0) or NaN (mantissa != 0)
  finite,  // OCP MX elements: every code is a finite number
};

// nearest_away: to nearest, ties away from zero (IEEE 754's roundTiesToAway; Quartet II's
// FP4 quantizers), docs/spec.md §2.2.
enum class Rounding : std::uint8_t { nearest_even, toward_zero, stochastic, nearest_away };
enum class Overflow : std::uint8_t { saturate, nan, inf };

std::string_view to_string(Policy p);
std::string_view to_string(Rounding r);
std::string_view to_string(Overflow o);
Policy parse_policy(std::string_view s);      // throws Error
Rounding parse_rounding(std::string_view s);  // accepts nearest-even|ne|rne, toward-zero|tz, stochastic|sr, nearest-away|rna
Overflow parse_overflow(std::string_view s);  // saturate|clip, nan, inf

// Limits of what a Format may describe. Codes and kernels take at most 16 bits; the analysis
// (range, SNR) also takes wider formats up to fp32.
inline constexpr int kMaxExpBits = 8;
inline constexpr int kMaxManBits = 23;
inline constexpr int kMaxCodeWidth = 16;
inline constexpr int kMaxAbsBias = 512;

struct Format {
  std::int8_t exp_bits = 4;   // E, 0..8
  std::int8_t man_bits = 3;   // M, 0..23
  std::int16_t bias = 7;      // any integer in [-512, 512]
  Policy policy = Policy::fnuz;
  bool subnormals = true;     // false: exponent field 0 is an ordinary binade (DLFloat)
  bool sign = true;           // false: no sign bit, "0.E.M" (scale formats, docs/spec.md §1.4)
  bool zero = true;           // false: code 0 is 2^-bias, not zero (E8M0; needs subnormals off)

  // ---- derived figures -------------------------------------------------------------
  int width() const { return (sign ? 1 : 0) + exp_bits + man_bits; }
  bool codable() const { return width() <= kMaxCodeWidth; }
  std::uint32_t sign_bit() const { return sign ? 1u << (width() - 1) : 0; }  // 0 when unsigned
  std::uint32_t mag_mask() const { return (1u << (exp_bits + man_bits)) - 1; }
  // Exponent (unbiased) of the smallest normal binade: 1-b with subnormals, -b without.
  // For E = 0 every value lies below 2^emin (the scaled integer is all "subnormal").
  int emin() const { return subnormals ? 1 - bias : -static_cast<int>(bias); }
  // Magnitude code of the largest finite value.
  std::uint32_t max_code() const;
  // Magnitude code of the smallest positive value: 1, or 0 in a format without zero.
  std::uint32_t min_code() const { return zero ? 1 : 0; }
  bool has_nan() const { return policy != Policy::finite; }
  bool has_inf() const { return policy == Policy::ieee; }
  bool signed_zero() const { return sign && zero && policy != Policy::fnuz; }
  bool signed_nan() const { return sign && (policy == Policy::fn || policy == Policy::ieee); }
  // The canonical NaN code (docs/spec.md §2.1, step 1). Only meaningful when has_nan().
  std::uint32_t nan_code(bool negative) const;
  std::uint32_t inf_code(bool negative) const;  // only when has_inf()
  // Exact value of a finite magnitude code (code <= max_code()), as a double: every format
  // value fits a double exactly (M <= 23, exponents within +-800).
  double magnitude(std::uint32_t mag_code) const;
  double max_finite() const { return magnitude(max_code()); }
  double min_positive() const { return magnitude(min_code()); }
  double min_normal() const;  // smallest value with the implicit bit; 0 if E == 0
  // Number of finite values (counting +0 and -0 separately where both exist).
  std::uint64_t finite_count() const;
  // Classify a full code (sign included).
  enum class Class : std::uint8_t { zero, subnormal, normal, nan, inf };
  Class classify(std::uint32_t code) const;

  friend bool operator==(const Format& a, const Format& b) = default;
};

// Builds and validates; throws Error naming what is wrong.
Format make_format(int exp_bits, int man_bits, int bias, Policy policy = Policy::fnuz,
                   bool subnormals = true, bool sign = true, bool zero = true);
// 2^(E-1) - 1, 0 for E = 0.
int natural_bias(int exp_bits);
// Throws Error if the format is invalid (as make_format does).
void validate(const Format& f);

// "1.4.3", "1.4.3:10", "1.0.7:-2", "1.4.3:7:fn", "1.6.9:31:fn:nosub", the unsigned
// "0.4.3:fn" and "0.8.0:fn:nosub:nozero", or a preset name.
Format parse_format(std::string_view text);
// Canonical text: "1.E.M" ("0.E.M" unsigned) followed by ":bias" when not natural,
// ":policy" when not fnuz, ":nosub" when subnormals are off, ":nozero" without zero.
// parse_format(to_string(f)) == f for every valid f.
std::string to_string(const Format& f);
// The preset name for f, or "" when none matches.
std::string_view preset_name(const Format& f);

struct Preset {
  std::string_view name;
  Format format;
  std::string_view note;
};
const std::vector<Preset>& presets();
// The formats of the paper's Table 1: fp32 fp16 bf16 dlfloat16 1.5.2 1.4.3 1.3.4.
const std::vector<std::string_view>& table1_format_names();

// The quantizer a tensor gets: a format plus how to round into it.
struct QuantSpec {
  Format format{};
  Rounding rounding = Rounding::nearest_even;
  Overflow overflow = Overflow::saturate;
  std::uint8_t random_bits = 32;  // R, 1..32: random bits compared with the fraction (stochastic)
  std::uint64_t seed = 0;         // stochastic rounding stream key

  friend bool operator==(const QuantSpec& a, const QuantSpec& b) = default;
};
// Throws Error if the combination is invalid (e.g. overflow=inf on a non-ieee format).
void validate(const QuantSpec& q);

}  // namespace fp8lab
