// A hardware model of the dot products inside a matrix unit (docs/spec.md §7.4): products
// formed exactly, aligned in groups to the group's largest term keeping a fixed number of
// bits, summed exactly, rounded into an accumulator of a given width, and promoted to a
// float32 sum every so many products. The presets model published measurements of GPU
// tensor cores and the OCP MX specification's dot product (docs/spec.md §7.4 cites each).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace fp8lab {

struct DotModel {
  int group = 32;             // k: products aligned and summed together, with the accumulator
  int frac = 13;              // F: bits kept below the leading bit of the group's largest term
  bool align_nearest = false;  // alignment rounds to nearest-even; false: truncates (toward zero)
  int acc_bits = 24;          // W: significand bits of the accumulator (float32's exponent range)
  bool acc_nearest = false;   // each group's sum rounds into it to nearest-even; false: toward zero
  std::int64_t promote = 0;   // n: every n products the accumulator is added to a float32 sum; 0 never
  friend bool operator==(const DotModel&, const DotModel&) = default;
};

// Limits of the parameters (docs/spec.md §7.4): 1 <= group <= 64, 0 <= frac <= 100,
// 1 <= acc_bits <= 24, promote 0 or a positive multiple of group.
constexpr int kMaxDotGroup = 64, kMaxDotFrac = 100;
// Throws Error naming the parameter out of range.
void validate(const DotModel& m);

// sum_i a[i * a_stride] * b[i * b_stride] for i < n under the model, as float32. A NaN
// operand, or infinite products of both signs, give NaN; otherwise an infinite product gives
// its infinity; a finite sum beyond float32's range gives an infinity under nearest-even
// rounding and the largest finite value toward zero.
float model_dot(const float* a, std::ptrdiff_t a_stride, const float* b, std::ptrdiff_t b_stride, std::int64_t n,
                const DotModel& m);

// The presets, each with its name and what it models (docs/spec.md §7.4).
struct DotPreset {
  std::string_view name;
  DotModel model;
  std::string_view models;
};
const std::vector<DotPreset>& dot_presets();

// "hopper-fp8" for a preset, else the general form
// "dot:group=K:frac=F:align=truncate|nearest:acc=W:acc_round=truncate|nearest:promote=N".
std::string to_string(const DotModel& m);
// A preset's name or the general form (keys in any order, each at most once; those not
// given keep DotModel's defaults). Throws Error naming the problem.
DotModel parse_dot_model(std::string_view text);

}  // namespace fp8lab
