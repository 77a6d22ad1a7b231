// Every kernel, on every SIMD target this CPU runs, bit-exact against the scalar codec.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#include "../common/reference.hpp"
#include "fp8lab/core/codec.hpp"
#include "fp8lab/kernels/kernels.hpp"

using namespace fp8lab;

namespace {

std::vector<Format> kernel_formats() {
  std::vector<Format> out;
  for (const auto& p : presets())
    if (p.format.codable()) out.push_back(p.format);
  const auto all = ref::eight_bit_formats();
  for (std::size_t i = 0; i < all.size(); i += 53) out.push_back(all[i]);
  for (const char* s : {"1.4.3:10", "1.4.3:14", "1.5.2:24", "1.5.2:33", "1.0.7:-2", "1.0.7:3",
                        "1.8.7:127", "1.8.7:130", "1.8.7:-2", "1.5.10:20", "1.7.0:63",
                        "1.3.2:3:finite", "1.6.9:31:fn:nosub", "1.2.1:1:finite", "1.0.15:5",
                        "1.1.6:0:fn"})
    out.push_back(parse_format(s));
  return out;
}

std::vector<float> inputs(const Format& f, std::size_t n, std::uint64_t seed) {
  ref::InputGen gen(seed);
  const ref::Table t(f.width() <= 12 ? f : parse_format("1.4.3"));
  std::vector<float> x(n);
  const float specials[] = {0.0f, -0.0f, std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(),
                            -std::numeric_limits<float>::quiet_NaN(), 0x1p-149f, -0x1.fp-130f,
                            std::numeric_limits<float>::max(), 1e30f, -1e-30f};
  for (std::size_t i = 0; i < n; ++i) {
    if (i < std::size(specials)) x[i] = specials[i];
    else if (i % 3 == 0) x[i] = gen.near(t);
    else if (i % 3 == 1) x[i] = gen.any_bits();
    else x[i] = static_cast<float>(static_cast<std::int64_t>(gen.next() % 2001) - 1000) *
                std::ldexp(1.0f, static_cast<int>(gen.next() % 40) - 30);
  }
  return x;
}

// What the SIMD fast path sees in training: values in the format's normal range (and a
// few past its max) mixed with +-0, as in ReLU outputs and the gradients through them;
// runs of whole vectors without zeros too.
std::vector<float> normal_or_zero_inputs(const Format& f, std::size_t n, std::uint64_t seed) {
  ref::InputGen gen(seed);
  const int emin = std::max(f.emin(), -126);
  const int emax = std::min(static_cast<int>(std::ilogb(f.max_finite())), 126);
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) {
    const bool dense = (i / 64) % 3 == 2;  // every third run of 64 has no zeros
    const std::uint64_t r = gen.next();
    if (!dense && r % 2 == 0) {
      x[i] = (r & 4) ? -0.0f : 0.0f;
      continue;
    }
    const int e = emin + static_cast<int>((r >> 8) % static_cast<std::uint64_t>(emax - emin + 2));
    const float m = 1.0f + static_cast<float>((r >> 20) & 0x7fffff) * 0x1p-23f;
    x[i] = std::ldexp((r & 2) ? -m : m, e);
  }
  return x;
}

std::uint32_t bits(float v) { return std::bit_cast<std::uint32_t>(v); }

class AllTargets : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { kernels::use_target(GetParam()); }
  void TearDown() override { kernels::use_target(""); }
};

}  // namespace

TEST_P(AllTargets, QuantizeEncodeDecodeMatchScalar) {
  ASSERT_EQ(kernels::current_target(), GetParam());
  const std::size_t n = 1000 + 37;  // not a multiple of any vector width: tails run too
  const std::uint64_t offset = 123456789;
  int fast = 0;
  for (const Format& f : kernel_formats()) {
    fast += kernels::has_fast_path(f);
    for (int set = 0; set < 2; ++set) {
    const auto x = set == 0 ? inputs(f, n, f.bias * 131 + f.exp_bits)
                            : normal_or_zero_inputs(f, n, f.bias * 17 + f.man_bits);
    for (Rounding r : {Rounding::nearest_even, Rounding::toward_zero, Rounding::stochastic, Rounding::nearest_away}) {
      for (Overflow o : {Overflow::saturate, Overflow::nan, Overflow::inf}) {
        QuantSpec q;
        q.format = f;
        q.rounding = r;
        q.overflow = o;
        q.seed = 77;
        q.random_bits = (o == Overflow::nan) ? 9 : 32;
        try {
          validate(q);
        } catch (const Error&) {
          continue;
        }
        SCOPED_TRACE(to_string(f) + " " + std::string(to_string(r)) + " " +
                     std::string(to_string(o)) + (set ? " normal-or-zero inputs" : ""));
        // Scalar expectations.
        std::vector<float> want_q(n);
        std::vector<std::uint32_t> want_c(n);
        QuantCounts want_counts, want_counts_enc;
        for (std::size_t i = 0; i < n; ++i) {
          want_q[i] = quantize(x[i], q, offset + i, &want_counts);
          want_c[i] = encode(x[i], q, offset + i, &want_counts_enc);
        }
        std::vector<float> y(n);
        QuantCounts counts;
        kernels::quantize(x.data(), y.data(), n, q, offset, &counts);
        for (std::size_t i = 0; i < n; ++i)
          ASSERT_EQ(bits(y[i]), bits(want_q[i])) << "i=" << i << " x=" << std::hexfloat << x[i];
        EXPECT_EQ(counts, want_counts);
        // In place, without counts.
        std::vector<float> z = x;
        kernels::quantize(z.data(), z.data(), n, q, offset);
        ASSERT_EQ(std::memcmp(z.data(), y.data(), n * 4), 0);
        // Codes.
        if (f.width() <= 8) {
          std::vector<std::uint8_t> c(n);
          QuantCounts cc;
          kernels::encode(x.data(), c.data(), n, q, offset, &cc);
          for (std::size_t i = 0; i < n; ++i)
            ASSERT_EQ(c[i], want_c[i]) << "i=" << i << " x=" << std::hexfloat << x[i];
          EXPECT_EQ(cc, want_counts_enc);
          // Both outputs in one pass.
          std::vector<float> y2(n);
          std::vector<std::uint8_t> c2(n);
          QuantCounts c2c;
          kernels::quantize_and_encode(x.data(), y2.data(), c2.data(), n, q, offset, &c2c);
          ASSERT_EQ(c2, c);
          ASSERT_EQ(std::memcmp(y2.data(), y.data(), n * 4), 0);
          EXPECT_EQ(c2c, want_counts_enc);
        }
        if (f.width() <= 16) {
          std::vector<std::uint16_t> c(n);
          kernels::encode(x.data(), c.data(), n, q, offset);
          for (std::size_t i = 0; i < n; ++i)
            ASSERT_EQ(c[i], want_c[i]) << "i=" << i << " x=" << std::hexfloat << x[i];
        }
      }
    }
    }
    // Decode every code (and garbage above the width, which is ignored).
    const std::uint32_t ncodes = 1u << f.width();
    std::vector<std::uint16_t> codes(ncodes + 3);
    for (std::uint32_t c = 0; c < ncodes + 3; ++c) codes[c] = static_cast<std::uint16_t>(c);
    std::vector<float> d(codes.size());
    kernels::decode(codes.data(), d.data(), codes.size(), f);
    for (std::uint32_t c = 0; c < codes.size(); ++c)
      ASSERT_EQ(bits(d[c]), bits(decode(c & (ncodes - 1), f))) << to_string(f) << " code " << c;
    if (f.width() <= 8) {
      std::vector<std::uint8_t> c8(256);
      for (int c = 0; c < 256; ++c) c8[c] = static_cast<std::uint8_t>(c);
      std::vector<float> d8(256);
      kernels::decode(c8.data(), d8.data(), 256, f);
      for (int c = 0; c < 256; ++c)
        ASSERT_EQ(bits(d8[c]), bits(decode(c & (ncodes - 1), f))) << to_string(f) << " code " << c;
    }
  }
  EXPECT_GT(fast, 40);  // most formats take the SIMD path
}

// Formats of at most 8 magnitudes round by counting breakpoints (Params::small): every
// 3- and 4-bit format with a mantissa bit, each policy and a spread of biases, on each
// value, each midpoint between neighbours (and past the largest), the floats on either
// side of them, both signs, NaN, Inf and tiny inputs, against the scalar codec.
TEST_P(AllTargets, SmallFormatsMatchTheCodecAtEveryBreakpoint) {
  int formats = 0;
  // Formats without exponent bits (1.0.M) are a grid of integers times 2^(1-bias-M): past
  // their largest value the next one is a grid step away, not a step of the binade.
  for (const char* name : {"e2m1fn", "1.2.1:0", "1.2.1:3:fn", "1.2.1:2:finite", "1.1.2:1", "1.1.2:-3:fn", "1.1.1:1",
                           "1.1.1:0:finite", "1.2.1:7", "1.0.3:-2", "1.0.3:-2:finite", "1.0.3:4", "1.0.2:0",
                           "1.0.1:1:finite"}) {
    const Format f = parse_format(name);
    std::vector<float> x{0.0f, -0.0f, std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
                         0x1p-149f, 1e-30f, 3e38f};
    for (std::uint32_t k = 0; k <= f.max_code(); ++k) {
      const double v = f.magnitude(k);
      // Past the largest value: a grid step (no exponent bits) or a step of its binade.
      const auto step = [&] { return f.exp_bits == 0 ? f.magnitude(1) : std::ldexp(1.0, std::ilogb(v) - f.man_bits); };
      const double next = k < f.max_code() ? f.magnitude(k + 1) : v + step();
      for (const double t : {v, (v + next) / 2, next}) {
        const auto c = static_cast<float>(t);
        for (const float y : {c, std::nextafter(c, 0.0f), std::nextafter(c, INFINITY)}) {
          x.push_back(y);
          x.push_back(-y);
        }
      }
    }
    while (x.size() % 37 != 0) x.push_back(0.75f);  // a tail that is no whole vector
    ++formats;
    for (Rounding r : {Rounding::nearest_even, Rounding::toward_zero, Rounding::nearest_away})
      for (Overflow o : {Overflow::saturate, Overflow::nan, Overflow::inf}) {
        QuantSpec q;
        q.format = f;
        q.rounding = r;
        q.overflow = o;
        try {
          validate(q);
        } catch (const Error&) {
          continue;
        }
        SCOPED_TRACE(std::string(name) + " " + std::string(to_string(r)) + " " + std::string(to_string(o)));
        std::vector<float> y(x.size()), want_y(x.size());
        std::vector<std::uint8_t> codes(x.size());
        QuantCounts counts, want_counts;
        for (std::size_t i = 0; i < x.size(); ++i) want_y[i] = quantize(x[i], q, i, &want_counts);
        kernels::quantize_and_encode(x.data(), y.data(), codes.data(), x.size(), q, 0, &counts);
        for (std::size_t i = 0; i < x.size(); ++i) {
          ASSERT_EQ(bits(y[i]), bits(want_y[i])) << "x=" << std::hexfloat << x[i];
          ASSERT_EQ(codes[i], encode(x[i], q, i)) << "x=" << std::hexfloat << x[i];
        }
        EXPECT_EQ(counts, want_counts);
      }
  }
  EXPECT_EQ(formats, 14);
}

#if defined(__x86_64__) || defined(__i386__)
// Nearest-even rounds by float32 addition on most formats (docs/spec.md §2.2): its results
// do not depend on the caller's flush-to-zero and denormals-are-zero modes, which training
// may set (train.flush_denormals). Every kernel format on float32 subnormals and on values
// about its own smallest subnormal, with both modes on, against the codec with both off.
TEST_P(AllTargets, NearestEvenIgnoresFlushToZeroModes) {
  const kernels::Runner serial = kernels::Runner::serial();  // the modes are this thread's
  int formats = 0;
  for (const Format& f : kernel_formats()) {
    QuantSpec q;
    q.format = f;
    const std::size_t n = 1000 + 37;
    std::vector<float> x = inputs(f, n, f.bias * 7 + 1);
    ref::InputGen gen(static_cast<std::uint64_t>(f.bias + 1000));
    for (std::size_t i = 0; i < n; i += 2) {
      const std::uint64_t r = gen.next();
      const int e = f.emin() - f.man_bits - 2 + static_cast<int>(r % 5);
      const float m = 1.0f + static_cast<float>((r >> 40) & 0xffffff) * 0x1p-24f;
      const float near_smallest = std::ldexp((r & 1) ? -m : m, std::max(e, -149));
      const float subnormal = std::bit_cast<float>(static_cast<std::uint32_t>(r >> 8) & 0x807fffffu);
      x[i] = (i / 2) % 2 ? subnormal : near_smallest;
    }
    std::vector<float> want(n), y(n);
    std::vector<std::uint16_t> want_c(n), c(n);
    for (std::size_t i = 0; i < n; ++i) {
      want[i] = quantize(x[i], q, i);
      if (f.width() <= 16) want_c[i] = static_cast<std::uint16_t>(encode(x[i], q, i));
    }
    const unsigned modes = _mm_getcsr();
    _mm_setcsr(modes | 0x8040u);  // FTZ and DAZ
    kernels::quantize(x.data(), y.data(), n, q, 0, nullptr, serial);
    if (f.width() <= 16) kernels::encode(x.data(), c.data(), n, q, 0, nullptr, serial);
    _mm_setcsr(modes);
    SCOPED_TRACE(to_string(f));
    for (std::size_t i = 0; i < n; ++i) {
      ASSERT_EQ(bits(y[i]), bits(want[i])) << "i=" << i << " x=" << std::hexfloat << x[i];
      if (f.width() <= 16) ASSERT_EQ(c[i], want_c[i]) << "x=" << std::hexfloat << x[i];
    }
    ++formats;
  }
  EXPECT_GT(formats, 40);
}
#endif

// float32 to bfloat16: the top halves, and whether every bottom half was zero, with one
// value that is not a bfloat16 value at each place (vectors and the tail).
TEST_P(AllTargets, ToBf16ExactKeepsTopHalvesAndFindsEveryInexactValue) {
  ref::InputGen gen(3);
  const std::size_t n = 1000 + 13;
  std::vector<float> x(n);
  for (float& v : x) v = std::bit_cast<float>(static_cast<std::uint32_t>(gen.next()) & 0xFFFF0000u);
  std::vector<std::uint16_t> y(n);
  ASSERT_TRUE(kernels::to_bf16_exact(x.data(), y.data(), n));
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(y[i], bits(x[i]) >> 16) << i;
  for (const std::size_t at : {std::size_t{0}, std::size_t{17}, n / 2, n - 1}) {
    std::vector<float> z = x;
    z[at] = std::bit_cast<float>(bits(z[at]) | 1u);
    EXPECT_FALSE(kernels::to_bf16_exact(z.data(), y.data(), n)) << at;
  }
}

// Quantization straight to bfloat16 (with and without codes): the scalar quantizer's values'
// top halves and its codes and counts, for every rounding (the stochastic stream indexed
// as in quantize()), over more than one chunk, with a tail; a format whose values are not
// all bfloat16 values is reported.
TEST_P(AllTargets, QuantizeBf16IsTheScalarQuantizersTopHalves) {
  const std::size_t n = 3 * 4096 + 77;
  const std::uint64_t offset = 991;
  int formats = 0;
  for (const char* name : {"e4m3fn", "e5m2", "1.4.3:10", "1.5.2:33", "e2m1fn"}) {
    const Format f = parse_format(name);
    const auto x = inputs(f, n, static_cast<std::uint64_t>(f.bias) * 7 + 3);
    for (Rounding r : {Rounding::nearest_even, Rounding::toward_zero, Rounding::stochastic, Rounding::nearest_away}) {
      QuantSpec q;
      q.format = f;
      q.rounding = r;
      q.seed = 5;
      SCOPED_TRACE(std::string(name) + " " + std::string(to_string(r)));
      std::vector<std::uint16_t> want(n);
      std::vector<std::uint8_t> want_codes(n);
      QuantCounts want_counts;
      for (std::size_t i = 0; i < n; ++i) {
        want[i] = static_cast<std::uint16_t>(bits(quantize(x[i], q, offset + i, &want_counts)) >> 16);
        want_codes[i] = static_cast<std::uint8_t>(encode(x[i], q, offset + i));
      }
      for (bool with_codes : {false, true}) {
        std::vector<std::uint16_t> y(n);
        std::vector<std::uint8_t> codes(n);
        QuantCounts counts;
        ASSERT_TRUE(kernels::quantize_bf16(x.data(), y.data(), with_codes ? codes.data() : nullptr, n, q, offset,
                                           &counts));
        for (std::size_t i = 0; i < n; ++i) {
          ASSERT_EQ(y[i], want[i]) << "i=" << i << " x=" << std::hexfloat << x[i];
          if (with_codes) {
            ASSERT_EQ(codes[i], want_codes[i]) << "i=" << i;
          }
        }
        EXPECT_EQ(counts, want_counts);
      }
    }
    ++formats;
  }
  EXPECT_EQ(formats, 5);
  QuantSpec wide;
  wide.format = parse_format("1.5.10");
  const std::vector<float> x(100, 1.0f + 0x1p-9f);
  std::vector<std::uint16_t> y(100);
  EXPECT_FALSE(kernels::quantize_bf16(x.data(), y.data(), nullptr, x.size(), wide));
}

// Codes straight to bfloat16: every code of every 8-bit format whose values are bfloat16
// values (in vectors and the tail) gives decode()'s top half; a format with a value below
// bfloat16's smallest subnormal gives false.
TEST_P(AllTargets, DecodeBf16IsTheTopHalfOfEveryCodesValue) {
  int formats = 0;
  for (const char* name : {"e4m3fn", "e5m2", "e4m3fnuz", "1.4.3:10", "1.5.2:31", "1.0.7", "1.7.0", "e2m1fn"}) {
    const Format f = parse_format(name);
    std::vector<std::uint8_t> codes;
    for (int rep = 0; rep < 3; ++rep)
      for (std::uint32_t c = 0; c < (1u << f.width()); ++c) codes.push_back(static_cast<std::uint8_t>(c));
    codes.resize(codes.size() - 5);  // a tail shorter than a vector
    std::vector<std::uint16_t> y(codes.size());
    ASSERT_TRUE(kernels::decode_bf16(codes.data(), y.data(), codes.size(), f)) << name;
    for (std::size_t i = 0; i < codes.size(); ++i) {
      const float v = decode(codes[i], f);
      ASSERT_EQ(y[i], bits(v) >> 16) << name << " code " << int(codes[i]);
      ASSERT_EQ(bits(v) & 0xFFFFu, 0u) << name << " code " << int(codes[i]);
    }
    ++formats;
  }
  EXPECT_EQ(formats, 8);
  const Format tiny = parse_format("1.7.0:200");  // 2^-199: no bfloat16 value
  std::vector<std::uint8_t> one{1};
  std::vector<std::uint16_t> y(1, 0xABCD);
  EXPECT_FALSE(kernels::decode_bf16(one.data(), y.data(), 1, tiny));
  EXPECT_EQ(y[0], 0xABCD);
}

INSTANTIATE_TEST_SUITE_P(Kernels, AllTargets, ::testing::ValuesIn(kernels::available_targets()),
                         [](const auto& info) { return info.param; });

TEST(Kernels, ThreadCountDoesNotChangeStochasticBits) {
  const std::size_t n = (std::size_t{1} << 20) + 123;
  QuantSpec q;
  q.format = parse_format("e5m2");
  q.rounding = Rounding::stochastic;
  q.seed = 5;
  std::vector<float> x(n);
  ref::InputGen gen(3);
  for (auto& v : x) v = static_cast<float>(static_cast<std::int64_t>(gen.next() % 100001) - 50000) * 1e-3f;
  std::vector<float> y1(n), y4(n);
  std::vector<std::uint8_t> c1(n), c4(n);
  const int before = kernels::num_threads();
  kernels::set_num_threads(1);
  kernels::quantize(x.data(), y1.data(), n, q, 99);
  kernels::encode(x.data(), c1.data(), n, q, 99);
  kernels::set_num_threads(4);
  QuantCounts c;
  kernels::quantize(x.data(), y4.data(), n, q, 99, &c);
  kernels::encode(x.data(), c4.data(), n, q, 99);
  kernels::set_num_threads(before);
  EXPECT_EQ(std::memcmp(y1.data(), y4.data(), n * 4), 0);
  EXPECT_EQ(c1, c4);
  EXPECT_EQ(c.total, n);
  // And a different offset moves the stream.
  std::vector<float> y5(n);
  kernels::quantize(x.data(), y5.data(), n, q, 100);
  EXPECT_NE(std::memcmp(y1.data(), y5.data(), n * 4), 0);
}

// A kernel called with the default runner from inside a part of the pool's own job (a
// caller's parallel_for whose parts quantize) runs on that part's thread and gives the same
// bits, rather than waiting for the busy pool.
TEST(Kernels, AKernelInsideAPoolPartRunsOnItsThread) {
  const int before = kernels::num_threads();
  kernels::set_num_threads(4);
  QuantSpec q;
  q.format = parse_format("e5m2");
  q.rounding = Rounding::stochastic;
  q.seed = 9;
  const std::size_t rows = 8, cols = std::size_t{1} << 17;  // each row above kParallelThreshold
  ASSERT_GE(cols, kernels::kParallelThreshold);
  std::vector<float> x(rows * cols), nested(rows * cols), flat(rows * cols);
  ref::InputGen gen(4);
  for (auto& v : x) v = static_cast<float>(static_cast<std::int64_t>(gen.next() % 20001) - 10000) * 1e-3f;
  kernels::parallel_for(rows * cols, cols, [&](std::size_t b, std::size_t e) {
    for (std::size_t r = b; r < e; r += cols) kernels::quantize(x.data() + r, nested.data() + r, cols, q, r);
  });
  kernels::quantize(x.data(), flat.data(), rows * cols, q, 0);
  kernels::set_num_threads(before);
  EXPECT_EQ(std::memcmp(nested.data(), flat.data(), flat.size() * 4), 0);
}

TEST(Kernels, IndexSegmentsCrossing2To32) {
  const std::size_t n = 5000;
  QuantSpec q;
  q.format = parse_format("e4m3fnuz");
  q.rounding = Rounding::stochastic;
  q.seed = 11;
  std::vector<float> x(n, 1.03f), y(n);
  const std::uint64_t offset = (std::uint64_t{1} << 32) - 1234;
  kernels::quantize(x.data(), y.data(), n, q, offset);
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(bits(y[i]), bits(quantize(x[i], q, offset + i)));
}

TEST(Kernels, ExponentHistogramMatchesIlogb) {
  const std::size_t n = 300000;
  std::vector<float> x = inputs(parse_format("1.4.3"), n, 8);
  x[20] = 0x1p-149f;
  x[21] = 0x1.fffffep-127f;
  kernels::ExpHistogram want;
  for (float v : x) {
    if (std::isnan(v)) ++want.nan;
    else if (std::isinf(v)) ++want.inf;
    else if (v == 0) ++want.zero;
    else ++want.at(std::ilogb(v));
  }
  EXPECT_EQ(kernels::exponent_histogram(x.data(), n), want);
  EXPECT_EQ(kernels::exponent_histogram(x.data(), n).total(), n);
  EXPECT_EQ(kernels::exponent_histogram(x.data(), 7), [&] {
    kernels::ExpHistogram h;
    for (int i = 0; i < 7; ++i) {
      if (std::isnan(x[i])) ++h.nan;
      else if (std::isinf(x[i])) ++h.inf;
      else if (x[i] == 0) ++h.zero;
      else ++h.at(std::ilogb(x[i]));
    }
    return h;
  }());
}

TEST(Kernels, RejectsWhatDoesNotFit) {
  QuantSpec q;
  q.format = parse_format("fp16");
  float x = 1;
  std::uint8_t c8;
  std::uint16_t c16;
  EXPECT_THROW(kernels::encode(&x, &c8, 1, q), Error);
  q.format = parse_format("fp32");
  EXPECT_THROW(kernels::encode(&x, &c16, 1, q), Error);
  float y;
  kernels::quantize(&x, &y, 1, q);  // fp32 fake quantization is allowed (identity)
  EXPECT_EQ(y, 1.0f);
  EXPECT_THROW(kernels::use_target("NO_SUCH_TARGET"), Error);
}
