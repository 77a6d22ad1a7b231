// Quartet II's NVFP4 arithmetic and MS-EDEN (docs/spec.md §6.13): the constants, the scalar
// reference of MS-EDEN (each element from its own quotient), and the correction the kernels
// apply to their own quantization without it.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "fp8lab/core/codec.hpp"
#include "fp8lab/core/error.hpp"
#include "fp8lab/core/scaled.hpp"

namespace fp8lab {

QuartetConstants quartet_constants(const ScaledSpec& s) {
  // Quartet II's forward kernel: scales up to 448 for an element value of 6. Its MS-EDEN
  // kernel: up to 255.99, room for the correction, and 6 / scale_override with the backward
  // pass's override (17/16) * 0.93, as the published code computes it in double.
  if (s.eden == 0) return {448.0f, 6.0f};
  return {255.99f, static_cast<float>(6.0 / (17.0 / 16.0 * 0.93))};
}

float eden_correction(double num, double den) {
  const auto n = static_cast<float>(num), d = static_cast<float>(den);
  const float c = d == 0 ? 1.0f : n / d;
  return std::isfinite(c) ? c : 1.0f;
}

std::uint32_t eden_scale_code(const ScaledSpec& s, float scale, float c, std::uint64_t index, bool* past_top) {
  static const Format ue4m3 = scale_format(ScaleFormat::ue4m3);
  static const auto top = static_cast<float>(ue4m3.max_finite());
  const float t = scale * c;
  if (past_top) *past_top = t > top;
  return encode(t, QuantSpec{ue4m3, Rounding::stochastic, Overflow::saturate, 32, s.element.seed}, index);
}

namespace {

// One group of a window: where it lies, its scale and what it wrote.
struct EdenGroup {
  std::size_t begin = 0, len = 0;  // flat offset and length
  std::size_t index = 0;           // of its scale code in the row-major grid
  GroupScale g;
  bool counted_underflow = false;  // choose_scale counted a scale underflow already
  bool counted_overflow = false;   // and an overflow
};

// Writes value y of flat offset i (values and the bfloat16 top half); false where the bottom
// half of a bfloat16 output is not zero.
bool write_value(const ScaledOut& out, std::size_t i, float y) {
  if (out.values) out.values[i] = y;
  if (!out.bf16) return true;
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(y);
  out.bf16[i] = static_cast<std::uint16_t>(bits >> 16);
  return (bits & 0xFFFFu) == 0;
}

// One window's quantization: its groups, their element values q and the sums of v^2 and v q.
class Window {
 public:
  Window(const float* x, const ScaledSpec& s, float ts, const ScaledOut& out, const ScaledCall& call,
         ScaledCounts& counts)
      : x_(x), s_(s), ts_(ts), out_(out), call_(call), counts_(counts) {}

  // Quantizes the groups of row r's columns [c0, c1) (cols per row) and corrects their scales. Returns false where a bfloat16 output lost bits.
  bool run(std::size_t r, std::size_t c0, std::size_t c1, std::size_t cols) {
    groups_.clear();
    q_.assign(c1 - c0, 0.0f);
    num_ = den_ = 0;
    first_ = r * cols + c0;
    const auto K = static_cast<std::size_t>(s_.block);
    const std::size_t grid_cols = (cols + K - 1) / K;
    for (std::size_t c = c0; c < c1; c += K) quantize_group(r * cols + c, std::min(K, c1 - c), r * grid_cols + c / K);
    correct();
    return write();
  }

 private:
  void quantize_group(std::size_t begin, std::size_t len, std::size_t index) {
    EdenGroup e{begin, len, index, {}, false, false};
    const ScaledCounts before = counts_;
    e.g = scale_group(s_, amax_of(x_ + begin, len), TensorScale(ts_), &counts_);
    e.counted_underflow = counts_.scale_underflow > before.scale_underflow;
    e.counted_overflow = counts_.scale_overflow > before.scale_overflow;
    const std::uint64_t overflow_before = counts_.elements.overflow;
    for (std::size_t i = begin; i < begin + len; ++i) quantize_element(e.g, i);
    if (counts_.elements.overflow > overflow_before) ++counts_.saturated_groups;
    if (out_.scale_codes) out_.scale_codes[index] = e.g.code;
    groups_.push_back(e);
  }

  void quantize_element(const GroupScale& g, std::size_t i) {
    const Format& f = s_.element.format;
    const float x = x_[i];
    QuantCounts& qc = counts_.elements;
    ++qc.total;
    std::uint32_t code;
    if (g.nan) {
      code = f.has_nan() ? f.nan_code(false) : 0;
      ++qc.nan;
    } else {
      // A scale that underflowed to 0 (X = fl32(s ts)) quantizes every element to zero.
      const float v = g.value == 0 ? std::copysign(0.0f, x) : saturate_scaled(x / g.value, x);
      QuantCounts one;
      code = encode(v, s_.element, call_.index_offset + i, &one);
      --one.total;
      if (v == 0 && x != 0) ++one.underflow;
      qc += one;
      const float q = decode(code, f);
      q_[i - first_] = q;
      num_ += static_cast<double>(v) * v;
      den_ += static_cast<double>(v) * q;
    }
    if (out_.codes) out_.codes[i] = static_cast<std::uint8_t>(code);
  }

  // MS-EDEN: each finite group's scale corrected by the window's c (eden_scale_code), with the
  // random bits of its first element's index.
  void correct() {
    const float c = eden_correction(num_, den_);
    for (EdenGroup& e : groups_) {
      if (e.g.nan) continue;
      bool past_top = false;
      e.g.code = eden_scale_code(s_, unit_scale(e.g.code), c, call_.index_offset + e.begin, &past_top);
      if (past_top && !e.counted_overflow) ++counts_.scale_overflow;
      if (e.g.code == 0 && !e.g.zero && !e.counted_underflow) ++counts_.scale_underflow;
      if (out_.scale_codes) out_.scale_codes[e.index] = e.g.code;
    }
  }

  float unit_scale(std::uint32_t code) const { return scale_from_code(s_, code, 1.0f).value; }

  // Values fl32(fl32(q s) ts), or q s where the tensor scale is left out (docs/spec.md §6.7).
  bool write() {
    bool exact = true;
    const bool unit = out_.without_tensor_scale;
    for (const EdenGroup& e : groups_) {
      const float s = unit_scale(e.g.code);
      for (std::size_t i = e.begin; i < e.begin + e.len; ++i) {
        const float q = q_[i - first_];
        const float y = e.g.nan ? std::numeric_limits<float>::quiet_NaN() : unit ? q * s : quartet_value(q, s, ts_);
        exact &= write_value(out_, i, y);
      }
    }
    return exact;
  }

  const float* x_;
  const ScaledSpec& s_;
  float ts_;
  const ScaledOut& out_;
  const ScaledCall& call_;
  ScaledCounts& counts_;
  std::vector<EdenGroup> groups_;
  std::vector<float> q_;  // the element values of the window (0 in NaN groups)
  double num_ = 0, den_ = 0;
  std::size_t first_ = 0;
};

}  // namespace

bool quartet_quantize_rows(const float* x, std::size_t r0, std::size_t r1, std::size_t cols, const ScaledSpec& s,
                           float ts, const ScaledOut& out, const ScaledCall& call, ScaledCounts* counts) {
  if (s.eden == 0) throw Error("quartet_quantize_rows: '" + to_string(s) + "' is no MS-EDEN spec (option eden-N)");
  ScaledCounts local;
  Window w(x, s, ts, out, call, local);
  const auto N = static_cast<std::size_t>(s.eden);
  bool exact = true;
  for (std::size_t r = r0; r < r1; ++r)
    for (std::size_t c = 0; c < cols; c += N) exact &= w.run(r, c, std::min(cols, c + N), cols);
  if (counts) *counts += local;
  return exact;
}

namespace {

// MS-EDEN's correction of quantized rows (eden_correct_rows), a row at a time: the sums of
// v = fl32(x / X) and q = the element value of its code over each window's finite groups, then
// each group's new scale and its values.
class Correction {
 public:
  Correction(const float* x, std::size_t cols, const ScaledSpec& s, float ts, const std::uint8_t* codes,
             std::uint32_t* scale_codes, const ScaledOut& out, const ScaledCall& call, ScaledCounts& counts)
      : x_(x), cols_(cols), K_(static_cast<std::size_t>(s.block)), grid_cols_((cols + K_ - 1) / K_), s_(s), ts_(ts),
        codes_(codes), scale_codes_(scale_codes), out_(out), call_(call), counts_(counts),
        N_(static_cast<std::size_t>(s.eden)) {
    const Format sf = scale_format(s.scale);
    nan_code_ = sf.nan_code(false);
    top_code_ = sf.max_code();
    one_code_ = encode(1.0f, QuantSpec{sf});
    quotient_m_ = quartet_constants(s).m;
    top_ = static_cast<float>(sf.max_finite());
    for (std::uint32_t c = 0; c < 256; ++c) {
      element_[c] = c < 16 ? decode(c, s.element.format) : 0.0f;
      scale_[c] = c <= sf.max_code() ? static_cast<float>(sf.magnitude(c)) : std::numeric_limits<float>::quiet_NaN();
    }
  }

  // One row: v = fl32(x / X) and q of every value (zeros in NaN groups and where X is 0, which
  // then add nothing), each window's sums in its own order (four windows' chains at a time), then each
  // group's corrected scale and its values.
  bool run_row(std::size_t r) {
    const std::size_t row = r * cols_;
    v_.resize(cols_);
    q_.resize(cols_);
    constexpr float kMax = std::numeric_limits<float>::max();
    for (std::size_t g = 0; g < grid_cols_; ++g) {
      const std::uint32_t code = scale_codes_[r * grid_cols_ + g];
      const std::size_t c0 = g * K_, c1 = std::min(cols_, c0 + K_);
      const bool nan = code == nan_code_;
      const float X = nan ? 0.0f : scale_[code] * ts_;
      const float* x = x_ + row;
      if (X == 0) {
        std::fill(v_.begin() + static_cast<std::ptrdiff_t>(c0), v_.begin() + static_cast<std::ptrdiff_t>(c1), 0.0f);
      } else {
        for (std::size_t c = c0; c < c1; ++c) {  // saturate_scaled, without a branch
          const float v = x[c] / X;
          v_[c] = std::abs(v) > kMax && std::abs(x[c]) <= kMax ? std::copysign(kMax, v) : v;
        }
      }
      for (std::size_t c = c0; c < c1; ++c) q_[c] = nan ? 0.0f : element_[codes_[row + c]];
    }
    sum_windows();
    bool exact = true;
    for (std::size_t g = 0; g < grid_cols_; ++g) {
      std::uint32_t& code = scale_codes_[r * grid_cols_ + g];
      const std::size_t begin = row + g * K_, end = row + std::min(cols_, (g + 1) * K_);
      if (code != nan_code_) code = corrected(code, cor_[g * K_ / N_], begin, end);
      const float unit = code == nan_code_ ? std::numeric_limits<float>::quiet_NaN() : scale_[code];
      for (std::size_t i = begin; i < end; ++i) {
        const float q = element_[codes_[i]];
        exact &= write_value(out_, i, out_.without_tensor_scale ? q * unit : quartet_value(q, unit, ts_));
      }
    }
    return exact;
  }

 private:
  // cor_[w]: the correction of window w of the row in v_ and q_, its sums in float64 in the
  // row's order; four whole windows' chains interleaved (the same sums, added sooner).
  void sum_windows() {
    const std::size_t windows = (cols_ + N_ - 1) / N_, whole = cols_ / N_;
    cor_.resize(windows);
    std::size_t w = 0;
    for (; w + 4 <= whole; w += 4) {
      double num[4] = {0, 0, 0, 0}, den[4] = {0, 0, 0, 0};
      const float* v = v_.data() + w * N_;
      const float* q = q_.data() + w * N_;
      for (std::size_t i = 0; i < N_; ++i)
        for (std::size_t k = 0; k < 4; ++k) {
          const double a = v[k * N_ + i];
          num[k] += a * a;
          den[k] += a * q[k * N_ + i];
        }
      for (std::size_t k = 0; k < 4; ++k) cor_[w + k] = eden_correction(num[k], den[k]);
    }
    for (; w < windows; ++w) {
      double num = 0, den = 0;
      for (std::size_t c = w * N_; c < std::min(cols_, (w + 1) * N_); ++c) {
        const double a = v_[c];
        num += a * a;
        den += a * q_[c];
      }
      cor_[w] = eden_correction(num, den);
    }
  }

  // The group's corrected code, counting a scale overflow or underflow its first scale had not
  // (its quotient amax / m / ts past 448, or at most 2^-10, which rounds to UE4M3's 0; either
  // leaves the first scale at 448 or at 1, the only codes whose amax is looked at).
  std::uint32_t corrected(std::uint32_t code, float cor, std::size_t begin, std::size_t end) {
    bool was_under = false, was_over = false;
    float amax = 1;  // any non-zero value where the amax is not needed
    if (code == top_code_ || code == one_code_) {
      amax = amax_of(x_ + begin, end - begin).value;
      const float quotient = std::min(amax / quotient_m_ / ts_, std::numeric_limits<float>::max());
      was_under = amax != 0 && quotient <= 0x1p-10f;
      was_over = quotient > top_;
    }
    bool past_top = false;
    const std::uint32_t out = eden_scale_code(s_, scale_[code], cor, call_.index_offset + begin, &past_top);
    if (past_top && !was_over) ++counts_.scale_overflow;
    if (out == 0 && amax != 0 && !was_under) ++counts_.scale_underflow;
    return out;
  }

  const float* x_;
  std::size_t cols_, K_, grid_cols_;
  const ScaledSpec& s_;
  float ts_;
  const std::uint8_t* codes_;
  std::uint32_t* scale_codes_;
  const ScaledOut& out_;
  const ScaledCall& call_;
  ScaledCounts& counts_;
  std::uint32_t nan_code_, top_code_, one_code_;
  float quotient_m_, top_;
  float element_[256], scale_[256];
  std::size_t N_;
  std::vector<float> v_, q_, cor_;  // of the row: its values and windows
};

}  // namespace

bool eden_correct_rows(const float* x, std::size_t r0, std::size_t r1, std::size_t cols, const ScaledSpec& s,
                       float ts, const std::uint8_t* codes, std::uint32_t* scale_codes, const ScaledOut& out,
                       const ScaledCall& call, ScaledCounts* counts) {
  ScaledCounts local;
  Correction c(x, cols, s, ts, codes, scale_codes, out, call, local);
  bool exact = true;
  for (std::size_t r = r0; r < r1; ++r) exact &= c.run_row(r);
  if (counts) *counts += local;
  return exact;
}

}  // namespace fp8lab
