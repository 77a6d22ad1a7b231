// Format figures (docs/spec.md §3): dynamic range, the SNR models of the paper's appendices, and
// SNR measured on a sampled distribution.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "fp8lab/core/format.hpp"
#include "fp8lab/core/scaled.hpp"

namespace fp8lab {

// D = 20 log10(max finite / min positive), in dB.
double dynamic_range_db(const Format& f);

// Appendix B: SNR_dB = 7.44 + 6.02 p with p = M + 1 (valid inside the dynamic range).
double float_snr_model_db(const Format& f);

// student_t: Student's t with `dof` degrees of freedom, times `scale` (heavy tails);
// outliers: normal(0, scale), except a fraction `outlier_fraction` of the values drawn from
// normal(0, scale * outlier_scale).
enum class Distribution : std::uint8_t { normal, uniform, laplace, loguniform, student_t, outliers };
std::string_view to_string(Distribution d);  // normal, uniform, laplace, loguniform, student-t, normal-outliers
Distribution parse_distribution(std::string_view s);  // a name alone; throws Error

struct DistSpec {
  Distribution dist = Distribution::normal;
  double scale = 1.0;      // normal: sigma; uniform: half-width; laplace: b; loguniform: max |x|
  double log2_span = 16;   // loguniform: |x| = scale * 2^u, u uniform in [-span, 0]
  double dof = 3;                   // student-t
  double outlier_fraction = 0.001;  // normal-outliers
  double outlier_scale = 100;       // normal-outliers
};
// "NAME[:PARAM...]": normal, uniform, laplace, loguniform, student-t:DOF,
// normal-outliers:FRACTION:SCALE (e.g. "student-t:3", "normal-outliers:0.001:100"). The
// distribution's own scale is not part of it. Throws Error naming the bad part.
DistSpec parse_dist_spec(std::string_view text);
std::string to_string(const DistSpec& d);  // the text parse_dist_spec reads
// E{x^2} of the distribution (infinite for Student's t with 2 or fewer degrees of freedom).
double signal_power(const DistSpec& d);

// Appendix A for a scaled integer (E = 0): rounding noise q^2/12 inside +-(m q), clipping
// noise outside, m = 2^M - 1 and q = 2^(1-b-M). For the normal distribution this is the
// paper's equation (eq:SNR) exactly; uniform and Laplace use their own closed forms.
// Returns NaN where no closed form exists (loguniform) or the format is not fixed point.
double fixed_point_snr_model_db(const Format& f, const DistSpec& d);
// The same for any quantization step q and m = largest integer level (2^n - 1).
double fixed_point_snr_model_db(double m, double q, const DistSpec& d);

// The model this project reports for a format: Appendix A for E = 0, Appendix B otherwise.
double snr_model_db(const Format& f, const DistSpec& d);

// Deterministic samples (the same on every machine for a seed).
// At most kMaxSamples (2^30, 4 GiB of float32): more is refused (Error), not allocated.
// The scale (times the outliers' scale) must lie in [kMinSampleScale, kMaxSampleScale].
inline constexpr std::size_t kMaxSamples = std::size_t{1} << 30;
inline constexpr double kMinSampleScale = 1e-30, kMaxSampleScale = 1e30;
std::vector<float> sample(const DistSpec& d, std::size_t n, std::uint64_t seed);

// 10 log10(sum x^2 / sum (x - Q(x))^2) under nearest-even, saturating quantization.
// Uses the scalar codec; NaN results (none under saturation) are ignored.
double measured_snr_db(const Format& f, const std::vector<float>& x);
// The same for a scaled quantizer (the scalar reference), x viewed as a matrix with `cols`
// columns (x.size() a multiple of cols), groups along the rows. NaN groups are ignored.
double measured_snr_db(const ScaledSpec& s, const std::vector<float>& x, std::size_t cols);

}  // namespace fp8lab
