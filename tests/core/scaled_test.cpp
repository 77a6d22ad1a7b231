// Scaled quantization (docs/spec.md §6): the notation, the choice of scales against a linear
// scan over every scale value, and the reference quantizer against the sorted-value reference
// on groups that reach every case (zero, NaN, Inf, powers of two, the element max,
// subnormal inputs, scale underflow and overflow).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "../common/scaled_reference.hpp"
#include "../common/testutil.hpp"
#include "fp8lab/core/scaled.hpp"

namespace fp8lab {
namespace {

using test::error_of;

// Every preset but those of the quartet arithmetic, whose own reference is the published
// algorithm (QuartetArithmetic below; tests/python/test_conformance.py).
std::vector<ScaledSpec> preset_specs() {
  std::vector<ScaledSpec> out;
  for (const auto& p : scaled_presets())
    if (parse_scaled(p.name).arithmetic != ScaleArithmetic::quartet) out.push_back(parse_scaled(p.name));
  return out;
}

// Every preset, and each with the other two rules.
std::vector<ScaledSpec> all_rules() {
  std::vector<ScaledSpec> out;
  for (ScaledSpec s : preset_specs())
    for (ScaleRule r : {ScaleRule::floor, ScaleRule::ceil, ScaleRule::nearest}) {
      if (s.four_over_six && r == ScaleRule::floor) continue;  // refused (docs/spec.md §6.10)
      s.rule = r;
      out.push_back(s);
    }
  return out;
}

TEST(ScaledNotation, PresetsParseAndPrintBack) {
  EXPECT_EQ(scaled_presets().size(), 17u);
  for (const auto& p : scaled_presets()) {
    const ScaledSpec s = parse_scaled(p.name);
    EXPECT_EQ(s, parse_scaled(p.spec)) << p.name;
    EXPECT_EQ(to_string(s), p.spec) << p.name;
    EXPECT_EQ(parse_scaled(to_string(s)), s) << p.name;
  }
  const ScaledSpec mx = parse_scaled("mxfp4");
  EXPECT_EQ(mx.element.format, parse_format("e2m1fn"));
  EXPECT_EQ(mx.granularity, Granularity::block);
  EXPECT_EQ(mx.block, 32);
  EXPECT_EQ(mx.scale, ScaleFormat::e8m0);
  EXPECT_EQ(mx.rule, ScaleRule::floor);
  const ScaledSpec nv = parse_scaled("nvfp4");
  EXPECT_EQ(nv.block, 16);
  EXPECT_EQ(nv.scale, ScaleFormat::ue4m3);
  EXPECT_TRUE(nv.tensor_scale);
  EXPECT_EQ(parse_scaled("e4m3_delayed").history, 16);
  EXPECT_EQ(parse_scaled("deepseek_128x128").granularity, Granularity::tile);
  EXPECT_EQ(parse_scaled("deepseek_128x128").block, 128);
}

TEST(ScaledNotation, NamesParseAndPrintBack) {
  for (ScaleFormat f : {ScaleFormat::e8m0, ScaleFormat::ue4m3, ScaleFormat::fp32}) EXPECT_EQ(parse_scale_format(to_string(f)), f);
  for (ScaleRule r : {ScaleRule::floor, ScaleRule::ceil, ScaleRule::nearest}) EXPECT_EQ(parse_scale_rule(to_string(r)), r);
  EXPECT_EQ(to_string(ScaleFormat::none), "none");
  EXPECT_EQ(to_string(Granularity::tile), "tile");
  // "none" prints but is not a scale format a spec names.
  EXPECT_EQ(test::error_of([] { (void)parse_scale_format("none"); }), "unknown scale format 'none' (known: e8m0, ue4m3, fp32)");
  EXPECT_EQ(test::error_of([] { (void)parse_scale_rule("round"); }), "unknown scale rule 'round' (known: floor, ceil, nearest)");
}

TEST(ScaledNotation, OptionsAndDefaults) {
  EXPECT_EQ(to_string(parse_scaled("mxfp4:ceil")), "e2m1fn@1x32:e8m0:ceil");
  EXPECT_EQ(to_string(parse_scaled("e4m3fn@1x64")), "e4m3fn@1x64:e8m0:floor");
  EXPECT_EQ(to_string(parse_scaled("1.4.3:10@line:fp32:nearest")), "1.4.3:10@line:fp32:nearest");
  EXPECT_EQ(to_string(parse_scaled("e4m3_delayed:delayed-4")), "e4m3fn@tensor:fp32:nearest:delayed-4");
  EXPECT_EQ(to_string(parse_scaled("e4m3_delayed:current")), "e4m3fn@tensor:fp32:nearest");
  // Where products apply the tensor scale (docs/spec.md §6.7): on the output unless folded.
  const ScaledSpec nv = parse_scaled("nvfp4"), folded = parse_scaled("nvfp4:tensor-scale-folded");
  EXPECT_TRUE(nv.tensor_scale_on_output());
  EXPECT_FALSE(folded.tensor_scale_on_output());
  EXPECT_TRUE(folded.tensor_scale && folded.fold_tensor_scale);
  EXPECT_EQ(to_string(folded), "e2m1fn@1x16:ue4m3:nearest:tensor-scale-folded");
  EXPECT_EQ(parse_scaled(to_string(folded)), folded);
  EXPECT_EQ(parse_scaled("e2m1fn@1x32:e8m0:tensor-scale-folded"), parse_scaled("e2m1fn@1x32:tensor-scale-folded:e8m0"));
  EXPECT_FALSE(parse_scaled("mxfp4").tensor_scale_on_output());
  // Where products apply float32 group scales (§6.8): on the output unless folded; E8M0 and
  // UE4M3 scales are always in the values.
  const ScaledSpec ds = parse_scaled("deepseek_1x128"), ds_folded = parse_scaled("deepseek_1x128:scales-folded");
  EXPECT_TRUE(ds.scales_on_output());
  EXPECT_FALSE(ds_folded.scales_on_output());
  EXPECT_EQ(to_string(ds_folded), "e4m3fn@1x128:fp32:nearest:scales-folded");
  EXPECT_EQ(parse_scaled(to_string(ds_folded)), ds_folded);
  EXPECT_EQ(parse_scaled("deepseek_1x128:scales-on-output"), ds);
  EXPECT_EQ(to_string(parse_scaled("e4m3_tensor:scales-on-output")), "e4m3fn@tensor:fp32:nearest");
  EXPECT_EQ(codes_name(ds_folded), to_string(ds));
  EXPECT_FALSE(parse_scaled("mxfp8_e4m3").scales_on_output());
  EXPECT_FALSE(parse_scaled("nvfp4").scales_on_output());
  EXPECT_EQ(parse_scaled("e2m1fn@1x1").block, 1);
  const ScaledSpec plain = parse_scaled("1.5.2:33");
  EXPECT_FALSE(plain.scaled());
  EXPECT_EQ(plain.element.format, parse_format("1.5.2:33"));
  EXPECT_EQ(to_string(plain), "1.5.2:33");
}

TEST(ScaledNotation, RefusesWithTheReason) {
  for (const auto& [bad, what] : std::vector<std::pair<std::string, std::string>>{
           {"e4m3fn@2x4", "blocks are 1xK and tiles KxK"},
           {"e4m3fn@0x0", "is no granularity"},
           {"e4m3fn@1x", "is no granularity"},
           {"e4m3fn@rows", "is no granularity"},
           {"e4m3fn@1x32:e9m0", "unknown option 'e9m0'"},
           {"mxfp4:delayed-0", "expected delayed-N"},
           {"mxfp4:delayed-8", "delayed scaling needs one scale per tensor or a tensor scale"},
           {"e4m3fn@1x32:fp32:tensor-scale", "a tensor scale needs e8m0 or ue4m3"},
           {"bf16@1x32", "8 bits wide or less"},
           {"e4m3fn@1x131072", "block size must be in"},
           {"1.4.3:300@1x32", "bias must be in [-256, 256]"},
           {"nofmt@1x32", "format 'nofmt'"},
           // Each kind of option once: a second contradicts (or repeats) the first.
           {"mxfp4:ceil:floor", "'floor' after 'ceil': the rounding rule is given twice"},
           {"mxfp4:floor:floor", "the rounding rule is given twice"},
           {"e4m3fn@1x32:e8m0:fp32", "'fp32' after 'e8m0': the scale format is given twice"},
           {"nvfp4:tensor-scale:tensor-scale", "the tensor scale is given twice"},
           {"nvfp4:tensor-scale-folded:tensor-scale", "the tensor scale is given twice"},
           {"e4m3fn@1x32:fp32:tensor-scale-folded", "a tensor scale needs e8m0 or ue4m3"},
           {"e4m3fn@tensor:fp32:delayed-4:current", "'current' after 'delayed-4'"},
           {"mxfp8_e4m3:scales-folded", "'scales-folded' needs float32 group scales"},
           {"nvfp4:scales-on-output", "'scales-on-output' needs float32 group scales"},
           {"deepseek_1x128:scales-folded:e8m0", "'scales-folded' needs float32 group scales"},
           {"deepseek_1x128:scales-folded:scales-on-output", "the order of the scales in products is given twice"},
           {"mxfp4:torchao", "torchao's arithmetic is that of its NVFP4 quantizer"},
           {"nvfp4:ceil:torchao", "ue4m3 scales rounded to nearest"},
           {"nvfp4:torchao:torchao", "the arithmetic is given twice"},
           {"mxfp8_e4m3:te", "te's arithmetic is that of TransformerEngine's current scaling"},
           {"e4m3_tensor:ceil:te", "float32 scales rounded to nearest"},
           {"e2m1fn@1x16:ue4m3:nearest:te", "or of its NVFP4 quantizer (ue4m3 scales rounded to nearest under a tensor"},
           {"nvfp4:ceil:te", "te's arithmetic"},
           {"mxfp4:te", "its MXFP8 quantizer is the ceil rule"},
           {"mxfp4:4over6", "4over6 needs ue4m3 or fp32 group scales"},
           {"e4m3fn@1x16:ue4m3:nearest:4over6", "it needs E2M1 elements"},
           {"nvfp4:floor:4over6", "4over6 needs the ceil or nearest rule"},
           {"nvfp4:torchao:4over6", "4over6 is defined on the exact arithmetic"},
           {"nvfp4:4over6:4over6", "the adaptive choice of scales is given twice"},
           {"nvfp4:dither-scale", "dither-scale scales the elements of E8M0 blocks by 3/4"},
           {"e4m3fn@1x32:e8m0:floor:tensor-scale:dither-scale", "without a tensor scale"},
           {"mxfp4:dither-scale:dither-scale", "the dither-scale option is given twice"},
       }) {
    const std::string e = error_of([&] { (void)parse_scaled(bad); });
    EXPECT_NE(e.find(what), std::string::npos) << bad << " -> " << e;
  }
  // After a preset, one option of a kind replaces the preset's choice.
  EXPECT_EQ(parse_scaled("mxfp4:ceil").rule, parse_scaled("e2m1fn@1x32:e8m0:ceil").rule);
  EXPECT_EQ(parse_scaled("e4m3_delayed:current").history, 0);
  ScaledSpec unfolded = parse_scaled("mxfp8_e4m3");  // a folded tensor scale needs one
  unfolded.fold_tensor_scale = true;
  EXPECT_NE(error_of([&] { validate(unfolded); }).find("there is no tensor scale"), std::string::npos);
  ScaledSpec s = parse_scaled("mxfp8_e4m3");
  s.element.overflow = Overflow::nan;
  EXPECT_NE(error_of([&] { validate(s); }).find("saturate"), std::string::npos);
}

// amax values at every float32 exponent: powers of two, just below and above them, the
// element max times a power of two, and subnormals.
std::vector<float> amaxes(const ScaledSpec& s) {
  std::vector<float> out;
  const double max_e = s.element.format.max_finite();
  for (int k = -149; k <= 127; ++k) {
    const float p = std::ldexp(1.0f, k);
    out.push_back(p);
    out.push_back(std::nextafter(p, 0.0f));
    out.push_back(std::nextafter(p, INFINITY));
    out.push_back(p * 1.5f);
    const auto m = static_cast<float>(max_e * std::ldexp(1.0, k));
    if (std::isfinite(m) && m > 0) {
      out.push_back(m);
      out.push_back(m * 1.5f);  // an E8M0 tie under the nearest rule
      out.push_back(std::nextafter(m, INFINITY));
      out.push_back(std::nextafter(m, 0.0f));
    }
  }
  // The midpoints between neighbouring UE4M3 scales, times the element max (ties).
  const std::vector<double> v = ref::scale_values(ScaleFormat::ue4m3);
  for (std::size_t c = 0; c + 1 < v.size(); ++c) out.push_back(static_cast<float>((v[c] + v[c + 1]) / 2 * max_e));
  out.push_back(std::numeric_limits<float>::max());
  std::erase_if(out, [](float v) { return !(v > 0) || !std::isfinite(v); });
  return out;
}

TEST(ScaledScale, MatchesALinearScanForEveryRuleAndAmax) {
  for (const ScaledSpec& s : all_rules())
    for (const float ts : {1.0f, 0.0123f, 3.0e-30f})
      for (float amax : amaxes(s)) {
        const float t = s.tensor_scale ? ts : 1.0f;
        if (!s.tensor_scale && ts != 1.0f) continue;
        const GroupScale g = choose_scale(s, amax, t);
        ASSERT_EQ(g.code, ref::scale_code(s, amax, t))
            << to_string(s) << " amax " << amax << " ts " << t;
        EXPECT_FALSE(g.nan);
      }
}

// The table the kernels look block scales up in gives choose_scale's code and its overflow
// and underflow counts: at every breakpoint and the float on either side of it, at the
// amaxes above and at random ones, for every rule, UE4M3 element format and tensor scale.
TEST(ScaledScale, ScaleStepsGiveChooseScalesCodes) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<std::uint32_t> bits(1, 0x7F7FFFFFu);
  int checked = 0, checked_four = 0, single = 0, walking = 0;
  std::vector<ScaledSpec> specs = all_rules();
  for (const char* more : {"e4m3fn@1x32:ue4m3", "e5m2@1x16:ue4m3:tensor-scale", "e2m3fn@16x16:ue4m3:tensor-scale"})
    for (ScaleRule r : {ScaleRule::floor, ScaleRule::ceil, ScaleRule::nearest}) {
      ScaledSpec s = parse_scaled(more);
      s.rule = r;
      specs.push_back(s);
    }
  for (const ScaledSpec& s : specs) {
    if (s.scale != ScaleFormat::ue4m3) {
      EXPECT_FALSE(ScaleSteps::make(s, 1.0f)) << to_string(s);
      continue;
    }
    for (const float ts : {1.0f, 0.0123f, 3.0e-30f, 1.0e-38f, 7.1e25f, std::numeric_limits<float>::min()}) {
      const auto t = ScaleSteps::make(s, ts);
      ASSERT_TRUE(t);
      const auto four = s.four_over_six ? ScaleSteps::make(s, ts, 4.0) : std::nullopt;
      ++(t->single_step() ? single : walking);
      std::vector<float> probes = amaxes(s);
      for (std::uint32_t c = 1; c <= t->max_code(); ++c) {
        const std::uint32_t b = t->first(c);
        if (b >= 0x7F800000u) continue;
        probes.push_back(std::bit_cast<float>(b));
        if (b > 1) probes.push_back(std::bit_cast<float>(b - 1));
        probes.push_back(std::bit_cast<float>(b + 1));
      }
      for (int i = 0; i < 2000; ++i) probes.push_back(std::bit_cast<float>(bits(rng)));
      for (const float amax : probes) {
        ScaledCounts counts;
        const GroupScale g = choose_scale(s, amax, ts, &counts);
        const std::uint32_t a = std::bit_cast<std::uint32_t>(amax);
        ASSERT_EQ(t->code(a), g.code) << to_string(s) << " amax " << amax << " ts " << ts;
        ASSERT_EQ(t->code(a), ref::scale_code(s, amax, ts)) << to_string(s) << " amax " << amax << " ts " << ts;
        ASSERT_EQ(std::bit_cast<std::uint32_t>(t->value(g.code)), std::bit_cast<std::uint32_t>(g.value));
        ASSERT_EQ(t->overflow(a), counts.scale_overflow == 1) << to_string(s) << " amax " << amax << " ts " << ts;
        ASSERT_EQ(g.code == 0, counts.scale_underflow == 1) << to_string(s) << " amax " << amax << " ts " << ts;
        if (four) {  // Four Over Six's second table: the amax scaled to 4 (docs/spec.md §6.10)
          ASSERT_EQ(four->code(a), ref::scale_code(s, amax, ts, 4.0)) << to_string(s) << " amax " << amax;
          ++checked_four;
        }
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 10000);
  EXPECT_GT(checked_four, 1000);
  EXPECT_GT(single, 0);  // both look-ups were tested
  EXPECT_GT(walking, 0);
}

TEST(ScaledNotation, TorchaosArithmeticIsAnOption) {
  const ScaledSpec s = parse_scaled("nvfp4:torchao");
  EXPECT_EQ(s.arithmetic, ScaleArithmetic::torchao);
  EXPECT_TRUE(s.multiplies());
  EXPECT_FALSE(parse_scaled("nvfp4").multiplies());
  EXPECT_EQ(to_string(s), "e2m1fn@1x16:ue4m3:nearest:tensor-scale:torchao");
  EXPECT_EQ(parse_scaled(to_string(s)), s);
  EXPECT_EQ(codes_name(s), to_string(s));  // other codes than nvfp4's: part of the stored name
  EXPECT_EQ(to_string(parse_scaled("e2m1fn@1x16:ue4m3:nearest:torchao")), "e2m1fn@1x16:ue4m3:nearest:torchao");
}

// torchao's NVFP4 scale (docs/spec.md §6.9), worked by hand: s = ue4m3(clamp(fl32(fl32(amax
// / 6) / ts), 2^-6, 448)) to nearest, elements times fl32(fl32(1 / ts) / s).
TEST(ScaledScale, TorchaosArithmetic) {
  const ScaledSpec t = parse_scaled("nvfp4:torchao"), exact = parse_scaled("nvfp4");
  GroupScale g = choose_scale(t, 6.0f, 1);
  EXPECT_EQ(g.code, 0x38u);  // 1.0
  EXPECT_EQ(g.value, 1.0f);
  EXPECT_EQ(g.reciprocal, 1.0f);
  // amax / 6 = 2^-8: the exact rule takes the subnormal 2^-8 (code 2); torchao clamps the
  // quotient up to the least normal, 2^-6 (code 8), and counts a scale underflow.
  ScaledCounts c;
  EXPECT_EQ(choose_scale(exact, 6.0f * 0x1p-8f, 1).code, 2u);
  g = choose_scale(t, 6.0f * 0x1p-8f, 1, &c);
  EXPECT_EQ(g.code, 8u);
  EXPECT_EQ(g.reciprocal, 64.0f);
  EXPECT_EQ(c.scale_underflow, 1u);
  // A zero group has the least normal scale too (exact: code 0), and counts no underflow.
  g = choose_scale(t, 0.0f, 1, &c);
  EXPECT_TRUE(g.zero);
  EXPECT_EQ(g.code, 8u);
  EXPECT_EQ(c.scale_underflow, 1u);
  // Past 448: clamped, counted as an overflow.
  g = choose_scale(t, 1e6f, 1, &c);
  EXPECT_EQ(g.code, 126u);
  EXPECT_EQ(c.scale_overflow, 1u);
  // With a tensor scale of 3: amax 36 gives fl32(6 / 3) = 2 (code 0x40), X = 6, and the
  // elements are multiplied by fl32(fl32(1 / 3) / 2), not divided by 6.
  g = choose_scale(t, 36.0f, 3.0f);
  EXPECT_EQ(g.code, 0x40u);
  EXPECT_EQ(g.value, 6.0f);
  EXPECT_EQ(g.reciprocal, (1.0f / 3.0f) / 2.0f);
  EXPECT_NE(g.reciprocal * 5.0f, 5.0f / 6.0f);  // where the two orders part
  EXPECT_EQ(choose_scale(t, NAN, 3.0f).code, 0x7Fu);
}

// The kernels' table of the quartet arithmetic's scale codes (ScaleSteps, found by bisection)
// gives choose_scale's code at and beside every step and at random amaxes: ue4m3 of
// fl32(fl32(amax / m) / ts) to nearest-even, code 0 where choose_scale takes 1 instead (a
// scale underflow), and overflow where the quotient passes 448 (docs/spec.md §6.13).
TEST(QuartetArithmetic, ScaleStepsGiveChooseScalesCodes) {
  std::mt19937 rng(8);
  std::uniform_int_distribution<std::uint32_t> bits(1, 0x7F7FFFFFu);
  const Format e4m3 = scale_format(ScaleFormat::ue4m3);
  const std::uint32_t one = encode(1.0f, QuantSpec{e4m3});
  for (const char* name : {"nvfp4_quartet", "nvfp4_eden"}) {
    const ScaledSpec s = parse_scaled(name);
    const float m = quartet_constants(s).m;
    for (const float ts : {1.0f, 0.0123f, 3.0e-30f, 7.1e25f, std::numeric_limits<float>::min()}) {
      const auto t = ScaleSteps::make(s, ts);
      ASSERT_TRUE(t) << name;
      std::vector<float> probes;
      for (std::uint32_t c = 1; c <= t->max_code(); ++c) {
        const std::uint32_t b = t->first(c);
        if (b >= 0x7F800000u) continue;
        for (const std::uint32_t d : {b - 1, b, b + 1}) probes.push_back(std::bit_cast<float>(d));
      }
      for (int i = 0; i < 3000; ++i) probes.push_back(std::bit_cast<float>(bits(rng)));
      for (const float amax : probes) {
        ScaledCounts counts;
        const GroupScale g = choose_scale(s, amax, ts, &counts);
        const std::uint32_t a = std::bit_cast<std::uint32_t>(amax), want =
            encode(std::min(amax / m / ts, std::numeric_limits<float>::max()), QuantSpec{e4m3});
        ASSERT_EQ(t->code(a), want) << name << " amax " << amax << " ts " << ts;
        ASSERT_EQ(g.code, want == 0 ? one : want) << name << " amax " << amax << " ts " << ts;
        ASSERT_EQ(counts.scale_underflow, want == 0 ? 1u : 0u);
        ASSERT_EQ(t->overflow(a), counts.scale_overflow == 1) << name << " amax " << amax << " ts " << ts;
        ASSERT_EQ(std::bit_cast<std::uint32_t>(t->value(g.code)), std::bit_cast<std::uint32_t>(g.value));
      }
    }
  }
}

// The quartet arithmetic and MS-EDEN (docs/spec.md §6.13) refuse what they do not define.
TEST(QuartetArithmetic, RefusesWhatItDoesNotDefine) {
  EXPECT_NE(error_of([] { parse_scaled("nvfp4:eden-32"); }).find("add the option quartet"), std::string::npos);
  EXPECT_NE(error_of([] { parse_scaled("nvfp4_eden:eden-24"); }).find("multiple of the block (16)"), std::string::npos);
  EXPECT_NE(error_of([] { parse_scaled("nvfp4_quartet:ceil"); }).find("Quartet II"), std::string::npos);
  EXPECT_NE(error_of([] { parse_scaled("mxfp4:quartet"); }).find("Quartet II"), std::string::npos);
  EXPECT_NE(error_of([] { parse_scaled("nvfp4_quartet:delayed-4"); }).find("current scaling"), std::string::npos);
  EXPECT_NE(error_of([] { parse_scaled("nvfp4_eden:eden-x"); }).find("expected eden-N"), std::string::npos);
  ScaledSpec s = parse_scaled("nvfp4_eden");
  s.element.rounding = Rounding::stochastic;
  EXPECT_NE(error_of([&] { validate(s); }).find("stochastic rounding of the elements"), std::string::npos);
  EXPECT_EQ(to_string(parse_scaled("nvfp4_eden:eden-32")), "e2m1fn@1x16:ue4m3:nearest:tensor-scale:quartet:eden-32");
}

// MS-EDEN on one window of 32 values, worked from the published kernel in float32: D =
// fl32(fl32(A / 255.99) / m), m = fl32(6 / 0.988125); block scales s_b = e4m3(fl32(fl32(a_b / m) /
// D)); v = fl32(x / fl32(s_b D)); q = v to nearest-away on E2M1; c = sum v^2 / sum v q; each block
// keeps one of the two E4M3 neighbours of fl32(s_b c), both drawn over seeds; values
// fl32(fl32(q s) D). Without eden, the values are q fl32(s_b D) with scales for 448 and 6.
TEST(QuartetArithmetic, MsEdenFollowsThePublishedKernel) {
  std::vector<float> x(32);
  for (std::size_t i = 0; i < 32; ++i) x[i] = std::sin(static_cast<float>(i) * 0.7f) * (i < 16 ? 3.0f : 0.02f);
  const auto m = static_cast<float>(6.0 / (17.0 / 16.0 * 0.93));
  float A = 0, a[2] = {0, 0};
  for (std::size_t i = 0; i < 32; ++i) {
    A = std::max(A, std::abs(x[i]));
    a[i / 16] = std::max(a[i / 16], std::abs(x[i]));
  }
  const float D = A / 255.99f / m;
  const Format e4m3 = scale_format(ScaleFormat::ue4m3), e2m1 = parse_format("e2m1fn");
  float sb[2], q[32], v[32];
  double num = 0, den = 0;
  for (int b = 0; b < 2; ++b) sb[b] = decode(encode(a[b] / m / D, QuantSpec{e4m3}), e4m3);
  for (std::size_t i = 0; i < 32; ++i) {
    v[i] = x[i] / (sb[i / 16] * D);
    q[i] = decode(encode(v[i], QuantSpec{e2m1, Rounding::nearest_away}), e2m1);
    num += static_cast<double>(v[i]) * v[i];
    den += static_cast<double>(v[i]) * q[i];
  }
  const float c = static_cast<float>(num) / static_cast<float>(den);
  ScaledSpec s = parse_scaled("nvfp4_eden:eden-32");
  s.element.rounding = Rounding::nearest_away;
  bool drawn[2][2] = {{false, false}, {false, false}};
  for (std::uint64_t seed = 0; seed < 64; ++seed) {
    s.element.seed = seed;
    std::vector<float> y(32);
    std::vector<std::uint32_t> scales(2);
    float ts = 0;
    ScaledCounts counts;
    (void)scaled_quantize_reference(x.data(), 1, 32, s, {y.data(), nullptr, scales.data(), &ts}, {}, &counts);
    ASSERT_EQ(ts, D);
    EXPECT_EQ(counts.groups, 2u);
    for (int b = 0; b < 2; ++b) {
      const float t = sb[b] * c, got = decode(scales[static_cast<std::size_t>(b)], e4m3);
      const float down = decode(encode(t, QuantSpec{e4m3, Rounding::toward_zero}), e4m3);
      const float up = down == t ? down : decode(encode(down, QuantSpec{e4m3}) + 1, e4m3);
      ASSERT_TRUE(got == down || got == up) << "block " << b << " seed " << seed << ": " << got << " not " << down
                                            << " or " << up;
      drawn[b][got == up ? 1 : 0] = true;
      for (std::size_t i = 16 * static_cast<std::size_t>(b); i < 16 * static_cast<std::size_t>(b) + 16; ++i)
        ASSERT_EQ(y[i], (q[i] * got) * D) << i;
    }
  }
  EXPECT_TRUE(drawn[0][0] && drawn[0][1] && drawn[1][0] && drawn[1][1]) << "both neighbours of each block";
  // Quartet II's forward quantizer: scales for 448 and 6, values q fl32(s_b D).
  ScaledSpec f = parse_scaled("nvfp4_quartet:eden-32");
  f.eden = 0;
  f.element.rounding = Rounding::nearest_away;
  std::vector<float> y(32);
  (void)scaled_quantize_reference(x.data(), 1, 32, f, {y.data()});
  const float Df = A / 448.0f / 6.0f;
  for (std::size_t i = 0; i < 32; ++i) {
    const float s_b = decode(encode(a[i / 16] / 6.0f / Df, QuantSpec{e4m3}), e4m3);
    const float X = s_b * Df;
    EXPECT_EQ(y[i], decode(encode(x[i] / X, QuantSpec{e2m1, Rounding::nearest_away}), e2m1) * X) << i;
  }
}

// TransformerEngine's NVFP4 quantizer (docs/spec.md §6.9), worked by hand: E = fl32(2688 /
// A), the tensor scale D = fl32(1 / E), s = ue4m3(min(fl32(amax * fl32(E * fl32(1 / 6))),
// 448)) to nearest-even, X = fl32(s * D), elements times fl32(1 / X).
TEST(ScaledScale, TransformerEnginesNvfp4Arithmetic) {
  const ScaledSpec t = parse_scaled("nvfp4:te"), exact = parse_scaled("nvfp4");
  EXPECT_EQ(to_string(t), "e2m1fn@1x16:ue4m3:nearest:tensor-scale:te");
  EXPECT_EQ(codes_name(t), to_string(t));  // other codes than nvfp4's
  // A = 2688: E = D = 1. amax 1.7812499 (0x3FE3FFFF): amax / 6 lies just below the midpoint
  // 0.296875 of 0.28125 (code 41) and 0.3125 (code 42), which the exact rule sees; TE's
  // float32 product rounds onto the midpoint, and the tie goes to the even code 42.
  const TensorScale one = tensor_scale_for(t, 2688.0f);
  EXPECT_EQ(one.value, 1.0f);
  EXPECT_EQ(one.te_encode, 1.0f);
  const float amax = std::bit_cast<float>(0x3FE3FFFFu);
  EXPECT_EQ(choose_scale(exact, amax, 1.0f).code, 41u);
  GroupScale g = choose_scale(t, amax, one);
  EXPECT_EQ(g.code, 42u);
  EXPECT_EQ(g.value, 0.3125f);
  EXPECT_EQ(g.reciprocal, 3.2f);
  // A = 10: E = fl32(268.8), D = fl32(1 / E) = 0.0037202383, an ulp from the exact
  // arithmetic's fl32(10 / 2688).
  const TensorScale ten = tensor_scale_for(t, 10.0f);
  EXPECT_EQ(ten.te_encode, 2688.0f / 10.0f);
  EXPECT_EQ(ten.value, 1.0f / (2688.0f / 10.0f));
  EXPECT_EQ(tensor_scale_of(t, 10.0f), ten.value);
  EXPECT_NE(ten.value, tensor_scale_of(exact, 10.0f));
  // A = 3: fl32(3 * fl32(896 / 6)) = 448.00003 is past 448: clamped, counted as an overflow.
  ScaledCounts c;
  g = choose_scale(t, 3.0f, tensor_scale_for(t, 3.0f), &c);
  EXPECT_EQ(g.code, 126u);
  EXPECT_EQ(c.scale_overflow, 1u);
  // A scale below half UE4M3's least subnormal rounds to 0 (an underflow); its elements are
  // then multiplied by float32's largest, as TE's are, and read back as 0.
  g = choose_scale(t, 1e-6f, one, &c);
  EXPECT_EQ(g.code, 0u);
  EXPECT_FALSE(g.zero);
  EXPECT_EQ(g.value, 0.0f);
  EXPECT_EQ(g.reciprocal, std::numeric_limits<float>::max());
  EXPECT_EQ(c.scale_underflow, 1u);
  // In a tensor: block 0 holds A = 2688, block 1's scale rounds to 0. Block 1's elements
  // saturate to +-6 (zeros stay zeros; -0 keeps its sign, where TE's cast writes +0), and read
  // back as zeros of their signs.
  std::vector<float> x = {2688.0f, 1.0f, 2.0f, 3.0f, 1e-6f, -5e-7f, 0.0f, -0.0f}, y(8);
  std::vector<std::uint8_t> codes(8);
  std::vector<std::uint32_t> scales(2);
  float ts = 0;
  ScaledCounts counts;
  scaled_quantize_reference(x.data(), 1, 8, parse_scaled("e2m1fn@1x4:ue4m3:nearest:tensor-scale:te"),
                            {.values = y.data(), .codes = codes.data(), .scale_codes = scales.data(),
                             .tensor_scale = &ts},
                            {}, &counts);
  EXPECT_EQ(ts, 1.0f);
  EXPECT_EQ(scales, (std::vector<std::uint32_t>{126u, 0u}));
  EXPECT_EQ(std::vector<std::uint8_t>(codes.begin() + 4, codes.end()), (std::vector<std::uint8_t>{7, 15, 0, 8}));
  for (int i = 4; i < 8; ++i) {
    EXPECT_EQ(y[i], 0.0f);
    EXPECT_EQ(std::signbit(y[i]), std::signbit(x[i])) << i;
  }
  EXPECT_EQ(counts.scale_underflow, 1u);
  // An all-zero tensor: E = float32's largest (2688 / 0), D its reciprocal; every code 0.
  const TensorScale zero = tensor_scale_for(t, 0.0f);
  EXPECT_EQ(zero.te_encode, std::numeric_limits<float>::max());
  EXPECT_GT(zero.value, 0.0f);
  // A tensor scale given as a float alone lacks E: te's block scales refuse it.
  EXPECT_NE(error_of([&] { (void)choose_scale(t, 1.0f, 1.0f); }).find("global encode factor"), std::string::npos);
  EXPECT_EQ(choose_scale(t, NAN, one).code, 0x7Fu);
}

// dither-scale (docs/spec.md §6.11), worked by hand on one MXFP4 block: amax 7 gives e =
// floor(log2 7) - 2 = 0; x = 7 is rounded from fl32(21) / 4 = 5.25 (to 6, not past it), and
// reads back as fl32(6 * 4) / 3 = 8; x = 1 from 0.75 (a tie: to 1, even), read back as 4/3.
TEST(ScaledScale, DitherScaleIsThreeQuartersOfTheBlock) {
  const ScaledSpec s = parse_scaled("mxfp4:dither-scale");
  EXPECT_EQ(to_string(s), "e2m1fn@1x32:e8m0:floor:dither-scale");
  EXPECT_FALSE(s.power_of_two_elements());
  EXPECT_EQ(codes_name(s), to_string(s));
  std::vector<float> x(32, 0.0f), y(32);
  x[0] = 7.0f;
  x[1] = 1.0f;
  x[2] = -0.3f;  // 3/4: -0.225, to -0 (below the tie 0.25)
  std::vector<std::uint8_t> codes(32);
  std::uint32_t scale = 0;
  ScaledCounts c;
  scaled_quantize_reference(x.data(), 1, 32, s, {.values = y.data(), .codes = codes.data(), .scale_codes = &scale},
                            {}, &c);
  EXPECT_EQ(scale, 127u);
  EXPECT_EQ(y[0], 8.0f);
  EXPECT_EQ(y[1], 4.0f / 3.0f);
  EXPECT_EQ(y[2], 0.0f);
  EXPECT_TRUE(std::signbit(y[2]));
  EXPECT_EQ(c.elements.overflow, 0u);
  // The plain quantizer: 7 / 1 saturates to 6, counted.
  ScaledCounts plain;
  scaled_quantize_reference(x.data(), 1, 32, parse_scaled("mxfp4"), {.values = y.data()}, {}, &plain);
  EXPECT_EQ(y[0], 6.0f);
  EXPECT_EQ(plain.elements.overflow, 1u);
  // Decoding reads the same values back.
  std::vector<float> back(32);
  scaled_decode_reference(codes.data(), &scale, 1.0f, 1, 32, s, back.data());
  EXPECT_EQ(back[0], 8.0f);
  EXPECT_EQ(back[1], 4.0f / 3.0f);
}

// TransformerEngine's current scaling (docs/spec.md §6.9), worked by hand: S = fl32(max_e /
// amax), X = fl32(1 / S), elements times S.
TEST(ScaledScale, TransformerEnginesArithmetic) {
  const ScaledSpec t = parse_scaled("e4m3_tensor:te");
  EXPECT_EQ(to_string(t), "e4m3fn@tensor:fp32:nearest:te");
  GroupScale g = choose_scale(t, 448.0f, 1);
  EXPECT_EQ(g.reciprocal, 1.0f);
  EXPECT_EQ(g.value, 1.0f);
  g = choose_scale(t, 11.0f, 1);
  EXPECT_EQ(g.reciprocal, 448.0f / 11.0f);
  EXPECT_EQ(g.value, 1.0f / (448.0f / 11.0f));
  EXPECT_EQ(std::bit_cast<float>(g.code), g.value);
  EXPECT_NE(g.value, choose_scale(parse_scaled("e4m3_tensor"), 11.0f, 1).value);  // fl32(11 / 448), an ulp away
  ScaledCounts c;
  g = choose_scale(t, 1e-40f, 1, &c);  // 448 / 1e-40 overflows: float32's largest
  EXPECT_EQ(g.reciprocal, std::numeric_limits<float>::max());
  EXPECT_EQ(c.scale_underflow, 1u);
  g = choose_scale(t, 0.0f, 1, &c);
  EXPECT_TRUE(g.zero);
  EXPECT_EQ(g.value, 1.0f);
  EXPECT_EQ(c.scale_underflow, 1u);
  EXPECT_TRUE(choose_scale(t, NAN, 1).nan);
}

TEST(ScaledScale, FloorIsTheOcpRuleAndCeilNeverSaturates) {
  const ScaledSpec mx = parse_scaled("mxfp8_e4m3");
  EXPECT_EQ(element_emax(mx.element.format), 8);
  EXPECT_EQ(choose_scale(mx, 448.0f, 1).code, 127u);         // 2^(8-8)
  EXPECT_EQ(choose_scale(mx, 480.0f, 1).code, 127u);         // floor: 480 saturates to 448
  EXPECT_EQ(choose_scale(mx, 1.0f, 1).code, 119u);           // 2^(0-8)
  EXPECT_EQ(choose_scale(mx, 1e-40f, 1).code, 0u);           // below 2^-127: clamped up
  EXPECT_EQ(choose_scale(mx, 0.0f, 1).code, 0u);
  EXPECT_TRUE(choose_scale(mx, 0.0f, 1).zero);
  EXPECT_EQ(choose_scale(mx, NAN, 1).code, 0xFFu);
  EXPECT_EQ(choose_scale(mx, INFINITY, 1).code, 0xFFu);
  ScaledSpec up = mx;
  up.rule = ScaleRule::ceil;
  EXPECT_EQ(choose_scale(up, 448.0f, 1).code, 127u);
  EXPECT_EQ(choose_scale(up, 480.0f, 1).code, 128u);         // 480/2 = 240 fits
  ScaledCounts c;
  (void)choose_scale(mx, 1e-40f, 1, &c);
  EXPECT_EQ(c.scale_underflow, 1u);
  const ScaledSpec nv = parse_scaled("nvfp4");
  EXPECT_EQ(choose_scale(nv, 6.0f, 1).value, 1.0f);
  EXPECT_EQ(choose_scale(nv, NAN, 1).code, 0x7Fu);
  EXPECT_EQ(tensor_scale_of(nv, 2688.0f), 1.0f);             // 6 * 448
  EXPECT_EQ(tensor_scale_of(nv, 0.0f), 1.0f);
  EXPECT_EQ(tensor_scale_of(parse_scaled("mxfp4"), 5.0f), 1.0f);
}

// Groups that reach every case, laid out in a matrix of `rows` x `cols`.
std::vector<float> hostile(std::size_t n, std::uint64_t seed, const ScaledSpec& s) {
  ref::InputGen gen(seed);
  std::vector<float> x(n);
  const double max_e = s.element.format.max_finite();
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t r = gen.next();
    const int k = static_cast<int>(r % 60) - 30;
    switch ((r >> 8) % 8) {
      case 0: x[i] = gen.any_bits(); break;                              // anything, specials too
      case 1: x[i] = std::ldexp(1.0f, k); break;                          // a power of two
      case 2: x[i] = static_cast<float>(max_e * std::ldexp(1.0, k)); break;  // the element max scaled
      case 3: x[i] = 0.0f; break;
      case 4: x[i] = std::ldexp(static_cast<float>(r >> 40), -160); break;  // subnormal
      default: x[i] = std::ldexp(static_cast<float>(static_cast<std::int32_t>(r >> 32)), k - 31); break;
    }
    if ((r >> 20) % 2) x[i] = -x[i];
  }
  return x;
}

// Blocks of 8 consecutive rows are all zero, all tiny, or finite only, so that zero groups,
// scale underflow and finite groups occur beside NaN groups.
void shape_groups(std::vector<float>& x, std::size_t cols) {
  for (std::size_t i = 0; i < x.size(); ++i) {
    const std::size_t band = (i / cols / 8) % 4;
    if (band == 0) x[i] = (i % 3 == 0) ? -0.0f : 0.0f;
    if (band == 1) x[i] = std::isfinite(x[i]) ? std::ldexp(1.0f, -140) * static_cast<float>(i % 7) : 1e-45f;
    if (band == 2 && !std::isfinite(x[i])) x[i] = 1.0f;
    if (band == 3 && i % 211 == 0) x[i] = (i % 2) ? NAN : -INFINITY;
  }
}

struct Result {
  std::vector<float> y;
  std::vector<std::uint8_t> codes;
  std::vector<std::uint32_t> scales;
  float ts = 0;
  ScaledCounts counts;
};

Result run(const ScaledSpec& s, const std::vector<float>& x, std::size_t rows, std::size_t cols,
           const ScaledCall& call = {}) {
  Result r;
  r.y.resize(x.size());
  r.codes.resize(x.size());
  r.scales.resize(block_layout(s, rows, cols).groups());
  scaled_quantize_reference(x.data(), rows, cols, s, {r.y.data(), r.codes.data(), r.scales.data(), &r.ts}, call,
                            &r.counts);
  return r;
}

bool same(float a, float b) { return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b) || (std::isnan(a) && std::isnan(b)); }

TEST(ScaledReference, MatchesTheSortedValueReferenceOnEveryCase) {
  constexpr std::size_t rows = 64, cols = 200;  // 200: the last 1x32 block of a row is short
  for (ScaledSpec s : all_rules()) {
    for (Rounding rounding : {Rounding::nearest_even, Rounding::stochastic}) {
      s.element.rounding = rounding;
      s.element.seed = 7;
      std::vector<float> x = hostile(rows * cols, 11, s);
      shape_groups(x, cols);
      const Result got = run(s, x, rows, cols);
      const BlockLayout l = block_layout(s, rows, cols);
      const float ts = tensor_scale_of(s, amax_of(x.data(), x.size()).value);
      ASSERT_EQ(got.ts, ts);
      const ref::Table table(s.element.format);
      std::vector<std::optional<std::uint32_t>> expected(l.groups());
      struct GroupAmax {
        float amax = 0;
        bool nonfinite = false, known = false;
        std::vector<ref::IndexedValue> values;  // for 4over6
      };
      std::vector<GroupAmax> group_amax(l.groups());
      for (std::size_t r = 0; r < rows; ++r)
        for (std::size_t c = 0; c < cols; ++c) {
          const std::size_t gr = r / l.block_rows, gc = c / l.block_cols, i = r * cols + c;
          // The group's amax by hand, once per group.
          auto& [amax, nonfinite, known, values] = group_amax[gr * l.grid_cols() + gc];
          if (!known) {
            known = true;
            for (std::size_t rr = gr * l.block_rows; rr < std::min(rows, (gr + 1) * l.block_rows); ++rr)
              for (std::size_t cc = gc * l.block_cols; cc < std::min(cols, (gc + 1) * l.block_cols); ++cc) {
                values.push_back({x[rr * cols + cc], rr * cols + cc});
                const float v = std::fabs(x[rr * cols + cc]);
                if (!std::isfinite(v)) nonfinite = true;
                else amax = std::max(amax, v);
              }
          }
          const std::uint32_t scode = got.scales[gr * l.grid_cols() + gc];
          if (nonfinite) {
            ASSERT_EQ(scode, s.scale == ScaleFormat::e8m0 ? 0xFFu : s.scale == ScaleFormat::ue4m3 ? 0x7Fu : 0x7FC00000u);
            ASSERT_TRUE(std::isnan(got.y[i]));
            continue;
          }
          std::optional<std::uint32_t>& cached = expected[gr * l.grid_cols() + gc];
          if (!cached)
            cached = amax == 0            ? 0
                     : s.four_over_six ? ref::four_over_six_code(s, table, values, amax, ts)
                                       : ref::scale_code(s, amax, ts);
          const std::uint32_t want_scode = *cached;
          ASSERT_EQ(scode, want_scode) << to_string(s) << " group " << gr << "," << gc << " amax " << amax;
          const double X = s.tensor_scale ? static_cast<float>(ref::scale_value(s, scode) * ts) : ref::scale_value(s, scode);
          const ref::ElementOut want = ref::element(s, table, x[i], X, i);
          ASSERT_EQ(got.codes[i], want.code) << to_string(s) << " x " << x[i] << " X " << X;
          ASSERT_TRUE(same(got.y[i], want.value)) << to_string(s) << " x " << x[i] << " X " << X << ": "
                                                  << got.y[i] << " vs " << want.value;
        }
      if (l.block_rows == 1 && l.block_cols <= 128) {  // small groups: every kind occurs
        EXPECT_GT(got.counts.nan_groups, 0u) << to_string(s);
        EXPECT_GT(got.counts.zero_groups, 0u) << to_string(s);
        EXPECT_GT(got.counts.nan_groups + got.counts.zero_groups, 0u) << to_string(s);
      }
      EXPECT_EQ(got.counts.groups, l.groups());
      EXPECT_EQ(got.counts.elements.total, rows * cols);
    }
  }
}

TEST(ScaledReference, DecodingTheCodesGivesTheValues) {
  constexpr std::size_t rows = 40, cols = 96;
  for (const ScaledSpec& s : all_rules()) {
    std::vector<float> x = hostile(rows * cols, 3, s);
    shape_groups(x, cols);
    const Result got = run(s, x, rows, cols);
    std::vector<float> y(x.size());
    scaled_decode_reference(got.codes.data(), got.scales.data(), got.ts, rows, cols, s, y.data());
    for (std::size_t i = 0; i < x.size(); ++i)
      if (!std::isnan(x[i])) {
        ASSERT_TRUE(same(y[i], got.y[i])) << to_string(s) << " " << i;
      }
  }
}

TEST(ScaledReference, GroupsFollowTheLayout) {
  // Each row r holds 2^r in column 0 only: per line, every row has its own scale; per
  // tensor, one scale from the largest; per 4x4 tile, the largest of four rows.
  constexpr std::size_t rows = 8, cols = 5;
  std::vector<float> x(rows * cols, 0.0f);
  for (std::size_t r = 0; r < rows; ++r) x[r * cols] = std::ldexp(1.0f, static_cast<int>(r));
  auto scales = [&](const char* text) { return run(parse_scaled(text), x, rows, cols).scales; };
  EXPECT_EQ(scales("e4m3fn@line:e8m0:floor"), (std::vector<std::uint32_t>{119, 120, 121, 122, 123, 124, 125, 126}));
  EXPECT_EQ(scales("e4m3fn@tensor:e8m0:floor"), (std::vector<std::uint32_t>{126}));
  EXPECT_EQ(scales("e4m3fn@4x4:e8m0:floor"), (std::vector<std::uint32_t>{122, 0, 126, 0}));
  EXPECT_EQ(scales("e4m3fn@1x4:e8m0:floor").size(), 16u);
  EXPECT_EQ(block_layout(parse_scaled("mxfp4"), 3, 65).groups(), 9u);
  EXPECT_EQ(block_layout(parse_scaled("mxfp4"), 0, 65).groups(), 0u);
  EXPECT_DOUBLE_EQ(bits_per_element(parse_scaled("mxfp4"), 4, 64), 4.25);
  EXPECT_DOUBLE_EQ(bits_per_element(parse_scaled("mxfp8_e4m3"), 4, 64), 8.25);
  EXPECT_DOUBLE_EQ(bits_per_element(parse_scaled("nvfp4"), 4, 64), 4.5 + 32.0 / 256);
  EXPECT_DOUBLE_EQ(bits_per_element(parse_scaled("e5m2"), 4, 64), 8);
}

TEST(ScaledReference, FloorSaturatesWhereCeilDoesNot) {
  // amax 1.9 * 2^3: floor gives 2^(3-8), so 1.9 * 2^8 = 486 > 448 saturates.
  std::vector<float> x(32, 1.0f);
  x[5] = 15.2f;
  const Result floor = run(parse_scaled("mxfp8_e4m3"), x, 1, 32);
  EXPECT_EQ(floor.counts.saturated_groups, 1u);
  EXPECT_EQ(floor.counts.elements.overflow, 1u);
  EXPECT_EQ(floor.y[5], 14.0f);  // 448 * 2^-5
  const Result ceil = run(parse_scaled("mxfp8_e4m3:ceil"), x, 1, 32);
  EXPECT_EQ(ceil.counts.saturated_groups, 0u);
  EXPECT_EQ(ceil.y[5], 15.0f);  // 240 * 2^-4
}

TEST(ScaledReference, DelayedScalingTakesTheHistory) {
  const ScaledSpec s = parse_scaled("e4m3_delayed");
  std::vector<float> x{1.0f, -2.0f, 100.0f, NAN};
  ScaledCall call;
  call.delayed_amax = 44.8f;  // scale 0.1: 100 saturates at 44.8
  const Result r = run(s, x, 1, 4, call);
  EXPECT_EQ(r.scales[0], std::bit_cast<std::uint32_t>(0.1f));
  EXPECT_EQ(r.y[2], 448.0f * 0.1f);
  EXPECT_EQ(r.counts.elements.overflow, 1u);
  EXPECT_TRUE(std::isnan(r.y[3]));  // one NaN element, not a NaN tensor
  EXPECT_EQ(r.counts.nan_groups, 0u);
  // Without a history (or a zero one) the current amax is used.
  call.delayed_amax = 0.0f;
  EXPECT_TRUE(std::isnan(run(s, x, 1, 4, call).y[0]));  // the NaN makes the tensor's scale NaN
  x[3] = 3.0f;
  EXPECT_EQ(run(s, x, 1, 4, call).y, run(s, x, 1, 4).y);
  EXPECT_EQ(run(s, x, 1, 4).scales[0], std::bit_cast<std::uint32_t>(100.0f / 448.0f));

  AmaxHistory h(3);
  EXPECT_FALSE(h.amax());
  for (float a : {5.0f, 1.0f, 2.0f, 3.0f}) h.push(a);
  EXPECT_EQ(h.amax(), 3.0f);  // 5 has left the window
  EXPECT_EQ(h.values().size(), 3u);
  EXPECT_NE(error_of([&] { h.restore({1, 2, 3, 4}); }).find("4 values for a length of 3"), std::string::npos);
  EXPECT_NE(error_of([&] { h.restore({NAN}); }).find("not a finite amax"), std::string::npos);
  h.restore({7.0f});
  EXPECT_EQ(h.amax(), 7.0f);
}

TEST(ScaledReference, ZeroAndNanTensors) {
  for (const ScaledSpec& s : all_rules()) {
    std::vector<float> x(300, 0.0f);
    x[7] = -0.0f;
    Result r = run(s, x, 10, 30);
    EXPECT_EQ(r.counts.zero_groups, r.counts.groups) << to_string(s);
    for (std::size_t i = 0; i < x.size(); ++i) ASSERT_TRUE(same(r.y[i], x[i])) << to_string(s) << " " << i;
    for (std::uint32_t c : r.scales) ASSERT_EQ(c, 0u);
    x[299] = NAN;
    r = run(s, x, 10, 30);
    EXPECT_TRUE(std::isnan(r.y[299]));
    EXPECT_EQ(r.counts.nan_groups, 1u) << to_string(s);
    EXPECT_EQ(r.counts.zero_groups, r.counts.groups - 1) << to_string(s);
  }
}

TEST(ScaledReference, FixedBiasIsThePlainQuantizer) {
  const ScaledSpec s = parse_scaled("1.4.3:10");
  const std::vector<float> x = hostile(4096, 5, s);
  const Result r = run(s, x, 64, 64);
  for (std::size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(r.codes[i], encode(x[i], s.element));
    ASSERT_TRUE(same(r.y[i], quantize(x[i], s.element)));
  }
  EXPECT_EQ(r.ts, 1.0f);
}

TEST(Scaled, ScaleCodesOutsideTheScaleFormatReadAsNaN) {
  const ScaledSpec nv = parse_scaled("nvfp4");
  EXPECT_FALSE(scale_from_code(nv, 0x7E, 1.0f).nan);  // 448
  EXPECT_EQ(scale_from_code(nv, 0x7E, 1.0f).value, 448.0f);
  EXPECT_TRUE(scale_from_code(nv, 0x7F, 1.0f).nan);
  for (std::uint32_t c : {0x80u, 0xC8u, 0xFFu, 0x1234u}) EXPECT_TRUE(scale_from_code(nv, c, 1.0f).nan) << c;
  const ScaledSpec mx = parse_scaled("mxfp4");
  EXPECT_EQ(scale_from_code(mx, 254, 1.0f).value, 0x1p127f);
  EXPECT_TRUE(scale_from_code(mx, 255, 1.0f).nan);
  EXPECT_TRUE(scale_from_code(mx, 256, 1.0f).nan);
}

// Four Over Six (docs/spec.md §6.10) on blocks worked by hand: 6 and 4.6 read back as 6 and
// 4 under the scale for 6 (error 0.36) and as 6 and 4.5 under the scale 1.5 for 4 (error
// 0.01); 6 and 1.1 as 6 and 1 (error 0.01) against 6 and 0.75 (error 0.1225); 6 and 3 are
// exact under both, and a tie keeps 6.
TEST(ScaledScale, FourOverSixKeepsTheNearerOfTwoScales) {
  const ScaledSpec s = parse_scaled("e2m1fn@1x16:ue4m3:nearest:4over6");
  const auto block = [](float second) {
    std::vector<float> x(16, 0.0f);
    x[0] = 6.0f;
    x[1] = second;
    return x;
  };
  struct Case {
    float second;
    std::uint32_t code;  // UE4M3: 56 is 1, 60 is 1.5
    float back;
  };
  for (const Case& c : {Case{4.6f, 60, 4.5f}, Case{1.1f, 56, 1.0f}, Case{3.0f, 56, 3.0f}, Case{-4.6f, 60, -4.5f}}) {
    const std::vector<float> x = block(c.second);
    std::vector<float> y(16);
    std::vector<std::uint8_t> codes(16);
    std::uint32_t scale = 0;
    ScaledCounts counts;
    scaled_quantize_reference(x.data(), 1, 16, s, {y.data(), codes.data(), &scale, nullptr}, {}, &counts);
    EXPECT_EQ(scale, c.code) << c.second;
    EXPECT_EQ(y[0], 6.0f) << c.second;
    EXPECT_EQ(y[1], c.back) << c.second;
    EXPECT_EQ(counts.groups, 1u);
    EXPECT_EQ(counts.elements.total, 16u);
  }
  // The tensor scale leaves room for 1.5 times the largest block scale: A / (6 * 256).
  const ScaledSpec nv = parse_scaled("nvfp4_4over6");
  EXPECT_EQ(tensor_scale_of(nv, 1536.0f), 1.0f);
  EXPECT_EQ(tensor_scale_of(parse_scaled("nvfp4"), 2688.0f), 1.0f);
  std::vector<float> x = block(4.6f);
  std::vector<float> y(16);
  std::uint32_t scale = 0;
  float ts = 0;
  scaled_quantize_reference(x.data(), 1, 16, nv, {y.data(), nullptr, &scale, &ts});
  EXPECT_EQ(ts, 0x1p-8f);  // 6 / 1536
  EXPECT_EQ(scale, 124u);  // 384 = 1.5 * 256, below UE4M3's 448
  EXPECT_EQ(y[1], 4.5f);
  // The option prints and parses back, and is part of the quantizer's name.
  ScaledSpec plain = nv;
  plain.four_over_six = false;
  EXPECT_EQ(to_string(nv), "e2m1fn@1x16:ue4m3:nearest:tensor-scale:4over6");
  EXPECT_EQ(parse_scaled(to_string(nv)), nv);
  EXPECT_NE(plain, nv);
}

// On random tensors, each block keeps the scale whose error is smaller: its error is never
// above that of the scale for 6, both scales are kept somewhere, and the whole tensor's
// squared error is below plain NVFP4's (the paper's claim, on these tensors).
TEST(ScaledScale, FourOverSixNeverAddsErrorToABlock) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  // (On 16x16 tiles of these tensors, 4 never wins: a tile of 256 values has too many between
  // two thirds of its largest and its largest.)
  for (const char* name : {"nvfp4_4over6", "e2m1fn@1x16:fp32:nearest:4over6", "e2m1fn@1x16:ue4m3:nearest:4over6",
                           "e2m1fn@1x32:ue4m3:ceil:tensor-scale:4over6"}) {
    const ScaledSpec s = parse_scaled(name);
    constexpr std::size_t rows = 64, cols = 128;
    std::vector<float> x(rows * cols);
    for (float& v : x) v = normal(rng) * (normal(rng) > 1.5f ? 8.0f : 1.0f);  // some outliers
    const Result got = run(s, x, rows, cols);
    ScaledSpec six = s;  // without 4over6: the scale for 6, and plain NVFP4's tensor scale
    six.four_over_six = false;
    const BlockLayout l = block_layout(s, rows, cols);
    std::size_t kept_four = 0;
    for (std::size_t g = 0; g < l.groups(); ++g) {
      const std::size_t r0 = g / l.grid_cols() * l.block_rows, c0 = g % l.grid_cols() * l.block_cols;
      const GroupValues v{x.data() + r0 * cols + c0, std::min(l.block_rows, rows - r0),
                          std::min(l.block_cols, cols - c0), cols, r0 * cols + c0, cols};
      float amax = 0;
      for (std::size_t r = 0; r < v.rows; ++r)
        for (std::size_t c = 0; c < v.cols; ++c) amax = std::max(amax, std::fabs(v.x[r * v.stride + c]));
      const GroupScale for_six = choose_scale(six, amax, got.ts);  // under 4over6's tensor scale
      const GroupScale kept = scale_from_code(s, got.scales[g], got.ts);
      ASSERT_LE(four_over_six_error(s, kept, v), four_over_six_error(s, for_six, v)) << name << " group " << g;
      kept_four += kept.code != for_six.code;
    }
    EXPECT_GT(kept_four, 0u) << name;
    EXPECT_LT(kept_four, l.groups()) << name;
    const Result plain = run(six, x, rows, cols);
    double e46 = 0, e6 = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      e46 += std::pow(static_cast<double>(got.y[i]) - x[i], 2);
      e6 += std::pow(static_cast<double>(plain.y[i]) - x[i], 2);
    }
    EXPECT_LT(e46, e6) << name;
  }
}

// Four Over Six's error of a one-value group is (y - x)^2 with y the codec's value: across
// float32 magnitudes up to past E2M1's range (every 1013th float, the E2M1 midpoints and their
// neighbours), both signs, under a scale of 1 and of 0.37 (where the error function takes its
// own E2M1 rounding for nearest-even, and the codec for stochastic rounding).
TEST(ScaledScale, FourOverSixErrorIsTheCodecsRounding) {
  std::vector<float> xs;
  for (std::uint32_t b = 0; b <= std::bit_cast<std::uint32_t>(9.0f); b += 1013) xs.push_back(std::bit_cast<float>(b));
  for (float m : {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 6.0f, 7.0f})
    for (float v : {m, std::nextafter(m, 0.0f), std::nextafter(m, 10.0f)}) xs.push_back(v);
  for (const Rounding rounding : {Rounding::nearest_even, Rounding::stochastic}) {
    ScaledSpec s = parse_scaled("e2m1fn@1x16:ue4m3:nearest:4over6");
    s.element.rounding = rounding;
    for (const float X : {1.0f, 0.37f}) {
      GroupScale g;
      g.value = X;
      std::uint64_t index = 0;
      for (float m : xs)
        for (const float x : {m * X, -m * X}) {
          const GroupValues v{&x, 1, 1, 1, index, 0};
          const float y = decode(encode(x / X, s.element, index), s.element.format) * X;
          const double d = static_cast<double>(y) - x;
          ASSERT_EQ(four_over_six_error(s, g, v), d * d) << "x " << x << " X " << X;
          ++index;
        }
    }
  }
}

}  // namespace
}  // namespace fp8lab
