// A recipe's one grammar (recipe.hpp, docs/spec.md §4.2): one table of keys that the line
// form, the TOML form, Python's fields and both printers read. Each key's value is set
// from its text; TOML's typed values are turned into that text first (true -> "true",
// a quantizer table -> "FORMAT/ROUNDING:BITS/OVERFLOW"), so that both forms go through the
// same setter and say the same things.
#include <charconv>
#include <sstream>

#include "fp8lab/core/files.hpp"
#include "fp8lab/core/text.hpp"
#include "fp8lab/core/toml_parse.hpp"
#include "fp8lab/settings/compute_spec.hpp"
#include "fp8lab/settings/recipe.hpp"

namespace fp8lab::nn {

namespace {

// The TOML values a key takes.
enum class TomlValue : std::uint8_t {
  quantizer,  // a string, or a table with format, rounding, overflow, random_bits
  exemption,  // true, false or a quantizer string
  boolean,
  integer,
  text,
};

struct RecipeKey {
  std::string_view name;       // in TOML, in a line and in Python
  std::string_view line_name;  // its other name in a line, or ""
  TomlValue toml;
  void (*set)(Recipe&, std::string_view);  // from the value's text; throws Error without location
  std::string_view takes;                  // what the value may be, for errors
  // The value's text as the printers write it; nullopt at the default (left out). The
  // quantizers of the four kinds are always written; the name is neither form's item.
  std::optional<std::string> (*get)(const Recipe&);
};

bool truth(std::string_view v, bool& out) {
  if (v == "true" || v == "1") return out = true, true;
  if (v == "false" || v == "0") return out = false, true;
  return false;
}

// exempt_first: off ("false", "0", "quantize"), its two tensors in float32 ("true", "1",
// "fp32") or in the quantizer given ("fp16", "1.5.2:20", ...).
void set_exempt_first(Recipe& r, std::string_view v) {
  bool on = false;
  if (v == "quantize" || (truth(v, on) && !on)) {
    r.exempt_first = false;
    r.first_quant = std::nullopt;
    return;
  }
  r.exempt_first = true;
  r.first_quant = truth(v, on) ? std::nullopt : parse_kind_quant(v);
}

// keep_first and keep_last: off ("false", "0"), the whole layer in float32 ("true", "1",
// "fp32", "float32") or in the quantizer given ("bf16", "1.5.2:20", ...).
void set_keep(bool& keep, KindQuant& quant, std::string_view v) {
  quant = std::nullopt;
  if (v == "fp32" || v == "float32" || truth(v, keep)) {
    keep = keep || v == "fp32" || v == "float32";
    return;
  }
  keep = true;
  quant = parse_kind_quant(v);
}

void set_keep_first(Recipe& r, std::string_view v) { set_keep(r.keep_first, r.keep_first_quant, v); }
void set_keep_last(Recipe& r, std::string_view v) { set_keep(r.keep_last, r.keep_last_quant, v); }

void set_hadamard(Recipe& r, std::string_view v) {
  int n = -1;
  const auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
  if (ec != std::errc() || p != v.data() + v.size() || (n != 0 && !is_hadamard_size(n)))
    throw Error("not '" + std::string(v) + "'");
  r.hadamard = n;
}

void set_hadamard_signs(Recipe& r, std::string_view v) { r.hadamard_signs = parse_hadamard_signs(v); }
void set_hadamard_on(Recipe& r, std::string_view v) { r.hadamard_on = parse_hadamard_products(v); }

// What no one key can check alone: TransformerEngine's signs are 16.
void check_keys(const Recipe& r, const std::string& at) {
  if (r.hadamard_signs == HadamardSigns::te && r.hadamard > 16)
    throw Error(at + ": hadamard_signs = te is TransformerEngine's 16 fixed signs; hadamard = " +
                std::to_string(r.hadamard) + " needs random or none");
}

template <TensorKind K>
void set_kind(Recipe& r, std::string_view v) {
  r.base[K] = parse_kind_quant(v);
}

template <TensorKind K>
std::optional<std::string> get_kind(const Recipe& r) {
  return to_string(r.base[K]);
}

// a_bwd and w_bwd: a scaled quantizer with current scaling (its own amax each step), the
// backward product's form of the kind (LayerQuant::backward_form); "none" or "same": the
// kind's own quantizer.
template <KindQuant LayerQuant::*Form>
void set_backward_form(Recipe& r, std::string_view v) {
  if (v == "none" || v == "same") {
    r.base.*Form = std::nullopt;
    return;
  }
  KindQuant q = parse_kind_quant(v);
  if (!q || !q->scaled())
    throw Error("'" + std::string(v) + "' is not a scaled quantizer (a backward form is one, e.g. mxfp4/stochastic)");
  if (q->history > 0)
    throw Error("'" + std::string(v) + "' is delayed scaling; a backward form scales from its own amax each step");
  r.base.*Form = std::move(q);
}

template <KindQuant LayerQuant::*Form>
std::optional<std::string> get_backward_form(const Recipe& r) {
  if (!(r.base.*Form)) return std::nullopt;
  return to_string(r.base.*Form);
}

std::optional<std::string> get_exempt_first(const Recipe& r) {
  if (!r.exempt_first) return "0";
  if (r.first_quant) return to_string(r.first_quant);
  return std::nullopt;
}

std::optional<std::string> get_keep(bool keep, const KindQuant& quant) {
  if (!keep) return std::nullopt;
  return quant ? to_string(quant) : std::string("fp32");
}

std::optional<std::string> get_keep_first(const Recipe& r) { return get_keep(r.keep_first, r.keep_first_quant); }
std::optional<std::string> get_keep_last(const Recipe& r) { return get_keep(r.keep_last, r.keep_last_quant); }

std::optional<std::string> get_hadamard_signs(const Recipe& r) {
  if (r.hadamard_signs == HadamardSigns::random) return std::nullopt;
  return std::string(to_string(r.hadamard_signs));
}

std::optional<std::string> get_hadamard_on(const Recipe& r) {
  if (r.hadamard_on == HadamardProducts::grad_w) return std::nullopt;
  return std::string(to_string(r.hadamard_on));
}

std::optional<std::string> get_hadamard(const Recipe& r) {
  return r.hadamard ? std::optional<std::string>(std::to_string(r.hadamard)) : std::nullopt;
}

std::optional<std::string> get_compute(const Recipe& r) {
  return r.compute ? std::optional<std::string>(to_string(*r.compute)) : std::nullopt;
}

std::optional<std::string> get_accumulate(const Recipe& r) {
  return r.accumulate ? std::optional<std::string>(to_string(*r.accumulate)) : std::nullopt;
}

std::optional<std::string> get_nothing(const Recipe&) { return std::nullopt; }

constexpr RecipeKey kKeys[] = {
    {"name", "", TomlValue::text, [](Recipe& r, std::string_view v) { r.name = std::string(v); }, "a string",
     get_nothing},
    {"a", "", TomlValue::quantizer, set_kind<TensorKind::a>, "a quantizer or fp32", get_kind<TensorKind::a>},
    {"w", "", TomlValue::quantizer, set_kind<TensorKind::w>, "a quantizer or fp32", get_kind<TensorKind::w>},
    {"gx", "", TomlValue::quantizer, set_kind<TensorKind::gx>, "a quantizer or fp32", get_kind<TensorKind::gx>},
    {"gw", "", TomlValue::quantizer, set_kind<TensorKind::gw>, "a quantizer or fp32", get_kind<TensorKind::gw>},
    {"exempt_first", "first", TomlValue::exemption, set_exempt_first,
     "true, false or the quantizer of the first layer's input and output gradient (\"fp16\")", get_exempt_first},
    {"keep_first", "", TomlValue::exemption, set_keep_first,
     "true, false, fp32 or the quantizer of the whole first layer (\"bf16\")", get_keep_first},
    {"keep_last", "last", TomlValue::exemption, set_keep_last,
     "true, false, fp32 or the quantizer of the whole last layer (\"bf16\")", get_keep_last},
    {"hadamard", "", TomlValue::integer, set_hadamard, "0, 16, 32, 64 or 128", get_hadamard},
    {"hadamard_signs", "", TomlValue::text, set_hadamard_signs,
     "random (new signs for each product), none (the plain transform) or te (TransformerEngine's fixed signs)",
     get_hadamard_signs},
    {"hadamard_on", "", TomlValue::text, set_hadamard_on,
     "grad_w (the transform on grad_w's product) or backward (on grad_x's too)", get_hadamard_on},
    {"a_bwd", "", TomlValue::quantizer, set_backward_form<&LayerQuant::a_bwd>,
     "a scaled quantizer with current scaling, or none (the backward product's form of a; a itself by default)",
     get_backward_form<&LayerQuant::a_bwd>},
    {"w_bwd", "", TomlValue::quantizer, set_backward_form<&LayerQuant::w_bwd>,
     "a scaled quantizer with current scaling, or none (the backward product's form of w; w itself by default)",
     get_backward_form<&LayerQuant::w_bwd>},
    {"bwd_from", "", TomlValue::text,
     [](Recipe& r, std::string_view v) { r.base.bwd_from = parse_backward_source(v); },
     "tensor (a_bwd and w_bwd quantize the float32 tensor) or forward (the values the forward product read)",
     [](const Recipe& r) -> std::optional<std::string> {
       if (r.base.bwd_from == BackwardSource::tensor) return std::nullopt;
       return std::string(to_string(r.base.bwd_from));
     }},
    {"compute", "", TomlValue::text, [](Recipe& r, std::string_view v) { r.compute = parse_compute(v); },
     "fp32, bf16 or auto", get_compute},
    {"accumulate", "", TomlValue::text, [](Recipe& r, std::string_view v) { r.accumulate = parse_accumulation(v); },
     "fp32, FORMAT@CHUNK or a dot model", get_accumulate},
};

// The key named `name` (its own name, its line name or a tensor kind's other name such as
// "activations"); nullptr for none.
const RecipeKey* find_key(std::string_view name, bool in_line) {
  for (const RecipeKey& k : kKeys)
    if (k.name == name || (in_line && !k.line_name.empty() && k.line_name == name)) return &k;
  try {
    const std::string_view kind = to_string(parse_kind(name));
    for (const RecipeKey& k : kKeys)
      if (k.name == kind) return &k;
  } catch (const Error&) {
  }
  return nullptr;
}

std::string key_list(bool in_line) {
  std::string s;
  for (const RecipeKey& k : kKeys) {
    s += (s.empty() ? "" : ", ") + std::string(k.name);
    if (in_line && !k.line_name.empty()) s += " (or " + std::string(k.line_name) + ")";
  }
  return s;
}

// Sets the keys of one form, each at most once.
class KeySetter {
 public:
  explicit KeySetter(Recipe& r) : r_(r) {}
  // Throws Error without location: "given twice", or the setter's own.
  void set(const RecipeKey& k, std::string_view value) {
    const auto i = static_cast<std::size_t>(&k - kKeys);
    if (seen_[i]) throw Error("given twice");
    seen_[i] = true;
    k.set(r_, value);
  }
  bool given(std::string_view name) const {
    for (std::size_t i = 0; i < std::size(kKeys); ++i)
      if (kKeys[i].name == name) return seen_[i];
    return false;
  }

 private:
  Recipe& r_;
  std::array<bool, std::size(kKeys)> seen_{};
};

std::string_view preset_line(std::string_view name) {
  for (const auto& p : recipe_presets())
    if (p.name == name) return p.line;
  return {};
}

Error not_a_recipe(std::string_view text) {
  std::string names;
  for (const auto& p : recipe_presets()) names += (names.empty() ? "" : ", ") + std::string(p.name);
  return Error("recipe '" + std::string(text) + "': expected KEY=VALUE items (a=1.4.3:10,w=...,gx=...,gw=...) or a preset: " +
               names);
}

}  // namespace

Recipe parse_recipe(std::string_view text_in) {
  const std::string_view text = trim(text_in);
  if (const std::string_view line = preset_line(text); !line.empty()) {
    Recipe r = parse_recipe(line);
    r.name = std::string(text);
    return r;
  }
  if (text.find('=') == std::string_view::npos) throw not_a_recipe(text);
  std::vector<std::string_view> items = split(text, ',');
  // A preset first, changed by the items after it.
  const std::string_view preset = preset_line(trim(items.front()));
  Recipe r = preset.empty() ? Recipe{} : parse_recipe(preset);
  if (!preset.empty()) items.erase(items.begin());
  r.name = std::string(text);
  KeySetter setter(r);
  const std::string at = "recipe '" + std::string(text) + "'";
  for (std::string_view item : items) {
    item = trim(item);
    if (item.empty()) continue;
    const std::optional<KeyValue> kv = key_value(item);
    if (!kv) throw Error(at + ": '" + std::string(item) + "' has no '='");
    const std::string_view key = trim(kv->key), value = trim(kv->value);
    if (key == "override" || key == "match")
      throw Error(at + ": per-layer overrides need a recipe file in TOML ([[override]] tables with match = \"PATTERN\"; "
                       "docs/spec.md §4.2)");
    const RecipeKey* k = find_key(key, true);
    if (!k) throw Error(at + ": unknown key '" + std::string(key) + "' (expected " + key_list(true) + ")");
    try {
      setter.set(*k, value);
    } catch (const Error& e) {
      throw Error(at + ", " + std::string(key) + ": " + e.what() + " (" + std::string(k->name) + " takes " +
                  std::string(k->takes) + ")");
    }
  }
  check_keys(r, at);
  return r;
}

namespace {

std::string where(const std::string& source, const toml::node& n) {
  return at_line(source, n.source().begin.line);
}

// A quantizer table's text: format, then /rounding[:random_bits] and /overflow.
std::string quantizer_table_text(const toml::table& t) {
  for (auto&& [k, v] : t) {
    const std::string_view kk = k.str();
    if (kk != "format" && kk != "rounding" && kk != "overflow" && kk != "random_bits")
      throw Error("unknown key '" + std::string(kk) + "' (expected format, rounding, overflow, random_bits)");
  }
  const auto fmt = t["format"].value_exact<std::string>();
  if (!fmt) throw Error("needs a 'format' string");
  std::string text = *fmt;
  const auto rounding = t["rounding"].value_exact<std::string>();
  const auto overflow = t["overflow"].value_exact<std::string>();
  const auto bits = t["random_bits"].value_exact<std::int64_t>();
  if (t.contains("rounding") && !rounding) throw Error("'rounding' must be a string");
  if (t.contains("overflow") && !overflow) throw Error("'overflow' must be a string");
  if (t.contains("random_bits") && !bits) throw Error("'random_bits' must be an integer");
  if (bits && (!rounding || parse_rounding(*rounding) != Rounding::stochastic))
    throw Error("random_bits is for stochastic rounding (rounding = \"stochastic\")");
  if (rounding) text += "/" + *rounding;
  if (bits) text += ":" + std::to_string(*bits);
  if (overflow) text += "/" + *overflow;
  return text;
}

// A TOML value as the text its key's setter reads; throws Error naming the type expected.
std::string toml_value_text(const RecipeKey& k, const toml::node& v) {
  const auto s = v.value_exact<std::string>();
  const auto b = v.value_exact<bool>();
  switch (k.toml) {
    case TomlValue::quantizer:
      if (s) return *s;
      if (const auto* t = v.as_table()) return quantizer_table_text(*t);
      throw Error("must be a format string or a table");
    case TomlValue::exemption:
      if (b) return *b ? "true" : "false";
      if (s) return *s;
      break;
    case TomlValue::boolean:
      if (b) return *b ? "true" : "false";
      break;
    case TomlValue::integer:
      if (const auto i = v.value_exact<std::int64_t>()) return std::to_string(*i);
      break;
    case TomlValue::text:
      if (s) return *s;
      if (k.name == "name") throw Error("must be a string");
      throw Error("must be a string (" + std::string(k.takes) + ")");
  }
  throw Error("must be " + std::string(k.takes));
}

// The recipe's own table: the root, or its [recipe] table with nothing beside it.
const toml::table& recipe_table(const toml::table& root, const std::string& source) {
  const toml::table* sub = root["recipe"].as_table();
  if (!sub) return root;
  for (auto&& [k, v] : root)
    if (k.str() != "recipe")
      throw Error(where(source, v) + "'" + std::string(k.str()) +
                  "' stands outside the [recipe] table: put every key of the recipe inside it");
  return *sub;
}

RecipeOverride override_from_toml(const toml::node& item, const std::string& source) {
  const auto* ot = item.as_table();
  if (!ot) throw Error(where(source, item) + "each override must be a table");
  RecipeOverride o;
  for (auto&& [ok, ov] : *ot) {
    const std::string okey(ok.str());
    if (okey == "match") {
      if (auto s = ov.value_exact<std::string>()) o.pattern = *s;
      else throw Error(where(source, ov) + "'match' must be a string");
      continue;
    }
    TensorKind kind;
    try {
      kind = parse_kind(okey);
    } catch (const Error&) {
      throw Error(where(source, ov) + "unknown key '" + okey + "' in override (expected match, a, w, gx, gw)");
    }
    try {
      o.set[static_cast<int>(kind)] = parse_kind_quant(toml_value_text(*find_key(to_string(kind), false), ov));
    } catch (const Error& e) {
      throw Error(where(source, ov) + "'" + okey + "': " + e.what());
    }
  }
  if (o.pattern.empty()) throw Error(where(source, item) + "override needs a 'match' pattern");
  return o;
}

}  // namespace

Recipe parse_recipe_toml(std::string_view text, const std::string& source) {
  const toml::table root = parse_toml(text, source);
  const toml::table& t = recipe_table(root, source);
  if (t.empty())
    throw Error(source + ": the recipe sets nothing (an empty recipe would train in float32 without a word); "
                "give each tensor kind a quantizer, e.g. a = \"1.4.3:10\", or a = \"fp32\" on purpose");
  Recipe r;
  r.name = source;
  KeySetter setter(r);
  for (auto&& [k, v] : t) {
    const std::string key(k.str());
    if (key == "override") {
      const auto* arr = v.as_array();
      if (!arr) throw Error(where(source, v) + "'override' must be an array of tables ([[override]])");
      for (auto&& item : *arr) r.overrides.push_back(override_from_toml(item, source));
      continue;
    }
    if (key == "recipe")
      throw Error(where(source, v) + "'recipe' must be the [recipe] table holding the recipe's keys (a recipe file "
                  "does not name another recipe)");
    const RecipeKey* rk = find_key(key, false);
    if (!rk)
      throw Error(where(source, v) + "unknown key '" + key + "' (expected " + key_list(false) + ", override)");
    std::string value;
    try {
      value = toml_value_text(*rk, v);
    } catch (const Error& e) {
      throw Error(where(source, v) + "'" + key + "' " + e.what());
    }
    try {
      setter.set(*rk, value);
    } catch (const Error& e) {
      throw Error(where(source, v) + "'" + key + "': " + e.what() + " (" + std::string(rk->name) + " takes " +
                  std::string(rk->takes) + ")");
    }
  }
  check_keys(r, source);
  return r;
}

namespace {
// A recipe built from fields without a name is called by its line (as a parsed line is),
// and its overrides' patterns.
std::string default_name(const Recipe& r) {
  if (r.overrides.empty()) return r.to_line();
  Recipe base = r;
  base.overrides.clear();
  std::string s = base.to_line() + "; overrides:";
  for (const auto& o : r.overrides) s += " " + o.pattern;
  return s;
}
}  // namespace

Recipe recipe_from_fields(
    const std::vector<std::pair<std::string, std::string>>& fields,
    const std::vector<std::pair<std::string, std::vector<std::pair<std::string, std::string>>>>& overrides) {
  Recipe r;
  KeySetter setter(r);
  for (const auto& [key, value] : fields) {
    const RecipeKey* k = find_key(key, false);
    if (!k) throw Error("recipe: unknown field '" + key + "' (expected " + key_list(false) + ", overrides)");
    try {
      setter.set(*k, value);
    } catch (const Error& e) {
      throw Error("recipe field '" + key + "': " + e.what() + " (" + std::string(k->name) + " takes " +
                  std::string(k->takes) + ")");
    }
  }
  for (const auto& [pattern, kinds] : overrides) {
    if (pattern.empty()) throw Error("recipe override: needs a 'match' pattern");
    RecipeOverride o;
    o.pattern = pattern;
    for (const auto& [kind, quant] : kinds) {
      try {
        o.set[static_cast<int>(parse_kind(kind))] = parse_kind_quant(quant);
      } catch (const Error& e) {
        throw Error("recipe override '" + pattern + "', " + kind + ": " + e.what());
      }
    }
    r.overrides.push_back(std::move(o));
  }
  check_keys(r, "recipe");
  if (!setter.given("name")) r.name = default_name(r);
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

namespace {

// Key `k`'s value in TOML, from its text: true/false for the switches, a number for
// hadamard, a string for the rest (an exemption's "fp32" is true).
void put_toml(toml::table& t, const RecipeKey& k, const std::string& text) {
  bool on = false;
  if (k.toml == TomlValue::boolean)
    t.insert(k.name, text != "false" && text != "0");
  else if (k.toml == TomlValue::exemption && (truth(text, on) || text == "fp32"))
    t.insert(k.name, on || text == "fp32");
  else if (k.toml == TomlValue::integer)
    t.insert(k.name, static_cast<std::int64_t>(std::stoll(text)));
  else
    t.insert(k.name, text);
}

}  // namespace

std::string Recipe::to_line() const {
  if (!overrides.empty())
    throw Error("recipe '" + name + "' has per-layer overrides, which only its TOML form holds (Recipe::to_toml)");
  std::string s;
  for (const RecipeKey& k : kKeys)
    if (const auto v = k.get(*this))
      s += (s.empty() ? "" : ",") + std::string(k.line_name.empty() ? k.name : k.line_name) + "=" + *v;
  return s;
}

std::string Recipe::to_toml() const {
  toml::table t;
  t.insert("name", name);
  for (const RecipeKey& k : kKeys)
    if (const auto v = k.get(*this)) put_toml(t, k, *v);
  toml::array arr;
  for (const RecipeOverride& o : overrides) {
    toml::table ot;
    ot.insert("match", o.pattern);
    for (TensorKind kind : kAllKinds)
      if (const auto& q = o.set[static_cast<int>(kind)]) ot.insert(to_string(kind), to_string(*q));
    arr.push_back(std::move(ot));
  }
  if (!arr.empty()) t.insert("override", std::move(arr));
  std::ostringstream out;
  out << t << "\n";
  return out.str();
}

}  // namespace fp8lab::nn
