// The paper's Table 1 and Appendix A figures, to 0.1 dB, and measured SNR against the models.
#include <gtest/gtest.h>

#include <cmath>

#include "fp8lab/core/analysis.hpp"
#include "fp8lab/core/format.hpp"

using namespace fp8lab;

namespace {
double round1(double v) { return std::round(v * 10) / 10; }
}  // namespace

TEST(Analysis, Table1) {
  struct Row {
    const char* fmt;
    double D, snr;
  } rows[] = {{"fp32", 1667.7, 151.9}, {"fp16", 240.8, 73.7}, {"bf16", 1571.3, 55.6},
              {"dlfloat16", 385.3, 67.6}, {"1.5.2", 197.5, 25.5}, {"1.4.3", 107.8, 31.5},
              {"1.3.4", 66.0, 37.5}};
  for (const auto& r : rows) {
    SCOPED_TRACE(r.fmt);
    const Format f = parse_format(r.fmt);
    EXPECT_EQ(round1(dynamic_range_db(f)), r.D);
    EXPECT_EQ(round1(float_snr_model_db(f)), r.snr);
  }
  // D does not depend on the bias.
  EXPECT_DOUBLE_EQ(dynamic_range_db(parse_format("1.4.3:3")), dynamic_range_db(parse_format("1.4.3:20")));
}

TEST(Analysis, AppendixAFixedPoint) {
  const DistSpec normal;
  EXPECT_EQ(round1(dynamic_range_db(parse_format("1.0.7"))), 42.1);
  EXPECT_EQ(round1(fixed_point_snr_model_db(parse_format("1.0.7:-2"), normal)), 34.9);  // q = 2^-4
  EXPECT_EQ(round1(fixed_point_snr_model_db(parse_format("1.0.7:-1"), normal)), 40.5);  // q = 2^-5
  EXPECT_EQ(round1(fixed_point_snr_model_db(parse_format("1.0.7:0"), normal)), 19.2);   // q = 2^-6
  // The model peaks at 40.5 dB near q = 0.031.
  double best = -1, best_q = 0;
  for (double q = 0.01; q < 0.06; q += 0.0001) {
    const double s = fixed_point_snr_model_db(127, q, normal);
    if (s > best) best = s, best_q = q;
  }
  EXPECT_EQ(round1(best), 40.5);
  EXPECT_NEAR(best_q, 0.031, 0.001);
}

TEST(Analysis, MeasuredSnrAgreesWithTheModels) {
  // Fixed point on a normal signal: the Monte Carlo estimate of Figure 20b.
  for (int bias : {-4, -3, -2, -1, 0, 1}) {
    DistSpec d;
    const auto x = sample(d, 400000, 11);
    const Format f = make_format(0, 7, bias);
    EXPECT_NEAR(measured_snr_db(f, x), fixed_point_snr_model_db(f, d), 0.25) << "bias " << bias;
  }
  // Uniform and Laplace closed forms.
  for (Distribution dist : {Distribution::uniform, Distribution::laplace}) {
    DistSpec d;
    d.dist = dist;
    d.scale = 2.0;
    const auto x = sample(d, 400000, 5);
    // The q^2/12 rounding-noise model is looser for Laplace's cusp at 0 when q is coarse.
    for (int bias : {-3, -2, -1, 0}) {
      const Format f = make_format(0, 7, bias);
      const double tol = dist == Distribution::laplace && bias == -3 ? 0.45 : 0.25;
      EXPECT_NEAR(measured_snr_db(f, x), fixed_point_snr_model_db(f, d), tol)
          << to_string(dist) << " bias " << bias;
    }
  }
  // Floating point inside its range: 7.44 + 6.02 p within a fraction of a dB.
  DistSpec d;
  const auto x = sample(d, 400000, 3);
  for (const char* name : {"1.4.3", "1.5.2", "1.3.4", "1.6.9:31"}) {
    const Format f = parse_format(name);
    EXPECT_NEAR(measured_snr_db(f, x), float_snr_model_db(f), 0.5) << name;
  }
}

TEST(Analysis, SamplesAreDeterministicAndShaped) {
  DistSpec d;
  EXPECT_EQ(sample(d, 100, 1), sample(d, 100, 1));
  EXPECT_NE(sample(d, 100, 1), sample(d, 100, 2));
  for (Distribution dist : {Distribution::normal, Distribution::uniform, Distribution::laplace,
                            Distribution::loguniform}) {
    DistSpec s;
    s.dist = dist;
    s.scale = 3.0;
    s.log2_span = 10;
    const auto x = sample(s, 200000, 9);
    double p = 0;
    for (float v : x) p += static_cast<double>(v) * v;
    EXPECT_NEAR(p / x.size() / signal_power(s), 1.0, 0.03) << to_string(dist);
  }
  EXPECT_THROW(parse_distribution("cauchy"), Error);
}
