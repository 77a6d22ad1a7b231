#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "../common/testutil.hpp"
#include "fp8lab/core/format.hpp"

using namespace fp8lab;

TEST(Format, IsTriviallyCopyableAndSmall) {
  static_assert(std::is_trivially_copyable_v<Format>);
  static_assert(std::is_trivially_copyable_v<QuantSpec>);
  EXPECT_LE(sizeof(Format), 8u);
}

TEST(Format, NaturalBias) {
  EXPECT_EQ(natural_bias(4), 7);
  EXPECT_EQ(natural_bias(5), 15);
  EXPECT_EQ(natural_bias(0), 0);
  EXPECT_EQ(parse_format("1.4.3").bias, 7);
  EXPECT_EQ(parse_format("1.5.2").bias, 15);
  EXPECT_EQ(parse_format("1.0.7").bias, 0);
}

TEST(Format, ParsesTheForms) {
  EXPECT_EQ(parse_format("1.4.3:10"), make_format(4, 3, 10));
  EXPECT_EQ(parse_format("1.0.7:-2"), make_format(0, 7, -2));
  EXPECT_EQ(parse_format("1.4.3:7:fn"), make_format(4, 3, 7, Policy::fn));
  EXPECT_EQ(parse_format("1.4.3:fn"), make_format(4, 3, 7, Policy::fn));
  EXPECT_EQ(parse_format(" 1.6.9:31:fn:nosub "), make_format(6, 9, 31, Policy::fn, false));
  EXPECT_EQ(parse_format("E4M3FN"), make_format(4, 3, 7, Policy::fn));
}

TEST(Format, PresetsHaveTheirPublishedRanges) {
  struct Row {
    const char* name;
    double max, min_pos;
  } rows[] = {
      {"e4m3fnuz", 240, 0x1p-10},     {"e4m3b11fnuz", 30, 0x1p-13},  {"e5m2fnuz", 57344, 0x1p-17},
      {"e4m3fn", 448, 0x1p-9},        {"e5m2", 57344, 0x1p-16},      {"e3m4", 15.5, 0x1p-6},
      {"e2m3fn", 7.5, 0.125},         {"e3m2fn", 28, 0.0625},        {"e2m1fn", 6, 0.5},
      {"fp16", 65504, 0x1p-24},       {"bf16", 0x1.fep127, 0x1p-133}, {"fp32", 0x1.fffffep127, 0x1p-149},
      {"dlfloat16", 0x1.ffp32, 0x1.008p-31},
  };
  for (const auto& r : rows) {
    SCOPED_TRACE(r.name);
    const Format f = parse_format(r.name);
    EXPECT_EQ(f.max_finite(), r.max);
    EXPECT_EQ(f.min_positive(), r.min_pos);
    EXPECT_EQ(preset_name(f), r.name);
  }
}

TEST(Format, DerivedCodes) {
  const Format fnuz = parse_format("e4m3fnuz");
  EXPECT_EQ(fnuz.nan_code(false), 0x80u);
  EXPECT_EQ(fnuz.nan_code(true), 0x80u);
  EXPECT_EQ(fnuz.max_code(), 0x7fu);
  EXPECT_EQ(fnuz.finite_count(), 255u);
  const Format fn = parse_format("e4m3fn");
  EXPECT_EQ(fn.nan_code(false), 0x7fu);
  EXPECT_EQ(fn.nan_code(true), 0xffu);
  EXPECT_EQ(fn.max_code(), 0x7eu);
  EXPECT_EQ(fn.finite_count(), 254u);
  const Format e5m2 = parse_format("e5m2");
  EXPECT_EQ(e5m2.nan_code(false), 0x7eu);
  EXPECT_EQ(e5m2.nan_code(true), 0xfeu);
  EXPECT_EQ(e5m2.inf_code(false), 0x7cu);
  EXPECT_EQ(e5m2.max_code(), 0x7bu);
  EXPECT_EQ(parse_format("e2m1fn").finite_count(), 16u);
  EXPECT_EQ(parse_format("e4m3fnuz").classify(0x80), Format::Class::nan);
  EXPECT_EQ(parse_format("e4m3fnuz").classify(0x01), Format::Class::subnormal);
  EXPECT_EQ(parse_format("e4m3fnuz").classify(0x08), Format::Class::normal);
  EXPECT_EQ(e5m2.classify(0xfc), Format::Class::inf);
  EXPECT_EQ(e5m2.classify(0x7d), Format::Class::nan);
  EXPECT_EQ(parse_format("dlfloat16").classify(0x0001), Format::Class::normal);
}

// parse(to_string(f)) == f for every valid format in the whole space.
TEST(Format, PrintParseRoundTripsEverywhere) {
  int checked = 0;
  for (int E = 0; E <= 8; ++E)
    for (int M = 0; M <= 23; ++M)
      for (int b : {-512, -100, -8, -1, 0, 1, 3, 7, 10, 15, 16, 31, 48, 127, 200, 512})
        for (Policy p : {Policy::fnuz, Policy::fn, Policy::ieee, Policy::finite})
          for (int flags = 0; flags < 8; ++flags) {
            Format f;
            f.exp_bits = static_cast<std::int8_t>(E);
            f.man_bits = static_cast<std::int8_t>(M);
            f.bias = static_cast<std::int16_t>(b);
            f.policy = p;
            f.subnormals = flags & 1;
            f.sign = !(flags & 2);
            f.zero = !(flags & 4);
            bool valid = true;
            try {
              validate(f);
            } catch (const Error&) {
              valid = false;
            }
            if (!valid) continue;
            ASSERT_EQ(parse_format(to_string(f)), f) << to_string(f);
            ++checked;
          }
  EXPECT_GT(checked, 20000);
}


void expect_error(const std::string& text, const std::string& needle) {
  try {
    parse_format(text);
    ADD_FAILURE() << "'" << text << "' parsed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "'" << text << "' gave: " << e.what();
    EXPECT_NE(std::string(e.what()).find("'" + text + "'"), std::string::npos) << e.what();
  }
}

TEST(Format, BadTextGivesActionableErrors) {
  expect_error("1.4", "expected S.E.M");
  expect_error("2.4.3", "sign field");
  expect_error("1.9.3", "E must be in 0..8");
  expect_error("1.4.30", "M must be in 0..23");
  expect_error("1.4.3:600", "bias must be in");
  expect_error("1.0.7:7:ieee", "needs at least one exponent bit");
  expect_error("1.5.0:ieee", "non-zero mantissa");
  expect_error("1.0.7:nosub", "subnormals off needs E >= 1");
  expect_error("1.4.3:7:7", "bias given twice");
  expect_error("1.4.3:x7", "unknown field 'x7'");
  expect_error("1.4.3:10:fn:bogus", "unknown field 'bogus'");  // not "policy given twice"
  expect_error("1.4.3:fn:fnuz", "policy given twice");
  expect_error("1.4.3:1x", "not an integer");
  expect_error("e9m9", "unknown preset");
  expect_error("1.0.0", "no positive finite value");
  expect_error("1.4.x", "expected S.E.M");
}

TEST(QuantSpec, InfOverflowNeedsIeee) {
  QuantSpec q;
  q.format = parse_format("e4m3fn");
  q.overflow = Overflow::inf;
  EXPECT_THROW(validate(q), Error);
  q.format = parse_format("e5m2");
  EXPECT_NO_THROW(validate(q));
  q.random_bits = 0;
  EXPECT_THROW(validate(q), Error);
}

TEST(Format, ModeNamesParse) {
  // Every value's printed name parses back to it.
  for (Policy p : {Policy::fnuz, Policy::fn, Policy::ieee, Policy::finite}) EXPECT_EQ(parse_policy(to_string(p)), p);
  for (Rounding r : {Rounding::nearest_even, Rounding::toward_zero, Rounding::stochastic, Rounding::nearest_away})
    EXPECT_EQ(parse_rounding(to_string(r)), r);
  for (Overflow o : {Overflow::saturate, Overflow::nan, Overflow::inf}) EXPECT_EQ(parse_overflow(to_string(o)), o);
  EXPECT_EQ(to_string(Rounding::nearest_even), "nearest-even");
  EXPECT_EQ(to_string(Policy::fnuz), "fnuz");
  // The other spellings, in any case, with space around.
  for (const char* s : {"nearest_even", "NE", "rne", " Nearest "}) EXPECT_EQ(parse_rounding(s), Rounding::nearest_even) << s;
  for (const char* s : {"toward_zero", "tz", "RTZ", "truncate"}) EXPECT_EQ(parse_rounding(s), Rounding::toward_zero) << s;
  EXPECT_EQ(parse_rounding("SR"), Rounding::stochastic);
  for (const char* s : {"nearest_away", "RNA", "away"}) EXPECT_EQ(parse_rounding(s), Rounding::nearest_away) << s;
  for (const char* s : {"clip", "sat", "Saturate"}) EXPECT_EQ(parse_overflow(s), Overflow::saturate) << s;
  EXPECT_EQ(parse_policy(" IEEE "), Policy::ieee);
  // Unknown names: the error quotes what was given and lists the names.
  EXPECT_EQ(test::error_of([] { (void)parse_rounding("up"); }),
            "unknown rounding 'up' (known: nearest-even, toward-zero, stochastic, nearest-away)");
  EXPECT_EQ(test::error_of([] { (void)parse_overflow("Wrap"); }), "unknown overflow mode 'Wrap' (known: saturate, nan, inf)");
  EXPECT_EQ(test::error_of([] { (void)parse_policy("ocp"); }),
            "unknown special-value policy 'ocp' (known: fnuz, fn, ieee, finite)");
}

TEST(Format, UnsignedAndZerolessNeedTheirConditions) {
  expect_error("0.4.3", "fnuz");
  expect_error("0.4.3:fn:nozero", "needs subnormals off");
  expect_error("1.4.3:fn:nosub:nozero", "unsigned");
  expect_error("0.0.0:fn", "E >= 1");
  expect_error("0.8.0:fn:nosub:nozero:zero", "zero flag given twice");
  EXPECT_EQ(parse_format("0.4.3:fn").width(), 7);
  EXPECT_FALSE(parse_format("0.4.3:ieee").signed_zero());
}
