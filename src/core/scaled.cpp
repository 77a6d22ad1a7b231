// Scaled quantization as specified in docs/spec.md §6: the notation, the presets, the choice
// of a group's scale, and the scalar reference quantizer.
#include "fp8lab/core/scaled.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>

#include "fp8lab/core/enum_names.hpp"
#include "fp8lab/core/text.hpp"

namespace fp8lab {

// ---- names ---------------------------------------------------------------------------

namespace {

constexpr EnumName<Granularity> kGranularities[] = {
    {Granularity::tensor, "tensor"}, {Granularity::line, "line"}, {Granularity::block, "block"}, {Granularity::tile, "tile"}};
// The scale formats a spec may name: all but none (a spec without scales names none).
constexpr EnumName<ScaleFormat> kScaleFormats[] = {
    {ScaleFormat::e8m0, "e8m0"}, {ScaleFormat::ue4m3, "ue4m3"}, {ScaleFormat::fp32, "fp32"}};
constexpr EnumName<ScaleRule> kScaleRules[] = {
    {ScaleRule::floor, "floor"}, {ScaleRule::ceil, "ceil"}, {ScaleRule::nearest, "nearest"}};
// The option of Four Over Six (docs/spec.md §6.10), its second target and the largest block
// scale its tensor scale leaves room for (the published choice: 256, so that 1.5 times it
// stays below UE4M3's 448).
constexpr const char* kFourOverSix = "4over6";
constexpr const char* kDitherScale = "dither-scale";
constexpr double kFourOverSixTarget = 4.0;
constexpr double kFourOverSixScaleTop = 256.0;
constexpr EnumName<ScaleArithmetic> kArithmetics[] = {{ScaleArithmetic::exact, "exact"},
                                                      {ScaleArithmetic::torchao, "torchao"},
                                                      {ScaleArithmetic::te, "te"},
                                                      {ScaleArithmetic::quartet, "quartet"}};
constexpr std::string_view kEden = "eden-";

}  // namespace

std::string_view to_string(Granularity g) { return enum_name(kGranularities, g); }
std::string_view to_string(ScaleFormat s) { return s == ScaleFormat::none ? "none" : enum_name(kScaleFormats, s); }
std::string_view to_string(ScaleRule r) { return enum_name(kScaleRules, r); }
std::string_view to_string(ScaleArithmetic a) { return enum_name(kArithmetics, a); }

ScaleFormat parse_scale_format(std::string_view s) {
  return enum_parse(kScaleFormats, trim(s), "scale format");
}

ScaleRule parse_scale_rule(std::string_view s) { return enum_parse(kScaleRules, trim(s), "scale rule"); }

// ---- validation ----------------------------------------------------------------------

void validate(const ScaledSpec& s) {
  validate(s.element);
  const std::string what = "scaled quantizer '" + to_string(s) + "': ";
  if (!s.scaled()) {
    if (s.granularity != Granularity::tensor || s.block != 0 || s.tensor_scale || s.history != 0)
      throw Error(what + "a fixed-bias quantizer has no groups, tensor scale or history");
    return;
  }
  const Format& e = s.element.format;
  if (e.width() > 8) throw Error(what + "the element format must be 8 bits wide or less");
  if (std::abs(e.bias) > 256) throw Error(what + "the element format's bias must be in [-256, 256]");
  if (s.element.overflow != Overflow::saturate)
    throw Error(what + "scaled elements saturate (the OCP MX rule); overflow '" +
                std::string(to_string(s.element.overflow)) + "' does not apply");
  const bool sized = s.granularity == Granularity::block || s.granularity == Granularity::tile;
  if (sized && (s.block < 1 || s.block > kMaxBlock))
    throw Error(what + "the block size must be in 1.." + std::to_string(kMaxBlock));
  if (!sized && s.block != 0) throw Error(what + "only blocks and tiles have a size");
  if (s.fold_tensor_scale && !s.tensor_scale)
    throw Error(what + "the tensor scale is folded into the values, but there is no tensor scale");
  if (s.fold_scales && s.scale != ScaleFormat::fp32)
    throw Error(what + "scales-folded needs float32 group scales (e8m0 and ue4m3 scales are exact in the values)");
  if (s.tensor_scale && s.scale != ScaleFormat::e8m0 && s.scale != ScaleFormat::ue4m3)
    throw Error(what + "a tensor scale needs e8m0 or ue4m3 group scales");
  if (s.history < 0 || s.history > kMaxHistory)
    throw Error(what + "the amax history must be in 0.." + std::to_string(kMaxHistory));
  if (s.history > 0 && s.granularity != Granularity::tensor && !s.tensor_scale)
    throw Error(what + "delayed scaling needs one scale per tensor or a tensor scale");
  if (s.arithmetic == ScaleArithmetic::torchao && (s.scale != ScaleFormat::ue4m3 || s.rule != ScaleRule::nearest))
    throw Error(what + "torchao's arithmetic is that of its NVFP4 quantizer: ue4m3 scales rounded to nearest "
                       "(its MX quantizer is fp8lab's floor and ceil rules, docs/spec.md §6.9)");
  if (s.arithmetic == ScaleArithmetic::te) {
    const bool current_scaling = s.scale == ScaleFormat::fp32 && !s.tensor_scale;
    const bool nvfp4 = s.scale == ScaleFormat::ue4m3 && s.tensor_scale;
    if (s.rule != ScaleRule::nearest || !(current_scaling || nvfp4))
      throw Error(what + "te's arithmetic is that of TransformerEngine's current scaling (float32 scales rounded to "
                         "nearest, without a tensor scale) or of its NVFP4 quantizer (ue4m3 scales rounded to nearest "
                         "under a tensor scale); its MXFP8 quantizer is the ceil rule (docs/spec.md §6.9)");
  }
  if (s.dither_scale && (s.scale != ScaleFormat::e8m0 || s.tensor_scale || s.arithmetic != ScaleArithmetic::exact))
    throw Error(what + "dither-scale scales the elements of E8M0 blocks by 3/4: it needs e8m0 scales without a "
                       "tensor scale and the exact arithmetic (docs/spec.md §6.11)");
  if (s.arithmetic == ScaleArithmetic::quartet &&
      (e.max_finite() != 6.0 || s.scale != ScaleFormat::ue4m3 || !s.tensor_scale ||
       s.granularity != Granularity::block || s.rule != ScaleRule::nearest || s.history != 0 || s.four_over_six ||
       s.dither_scale))
    throw Error(what + "quartet's arithmetic is that of Quartet II's NVFP4 kernels: E2M1 elements in 1xK blocks, ue4m3 "
                       "scales rounded to nearest under a tensor scale, current scaling (docs/spec.md §6.13)");
  if (s.eden != 0) {
    if (s.arithmetic != ScaleArithmetic::quartet)
      throw Error(what + "eden-N is MS-EDEN on Quartet II's arithmetic: add the option quartet (docs/spec.md §6.13)");
    if (s.eden < 1 || s.eden > kMaxBlock || s.eden % s.block != 0)
      throw Error(what + "eden-" + std::to_string(s.eden) + ": the window must be a multiple of the block (" +
                  std::to_string(s.block) + ") up to " + std::to_string(kMaxBlock));
    if (s.element.rounding == Rounding::stochastic)
      throw Error(what + "MS-EDEN rounds the elements to nearest and the scales stochastically: stochastic rounding "
                         "of the elements does not apply");
  }
  if (s.four_over_six) {
    if (e.max_finite() != 6.0)
      throw Error(what + "4over6 chooses between the element values 6 and 4: it needs E2M1 elements (largest 6)");
    if (s.scale != ScaleFormat::ue4m3 && s.scale != ScaleFormat::fp32)
      throw Error(what + "4over6 needs ue4m3 or fp32 group scales (an e8m0 scale cannot move the block by 6/4)");
    if (s.rule == ScaleRule::floor)
      throw Error(what + "4over6 needs the ceil or nearest rule (floor gives the same power of two for 4 and 6)");
    if (s.arithmetic != ScaleArithmetic::exact)
      throw Error(what + "4over6 is defined on the exact arithmetic (docs/spec.md §6.10)");
  }
}

// ---- notation ------------------------------------------------------------------------

namespace {

bool parse_positive(std::string_view s, int& out) {
  if (s.empty() || s.front() == '+' || s.front() == '-') return false;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && p == s.data() + s.size() && out >= 1;
}

void parse_granularity(std::string_view g, ScaledSpec& s, const std::string& where) {
  s.block = 0;
  if (g == "tensor") return void(s.granularity = Granularity::tensor);
  if (g == "line") return void(s.granularity = Granularity::line);
  const std::size_t x = g.find('x');
  int a = 0, b = 0;
  if (x == std::string_view::npos || !parse_positive(g.substr(0, x), a) || !parse_positive(g.substr(x + 1), b))
    throw Error(where + "'" + std::string(g) + "' is no granularity: expected tensor, line, 1xK or KxK");
  if (a == 1 && b > 1) {
    s.granularity = Granularity::block;
    s.block = b;
  } else if (a == b) {
    s.granularity = a == 1 ? Granularity::block : Granularity::tile;
    s.block = a;
  } else {
    throw Error(where + "'" + std::string(g) + "': blocks are 1xK and tiles KxK");
  }
}

// What an option sets: each may be given once in a format's text (after a preset it
// replaces the preset's choice); a second one contradicts or repeats the first.
enum class OptionKind { scale, rule, tensor_scale, history, scale_order, arithmetic, adaptive, dither, eden };

OptionKind apply_option(std::string_view o, ScaledSpec& s, const std::string& where) {
  if (const auto f = enum_find(kScaleFormats, o)) return s.scale = *f, OptionKind::scale;
  if (const auto r = enum_find(kScaleRules, o)) return s.rule = *r, OptionKind::rule;
  if (o == "tensor-scale" || o == "tensor-scale-folded") {
    s.tensor_scale = true;
    s.fold_tensor_scale = o == "tensor-scale-folded";
    return OptionKind::tensor_scale;
  }
  if (o == "scales-on-output" || o == "scales-folded") {
    s.fold_scales = o == "scales-folded";
    return OptionKind::scale_order;
  }
  if (o == "current") return s.history = 0, OptionKind::history;
  if (const auto a = enum_find(kArithmetics, o)) return s.arithmetic = *a, OptionKind::arithmetic;
  if (o == kFourOverSix) return s.four_over_six = true, OptionKind::adaptive;
  if (o == kDitherScale) return s.dither_scale = true, OptionKind::dither;
  if (o.substr(0, kEden.size()) == kEden) {
    if (!parse_positive(o.substr(kEden.size()), s.eden))
      throw Error(where + "'" + std::string(o) + "': expected eden-N with N the window of MS-EDEN's correction");
    return OptionKind::eden;
  }
  if (o.substr(0, 8) == "delayed-") {
    int n = 0;
    if (!parse_positive(o.substr(8), n))
      throw Error(where + "'" + std::string(o) + "': expected delayed-N with N the history length");
    s.history = n;
    return OptionKind::history;
  }
  throw Error(where + "unknown option '" + std::string(o) +
              "': expected e8m0, ue4m3, fp32, floor, ceil, nearest, tensor-scale, tensor-scale-folded, "
              "scales-on-output, scales-folded, current, delayed-N, exact, torchao, te, quartet, 4over6, dither-scale or eden-N");
}

void apply_options(const std::vector<std::string_view>& options, ScaledSpec& s, const std::string& where) {
  static constexpr const char* kWhat[] = {"scale format", "rounding rule", "tensor scale",
                                          "scaling (current or delayed)", "order of the scales in products",
                                          "arithmetic", "adaptive choice of scales", "dither-scale option",
                                          "MS-EDEN window"};
  std::string_view given[std::size(kWhat)];
  for (std::string_view o : options) {
    const auto k = static_cast<std::size_t>(apply_option(o, s, where));
    if (!given[k].empty())
      throw Error(where + "'" + std::string(o) + "' after '" + std::string(given[k]) + "': the " + kWhat[k] +
                  " is given twice");
    given[k] = o;
  }
  const auto order = given[static_cast<std::size_t>(OptionKind::scale_order)];
  if (!order.empty() && s.scale != ScaleFormat::fp32)
    throw Error(where + "'" + std::string(order) +
                "' needs float32 group scales (e8m0 and ue4m3 scales are exact in the values)");
}

const ScaledPreset* find_preset(std::string_view name) {
  for (const auto& p : scaled_presets())
    if (p.name == name) return &p;
  return nullptr;
}

}  // namespace

ScaledSpec parse_scaled(std::string_view text_in) {
  const std::string_view text = trim(text_in);
  const std::string where = "scaled format '" + std::string(text_in) + "': ";
  ScaledSpec s;
  std::vector<std::string_view> options;
  if (const std::size_t at = text.find('@'); at != std::string_view::npos) {
    s.element.format = parse_format(text.substr(0, at));
    options = split(text.substr(at + 1), ':');
    parse_granularity(options.front(), s, where);
    options.erase(options.begin());
    s.scale = ScaleFormat::e8m0;
  } else {
    const auto parts = split(text, ':');
    const ScaledPreset* p = find_preset(parts.front());
    if (!p) {
      s.element.format = parse_format(text);
      validate(s);
      return s;
    }
    s = parse_scaled(p->spec);
    options.assign(parts.begin() + 1, parts.end());
  }
  apply_options(options, s, where);
  validate(s);
  return s;
}

std::string to_string(const ScaledSpec& s) {
  const Format& f = s.element.format;
  const std::string_view preset = preset_name(f);
  const std::string element = preset.empty() ? to_string(f) : std::string(preset);
  if (!s.scaled()) return element;
  std::string g;
  switch (s.granularity) {
    case Granularity::tensor: g = "tensor"; break;
    case Granularity::line: g = "line"; break;
    case Granularity::block: g = "1x" + std::to_string(s.block); break;
    case Granularity::tile: g = std::to_string(s.block) + "x" + std::to_string(s.block); break;
  }
  std::string out = element + "@" + g + ":" + std::string(to_string(s.scale)) + ":" + std::string(to_string(s.rule));
  if (s.tensor_scale) out += s.fold_tensor_scale ? ":tensor-scale-folded" : ":tensor-scale";
  if (s.fold_scales) out += ":scales-folded";
  if (s.history > 0) out += ":delayed-" + std::to_string(s.history);
  if (s.arithmetic != ScaleArithmetic::exact) out += ":" + std::string(to_string(s.arithmetic));
  if (s.four_over_six) out += std::string(":") + kFourOverSix;
  if (s.dither_scale) out += std::string(":") + kDitherScale;
  if (s.eden != 0) out += ":" + std::string(kEden) + std::to_string(s.eden);
  return out;
}

std::string codes_name(const ScaledSpec& s) {
  ScaledSpec stored = s;
  stored.fold_tensor_scale = false;
  stored.fold_scales = false;
  return to_string(stored);
}

const std::vector<ScaledPreset>& scaled_presets() {
  static const std::vector<ScaledPreset> p{
      {"mxfp8_e4m3", "e4m3fn@1x32:e8m0:floor", "OCP MXFP8: 32 E4M3 elements share an E8M0 scale"},
      {"mxfp8_e5m2", "e5m2@1x32:e8m0:floor", "OCP MXFP8 with E5M2 elements"},
      {"mxfp6_e3m2", "e3m2fn@1x32:e8m0:floor", "OCP MXFP6 with E3M2 elements"},
      {"mxfp6_e2m3", "e2m3fn@1x32:e8m0:floor", "OCP MXFP6 with E2M3 elements"},
      {"mxfp4", "e2m1fn@1x32:e8m0:floor", "OCP MXFP4: 32 E2M1 elements share an E8M0 scale"},
      {"mxint8", "1.0.7:finite@1x32:e8m0:floor", "OCP MXINT8: 8-bit integers times 2^-6, E8M0 scale"},
      {"nvfp4", "e2m1fn@1x16:ue4m3:nearest:tensor-scale",
       "NVFP4: 16 E2M1 elements share an unsigned E4M3 scale, times a float32 tensor scale"},
      {"nvfp4_16x16", "e2m1fn@16x16:ue4m3:nearest:tensor-scale",
       "NVFP4 weights in NVIDIA's training recipe: 16x16 tiles, one quantization for W and W^T"},
      {"nvfp4_4over6", "e2m1fn@1x16:ue4m3:nearest:tensor-scale:4over6",
       "NVFP4 with Four Over Six: each block scaled to 6 or to 4, whichever is nearer its values"},
      {"nvfp4_quartet", "e2m1fn@1x16:ue4m3:nearest:tensor-scale:quartet",
       "NVFP4 as Quartet II's forward kernel computes it (its float32 order of operations)"},
      {"nvfp4_eden", "e2m1fn@1x16:ue4m3:nearest:tensor-scale:quartet:eden-128",
       "Quartet II's MS-EDEN: NVFP4 with scales corrected over windows of 128 and rounded stochastically"},
      {"deepseek_1x128", "e4m3fn@1x128:fp32:nearest", "DeepSeek-V3 activations and gradients: 1x128 tiles"},
      {"deepseek_128x128", "e4m3fn@128x128:fp32:nearest", "DeepSeek-V3 weights: 128x128 blocks"},
      {"e4m3_tensor", "e4m3fn@tensor:fp32:nearest", "per-tensor current scaling, E4M3"},
      {"e5m2_tensor", "e5m2@tensor:fp32:nearest", "per-tensor current scaling, E5M2"},
      {"e4m3_delayed", "e4m3fn@tensor:fp32:nearest:delayed-16",
       "per-tensor delayed scaling (TransformerEngine-style): amax of the last 16 steps, E4M3"},
      {"e5m2_delayed", "e5m2@tensor:fp32:nearest:delayed-16", "per-tensor delayed scaling, E5M2"},
  };
  return p;
}

// ---- layout and counts ---------------------------------------------------------------

BlockLayout block_layout(const ScaledSpec& s, std::size_t rows, std::size_t cols) {
  BlockLayout l;
  l.rows = rows;
  l.cols = cols;
  const auto k = static_cast<std::size_t>(s.block);
  switch (s.granularity) {
    case Granularity::tensor:
      l.block_rows = std::max<std::size_t>(rows, 1);
      l.block_cols = std::max<std::size_t>(cols, 1);
      break;
    case Granularity::line: l.block_cols = std::max<std::size_t>(cols, 1); break;
    case Granularity::block: l.block_cols = k; break;
    case Granularity::tile: l.block_rows = l.block_cols = k; break;
  }
  return l;
}

ScaledCounts& ScaledCounts::operator+=(const ScaledCounts& o) {
  elements += o.elements;
  groups += o.groups;
  saturated_groups += o.saturated_groups;
  nan_groups += o.nan_groups;
  zero_groups += o.zero_groups;
  scale_underflow += o.scale_underflow;
  scale_overflow += o.scale_overflow;
  return *this;
}

double bits_per_element(const ScaledSpec& s, std::size_t rows, std::size_t cols) {
  const double n = static_cast<double>(rows) * static_cast<double>(cols);
  const double w = s.element.format.width();
  if (!s.scaled() || n == 0) return w;
  const double scale_bits = s.scale == ScaleFormat::fp32 ? 32 : 8;
  const double groups = static_cast<double>(block_layout(s, rows, cols).groups());
  return w + (groups * scale_bits + (s.tensor_scale ? 32 : 0)) / n;
}

// ---- choosing a scale ----------------------------------------------------------------

int element_emax(const Format& element) { return std::ilogb(element.max_finite()); }

Format scale_format(ScaleFormat s) {
  switch (s) {
    case ScaleFormat::e8m0: return make_format(8, 0, 127, Policy::fn, false, false, false);
    case ScaleFormat::ue4m3: return make_format(4, 3, 7, Policy::fn, true, false, true);
    default: break;
  }
  throw Error("scale format '" + std::string(to_string(s)) + "' has no 8-bit codes");
}

namespace {

// The scale format's finite codes 0..max in increasing value (fp32: the bits of a
// non-negative float, which order as the values do).
struct ScaleCodes {
  ScaleFormat kind;
  Format f{};
  std::uint32_t max = 0;
  std::vector<double> values;  // of every code (8-bit scale formats)
  std::vector<std::uint8_t> nans;  // whether each 8-bit code is a NaN (or no code of the format)
  explicit ScaleCodes(ScaleFormat k) : kind(k) {
    if (k == ScaleFormat::fp32) {
      max = std::bit_cast<std::uint32_t>(std::numeric_limits<float>::max());
    } else {
      f = scale_format(k);
      max = f.max_code();
      for (std::uint32_t c = 0; c <= max; ++c) values.push_back(f.magnitude(c));
      for (std::uint32_t c = 0; c < 256; ++c) nans.push_back(c > max || f.classify(c) == Format::Class::nan);
    }
  }
  // Whether code c reads as NaN: a NaN code, or none of the format's (corrupt input).
  bool reads_nan(std::uint32_t c) const {
    if (kind == ScaleFormat::fp32) return std::isnan(std::bit_cast<float>(c));
    return c >= nans.size() || nans[c] != 0;
  }
  double value(std::uint32_t c) const {
    return kind == ScaleFormat::fp32 ? static_cast<double>(std::bit_cast<float>(c)) : values[c];
  }
  std::uint32_t nan() const {
    return kind == ScaleFormat::fp32 ? 0x7FC00000u : f.nan_code(false);
  }
  // The largest code whose value satisfies le (a predicate monotone in the value), or
  // nullopt when even code 0 does not. `near`: about where the boundary lies; float32 scales
  // start from its code and walk (a step or two) instead of searching 2^31 codes.
  // The code whose value is about t (> 0): a starting point for last_le's walk.
  std::uint32_t approx_code(double t) const {
    if (kind == ScaleFormat::fp32) return std::min(std::bit_cast<std::uint32_t>(static_cast<float>(t)), max);
    const int M = f.man_bits, emin = f.emin();
    const int E = std::ilogb(t);
    std::int64_t c;
    if (E >= emin) {
      const auto mant = static_cast<std::int64_t>(std::ldexp(t, -E) * (1 << M)) - (std::int64_t{1} << M);
      c = ((static_cast<std::int64_t>(E - emin) + (f.subnormals ? 1 : 0)) << M) + mant;
    } else {
      c = f.subnormals ? static_cast<std::int64_t>(std::ldexp(t, M - emin)) : 0;
    }
    return static_cast<std::uint32_t>(std::clamp<std::int64_t>(c, 0, max));
  }

  template <class Le>
  std::optional<std::uint32_t> last_le(Le le, double near = 0) const {
    if (near > 0 && std::isfinite(near)) {
      std::uint32_t c = approx_code(near);
      if (le(value(c))) {
        while (c < max && le(value(c + 1))) ++c;
        return c;
      }
      while (c > 0) {
        --c;
        if (le(value(c))) return c;
      }
      return std::nullopt;
    }
    if (!le(value(0))) return std::nullopt;
    std::uint32_t lo = 0, hi = max;  // le(lo) holds
    while (lo < hi) {
      const std::uint32_t mid = lo + (hi - lo + 1) / 2;
      if (le(value(mid))) lo = mid;
      else hi = mid - 1;
    }
    return lo;
  }
};

const ScaleCodes& scale_codes(ScaleFormat k) {
  static const ScaleCodes e8m0(ScaleFormat::e8m0), ue4m3(ScaleFormat::ue4m3), fp32(ScaleFormat::fp32);
  return k == ScaleFormat::e8m0 ? e8m0 : k == ScaleFormat::ue4m3 ? ue4m3 : fp32;
}

// floor(log2(amax / ts)) for finite positive amax and ts, exactly.
int floor_log2_ratio(double amax, double ts) {
  int k = std::ilogb(amax / ts);
  while (std::ldexp(ts, k) > amax) --k;
  while (std::ldexp(ts, k + 1) <= amax) ++k;
  return k;
}

// E8M0 without a tensor scale: the power of two by exponent arithmetic (what the linear
// scan of the tests and the search below give, in a few operations for the kernels).
// The element format's largest value and its exponent, computed once per format and thread
// (every group of a tensor asks).
struct ElementFigures {
  Format f{};
  double max = 0;
  int emax = 0;
};
const ElementFigures& figures_of(const Format& f) {
  thread_local ElementFigures last;
  thread_local bool set = false;
  if (!set || !(last.f == f)) {
    last.f = f;
    last.max = f.max_finite();
    last.emax = std::ilogb(last.max);
    set = true;
  }
  return last;
}

std::uint32_t e8m0_code(const ScaledSpec& s, double amax, ScaledCounts* counts) {
  const ElementFigures& ef = figures_of(s.element.format);
  const double max_e = ef.max;
  int e;
  if (s.rule == ScaleRule::floor) {
    e = std::ilogb(amax) - ef.emax;
  } else {
    // The largest e with 2^e max_e <= amax, then the rule between 2^e and 2^(e+1).
    e = std::ilogb(amax) - std::ilogb(max_e);
    while (std::ldexp(max_e, e) > amax) --e;
    while (std::ldexp(max_e, e + 1) <= amax) ++e;
    const double lo = std::ldexp(max_e, e);
    if (lo != amax && (s.rule == ScaleRule::ceil || 2 * amax > 3 * lo || (2 * amax == 3 * lo && e % 2 == 0))) ++e;
  }
  if (e < -127) {
    if (counts) ++counts->scale_underflow;
    return 0;
  }
  if (e > 127) {
    if (counts) ++counts->scale_overflow;
    return 254;
  }
  return static_cast<std::uint32_t>(e + 127);
}

// The code of the rule's scale for a positive finite amax, with `target_e` the element value
// the amax is scaled to (0: the element format's largest, max_e).
std::uint32_t scale_code(const ScaledSpec& s, double amax, double ts, ScaledCounts* counts, double target_e = 0) {
  if (s.scale == ScaleFormat::e8m0 && ts == 1) return e8m0_code(s, amax, counts);
  const ScaleCodes& sc = scale_codes(s.scale);
  const ElementFigures& ef = figures_of(s.element.format);
  const double max_e = target_e > 0 ? target_e : ef.max;
  const auto count = [&](std::uint64_t ScaledCounts::*field) {
    if (counts) ++(counts->*field);
  };
  if (s.rule == ScaleRule::floor) {
    const double target = std::ldexp(1.0, floor_log2_ratio(amax, ts) - ef.emax);
    const auto c = sc.last_le([&](double v) { return v <= target; }, target);
    if (!c) return count(&ScaledCounts::scale_underflow), 0;  // E8M0: clamped up to 2^-127
    if (target > sc.value(sc.max)) count(&ScaledCounts::scale_overflow);
    if (sc.value(*c) == 0) count(&ScaledCounts::scale_underflow);
    return *c;
  }
  // amax / (v ts) <= max_e, compared exactly (every product here is exact in double).
  const auto fits = [&](double v) { return v * ts * max_e >= amax; };
  const auto c = sc.last_le([&](double v) { return v * ts * max_e <= amax; }, amax / (ts * max_e));
  if (!c) return count(&ScaledCounts::scale_underflow), 0;
  if (fits(sc.value(*c))) return *c;  // exact
  if (*c == sc.max) return count(&ScaledCounts::scale_overflow), sc.max;
  const std::uint32_t lo = *c, hi = *c + 1;
  std::uint32_t pick = hi;
  if (s.rule == ScaleRule::nearest) {
    const double twice = 2 * amax, mid = (sc.value(lo) + sc.value(hi)) * ts * max_e;
    pick = twice < mid ? lo : twice > mid ? hi : (lo % 2 == 0 ? lo : hi);
  }
  if (sc.value(pick) == 0) count(&ScaledCounts::scale_underflow);
  return pick;
}

// torchao's NVFP4 scale of a finite amax (docs/spec.md §6.9): its float32 operations, the
// quotient clamped to the scale format's normal range and rounded to nearest-even; a zero
// group gets the least normal scale too. Sets code, value and reciprocal.
GroupScale torchao_scale(const ScaledSpec& s, float amax, float ts, ScaledCounts* counts) {
  const ScaleCodes& sc = scale_codes(s.scale);
  const auto max_e = static_cast<float>(figures_of(s.element.format).max);
  const auto least = static_cast<float>(sc.value(1u << sc.f.man_bits));
  const auto top = static_cast<float>(sc.value(sc.max));
  const float q = amax / max_e / ts;
  GroupScale g;
  g.zero = amax == 0;
  if (counts && q > top) ++counts->scale_overflow;
  if (counts && q < least && !g.zero) ++counts->scale_underflow;
  g.code = encode(std::clamp(q, least, top), QuantSpec{sc.f});
  const auto scale = static_cast<float>(sc.value(g.code));
  g.value = static_cast<float>(static_cast<double>(scale) * ts);
  g.reciprocal = 1.0f / ts / scale;
  return g;
}

// TransformerEngine's current-scaling scale of a finite amax (docs/spec.md §6.9): the encoding
// factor S = fl32(max_e / amax), float32's largest where that overflows (counted as a scale
// underflow: X is then below float32's normal range), 1 for a zero group; X = fl32(1 / S).
GroupScale te_scale(const ScaledSpec& s, float amax, ScaledCounts* counts) {
  const auto max_e = static_cast<float>(figures_of(s.element.format).max);
  GroupScale g;
  g.zero = amax == 0;
  float S = g.zero ? 1.0f : max_e / amax;
  if (std::isinf(S)) {
    S = std::numeric_limits<float>::max();
    if (counts) ++counts->scale_underflow;
  }
  g.reciprocal = S;
  g.value = 1.0f / S;
  g.code = std::bit_cast<std::uint32_t>(g.value);
  return g;
}

// TransformerEngine's NVFP4 block scale of a finite amax under global encode factor E
// (docs/spec.md §6.9): s = ue4m3(clamp(min(fl32(amax * fl32(E * fl32(1 / max_e))), float32's
// largest), 448)), rounded to nearest-even (0 below half the least subnormal, counted as a
// scale underflow; past 448, a scale overflow); X = fl32(s * D) with D the tensor scale;
// elements are fl32(x * r), r = fl32(1 / X), float32's largest where that is infinite.
GroupScale te_nvfp4_scale(const ScaledSpec& s, float amax, const TensorScale& ts, ScaledCounts* counts) {
  if (!(ts.te_encode > 0))
    throw Error("te's NVFP4 block scales are formed from TransformerEngine's global encode factor, which this "
                "tensor scale lacks (docs/spec.md §6.9)");
  const ScaleCodes& sc = scale_codes(s.scale);
  const auto max_e = static_cast<float>(figures_of(s.element.format).max);
  const auto top = static_cast<float>(sc.value(sc.max));
  const float multiplier = ts.te_encode * (1.0f / max_e);
  const float q = std::min(amax * multiplier, std::numeric_limits<float>::max());
  GroupScale g;
  g.zero = amax == 0;
  g.code = encode(std::min(q, top), QuantSpec{sc.f});
  if (counts && q > top) ++counts->scale_overflow;
  if (counts && g.code == 0 && !g.zero) ++counts->scale_underflow;
  g.value = static_cast<float>(sc.value(g.code) * ts.value);
  const float r = 1.0f / g.value;
  g.reciprocal = std::isinf(r) ? std::numeric_limits<float>::max() : r;
  return g;
}

// TransformerEngine's global encode factor for a tensor amax: fl32(max_e * 448 / amax),
// float32's largest where that is infinite (amax 0 included), 1 where it is 0 (docs/spec.md §6.9).
float te_encode_of(const ScaledSpec& s, float tensor_amax) {
  const auto top = static_cast<float>(figures_of(s.element.format).max * scale_codes(s.scale).value(scale_codes(s.scale).max));
  const float e = std::min(top / tensor_amax, std::numeric_limits<float>::max());
  return e == 0 ? 1.0f : e;
}

// Quartet II's block scale of a finite amax (docs/spec.md §6.13): s = ue4m3(fl32(fl32(amax / m)
// / D)) to nearest-even, saturating at 448 (an infinite quotient too), and 1 where that is 0 (a
// zero group, or a scale underflow); X = fl32(s D).
GroupScale quartet_scale(const ScaledSpec& s, float amax, float ts, ScaledCounts* counts) {
  const ScaleCodes& sc = scale_codes(s.scale);
  // Past float32's range the quotient saturates, as the kernels' satfinite conversion does.
  const float q = std::min(amax / quartet_constants(s).m / ts, std::numeric_limits<float>::max());
  GroupScale g;
  g.zero = amax == 0;
  g.code = encode(q, QuantSpec{sc.f});
  if (counts && q > static_cast<float>(sc.value(sc.max))) ++counts->scale_overflow;
  if (g.code == 0) {
    if (counts && !g.zero) ++counts->scale_underflow;
    g.code = encode(1.0f, QuantSpec{sc.f});
  }
  g.value = static_cast<float>(sc.value(g.code) * ts);
  return g;
}

bool te_two_level(const ScaledSpec& s) { return s.arithmetic == ScaleArithmetic::te && s.tensor_scale; }

}  // namespace

TensorScale tensor_scale_for(const ScaledSpec& s, float tensor_amax) {
  if (!te_two_level(s)) return TensorScale(tensor_scale_of(s, tensor_amax));
  const float e = te_encode_of(s, tensor_amax);
  return TensorScale(1.0f / e, e);
}

float tensor_scale_of(const ScaledSpec& s, float tensor_amax) {
  if (te_two_level(s)) return tensor_scale_for(s, tensor_amax).value;
  if (!s.tensor_scale || !(tensor_amax > 0)) return 1.0f;
  if (s.arithmetic == ScaleArithmetic::quartet) {  // 0 only for an amax below about 2^-138
    const QuartetConstants k = quartet_constants(s);
    return std::max(tensor_amax / k.top / k.m, std::numeric_limits<float>::denorm_min());
  }
  const double s_top = s.four_over_six ? kFourOverSixScaleTop : scale_codes(s.scale).value(scale_codes(s.scale).max);
  const double top = s.element.format.max_finite() * s_top;
  const auto ts = static_cast<float>(static_cast<double>(tensor_amax) / top);
  return std::max(ts, std::numeric_limits<float>::min());
}

namespace {

// choose_scale with the amax scaled to element value `target_e` (0: the largest).
GroupScale choose_scale_for(const ScaledSpec& s, float amax, const TensorScale& tensor, ScaledCounts* counts,
                            double target_e) {
  const float ts = tensor.value;
  GroupScale g;
  const ScaleCodes& sc = scale_codes(s.scale);
  if (!std::isfinite(amax) || amax < 0) {  // a NaN or Inf in the group
    g.nan = true;
    g.code = sc.nan();
    g.value = std::numeric_limits<float>::quiet_NaN();
    return g;
  }
  if (s.arithmetic == ScaleArithmetic::torchao) return torchao_scale(s, amax, ts, counts);
  if (s.arithmetic == ScaleArithmetic::quartet) return quartet_scale(s, amax, ts, counts);
  if (te_two_level(s)) return te_nvfp4_scale(s, amax, tensor, counts);
  if (s.arithmetic == ScaleArithmetic::te) return te_scale(s, amax, counts);
  if (amax == 0) {
    g.zero = true;
    g.code = 0;
  } else {
    g.code = scale_code(s, amax, ts, counts, target_e);
  }
  g.value = static_cast<float>(sc.value(g.code) * ts);
  if (s.scale == ScaleFormat::e8m0) g.exponent = static_cast<int>(g.code) - 127;
  return g;
}

}  // namespace

GroupScale choose_scale(const ScaledSpec& s, float amax, const TensorScale& ts, ScaledCounts* counts) {
  return choose_scale_for(s, amax, ts, counts, 0);
}

void check_scale_codes(const std::uint32_t* codes, std::size_t n, const ScaledSpec& s, const std::string& where) {
  if (s.scale == ScaleFormat::fp32 || !s.scaled()) return;
  const Format f = scale_format(s.scale);
  const std::uint32_t top = f.max_code(), nan = f.nan_code(false);
  for (std::size_t i = 0; i < n; ++i)
    if (codes[i] > top && codes[i] != nan)
      throw Error(where + ": value " + std::to_string(codes[i]) + " at index " + std::to_string(i) + " is not a " +
                  std::string(to_string(s.scale)) + " code");
}

void check_tensor_scale(float ts, const ScaledSpec& s, const std::string& where) {
  const auto fmt_g = [](float v) {
    char b[32];
    std::snprintf(b, sizeof b, "%.9g", static_cast<double>(v));
    return std::string(b);
  };
  if (s.tensor_scale && !(ts > 0 && std::isfinite(ts)))
    throw Error(where + ": the tensor scale must be a positive finite float32 number, got " + fmt_g(ts));
  if (!s.tensor_scale && ts != 1.0f)
    throw Error(where + ": " + to_string(s) + " has no tensor scale, but one of " + fmt_g(ts) +
                " was given (codes of another format?)");
}

GroupScale scale_from_code(const ScaledSpec& s, std::uint32_t code, float ts) {
  const ScaleCodes& sc = scale_codes(s.scale);
  GroupScale g;
  g.code = code;
  if (sc.reads_nan(code)) {  // a code outside the scale format (corrupt input) reads as NaN
    g.nan = true;
    g.value = std::numeric_limits<float>::quiet_NaN();
    return g;
  }
  g.value = static_cast<float>(sc.value(code) * ts);
  if (s.scale == ScaleFormat::e8m0) g.exponent = static_cast<int>(code) - 127;
  return g;
}

namespace {

// The bits of the smallest float32 at or above (strict: above) a non-negative double;
// 0x7F800000 where none is finite.
std::uint32_t float_at_or_above(double p, bool strict) {
  float f = static_cast<float>(p);  // to nearest: at most one step off
  if (static_cast<double>(f) < p || (strict && static_cast<double>(f) == p))
    f = std::nextafter(f, std::numeric_limits<float>::infinity());
  return std::min(std::bit_cast<std::uint32_t>(f), 0x7F800000u);
}

// 2^k as a double (k within double's range for every call here).
double pow2(int k) { return std::ldexp(1.0, k); }

}  // namespace

// The smallest amax of each code, from scale_code's rule with every product exact in
// double (the values have 4 significant bits, ts 24 and the element max at most 24):
//   ceil:    code >= c  iff  amax >  T(c-1), T(c) = v(c) ts max_e;
//   nearest: code >= c  iff  amax >  (T(c-1) + T(c)) / 2, or equal to it with c-1 odd;
//   floor:   code >= c  iff  ts 2^(j + emax) <= amax, j = ceil(log2 v(c)) (the target
//            2^(floor(log2(amax/ts)) - emax) reaches v(c)).
// Overflow: amax > T(max) (ceil, nearest); target > v(max) (floor).
namespace {

// The smallest float32 bits b in [0, 0x7F800000) with pred(b) (a predicate false then true
// as b grows), 0x7F800000 where none.
template <class Pred>
std::uint32_t first_bits(const Pred& pred) {
  std::uint32_t lo = 0, hi = 0x7F800000u;
  while (lo < hi) {
    const std::uint32_t mid = lo + (hi - lo) / 2;
    if (pred(mid)) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

}  // namespace

std::optional<ScaleSteps> ScaleSteps::make(const ScaledSpec& s, float ts, double target_e) {
  const bool quartet = s.arithmetic == ScaleArithmetic::quartet && target_e == 0;
  if (s.scale != ScaleFormat::ue4m3 || !(s.arithmetic == ScaleArithmetic::exact || quartet) || !(ts > 0) ||
      !std::isfinite(ts))
    return std::nullopt;
  const ScaleCodes& sc = scale_codes(s.scale);
  const ElementFigures& ef = figures_of(s.element.format);
  const double m = static_cast<double>(ts) * (target_e > 0 ? target_e : ef.max);
  ScaleSteps t;
  t.max_ = sc.max;
  t.first_.assign(sc.max + 1, 0);
  t.values_.resize(sc.max + 1);
  for (std::uint32_t c = 0; c <= sc.max; ++c) t.values_[c] = static_cast<float>(sc.value(c) * ts);
  const auto T = [&](std::uint32_t c) { return sc.value(c) * m; };
  // The quartet arithmetic's code, fl32(fl32(amax / m) / ts) rounded to nearest-even, is a
  // non-decreasing function of amax: its steps found by bisection over the amax bits (the
  // code 0 that quartet_scale replaces by 1's is the kernels' general path).
  const float qm = quartet ? quartet_constants(s).m : 0;
  const auto quotient = [&](std::uint32_t bits) {
    return std::min(std::bit_cast<float>(bits) / qm / ts, std::numeric_limits<float>::max());
  };
  for (std::uint32_t c = 1; c <= sc.max && quartet; ++c)
    t.first_[c] = first_bits([&](std::uint32_t b) { return encode(quotient(b), QuantSpec{sc.f}) >= c; });
  for (std::uint32_t c = 1; c <= sc.max && !quartet; ++c) {
    switch (s.rule) {
      case ScaleRule::ceil: t.first_[c] = float_at_or_above(T(c - 1), true); break;
      case ScaleRule::nearest: t.first_[c] = float_at_or_above((T(c - 1) + T(c)) / 2, (c - 1) % 2 == 0); break;
      case ScaleRule::floor: {
        const double v = sc.value(c);
        const int j = std::ilogb(v) + (v == pow2(std::ilogb(v)) ? 0 : 1);  // ceil(log2 v)
        t.first_[c] = float_at_or_above(ts * pow2(j + ef.emax), false);
        break;
      }
    }
  }
  if (quartet) {
    const auto top = static_cast<float>(sc.value(sc.max));
    t.overflow_from_ = first_bits([&](std::uint32_t b) { return quotient(b) > top; });
  } else if (s.rule == ScaleRule::floor) {
    const int J = std::ilogb(sc.value(sc.max)) + 1;
    t.overflow_from_ = float_at_or_above(ts * pow2(J + ef.emax), false);
  } else {
    t.overflow_from_ = float_at_or_above(T(sc.max), true);
  }
  // Each bucket's codes, merged against the breakpoints.
  t.buckets_.resize((0x7F800000u >> kShift) + 1);
  std::uint32_t c = 0;
  for (std::uint32_t b = 0; b < t.buckets_.size(); ++b) {
    const std::uint32_t low = b << kShift, end = low + (1u << kShift);
    while (c < t.max_ && t.first_[c + 1] <= low) ++c;
    Bucket& k = t.buckets_[b];
    k.low = k.above = static_cast<std::uint8_t>(c);
    k.at = end;
    if (c < t.max_ && t.first_[c + 1] < end) {
      k.at = t.first_[c + 1];
      std::uint32_t hi = c;
      while (hi < t.max_ && t.first_[hi + 1] == k.at) ++hi;
      k.above = static_cast<std::uint8_t>(hi);
      if (hi < t.max_ && t.first_[hi + 1] < end) t.single_ = false;
    }
  }
  return t;
}

namespace {

// Scales are powers of two applied as a shift of the element bias (exact).
bool power_of_two_path(const ScaledSpec& s) { return s.power_of_two_elements(); }

}  // namespace

Amax amax_of(const float* x, std::size_t n, std::size_t stride) {
  // The largest magnitude's bits (which order as the magnitudes do): a loop compilers
  // vectorize. Only a group holding NaN or Inf takes the second, slower loop.
  std::uint32_t top = 0;
  for (std::size_t i = 0; i < n; ++i) top = std::max(top, std::bit_cast<std::uint32_t>(x[i * stride]) & 0x7FFFFFFFu);
  Amax a;
  if (top < 0x7F800000u) {
    a.value = std::bit_cast<float>(top);
    return a;
  }
  a.nonfinite = true;
  for (std::size_t i = 0; i < n; ++i) {
    const float v = std::fabs(x[i * stride]);
    if (std::isfinite(v) && v > a.value) a.value = v;
  }
  return a;
}

namespace {

// A finite |v| rounded to nearest-even on E2M1's values 0, 0.5, 1, 1.5, 2, 3, 4, 6 (saturating):
// steps of 0.5 below 2, of 1 below 4, of 2 above, each by float32 addition of C = 2^23 times
// the step, whose unit in the last place is the step, so (a + C) - C rounds to it to even
// (the default rounding mode, which fp8lab assumes everywhere, docs/spec.md §2.2); the even
// multiples are E2M1's even codes. Without branches: the binades mispredict.
float e2m1_nearest_magnitude(float a) {
  const auto k = static_cast<std::uint32_t>(a >= 2.0f) + static_cast<std::uint32_t>(a >= 4.0f);
  const float C = std::bit_cast<float>((127u + 22u + k) << 23);  // 2^22, 2^23 or 2^24
  return std::min((a + C) - C, 6.0f);  // IEEE arithmetic (no -ffast-math): not folded to a
}

bool is_e2m1(const Format& f) {
  static const Format e2m1 = parse_format("e2m1fn");
  return f == e2m1;
}

// One term of Four Over Six's error (docs/spec.md §6.10): (y - x)^2 in double, added to sum.
inline void add_squared_error(double& sum, float y, float x) {
  const double d = static_cast<double>(y) - static_cast<double>(x);
  sum += d * d;
}

// Four Over Six's errors of a group under each of N scales, summed side by side (independent
// chains of additions) in the group's row-major order.
template <std::size_t N>
std::array<double, N> errors_of(const ScaledSpec& s, const std::array<const GroupScale*, N>& scales,
                                const GroupValues& v) {
  // E2M1 to nearest-even (every preset's case) by its three steps; any other rounding by the codec.
  const bool fast = is_e2m1(s.element.format) && s.element.rounding == Rounding::nearest_even;
  std::array<double, N> sums{};
  for (std::size_t r = 0; r < v.rows; ++r)
    for (std::size_t c = 0; c < v.cols; ++c) {
      const float x = v.x[r * v.stride + c];
      for (std::size_t k = 0; k < N; ++k) {
        const float X = scales[k]->value;
        float y = 0.0f;  // a scale of 0 flushes every element (docs/spec.md §6.2)
        if (X > 0) {
          const float q = saturate_scaled(x / X, x);
          y = fast ? std::copysign(e2m1_nearest_magnitude(std::fabs(q)), q) * X
                   : decode(encode(q, s.element, v.first_index + r * v.index_stride + c), s.element.format) * X;
        }
        add_squared_error(sums[k], y, x);
      }
    }
  return sums;
}

}  // namespace

double four_over_six_error(const ScaledSpec& s, const GroupScale& g, const GroupValues& v) {
  return errors_of<1>(s, {&g}, v)[0];
}

bool four_over_six_keeps_four(const float* x, const float* y6, const float* y4, std::size_t n) {
  double e6 = 0, e4 = 0;
  for (std::size_t i = 0; i < n; ++i) {
    add_squared_error(e6, y6[i], x[i]);
    add_squared_error(e4, y4[i], x[i]);
  }
  return e4 < e6;
}

namespace {

// Four Over Six's choice for a group (docs/spec.md §6.10): the scale for 6 (the rule's, as
// choose_scale gives it) unless the one for 4 gives a smaller error; a NaN or zero group
// keeps the former. Only the kept scale's range counts reach *counts.
GroupScale four_over_six_scale(const ScaledSpec& s, float amax, float ts, ScaledCounts* counts,
                               const GroupValues& values) {
  ScaledCounts six_counts, four_counts;
  const GroupScale six = choose_scale_for(s, amax, ts, &six_counts, 0);
  GroupScale kept = six;
  ScaledCounts* kept_counts = &six_counts;
  if (!six.nan && !six.zero) {
    const GroupScale four = choose_scale_for(s, amax, ts, &four_counts, kFourOverSixTarget);
    const auto [e6, e4] = errors_of<2>(s, {&six, &four}, values);
    if (e4 < e6) {
      kept = four;
      kept_counts = &four_counts;
    }
  }
  if (counts) *counts += *kept_counts;
  return kept;
}

}  // namespace

GroupScale scale_group(const ScaledSpec& s, const Amax& a, const TensorScale& ts, ScaledCounts* counts,
                       std::optional<float> history_amax, const GroupValues* values) {
  const float amax = history_amax ? *history_amax : a.nonfinite ? std::numeric_limits<float>::quiet_NaN() : a.value;
  if (s.four_over_six && !values) throw Error("4over6 chooses a group's scale from its values: none were given");
  const GroupScale g =
      s.four_over_six ? four_over_six_scale(s, amax, ts.value, counts, *values) : choose_scale(s, amax, ts, counts);
  if (counts) {
    ++counts->groups;
    counts->nan_groups += g.nan;
    counts->zero_groups += !a.nonfinite && a.value == 0;
  }
  return g;
}

// ---- delayed scaling -----------------------------------------------------------------

void AmaxHistory::push(float amax) {
  if (length_ <= 0) return;
  values_.push_back(amax);
  while (values_.size() > static_cast<std::size_t>(length_)) values_.pop_front();
}

std::optional<float> AmaxHistory::amax() const {
  if (values_.empty()) return std::nullopt;
  return *std::max_element(values_.begin(), values_.end());
}

void AmaxHistory::restore(std::deque<float> values) {
  if (values.size() > static_cast<std::size_t>(std::max(length_, 0)))
    throw Error("amax history of " + std::to_string(values.size()) + " values for a length of " +
                std::to_string(length_));
  for (float v : values)
    if (!(v >= 0) || !std::isfinite(v)) throw Error("amax history holds a value that is not a finite amax");
  values_ = std::move(values);
}

// ---- the reference -------------------------------------------------------------------

namespace {

struct GroupJob {
  const float* x;
  std::size_t cols;  // row stride
  std::size_t r0, r1, c0, c1;
};

template <class F>
void for_each_in(const GroupJob& j, F f) {
  for (std::size_t r = j.r0; r < j.r1; ++r)
    for (std::size_t c = j.c0; c < j.c1; ++c) f(r * j.cols + c);
}

Amax group_amax(const GroupJob& j) {
  Amax a;
  for_each_in(j, [&](std::size_t i) {
    const Amax one = amax_of(j.x + i, 1);
    a.nonfinite |= one.nonfinite;
    a.value = std::max(a.value, one.value);
  });
  return a;
}

// Quantizes one group with scale g; returns whether an element saturated.
bool quantize_group(const GroupJob& j, const ScaledSpec& s, const GroupScale& g, const ScaledOut& out,
                    const ScaledCall& call, QuantCounts& qc) {
  const Format& e = s.element.format;
  QuantSpec shifted = s.element;
  const bool pow2 = power_of_two_path(s);
  // What an element's value is multiplied by: X, or the group's scale alone where the
  // tensor scale is left out (docs/spec.md §6.7).
  const bool unit = out.without_tensor_scale && s.tensor_scale && !g.nan;
  const float X = unit ? scale_from_code(s, g.code, 1.0f).value : g.value;
  if (pow2) shifted.format.bias = static_cast<std::int16_t>(e.bias - g.exponent);
  const std::uint64_t overflow_before = qc.overflow;
  for_each_in(j, [&](std::size_t i) {
    const float x = j.x[i];
    const std::uint64_t index = call.index_offset + i;
    std::uint32_t code;
    float y;
    ++qc.total;
    if (g.nan) {
      code = e.has_nan() ? e.nan_code(false) : 0;
      y = std::numeric_limits<float>::quiet_NaN();
      ++qc.nan;
    } else if (pow2) {
      QuantCounts one;
      code = encode(x, shifted, index, &one);
      --one.total;
      qc += one;
      y = std::isnan(x) ? quantize(x, s.element) : decode(code, shifted.format);
    } else if (g.zero || (g.value == 0 && !s.multiplies())) {  // a zero group, or a scale that underflowed to 0
      code = encode(std::signbit(x) ? -0.0f : 0.0f, s.element);
      if (x != 0 && !std::isnan(x)) ++qc.underflow;
      y = std::isnan(x) ? quantize(x, s.element) : decode(code, e) * 0.0f;
      if (std::isnan(x)) ++qc.nan;
    } else {
      const float v = s.dither_scale ? dither_scaled(x, g.exponent)
                                     : saturate_scaled(s.multiplies() ? x * g.reciprocal : x / g.value, x);
      QuantCounts one;
      code = encode(v, s.element, index, &one);
      --one.total;
      if (v == 0 && x != 0) ++one.underflow;
      qc += one;
      y = std::isnan(x)       ? quantize(x, s.element) * X
          : s.dither_scale ? dither_value(decode(code, e), g.exponent)
                           : decode(code, e) * X;
    }
    if (out.codes) out.codes[i] = static_cast<std::uint8_t>(code);
    if (out.values) out.values[i] = y;
  });
  return qc.overflow > overflow_before;
}

}  // namespace

float scaled_quantize_reference(const float* x, std::size_t rows, std::size_t cols, const ScaledSpec& s,
                                const ScaledOut& out, const ScaledCall& call, ScaledCounts* counts) {
  validate(s);
  const std::size_t n = rows * cols;
  const float current = amax_of(x, n).value;
  ScaledCounts local;
  if (!s.scaled()) {
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint32_t code = encode(x[i], s.element, call.index_offset + i, &local.elements);
      if (out.codes) out.codes[i] = static_cast<std::uint8_t>(code);
      if (out.values) out.values[i] = quantize(x[i], s.element, call.index_offset + i);
    }
    if (out.tensor_scale) *out.tensor_scale = 1.0f;
    if (counts) *counts += local;
    return current;
  }
  if (out.codes && s.element.format.width() > 8) throw Error("codes of elements wider than 8 bits");
  const bool delayed = s.history > 0 && call.delayed_amax && *call.delayed_amax > 0;
  const float tensor_amax = delayed ? *call.delayed_amax : current;
  const TensorScale ts = tensor_scale_for(s, tensor_amax);
  if (out.tensor_scale) *out.tensor_scale = ts.value;
  if (s.eden != 0) {
    quartet_quantize_rows(x, 0, rows, cols, s, ts.value, out, call, &local);
    if (counts) *counts += local;
    return current;
  }
  const BlockLayout l = block_layout(s, rows, cols);
  for (std::size_t gr = 0; gr < l.grid_rows(); ++gr)
    for (std::size_t gc = 0; gc < l.grid_cols(); ++gc) {
      const GroupJob j{x, cols, gr * l.block_rows, std::min(rows, (gr + 1) * l.block_rows),
                       gc * l.block_cols, std::min(cols, (gc + 1) * l.block_cols)};
      // Delayed per-tensor scaling takes its amax from the history; otherwise a NaN or Inf
      // in the group makes its scale NaN.
      const bool from_history = delayed && s.granularity == Granularity::tensor;
      const GroupValues values{x + j.r0 * cols + j.c0, j.r1 - j.r0, j.c1 - j.c0, cols,
                               call.index_offset + j.r0 * cols + j.c0, cols};
      const GroupScale g = scale_group(s, group_amax(j), ts, &local,
                                       from_history ? std::optional<float>(tensor_amax) : std::nullopt, &values);
      if (quantize_group(j, s, g, out, call, local.elements)) ++local.saturated_groups;
      if (out.scale_codes) out.scale_codes[gr * l.grid_cols() + gc] = g.code;
    }
  if (counts) *counts += local;
  return current;
}

void scaled_decode_reference(const std::uint8_t* codes, const std::uint32_t* scale_codes, float tensor_scale,
                             std::size_t rows, std::size_t cols, const ScaledSpec& s, float* y) {
  validate(s);
  const Format& e = s.element.format;
  if (!s.scaled()) {
    for (std::size_t i = 0; i < rows * cols; ++i) y[i] = decode(codes[i], e);
    return;
  }
  const BlockLayout l = block_layout(s, rows, cols);
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t c = 0; c < cols; ++c) {
      const std::size_t i = r * cols + c;
      const GroupScale g =
          scale_from_code(s, scale_codes[(r / l.block_rows) * l.grid_cols() + c / l.block_cols], tensor_scale);
      if (g.nan) {
        y[i] = std::numeric_limits<float>::quiet_NaN();
      } else if (power_of_two_path(s)) {
        Format shifted = e;
        shifted.bias = static_cast<std::int16_t>(e.bias - g.exponent);
        y[i] = decode(codes[i], shifted);
      } else if (s.dither_scale) {
        y[i] = dither_value(decode(codes[i], e), g.exponent);
      } else if (s.eden != 0) {
        y[i] = quartet_value(decode(codes[i], e), scale_from_code(s, g.code, 1.0f).value, tensor_scale);
      } else {
        y[i] = decode(codes[i], e) * g.value;
      }
    }
}

}  // namespace fp8lab
