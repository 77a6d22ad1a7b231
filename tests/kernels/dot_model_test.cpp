// The dot-product hardware model (docs/spec.md §7.4) against a slow reference that follows
// the definition in double arithmetic (exact for frac <= 45: every aligned term and group sum
// is a multiple of 2^(emax - F) below 2^(emax + 8)), bit for bit, on random and adversarial
// inputs; the OCP MX preset against exact block sums; and the model's names.
#include <gtest/gtest.h>

#include <cfenv>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "fp8lab/core/codec.hpp"
#include "fp8lab/core/dot_model.hpp"
#include "fp8lab/core/error.hpp"
#include "fp8lab/core/format.hpp"
#include "fp8lab/kernels/dot_model.hpp"

using namespace fp8lab;

namespace {

// x / quantum rounded to an integer as the model says (truncate or nearest-even), times quantum.
double round_to_quantum(double x, double quantum, bool nearest) {
  const double r = x / quantum;
  return (nearest ? std::nearbyint(r) : std::trunc(r)) * quantum;  // nearbyint: ties to even (the default mode)
}

// A value rounded into a W-bit accumulator with float32's exponent range.
float into_accumulator(double x, const DotModel& m) {
  if (x == 0) return 0.0f;
  const int qexp = std::max(std::ilogb(x) - (m.acc_bits - 1), -149);
  const double v = round_to_quantum(x, std::ldexp(1.0, qexp), m.acc_nearest);
  const double limit = std::ldexp(std::ldexp(1.0, m.acc_bits) - 1, 128 - m.acc_bits);
  if (std::fabs(v) > limit) return static_cast<float>(std::copysign(m.acc_nearest ? HUGE_VAL : limit, v));
  return static_cast<float>(v);
}

// The definition: groups of `group` products and the accumulator, aligned to 2^(emax - F),
// summed, rounded into the accumulator; promoted to a float32 sum every `promote` products.
float reference_dot(const std::vector<float>& a, const std::vector<float>& b, const DotModel& m) {
  bool nan = false, pos = false, neg = false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double p = static_cast<double>(a[i]) * b[i];
    if (std::isnan(p)) nan = true;
    if (std::isinf(p)) (p > 0 ? pos : neg) = true;
  }
  if (nan || (pos && neg)) return std::numeric_limits<float>::quiet_NaN();
  if (pos || neg) return pos ? HUGE_VALF : -HUGE_VALF;
  float acc = 0, outer = 0;
  std::size_t since = 0;
  for (std::size_t start = 0; start < a.size(); start += static_cast<std::size_t>(m.group)) {
    const std::size_t end = std::min(a.size(), start + static_cast<std::size_t>(m.group));
    std::vector<double> terms;
    for (std::size_t i = start; i < end; ++i) terms.push_back(static_cast<double>(a[i]) * b[i]);  // exact
    terms.push_back(acc);
    double largest = 0;
    for (const double t : terms) largest = std::max(largest, std::fabs(t));
    if (largest == 0) {
      acc = 0;
    } else {
      const double quantum = std::ldexp(1.0, std::ilogb(largest) - m.frac);
      double sum = 0;
      for (const double t : terms) sum += round_to_quantum(t, quantum, m.align_nearest);
      acc = into_accumulator(sum, m);
    }
    since += end - start;
    if (m.promote > 0 && (since == static_cast<std::size_t>(m.promote) || end == a.size())) {
      outer += acc;
      acc = 0;
      since = 0;
    }
  }
  return m.promote > 0 ? outer : acc;
}

bool same_bits(float x, float y) {
  if (std::isnan(x) && std::isnan(y)) return true;
  return std::memcmp(&x, &y, sizeof x) == 0;
}

float model(const std::vector<float>& a, const std::vector<float>& b, const DotModel& m) {
  return model_dot(a.data(), 1, b.data(), 1, static_cast<std::int64_t>(a.size()), m);
}

// Inputs of several kinds: E4M3 values, float32 over a wide exponent range, cancelling
// pairs with a small remainder, values just below powers of two, float32 subnormals.
std::vector<float> inputs(std::mt19937& rng, int kind, std::size_t n) {
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int> exponent(-40, 40), coin(0, 1);
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    switch (kind) {
      case 0: v[i] = quantize(normal(rng) * 8, parse_format("e4m3fn")); break;
      case 1: v[i] = std::ldexp(normal(rng), exponent(rng)); break;
      case 2: v[i] = i % 2 ? -v[i - 1] * (1 + std::ldexp(1.0f, -20)) : std::ldexp(normal(rng), exponent(rng) / 4); break;
      case 3: v[i] = (coin(rng) ? 1 : -1) * std::nextafter(std::ldexp(1.0f, exponent(rng) / 4), 0.0f); break;
      default: v[i] = std::ldexp(normal(rng), -130 - exponent(rng) / 4); break;
    }
  }
  return v;
}

std::vector<DotModel> models_under_test() {
  std::vector<DotModel> out;
  for (const auto& p : dot_presets())
    if (p.model.frac <= 45) out.push_back(p.model);
  for (const int group : {1, 4, 16, 64})
    for (const int frac : {0, 3, 13, 23, 45})
      for (const bool nearest : {false, true}) {
        DotModel m;
        m.group = group;
        m.frac = frac;
        m.align_nearest = nearest;
        m.acc_nearest = !nearest;
        m.acc_bits = frac % 2 ? 24 : 8;
        m.promote = group == 4 ? 16 : group == 16 ? 16 : 0;
        out.push_back(m);
      }
  return out;
}

}  // namespace

TEST(DotModel, MatchesTheDefinitionBitForBit) {
  std::mt19937 rng(7);
  int compared = 0;
  for (const DotModel& m : models_under_test())
    for (int kind = 0; kind < 5; ++kind)
      for (const std::size_t n : {1u, 5u, 31u, 32u, 33u, 130u, 300u}) {
        const auto a = inputs(rng, kind, n), b = inputs(rng, kind == 2 ? 0 : kind, n);
        const float want = reference_dot(a, b, m), got = model(a, b, m);
        ASSERT_TRUE(same_bits(got, want)) << to_string(m) << " kind " << kind << " n " << n << ": " << got << " want " << want;
        ++compared;
      }
  EXPECT_GT(compared, 1000);
}

// Worked by hand: 127 products of 2^-14 and then 1.0. In Hopper's model the first 96 sum
// exactly (to 96 * 2^-14 = 48 * 2^-13), and in the last group the largest term is 1, so the
// other 31 products (2^-14, below 2^-13) are truncated away: 1 + 48 * 2^-13 = 1.005859375.
// Float32 gives the exact 1 + 127 * 2^-14. With 14 fraction bits they survive.
TEST(DotModel, SmallProductsAreTruncatedBesideALargeOne) {
  std::vector<float> a(128, std::ldexp(1.0f, -14)), b(128, 1.0f);
  a[127] = 1.0f;
  EXPECT_EQ(model(a, b, parse_dot_model("hopper-fp8")), 1.005859375f);
  EXPECT_EQ(model(a, b, parse_dot_model("dot:frac=14:acc=24")), 1.0f + 127 * std::ldexp(1.0f, -14));
  // The accumulator's width: 14 bits hold 1 + 48 * 2^-13 but not 1 + 49 * 2^-14 * 2.
  a.assign(64, 0.0f);
  a[0] = 1.0f;
  a[1] = std::ldexp(1.0f, -13) + std::ldexp(1.0f, -14);  // needs 15 bits beside 1
  b.assign(64, 1.0f);
  EXPECT_EQ(model(a, b, parse_dot_model("dot:frac=20:acc=14")), 1.0f + std::ldexp(1.0f, -13));
  EXPECT_EQ(model(a, b, parse_dot_model("dot:frac=20:acc=15")), 1.0f + std::ldexp(1.0f, -13) + std::ldexp(1.0f, -14));
  EXPECT_EQ(model(a, b, parse_dot_model("dot:frac=20:acc=14:acc_round=nearest")), 1.0f + std::ldexp(1.0f, -12));
}

// Promotion: a float32 sum of partial sums restarts the accumulator, so the small products
// of a later block are not swamped by the earlier blocks' total.
TEST(DotModel, PromotionKeepsLaterSmallProducts) {
  std::vector<float> a(256, std::ldexp(1.0f, -14)), b(256, 1.0f);
  a[0] = 1.0f;  // block 1 holds the large product; block 2 only small ones
  const float plain = model(a, b, parse_dot_model("hopper-fp8"));
  const float promoted = model(a, b, parse_dot_model("hopper-fp8-promote128"));
  EXPECT_EQ(plain, 1.0f);  // every 2^-14 truncated beside 1
  EXPECT_EQ(promoted, 1.0f + 128 * std::ldexp(1.0f, -14));  // block 2's 128 products sum exactly
}

// The OCP MX preset: each 32-product block exact (E4M3 and E2M1 element products span
// fewer than 53 bits, so a double holds each block's sum), rounded to float32, blocks added
// in float32 in order.
TEST(DotModel, OcpMxIsExactBlocksAddedInFloat32) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  const DotModel m = parse_dot_model("ocp-mx");
  for (const char* element : {"e4m3fn", "e2m1fn", "e5m2"})
    for (const std::size_t n : {32u, 96u, 100u}) {
      std::vector<float> a(n), b(n);
      for (std::size_t i = 0; i < n; ++i) {
        a[i] = quantize(normal(rng) * 4, parse_format(element));
        b[i] = quantize(std::ldexp(normal(rng), i % 5 - 2), parse_format(element));
      }
      float want = 0;
      for (std::size_t start = 0; start < n; start += 32) {
        double block = 0;
        for (std::size_t i = start; i < std::min(n, start + 32); ++i) block += static_cast<double>(a[i]) * b[i];
        want += static_cast<float>(block);
      }
      EXPECT_TRUE(same_bits(model(a, b, m), want)) << element << " " << n;
    }
}

TEST(DotModel, SpecialValues) {
  const DotModel m = parse_dot_model("hopper-fp8");
  const float inf = HUGE_VALF, nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(model({1, nan}, {1, 1}, m)));
  EXPECT_TRUE(std::isnan(model({inf, 0}, {0, 1}, m)));  // inf * 0
  EXPECT_TRUE(std::isnan(model({inf, inf}, {1, -1}, m)));
  EXPECT_EQ(model({inf, 5}, {-1, 1}, m), -inf);
  EXPECT_EQ(model({}, {}, m), 0.0f);
  // Overflow of a finite sum: infinity when rounding to nearest, the largest value toward zero.
  const float big = std::numeric_limits<float>::max();
  EXPECT_EQ(model({big, big}, {1, 1}, parse_dot_model("dot:acc_round=nearest:acc=24")), inf);
  EXPECT_EQ(model({big, big}, {1, 1}, parse_dot_model("dot:acc=24")), big);
}

// Every output is model_dot of its row and column, whoever runs it: the pool, the caller
// alone, or a caller's three parts run in reverse (a long reduction, 2000 products an output:
// work enough to split).
TEST(DotModel, MatrixKernelIsModelDotPerOutput) {
  std::mt19937 rng(3);
  const std::size_t batch = 2, rows = 5, inner = 2000, cols = 9;
  std::vector<float> a, b;
  for (std::size_t i = 0; i < batch; ++i) {
    const auto ai = inputs(rng, 1, rows * inner), bi = inputs(rng, 1, inner * cols);
    a.insert(a.end(), ai.begin(), ai.end());
    b.insert(b.end(), bi.begin(), bi.end());
  }
  a[3] = HUGE_VALF;                                  // row 0 of batch 0: infinite products
  b[inner * cols + 2 * cols + 4] = std::nanf("");    // column 4 of batch 1: NaN
  const DotModel m = parse_dot_model("hopper-fp8-promote128");
  std::vector<float> out(batch * rows * cols), serial(out.size()), parts(out.size());
  kernels::model_matmul(a.data(), b.data(), out.data(), {batch, rows, inner, cols}, m);
  kernels::model_matmul(a.data(), b.data(), serial.data(), {batch, rows, inner, cols}, m, kernels::Runner::serial());
  int calls = 0;
  const kernels::Runner reversed =
      kernels::Runner::external(3, [&](std::size_t n, const std::function<void(std::size_t)>& part) {
        ++calls;
        for (std::size_t i = n; i-- > 0;) part(i);
      });
  kernels::model_matmul(a.data(), b.data(), parts.data(), {batch, rows, inner, cols}, m, reversed);
  EXPECT_EQ(calls, static_cast<int>(batch));  // each batch's outputs split, though only 45 of them
  for (std::size_t t = 0; t < batch; ++t)
    for (std::size_t i = 0; i < rows; ++i)
      for (std::size_t j = 0; j < cols; ++j) {
        const float want = model_dot(a.data() + (t * rows + i) * inner, 1, b.data() + t * inner * cols + j,
                                     static_cast<std::ptrdiff_t>(cols), static_cast<std::int64_t>(inner), m);
        const std::size_t o = (t * rows + i) * cols + j;
        ASSERT_TRUE(same_bits(out[o], want)) << t << " " << i << " " << j;
        ASSERT_TRUE(same_bits(serial[o], want));
        ASSERT_TRUE(same_bits(parts[o], want));
      }
  EXPECT_TRUE(std::isinf(out[0]) && std::isnan(out[rows * cols + 4]) && std::isfinite(out[rows * cols + 5]));
}

TEST(DotModel, NamesRoundTripAndErrorsNameTheProblem) {
  for (const auto& p : dot_presets()) {
    EXPECT_EQ(to_string(p.model), p.name);
    EXPECT_EQ(parse_dot_model(to_string(p.model)), p.model);
  }
  const DotModel m = parse_dot_model("dot:promote=64:group=16:frac=7:align=nearest:acc=10:acc_round=nearest");
  EXPECT_EQ(to_string(m), "dot:group=16:frac=7:align=nearest:acc=10:acc_round=nearest:promote=64");
  EXPECT_EQ(parse_dot_model(to_string(m)), m);
  const auto error = [](const char* text) {
    try {
      parse_dot_model(text);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error("hopper").find("expected a preset (hopper-fp8, hopper-fp8-promote128, blackwell, ocp-mx)"), std::string::npos);
  EXPECT_NE(error("dot:width=3").find("unknown key 'width'"), std::string::npos);
  EXPECT_NE(error("dot:frac=3:frac=4").find("'frac' given twice"), std::string::npos);
  EXPECT_NE(error("dot:frac=x").find("frac: 'x' is not an integer"), std::string::npos);
  EXPECT_NE(error("dot:align=up").find("'up' is not a rounding"), std::string::npos);
  EXPECT_NE(error("dot:group=65").find("group 65 is out of range 1..64"), std::string::npos);
  EXPECT_NE(error("dot:frac=101").find("frac 101 is out of range 0..100"), std::string::npos);
  EXPECT_NE(error("dot:acc=25").find("acc 25 is out of range 1..24"), std::string::npos);
  EXPECT_NE(error("dot:group=32:promote=48").find("promote 48 must be 0 (never) or a positive multiple of group 32"),
            std::string::npos);
  EXPECT_NE(error("dot:frac").find("expected KEY=VALUE, got 'frac'"), std::string::npos);
}
