// Every 8-bit format shape (E + M = 7 for E = 0..7, every bias in -8..48, every policy that
// applies, subnormals on and off): every code of each, and sampled float32 inputs (every
// input of the formats ml_dtypes has is tests/core/all_inputs.cpp's, label exhaustive).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>

#include "../common/reference.hpp"
#include "fp8lab/core/codec.hpp"

using namespace fp8lab;

namespace {
const std::vector<Format>& formats() {
  static const std::vector<Format> f = ref::eight_bit_formats();
  return f;
}
QuantSpec spec(const Format& f, Rounding r, Overflow o = Overflow::saturate) {
  QuantSpec q;
  q.format = f;
  q.rounding = r;
  q.overflow = o;
  q.seed = 1234;
  return q;
}
// FP8LAB_TEST_SCALE multiplies the random-input counts (default 1).
double scale() {
  const char* s = std::getenv("FP8LAB_TEST_SCALE");
  return s ? std::atof(s) : 1.0;
}
}  // namespace

TEST(EveryEightBitFormat, FormatCount) { EXPECT_GT(formats().size(), 3000u); }

// Decoding a finite code and encoding it again gives the code back, in every mode.
TEST(EveryEightBitFormat, DecodeThenEncodeReturnsEveryFiniteCode) {
  for (const Format& f : formats()) {
    for (Rounding r : {Rounding::nearest_even, Rounding::toward_zero, Rounding::stochastic, Rounding::nearest_away}) {
      const QuantSpec q = spec(f, r);
      for (std::uint32_t c = 0; c < 256; ++c) {
        const auto cls = f.classify(c);
        if (cls == Format::Class::nan || cls == Format::Class::inf) continue;
        const float v = decode(c, f);
        // Values beyond float32's range cannot be decoded exactly (E = 7 with a bias <= 0).
        if (static_cast<double>(std::fabs(v)) != f.magnitude(c & f.mag_mask())) continue;
        ASSERT_EQ(encode(v, q, c), c) << to_string(f) << " code " << c << " value " << v
                                      << " mode " << to_string(r);
      }
    }
  }
}

// Between every pair of neighbouring values, 0.49, 0.50 and 0.51 of the gap round as
// docs/spec.md §2 says, on both signs, in every mode; the top gap (max to the next power) too.
TEST(EveryEightBitFormat, NeighbourGapsRoundAsSpecified) {
  std::uint64_t checked = 0;
  for (const Format& f : formats()) {
    const ref::Table t(f);
    const std::uint32_t maxc = f.max_code();
    for (std::uint32_t k = 0; k <= maxc; ++k) {
      const double lo = t.vals[k], hi = t.vals[k + 1];
      if (hi > 3.4e38 || (lo > 0 && lo < 0x1p-126)) continue;  // keep points exact in float32
      for (double frac : {0.49, 0.50, 0.51}) {
        const double xd = lo + (hi - lo) * frac;
        const float x = static_cast<float>(xd);
        if (static_cast<double>(x) != xd && frac == 0.50) continue;
        if (!(x > lo && x < hi)) continue;
        for (int sgn : {1, -1}) {
          const float sx = sgn * x;
          if (sgn < 0 && !f.sign) {  // below an unsigned format's range (docs/spec.md §1.4)
            const std::uint32_t below = f.has_nan() ? f.nan_code(false) : 0;
            for (Rounding r : {Rounding::nearest_even, Rounding::toward_zero, Rounding::stochastic, Rounding::nearest_away})
              ASSERT_EQ(encode(sx, spec(f, r)), below) << to_string(f);
            continue;
          }
          const std::uint32_t S = sgn < 0 ? f.sign_bit() : 0;
          auto mag_of = [&](std::uint32_t code) { return code & f.mag_mask(); };
          // Nearest even.
          {
            const QuantSpec q = spec(f, Rounding::nearest_even, Overflow::nan);
            const std::uint32_t c = encode(sx, q);
            std::uint32_t want;
            if (frac < 0.5) want = k;
            else if (frac > 0.5) want = k + 1;
            else want = (f.man_bits == 0 && lo > 0) ? k + 1 : (k % 2 == 0 ? k : k + 1);
            if (want > maxc) {
              ASSERT_EQ(c, f.has_nan() ? f.nan_code(sgn < 0) : (S | maxc)) << to_string(f) << " k " << k;
            } else if (want == 0) {
              ASSERT_EQ(mag_of(c), 0u) << to_string(f);
              ASSERT_EQ(c, f.signed_zero() ? S : 0u) << to_string(f);
            } else {
              ASSERT_EQ(c, S | want) << to_string(f) << " k " << k << " frac " << frac << " sign " << sgn;
            }
          }
          // Nearest, ties away from zero: the upper magnitude from the midpoint on.
          {
            const QuantSpec q = spec(f, Rounding::nearest_away, Overflow::nan);
            const std::uint32_t c = encode(sx, q);
            const std::uint32_t want = frac < 0.5 ? k : k + 1;
            if (want > maxc) {
              ASSERT_EQ(c, f.has_nan() ? f.nan_code(sgn < 0) : (S | maxc)) << to_string(f) << " k " << k;
            } else if (want == 0) {
              ASSERT_EQ(mag_of(c), 0u) << to_string(f);
            } else {
              ASSERT_EQ(c, S | want) << to_string(f) << " k " << k << " frac " << frac << " sign " << sgn;
            }
          }
          // Toward zero: always the lower magnitude.
          {
            const QuantSpec q = spec(f, Rounding::toward_zero);
            const std::uint32_t c = encode(sx, q);
            ASSERT_EQ(mag_of(c), k) << to_string(f);
          }
          // Stochastic: one of the two neighbours (hi overflows to max when saturating).
          {
            const QuantSpec q = spec(f, Rounding::stochastic);
            for (std::uint64_t i = 0; i < 4; ++i) {
              const std::uint32_t m = mag_of(encode(sx, q, i));
              ASSERT_TRUE(m == k || m == std::min(k + 1, maxc)) << to_string(f) << " k " << k;
            }
          }
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 1000000u);
}

// The codec against the independent reference on random inputs of every exponent, inputs
// near the format's values, and the special values, for every format, mode and overflow.
TEST(EveryEightBitFormat, CodecMatchesIndependentReference) {
  const int per_format = static_cast<int>(600 * scale());
  std::uint64_t checked = 0;
  ref::InputGen gen(99);
  const float specials[] = {0.0f, -0.0f, std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(), 0x1p-149f, -0x1p-149f,
                            std::numeric_limits<float>::max(), 0x1p-126f};
  for (const Format& f : formats()) {
    const ref::Table t(f);
    for (Rounding r : {Rounding::nearest_even, Rounding::toward_zero, Rounding::stochastic, Rounding::nearest_away}) {
      for (Overflow o : {Overflow::saturate, Overflow::nan}) {
        QuantSpec q = spec(f, r, o);
        q.random_bits = (checked % 3 == 0) ? 32 : static_cast<std::uint8_t>(1 + checked % 32);
        auto check = [&](float x, std::uint64_t idx) {
          const std::uint32_t got = encode(x, q, idx), want = ref::encode(t, q, x, idx);
          ASSERT_EQ(got, want) << to_string(f) << " x=" << x << " (" << std::hexfloat << x
                               << ") mode " << to_string(r) << " R " << int(q.random_bits);
        };
        for (float x : specials) check(x, checked);
        for (int i = 0; i < per_format; ++i) {
          const float x = (i & 1) ? gen.any_bits() : gen.near(t);
          check(x, gen.next());
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 10000000u * scale() * 0.9);
}

// The ml_dtypes formats (and fp16/bf16) against the reference on many more inputs each.
TEST(EveryEightBitFormat, PresetsMatchReferenceOnManyInputs) {
  const int n = static_cast<int>(1000000 * scale());
  ref::InputGen gen(2024);
  for (const char* name : {"e4m3fnuz", "e4m3b11fnuz", "e5m2fnuz", "e4m3fn", "e5m2", "e3m4",
                           "e2m3fn", "e3m2fn", "e2m1fn", "fp16", "bf16", "dlfloat16"}) {
    const Format f = parse_format(name);
    const ref::Table t(f);
    for (Overflow o : {Overflow::saturate, f.has_inf() ? Overflow::inf : Overflow::nan}) {
      QuantSpec q = spec(f, Rounding::nearest_even, o);
      for (int i = 0; i < n; ++i) {
        const float x = (i % 3 == 0) ? gen.near(t) : gen.any_bits();
        ASSERT_EQ(encode(x, q), ref::encode(t, q, x, 0))
            << name << " x=" << std::hexfloat << x;
      }
    }
  }
}
