#include <gtest/gtest.h>

#include "../common/testutil.hpp"
#include "fp8lab/nn/recipe.hpp"

using namespace fp8lab;
using namespace fp8lab::nn;

TEST(Recipe, ParsesOneLine) {
  const Recipe r = parse_recipe("a=1.4.3:10,w=1.4.3:14,gx=1.5.2:33/stochastic/nan,gw=1.5.2:31");
  ASSERT_TRUE(r.base[TensorKind::a]);
  EXPECT_EQ(r.base[TensorKind::a]->format, parse_format("1.4.3:10"));
  EXPECT_EQ(r.base[TensorKind::gx]->rounding, Rounding::stochastic);
  EXPECT_EQ(r.base[TensorKind::gx]->overflow, Overflow::nan);
  EXPECT_EQ(r.base[TensorKind::gw]->format, parse_format("1.5.2:31"));
  EXPECT_TRUE(r.exempt_first);
  EXPECT_EQ(parse_recipe(r.to_line()).base, r.base);
  const Recipe partial = parse_recipe("gx=e5m2, first=0");
  EXPECT_FALSE(partial.base[TensorKind::a]);
  EXPECT_TRUE(partial.base[TensorKind::gx]);
  EXPECT_FALSE(partial.exempt_first);
}

TEST(Recipe, PresetsFollowThePaper) {
  const Recipe r = parse_recipe("resnet32-mixed");
  EXPECT_EQ(r.base[TensorKind::a]->format, parse_format("1.4.3:10"));
  EXPECT_EQ(r.base[TensorKind::w]->format, parse_format("1.4.3:14"));
  EXPECT_EQ(r.base[TensorKind::gx]->format, parse_format("1.5.2:33"));
  EXPECT_EQ(r.base[TensorKind::gw]->format, parse_format("1.5.2:31"));
  const Recipe t = parse_recipe("transformer-152");
  EXPECT_EQ(t.base[TensorKind::gx]->format, parse_format("1.5.2:40"));
  const Recipe e = parse_recipe("efficientnet-mixed");
  EXPECT_EQ(e.base[TensorKind::gw]->format, parse_format("fp16"));
  for (const auto& p : recipe_presets()) EXPECT_NO_THROW(parse_recipe(p.name)) << p.name;
  const Recipe f = parse_recipe("fp32");
  for (TensorKind k : kAllKinds) EXPECT_FALSE(f.base[k]);
}

using fp8lab::test::error_of;

TEST(Recipe, BadLinesNameTheProblem) {
  EXPECT_NE(error_of([] { parse_recipe("a=1.4.3,q=1.5.2"); }).find("unknown key 'q'"), std::string::npos);
  EXPECT_NE(error_of([] { parse_recipe("a=1.4.9x"); }).find("format '1.4.9x'"), std::string::npos);
  EXPECT_NE(error_of([] { parse_recipe("a=1.4.3,a=1.5.2"); }).find("given twice"), std::string::npos);
  EXPECT_NE(error_of([] { parse_recipe("nonsense"); }).find("preset"), std::string::npos);
  EXPECT_NE(error_of([] { parse_recipe("gx=e4m3fn/inf"); }).find("overflow mode 'inf'"), std::string::npos);
  EXPECT_NE(error_of([] { parse_recipe("gx=e5m2/up"); }).find("'up'"), std::string::npos);
}

TEST(Recipe, TomlWithOverrides) {
  const std::string toml = R"(
name = "mixed with fp32 head"
a = "1.4.3:10"
w = "1.4.3:14"
gx = { format = "1.5.2:33", rounding = "stochastic", random_bits = 12 }
gw = "1.5.2:31"

[[override]]
match = "last"
a = "fp32"
w = "fp32"

[[override]]
match = "layer1.*"
gw = "e5m2/nan"
)";
  const Recipe r = parse_recipe_toml(toml, "t.toml");
  EXPECT_EQ(r.name, "mixed with fp32 head");
  EXPECT_EQ(r.base[TensorKind::gx]->random_bits, 12);
  ASSERT_EQ(r.overrides.size(), 2u);
  const LayerQuant first = r.resolve("conv1", 0, 5);
  EXPECT_FALSE(first[TensorKind::a]);   // exempt: first layer's input
  EXPECT_FALSE(first[TensorKind::gx]);  // and the gradient at its output
  EXPECT_TRUE(first[TensorKind::w]);
  const LayerQuant mid = r.resolve("layer1.0.conv2", 2, 5);
  EXPECT_EQ(mid[TensorKind::gw]->format, parse_format("e5m2"));
  EXPECT_EQ(mid[TensorKind::gw]->overflow, Overflow::nan);
  EXPECT_TRUE(mid[TensorKind::a]);
  const LayerQuant last = r.resolve("fc", 4, 5);
  EXPECT_FALSE(last[TensorKind::a]);
  EXPECT_FALSE(last[TensorKind::w]);
  EXPECT_TRUE(last[TensorKind::gx]);
  EXPECT_NO_THROW(check_overrides(r, {"conv1", "layer1.0.conv2", "fc"}));
  EXPECT_NE(error_of([&] { check_overrides(r, {"conv1", "fc"}); }).find("'layer1.*' matches no"),
            std::string::npos);
}

TEST(Recipe, TomlErrorsNameLineAndKey) {
  EXPECT_NE(error_of([] { parse_recipe_toml("a = \"1.4.3\"\nbogus = 1\n", "r.toml"); }).find("r.toml:2: unknown key 'bogus'"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_recipe_toml("\n\nw = \"1.4.x\"\n", "r.toml"); }).find("r.toml:3: 'w'"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_recipe_toml("a = [\n", "r.toml"); }).find("r.toml:"), std::string::npos);
  EXPECT_NE(error_of([] { parse_recipe_toml("[[override]]\na = \"fp32\"\n", "r.toml"); }).find("needs a 'match'"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_recipe_toml("gx = { format = \"e5m2\", mode = 1 }\n", "r.toml"); }).find("unknown key 'mode'"),
            std::string::npos);
}

TEST(Recipe, Glob) {
  EXPECT_TRUE(glob_match("layer1.*", "layer1.0.conv1"));
  EXPECT_TRUE(glob_match("*.conv?", "layer1.0.conv1"));
  EXPECT_TRUE(glob_match("*", ""));
  EXPECT_FALSE(glob_match("layer1.*", "layer10"));
  EXPECT_FALSE(glob_match("fc", "fc2"));
  EXPECT_TRUE(glob_match("a*b*c", "axxbyyc"));
  EXPECT_FALSE(glob_match("a*b*c", "axxbyy"));
}
