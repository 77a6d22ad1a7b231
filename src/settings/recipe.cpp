#include <algorithm>

#include "fp8lab/core/enum_names.hpp"
#include "fp8lab/core/text.hpp"
#include "fp8lab/settings/compute_spec.hpp"
#include "fp8lab/settings/recipe.hpp"

namespace fp8lab::nn {

namespace {
// The tensor kinds' names: the short one recipes and statistics use, the title plots use,
// and the other spellings a recipe accepts.
struct KindName {
  TensorKind kind;
  std::string_view name, title, alias1, alias2;
};
constexpr KindName kKindNames[] = {
    {TensorKind::a, "a", "activations", "activations", "act"},
    {TensorKind::w, "w", "weights", "weights", "weights"},
    {TensorKind::gx, "gx", "grad_x", "grad_x", "grad_a"},
    {TensorKind::gw, "gw", "grad_w", "grad_w", "grad_w"},
};
const KindName& names_of(TensorKind k) {
  for (const auto& n : kKindNames)
    if (n.kind == k) return n;
  return kKindNames[0];
}
}  // namespace

std::string_view to_string(TensorKind k) { return names_of(k).name; }

namespace {
constexpr EnumName<HadamardSigns> kHadamardSigns[] = {
    {HadamardSigns::random, "random"}, {HadamardSigns::none, "none"}, {HadamardSigns::te, "te"}};
}  // namespace

std::string_view to_string(HadamardSigns s) { return enum_name(kHadamardSigns, s); }
HadamardSigns parse_hadamard_signs(std::string_view s) {
  return enum_parse(kHadamardSigns, trim(s), "Hadamard signs");
}

namespace {
constexpr EnumName<HadamardProducts> kHadamardProducts[] = {{HadamardProducts::grad_w, "grad_w"},
                                                            {HadamardProducts::backward, "backward"}};
}  // namespace

std::string_view to_string(HadamardProducts p) { return enum_name(kHadamardProducts, p); }
HadamardProducts parse_hadamard_products(std::string_view s) {
  return enum_parse(kHadamardProducts, trim(s), "Hadamard products");
}
constexpr EnumName<BackwardSource> kBackwardSources[] = {{BackwardSource::tensor, "tensor"},
                                                         {BackwardSource::forward, "forward"}};
std::string_view to_string(BackwardSource s) { return enum_name(kBackwardSources, s); }
BackwardSource parse_backward_source(std::string_view s) {
  return enum_parse(kBackwardSources, trim(s), "backward-form source");
}

const std::array<float, 16>& fixed_hadamard_signs(HadamardSigns s) {
  static constexpr std::array<float, 16> kPlain = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
  // transformer_engine/pytorch/custom_recipes/quantization_ref_nvfp4.py, get_wgrad_sign_vector.
  static constexpr std::array<float, 16> kTransformerEngine = {1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1};
  if (s == HadamardSigns::random) throw Error("the random Hadamard transform has no fixed signs");
  return s == HadamardSigns::te ? kTransformerEngine : kPlain;
}
std::string_view kind_title(TensorKind k) { return names_of(k).title; }

TensorKind parse_kind(std::string_view s) {
  s = trim(s);
  for (const auto& n : kKindNames)
    if (s == n.name || s == n.alias1 || s == n.alias2) return n.kind;
  throw Error("unknown tensor kind '" + std::string(s) + "': expected a, w, gx or gw");
}

namespace {
std::optional<Rounding> rounding_named(std::string_view s) {
  try {
    return parse_rounding(s);
  } catch (const Error&) {
    return std::nullopt;
  }
}

// "stochastic:R": stochastic rounding on R random bits (1..32); nullopt for any other text.
std::optional<std::uint8_t> stochastic_bits(std::string_view s) {
  constexpr std::string_view kPrefix = "stochastic:";
  if (s.substr(0, kPrefix.size()) != kPrefix) return std::nullopt;
  const std::optional<std::int64_t> r = parse_integer(s.substr(kPrefix.size()));
  if (!r || *r < 1 || *r > 32)
    throw Error("'" + std::string(s) + "': stochastic rounding takes 1..32 random bits (stochastic:R)");
  return static_cast<std::uint8_t>(*r);
}
}  // namespace

KindQuant parse_kind_quant(std::string_view text) {
  const std::string_view t = trim(text);
  if (t == "fp32" || t == "float32" || t == "none") return std::nullopt;
  const auto parts = split(t, '/');
  ScaledSpec s = parse_scaled(parts[0]);
  QuantSpec& q = s.element;
  bool seen_r = false, seen_o = false;
  for (std::size_t i = 1; i < parts.size(); ++i) {
    const std::string_view p = trim(parts[i]);
    if (const auto r = rounding_named(p)) {
      if (seen_r) throw Error("rounding given twice in '" + std::string(t) + "'");
      q.rounding = *r;
      seen_r = true;
      continue;
    }
    if (const auto bits = stochastic_bits(p)) {  // "stochastic:12"
      if (seen_r) throw Error("rounding given twice in '" + std::string(t) + "'");
      q.rounding = Rounding::stochastic;
      q.random_bits = *bits;
      seen_r = true;
      continue;
    }
    try {
      q.overflow = parse_overflow(p);
    } catch (const Error&) {
      throw Error("'" + std::string(p) + "' in '" + std::string(t) +
                  "' is neither a rounding (nearest-even, toward-zero, stochastic, nearest-away) nor an "
                  "overflow mode (saturate, nan, inf)");
    }
    if (seen_o) throw Error("overflow mode given twice in '" + std::string(t) + "'");
    seen_o = true;
  }
  validate(s);
  return s;
}

std::string to_string(const KindQuant& q) {
  if (!q) return "fp32";
  const QuantSpec& e = q->element;
  std::string s = q->scaled() ? to_string(*q) : to_string(e.format);
  if (e.rounding != Rounding::nearest_even) s += "/" + std::string(to_string(e.rounding));
  if (e.rounding == Rounding::stochastic && e.random_bits != QuantSpec{}.random_bits)
    s += ":" + std::to_string(e.random_bits);
  if (e.overflow != Overflow::saturate) s += "/" + std::string(to_string(e.overflow));
  return s;
}

bool glob_match(std::string_view p, std::string_view t) {
  // Iterative matcher with backtracking to the last '*'.
  std::size_t pi = 0, ti = 0, star = std::string_view::npos, mark = 0;
  while (ti < t.size()) {
    if (pi < p.size() && (p[pi] == '?' || p[pi] == t[ti])) {
      ++pi;
      ++ti;
    } else if (pi < p.size() && p[pi] == '*') {
      star = pi++;
      mark = ti;
    } else if (star != std::string_view::npos) {
      pi = star + 1;
      ti = ++mark;
    } else {
      return false;
    }
  }
  while (pi < p.size() && p[pi] == '*') ++pi;
  return pi == p.size();
}

namespace {
bool override_matches(const RecipeOverride& o, std::string_view path, int index, int count) {
  if (o.pattern == "first") return index == 0;
  if (o.pattern == "last") return index == count - 1;
  return glob_match(o.pattern, path);
}
}  // namespace

LayerQuant Recipe::resolve(std::string_view path, int index, int count) const {
  LayerQuant out = base;
  out.hadamard = hadamard;
  out.hadamard_signs = hadamard_signs;
  out.hadamard_on = hadamard_on;
  // Whether each kind's quantizer was replaced: a backward form belongs to the base's.
  std::array<bool, kKinds> replaced{};
  const auto set = [&](TensorKind k, const KindQuant& q) {
    out[k] = q;
    replaced[static_cast<int>(k)] = true;
  };
  if (exempt_first && index == 0) {
    set(TensorKind::a, first_quant);
    set(TensorKind::gx, first_quant);
  }
  for (TensorKind k : kAllKinds) {
    if (keep_first && index == 0) set(k, keep_first_quant);
    if (keep_last && index == count - 1) set(k, keep_last_quant);
  }
  for (const auto& o : overrides)
    if (override_matches(o, path, index, count))
      for (TensorKind k : kAllKinds)
        if (const auto& q = o.set[static_cast<int>(k)]) set(k, *q);
  if (replaced[static_cast<int>(TensorKind::a)]) out.a_bwd = std::nullopt;
  if (replaced[static_cast<int>(TensorKind::w)]) out.w_bwd = std::nullopt;
  return out;
}

bool Recipe::depends_on_count() const {
  return keep_last || std::any_of(overrides.begin(), overrides.end(), [](const RecipeOverride& o) { return o.pattern == "last"; });
}

const std::vector<RecipePreset>& recipe_presets() {
  static const std::vector<RecipePreset> p = {
      {"fp32", "a=fp32,w=fp32,gx=fp32,gw=fp32", "float32 baseline"},
      {"resnet32-143", "a=1.4.3:10,w=1.4.3:14,gx=1.4.3:20,gw=1.4.3:16",
       "ResNet-32 CIFAR-100, all 1.4.3 (paper: 70.30 +- 0.37 %)"},
      {"resnet32-152", "a=1.5.2:24,w=1.5.2:28,gx=1.5.2:32,gw=1.5.2:33",
       "ResNet-32 CIFAR-100, all 1.5.2 (paper: 70.02 +- 0.40 %)"},
      {"resnet32-mixed", "a=1.4.3:10,w=1.4.3:14,gx=1.5.2:33,gw=1.5.2:31",
       "ResNet-32 CIFAR-100, 1.4.3 forward / 1.5.2 backward (paper: 70.42 +- 0.45 %)"},
      {"resnet18-152", "a=1.5.2:28,w=1.5.2:24,gx=1.5.2:34,gw=1.5.2:31",
       "ResNet-18 ImageNet, all 1.5.2 (paper: 69.95 %, significantly worse)"},
      {"resnet18-mixed", "a=1.4.3:10,w=1.4.3:14,gx=1.5.2:34,gw=1.5.2:31",
       "ResNet-18 ImageNet, mixed (paper: 70.29 %)"},
      {"resnet50-152", "a=1.5.2:24,w=1.5.2:28,gx=1.5.2:32,gw=1.5.2:32",
       "ResNet-50 ImageNet, all 1.5.2 (paper: 76.43 %, significantly worse)"},
      {"resnet50-mixed", "a=1.4.3:10,w=1.4.3:14,gx=1.5.2:32,gw=1.5.2:32",
       "ResNet-50 ImageNet, mixed (paper: 76.61 %)"},
      {"efficientnet-mixed", "a=1.4.3:7,w=1.4.3:12,gx=1.5.2:16,gw=fp16,first=fp16",
       "EfficientNet-B0, fp16 weight gradients and first layer (paper: 76.33 %; grad_x bias 16..18)"},
      {"transformer-152", "a=1.5.2:24,w=1.5.2:28,gx=1.5.2:40,gw=1.5.2:40",
       "Transformer base WMT14, all 1.5.2 (paper: 25.48 BLEU)"},
      {"transformer-mixed", "a=1.4.3:10,w=1.4.3:16,gx=1.5.2:40,gw=1.5.2:40",
       "Transformer base WMT14, mixed (paper: 25.56 BLEU)"},
      {"bert-mixed", "a=1.4.3:10,w=1.4.3:14,gx=1.5.2:16,gw=fp16",
       "BERT-Large, fp16 base (paper: MLM+NSP loss 2.22)"},
      {"mxfp8", "a=mxfp8_e4m3,w=mxfp8_e4m3,gx=mxfp8_e5m2,gw=fp32",
       "OCP MXFP8: E4M3 forward, E5M2 gradients, 1x32 E8M0 blocks (floor rule)"},
      {"mxfp8-ceil", "a=mxfp8_e4m3:ceil,w=mxfp8_e4m3:ceil,gx=mxfp8_e5m2:ceil,gw=fp32",
       "MXFP8 with E8M0 scales rounded up (nothing saturates)"},
      {"mxfp6", "a=mxfp6_e2m3,w=mxfp6_e2m3,gx=mxfp6_e3m2,gw=fp32",
       "OCP MXFP6: E2M3 forward, E3M2 gradients"},
      {"mxfp4", "a=mxfp4,w=mxfp4,gx=mxfp4,gw=fp32", "OCP MXFP4 everywhere"},
      {"nvfp4", "a=nvfp4,w=nvfp4,gx=nvfp4/stochastic,gw=fp32",
       "NVFP4 (1x16 UE4M3 blocks, float32 tensor scale), stochastic rounding of gradients"},
      {"nvfp4-rht", "a=nvfp4,w=nvfp4,gx=nvfp4/stochastic,gw=fp32,hadamard=16",
       "NVFP4 with the random Hadamard transform on grad_w's operands (linear layers)"},
      {"nvfp4-last-fp32", "a=nvfp4,w=nvfp4,gx=nvfp4/stochastic,gw=fp32,last=fp32",
       "NVFP4 with the last layer (the classifier) in float32"},
      {"nvfp4-training", "a=nvfp4,w=nvfp4_16x16,gx=nvfp4/stochastic,gw=fp32,keep_first=bf16,last=bf16,hadamard=16",
       "NVIDIA's NVFP4 training recipe: 16x16 weight tiles, 1x16 activation and gradient blocks, stochastic "
       "rounding of gradients, the random Hadamard transform on grad_w's operands, the first and last layers in "
       "bfloat16"},
      {"nvfp4-4over6",
       "a=nvfp4_4over6,w=nvfp4_16x16:4over6,gx=nvfp4_4over6/stochastic,gw=fp32,keep_first=bf16,last=bf16,hadamard=16",
       "nvfp4-training with Four Over Six (each block scaled to 6 or to 4, whichever is nearer its values) on every "
       "operand"},
      {"mxfp4-tseng",
       "a=bf16,w=bf16,gx=mxfp4:dither-scale/stochastic,gw=fp32,a_bwd=mxfp4:dither-scale/stochastic,"
       "w_bwd=mxfp4:dither-scale/stochastic,hadamard=64,hadamard_on=backward",
       "Tseng et al.'s MXFP4 recipe: a bfloat16 forward; both backward products in MXFP4 with dither-scale and "
       "stochastic rounding, after the random Hadamard transform of 64"},
      {"nvfp4-quartet2",
       "a=nvfp4_quartet/nearest-away,w=nvfp4_quartet/nearest-away,gx=nvfp4_eden/nearest-away,gw=fp32,"
       "a_bwd=nvfp4_eden/nearest-away,w_bwd=nvfp4_eden/nearest-away,bwd_from=forward,hadamard=128,"
       "hadamard_on=backward",
       "Quartet II: an NVFP4 forward rounded to nearest (its kernel's float32 operations); both backward products "
       "in NVFP4 with MS-EDEN after the random Hadamard transform of 128, on the forward's quantized operands"},
      {"deepseek", "a=deepseek_1x128,w=deepseek_128x128,gx=deepseek_1x128,gw=fp32",
       "DeepSeek-V3: E4M3, 1x128 tiles for activations and gradients, 128x128 for weights"},
      {"tensor-current", "a=e4m3_tensor,w=e4m3_tensor,gx=e5m2_tensor,gw=fp32",
       "per-tensor current scaling: E4M3 forward, E5M2 gradients"},
      {"tensor-delayed", "a=e4m3_delayed,w=e4m3_delayed,gx=e5m2_delayed,gw=fp32",
       "per-tensor delayed scaling (amax of the last 16 steps): E4M3 forward, E5M2 gradients"},
  };
  return p;
}

void check_overrides(const Recipe& r, const std::vector<std::string>& paths) {
  std::string bad;
  for (const auto& o : r.overrides) {
    if (o.pattern == "first" || o.pattern == "last") {
      if (paths.empty()) bad += (bad.empty() ? "" : ", ") + ("'" + o.pattern + "'");
      continue;
    }
    bool any = false;
    for (const auto& p : paths) any = any || glob_match(o.pattern, p);
    if (!any) bad += (bad.empty() ? "" : ", ") + ("'" + o.pattern + "'");
  }
  if (!bad.empty()) {
    std::string some;
    for (std::size_t i = 0; i < paths.size() && i < 6; ++i) some += (i ? ", " : "") + paths[i];
    throw Error("recipe '" + r.name + "': override pattern " + bad +
                " matches no quantized layer (layers: " + some + (paths.size() > 6 ? ", ..." : "") + ")");
  }
}

}  // namespace fp8lab::nn
