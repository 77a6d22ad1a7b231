#include "fp8lab/core/toml_parse.hpp"
#include "fp8lab/core/text.hpp"
#include "fp8lab/nn/compute_spec.hpp"
#include "fp8lab/nn/recipe.hpp"

#include "fp8lab/core/files.hpp"

#include <fstream>
#include <sstream>

namespace fp8lab::nn {

namespace {
std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  std::size_t start = 0;
  for (;;) {
    const std::size_t p = s.find(sep, start);
    out.push_back(s.substr(start, p == std::string_view::npos ? s.size() - start : p - start));
    if (p == std::string_view::npos) return out;
    start = p + 1;
  }
}
}  // namespace

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
    try {
      q.overflow = parse_overflow(p);
    } catch (const Error&) {
      throw Error("'" + std::string(p) + "' in '" + std::string(t) +
                  "' is neither a rounding (nearest-even, toward-zero, stochastic) nor an "
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
  if (exempt_first && index == 0) {
    out[TensorKind::a] = first_quant;
    out[TensorKind::gx] = first_quant;
  }
  if (keep_last && index == count - 1) out.q = {};
  for (const auto& o : overrides)
    if (override_matches(o, path, index, count))
      for (int k = 0; k < kKinds; ++k)
        if (o.set[k]) out.q[k] = *o.set[k];
  return out;
}

std::string Recipe::to_line() const {
  std::string s;
  for (TensorKind k : kAllKinds)
    s += (s.empty() ? "" : ",") + std::string(to_string(k)) + "=" + to_string(base[k]);
  if (!exempt_first) s += ",first=0";
  else if (first_quant) s += ",first=" + to_string(first_quant);
  if (keep_last) s += ",last=fp32";
  if (hadamard) s += ",hadamard=" + std::to_string(hadamard);
  return s;
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
      {"deepseek", "a=deepseek_1x128,w=deepseek_128x128,gx=deepseek_1x128,gw=fp32",
       "DeepSeek-V3: E4M3, 1x128 tiles for activations and gradients, 128x128 for weights"},
      {"tensor-current", "a=e4m3_tensor,w=e4m3_tensor,gx=e5m2_tensor,gw=fp32",
       "per-tensor current scaling: E4M3 forward, E5M2 gradients"},
      {"tensor-delayed", "a=e4m3_delayed,w=e4m3_delayed,gx=e5m2_delayed,gw=fp32",
       "per-tensor delayed scaling (amax of the last 16 steps): E4M3 forward, E5M2 gradients"},
  };
  return p;
}

namespace {
// The first layer's exemption: off ("0", "false", "quantize"), its two tensors in float32
// ("1", "true", "fp32") or in the quantizer given ("fp16", "1.5.2:20", ...).
void set_first(Recipe& r, std::string_view value) {
  if (value == "0" || value == "false" || value == "quantize") {
    r.exempt_first = false;
    r.first_quant = std::nullopt;
    return;
  }
  r.exempt_first = true;
  r.first_quant = value == "1" || value == "true" ? std::nullopt : parse_kind_quant(value);
}
}  // namespace

Recipe parse_recipe(std::string_view text_in) {
  const std::string_view text = trim(text_in);
  for (const auto& p : recipe_presets())
    if (p.name == text) {
      Recipe r = parse_recipe(p.line);
      r.name = std::string(p.name);
      return r;
    }
  if (text.find('=') == std::string_view::npos) {
    std::string names;
    for (const auto& p : recipe_presets()) names += (names.empty() ? "" : ", ") + std::string(p.name);
    throw Error("recipe '" + std::string(text) +
                "': expected kind=format pairs (a=1.4.3:10,w=...,gx=...,gw=...) or a preset: " +
                names);
  }
  Recipe r;
  r.name = std::string(text);
  std::array<bool, kKinds> seen{};
  for (std::string_view item : split(text, ',')) {
    item = trim(item);
    if (item.empty()) continue;
    const std::size_t eq = item.find('=');
    if (eq == std::string_view::npos)
      throw Error("recipe '" + std::string(text) + "': '" + std::string(item) + "' has no '='");
    const std::string_view key = trim(item.substr(0, eq)), value = trim(item.substr(eq + 1));
    if (key == "first") {
      try {
        set_first(r, value);
      } catch (const Error& e) {
        throw Error("recipe '" + std::string(text) + "', first: " + e.what() +
                    " (first takes 0, 1, fp32 or the quantizer of the first layer's input and output gradient)");
      }
      continue;
    }
    if (key == "last") {
      if (value != "fp32" && value != "float32")
        throw Error("recipe '" + std::string(text) + "': last takes fp32 (the last layer in float32), not '" +
                    std::string(value) + "'");
      r.keep_last = true;
      continue;
    }
    if (key == "hadamard") {
      if (value != "0" && value != "16")
        throw Error("recipe '" + std::string(text) + "': hadamard must be 0 or 16 (got '" + std::string(value) + "')");
      r.hadamard = value == "16" ? 16 : 0;
      continue;
    }
    TensorKind k;
    try {
      k = parse_kind(key);
    } catch (const Error&) {
      throw Error("recipe '" + std::string(text) + "': unknown key '" + std::string(key) +
                  "' (expected a, w, gx, gw, first, last or hadamard)");
    }
    if (seen[static_cast<int>(k)])
      throw Error("recipe '" + std::string(text) + "': '" + std::string(key) + "' given twice");
    seen[static_cast<int>(k)] = true;
    try {
      r.base[k] = parse_kind_quant(value);
    } catch (const Error& e) {
      throw Error("recipe '" + std::string(text) + "', " + std::string(key) + ": " + e.what());
    }
  }
  return r;
}

namespace {
std::string where(const std::string& source, const toml::node& n) {
  const auto& src = n.source();
  return source + ":" + std::to_string(src.begin.line) + ": ";
}

KindQuant kind_from_toml(const toml::node& n, const std::string& source, std::string_view key) {
  try {
    if (auto s = n.value<std::string>()) return parse_kind_quant(*s);
    if (const auto* t = n.as_table()) {
      std::string text;
      for (auto&& [k, v] : *t) {
        const std::string kk(k.str());
        if (kk != "format" && kk != "rounding" && kk != "overflow" && kk != "random_bits")
          throw Error("unknown key '" + kk + "' (expected format, rounding, overflow, random_bits)");
      }
      const auto fmt = (*t)["format"].value<std::string>();
      if (!fmt) throw Error("needs a 'format' string");
      KindQuant q = parse_kind_quant(*fmt);
      if (!q) return q;
      QuantSpec& e = q->element;
      if (auto r = (*t)["rounding"].value<std::string>()) e.rounding = parse_rounding(*r);
      if (auto o = (*t)["overflow"].value<std::string>()) e.overflow = parse_overflow(*o);
      if (auto b = (*t)["random_bits"].value<std::int64_t>()) {
        if (*b < 1 || *b > 32) throw Error("random_bits must be in 1..32");
        e.random_bits = static_cast<std::uint8_t>(*b);
      }
      validate(*q);
      return q;
    }
    throw Error("expected a format string or a table");
  } catch (const Error& e) {
    throw Error(where(source, n) + "'" + std::string(key) + "': " + e.what());
  }
}
}  // namespace

Recipe parse_recipe_toml(std::string_view text, const std::string& source) {
  const toml::table root = parse_toml(text, source);
  const toml::table* t = &root;
  if (auto* sub = root["recipe"].as_table()) {
    // The recipe in a [recipe] table: nothing may stand beside it, or it would be ignored.
    for (auto&& [k, v] : root)
      if (k.str() != "recipe")
        throw Error(where(source, v) + "'" + std::string(k.str()) +
                    "' stands outside the [recipe] table: put every key of the recipe inside it");
    t = sub;
  }
  if (t->empty())
    throw Error(source + ": the recipe sets nothing (an empty recipe would train in float32 without a word); "
                "give each tensor kind a quantizer, e.g. a = \"1.4.3:10\", or a = \"fp32\" on purpose");
  Recipe r;
  r.name = source;
  for (auto&& [k, v] : *t) {
    const std::string key(k.str());
    if (key == "name") {
      if (auto s = v.value<std::string>()) r.name = *s;
      else throw Error(where(source, v) + "'name' must be a string");
    } else if (key == "exempt_first") {
      if (auto b = v.value_exact<bool>()) {
        set_first(r, *b ? "1" : "0");
      } else if (auto q = v.value_exact<std::string>()) {
        try {
          set_first(r, *q);
        } catch (const Error& e) {
          throw Error(where(source, v) + "'exempt_first': " + e.what());
        }
      } else {
        throw Error(where(source, v) + "'exempt_first' must be true, false or a quantizer (\"fp16\")");
      }
    } else if (key == "keep_last") {
      if (auto b = v.value_exact<bool>()) r.keep_last = *b;
      else throw Error(where(source, v) + "'keep_last' must be true or false");
    } else if (key == "hadamard") {
      const auto h = v.value<std::int64_t>();
      if (!h || (*h != 0 && *h != 16)) throw Error(where(source, v) + "'hadamard' must be 0 or 16");
      r.hadamard = static_cast<int>(*h);
    } else if (key == "compute" || key == "accumulate") {
      const auto text = v.value<std::string>();
      if (!text) throw Error(where(source, v) + "'" + key + "' must be a string");
      try {
        if (key == "compute") r.compute = std::string(to_string(parse_compute(*text)));
        else r.accumulate = to_string(parse_accumulation(*text));
      } catch (const Error& e) {
        throw Error(where(source, v) + "'" + key + "': " + e.what());
      }
    } else if (key == "override") {
      const auto* arr = v.as_array();
      if (!arr) throw Error(where(source, v) + "'override' must be an array of tables ([[override]])");
      for (auto&& item : *arr) {
        const auto* ot = item.as_table();
        if (!ot) throw Error(where(source, item) + "each override must be a table");
        RecipeOverride o;
        for (auto&& [ok, ov] : *ot) {
          const std::string okey(ok.str());
          if (okey == "match") {
            if (auto s = ov.value<std::string>()) o.pattern = *s;
            else throw Error(where(source, ov) + "'match' must be a string");
          } else {
            TensorKind kind;
            try {
              kind = parse_kind(okey);
            } catch (const Error&) {
              throw Error(where(source, ov) + "unknown key '" + okey +
                          "' in override (expected match, a, w, gx, gw)");
            }
            o.set[static_cast<int>(kind)] = kind_from_toml(ov, source, okey);
          }
        }
        if (o.pattern.empty()) throw Error(where(source, item) + "override needs a 'match' pattern");
        r.overrides.push_back(std::move(o));
      }
    } else if (key == "recipe") {
      throw Error(where(source, v) + "'recipe' must be the [recipe] table holding the recipe's keys (a recipe file "
                  "does not name another recipe)");
    } else {
      TensorKind kind;
      try {
        kind = parse_kind(key);
      } catch (const Error&) {
        throw Error(where(source, v) + "unknown key '" + key +
                    "' (expected name, a, w, gx, gw, exempt_first, keep_last, hadamard, compute, accumulate, override)");
      }
      r.base[kind] = kind_from_toml(v, source, key);
    }
  }
  return r;
}

Recipe load_recipe(const std::string& arg) {
  if (arg.size() > 5 && arg.substr(arg.size() - 5) == ".toml") {
    // The readers of config files: a regular file within the memory budget (no device,
    // pipe or folder), read whole.
    return parse_recipe_toml(read_file(arg), arg);
  }
  return parse_recipe(arg);
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
