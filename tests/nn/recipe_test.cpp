#include <gtest/gtest.h>

#include "../common/testutil.hpp"
#include "fp8lab/settings/recipe.hpp"

#include <random>

using namespace fp8lab;
using namespace fp8lab::nn;

TEST(Recipe, ParsesOneLine) {
  const Recipe r = parse_recipe("a=1.4.3:10,w=1.4.3:14,gx=1.5.2:33/stochastic/nan,gw=1.5.2:31");
  ASSERT_TRUE(r.base[TensorKind::a]);
  EXPECT_EQ(r.base[TensorKind::a]->element.format, parse_format("1.4.3:10"));
  EXPECT_EQ(r.base[TensorKind::gx]->element.rounding, Rounding::stochastic);
  EXPECT_EQ(r.base[TensorKind::gx]->element.overflow, Overflow::nan);
  EXPECT_EQ(r.base[TensorKind::gw]->element.format, parse_format("1.5.2:31"));
  EXPECT_TRUE(r.exempt_first);
  EXPECT_EQ(parse_recipe(r.to_line()).base, r.base);
  const Recipe partial = parse_recipe("gx=e5m2, first=0");
  EXPECT_FALSE(partial.base[TensorKind::a]);
  EXPECT_TRUE(partial.base[TensorKind::gx]);
  EXPECT_FALSE(partial.exempt_first);
}

TEST(Recipe, PresetsFollowThePaper) {
  const Recipe r = parse_recipe("resnet32-mixed");
  EXPECT_EQ(r.base[TensorKind::a]->element.format, parse_format("1.4.3:10"));
  EXPECT_EQ(r.base[TensorKind::w]->element.format, parse_format("1.4.3:14"));
  EXPECT_EQ(r.base[TensorKind::gx]->element.format, parse_format("1.5.2:33"));
  EXPECT_EQ(r.base[TensorKind::gw]->element.format, parse_format("1.5.2:31"));
  const Recipe t = parse_recipe("transformer-152");
  EXPECT_EQ(t.base[TensorKind::gx]->element.format, parse_format("1.5.2:40"));
  const Recipe e = parse_recipe("efficientnet-mixed");
  EXPECT_EQ(e.base[TensorKind::gw]->element.format, parse_format("fp16"));
  for (const auto& p : recipe_presets()) EXPECT_NO_THROW(parse_recipe(p.name)) << p.name;
  const Recipe f = parse_recipe("fp32");
  for (TensorKind k : kAllKinds) EXPECT_FALSE(f.base[k]);
}

using fp8lab::test::error_of;

TEST(Recipe, FirstLayerExemptionTakesAQuantizer) {
  const KindQuant fp16 = parse_kind_quant("fp16"), a7 = parse_kind_quant("1.4.3:7");
  const KindQuant w12 = parse_kind_quant("1.4.3:12"), gx16 = parse_kind_quant("1.5.2:16");
  // The paper's EfficientNet recipe: the first layer's input and output gradient in float16.
  for (const Recipe& r : {parse_recipe("efficientnet-mixed"),
                          parse_recipe("a=1.4.3:7,w=1.4.3:12,gx=1.5.2:16,gw=fp16,first=fp16"),
                          parse_recipe_toml("a = \"1.4.3:7\"\nw = \"1.4.3:12\"\ngx = \"1.5.2:16\"\n"
                                            "gw = \"fp16\"\nexempt_first = \"fp16\"\n")}) {
    const LayerQuant first = r.resolve("stem.conv", 0, 5), second = r.resolve("blocks.0", 1, 5);
    EXPECT_EQ(first[TensorKind::a], fp16);
    EXPECT_EQ(first[TensorKind::gx], fp16);
    EXPECT_EQ(first[TensorKind::w], w12);
    EXPECT_EQ(first[TensorKind::gw], fp16);
    EXPECT_EQ(second[TensorKind::a], a7);
    EXPECT_EQ(second[TensorKind::gx], gx16);
    const Recipe again = parse_recipe(r.to_line());
    EXPECT_EQ(again.resolve("stem.conv", 0, 5), first) << r.to_line();
    EXPECT_NE(r.to_line().find(",first=" + to_string(fp16)), std::string::npos) << r.to_line();
  }
  // 1, true and fp32: float32 (the default); 0: quantized like the rest.
  for (const char* v : {"1", "true", "fp32", "float32"}) {
    const Recipe r = parse_recipe(std::string("a=1.4.3:7,gx=1.5.2:16,first=") + v);
    EXPECT_TRUE(r.exempt_first) << v;
    EXPECT_FALSE(r.resolve("x", 0, 2)[TensorKind::a]) << v;
    EXPECT_FALSE(r.resolve("x", 0, 2)[TensorKind::gx]) << v;
    EXPECT_EQ(r.to_line().find("first"), std::string::npos) << v;
  }
  const Recipe off = parse_recipe("a=1.4.3:7,gx=1.5.2:16,first=0");
  EXPECT_EQ(off.resolve("x", 0, 2)[TensorKind::a], a7);
  EXPECT_EQ(off.resolve("x", 0, 2)[TensorKind::gx], gx16);
  // An override naming the first layer still wins over the exemption.
  const Recipe o = parse_recipe_toml("a = \"1.4.3:7\"\nexempt_first = \"fp16\"\n[[override]]\nmatch = \"first\"\na = \"1.5.2:20\"\n");
  EXPECT_EQ(o.resolve("x", 0, 2)[TensorKind::a], parse_kind_quant("1.5.2:20"));
  // Anything else is an error naming the key.
  EXPECT_NE(error_of([] { parse_recipe("a=1.4.3,first=yes"); }).find("first"), std::string::npos);
  EXPECT_NE(error_of([] { parse_recipe("a=1.4.3,first=1.9.9"); }).find("first"), std::string::npos);
  const std::string toml_err = error_of([] { parse_recipe_toml("a = \"1.4.3\"\nexempt_first = 3\n", "r.toml"); });
  EXPECT_NE(toml_err.find("r.toml:2"), std::string::npos) << toml_err;
  EXPECT_NE(toml_err.find("exempt_first"), std::string::npos) << toml_err;
  EXPECT_NE(error_of([] { parse_recipe_toml("exempt_first = \"fp99\"\n", "r.toml"); }).find("r.toml:1"),
            std::string::npos);
}

TEST(Recipe, TakesScaledFormatsPerKind) {
  const Recipe r = parse_recipe("a=mxfp8_e4m3,w=e4m3fn@128x128:fp32:nearest,gx=mxfp8_e5m2/stochastic,gw=1.5.2:31");
  ASSERT_TRUE(r.base[TensorKind::a]->scaled());
  EXPECT_EQ(*r.base[TensorKind::a], parse_scaled("mxfp8_e4m3"));
  EXPECT_EQ(r.base[TensorKind::w]->granularity, Granularity::tile);
  EXPECT_EQ(r.base[TensorKind::gx]->element.rounding, Rounding::stochastic);
  EXPECT_FALSE(r.base[TensorKind::gw]->scaled());
  EXPECT_EQ(parse_recipe(r.to_line()).base, r.base);
  EXPECT_EQ(to_string(r.base[TensorKind::gx]), "e5m2@1x32:e8m0:floor/stochastic");
  EXPECT_NE(error_of([] { parse_recipe("a=mxfp4/nan"); }).find("saturate"), std::string::npos);
  EXPECT_NE(error_of([] { parse_recipe("a=mxfp4:sideways"); }).find("sideways"), std::string::npos);
  const Recipe t = parse_recipe_toml(R"(
a = "nvfp4"
[gx]
format = "e5m2@1x32:e8m0:ceil"
rounding = "stochastic"
[[override]]
match = "fc"
a = "fp32"
)");
  EXPECT_EQ(*t.base[TensorKind::a], parse_scaled("nvfp4"));
  EXPECT_EQ(t.base[TensorKind::gx]->rule, ScaleRule::ceil);
  EXPECT_EQ(t.base[TensorKind::gx]->element.rounding, Rounding::stochastic);
  EXPECT_FALSE(t.resolve("fc", 1, 2)[TensorKind::a]);
  const Recipe h = parse_recipe("nvfp4-rht");
  EXPECT_EQ(h.hadamard, 16);
  EXPECT_EQ(h.resolve("fc", 1, 2).hadamard, 16);
  EXPECT_EQ(parse_recipe(h.to_line()).hadamard, 16);
  EXPECT_EQ(parse_recipe_toml("a = \"nvfp4\"\nhadamard = 16\n").hadamard, 16);
  EXPECT_NE(error_of([] { parse_recipe("a=nvfp4,hadamard=8"); }).find("0, 16, 32, 64 or 128"), std::string::npos);
  EXPECT_NE(error_of([] { parse_recipe("a=nvfp4,hadamard=64x"); }).find("not '64x'"), std::string::npos);
  // Every size, and both products (docs/spec.md §6.6): kept by resolve and both printers.
  const Recipe both = parse_recipe("a=nvfp4,gx=nvfp4,hadamard=128,hadamard_on=backward");
  EXPECT_EQ(both.hadamard, 128);
  EXPECT_EQ(both.hadamard_on, HadamardProducts::backward);
  EXPECT_EQ(both.resolve("fc", 0, 2).hadamard_on, HadamardProducts::backward);
  EXPECT_EQ(parse_recipe(both.to_line()).hadamard_on, HadamardProducts::backward);
  EXPECT_EQ(parse_recipe(both.to_line()).hadamard, 128);
  const Recipe from_toml = parse_recipe_toml(both.to_toml(), "b.toml");
  EXPECT_EQ(from_toml.hadamard, 128);
  EXPECT_EQ(from_toml.hadamard_on, HadamardProducts::backward);
  EXPECT_EQ(parse_recipe("a=nvfp4,hadamard=32").hadamard_on, HadamardProducts::grad_w);
  EXPECT_NE(error_of([] { parse_recipe("a=nvfp4,hadamard_on=forward"); }).find("(known: grad_w, backward)"),
            std::string::npos);
  // TransformerEngine's 16 fixed signs make no larger transform, whichever key comes first.
  for (const char* bad : {"a=nvfp4,hadamard=64,hadamard_signs=te", "a=nvfp4,hadamard_signs=te,hadamard=64"})
    EXPECT_NE(error_of([&] { parse_recipe(bad); }).find("te is TransformerEngine's 16 fixed signs"), std::string::npos)
        << bad;
  EXPECT_NE(error_of([] { parse_recipe_toml("a = \"nvfp4\"\nhadamard = 32\nhadamard_signs = \"te\"\n", "t.toml"); })
                .find("t.toml: hadamard_signs = te"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_recipe_toml("hadamard = 8\n", "r.toml"); }).find("r.toml:1"), std::string::npos);
  const Recipe k = parse_recipe("nvfp4-last-fp32");
  EXPECT_TRUE(k.keep_last);
  EXPECT_TRUE(k.resolve("fc", 4, 5)[TensorKind::w] == std::nullopt);
  EXPECT_TRUE(k.resolve("fc", 4, 5)[TensorKind::gx] == std::nullopt);
  EXPECT_TRUE(k.resolve("conv", 3, 5)[TensorKind::w]->scaled());
  EXPECT_TRUE(parse_recipe(k.to_line()).keep_last);
  EXPECT_TRUE(parse_recipe_toml("a = \"nvfp4\"\nkeep_last = true\n").keep_last);
  EXPECT_NE(error_of([] { parse_recipe("a=nvfp4,last=maybe"); }).find("keep_last takes true, false, fp32 or the quantizer"), std::string::npos);
  for (const char* preset : {"mxfp8", "mxfp6", "mxfp4", "nvfp4", "deepseek", "tensor-current", "tensor-delayed"})
    EXPECT_TRUE(parse_recipe(preset).base[TensorKind::a]->scaled()) << preset;
}

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
  EXPECT_EQ(r.base[TensorKind::gx]->element.random_bits, 12);
  ASSERT_EQ(r.overrides.size(), 2u);
  const LayerQuant first = r.resolve("conv1", 0, 5);
  EXPECT_FALSE(first[TensorKind::a]);   // exempt: first layer's input
  EXPECT_FALSE(first[TensorKind::gx]);  // and the gradient at its output
  EXPECT_TRUE(first[TensorKind::w]);
  const LayerQuant mid = r.resolve("layer1.0.conv2", 2, 5);
  EXPECT_EQ(mid[TensorKind::gw]->element.format, parse_format("e5m2"));
  EXPECT_EQ(mid[TensorKind::gw]->element.overflow, Overflow::nan);
  EXPECT_TRUE(mid[TensorKind::a]);
  const LayerQuant last = r.resolve("fc", 4, 5);
  EXPECT_FALSE(last[TensorKind::a]);
  EXPECT_FALSE(last[TensorKind::w]);
  EXPECT_TRUE(last[TensorKind::gx]);
  EXPECT_NO_THROW(check_overrides(r, {"conv1", "layer1.0.conv2", "fc"}));
  EXPECT_NE(error_of([&] { check_overrides(r, {"conv1", "fc"}); }).find("'layer1.*' matches no"),
            std::string::npos);
}

TEST(Recipe, TomlRecipeTableHoldsTheWholeRecipe) {
  // A [recipe] table is the recipe: read as the top level would be.
  const Recipe r = parse_recipe_toml("[recipe]\na = \"1.4.3:10\"\nkeep_last = true\n", "r.toml");
  EXPECT_EQ(r.base[TensorKind::a]->element.format, parse_format("1.4.3:10"));
  EXPECT_TRUE(r.keep_last);
  // A key beside the table would be ignored: refused, with its line.
  const std::string beside = error_of([] { parse_recipe_toml("w = \"e4m3\"\n[recipe]\na = \"e4m3\"\n", "r.toml"); });
  EXPECT_NE(beside.find("r.toml:1: 'w' stands outside the [recipe] table"), std::string::npos) << beside;
  // 'recipe' as a string (naming another file) would set nothing: refused.
  const std::string named = error_of([] { parse_recipe_toml("recipe = \"other.toml\"\n", "r.toml"); });
  EXPECT_NE(named.find("r.toml:1: 'recipe' must be the [recipe] table"), std::string::npos) << named;
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

// A recipe file may say how its products run and accumulate (docs/spec.md §4.2, §7): parsed,
// nullopt where the file leaves them to the config.
TEST(Recipe, TomlComputeAndAccumulate) {
  const Recipe r = parse_recipe_toml("a = \"e4m3fn\"\ncompute = \"auto\"\naccumulate = \"e5m2@32\"\n", "r.toml");
  EXPECT_EQ(r.compute, Compute::auto_);
  EXPECT_EQ(r.accumulate, parse_accumulation("1.5.2:ieee@32"));
  const Recipe none = parse_recipe_toml("a = \"e4m3fn\"\n", "r.toml");
  EXPECT_FALSE(none.compute || none.accumulate);
  const std::string e = error_of([] { parse_recipe_toml("a = \"e4m3fn\"\ncompute = \"tf32\"\n", "r.toml"); });
  EXPECT_NE(e.find("r.toml:2: 'compute'"), std::string::npos) << e;
  EXPECT_NE(e.find("'tf32'"), std::string::npos) << e;
  EXPECT_NE(error_of([] { parse_recipe_toml("accumulate = 128\n", "r.toml"); }).find("r.toml:1: 'accumulate' must be a string (fp32, FORMAT@CHUNK or a dot model)"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_recipe_toml("accumulate = \"e5m2@0\"\n", "r.toml"); }).find("positive integer"),
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

// ---- one grammar, two forms (docs/spec.md §4.2) ---------------------------------------

namespace {
Recipe without_name(Recipe r) {
  r.name.clear();
  return r;
}
}  // namespace

TEST(RecipeGrammar, EveryPresetRoundTripsThroughTheLineAndTheToml) {
  for (const auto& p : recipe_presets()) {
    const Recipe r = parse_recipe(p.name);
    EXPECT_EQ(without_name(parse_recipe(r.to_line())), without_name(r)) << p.name << ": " << r.to_line();
    EXPECT_EQ(parse_recipe_toml(r.to_toml(), "t.toml"), r) << p.name << ":\n" << r.to_toml();
  }
}

// What a TOML recipe can say, a line says with the same keys (first and last are other
// names of exempt_first and keep_last there).
TEST(RecipeGrammar, TheLineTakesEveryKeyOfTheToml) {
  const Recipe line = parse_recipe(
      "name=mine,a=1.4.3:10,w=e4m3fn,gx=1.5.2:33/stochastic:12/nan,gw=fp32,exempt_first=fp16,keep_last=true,"
      "hadamard=16,compute=auto,accumulate=e5m2@32");
  const Recipe toml = parse_recipe_toml(R"(name = "mine"
a = "1.4.3:10"
w = "e4m3fn"
gx = { format = "1.5.2:33", rounding = "stochastic", random_bits = 12, overflow = "nan" }
gw = "fp32"
exempt_first = "fp16"
keep_last = true
hadamard = 16
compute = "auto"
accumulate = "e5m2@32"
)");
  EXPECT_EQ(line, toml);
  EXPECT_EQ(line.base[TensorKind::gx]->element.random_bits, 12);
  EXPECT_EQ(line.compute, Compute::auto_);
  EXPECT_EQ(without_name(parse_recipe("a=1.4.3,first=0,last=fp32")),
            without_name(parse_recipe("a=1.4.3,exempt_first=false,keep_last=true")));
  // keep_last can be switched off again, as in TOML.
  EXPECT_FALSE(parse_recipe("a=nvfp4,keep_last=false").keep_last);
  // A key given under both its names is given twice.
  EXPECT_NE(error_of([] { parse_recipe("a=1.4.3,first=0,exempt_first=1"); }).find("given twice"), std::string::npos);
  // Overrides are TOML's alone: the line points there, and so does the printer.
  const std::string e = error_of([] { parse_recipe("a=1.4.3,override=fc"); });
  EXPECT_NE(e.find("need a recipe file in TOML"), std::string::npos) << e;
  const Recipe o = parse_recipe_toml("a = \"1.4.3\"\n[[override]]\nmatch = \"fc\"\na = \"fp32\"\n", "o.toml");
  EXPECT_NE(error_of([&] { (void)o.to_line(); }).find("only its TOML form"), std::string::npos);
  // The unknown-key message lists the keys from the one table.
  const std::string u = error_of([] { parse_recipe("a=1.4.3,bogus=1"); });
  EXPECT_NE(u.find("exempt_first (or first), keep_first, keep_last (or last), hadamard, hadamard_signs, hadamard_on, "
                   "a_bwd, w_bwd, bwd_from, compute, accumulate"),
            std::string::npos)
      << u;
}

// keep_first and keep_last: a whole layer in float32 or in the quantizer given, in both forms.
TEST(RecipeGrammar, KeepFirstAndLastTakeAQuantizer) {
  const Recipe r = parse_recipe("a=1.4.3:10,w=1.4.3:14,gx=1.5.2:33,keep_first=bf16,last=bf16");
  const KindQuant bf16 = parse_kind_quant("bf16");
  for (int index : {0, 2})
    for (TensorKind k : kAllKinds) EXPECT_EQ(r.resolve("x", index, 3)[k], bf16) << index;
  EXPECT_EQ(r.resolve("x", 1, 3)[TensorKind::a], parse_kind_quant("1.4.3:10"));
  EXPECT_EQ(r.resolve("x", 1, 3)[TensorKind::gw], KindQuant{});
  EXPECT_EQ(r.to_line(), "a=1.4.3:10,w=1.4.3:14,gx=1.5.2:33,gw=fp32,keep_first=1.8.7:ieee,last=1.8.7:ieee");
  EXPECT_NE(r.to_toml().find("keep_last = '1.8.7:ieee'"), std::string::npos) << r.to_toml();
  EXPECT_EQ(without_name(parse_recipe_toml(r.to_toml(), "r.toml")), without_name(r));
  // true and fp32: float32 (printed as before: last=fp32 in a line, true in TOML).
  const Recipe f = parse_recipe("a=1.4.3:10,keep_first=true,last=fp32");
  EXPECT_TRUE(f.keep_first && f.keep_last && !f.keep_first_quant && !f.keep_last_quant);
  for (TensorKind k : kAllKinds) EXPECT_EQ(f.resolve("x", 0, 2)[k], KindQuant{});
  EXPECT_EQ(f.to_line(), "a=1.4.3:10,w=fp32,gx=fp32,gw=fp32,keep_first=fp32,last=fp32");
  EXPECT_NE(f.to_toml().find("keep_last = true"), std::string::npos) << f.to_toml();
  EXPECT_NE(error_of([] { parse_recipe("a=nvfp4,keep_first=bf16,keep_first=false"); }).find("given twice"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_recipe("a=nvfp4,keep_first=1.9.9"); }).find("keep_first takes"), std::string::npos);
  EXPECT_EQ(parse_recipe_toml("a = \"nvfp4\"\nkeep_first = \"bf16\"\n").keep_first_quant, bf16);
  EXPECT_FALSE(parse_recipe_toml("a = \"nvfp4\"\nkeep_first = false\n").keep_first);
}

// A preset followed by keys: the preset, with each key given after it replaced.
TEST(RecipeGrammar, APresetThenKeysChangesThePreset) {
  const Recipe full = parse_recipe("nvfp4-training");
  EXPECT_EQ(full.base[TensorKind::w], parse_kind_quant("e2m1fn@16x16:ue4m3:nearest:tensor-scale"));
  EXPECT_EQ(full.base[TensorKind::gx]->element.rounding, Rounding::stochastic);
  EXPECT_EQ(full.hadamard, 16);
  EXPECT_EQ(full.hadamard_signs, HadamardSigns::random);
  EXPECT_EQ(full.keep_first_quant, parse_kind_quant("bf16"));
  EXPECT_EQ(full.keep_last_quant, parse_kind_quant("bf16"));
  // TransformerEngine's switches, each a key: no Hadamard transform, the plain one, 1x16
  // weight blocks, round-to-nearest gradients.
  Recipe want = full;
  want.hadamard = 0;
  EXPECT_EQ(without_name(parse_recipe("nvfp4-training,hadamard=0")), without_name(want));
  want = full;
  want.hadamard_signs = HadamardSigns::none;
  const Recipe plain = parse_recipe("nvfp4-training, hadamard_signs=none");
  EXPECT_EQ(without_name(plain), without_name(want));
  EXPECT_EQ(plain.name, "nvfp4-training, hadamard_signs=none");
  EXPECT_EQ(plain.resolve("x", 1, 3).hadamard_signs, HadamardSigns::none);
  EXPECT_EQ(parse_recipe("nvfp4-training,hadamard_signs=te").hadamard_signs, HadamardSigns::te);
  EXPECT_EQ(without_name(parse_recipe(plain.to_line())), without_name(plain));
  want = full;
  want.base[TensorKind::w] = parse_kind_quant("nvfp4");
  want.base[TensorKind::gx] = parse_kind_quant("nvfp4");
  EXPECT_EQ(without_name(parse_recipe("nvfp4-training,w=nvfp4,gx=nvfp4")), without_name(want));
  EXPECT_NE(error_of([] { parse_recipe("nvfp4-training,hadamard=0,hadamard=16"); }).find("given twice"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_recipe("nvfp4-training,hadamard_signs=sometimes"); }).find("unknown Hadamard signs 'sometimes' (known: random, none, te)"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_recipe("nvfp4-trainin,hadamard=0"); }).find("has no '='"), std::string::npos);
}

// a_bwd and w_bwd (docs/spec.md §6.12): scaled quantizers with current scaling, in both
// forms; a layer whose a or w is not the base's (exempted, kept, overridden) has none.
TEST(RecipeGrammar, BackwardFormsBelongToTheBasesQuantizers) {
  const Recipe r = parse_recipe("mxfp4-tseng");
  const KindQuant mx = parse_kind_quant("mxfp4:dither-scale/stochastic");
  EXPECT_EQ(r.base[TensorKind::a], parse_kind_quant("bf16"));
  EXPECT_EQ(r.base[TensorKind::w], parse_kind_quant("bf16"));
  EXPECT_EQ(r.base.a_bwd, mx);
  EXPECT_EQ(r.base.w_bwd, mx);
  EXPECT_EQ(r.base[TensorKind::gx], mx);
  EXPECT_EQ(r.hadamard, 64);
  EXPECT_EQ(r.hadamard_on, HadamardProducts::backward);
  const LayerQuant middle = r.resolve("h.1", 1, 3);
  EXPECT_EQ(middle.a_bwd, mx);
  EXPECT_EQ(middle.w_bwd, mx);
  EXPECT_EQ(middle.backward_form(TensorKind::gx), KindQuant{});
  // The first layer's input is exempt (float32), so it has no backward form of a; its
  // weight keeps w's.
  const LayerQuant first = r.resolve("h.0", 0, 3);
  EXPECT_EQ(first.a_bwd, KindQuant{});
  EXPECT_EQ(first.w_bwd, mx);
  // keep_first / keep_last with the base's own quantizer (bf16) still drop the backward forms.
  const Recipe kept = parse_recipe("mxfp4-tseng,keep_first=bf16,last=bf16");
  for (int index : {0, 2}) {
    EXPECT_EQ(kept.resolve("h", index, 3).a_bwd, KindQuant{}) << index;
    EXPECT_EQ(kept.resolve("h", index, 3).w_bwd, KindQuant{}) << index;
  }
  EXPECT_EQ(kept.resolve("h", 1, 3).w_bwd, mx);
  const Recipe o = parse_recipe_toml("a = \"bf16\"\nw = \"bf16\"\na_bwd = \"mxfp4\"\nw_bwd = \"nvfp4\"\n"
                                     "[[override]]\nmatch = \"head\"\nw = \"fp32\"\n",
                                     "o.toml");
  EXPECT_EQ(o.resolve("head", 1, 3).w_bwd, KindQuant{});
  EXPECT_EQ(o.resolve("head", 1, 3).a_bwd, parse_kind_quant("mxfp4"));
  EXPECT_EQ(o.resolve("body", 1, 3).w_bwd, parse_kind_quant("nvfp4"));
  EXPECT_EQ(parse_recipe_toml(o.to_toml(), "o.toml"), o);
  // Printed only where given; "none" is the default again.
  EXPECT_EQ(parse_recipe("a=bf16").to_line().find("bwd"), std::string::npos);
  EXPECT_EQ(parse_recipe("mxfp4-tseng,a_bwd=none").base.a_bwd, KindQuant{});
  EXPECT_NE(r.to_line().find("a_bwd=e2m1fn@1x32:e8m0:floor:dither-scale/stochastic"), std::string::npos) << r.to_line();
  // Refused: a quantizer without scales, delayed scaling (each with the key and the reason).
  const std::string fixed = error_of([] { parse_recipe("a=bf16,a_bwd=1.4.3"); });
  EXPECT_NE(fixed.find("a_bwd: '1.4.3' is not a scaled quantizer"), std::string::npos) << fixed;
  const std::string delayed = error_of([] { parse_recipe("a=bf16,w_bwd=e4m3_delayed"); });
  EXPECT_NE(delayed.find("w_bwd: 'e4m3_delayed' is delayed scaling"), std::string::npos) << delayed;
  EXPECT_NE(error_of([] { parse_recipe_toml("a_bwd = 3\n", "b.toml"); }).find("b.toml:1"), std::string::npos);
  // bwd_from: the float32 tensor by default, printed only when it is the forward's values.
  EXPECT_EQ(r.base.bwd_from, BackwardSource::tensor);
  const Recipe fwd = parse_recipe("a=nvfp4,a_bwd=mxfp4,bwd_from=forward");
  EXPECT_EQ(fwd.resolve("x", 1, 3).bwd_from, BackwardSource::forward);
  EXPECT_NE(fwd.to_line().find("bwd_from=forward"), std::string::npos) << fwd.to_line();
  EXPECT_EQ(parse_recipe_toml(fwd.to_toml(), "f.toml").base, fwd.base);
  EXPECT_NE(error_of([] { parse_recipe("a=nvfp4,bwd_from=fp32"); }).find("(known: tensor, forward)"), std::string::npos);
}

TEST(RecipeGrammar, RandomBitsHaveATextForm) {
  const KindQuant q = parse_kind_quant("1.5.2:33/stochastic:12");
  ASSERT_TRUE(q);
  EXPECT_EQ(q->element.rounding, Rounding::stochastic);
  EXPECT_EQ(q->element.random_bits, 12);
  EXPECT_EQ(to_string(q), "1.5.2:33/stochastic:12");
  EXPECT_EQ(to_string(parse_kind_quant("1.5.2:33/stochastic:32")), "1.5.2:33/stochastic");
  for (const char* bad : {"1.5.2/stochastic:0", "1.5.2/stochastic:33", "1.5.2/stochastic:x", "1.5.2/nearest/stochastic:3"})
    EXPECT_THROW(parse_kind_quant(bad), Error) << bad;
  // TOML's random_bits only with stochastic rounding (elsewhere it would be silently unused).
  EXPECT_NE(error_of([] { parse_recipe_toml("gx = { format = \"e5m2\", random_bits = 12 }\n", "r.toml"); })
                .find("random_bits is for stochastic rounding"),
            std::string::npos);
}

// Random recipes over every key, overrides included: each prints to a TOML that reads back
// to it, and (without overrides) to a line that does.
TEST(RecipeGrammar, RandomRecipesRoundTripThroughBothForms) {
  const char* quantizers[] = {"fp32", "1.4.3:10", "e4m3fn", "1.5.2:33/stochastic/nan", "1.5.2:20/stochastic:7",
                              "mxfp8_e4m3", "nvfp4/stochastic", "e4m3fn@128x128:fp32:nearest", "fp16",
                              "mxfp4:ceil", "e5m2/toward-zero"};
  const char* patterns[] = {"first", "last", "layer1.*", "fc", "*.conv?"};
  std::mt19937 rng(11);
  auto pick = [&](int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng); };
  for (int i = 0; i < 2000; ++i) {
    Recipe r;
    r.name = "r" + std::to_string(i);
    for (TensorKind k : kAllKinds) r.base[k] = parse_kind_quant(quantizers[pick(std::size(quantizers))]);
    r.exempt_first = pick(3) != 0;
    if (r.exempt_first && pick(2)) r.first_quant = parse_kind_quant(quantizers[1 + pick(std::size(quantizers) - 1)]);
    r.keep_last = pick(2);
    if (r.keep_last && pick(2)) r.keep_last_quant = parse_kind_quant(quantizers[1 + pick(std::size(quantizers) - 1)]);
    r.keep_first = pick(2);
    if (r.keep_first && pick(2)) r.keep_first_quant = parse_kind_quant(quantizers[1 + pick(std::size(quantizers) - 1)]);
    r.hadamard = pick(2) ? 16 : 0;
    r.hadamard_signs = static_cast<HadamardSigns>(pick(3));
    const char* backward_forms[] = {"mxfp4/stochastic", "mxfp4:dither-scale/stochastic:16", "nvfp4", "e4m3_tensor"};
    if (pick(2)) r.base.a_bwd = parse_kind_quant(backward_forms[pick(std::size(backward_forms))]);
    if (pick(2)) r.base.w_bwd = parse_kind_quant(backward_forms[pick(std::size(backward_forms))]);
    if (pick(2)) r.base.bwd_from = BackwardSource::forward;
    if (pick(2)) r.compute = static_cast<Compute>(pick(3));
    const char* accumulations[] = {"fp32", "1.8.10@128", "hopper-fp8-promote128",
                                   "dot:group=8:frac=5:align=nearest:acc=9:acc_round=nearest:promote=16"};
    if (pick(2)) r.accumulate = parse_accumulation(accumulations[pick(std::size(accumulations))]);
    const bool overrides = pick(2);
    for (int j = 0; overrides && j < 1 + pick(3); ++j) {
      RecipeOverride o;
      o.pattern = patterns[pick(std::size(patterns))];
      for (int k = 0; k < kKinds; ++k)
        if (pick(2)) o.set[k] = parse_kind_quant(quantizers[pick(std::size(quantizers))]);
      r.overrides.push_back(o);
    }
    ASSERT_EQ(parse_recipe_toml(r.to_toml(), "t.toml"), r) << r.to_toml();
    if (!overrides) {
      ASSERT_EQ(without_name(parse_recipe(r.to_line())), without_name(r)) << r.to_line();
    }
  }
}

TEST(RecipeGrammar, FieldsBuildTheRecipeTheLineDoes) {
  const Recipe f = recipe_from_fields({{"a", "1.4.3:10"}, {"gx", "1.5.2:33"}, {"exempt_first", "false"}, {"hadamard", "16"}},
                                      {{"fc", {{"gx", "fp32"}}}});
  Recipe line = parse_recipe("a=1.4.3:10,gx=1.5.2:33,first=0,hadamard=16");
  line.overrides.push_back({"fc", {}});
  line.overrides.back().set[static_cast<int>(TensorKind::gx)] = KindQuant{};  // set, to float32
  EXPECT_EQ(without_name(f), without_name(line));
  EXPECT_EQ(f.name, "a=1.4.3:10,w=fp32,gx=1.5.2:33,gw=fp32,first=0,hadamard=16; overrides: fc");
  EXPECT_NE(error_of([] { (void)recipe_from_fields({{"gx", "1.9.9"}}); }).find("recipe field 'gx'"), std::string::npos);
  EXPECT_NE(error_of([] { (void)recipe_from_fields({{"first", "0"}}); }).find("unknown field 'first'"), std::string::npos);
  EXPECT_NE(error_of([] { (void)recipe_from_fields({}, {{"", {{"a", "fp32"}}}}); }).find("'match'"), std::string::npos);
}
