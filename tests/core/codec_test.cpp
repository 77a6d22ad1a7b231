// The codec against docs/spec.md §2.4's worked examples and special-value rules, format by format.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>

#include "fp8lab/core/codec.hpp"
#include "fp8lab/core/format.hpp"

using namespace fp8lab;

namespace {
QuantSpec spec(const char* fmt, Overflow o = Overflow::saturate,
               Rounding r = Rounding::nearest_even) {
  QuantSpec q;
  q.format = parse_format(fmt);
  q.overflow = o;
  q.rounding = r;
  return q;
}
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();
}  // namespace

TEST(Codec, SpecExamplesE4m3fnuz) {
  const QuantSpec sat = spec("e4m3fnuz"), nan = spec("e4m3fnuz", Overflow::nan);
  EXPECT_EQ(quantize(247.9f, sat), 240.0f);
  EXPECT_EQ(encode(247.9f, sat), 0x7fu);
  // 248 is a tie between 240 (odd) and 256 (even): 256 > max, so it overflows.
  EXPECT_EQ(encode(248.0f, sat), 0x7fu);
  EXPECT_EQ(encode(248.0f, nan), 0x80u);
  EXPECT_TRUE(std::isnan(quantize(248.0f, nan)));
  EXPECT_EQ(encode(247.99998f, nan), 0x7fu);
  // Half the smallest subnormal (2^-11) ties to +0; -2^-12 gives 0x00, never 0x80.
  EXPECT_EQ(encode(0x1p-11f, sat), 0x00u);
  EXPECT_EQ(encode(-0x1p-12f, sat), 0x00u);
  EXPECT_EQ(encode(-0x1p-11f, sat), 0x00u);
  EXPECT_EQ(std::bit_cast<std::uint32_t>(quantize(-0x1p-12f, sat)), 0u);  // +0.0f
  EXPECT_EQ(encode(0x1.8p-11f, sat), 0x01u);
  EXPECT_EQ(encode(-0x1.8p-11f, sat), 0x81u);
  EXPECT_EQ(encode(-0.0f, sat), 0x00u);
}

TEST(Codec, NaNInputs) {
  EXPECT_EQ(encode(kNaN, spec("e5m2")), 0x7eu);
  EXPECT_EQ(encode(-kNaN, spec("e5m2")), 0xfeu);
  EXPECT_EQ(encode(kNaN, spec("e4m3fn")), 0x7fu);
  EXPECT_EQ(encode(-kNaN, spec("e4m3fn")), 0xffu);
  EXPECT_EQ(encode(kNaN, spec("e4m3fnuz")), 0x80u);
  EXPECT_EQ(encode(-kNaN, spec("e5m2fnuz")), 0x80u);
  EXPECT_EQ(encode(kNaN, spec("fp16")), 0x7e00u);
  // A finite format has no NaN: encoding stores +0 and counts it; fake quantization keeps it.
  QuantCounts c;
  EXPECT_EQ(encode(kNaN, spec("e2m1fn"), 0, &c), 0x0u);
  EXPECT_EQ(c.nan, 1u);
  EXPECT_TRUE(std::isnan(quantize(kNaN, spec("e2m1fn"))));
  EXPECT_TRUE(std::signbit(quantize(-kNaN, spec("e2m1fn"))));
}

TEST(Codec, InfInputsStayVisible) {
  for (Overflow o : {Overflow::saturate, Overflow::nan}) {
    EXPECT_EQ(encode(kInf, spec("e4m3fnuz", o)), 0x80u);
    EXPECT_EQ(encode(-kInf, spec("e4m3fnuz", o)), 0x80u);
    EXPECT_EQ(encode(kInf, spec("e4m3fn", o)), 0x7fu);
    EXPECT_EQ(encode(-kInf, spec("e4m3fn", o)), 0xffu);
    EXPECT_EQ(encode(kInf, spec("e5m2", o)), 0x7cu);
    EXPECT_EQ(encode(-kInf, spec("e5m2", o)), 0xfcu);
    EXPECT_EQ(encode(kInf, spec("e2m1fn", o)), 0x7u);
    EXPECT_EQ(encode(-kInf, spec("e2m1fn", o)), 0xfu);
  }
  EXPECT_EQ(quantize(-kInf, spec("e5m2")), -kInf);
  EXPECT_EQ(quantize(kInf, spec("e2m1fn")), 6.0f);
}

TEST(Codec, OverflowModes) {
  // e4m3fn: max 448; 464 ties to 448 (even mantissa); above that overflows.
  EXPECT_EQ(encode(464.0f, spec("e4m3fn", Overflow::nan)), 0x7eu);
  EXPECT_EQ(encode(464.1f, spec("e4m3fn", Overflow::nan)), 0x7fu);
  EXPECT_EQ(encode(-464.1f, spec("e4m3fn", Overflow::nan)), 0xffu);
  EXPECT_EQ(encode(-1e9f, spec("e4m3fn")), 0xfeu);
  // e5m2: 61440 ties between 57344 (odd) and 65536 (even) -> overflow.
  EXPECT_EQ(encode(61440.0f, spec("e5m2", Overflow::inf)), 0x7cu);
  EXPECT_EQ(encode(61439.0f, spec("e5m2", Overflow::inf)), 0x7bu);
  EXPECT_EQ(encode(-61440.0f, spec("e5m2", Overflow::nan)), 0xfeu);
  EXPECT_EQ(encode(61440.0f, spec("e5m2")), 0x7bu);
  // Finite formats saturate in every mode (no NaN code), counting the overflow.
  QuantCounts c;
  EXPECT_EQ(encode(7.0f, spec("e2m1fn", Overflow::nan), 0, &c), 0x7u);
  EXPECT_EQ(c.overflow, 1u);
  EXPECT_EQ(c.nan, 0u);
  // Toward zero still overflows past max: the unbounded result is >= the next power.
  EXPECT_EQ(encode(300.0f, spec("e4m3fnuz", Overflow::nan, Rounding::toward_zero)), 0x80u);
  EXPECT_EQ(encode(255.0f, spec("e4m3fnuz", Overflow::nan, Rounding::toward_zero)), 0x7fu);
}

TEST(Codec, TiesGoToEven) {
  // e2m1fn values 0 .5 1 1.5 2 3 4 6.
  EXPECT_EQ(quantize(5.0f, spec("e2m1fn")), 4.0f);
  EXPECT_EQ(quantize(3.5f, spec("e2m1fn")), 4.0f);
  EXPECT_EQ(quantize(2.5f, spec("e2m1fn")), 2.0f);
  EXPECT_EQ(quantize(1.25f, spec("e2m1fn")), 1.0f);
  EXPECT_EQ(quantize(0.25f, spec("e2m1fn")), 0.0f);
  EXPECT_EQ(quantize(0.75f, spec("e2m1fn")), 1.0f);
  EXPECT_EQ(quantize(-0.25f, spec("e2m1fn")), -0.0f);
  EXPECT_TRUE(std::signbit(quantize(-0.25f, spec("e2m1fn"))));
  // M = 0: a tie between 2^e and 2^(e+1) goes up (the carry makes the significand even).
  EXPECT_EQ(quantize(1.5f, spec("1.7.0:64")), 2.0f);
  EXPECT_EQ(quantize(3.0f, spec("1.7.0:63")), 4.0f);
  EXPECT_EQ(quantize(1.4f, spec("1.7.0:64")), 1.0f);
}

TEST(Codec, ScaledInteger) {
  // 1.0.7 bias -2: q = 2^(1+2-7) = 2^-4, max 127/16.
  const QuantSpec q = spec("1.0.7:-2");
  EXPECT_EQ(quantize(1.0f, q), 1.0f);
  EXPECT_EQ(quantize(0.03125f, q), 0.0f);     // tie -> even (0)
  EXPECT_EQ(quantize(0.09375f, q), 0.125f);   // tie between 1q and 2q -> 2q
  EXPECT_EQ(quantize(100.0f, q), 127.0f / 16);
  EXPECT_EQ(encode(-1.0f, q), 0x80u | 16u);
  EXPECT_EQ(encode(-0.0f, spec("1.0.7:-2:finite")), 0x80u);
}

TEST(Codec, SubnormalsOff) {
  // dlfloat16 has no subnormals: below minpos = 2^-31 (1 + 2^-9) the neighbours are 0 and minpos.
  const QuantSpec q = spec("dlfloat16");
  const double minpos = 0x1.008p-31;
  EXPECT_EQ(quantize(static_cast<float>(minpos), q), static_cast<float>(minpos));
  EXPECT_EQ(quantize(static_cast<float>(minpos * 0.51), q), static_cast<float>(minpos));
  EXPECT_EQ(quantize(static_cast<float>(minpos * 0.49), q), 0.0f);
  EXPECT_EQ(quantize(0x1p-31f, q), static_cast<float>(minpos));  // 2^-31 is not a value
  EXPECT_EQ(encode(0x1p-31f, q), 0x0001u);
  // The exact half ties to 0 (code 0 is even).
  const QuantSpec q8 = spec("1.4.3:7:nosub");  // minpos = 2^-7 * 1.125
  EXPECT_EQ(quantize(0x1.2p-8f, q8), 0.0f);
  EXPECT_EQ(quantize(0x1.21p-8f, q8), 0x1.2p-7f);
  EXPECT_EQ(decode(0x00, q8.format), 0.0f);
  EXPECT_EQ(decode(0x01, q8.format), 0x1.2p-7f);
}

TEST(Codec, DecodeEveryPresetCodeMatchesItsValue) {
  for (const auto& p : presets()) {
    if (!p.format.codable()) continue;
    const Format& f = p.format;
    for (std::uint32_t c = 0; c < (1u << f.width()); ++c) {
      const float v = decode(c, f);
      const auto cls = f.classify(c);
      if (cls == Format::Class::nan) {
        ASSERT_TRUE(std::isnan(v)) << p.name << " " << c;
        continue;
      }
      if (cls == Format::Class::inf) {
        ASSERT_TRUE(std::isinf(v));
        continue;
      }
      const double mag = f.magnitude(c & f.mag_mask());
      ASSERT_EQ(static_cast<double>(std::fabs(v)), mag) << p.name << " code " << c;
      ASSERT_EQ(std::signbit(v), (c & f.sign_bit()) != 0) << p.name << " code " << c;
    }
  }
}

TEST(Codec, WideFormatsQuantize) {
  // fp32 is the identity; bf16 rounds to 8 significant bits.
  const QuantSpec fp32 = spec("fp32");
  for (float x : {1.0f, 3.14159f, -1e-40f, 1e38f, 0x1p-149f})
    EXPECT_EQ(std::bit_cast<std::uint32_t>(quantize(x, fp32)), std::bit_cast<std::uint32_t>(x));
  EXPECT_EQ(quantize(1.00390625f, spec("bf16")), 1.0f);        // tie -> even
  EXPECT_EQ(quantize(1.01171875f, spec("bf16")), 1.015625f);   // tie -> even (up)
  EXPECT_EQ(quantize(0x1p-134f, spec("bf16")), 0.0f);          // half of min subnormal
  EXPECT_EQ(quantize(0x1.8p-134f, spec("bf16")), 0x1p-133f);
  EXPECT_EQ(quantize(65520.0f, spec("fp16", Overflow::inf)), std::numeric_limits<float>::infinity());
  EXPECT_EQ(quantize(65519.0f, spec("fp16", Overflow::inf)), 65504.0f);
}

TEST(Codec, StochasticIsReproducibleAndSeeded) {
  QuantSpec q = spec("e4m3fnuz", Overflow::saturate, Rounding::stochastic);
  q.seed = 42;
  int differ = 0;
  for (std::uint64_t i = 0; i < 1000; ++i) {
    const float x = 1.0f + 0.0625f * 0.3f;
    ASSERT_EQ(encode(x, q, i), encode(x, q, i));
    QuantSpec q2 = q;
    q2.seed = 43;
    differ += encode(x, q, i) != encode(x, q2, i);
  }
  EXPECT_GT(differ, 200);
}

// Mean error of stochastic rounding is zero: 10^6 draws of one input between neighbours.
TEST(Codec, StochasticIsUnbiased) {
  struct Case {
    const char* fmt;
    float x;
    int R;
  } cases[] = {
      {"e4m3fnuz", 1.0f + 0.125f * 0.3f, 32},     // normal range, p = 0.3
      {"e4m3fnuz", 0x1p-10f * 0.01f, 32},         // far below the smallest subnormal
      {"e5m2", -3.3f, 32},
      {"1.0.7:-2", 0.0625f * 5.77f, 32},
      {"dlfloat16", static_cast<float>(0x1.008p-31 * 0.37), 32},  // no-subnormal gap
      {"e4m3fnuz", 1.0f + 0.125f * (76.0f / 256), 8},  // R = 8: unbiased when the fraction has <= 8 bits
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.fmt);
    QuantSpec q = spec(c.fmt, Overflow::saturate, Rounding::stochastic);
    q.seed = 7;
    q.random_bits = static_cast<std::uint8_t>(c.R);
    QuantSpec ne = spec(c.fmt);
    const double lo = quantize(c.x, [&] { QuantSpec t = ne; t.rounding = Rounding::toward_zero; return t; }());
    double sum = 0, sum2 = 0;
    const int n = 1000000;
    for (int i = 0; i < n; ++i) {
      const double e = static_cast<double>(quantize(c.x, q, static_cast<std::uint64_t>(i))) - c.x;
      sum += e;
      sum2 += e * e;
    }
    const double mean = sum / n;
    const double sd = std::sqrt(sum2 / n - mean * mean);
    EXPECT_LT(std::fabs(mean), 4 * sd / std::sqrt(static_cast<double>(n)) + 1e-30)
        << "mean error " << mean << " (lo " << lo << ")";
    EXPECT_GT(sd, 0);
  }
}

// With R random bits only the top R bits of the fraction count (documented truncation).
TEST(Codec, StochasticWithFewBitsTruncatesTheFraction) {
  QuantSpec q = spec("e4m3fnuz", Overflow::saturate, Rounding::stochastic);
  q.random_bits = 2;
  // Fraction 0.2 of the gap: top 2 bits are 00 -> never rounds up.
  const float x = 1.0f + 0.125f * 0.2f;
  for (std::uint64_t i = 0; i < 10000; ++i) ASSERT_EQ(quantize(x, q, i), 1.0f);
  // Fraction 0.75 -> rounds up with probability exactly 3/4.
  const float y = 1.0f + 0.125f * 0.75f;
  int ups = 0;
  for (std::uint64_t i = 0; i < 100000; ++i) ups += quantize(y, q, i) > 1.0f;
  EXPECT_NEAR(ups / 100000.0, 0.75, 0.01);
}

TEST(Codec, CountsWhatHappened) {
  QuantCounts c;
  const QuantSpec q = spec("e4m3fnuz", Overflow::nan);
  for (float x : {1.0f, 1e-9f, -1e-9f, 0.0f, 1000.0f, kNaN, kInf}) encode(x, q, 0, &c);
  EXPECT_EQ(c.total, 7u);
  EXPECT_EQ(c.underflow, 2u);
  EXPECT_EQ(c.overflow, 2u);  // 1000 and Inf
  EXPECT_EQ(c.nan, 3u);       // 1000 -> NaN, NaN, Inf -> NaN
}

TEST(Codec, RequireCodable) {
  EXPECT_THROW(require_codable(parse_format("fp32")), Error);
  EXPECT_NO_THROW(require_codable(parse_format("fp16")));
}

// E8M0 (docs/spec.md §1.4): code c is 2^(c-127) for c < 255, NaN at 255; no zero, no sign.
TEST(Codec, E8m0IsEveryPowerOfTwoAndNaN) {
  const QuantSpec q = spec("e8m0");
  EXPECT_EQ(to_string(q.format), "0.8.0:fn:nosub:nozero");  // bias 127 is natural
  EXPECT_EQ(parse_format("0.8.0:fn:nosub:nozero"), q.format);
  EXPECT_EQ(q.format.width(), 8);
  EXPECT_EQ(q.format.finite_count(), 255u);
  for (std::uint32_t c = 0; c < 255; ++c) {
    EXPECT_EQ(decode(c, q.format), std::ldexp(1.0f, static_cast<int>(c) - 127)) << c;
    EXPECT_EQ(q.format.classify(c), Format::Class::normal) << c;
    EXPECT_EQ(encode(std::ldexp(1.0f, static_cast<int>(c) - 127), q), c) << c;
  }
  EXPECT_TRUE(std::isnan(decode(255, q.format)));
  QuantCounts n;
  // Zero and everything below 2^-127 give code 0, counted as underflow.
  for (float x : {0.0f, -0.0f, std::ldexp(1.0f, -128), std::ldexp(1.0f, -149)}) EXPECT_EQ(encode(x, q, 0, &n), 0u) << x;
  EXPECT_EQ(n.underflow, 4u);
  // Negative inputs and NaN give NaN; +Inf overflows to NaN; above 2^127 saturates.
  for (float x : {-1.0f, -kInf, kNaN, kInf}) EXPECT_EQ(encode(x, q), 255u) << x;
  EXPECT_EQ(encode(std::numeric_limits<float>::max(), q), 254u);
  EXPECT_EQ(encode(std::numeric_limits<float>::max(), spec("e8m0", Overflow::nan)), 255u);
  // Nearest: 1.4 * 2^k goes down, 1.5 * 2^k (the tie between 2^k and 2^(k+1)) goes up, as
  // IEEE 754 does for one-significand-bit formats; toward zero always goes down.
  EXPECT_EQ(encode(1.4f, q), 127u);
  EXPECT_EQ(encode(1.5f, q), 128u);
  EXPECT_EQ(encode(1.99f, spec("e8m0", Overflow::saturate, Rounding::toward_zero)), 127u);
}

// UE4M3 (the NVFP4 block scale): the non-negative half of e4m3fn, NaN at 0x7f.
TEST(Codec, Ue4m3IsThePositiveHalfOfE4m3fn) {
  const QuantSpec u = spec("ue4m3"), s = spec("e4m3fn");
  EXPECT_EQ(to_string(u.format), "0.4.3:fn");
  EXPECT_EQ(u.format.width(), 7);
  for (std::uint32_t c = 0; c < 128; ++c) {
    const float a = decode(c, u.format), b = decode(c, s.format);
    if (std::isnan(b)) {
      EXPECT_TRUE(std::isnan(a)) << c;
    } else {
      EXPECT_EQ(a, b) << c;
    }
  }
  // Every positive float32 with the low 12 bits clear, and the midpoints of e4m3fn: the same
  // code as e4m3fn gives.
  for (std::uint32_t bits = 0; bits < 0x7f800000u; bits += 0x1000u) {
    const float x = std::bit_cast<float>(bits);
    ASSERT_EQ(encode(x, u), encode(x, s)) << x;
  }
  for (std::uint32_t c = 0; c + 1 < 0x7f; ++c) {
    const float mid = (decode(c, s.format) + decode(c + 1, s.format)) / 2;
    ASSERT_EQ(encode(mid, u), encode(mid, s)) << mid;
  }
  EXPECT_EQ(encode(-0.0f, u), 0u);
  EXPECT_EQ(encode(-1.0f, u), 0x7fu);
  EXPECT_EQ(encode(1e6f, u), 0x7eu);  // saturates at 448
}
