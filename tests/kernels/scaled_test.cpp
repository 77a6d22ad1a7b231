// The scaled kernels against the scalar reference (docs/spec.md §6): values, codes, scales,
// the tensor scale and every count, bit for bit, for every preset and rule, every SIMD target
// and 1 to 3 threads, on shapes whose rows end inside a block, span several chunks, or pass
// the size above which the kernels split work over threads.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "../common/reference.hpp"
#include "fp8lab/core/scaled.hpp"
#include "fp8lab/kernels/kernels.hpp"
#include "fp8lab/kernels/scaled.hpp"

namespace fp8lab {
namespace {

// Whether validate refuses scale rule r on s: 4over6 takes no floor (docs/spec.md §6.10), the
// quartet arithmetic nearest only (§6.13).
// The rounding beside nearest-even that the tests vary: stochastic, or nearest-away for MS-EDEN,
// whose elements round to nearest (its scales stochastically, §6.13).
Rounding varied_rounding(const ScaledSpec& s) { return s.eden != 0 ? Rounding::nearest_away : Rounding::stochastic; }

bool refuses_rule(const ScaledSpec& s, ScaleRule r) {
  return (s.four_over_six && r == ScaleRule::floor) || (s.arithmetic == ScaleArithmetic::quartet && r != ScaleRule::nearest);
}

std::vector<float> inputs(std::size_t n, std::uint64_t seed) {
  ref::InputGen gen(seed);
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t r = gen.next();
    const int k = static_cast<int>(r % 50) - 25;
    switch ((r >> 8) % 16) {
      case 0: x[i] = gen.any_bits(); break;
      case 1: x[i] = 0.0f; break;
      case 2: x[i] = std::ldexp(1.0f, k); break;
      case 3: x[i] = std::ldexp(static_cast<float>(r >> 44), -149); break;  // subnormal
      default: x[i] = std::ldexp(static_cast<float>(static_cast<std::int32_t>(r >> 32)), k - 31); break;
    }
  }
  // Rows 0-1 zero, row 2 tiny: zero groups and scale underflow in every layout.
  return x;
}

struct Out {
  std::vector<float> y;
  std::vector<std::uint8_t> codes;
  std::vector<std::uint32_t> scales;
  float ts = 0, amax = 0;
  ScaledCounts counts;
};

// kernels::scaled_quantize on the kernels' pool.
float kernel_quantize(const float* x, std::size_t rows, std::size_t cols, const ScaledSpec& s, const ScaledOut& out,
                      const ScaledCall& call, ScaledCounts* counts) {
  return kernels::scaled_quantize(x, rows, cols, s, out, call, counts);
}

template <class Fn>
Out run(Fn fn, const ScaledSpec& s, const std::vector<float>& x, std::size_t rows, std::size_t cols,
        const ScaledCall& call) {
  Out o;
  o.y.resize(x.size());
  o.codes.resize(x.size());
  o.scales.resize(block_layout(s, rows, cols).groups());
  o.amax = fn(x.data(), rows, cols, s, ScaledOut{o.y.data(), o.codes.data(), o.scales.data(), &o.ts}, call, &o.counts);
  return o;
}

void expect_same(const Out& a, const Out& b, const std::string& what) {
  ASSERT_EQ(a.codes, b.codes) << what;
  ASSERT_EQ(a.scales, b.scales) << what;
  for (std::size_t i = 0; i < a.y.size(); ++i)
    ASSERT_EQ(std::bit_cast<std::uint32_t>(a.y[i]), std::bit_cast<std::uint32_t>(b.y[i])) << what << " at " << i;
  ASSERT_EQ(std::bit_cast<std::uint32_t>(a.ts), std::bit_cast<std::uint32_t>(b.ts)) << what;
  ASSERT_EQ(a.amax, b.amax) << what;
  ASSERT_EQ(a.counts, b.counts) << what << ": groups " << a.counts.groups << "/" << b.counts.groups << " saturated "
                                << a.counts.saturated_groups << "/" << b.counts.saturated_groups << " underflow "
                                << a.counts.elements.underflow << "/" << b.counts.elements.underflow;
}

class ScaledKernels : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { kernels::use_target(GetParam()); }
  void TearDown() override {
    kernels::use_target("");
    kernels::set_num_threads(0);
  }
};

TEST_P(ScaledKernels, BitExactWithTheReference) {
  struct Shape {
    std::size_t rows, cols;
  };
  // Rows ending inside a block; long rows; short rows (chunks span rows); rows of whole
  // blocks (the one-pass E8M0 path).
  const std::vector<Shape> shapes{{7, 200}, {3, 5000}, {1, 37}, {400, 20}, {9, 320}, {4, 256}, {40, 96}, {300, 16}};
  // Every preset with every rule, and torchao's and TransformerEngine's arithmetic (docs/spec.md §6.9).
  std::vector<ScaledSpec> specs;
  for (const auto& preset : scaled_presets())
    for (ScaleRule rule : {ScaleRule::floor, ScaleRule::ceil, ScaleRule::nearest}) {
      specs.push_back(parse_scaled(preset.name));
      specs.back().rule = rule;
      if (refuses_rule(specs.back(), rule)) specs.pop_back();
    }
  for (const char* name : {"nvfp4:torchao", "e2m1fn@1x16:ue4m3:nearest:torchao", "e4m3fn@1x32:ue4m3:nearest:torchao",
                           "nvfp4:torchao:delayed-4", "e2m1fn@16x16:ue4m3:nearest:tensor-scale:torchao",
                           "e4m3_tensor:te", "e5m2_delayed:te", "e4m3fn@1x32:fp32:nearest:te",
                           "e5m2@line:fp32:nearest:te", "e4m3fn@128x128:fp32:nearest:te", "nvfp4_16x16:4over6",
                           "e2m1fn@1x16:fp32:nearest:4over6", "e2m1fn@line:fp32:ceil:4over6", "nvfp4_4over6:delayed-4",
                           "e2m1fn@tensor:fp32:nearest:4over6", "e2m1fn@1x32:ue4m3:ceil:tensor-scale:4over6",
                           "nvfp4:te", "nvfp4_16x16:te", "nvfp4:te:delayed-4", "e4m3fn@1x32:ue4m3:nearest:tensor-scale:te",
                           "mxfp4:dither-scale", "mxfp4:ceil:dither-scale", "e4m3fn@16x16:e8m0:floor:dither-scale",
                           "e2m1fn@line:e8m0:floor:dither-scale", "e3m2fn@tensor:e8m0:nearest:dither-scale",
                           "nvfp4_eden:eden-16", "e2m1fn@1x32:ue4m3:nearest:tensor-scale:quartet:eden-64",
                           "e2m1fn@1x8:ue4m3:nearest:tensor-scale:quartet"})
    specs.push_back(parse_scaled(name));
  for (const ScaledSpec& spec : specs)
      for (const Shape& sh : shapes) {
        ScaledSpec s = spec;
        s.element.rounding = ((sh.rows + sh.cols) % 2) ? varied_rounding(s) : Rounding::nearest_even;
        s.element.seed = 3;
        std::vector<float> x = inputs(sh.rows * sh.cols, sh.cols);
        for (std::size_t i = 0; i < std::min<std::size_t>(x.size(), 64); ++i) x[i] = i < 32 ? 0.0f : 1e-42f;
        ScaledCall call;
        call.index_offset = 5;
        if (s.history > 0) call.delayed_amax = 3.5f;
        const std::string what = to_string(s) + " " + std::to_string(sh.rows) + "x" + std::to_string(sh.cols);
        const Out want = run(scaled_quantize_reference, s, x, sh.rows, sh.cols, call);
        const Out got = run(kernel_quantize, s, x, sh.rows, sh.cols, call);
        expect_same(got, want, what);
      }
}

// Delayed scaling from a small history: finite values whose scaled value lies past
// float32's range saturate (the exact quotient would), infinities stay NaN, on the vector
// path, its tail and the piecewise passes alike.
TEST_P(ScaledKernels, QuotientsPastFloat32Saturate) {
  for (const char* name : {"e4m3_delayed", "e4m3fn@tensor:e8m0:floor:delayed-4", "e4m3fn@tensor:e8m0:nearest:delayed-4",
                           "e5m2@tensor:fp32:ceil:delayed-2"})
    for (std::size_t cols : {64u, 37u}) {
      const ScaledSpec s = parse_scaled(name);
      std::vector<float> x = inputs(3 * cols, cols);
      x[1] = 1e36f;
      x[2] = -3e38f;
      x[cols + 3] = INFINITY;
      x[2 * cols + 5] = 2e37f;
      ScaledCall call;
      call.delayed_amax = 1e-3f;
      const std::string what = std::string(name) + " cols " + std::to_string(cols);
      const Out want = run(scaled_quantize_reference, s, x, 3, cols, call);
      const Out got = run(kernel_quantize, s, x, 3, cols, call);
      expect_same(got, want, what);
      const float top = static_cast<float>(s.element.format.max_finite());
      EXPECT_TRUE(std::isfinite(want.y[1]) && want.y[1] > 0.0f) << what;
      EXPECT_EQ(want.y[2], -want.y[1]) << what;  // both saturate at the element max times the scale
      EXPECT_EQ(want.codes[1], encode(top, s.element)) << what;
      EXPECT_FALSE(std::isfinite(want.y[cols + 3])) << what;  // an infinity stays visible (NaN or Inf)
    }
}

// Blocks of ordinary values (a normal sample times a power of two that varies by block,
// from 2^-30 to 2^30) with a few zero, tiny and NaN blocks: the inputs on which the fast
// scale paths (E8M0 from the bits, UE4M3 from the ScaleSteps table) decide nearly every
// block, against the reference, with and without counts.
TEST_P(ScaledKernels, FastScalePathsMatchTheReference) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  for (const auto& preset : scaled_presets())
    for (ScaleRule rule : {ScaleRule::floor, ScaleRule::ceil, ScaleRule::nearest})
      for (std::size_t cols : {16, 64, 4096}) {
        ScaledSpec s = parse_scaled(preset.name);
        s.rule = rule;
        if (refuses_rule(s, rule)) continue;
        const std::size_t rows = 24;
        std::vector<float> x(rows * cols);
        for (std::size_t i = 0; i < x.size(); ++i) {
          const int k = static_cast<int>((i / 16) % 61) - 30;
          x[i] = std::ldexp(normal(rng), k);
        }
        for (std::size_t i = 0; i < 16; ++i) x[i] = 0.0f;                         // a zero block
        for (std::size_t i = 16; i < 32; ++i) x[i] = std::ldexp(1.0f, -140);      // scale underflow
        x[40] = std::numeric_limits<float>::quiet_NaN();                          // a NaN block
        x[x.size() - 3] = static_cast<float>(s.element.format.max_finite()) * 1024;  // amax at max * 2^10
        ScaledCall call;
        call.index_offset = 9;
        if (s.history > 0) call.delayed_amax = 3.5f;
        const std::string what = to_string(s) + " cols " + std::to_string(cols);
        const Out want = run(scaled_quantize_reference, s, x, rows, cols, call);
        const Out got = run(kernel_quantize, s, x, rows, cols, call);
        expect_same(got, want, what);
        std::vector<float> y(x.size());
        std::vector<std::uint8_t> codes(x.size());
        kernels::scaled_quantize(x.data(), rows, cols, s, ScaledOut{y.data(), codes.data()}, call);
        ASSERT_EQ(codes, want.codes) << what << " without counts";
        for (std::size_t i = 0; i < y.size(); ++i)
          ASSERT_EQ(std::bit_cast<std::uint32_t>(y[i]), std::bit_cast<std::uint32_t>(want.y[i])) << what << " at " << i;
      }
}

TEST_P(ScaledKernels, AnyThreadCountGivesTheSameBits) {
  // 300 x 512: above the size where the kernels split work over threads.
  constexpr std::size_t rows = 300, cols = 512;
  const std::vector<float> x = inputs(rows * cols, 9);
  for (const char* name : {"mxfp4", "mxfp4:dither-scale", "mxfp8_e4m3:nearest", "nvfp4", "nvfp4:torchao", "nvfp4:te",
                           "deepseek_128x128", "e4m3_tensor",
                           "e5m2@line:ue4m3:ceil"}) {
    const ScaledSpec s = parse_scaled(name);
    kernels::set_num_threads(1);
    const Out one = run(kernel_quantize, s, x, rows, cols, {});
    const Out want = run(scaled_quantize_reference, s, x, rows, cols, {});
    expect_same(one, want, name);
    for (int t : {2, 3}) {
      kernels::set_num_threads(t);
      expect_same(run(kernel_quantize, s, x, rows, cols, {}), one, std::string(name) + " threads " + std::to_string(t));
    }
  }
}

// On a caller's threads (Runner::external): every part run once, by the caller's function,
// and the same bits as on the kernels' pool.
TEST_P(ScaledKernels, ExternalThreadsGiveTheSameBits) {
  constexpr std::size_t rows = 300, cols = 512;
  const std::vector<float> x = inputs(rows * cols, 12);
  for (const char* name : {"mxfp4", "nvfp4", "deepseek_128x128", "e4m3_tensor"}) {
    const ScaledSpec s = parse_scaled(name);
    const Out want = run(scaled_quantize_reference, s, x, rows, cols, {});
    for (int parts : {2, 3}) {
      std::vector<int> ran(static_cast<std::size_t>(parts), 0);
      int runs = 0;
      const kernels::Runner ext =
          kernels::Runner::external(parts, [&](std::size_t n, const std::function<void(std::size_t)>& part) {
            ++runs;
            ASSERT_EQ(n, static_cast<std::size_t>(parts));
            for (std::size_t i = n; i-- > 0;) {  // in reverse: order must not matter
              ++ran[i];
              part(i);
            }
          });
      const auto on_ext = [&](const float* xs, std::size_t r, std::size_t c, const ScaledSpec& sp, const ScaledOut& o,
                              const ScaledCall& call, ScaledCounts* counts) {
        return kernels::scaled_quantize(xs, r, c, sp, o, call, counts, ext);
      };
      const Out got = run(on_ext, s, x, rows, cols, {});
      expect_same(got, want, std::string(name) + " parts " + std::to_string(parts));
      EXPECT_GT(runs, 0) << name;
      for (int r : ran) EXPECT_EQ(r, runs) << name;
    }
  }
}

// Decoding: the kernel against the reference decode, both against the values the quantizer
// wrote (codes and scales hold every bit of them), on every preset and rule, 1 to 3 threads.
TEST_P(ScaledKernels, DecodeGivesBackTheQuantizedValues) {
  constexpr std::size_t rows = 260, cols = 300;  // above the threading size; rows end inside blocks
  for (const auto& preset : scaled_presets())
    for (ScaleRule rule : {ScaleRule::floor, ScaleRule::ceil, ScaleRule::nearest}) {
      ScaledSpec s = parse_scaled(preset.name);
      s.rule = rule;
      if (refuses_rule(s, rule)) continue;
      std::vector<float> x = inputs(rows * cols, 11);
      for (std::size_t i = 0; i < 64; ++i) x[i] = i < 32 ? 0.0f : 1e-42f;
      x[cols + 3] = std::numeric_limits<float>::quiet_NaN();
      const Out q = run(scaled_quantize_reference, s, x, rows, cols, {});
      std::vector<float> want(x.size());
      scaled_decode_reference(q.codes.data(), q.scales.data(), q.ts, rows, cols, s, want.data());
      const std::string what = to_string(s);
      for (std::size_t i = 0; i < x.size(); ++i)
        ASSERT_EQ(std::bit_cast<std::uint32_t>(want[i]), std::bit_cast<std::uint32_t>(q.y[i]))
            << what << ": the reference decode at " << i;
      for (int t : {1, 2, 3}) {
        kernels::set_num_threads(t);
        std::vector<float> got(x.size(), -1.0f);
        kernels::scaled_decode(q.codes.data(), q.scales.data(), q.ts, rows, cols, s, got.data());
        for (std::size_t i = 0; i < x.size(); ++i)
          ASSERT_EQ(std::bit_cast<std::uint32_t>(got[i]), std::bit_cast<std::uint32_t>(want[i]))
              << what << " threads " << t << " at " << i;
        // The bfloat16 decode: the top halves, exact where every bottom half is zero.
        std::vector<std::uint16_t> b16(x.size(), 0xAAAA);
        std::uint32_t dropped = 0;
        for (const float v : want) dropped |= std::bit_cast<std::uint32_t>(v) & 0xFFFFu;
        EXPECT_EQ(kernels::scaled_decode_bf16(q.codes.data(), q.scales.data(), q.ts, rows, cols, s, b16.data()),
                  dropped == 0) << what;
        for (std::size_t i = 0; i < x.size(); ++i)
          ASSERT_EQ(b16[i], std::bit_cast<std::uint32_t>(want[i]) >> 16) << what << " bf16, threads " << t << " at " << i;
        // Transposed: element (r, c) at [c * rows + r].
        std::vector<std::uint16_t> b16t(x.size(), 0xAAAA);
        EXPECT_EQ(kernels::scaled_decode_bf16_transposed(q.codes.data(), q.scales.data(), q.ts, rows, cols, s,
                                                         b16t.data()),
                  dropped == 0) << what;
        for (std::size_t r = 0; r < rows; ++r)
          for (std::size_t c = 0; c < cols; ++c)
            ASSERT_EQ(b16t[c * rows + r], std::bit_cast<std::uint32_t>(want[r * cols + c]) >> 16)
                << what << " bf16 transposed, threads " << t << " at " << r << ", " << c;
      }
    }
}

// The bfloat16 form (ScaledOut::bf16): the top half of every value the reference writes, and
// bf16_exact true exactly where every bottom half is zero; asked for alone (the values kept
// in cache only) or beside the float32 values and codes, on every path (whole blocks, pieces,
// one scale for the tensor), with inputs in range (every MX value a bfloat16 value) and with
// the generator's extremes.
TEST_P(ScaledKernels, Bf16FormIsTheTopHalvesOfTheValues) {
  const std::vector<std::pair<std::size_t, std::size_t>> shapes{{7, 200}, {400, 20}, {9, 320}, {300, 16}};
  for (const auto& preset : scaled_presets())
    for (const auto& [rows, cols] : shapes)
      for (const bool tame : {true, false}) {
        const ScaledSpec s = parse_scaled(preset.name);
        std::vector<float> x = inputs(rows * cols, cols);
        if (tame)
          for (float& v : x) v = std::isfinite(v) ? std::ldexp(std::tanh(v), 3) : 1.0f;
        const std::string what = to_string(s) + " " + std::to_string(rows) + "x" + std::to_string(cols);
        const Out want = run(scaled_quantize_reference, s, x, rows, cols, {});
        std::uint32_t dropped = 0;
        for (const float v : want.y) dropped |= std::bit_cast<std::uint32_t>(v) & 0xFFFFu;
        for (const bool alone : {true, false}) {
          std::vector<std::uint16_t> b16(x.size(), 0xAAAA);
          std::vector<float> y(alone ? 0 : x.size());
          std::vector<std::uint8_t> codes(alone ? 0 : x.size());
          std::vector<std::uint32_t> scales(block_layout(s, rows, cols).groups());
          float ts = 0;
          bool exact = !dropped;  // the opposite of what the kernel must write
          exact = !exact;
          kernels::scaled_quantize(x.data(), rows, cols, s,
                                   ScaledOut{alone ? nullptr : y.data(), alone ? nullptr : codes.data(), scales.data(),
                                             &ts, b16.data(), &exact});
          ASSERT_EQ(exact, dropped == 0) << what;
          for (std::size_t i = 0; i < x.size(); ++i)
            ASSERT_EQ(b16[i], std::bit_cast<std::uint32_t>(want.y[i]) >> 16) << what << " at " << i;
          if (tame && s.scale == ScaleFormat::e8m0 && s.element.format.man_bits <= 7) {
            EXPECT_TRUE(exact) << what;
          }
        }
      }
}

// The matrix given by its transpose (kernels::scaled_quantize_transposed): the reference's
// outputs on the matrix itself, bit for bit (values, codes, scales, bfloat16 form, counts),
// for every preset and rule, on shapes whose rows are whole blocks or shorter than one (the
// path that transposes tiles in cache: rows above and below its tile height, columns past a
// tile's width) and shapes that take the transposed copy, with the generator's extremes and
// with ordinary blocks beside zero, tiny and NaN ones, on 1 and 3 threads.
TEST_P(ScaledKernels, TransposedInputGivesTheSameBits) {
  struct Shape {
    std::size_t rows, cols;
  };
  const std::vector<Shape> shapes{{16, 4096}, {70, 512}, {3, 64}, {300, 16}, {130, 256}, {7, 200}, {40, 96}};
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  for (const auto& preset : scaled_presets())
    for (ScaleRule rule : {ScaleRule::floor, ScaleRule::ceil, ScaleRule::nearest})
      for (const Shape& sh : shapes)
        for (const bool tame : {true, false}) {
          ScaledSpec s = parse_scaled(preset.name);
          s.rule = rule;
          if (refuses_rule(s, rule)) continue;
          s.element.rounding = (sh.rows % 2) ? varied_rounding(s) : Rounding::nearest_even;
          s.element.seed = 7;
          const std::size_t n = sh.rows * sh.cols;
          std::vector<float> x = inputs(n, sh.rows + sh.cols);
          if (tame) {
            for (std::size_t i = 0; i < n; ++i) x[i] = std::ldexp(normal(rng), static_cast<int>((i / 16) % 41) - 20);
            for (std::size_t i = 0; i < std::min<std::size_t>(n, 32); ++i) x[i] = 0.0f;
            x[n / 2] = std::numeric_limits<float>::quiet_NaN();
            x[n - 1] = 1e-41f;
          }
          std::vector<float> xt(n);
          for (std::size_t r = 0; r < sh.rows; ++r)
            for (std::size_t c = 0; c < sh.cols; ++c) xt[c * sh.rows + r] = x[r * sh.cols + c];
          ScaledCall call;
          call.index_offset = 3;
          if (s.history > 0) call.delayed_amax = 2.5f;
          const std::string what = to_string(s) + " " + std::to_string(sh.rows) + "x" + std::to_string(sh.cols) +
                                   (tame ? " ordinary blocks" : " extremes");
          const Out want = run(scaled_quantize_reference, s, x, sh.rows, sh.cols, call);
          for (int threads : {1, 3}) {
            kernels::set_num_threads(threads);
            const auto transposed = [&](const float*, std::size_t r, std::size_t c, const ScaledSpec& sp,
                                        const ScaledOut& o, const ScaledCall& cl, ScaledCounts* counts) {
              return kernels::scaled_quantize_transposed(xt.data(), r, c, sp, o, cl, counts);
            };
            expect_same(run(transposed, s, x, sh.rows, sh.cols, call), want, what + " threads " + std::to_string(threads));
          }
          std::vector<std::uint16_t> b16(n, 0xAAAA);
          std::vector<std::uint32_t> scales(block_layout(s, sh.rows, sh.cols).groups());
          bool exact = false;
          kernels::scaled_quantize_transposed(xt.data(), sh.rows, sh.cols, s,
                                              ScaledOut{nullptr, nullptr, scales.data(), nullptr, b16.data(), &exact},
                                              call);
          std::uint32_t dropped = 0;
          for (std::size_t i = 0; i < n; ++i) {
            dropped |= std::bit_cast<std::uint32_t>(want.y[i]) & 0xFFFFu;
            ASSERT_EQ(b16[i], std::bit_cast<std::uint32_t>(want.y[i]) >> 16) << what << " bf16 at " << i;
          }
          ASSERT_EQ(exact, dropped == 0) << what;
          ASSERT_EQ(scales, want.scales) << what << " bf16 alone";
          // The bfloat16 form in the input's layout: element (r, c) at [c * rows + r].
          std::vector<std::uint16_t> b16t(n, 0xAAAA);
          exact = dropped != 0;
          kernels::scaled_quantize_transposed(xt.data(), sh.rows, sh.cols, s,
                                              ScaledOut{nullptr, nullptr, scales.data(), nullptr, b16t.data(), &exact},
                                              call, nullptr, {}, kernels::Bf16Layout::input);
          ASSERT_EQ(exact, dropped == 0) << what << " bf16 in the input's layout";
          for (std::size_t r = 0; r < sh.rows; ++r)
            for (std::size_t c = 0; c < sh.cols; ++c)
              ASSERT_EQ(b16t[c * sh.rows + r], std::bit_cast<std::uint32_t>(want.y[r * sh.cols + c]) >> 16)
                  << what << " bf16 in the input's layout at " << r << ", " << c;
        }
}

// Values without the tensor scale (ScaledOut::without_tensor_scale, docs/spec.md §6.7), the
// operand of a product that applies the tensor scale to its output: the reference's values
// are its codes decoded under a tensor scale of 1 (an independent path, the decode), its
// codes, scales, tensor scale and counts are those of the ordinary quantization, and the
// kernels write the same bits on every path (whole blocks, pieces, the transposed read, the
// bfloat16 forms), on 1 and 3 threads. E2M1 elements times UE4M3 scales are bfloat16 values.
TEST_P(ScaledKernels, ValuesWithoutTheTensorScale) {
  struct Shape {
    std::size_t rows, cols;
  };
  const std::vector<Shape> shapes{{16, 4096}, {7, 200}, {300, 16}, {130, 256}, {40, 96}};
  std::mt19937 rng(9);
  std::normal_distribution<float> normal;
  for (const char* name : {"nvfp4", "nvfp4:ceil", "nvfp4:floor", "nvfp4:delayed-4", "nvfp4:torchao", "nvfp4_4over6",
                           "nvfp4_16x16:4over6", "nvfp4:te", "nvfp4_16x16:te",
                           "e4m3fn@1x16:ue4m3:nearest:tensor-scale", "e2m1fn@1x32:e8m0:floor:tensor-scale",
                           "e3m2fn@8x8:ue4m3:nearest:tensor-scale", "nvfp4_quartet", "nvfp4_eden"})
    for (const Shape& sh : shapes)
      for (const bool tame : {true, false}) {
        ScaledSpec s = parse_scaled(name);
        s.element.rounding = (sh.rows % 2) ? varied_rounding(s) : Rounding::nearest_even;
        s.element.seed = 4;
        const std::size_t n = sh.rows * sh.cols;
        std::vector<float> x = inputs(n, sh.rows * 3 + sh.cols);
        if (tame) {
          // Blocks within UE4M3's range of scales (the fast paths), a zero block and a NaN.
          for (std::size_t i = 0; i < n; ++i) x[i] = std::ldexp(normal(rng), static_cast<int>((i / 16) % 9) - 4);
          for (std::size_t i = 0; i < std::min<std::size_t>(n, 32); ++i) x[i] = 0.0f;
          x[n / 3] = std::numeric_limits<float>::quiet_NaN();
        }
        ScaledCall call;
        call.index_offset = 11;
        if (s.history > 0) call.delayed_amax = 40.0f;
        const std::string what = std::string(name) + " " + std::to_string(sh.rows) + "x" + std::to_string(sh.cols) +
                                 (tame ? " ordinary blocks" : " extremes");
        const Out folded = run(scaled_quantize_reference, s, x, sh.rows, sh.cols, call);
        const auto unit = [](auto fn) {
          return [fn](const float* xs, std::size_t r, std::size_t c, const ScaledSpec& sp, const ScaledOut& o,
                      const ScaledCall& cl, ScaledCounts* counts) {
            ScaledOut u = o;
            u.without_tensor_scale = true;
            return fn(xs, r, c, sp, u, cl, counts);
          };
        };
        const Out want = run(unit(scaled_quantize_reference), s, x, sh.rows, sh.cols, call);
        ASSERT_EQ(want.codes, folded.codes) << what;
        ASSERT_EQ(want.scales, folded.scales) << what;
        ASSERT_EQ(want.ts, folded.ts) << what;
        ASSERT_EQ(want.counts, folded.counts) << what;
        ASSERT_NE(want.ts, 1.0f) << what << ": the test needs a tensor scale other than 1";
        std::vector<float> decoded(n);
        scaled_decode_reference(want.codes.data(), want.scales.data(), 1.0f, sh.rows, sh.cols, s, decoded.data());
        for (std::size_t i = 0; i < n; ++i)
          ASSERT_EQ(std::bit_cast<std::uint32_t>(want.y[i]), std::bit_cast<std::uint32_t>(decoded[i]))
              << what << ": the reference against its decode at " << i;
        std::vector<float> xt(n);
        for (std::size_t r = 0; r < sh.rows; ++r)
          for (std::size_t c = 0; c < sh.cols; ++c) xt[c * sh.rows + r] = x[r * sh.cols + c];
        const auto transposed = [&](const float*, std::size_t r, std::size_t c, const ScaledSpec& sp,
                                    const ScaledOut& o, const ScaledCall& cl, ScaledCounts* counts) {
          return kernels::scaled_quantize_transposed(xt.data(), r, c, sp, o, cl, counts);
        };
        for (int threads : {1, 3}) {
          kernels::set_num_threads(threads);
          const std::string t = " threads " + std::to_string(threads);
          expect_same(run(unit(kernel_quantize), s, x, sh.rows, sh.cols, call), want, what + t);
          expect_same(run(unit(transposed), s, x, sh.rows, sh.cols, call), want, what + " transposed" + t);
          ScaledCall known = call;  // the tensor's amax given, its pass skipped: the same bits
          known.known_amax = want.amax;
          expect_same(run(unit(kernel_quantize), s, x, sh.rows, sh.cols, known), want, what + " amax given" + t);
          expect_same(run(unit(transposed), s, x, sh.rows, sh.cols, known), want, what + " transposed, amax given" + t);
        }
        std::uint32_t dropped = 0;
        for (const float v : want.y) dropped |= std::bit_cast<std::uint32_t>(v) & 0xFFFFu;
        if (tame && s.scale == ScaleFormat::ue4m3 && s.element.format.man_bits <= 3) {
          EXPECT_EQ(dropped, 0u) << what << ": element times UE4M3 scale is a bfloat16 value";
        }
        for (const bool from_transpose : {false, true}) {
          std::vector<std::uint16_t> b16(n, 0xAAAA);
          std::vector<std::uint32_t> scales(want.scales.size());
          bool exact = dropped != 0;
          ScaledOut o{nullptr, nullptr, scales.data(), nullptr, b16.data(), &exact};
          o.without_tensor_scale = true;
          if (from_transpose) kernels::scaled_quantize_transposed(xt.data(), sh.rows, sh.cols, s, o, call);
          else kernels::scaled_quantize(x.data(), sh.rows, sh.cols, s, o, call);
          ASSERT_EQ(exact, dropped == 0) << what;
          for (std::size_t i = 0; i < n; ++i)
            ASSERT_EQ(b16[i], std::bit_cast<std::uint32_t>(want.y[i]) >> 16)
                << what << (from_transpose ? " transposed" : "") << " bf16 at " << i;
        }
      }
}

// Both forms of a matrix in one read (kernels::scaled_quantize_both): the row form is the
// reference's quantization of x [rows, cols], the column form the reference's of the matrix
// x is the transpose of ([cols, rows], materialized here), each with its own seed, index
// offset and counts, bit for bit (values, codes, scales, tensor scale, amax, counts, and the
// bfloat16 forms: the row form's in its layout, the column form's in x's), for every preset
// and rule, with ordinary blocks and the generator's extremes, on 1 and 3 threads. The shapes
// take the joint pass (rows and columns whole blocks or shorter than one, strips past a
// chunk) and the two calls it falls back to.
TEST_P(ScaledKernels, BothFormsInOneRead) {
  struct Shape {
    std::size_t rows, cols;
  };
  const std::vector<Shape> shapes{{4096, 16}, {512, 64}, {96, 32}, {256, 128}, {20, 16}, {200, 7}, {64, 40}, {16, 300}};
  std::mt19937 rng(13);
  std::normal_distribution<float> normal;
  for (const auto& preset : scaled_presets())
    for (ScaleRule rule : {ScaleRule::floor, ScaleRule::ceil, ScaleRule::nearest})
      for (const Shape& sh : shapes)
        for (const bool tame : {true, false}) {
          ScaledSpec s = parse_scaled(preset.name);
          s.rule = rule;
          if (refuses_rule(s, rule)) continue;
          s.element.rounding = (sh.cols % 2) ? varied_rounding(s) : Rounding::nearest_even;
          s.element.seed = 7;
          ScaledSpec t_s = s;
          t_s.element.seed = 8;
          const std::size_t R = sh.rows, C = sh.cols, n = R * C;
          std::vector<float> x = inputs(n, R + 3 * C);
          if (tame) {
            for (std::size_t i = 0; i < n; ++i) x[i] = std::ldexp(normal(rng), static_cast<int>((i / 16) % 41) - 20);
            for (std::size_t i = 0; i < std::min<std::size_t>(n, 48); ++i) x[i] = 0.0f;
            x[n / 2] = std::numeric_limits<float>::quiet_NaN();
            x[n - 1] = 1e-41f;
          }
          std::vector<float> xt(n);  // the column form's matrix [C, R]
          for (std::size_t r = 0; r < R; ++r)
            for (std::size_t c = 0; c < C; ++c) xt[c * R + r] = x[r * C + c];
          ScaledCall call, t_call;
          call.index_offset = 3;
          t_call.index_offset = 5;
          if (s.history > 0) {
            call.delayed_amax = 2.5f;
            t_call.delayed_amax = 4.0f;
          }
          const std::string what = to_string(s) + " " + std::to_string(R) + "x" + std::to_string(C) +
                                   (tame ? " ordinary blocks" : " extremes");
          const Out want = run(scaled_quantize_reference, s, x, R, C, call);
          const Out t_want = run(scaled_quantize_reference, t_s, xt, C, R, t_call);
          for (int threads : {1, 3}) {
            kernels::set_num_threads(threads);
            const std::string th = what + " threads " + std::to_string(threads);
            Out got, t_got;
            for (Out* o : {&got, &t_got}) {
              o->y.resize(n);
              o->codes.resize(n);
            }
            got.scales.resize(want.scales.size());
            t_got.scales.resize(t_want.scales.size());
            std::tie(got.amax, t_got.amax) = kernels::scaled_quantize_both(
                x.data(), R, C, s, ScaledOut{got.y.data(), got.codes.data(), got.scales.data(), &got.ts}, call,
                &got.counts, t_s, ScaledOut{t_got.y.data(), t_got.codes.data(), t_got.scales.data(), &t_got.ts},
                t_call, &t_got.counts);
            expect_same(got, want, th + " row form");
            expect_same(t_got, t_want, th + " column form");
            // The bfloat16 forms alone: the row form's [R, C], the column form's in x's layout.
            std::vector<std::uint16_t> b16(n, 0xAAAA), t_b16(n, 0xAAAA);
            std::vector<std::uint32_t> scales(want.scales.size()), t_scales(t_want.scales.size());
            bool exact = false, t_exact = false;
            kernels::scaled_quantize_both(x.data(), R, C, s, ScaledOut{nullptr, nullptr, scales.data(), nullptr, b16.data(), &exact},
                                          call, nullptr, t_s,
                                          ScaledOut{nullptr, nullptr, t_scales.data(), nullptr, t_b16.data(), &t_exact},
                                          t_call, nullptr, {}, kernels::Bf16Layout::input);
            std::uint32_t dropped = 0, t_dropped = 0;
            for (std::size_t r = 0; r < R; ++r)
              for (std::size_t c = 0; c < C; ++c) {
                const std::uint32_t v = std::bit_cast<std::uint32_t>(want.y[r * C + c]);
                const std::uint32_t tv = std::bit_cast<std::uint32_t>(t_want.y[c * R + r]);
                dropped |= v & 0xFFFFu;
                t_dropped |= tv & 0xFFFFu;
                ASSERT_EQ(b16[r * C + c], v >> 16) << th << " row form bf16 at " << r << ", " << c;
                ASSERT_EQ(t_b16[r * C + c], tv >> 16) << th << " column form bf16 at " << r << ", " << c;
              }
            ASSERT_EQ(exact, dropped == 0) << th;
            ASSERT_EQ(t_exact, t_dropped == 0) << th;
            ASSERT_EQ(scales, want.scales) << th;
            ASSERT_EQ(t_scales, t_want.scales) << th;
          }
        }
}

// The two forms must be one quantizer's: specs that differ beyond their seeds are refused.
TEST(ScaledKernelsInput, BothFormsNeedOneSpec) {
  std::vector<float> x(64, 1.0f), y(64), ty(64);
  try {
    kernels::scaled_quantize_both(x.data(), 2, 32, parse_scaled("mxfp8_e4m3"), ScaledOut{y.data()}, {}, nullptr,
                                  parse_scaled("mxfp4"), ScaledOut{ty.data()}, {}, nullptr);
    FAIL() << "two quantizers were taken as one";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("differ beyond their seeds"), std::string::npos) << e.what();
  }
}

// A spec without a scale is the plain element kernel's: refused by name, not run on the
// scalar reference behind the caller's back.
TEST(ScaledKernelsInput, AFixedBiasFormatIsRefused) {
  std::vector<float> x(64, 1.0f), y(64);
  const ScaledSpec fixed = parse_scaled("e4m3fn");
  ASSERT_FALSE(fixed.scaled());
  try {
    kernels::scaled_quantize(x.data(), 2, 32, fixed, ScaledOut{y.data()});
    FAIL() << "a fixed-bias format was quantized";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has no scale"), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Targets, ScaledKernels, ::testing::ValuesIn(kernels::available_targets()),
                         [](const auto& info) { return info.param; });

}  // namespace

// docs/spec.md §6.8: the chunks' sum is one rounding per chunk, the first a product and the
// rest fused multiply-adds, the same bits on any thread count, row lengths off the SIMD width
// included. The reference is the definition with std::fma.
TEST(ScaledChunkSum, OneFusedMultiplyAddPerChunk) {
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (const auto& shape : {kernels::ChunkSumShape{1, 1, 1, 1}, kernels::ChunkSumShape{2, 3, 5, 37},
                            kernels::ChunkSumShape{1, 4, 64, 160}, kernels::ChunkSumShape{3, 2, 7, 16}}) {
    const std::size_t rows = shape.batch * shape.rows;
    std::vector<float> p(rows * shape.chunks * shape.cols), sa(shape.batch * shape.chunks * shape.rows),
        sb(shape.batch * shape.chunks * shape.cols), start(rows * shape.cols);
    for (auto* v : {&p, &sa, &sb, &start})
      for (float& x : *v) x = std::ldexp(u(rng), static_cast<int>(rng() % 20) - 10);
    for (const bool first : {true, false}) {
      std::vector<float> want = start;
      for (std::size_t b = 0; b < shape.batch; ++b)
        for (std::size_t m = 0; m < shape.rows; ++m)
          for (std::size_t j = 0; j < shape.chunks; ++j)
            for (std::size_t n = 0; n < shape.cols; ++n) {
              const std::size_t bj = b * shape.chunks + j;
              const float s = sa[bj * shape.rows + m] * sb[bj * shape.cols + n];
              const float part = p[(bj * shape.rows + m) * shape.cols + n];
              float& c = want[(b * shape.rows + m) * shape.cols + n];
              c = first && j == 0 ? s * part : std::fma(s, part, c);
            }
      for (const int threads : {1, 2, 3}) {
        kernels::set_num_threads(threads);
        std::vector<float> got = start;
        kernels::scaled_chunk_sum(p.data(), sa.data(), sb.data(), got.data(), shape, first);
        for (std::size_t i = 0; i < got.size(); ++i)
          ASSERT_EQ(std::bit_cast<std::uint32_t>(got[i]), std::bit_cast<std::uint32_t>(want[i]))
              << "element " << i << " of " << shape.batch << "x" << shape.chunks << "x" << shape.rows << "x"
              << shape.cols << " first " << first << " threads " << threads;
      }
      kernels::set_num_threads(0);
    }
  }
}
}  // namespace fp8lab
