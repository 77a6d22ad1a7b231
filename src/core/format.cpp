#include "fp8lab/core/format.hpp"

#include "fp8lab/core/enum_names.hpp"
#include "fp8lab/core/text.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <string>

namespace fp8lab {

namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool parse_int(std::string_view s, int& out) {
  if (s.empty()) return false;
  if (s.front() == '+') s.remove_prefix(1);
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && p == s.data() + s.size();
}

// Each value with its name (what to_string prints, and parse accepts), then the other
// spellings the parsers accept; parsing ignores case and surrounding space.
constexpr EnumName<Policy> kPolicies[] = {
    {Policy::fnuz, "fnuz"}, {Policy::fn, "fn"}, {Policy::ieee, "ieee"}, {Policy::finite, "finite"}};
constexpr EnumName<Rounding> kRoundings[] = {
    {Rounding::nearest_even, "nearest-even"}, {Rounding::toward_zero, "toward-zero"}, {Rounding::stochastic, "stochastic"},
    {Rounding::nearest_away, "nearest-away"}};
constexpr EnumName<Rounding> kRoundingAliases[] = {
    {Rounding::nearest_even, "nearest_even"}, {Rounding::nearest_even, "ne"},  {Rounding::nearest_even, "rne"},
    {Rounding::nearest_even, "nearest"},      {Rounding::toward_zero, "toward_zero"}, {Rounding::toward_zero, "tz"},
    {Rounding::toward_zero, "rtz"},           {Rounding::toward_zero, "truncate"},    {Rounding::stochastic, "sr"},
    {Rounding::nearest_away, "nearest_away"}, {Rounding::nearest_away, "rna"},        {Rounding::nearest_away, "away"}};
constexpr EnumName<Overflow> kOverflows[] = {{Overflow::saturate, "saturate"}, {Overflow::nan, "nan"}, {Overflow::inf, "inf"}};
constexpr EnumName<Overflow> kOverflowAliases[] = {{Overflow::saturate, "clip"}, {Overflow::saturate, "sat"}};

// The value `s` names in `names` or `aliases`, in any case and with space around; the
// error quotes `s` as given.
template <class E, std::size_t N>
E parse_named(const EnumName<E> (&names)[N], std::string_view s, const char* what, EnumAliases<E> aliases = {}) {
  if (const auto v = enum_find(names, lower(trim(s)), aliases)) return *v;
  throw enum_unknown(names, s, what);
}

}  // namespace

std::string_view to_string(Policy p) { return enum_name(kPolicies, p); }
std::string_view to_string(Rounding r) { return enum_name(kRoundings, r); }
std::string_view to_string(Overflow o) { return enum_name(kOverflows, o); }

Policy parse_policy(std::string_view s) { return parse_named(kPolicies, s, "special-value policy"); }
Rounding parse_rounding(std::string_view s) { return parse_named(kRoundings, s, "rounding", kRoundingAliases); }
Overflow parse_overflow(std::string_view s) { return parse_named(kOverflows, s, "overflow mode", kOverflowAliases); }

int natural_bias(int exp_bits) {
  // Outside 1..30 there is no natural bias to compute (make_format rejects E > 8 anyway).
  return exp_bits <= 0 || exp_bits > 30 ? 0 : (1 << (exp_bits - 1)) - 1;
}

namespace {
// The field ranges, checked before the fields are narrowed into a Format and again by
// validate().
void check_field_ranges(int E, int M, int bias) {
  if (E < 0 || E > kMaxExpBits)
    throw Error("exponent bits E must be in 0.." + std::to_string(kMaxExpBits) + " (got " +
                std::to_string(E) + ")");
  if (M < 0 || M > kMaxManBits)
    throw Error("mantissa bits M must be in 0.." + std::to_string(kMaxManBits) + " (got " +
                std::to_string(M) + ")");
  if (bias < -kMaxAbsBias || bias > kMaxAbsBias)
    throw Error("bias must be in -" + std::to_string(kMaxAbsBias) + ".." +
                std::to_string(kMaxAbsBias) + " (got " + std::to_string(bias) + ")");
}
}  // namespace

void validate(const Format& f) {
  const int E = f.exp_bits, M = f.man_bits;
  check_field_ranges(E, M, f.bias);
  if ((f.policy == Policy::ieee || f.policy == Policy::fn) && E < 1)
    throw Error("policy " + std::string(to_string(f.policy)) +
                " needs at least one exponent bit (E >= 1)");
  if (f.policy == Policy::ieee && M < 1)
    throw Error("policy ieee needs M >= 1: its NaN codes have a non-zero mantissa");
  if (!f.subnormals && E < 1)
    throw Error("subnormals off needs E >= 1: a scaled integer (E = 0) has no exponent field");
  if (!f.sign && f.policy == Policy::fnuz)
    throw Error("policy fnuz puts its NaN at the sign bit, which an unsigned format (0.E.M) lacks: use fn, ieee "
                "or finite");
  if (!f.sign && E + M < 1) throw Error("an unsigned format needs E + M >= 1");
  if (!f.zero && f.sign) throw Error("nozero is for unsigned formats (0.E.M): a signed format keeps its zero");
  if (!f.zero && f.subnormals)
    throw Error("nozero (code 0 is 2^-bias) needs subnormals off (nosub): with subnormals code 0 is zero");
  if (f.max_code() < 1 && f.zero)
    throw Error("format has no positive finite value (1." + std::to_string(E) + "." +
                std::to_string(M) + " under policy " + std::string(to_string(f.policy)) + ")");
}

Format make_format(int exp_bits, int man_bits, int bias, Policy policy, bool subnormals, bool sign, bool zero) {
  check_field_ranges(exp_bits, man_bits, bias);  // before narrowing into the compact fields
  Format f;
  f.exp_bits = static_cast<std::int8_t>(exp_bits);
  f.man_bits = static_cast<std::int8_t>(man_bits);
  f.bias = static_cast<std::int16_t>(bias);
  f.policy = policy;
  f.subnormals = subnormals;
  f.sign = sign;
  f.zero = zero;
  validate(f);
  return f;
}

std::uint32_t Format::max_code() const {
  if (exp_bits < 0 || man_bits < 0 || exp_bits + man_bits > 31) return 0;
  const std::uint32_t all = (exp_bits + man_bits == 0) ? 0u : mag_mask();
  switch (policy) {
    case Policy::fnuz:
    case Policy::finite: return all;
    case Policy::fn: return all == 0 ? 0 : all - 1;
    case Policy::ieee: {
      const std::uint32_t exp_ones = (1u << exp_bits) - 1;
      return exp_bits == 0 ? 0 : (exp_ones << man_bits) - 1;
    }
  }
  return 0;
}

std::uint32_t Format::nan_code(bool negative) const {
  const std::uint32_t s = negative ? sign_bit() : 0;
  switch (policy) {
    case Policy::fnuz: return sign_bit();  // the "negative zero" code
    case Policy::fn: return s | mag_mask();
    case Policy::ieee: {
      const std::uint32_t exp_ones = (1u << exp_bits) - 1;
      return s | (exp_ones << man_bits) | (1u << (man_bits - 1));  // quiet NaN: mantissa MSB
    }
    case Policy::finite: return 0;  // no NaN: encoding stores +0 and counts it
  }
  return 0;
}

std::uint32_t Format::inf_code(bool negative) const {
  const std::uint32_t exp_ones = (1u << exp_bits) - 1;
  return (negative ? sign_bit() : 0) | (exp_ones << man_bits);
}

double Format::magnitude(std::uint32_t c) const {
  const int M = man_bits;
  const std::uint32_t e = c >> M;
  const std::uint32_t m = c & ((1u << M) - 1);
  if (exp_bits == 0 || (subnormals && e == 0))
    return std::ldexp(static_cast<double>(m), 1 - bias - M);
  if (c == 0) return zero ? 0.0 : std::ldexp(1.0, -bias);  // subnormals off: zero, or 2^-bias
  return std::ldexp(static_cast<double>((1u << M) + m), static_cast<int>(e) - bias - M);
}

double Format::min_normal() const {
  if (exp_bits == 0) return 0.0;
  if (subnormals) return std::ldexp(1.0, 1 - bias);
  return magnitude(min_code());
}

std::uint64_t Format::finite_count() const {
  const std::uint64_t mags = static_cast<std::uint64_t>(max_code()) + 1;  // including zero
  if (!sign) return mags;
  return signed_zero() ? 2 * mags : 2 * mags - 1;
}

Format::Class Format::classify(std::uint32_t code) const {
  const std::uint32_t mag = code & mag_mask();
  const std::uint32_t e = mag >> man_bits;
  const std::uint32_t m = mag & ((1u << man_bits) - 1);
  switch (policy) {
    case Policy::fnuz:
      if (code == sign_bit()) return Class::nan;
      break;
    case Policy::fn:
      if (mag == mag_mask()) return Class::nan;
      break;
    case Policy::ieee:
      if (e == (1u << exp_bits) - 1) return m == 0 ? Class::inf : Class::nan;
      break;
    case Policy::finite: break;
  }
  if (mag == 0 && zero) return Class::zero;
  if (exp_bits == 0 || (subnormals && e == 0)) return Class::subnormal;
  return Class::normal;
}

const std::vector<Preset>& presets() {
  static const std::vector<Preset> p = [] {
    auto mk = [](int E, int M, int b, Policy pol, bool sub = true) {
      return make_format(E, M, b, pol, sub);
    };
    auto scale = [](int E, int M, int b, Policy pol, bool sub, bool zero) {
      return make_format(E, M, b, pol, sub, false, zero);
    };
    return std::vector<Preset>{
        {"e4m3fnuz", mk(4, 3, 8, Policy::fnuz), "1.4.3 bias 8, one NaN (0x80), no Inf, max 240"},
        {"e4m3b11fnuz", mk(4, 3, 11, Policy::fnuz), "1.4.3 bias 11, one NaN, max 30"},
        {"e5m2fnuz", mk(5, 2, 16, Policy::fnuz), "1.5.2 bias 16, one NaN, max 57344"},
        {"e4m3fn", mk(4, 3, 7, Policy::fn), "OCP E4M3: NaN 0x7f/0xff, no Inf, max 448"},
        {"e5m2", mk(5, 2, 15, Policy::ieee), "OCP E5M2 / IEEE-style, max 57344"},
        {"e3m4", mk(3, 4, 3, Policy::ieee), "IEEE-style 1.3.4, max 15.5"},
        {"e2m3fn", mk(2, 3, 1, Policy::finite), "OCP MX FP6 E2M3, finite only, max 7.5"},
        {"e3m2fn", mk(3, 2, 3, Policy::finite), "OCP MX FP6 E3M2, finite only, max 28"},
        {"e2m1fn", mk(2, 1, 1, Policy::finite), "OCP MX FP4 E2M1, finite only, max 6"},
        {"fp16", mk(5, 10, 15, Policy::ieee), "IEEE binary16"},
        {"bf16", mk(8, 7, 127, Policy::ieee), "bfloat16"},
        {"fp32", mk(8, 23, 127, Policy::ieee), "IEEE binary32 (analysis only: 32 bits wide)"},
        {"dlfloat16", mk(6, 9, 31, Policy::fn, false),
         "DLFloat 1.6.9 bias 31, no subnormals, one NaN/Inf code per sign"},
        {"e8m0", scale(8, 0, 127, Policy::fn, false, false),
         "OCP MX scale 0.8.0: 2^-127..2^127, NaN 0xff, no zero, no sign"},
        {"ue4m3", scale(4, 3, 7, Policy::fn, true, true), "NVFP4 block scale: unsigned E4M3, NaN 0x7f, max 448"},
    };
  }();
  return p;
}

std::string_view preset_name(const Format& f) {
  for (const auto& p : presets())
    if (p.format == f) return p.name;
  return {};
}

std::string to_string(const Format& f) {
  std::string s = (f.sign ? "1." : "0.") + std::to_string(f.exp_bits) + "." + std::to_string(f.man_bits);
  if (f.bias != natural_bias(f.exp_bits)) s += ":" + std::to_string(f.bias);
  if (f.policy != Policy::fnuz) s += ":" + std::string(to_string(f.policy));
  if (!f.subnormals) s += ":nosub";
  if (!f.zero) s += ":nozero";
  return s;
}

namespace {

// A preset's format by name (any case), or an Error listing the presets.
Format preset_format(std::string_view text, const std::string& where) {
  const std::string l = lower(text);
  for (const auto& p : presets())
    if (p.name == l) return p.format;
  std::string names;
  for (const auto& p : presets()) names += (names.empty() ? "" : ", ") + std::string(p.name);
  throw Error(where + "unknown preset; expected 1.E.M or 0.E.M[:bias][:policy][:nosub][:nozero] or one of " + names);
}

// "S.E.M": the sign, exponent and mantissa fields.
std::array<int, 3> sign_exponent_mantissa(std::string_view head, const std::string& where) {
  const std::vector<std::string_view> pieces = split(head, '.');
  std::array<int, 3> fields{};
  if (pieces.size() != 3)
    throw Error(where + "expected S.E.M (sign bit 1 or 0, exponent and mantissa bits), e.g. 1.4.3");
  for (std::size_t i = 0; i < 3; ++i)
    if (!parse_int(pieces[i], fields[i]))
      throw Error(where + "expected S.E.M (sign bit 1 or 0, exponent and mantissa bits), e.g. 1.4.3");
  if (fields[0] != 0 && fields[0] != 1) throw Error(where + "the sign field is 1 bit (1.E.M) or none (0.E.M, unsigned)");
  return fields;
}

// The fields after the first ':' (bias, policy, nosub, nozero), each at most once.
struct FormatFields {
  int bias;
  Policy policy = Policy::fnuz;
  bool subnormals = true, zero = true;
  bool seen_bias = false, seen_policy = false, seen_sub = false, seen_zero = false;

  void take(std::string_view tok, const std::string& where) {
    const std::string l = lower(tok);
    int v = 0;
    if (tok.front() == '-' || tok.front() == '+' || std::isdigit(static_cast<unsigned char>(tok.front()))) {
      if (!parse_int(tok, v)) throw Error(where + "bias '" + std::string(tok) + "' is not an integer");
      once(seen_bias, where, "bias");
      bias = v;
    } else if (l == "nosub" || l == "sub") {
      once(seen_sub, where, "subnormal flag");
      subnormals = l == "sub";
    } else if (l == "nozero" || l == "zero") {
      once(seen_zero, where, "zero flag");
      zero = l == "zero";
    } else {
      Policy named;
      try {
        named = parse_policy(tok);
      } catch (const Error&) {
        throw Error(where + "unknown field '" + std::string(tok) +
                    "': expected a bias (integer), a policy (fnuz, fn, ieee, finite), nosub or nozero");
      }
      once(seen_policy, where, "policy");
      policy = named;
    }
  }
  static void once(bool& seen, const std::string& where, const char* what) {
    if (seen) throw Error(where + what + " given twice");
    seen = true;
  }
};

}  // namespace

Format parse_format(std::string_view text_in) {
  const std::string_view text = trim(text_in);
  const std::string where = "format '" + std::string(text_in) + "': ";
  if (text.empty()) throw Error("empty format: expected 1.E.M or 0.E.M (unsigned), then [:bias][:policy][:nosub][:nozero], or a preset");
  if (!std::isdigit(static_cast<unsigned char>(text.front()))) return preset_format(text, where);
  const std::vector<std::string_view> parts = split(text, ':');
  const std::array<int, 3> sem = sign_exponent_mantissa(parts[0], where);
  FormatFields f{natural_bias(sem[1])};
  for (std::size_t i = 1; i < parts.size(); ++i) {
    const std::string_view tok = trim(parts[i]);
    if (tok.empty() && i == 1) continue;  // "1.4.3::fn" leaves the bias natural
    if (tok.empty()) throw Error(where + "empty field after ':'");
    f.take(tok, where);
  }
  try {
    return make_format(sem[1], sem[2], f.bias, f.policy, f.subnormals, sem[0] == 1, f.zero);
  } catch (const Error& e) {
    throw Error(where + e.what());
  }
}

void validate(const QuantSpec& q) {
  validate(q.format);
  if (q.overflow == Overflow::inf && !q.format.has_inf())
    throw Error("overflow mode 'inf' needs a format with Inf (policy ieee); " +
                to_string(q.format) + " has none: use saturate or nan");
  if (q.random_bits < 1 || q.random_bits > 32)
    throw Error("random bits for stochastic rounding must be in 1..32 (got " +
                std::to_string(q.random_bits) + ")");
}

const std::vector<std::string_view>& table1_format_names() {
  static const std::vector<std::string_view> names = {"fp32", "fp16", "bf16", "dlfloat16", "1.5.2", "1.4.3", "1.3.4"};
  return names;
}

}  // namespace fp8lab
