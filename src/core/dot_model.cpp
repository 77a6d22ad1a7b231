// The dot-product hardware model (docs/spec.md §7.4), on integers: each float32 operand is
// m * 2^e with |m| < 2^24, a product is exact as m_a m_b * 2^(e_a + e_b), and a group's
// terms, aligned to 2^(emax - F), are summed exactly in a 64-bit (F <= 55) or 128-bit
// integer before the one rounding into the accumulator.
#include "fp8lab/core/dot_model.hpp"

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>

#include "fp8lab/core/dot_model_detail.hpp"
#include "fp8lab/core/error.hpp"
#include "fp8lab/core/text.hpp"

namespace fp8lab {

namespace dot_detail {

Split split(float x) {
  std::uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  const int field = static_cast<int>((bits >> 23) & 0xff);
  const auto frac = static_cast<std::int32_t>(bits & 0x7fffff);
  Split s;
  if (field == 0xff) {
    s.special = frac ? Special::nan : Special::inf;
    s.m = (bits >> 31) ? -1 : 1;
    return s;
  }
  const std::int32_t mag = field ? frac | (1 << 23) : frac;
  s.m = (bits >> 31) ? -mag : mag;
  s.e = (field ? field : 1) - 127 - 23;
  return s;
}

namespace {

using u128 = unsigned __int128;

int bit_length(u128 u) {
  const auto hi = static_cast<std::uint64_t>(u >> 64);
  return hi ? 128 - std::countl_zero(hi) : 64 - std::countl_zero(static_cast<std::uint64_t>(u));
}

// The largest finite value of a W-bit accumulator with float32's exponent range.
double acc_max(int w) { return std::ldexp(std::ldexp(1.0, w) - 1, 128 - w); }

}  // namespace

float round_into_accumulator(__int128 sum, int q, const DotModel& m) {
  if (sum == 0) return 0.0f;
  const bool negative = sum < 0;
  const u128 u = negative ? -static_cast<u128>(sum) : static_cast<u128>(sum);
  const int lead = bit_length(u) - 1 + q;  // floor(log2 |sum * 2^q|)
  const int qexp = std::max(lead - (m.acc_bits - 1), -149);
  const int shift = qexp - q;
  u128 keep = u;
  if (shift > 0) {
    u128 rem = 0, half = 0;
    bool above_half = false, at_half = false;
    if (shift >= 128) {  // u < 2^128 <= 2^shift: below one quantum
      keep = 0;
      above_half = shift == 128 && u > (u128{1} << 127);
      at_half = shift == 128 && u == (u128{1} << 127);
    } else {
      keep = u >> shift;
      rem = u & ((u128{1} << shift) - 1);
      half = u128{1} << (shift - 1);
      above_half = rem > half;
      at_half = rem == half;
    }
    if (m.acc_nearest && (above_half || (at_half && (keep & 1)))) ++keep;
  }
  const double mag = std::ldexp(static_cast<double>(keep), shift > 0 ? qexp : q);
  const double limit = acc_max(m.acc_bits);
  const double v = mag > limit ? (m.acc_nearest ? HUGE_VAL : limit) : mag;
  return static_cast<float>(negative ? -v : v);
}

namespace {

// One group's exact aligned sum, in units of 2^q (q = emax - F), in the integer type I.
template <class I>
I aligned_sum(const std::int64_t* pm, const int* pe, int terms, int q, bool nearest) {
  I sum = 0;
  for (int i = 0; i < terms; ++i) {
    if (!pm[i]) continue;
    const std::uint64_t mag = static_cast<std::uint64_t>(pm[i] < 0 ? -pm[i] : pm[i]);
    const int shift = pe[i] - q;
    I t;
    if (shift >= 0) {
      t = static_cast<I>(mag) << shift;
    } else if (-shift >= 64) {
      t = 0;  // |term| < 2^48 units of 2^pe: far below half a unit of 2^q
    } else {
      const int s = -shift;
      std::uint64_t k = mag >> s;
      if (nearest) {
        const std::uint64_t rem = mag & ((std::uint64_t{1} << s) - 1), half = std::uint64_t{1} << (s - 1);
        if (rem > half || (rem == half && (k & 1))) ++k;
      }
      t = static_cast<I>(k);
    }
    sum += pm[i] < 0 ? -t : t;
  }
  return sum;
}

}  // namespace

bool any_special(const Split* x, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i)
    if (x[i].special != Special::none) return true;
  return false;
}

float model_dot(const Split* a, const Split* b, std::int64_t n, const DotModel& m, bool specials) {
  // Special values first: the sum is NaN or an infinity whatever the model.
  bool nan = false, pos_inf = false, neg_inf = false;
  for (std::int64_t i = 0; specials && i < n; ++i) {
    if (a[i].special == Special::none && b[i].special == Special::none) continue;
    if (a[i].special == Special::nan || b[i].special == Special::nan || a[i].m == 0 || b[i].m == 0) {
      nan = true;
      break;
    }
    ((a[i].m < 0) != (b[i].m < 0) ? neg_inf : pos_inf) = true;
  }
  if (nan || (pos_inf && neg_inf)) return std::numeric_limits<float>::quiet_NaN();
  if (pos_inf || neg_inf) return pos_inf ? HUGE_VALF : -HUGE_VALF;

  std::int64_t pm[kMaxDotGroup + 1];
  int pe[kMaxDotGroup + 1];
  float acc = 0.0f, outer = 0.0f;
  std::int64_t since_promotion = 0;
  for (std::int64_t start = 0; start < n; start += m.group) {
    const int len = static_cast<int>(std::min<std::int64_t>(m.group, n - start));
    int terms = 0, emax = std::numeric_limits<int>::min();
    const auto add_term = [&](std::int64_t mant, int exp) {
      pm[terms] = mant;
      pe[terms] = exp;
      ++terms;
      if (mant) emax = std::max(emax, exp + 63 - std::countl_zero(static_cast<std::uint64_t>(mant < 0 ? -mant : mant)));
    };
    for (int i = 0; i < len; ++i)
      add_term(std::int64_t{a[start + i].m} * b[start + i].m, a[start + i].e + b[start + i].e);
    const Split c = split(acc);
    add_term(c.m, c.e);
    if (emax == std::numeric_limits<int>::min()) {
      acc = 0.0f;  // every term zero
    } else {
      const int q = emax - m.frac;
      const __int128 sum = m.frac <= 55 ? __int128{aligned_sum<std::int64_t>(pm, pe, terms, q, m.align_nearest)}
                                        : aligned_sum<__int128>(pm, pe, terms, q, m.align_nearest);
      acc = round_into_accumulator(sum, q, m);
    }
    since_promotion += len;
    if (m.promote > 0 && (since_promotion == m.promote || start + len == n)) {
      outer += acc;  // float32, nearest-even
      acc = 0.0f;
      since_promotion = 0;
    }
  }
  return m.promote > 0 ? outer : acc;
}

}  // namespace dot_detail

void validate(const DotModel& m) {
  const auto bad = [](const std::string& what) { throw Error("dot model: " + what); };
  if (m.group < 1 || m.group > kMaxDotGroup) bad("group " + std::to_string(m.group) + " is out of range 1.." + std::to_string(kMaxDotGroup));
  if (m.frac < 0 || m.frac > kMaxDotFrac) bad("frac " + std::to_string(m.frac) + " is out of range 0.." + std::to_string(kMaxDotFrac));
  if (m.acc_bits < 1 || m.acc_bits > 24) bad("acc " + std::to_string(m.acc_bits) + " is out of range 1..24");
  if (m.promote < 0 || (m.promote > 0 && m.promote % m.group != 0))
    bad("promote " + std::to_string(m.promote) + " must be 0 (never) or a positive multiple of group " + std::to_string(m.group));
}

float model_dot(const float* a, std::ptrdiff_t a_stride, const float* b, std::ptrdiff_t b_stride, std::int64_t n,
                const DotModel& m) {
  std::vector<dot_detail::Split> sa(static_cast<std::size_t>(n)), sb(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    sa[static_cast<std::size_t>(i)] = dot_detail::split(a[i * a_stride]);
    sb[static_cast<std::size_t>(i)] = dot_detail::split(b[i * b_stride]);
  }
  return dot_detail::model_dot(sa.data(), sb.data(), n, m);
}

}  // namespace fp8lab

// --- names ---------------------------------------------------------------------------------

namespace fp8lab {

const std::vector<DotPreset>& dot_presets() {
  // Sources and how sure each figure is: docs/spec.md §7.4.
  static const std::vector<DotPreset> presets = {
      {"hopper-fp8", {.group = 32, .frac = 13, .align_nearest = false, .acc_bits = 14, .acc_nearest = false, .promote = 0},
       "an FP8 tensor-core product on Hopper (H100/H200), accumulated whole in the tensor core"},
      {"hopper-fp8-promote128",
       {.group = 32, .frac = 13, .align_nearest = false, .acc_bits = 14, .acc_nearest = false, .promote = 128},
       "the same with DeepSeek-V3's promotion of the partial sum to float32 every 128 products"},
      {"blackwell", {.group = 32, .frac = 25, .align_nearest = false, .acc_bits = 24, .acc_nearest = false, .promote = 0},
       "an FP8/FP6/FP4 tensor-core product on Blackwell"},
      {"ocp-mx", {.group = 32, .frac = 100, .align_nearest = false, .acc_bits = 24, .acc_nearest = true, .promote = 32},
       "the OCP MX v1.0 dot product: each 32-element block exact, rounded to float32, blocks added in float32 in order"},
  };
  return presets;
}

namespace {

std::string_view rounding_name(bool nearest) { return nearest ? "nearest" : "truncate"; }

// One key of the general form: its name and how it sets the model from its value text.
struct DotKey {
  std::string_view name;
  void (*set)(DotModel&, std::string_view value, const std::string& where);
};

std::int64_t integer_value(std::string_view v, const std::string& where) {
  const auto n = parse_integer(v);
  if (!n) throw Error(where + "'" + std::string(v) + "' is not an integer");
  return *n;
}

bool rounding_value(std::string_view v, const std::string& where) {
  if (v == "nearest") return true;
  if (v == "truncate") return false;
  throw Error(where + "'" + std::string(v) + "' is not a rounding (expected truncate or nearest)");
}

int small_integer(std::string_view v, const std::string& where) {
  const std::int64_t n = integer_value(v, where);
  if (n < -1000 || n > 1000) throw Error(where + std::to_string(n) + " is out of range");
  return static_cast<int>(n);
}

constexpr DotKey kDotKeys[] = {
    {"group", [](DotModel& m, std::string_view v, const std::string& w) { m.group = small_integer(v, w); }},
    {"frac", [](DotModel& m, std::string_view v, const std::string& w) { m.frac = small_integer(v, w); }},
    {"align", [](DotModel& m, std::string_view v, const std::string& w) { m.align_nearest = rounding_value(v, w); }},
    {"acc", [](DotModel& m, std::string_view v, const std::string& w) { m.acc_bits = small_integer(v, w); }},
    {"acc_round", [](DotModel& m, std::string_view v, const std::string& w) { m.acc_nearest = rounding_value(v, w); }},
    {"promote", [](DotModel& m, std::string_view v, const std::string& w) { m.promote = integer_value(v, w); }},
};

std::string preset_names() {
  std::string o;
  for (const auto& p : dot_presets()) o += (o.empty() ? "" : ", ") + std::string(p.name);
  return o;
}

}  // namespace

std::string to_string(const DotModel& m) {
  for (const auto& p : dot_presets())
    if (p.model == m) return std::string(p.name);
  return "dot:group=" + std::to_string(m.group) + ":frac=" + std::to_string(m.frac) + ":align=" +
         std::string(rounding_name(m.align_nearest)) + ":acc=" + std::to_string(m.acc_bits) + ":acc_round=" +
         std::string(rounding_name(m.acc_nearest)) + ":promote=" + std::to_string(m.promote);
}

DotModel parse_dot_model(std::string_view text) {
  for (const auto& p : dot_presets())
    if (p.name == text) return p.model;
  const std::string whole = "dot model '" + std::string(text) + "': ";
  constexpr std::string_view kPrefix = "dot:";
  if (text.substr(0, kPrefix.size()) != kPrefix)
    throw Error(whole + "expected a preset (" + preset_names() + ") or dot:KEY=VALUE:... (keys group, frac, align, acc, "
                "acc_round, promote)");
  DotModel m;
  std::vector<std::string_view> seen;
  for (const std::string_view item : split(text.substr(kPrefix.size()), ':')) {
    const auto kv = key_value(trim(item));
    if (!kv) throw Error(whole + "expected KEY=VALUE, got '" + std::string(item) + "'");
    const std::string_view key = trim(kv->key);
    const DotKey* found = nullptr;
    for (const DotKey& k : kDotKeys)
      if (k.name == key) found = &k;
    if (!found) throw Error(whole + "unknown key '" + std::string(key) + "' (expected group, frac, align, acc, acc_round, promote)");
    if (std::find(seen.begin(), seen.end(), key) != seen.end()) throw Error(whole + "'" + std::string(key) + "' given twice");
    seen.push_back(key);
    found->set(m, trim(kv->value), whole + std::string(key) + ": ");
  }
  try {
    validate(m);
  } catch (const Error& e) {
    throw Error(whole + e.what());
  }
  return m;
}

}  // namespace fp8lab
