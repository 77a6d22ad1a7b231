// Loss scaling's one-line form (loss_scale_spec.hpp): a method, then key=value items looked
// up in one table that both the parser and the printer read.
#include "fp8lab/settings/loss_scale_spec.hpp"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <optional>

#include "fp8lab/core/enum_names.hpp"
#include "fp8lab/core/format.hpp"
#include "fp8lab/core/text.hpp"

namespace fp8lab::nn {

namespace {

constexpr EnumName<LossScaleMethod> kMethods[] = {{LossScaleMethod::none, "none"},
                                                  {LossScaleMethod::fixed, "static"},
                                                  {LossScaleMethod::backoff, "backoff"},
                                                  {LossScaleMethod::logmax, "logmax"}};
constexpr EnumName<LossScaleMethod> kMethodAliases[] = {{LossScaleMethod::fixed, "fixed"}};

constexpr int kLog2Lo = -126, kLog2Hi = 127;  // scales that are normal float32 numbers

// The shortest text that reads back to `v` ("1", "0.99", "5.5e-05").
std::string number_text(double v) {
  char b[64];
  const auto r = std::to_chars(b, b + sizeof b, v);
  return std::string(b, r.ptr);
}

// Reads one value of one key of `text`; errors name both.
class ValueReader {
 public:
  ValueReader(std::string_view text, std::string_view key, std::string_view value)
      : text_(text), key_(key), value_(value) {}
  Error bad(const std::string& why) const { return Error("loss scaling '" + std::string(text_) + "': " + why); }
  double number() const {
    const auto d = parse_number(value_);
    if (!d) throw bad("'" + std::string(key_) + "' needs a number, got '" + std::string(value_) + "'");
    return *d;
  }
  // An integer in [lo, hi]: a log2 scale outside float32's exponent range, or a fraction,
  // is an error rather than a silently converted value.
  int integer(int lo, int hi) const {
    const double d = number();
    if (d != std::floor(d) || d < lo || d > hi)
      throw bad("'" + std::string(key_) + "' must be an integer in " + std::to_string(lo) + ".." + std::to_string(hi) +
                ", got '" + std::string(value_) + "'");
    return static_cast<int>(d);
  }
  int log2_scale() const { return integer(kLog2Lo, kLog2Hi); }
  // A power of two in 2..2^64, as its log2.
  int power_of_two() const {
    const double f = number(), l = std::log2(f);
    if (f < 2 || l != std::floor(l) || l > 64) throw bad("factor must be a power of two in 2..2^64");
    return static_cast<int>(l);
  }

 private:
  std::string_view text_, key_, value_;
};

// A key of the one-line form: the methods that take it, how its value is read into the
// config, and how it is written back (the printer leaves out a value equal to the
// method's default).
struct Key {
  std::string_view name;
  bool (*takes)(LossScaleMethod);
  void (*read)(LossScaleConfig&, const ValueReader&);
  std::string (*write)(const LossScaleConfig&);
};

bool any_method(LossScaleMethod) { return true; }
bool backoff_only(LossScaleMethod m) { return m == LossScaleMethod::backoff; }
bool logmax_only(LossScaleMethod m) { return m == LossScaleMethod::logmax; }

const Key kKeys[] = {
    {"init", any_method, [](LossScaleConfig& c, const ValueReader& r) { c.init_log2 = r.log2_scale(); },
     [](const LossScaleConfig& c) { return std::to_string(c.init_log2); }},
    {"interval", backoff_only, [](LossScaleConfig& c, const ValueReader& r) { c.interval = r.integer(1, 1000000000); },
     [](const LossScaleConfig& c) { return std::to_string(c.interval); }},
    {"factor", backoff_only,
     [](LossScaleConfig& c, const ValueReader& r) { c.backoff_log2_factor = r.power_of_two(); },
     [](const LossScaleConfig& c) { return number_text(std::ldexp(1.0, c.backoff_log2_factor)); }},
    {"c", logmax_only, [](LossScaleConfig& c, const ValueReader& r) { c.c = r.number(); },
     [](const LossScaleConfig& c) { return number_text(c.c); }},
    {"beta1", logmax_only, [](LossScaleConfig& c, const ValueReader& r) { c.beta1 = r.number(); },
     [](const LossScaleConfig& c) { return number_text(c.beta1); }},
    {"beta2", logmax_only, [](LossScaleConfig& c, const ValueReader& r) { c.beta2 = r.number(); },
     [](const LossScaleConfig& c) { return number_text(c.beta2); }},
    {"max", logmax_only, [](LossScaleConfig& c, const ValueReader& r) { c.grad_format_max = r.number(); },
     [](const LossScaleConfig& c) { return number_text(c.grad_format_max); }},
    {"min_log2", any_method, [](LossScaleConfig& c, const ValueReader& r) { c.min_log2 = r.log2_scale(); },
     [](const LossScaleConfig& c) { return std::to_string(c.min_log2); }},
    {"max_log2", any_method, [](LossScaleConfig& c, const ValueReader& r) { c.max_log2 = r.log2_scale(); },
     [](const LossScaleConfig& c) { return std::to_string(c.max_log2); }},
};

const Key* find_key(std::string_view name) {
  for (const Key& k : kKeys)
    if (k.name == name) return &k;
  return nullptr;
}

// The config of `m` before any key: backoff starts at 2^16.
LossScaleConfig defaults_of(LossScaleMethod m) {
  LossScaleConfig c;
  c.method = m;
  if (m == LossScaleMethod::backoff) c.init_log2 = 16;
  return c;
}

void check_consistent(const LossScaleConfig& c, const ValueReader& r) {
  if (c.beta1 <= 0 || c.beta1 >= 1 || c.beta2 <= 0 || c.beta2 >= 1) throw r.bad("betas must be in (0, 1)");
  if (c.min_log2 > c.max_log2) throw r.bad("min_log2 > max_log2");
  if (c.init_log2 < c.min_log2 || c.init_log2 > c.max_log2)
    throw r.bad("the initial log2 scale " + std::to_string(c.init_log2) + " is outside min_log2..max_log2 (" +
                std::to_string(c.min_log2) + ".." + std::to_string(c.max_log2) + ")");
  if (c.method == LossScaleMethod::logmax && !(c.grad_format_max > 0)) throw r.bad("'max' must be > 0");
}

}  // namespace

std::string_view to_string(LossScaleMethod m) { return enum_name(kMethods, m); }

LossScaleConfig parse_loss_scale(std::string_view text) {
  const std::size_t colon = text.find(':');
  const std::string_view method = text.substr(0, colon);
  const ValueReader whole(text, "", "");
  const auto m = enum_find(kMethods, std::string(method), kMethodAliases);
  if (!m) throw whole.bad("unknown method '" + std::string(method) + "' (expected " + enum_names(kMethods) + ")");
  LossScaleConfig c = defaults_of(*m);
  if (colon == std::string_view::npos) return c;
  for (const std::string_view item : split(text.substr(colon + 1), ',')) {
    if (item.empty()) continue;
    const std::optional<KeyValue> kv = key_value(item);
    if (!kv) {
      if (c.method != LossScaleMethod::fixed) throw whole.bad("'" + std::string(item) + "' is not key=value");
      c.init_log2 = ValueReader(text, "log2 scale", item).log2_scale();  // "static:22"
      continue;
    }
    const Key* k = find_key(kv->key);
    if (!k || !k->takes(c.method))
      throw whole.bad("unknown key '" + std::string(kv->key) + "' for " + std::string(method));
    k->read(c, ValueReader(text, kv->key, kv->value));
  }
  check_consistent(c, whole);
  return c;
}

std::string to_string(const LossScaleConfig& c) {
  std::string s(to_string(c.method)), items;
  const LossScaleConfig d = defaults_of(c.method);
  for (const Key& k : kKeys) {
    if (!k.takes(c.method)) continue;
    const std::string v = k.write(c);
    if (v == k.write(d)) continue;
    if (c.method == LossScaleMethod::fixed && k.name == "init") {
      s += ":" + v;  // "static:22"
      continue;
    }
    items += (items.empty() ? "" : ",") + std::string(k.name) + "=" + v;
  }
  if (items.empty()) return s;
  return s + (s.find(':') == std::string::npos ? ":" : ",") + items;
}

LossScaleConfig with_recipe_target(LossScaleConfig c, const Recipe& recipe) {
  const auto& g = recipe.base[TensorKind::gx];
  if (c.method == LossScaleMethod::logmax && g && !g->scaled()) c.grad_format_max = g->element.format.max_finite();
  return c;
}

bool backoff_blind_to_overflow(const LossScaleConfig& c, const Recipe& recipe) {
  const auto& g = recipe.base[TensorKind::gx];
  return c.method == LossScaleMethod::backoff && g && !g->scaled() && g->element.overflow == Overflow::saturate;
}

}  // namespace fp8lab::nn
