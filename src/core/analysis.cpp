#include "fp8lab/core/analysis.hpp"

#include <cmath>
#include <limits>
#include <numbers>
#include <random>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "fp8lab/core/codec.hpp"
#include "fp8lab/core/enum_names.hpp"
#include "fp8lab/core/text.hpp"

namespace fp8lab {

double dynamic_range_db(const Format& f) {
  return 20.0 * std::log10(f.max_finite() / f.min_positive());
}

double float_snr_model_db(const Format& f) { return 7.44 + 6.02 * (f.man_bits + 1); }

namespace {

constexpr EnumName<Distribution> kDistributions[] = {
    {Distribution::normal, "normal"},         {Distribution::uniform, "uniform"},
    {Distribution::laplace, "laplace"},       {Distribution::loguniform, "loguniform"},
    {Distribution::student_t, "student-t"},   {Distribution::outliers, "normal-outliers"}};
constexpr EnumName<Distribution> kDistributionAliases[] = {
    {Distribution::normal, "gaussian"}, {Distribution::loguniform, "log-uniform"},
    {Distribution::student_t, "t"},     {Distribution::outliers, "outliers"}};

}  // namespace

std::string_view to_string(Distribution d) { return enum_name(kDistributions, d); }

Distribution parse_distribution(std::string_view s) {
  if (const auto d = enum_find(kDistributions, s, kDistributionAliases)) return *d;
  throw Error("unknown distribution '" + std::string(s) +
              "': expected normal, uniform, laplace, loguniform, student-t:DOF or "
              "normal-outliers:FRACTION:SCALE");
}

namespace {
double positive_number(std::string_view text, std::string_view what, std::string_view in) {
  const std::string t(trim(text));
  const auto v = parse_number(t);
  if (!v || !(*v > 0))
    throw Error("distribution '" + std::string(in) + "': " + std::string(what) + " must be a positive number (got '" +
                t + "')");
  return *v;
}
}  // namespace

DistSpec parse_dist_spec(std::string_view text) {
  const std::vector<std::string_view> parts = split(text, ':');
  DistSpec d;
  d.dist = parse_distribution(trim(parts[0]));
  const std::size_t want = d.dist == Distribution::student_t ? 2 : d.dist == Distribution::outliers ? 3 : 1;
  if (parts.size() != want && !(d.dist == Distribution::outliers && parts.size() == 1))
    throw Error("distribution '" + std::string(text) + "': " +
                (d.dist == Distribution::student_t        ? std::string("expected student-t:DOF")
                 : d.dist == Distribution::outliers ? std::string("expected normal-outliers:FRACTION:SCALE")
                                                          : std::string(to_string(d.dist)) + " takes no parameters"));
  if (d.dist == Distribution::student_t) d.dof = positive_number(parts[1], "the degrees of freedom", text);
  if (d.dist == Distribution::outliers && parts.size() == 3) {
    d.outlier_fraction = positive_number(parts[1], "the outlier fraction", text);
    if (d.outlier_fraction > 1)
      throw Error("distribution '" + std::string(text) + "': the outlier fraction must be at most 1");
    d.outlier_scale = positive_number(parts[2], "the outlier scale", text);
  }
  return d;
}

std::string to_string(const DistSpec& d) {
  const auto num = [](double v) {
    char b[32];
    std::snprintf(b, sizeof b, "%.17g", v);
    return std::string(b);
  };
  switch (d.dist) {
    case Distribution::student_t: return "student-t:" + num(d.dof);
    case Distribution::outliers: return "normal-outliers:" + num(d.outlier_fraction) + ":" + num(d.outlier_scale);
    default: return std::string(to_string(d.dist));
  }
}

double signal_power(const DistSpec& d) {
  const double s = d.scale;
  switch (d.dist) {
    case Distribution::normal: return s * s;
    case Distribution::uniform: return s * s / 3.0;
    case Distribution::laplace: return 2.0 * s * s;
    case Distribution::loguniform: {
      // E[(s 2^u)^2], u ~ U[-span, 0]  =  s^2 (1 - 4^-span) / (span ln 4)
      const double L = d.log2_span;
      return s * s * (1.0 - std::pow(4.0, -L)) / (L * std::log(4.0));
    }
    case Distribution::student_t:
      return d.dof > 2 ? s * s * d.dof / (d.dof - 2) : std::numeric_limits<double>::infinity();
    case Distribution::outliers: {
      const double p = d.outlier_fraction, k = d.outlier_scale;
      return s * s * ((1 - p) + p * k * k);
    }
  }
  return std::numeric_limits<double>::quiet_NaN();
}

double fixed_point_snr_model_db(const Format& f, const DistSpec& d) {
  if (f.exp_bits != 0) return std::numeric_limits<double>::quiet_NaN();
  return fixed_point_snr_model_db(std::ldexp(1.0, f.man_bits) - 1.0,
                                  std::ldexp(1.0, 1 - f.bias - f.man_bits), d);
}

double fixed_point_snr_model_db(double m, double q, const DistSpec& d) {
  const double a = m * q;  // largest value
  double rounding, clipping;
  switch (d.dist) {
    case Distribution::normal: {
      const double t = a / d.scale;
      const double erf_t = std::erf(t / std::numbers::sqrt2);
      rounding = q * q / 12.0 * erf_t;
      clipping = d.scale * d.scale *
                 ((1.0 + t * t) * (1.0 - erf_t) -
                  std::sqrt(2.0 / std::numbers::pi) * t * std::exp(-t * t / 2.0));
      break;
    }
    case Distribution::uniform: {
      const double s = d.scale;
      rounding = q * q / 12.0 * std::min(a / s, 1.0);
      clipping = a < s ? std::pow(s - a, 3) / (3.0 * s) : 0.0;
      break;
    }
    case Distribution::laplace: {
      const double b = d.scale;
      rounding = q * q / 12.0 * (1.0 - std::exp(-a / b));
      clipping = 2.0 * b * b * std::exp(-a / b);
      break;
    }
    default: return std::numeric_limits<double>::quiet_NaN();
  }
  return 10.0 * std::log10(signal_power(d) / (rounding + clipping));
}

double snr_model_db(const Format& f, const DistSpec& d) {
  return f.exp_bits == 0 ? fixed_point_snr_model_db(f, d) : float_snr_model_db(f);
}

std::vector<float> sample(const DistSpec& d, std::size_t n, std::uint64_t seed) {
  // Our own transforms of mt19937_64's bits, so that samples do not depend on the
  // standard library's distribution implementations.
  if (n > kMaxSamples)
    throw Error("samples: " + std::to_string(n) + " asked, at most " + std::to_string(kMaxSamples) +
                " (2^30, 4 GiB of float32) are drawn at once");
  // The widest values drawn: the scale, times the outliers' own scale.
  const double reach = d.scale * (d.dist == Distribution::outliers ? d.outlier_scale : 1.0);
  if (!(d.scale >= kMinSampleScale) || !(reach <= kMaxSampleScale))
    throw Error("samples: scale " + shortest_float(d.scale) +
                (d.dist == Distribution::outliers ? " times the outlier scale " + shortest_float(d.outlier_scale) : std::string()) +
                " is outside [1e-30, 1e30], where the samples are finite, normal float32 numbers");
  std::mt19937_64 rng(seed);
  const auto uniform01 = [&] {  // in (0, 1)
    return (static_cast<double>(rng() >> 11) + 0.5) * 0x1.0p-53;
  };
  std::vector<float> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    double v = 0;
    switch (d.dist) {
      case Distribution::normal: {  // Box-Muller, one value per pair
        const double u1 = uniform01(), u2 = uniform01();
        v = d.scale * std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
        break;
      }
      case Distribution::uniform: v = d.scale * (2.0 * uniform01() - 1.0); break;
      case Distribution::laplace: {
        const double u = uniform01() - 0.5;
        v = -d.scale * (u < 0 ? -1.0 : 1.0) * std::log(1.0 - 2.0 * std::abs(u));
        break;
      }
      case Distribution::loguniform: {
        const double u = -d.log2_span * uniform01();
        v = d.scale * std::exp2(u) * ((rng() & 1) ? -1.0 : 1.0);
        break;
      }
      case Distribution::student_t: {  // Bailey's polar method: exact for any dof > 0
        double a, b, w;
        do {
          a = 2.0 * uniform01() - 1.0;
          b = 2.0 * uniform01() - 1.0;
          w = a * a + b * b;
        } while (w > 1.0);
        v = d.scale * a * std::sqrt(d.dof * (std::pow(w, -2.0 / d.dof) - 1.0) / w);
        break;
      }
      case Distribution::outliers: {
        const bool outlier = uniform01() < d.outlier_fraction;
        const double u1 = uniform01(), u2 = uniform01();
        v = d.scale * (outlier ? d.outlier_scale : 1.0) * std::sqrt(-2.0 * std::log(u1)) *
            std::cos(2.0 * std::numbers::pi * u2);
        break;
      }
    }
    out[i] = static_cast<float>(v);
  }
  return out;
}

double measured_snr_db(const Format& f, const std::vector<float>& x) {
  QuantSpec q;
  q.format = f;
  double sig = 0, noise = 0;
  for (float v : x) {
    const float y = quantize(v, q);
    if (std::isnan(y)) continue;
    const double e = static_cast<double>(y) - v;
    sig += static_cast<double>(v) * v;
    noise += e * e;
  }
  if (noise == 0) return std::numeric_limits<double>::infinity();
  return 10.0 * std::log10(sig / noise);
}

double measured_snr_db(const ScaledSpec& s, const std::vector<float>& x, std::size_t cols) {
  if (!s.scaled()) return measured_snr_db(s.element.format, x);
  if (cols == 0 || x.size() % cols != 0) throw Error("measured_snr_db: the samples do not fill whole rows");
  std::vector<float> y(x.size());
  scaled_quantize_reference(x.data(), x.size() / cols, cols, s, ScaledOut{y.data()});
  double sig = 0, noise = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(y[i])) continue;
    const double e = static_cast<double>(y[i]) - x[i];
    sig += static_cast<double>(x[i]) * x[i];
    noise += e * e;
  }
  if (noise == 0) return std::numeric_limits<double>::infinity();
  return 10.0 * std::log10(sig / noise);
}

}  // namespace fp8lab
