// Quartet II's NVFP4 arithmetic and MS-EDEN (docs/spec.md §6.13): the one implementation
// that the scalar reference and the kernels both run, a row range at a time.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "fp8lab/core/codec.hpp"
#include "fp8lab/core/scaled.hpp"

namespace fp8lab {

QuartetConstants quartet_constants(const ScaledSpec& s) {
  // Quartet II's forward kernel: scales up to 448 for an element value of 6. Its MS-EDEN
  // kernel: up to 255.99, room for the correction, and 6 / scale_override with the backward
  // pass's override (17/16) * 0.93, as the published code computes it in double.
  if (s.eden == 0) return {448.0f, 6.0f};
  return {255.99f, static_cast<float>(6.0 / (17.0 / 16.0 * 0.93))};
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

// Row-major state of one window's quantization: the scaled elements v and the element values q.
class Window {
 public:
  Window(const float* x, const ScaledSpec& s, float ts, const ScaledOut& out, const ScaledCall& call,
         ScaledCounts& counts)
      : x_(x), s_(s), ts_(ts), out_(out), call_(call), counts_(counts) {}

  // Quantizes the groups of row r's columns [c0, c1) (cols per row) and, under eden, corrects
  // their scales. Returns false where a bfloat16 output lost bits.
  bool run(std::size_t r, std::size_t c0, std::size_t c1, std::size_t cols) {
    groups_.clear();
    v_.assign(c1 - c0, 0.0f);
    q_.assign(c1 - c0, 0.0f);
    num_ = den_ = 0;
    first_ = r * cols + c0;
    const auto K = static_cast<std::size_t>(s_.block);
    const std::size_t grid_cols = (cols + K - 1) / K;
    for (std::size_t c = c0; c < c1; c += K) quantize_group(r * cols + c, std::min(K, c1 - c), r * grid_cols + c / K);
    if (s_.eden != 0) correct();
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
      v_[i - first_] = v;
      q_[i - first_] = q;
      num_ += static_cast<double>(v) * v;
      den_ += static_cast<double>(v) * q;
    }
    if (out_.codes) out_.codes[i] = static_cast<std::uint8_t>(code);
  }

  // MS-EDEN: the window's correction c = fl32(num) / fl32(den) (1 where den is 0 or c is not
  // finite); each finite group's scale fl32(s c) rounded stochastically to UE4M3 with the
  // random bits of its first element's index, saturating at 448.
  void correct() {
    const auto num = static_cast<float>(num_), den = static_cast<float>(den_);
    float c = den == 0 ? 1.0f : num / den;
    if (!std::isfinite(c)) c = 1.0f;
    const Format sf = scale_format(s_.scale);
    const QuantSpec sr{sf, Rounding::stochastic, Overflow::saturate, 32, s_.element.seed};
    const float top = static_cast<float>(sf.max_finite());
    for (EdenGroup& e : groups_) {
      if (e.g.nan) continue;
      const float t = unit_scale(e.g.code) * c;
      e.g.code = encode(t, sr, call_.index_offset + e.begin);
      if (t > top && !e.counted_overflow) ++counts_.scale_overflow;
      if (e.g.code == 0 && !e.g.zero && !e.counted_underflow) ++counts_.scale_underflow;
      if (out_.scale_codes) out_.scale_codes[e.index] = e.g.code;
    }
  }

  float unit_scale(std::uint32_t code) const { return scale_from_code(s_, code, 1.0f).value; }

  // Values fl32(q fl32(s ts)), under eden fl32(fl32(q s) ts), or q s where the tensor scale is
  // left out (docs/spec.md §6.7).
  bool write() {
    bool exact = true;
    const bool unit = out_.without_tensor_scale;
    for (const EdenGroup& e : groups_) {
      const float s = unit_scale(e.g.code), X = s * ts_;
      for (std::size_t i = e.begin; i < e.begin + e.len; ++i) {
        const float q = q_[i - first_];
        const float y = e.g.nan ? std::numeric_limits<float>::quiet_NaN()
                        : unit  ? q * s
                        : s_.eden != 0 ? quartet_value(q, s, ts_)
                                       : q * X;
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
  std::vector<float> v_, q_;
  double num_ = 0, den_ = 0;
  std::size_t first_ = 0;
};

}  // namespace

bool quartet_quantize_rows(const float* x, std::size_t r0, std::size_t r1, std::size_t cols, const ScaledSpec& s,
                           float ts, const ScaledOut& out, const ScaledCall& call, ScaledCounts* counts) {
  ScaledCounts local;
  Window w(x, s, ts, out, call, local);
  const auto N = static_cast<std::size_t>(s.eden != 0 ? s.eden : s.block);
  bool exact = true;
  for (std::size_t r = r0; r < r1; ++r)
    for (std::size_t c = 0; c < cols; c += N) exact &= w.run(r, c, std::min(cols, c + N), cols);
  if (counts) *counts += local;
  return exact;
}

}  // namespace fp8lab
