// Scaled and block-scaled quantization (docs/spec.md §6): an element quantizer plus a scale
// shared by a group of values (a tensor, a line, a 1xK block, a KxK tile), chosen from the
// group's largest magnitude. The OCP Microscaling formats, NVFP4, DeepSeek-style tiles and
// per-tensor current or delayed scaling are presets of one ScaledSpec.
//
// This header holds the specification as data and the scalar reference that every fast path
// (fp8lab/kernels/scaled.hpp) is tested bit-exact against.
#pragma once

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fp8lab/core/codec.hpp"
#include "fp8lab/core/format.hpp"

namespace fp8lab {

// Which values share one scale, in a matrix view [rows, cols] whose blocks run along cols.
enum class Granularity : std::uint8_t {
  tensor,  // one scale for everything
  line,    // one per row (per column when the caller puts the columns last)
  block,   // 1xK blocks along each row (the last one of a row may be shorter)
  tile,    // KxK tiles
};
// How the scale is stored. `none`: no scale, the element format's fixed bias (the paper's
// per-tensor quantizer).
enum class ScaleFormat : std::uint8_t { none, e8m0, ue4m3, fp32 };
// How the scale is chosen from the group's largest magnitude amax (docs/spec.md §6.2):
// floor: 2^(floor(log2 amax) - emax), the OCP MX rule as written (emax: the exponent of the
//        element format's largest value); the largest value may then saturate;
// ceil: the smallest scale with amax / scale <= the element format's max (nothing saturates);
// nearest: the scale nearest amax / max.
enum class ScaleRule : std::uint8_t { floor, ceil, nearest };
// Whose float32 operations choose a group's scale and scale the elements (docs/spec.md §6.9):
// exact: §6.2-6.3, the rule's scale of the exact quotient and elements fl32(x / X);
// torchao: torchao's NVFP4 quantizer (UE4M3 scales), s = ue4m3(clamp(fl32(fl32(amax / max_e)
//          / ts), least normal, largest)) to nearest, elements fl32(x * fl32(fl32(1 / ts) / s));
// te: TransformerEngine's current scaling (float32 scales), S = fl32(max_e / amax) (the
//     largest float where that overflows, 1 for amax 0), X = fl32(1 / S), elements fl32(x * S);
// quartet: Quartet II's NVFP4 kernels (docs/spec.md §6.13), D = fl32(fl32(amax / top) / m),
//          s = ue4m3(fl32(fl32(amax_b / m) / D)) to nearest-even (1 where that is 0), elements
//          fl32(x / fl32(s D)), values fl32(q fl32(s D)); with `eden`, MS-EDEN's scales and
//          values fl32(fl32(q s) D).
enum class ScaleArithmetic : std::uint8_t { exact, torchao, te, quartet };

std::string_view to_string(Granularity g);
std::string_view to_string(ScaleFormat s);
std::string_view to_string(ScaleRule r);
std::string_view to_string(ScaleArithmetic a);
ScaleFormat parse_scale_format(std::string_view s);  // e8m0, ue4m3, fp32 (throws Error)
ScaleRule parse_scale_rule(std::string_view s);      // floor, ceil, nearest (throws Error)

inline constexpr int kMaxBlock = 1 << 16;    // K of a block or tile
inline constexpr int kMaxHistory = 1 << 16;  // amax history length of delayed scaling

struct ScaledSpec {
  QuantSpec element{};  // format, rounding, overflow (saturate), stochastic stream
  Granularity granularity = Granularity::tensor;
  int block = 0;  // K for block and tile
  ScaleFormat scale = ScaleFormat::none;
  ScaleRule rule = ScaleRule::floor;
  // A second, float32 scale per tensor that the block scales are relative to (NVFP4).
  bool tensor_scale = false;
  // Where a product of quantized operands applies the tensor scale (docs/spec.md §6.7):
  // false, to the product's float32 output, as the hardware of these formats does (the
  // operand's values are each element times its block scale); true (`tensor-scale-folded`),
  // folded into each value the product reads (the fake-quantized value, element times X).
  // Quantization itself (codes, scales, the values fp8lab quantize writes) is the same.
  bool fold_tensor_scale = false;
  // Where a product applies float32 group scales (docs/spec.md §6.8): false, the default
  // (`scales-on-output`), to float32 partial sums of the elements alone, each chunk of the
  // reduction that shares one scale per operand row scaled and added, as FP8 matrix units
  // with float32 scales do (DeepSeek-V3's tiles; torch._scaled_mm per tensor); true
  // (`scales-folded`), folded into each value the product reads. Only float32 scales have
  // the choice: E8M0 and UE4M3 scales are exact in the values.
  bool fold_scales = false;
  // Delayed scaling: the tensor-level amax comes from the last `history` steps (0: current).
  int history = 0;
  // The float32 operations of the scale and the elements: fp8lab's exact ones (§6.2-6.3) or
  // those of a library whose quantizer a run should match (`torchao`, §6.9).
  ScaleArithmetic arithmetic = ScaleArithmetic::exact;
  // Four Over Six (`4over6`, docs/spec.md §6.10): each group is quantized with the rule's
  // scale for the element format's largest value 6 and for 4, and keeps the one whose values
  // lie nearer its inputs (the smaller sum of squared errors); the tensor scale maps the
  // tensor's amax to 6 times 256 instead of 6 times 448. E2M1 elements, UE4M3 or float32
  // scales, the ceil or nearest rule, the exact arithmetic.
  bool four_over_six = false;
  // Tseng et al.'s headroom for stochastic rounding (`dither-scale`, docs/spec.md §6.11): with
  // E8M0 scale 2^e, an element is rounded from fl32(fl32(3 x) / 2^(e+2)), three quarters of
  // x / 2^e, so that rounding up never passes the element format's largest value, and reads
  // back as fl32(fl32(q 2^(e+2)) / 3). E8M0 scales without a tensor scale only.
  bool dither_scale = false;
  // MS-EDEN (`eden-N`, docs/spec.md §6.13), Quartet II's unbiased backward quantizer: 0 (off)
  // or the window N of each row whose groups share one correction c = sum v^2 / sum v q of
  // their scaled elements v and their elements q; each group's scale s c is then rounded
  // stochastically to a neighbouring UE4M3 value. The quartet arithmetic only; N a multiple
  // of the block.
  int eden = 0;

  bool scaled() const { return scale != ScaleFormat::none; }
  // Whether products apply the tensor scale to their output (docs/spec.md §6.7).
  bool tensor_scale_on_output() const { return tensor_scale && !fold_tensor_scale; }
  // Whether products apply the group scales to their partial sums (docs/spec.md §6.8).
  bool scales_on_output() const { return scale == ScaleFormat::fp32 && !fold_scales; }
  // Whether elements are x times GroupScale::reciprocal instead of x / GroupScale::value.
  bool multiplies() const { return arithmetic == ScaleArithmetic::torchao || arithmetic == ScaleArithmetic::te; }
  // Elements scaled by the E8M0 scale's power of two alone (x * 2^-e, read back q * 2^e):
  // the exponent arithmetic of an E8M0 spec without a tensor scale or dither-scale.
  bool power_of_two_elements() const { return scale == ScaleFormat::e8m0 && !tensor_scale && !dither_scale; }
  friend bool operator==(const ScaledSpec&, const ScaledSpec&) = default;
};

// Throws Error naming what is wrong (e.g. a block of 0, delayed per-block scaling, a scale
// format for a fixed-bias quantizer, an element overflow other than saturate).
void validate(const ScaledSpec& s);

// "ELEMENT@GRANULARITY[:OPTION...]" or "PRESET[:OPTION...]" (docs/spec.md §6.4), e.g.
// "e4m3fn@1x32:e8m0:floor", "mxfp4:ceil", "e2m1fn@1x16:ue4m3:nearest:tensor-scale",
// "e4m3fn@tensor:fp32:nearest:delayed-16". GRANULARITY is tensor, line, 1xK or KxK;
// OPTION is a scale format, a rule, tensor-scale (or tensor-scale-folded), scales-on-output
// or scales-folded (float32 scales), current or delayed-N, exact (the default), torchao (UE4M3
// scales: torchao's arithmetic) or te (TransformerEngine's: float32 scales of its current
// scaling, or UE4M3 scales under a tensor scale of its NVFP4 quantizer, §6.9), quartet
// (Quartet II's NVFP4, §6.13), 4over6 (§6.10), dither-scale (§6.11) or eden-N (§6.13). A
// plain format ("1.4.3:10", "e5m2") is the fixed-bias quantizer. Throws Error.
ScaledSpec parse_scaled(std::string_view text);
// Canonical text; parse_scaled(to_string(s)) == s (the element's rounding is not part of it).
std::string to_string(const ScaledSpec& s);

// The name a quantizer's codes are stored under (a code set's format): to_string without
// tensor-scale-folded and scales-folded, which say where products apply the scales and
// change no code, scale or tensor scale; so codes written under either order decode under
// the other.
std::string codes_name(const ScaledSpec& s);

struct ScaledPreset {
  std::string_view name, spec, note;
};
const std::vector<ScaledPreset>& scaled_presets();

// The matrix view and where its scales lie.
struct BlockLayout {
  std::size_t rows = 0, cols = 0;
  std::size_t block_rows = 1, block_cols = 1;  // values per group along each axis
  std::size_t grid_rows() const { return rows == 0 ? 0 : (rows + block_rows - 1) / block_rows; }
  std::size_t grid_cols() const { return cols == 0 ? 0 : (cols + block_cols - 1) / block_cols; }
  std::size_t groups() const { return grid_rows() * grid_cols(); }
};
BlockLayout block_layout(const ScaledSpec& s, std::size_t rows, std::size_t cols);

// What happened, by element and by group.
struct ScaledCounts {
  QuantCounts elements;              // overflow: clamped to the element max; underflow: to zero
  std::uint64_t groups = 0;
  std::uint64_t saturated_groups = 0;  // a finite element clamped to the element max
  std::uint64_t nan_groups = 0;        // NaN or Inf inside: the scale is NaN
  std::uint64_t zero_groups = 0;       // every value zero
  std::uint64_t scale_underflow = 0;   // scale below the scale format's range: clamped or zero
  std::uint64_t scale_overflow = 0;    // scale above it: clamped to the largest
  ScaledCounts& operator+=(const ScaledCounts& o);
  friend bool operator==(const ScaledCounts&, const ScaledCounts&) = default;
};

// One group's scale. `code`: the scale format's code (fp32: the float's bits); `value`: its
// value times the tensor scale, the X that elements are divided by (NaN for a NaN group).
struct GroupScale {
  std::uint32_t code = 0;
  float value = 1.0f;
  int exponent = 0;  // e8m0: log2 of the value (the element bias drops by it)
  // What elements are multiplied by where the spec multiplies() (torchao's and TE's orders): an
  // element is fl32(x * reciprocal). Unused (0) otherwise.
  float reciprocal = 0;
  bool nan = false;
  bool zero = false;  // amax == 0
};

// The element format's emax: floor(log2(max finite)).
int element_emax(const Format& element);
// The scale format's Format (e8m0 / ue4m3); fp32 and none have none.
Format scale_format(ScaleFormat s);

// Throws Error naming `where` and the index of the first of `n` scale codes that is no code
// of s's scale format (E8M0: 0..255; UE4M3: 0..126 and its NaN 127; float32: any bits).
void check_scale_codes(const std::uint32_t* codes, std::size_t n, const ScaledSpec& s, const std::string& where);
// Throws Error naming `where` unless `ts` can be s's tensor scale: a positive finite float32
// for a two-level spec, 1 for the others (a set's parts must belong together).
void check_tensor_scale(float ts, const ScaledSpec& s, const std::string& where);

// The group scale that scale code `code` stands for, under tensor scale `ts` (decoding).
GroupScale scale_from_code(const ScaledSpec& s, std::uint32_t code, float ts);

// The float32 tensor scale of a two-level spec from the tensor's amax (docs/spec.md §6.3;
// te's arithmetic: TransformerEngine's global decode scale, §6.9).
float tensor_scale_of(const ScaledSpec& s, float tensor_amax);

// The tensor scale that group scales are chosen under: `value`, what scale codes are
// multiplied by (tensor_scale_of); `te_encode`, TransformerEngine's global encode factor
// E = fl32(max_e * 448 / amax), from which te's arithmetic forms the block scales of a
// two-level spec (docs/spec.md §6.9; 0 for every other spec). A float converts to a tensor
// scale without E: enough for every spec but te's two-level ones.
struct TensorScale {
  float value = 1;
  float te_encode = 0;
  TensorScale() = default;
  TensorScale(float v) : value(v) {}  // NOLINT(google-explicit-constructor): a plain tensor scale
  TensorScale(float v, float encode) : value(v), te_encode(encode) {}
};
// The tensor scale of s for a tensor (or history) amax, with E where s needs it.
TensorScale tensor_scale_for(const ScaledSpec& s, float tensor_amax);

// The scale of one group with largest magnitude `amax` (NaN: a NaN or Inf in the group), for
// tensor scale `ts` (1 without a second level). Adds to counts->scale_underflow/overflow.
GroupScale choose_scale(const ScaledSpec& s, float amax, const TensorScale& ts, ScaledCounts* counts = nullptr);

// The rule's scale code of every positive finite amax under one tensor scale, by table
// look-up: for a UE4M3 scale (whose code 0 is zero) the code choose_scale gives is a
// non-decreasing step function of amax, fixed by the smallest amax of each code
// (docs/spec.md §6.2). Kernels look each block's amax up instead of searching the codes.
class ScaleSteps {
 public:
  // nullopt for the scale formats it does not cover (all but UE4M3). `target_e`: the element
  // value the amax is scaled to (0: the element format's largest; Four Over Six's 6 and 4).
  static std::optional<ScaleSteps> make(const ScaledSpec& s, float ts, double target_e = 0);
  // The code of a positive finite amax, given as its float32 bits.
  std::uint32_t code(std::uint32_t amax_bits) const {
    const Bucket& b = buckets_[amax_bits >> kShift];
    if (single_) {  // one breakpoint at most; without a branch, which amaxes would mispredict
      const std::uint32_t past = amax_bits >= b.at;
      return b.low + past * static_cast<std::uint32_t>(b.above - b.low);
    }
    std::uint32_t c = b.low;
    while (c < max_ && first_[c + 1] <= amax_bits) ++c;
    return c;
  }
  // Whether choose_scale counts a scale overflow (underflow: code 0) for this amax.
  bool overflow(std::uint32_t amax_bits) const { return amax_bits >= overflow_from_; }
  // The code's scale times the tensor scale: GroupScale::value.
  float value(std::uint32_t code) const { return values_[code]; }
  // The smallest amax (float32 bits) whose code is at least c, for 1 <= c <= max; 0x7F800000
  // where no finite amax reaches c.
  std::uint32_t first(std::uint32_t c) const { return first_[c]; }
  std::uint32_t max_code() const { return max_; }
  // Whether every look-up is one comparison (no bucket holds two breakpoints; otherwise the
  // look-up walks the breakpoints from the bucket's first code).
  bool single_step() const { return single_; }

 private:
  static constexpr int kShift = 19;  // buckets of float32 exponent and 4 mantissa bits
  // A bucket of amaxes: the code of its smallest, and the code from `at` on (the bucket's
  // one breakpoint, or past its end).
  struct Bucket {
    std::uint32_t at = 0;
    std::uint8_t low = 0, above = 0;
  };
  std::uint32_t max_ = 0, overflow_from_ = 0;
  bool single_ = true;  // no bucket holds two distinct breakpoints
  std::vector<std::uint32_t> first_;
  std::vector<float> values_;
  std::vector<Bucket> buckets_;
};

// An element scaled by its group (v = x / X, or x * 2^-e), where a finite x whose v lies past
// float32's range takes float32's largest value of its sign: it then saturates, as the exact
// quotient would (docs/spec.md §6.3); only an infinite x stays infinite.
inline float saturate_scaled(float v, float x) {
  return std::isinf(v) && std::isfinite(x) ? std::copysign(std::numeric_limits<float>::max(), v) : v;
}

// dither-scale's element before rounding, fl32(3 x) * 2^-(e+2) (saturate_scaled where a finite
// x overflows), and its value after, fl32(fl32(q * 2^(e+2)) / 3), for E8M0 exponent e
// (docs/spec.md §6.11). Each product by 2^k is exact in double and rounded once to float32, as
// the float32 division by 2^(e+2) rounds.
inline double dither_power(int k) { return std::bit_cast<double>(static_cast<std::uint64_t>(1023 + k) << 52); }
inline float dither_scaled(float x, int e) {
  return saturate_scaled(static_cast<float>(static_cast<double>(3.0f * x) * dither_power(-(e + 2))), x);
}
inline float dither_value(float q, int e) { return static_cast<float>(static_cast<double>(q) * dither_power(e + 2)) / 3.0f; }

// Largest finite |x| (0 if none) and whether any value is NaN or Inf.
struct Amax {
  float value = 0;
  bool nonfinite = false;
};
Amax amax_of(const float* x, std::size_t n, std::size_t stride = 1);

// A group's values, for the choices that look at more than its amax (four_over_six): element
// (r, c), r < rows and c < cols, at x[r * stride + c], with stochastic-rounding index
// first_index + r * index_stride + c.
struct GroupValues {
  const float* x = nullptr;
  std::size_t rows = 1, cols = 0, stride = 0;
  std::uint64_t first_index = 0, index_stride = 0;
};

// The scale of one group whose values have amax `a` (a NaN scale if they hold NaN or Inf),
// or of `history_amax` when given (delayed per-tensor scaling), counted in *counts as a
// group (zero, NaN, scale range). A four_over_six spec needs the group's `values` (throws
// Error without them) and gives the scale of the two it keeps (docs/spec.md §6.10).
GroupScale scale_group(const ScaledSpec& s, const Amax& a, const TensorScale& ts, ScaledCounts* counts,
                       std::optional<float> history_amax = std::nullopt, const GroupValues* values = nullptr);

// Four Over Six's sum of squared errors of a group quantized with scale g: (y - x)^2 summed
// in double in the group's row-major order, y each element's value (docs/spec.md §6.10).
double four_over_six_error(const ScaledSpec& s, const GroupScale& g, const GroupValues& v);
// Whether Four Over Six keeps the scale for 4 for a group of n values x (row-major) whose
// values are y6 under the scale for 6 and y4 under the scale for 4: the errors summed as
// four_over_six_error sums them (the kernels' choice, on values they computed).
bool four_over_six_keeps_four(const float* x, const float* y6, const float* y4, std::size_t n);

// The amax history of delayed scaling for one tensor: the largest of the last `length`
// tensor amaxes. Empty: the tensor's current amax is used.
class AmaxHistory {
 public:
  explicit AmaxHistory(int length = 0) : length_(length) {}
  void push(float amax);
  std::optional<float> amax() const;
  int length() const { return length_; }
  const std::deque<float>& values() const { return values_; }
  void restore(std::deque<float> values);  // from a checkpoint; throws Error if too long
  friend bool operator==(const AmaxHistory&, const AmaxHistory&) = default;

 private:
  int length_ = 0;
  std::deque<float> values_;
};

// Where a scaled quantization writes; any pointer may be null.
struct ScaledOut {
  float* values = nullptr;              // rows*cols fake-quantized values
  std::uint8_t* codes = nullptr;        // rows*cols element codes (element width <= 8)
  std::uint32_t* scale_codes = nullptr; // layout.groups() scale codes, row-major grid
  float* tensor_scale = nullptr;        // the second-level scale (1 without one)
  // The top half of each value's float32 bits (its bfloat16 value where it is one), written
  // by the kernels (kernels::scaled_quantize) only; with it, *bf16_exact says whether every
  // value was a bfloat16 value (all bottom halves zero).
  std::uint16_t* bf16 = nullptr;
  bool* bf16_exact = nullptr;
  // values and bf16 hold each element times its group's scale-format value, the tensor scale
  // left out (a product's operand that applies the tensor scale to its output, docs/spec.md
  // §6.7). No effect without a tensor scale.
  bool without_tensor_scale = false;
};

struct ScaledCall {
  std::optional<float> delayed_amax;  // the tensor-level amax to use (delayed scaling)
  std::uint64_t index_offset = 0;     // stochastic rounding index of element 0
  // The tensor's current amax (its largest finite |x|), where the caller already has it from
  // quantizing the same values along another axis: the kernels then skip the pass that
  // finds it for a tensor scale or a history. It must be that amax (the reference, which
  // always finds its own, is what the kernels are tested against with and without it).
  std::optional<float> known_amax;
};

// The scalar reference (docs/spec.md §6). x is row-major [rows, cols]. Returns the tensor's
// current amax (largest finite |x|), which delayed scaling pushes into its history.
float scaled_quantize_reference(const float* x, std::size_t rows, std::size_t cols,
                                const ScaledSpec& s, const ScaledOut& out,
                                const ScaledCall& call = {}, ScaledCounts* counts = nullptr);

// Values of codes written by a scaled quantization (NaN for a NaN group).
void scaled_decode_reference(const std::uint8_t* codes, const std::uint32_t* scale_codes,
                             float tensor_scale, std::size_t rows, std::size_t cols,
                             const ScaledSpec& s, float* y);

// The quartet arithmetic (docs/spec.md §6.13). Its constants: the largest block scale its
// tensor scale leaves room for (448; 255.99 under eden, room for the correction) and the
// element value m a block's amax maps to (6; 6 / 0.988125 under eden), both float32.
struct QuartetConstants {
  float top, m;
};
QuartetConstants quartet_constants(const ScaledSpec& s);
// MS-EDEN's scalar reference (an eden spec): quantizes rows [r0, r1) of the row-major matrix
// x [rows, cols] (1xK blocks along each row) under tensor scale ts (tensor_scale_of), writing
// out's codes, scale codes, values and bf16 at their flat offsets (out.tensor_scale and
// out.bf16_exact are the caller's); each element from its own quotient and rounding. Returns
// whether every value was a bfloat16 value (all bottom halves zero).
bool quartet_quantize_rows(const float* x, std::size_t r0, std::size_t r1, std::size_t cols, const ScaledSpec& s,
                           float ts, const ScaledOut& out, const ScaledCall& call, ScaledCounts* counts);
// MS-EDEN's correction on rows [r0, r1) that the quartet arithmetic quantized without it (the
// kernels' path): from x, the element codes and the scale codes s_b (row-major grid), which
// it replaces with the corrected ones, it writes out's values and bf16 (as quartet_quantize_rows
// does) and adds the correction's scale overflows and underflows to *counts.
bool eden_correct_rows(const float* x, std::size_t r0, std::size_t r1, std::size_t cols, const ScaledSpec& s,
                       float ts, const std::uint8_t* codes, std::uint32_t* scale_codes, const ScaledOut& out,
                       const ScaledCall& call, ScaledCounts* counts);
// MS-EDEN's window correction c = fl32(num) / fl32(den), 1 where den is 0 or c is not finite.
float eden_correction(double num, double den);
// MS-EDEN's scale code for a block of UE4M3 scale s_b and correction c: fl32(s_b c) rounded
// stochastically to UE4M3 with the random bits of `index` (s's element stream), saturating.
// *past_top: whether fl32(s_b c) lay above 448.
std::uint32_t eden_scale_code(const ScaledSpec& s, float scale, float c, std::uint64_t index, bool* past_top);
// A value of MS-EDEN (the quartet arithmetic with eden): fl32(fl32(q s) ts), element value q,
// block scale s. Without eden, a value is q times X = fl32(s ts), as in the other arithmetics.
inline float quartet_value(float q, float scale, float ts) { return (q * scale) * ts; }

// Bits of storage per element, scales included (e.g. 4.25 for MXFP4 at K = 32).
double bits_per_element(const ScaledSpec& s, std::size_t rows, std::size_t cols);

}  // namespace fp8lab
