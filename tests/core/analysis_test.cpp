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
  // Fixed point on a normal signal: the Monte Carlo estimate of Figure 7b.
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
  for (Distribution dist : {Distribution::normal, Distribution::uniform, Distribution::laplace, Distribution::loguniform,
                            Distribution::student_t, Distribution::outliers})
    EXPECT_EQ(parse_distribution(to_string(dist)), dist);
  EXPECT_EQ(parse_distribution("gaussian"), Distribution::normal);
  EXPECT_EQ(parse_distribution("log-uniform"), Distribution::loguniform);
  EXPECT_EQ(parse_distribution("t"), Distribution::student_t);
  EXPECT_EQ(parse_distribution("outliers"), Distribution::outliers);
}

TEST(Analysis, DistributionSpecsParsePrintAndRefuse) {
  const DistSpec t = parse_dist_spec("student-t:2.5");
  EXPECT_EQ(t.dist, Distribution::student_t);
  EXPECT_EQ(t.dof, 2.5);
  EXPECT_EQ(to_string(t), "student-t:2.5");
  const DistSpec o = parse_dist_spec("normal-outliers:0.01:50");
  EXPECT_EQ(o.outlier_fraction, 0.01);
  EXPECT_EQ(o.outlier_scale, 50);
  EXPECT_EQ(parse_dist_spec(to_string(o)).outlier_scale, 50);
  EXPECT_EQ(parse_dist_spec("laplace").dist, Distribution::laplace);
  for (const char* bad : {"student-t", "student-t:0", "student-t:-1", "student-t:3:4", "normal:1",
                          "normal-outliers:2:10", "normal-outliers:0.1", "normal-outliers:0.1:nan", "cauchy"})
    EXPECT_THROW(parse_dist_spec(bad), Error) << bad;
}

TEST(Analysis, HeavyTailedSamplesHaveTheirMoments) {
  // Student's t with 10 degrees of freedom: variance 10/8; P(|t| > 3.169) = 0.01 (tables).
  DistSpec t = parse_dist_spec("student-t:10");
  const auto x = sample(t, 1 << 20, 3);
  double ss = 0;
  std::size_t beyond = 0;
  for (float v : x) {
    ss += static_cast<double>(v) * v;
    beyond += std::fabs(v) > 3.169f;
  }
  EXPECT_NEAR(ss / x.size(), signal_power(t), 0.03 * signal_power(t));
  EXPECT_NEAR(static_cast<double>(beyond) / x.size(), 0.01, 0.001);
  // Outliers: 1 % of values from N(0, 100^2), of which 92 % lie beyond 10 (inliers never).
  DistSpec o = parse_dist_spec("normal-outliers:0.01:100");
  const auto y = sample(o, 1 << 20, 4);
  std::size_t big = 0;
  for (float v : y) big += std::fabs(v) > 10.0f;
  EXPECT_NEAR(static_cast<double>(big) / y.size(), 0.01 * 0.9203, 0.0006);
  EXPECT_DOUBLE_EQ(signal_power(o), 0.99 + 0.01 * 1e4);
  EXPECT_TRUE(std::isinf(signal_power(parse_dist_spec("student-t:2"))));
}

TEST(Analysis, ScaledSnrFollowsTheElementFormat) {
  // A float32 per-tensor scale that keeps every value in range: E4M3's relative precision,
  // the Appendix B model (7.44 + 6.02 * 4 = 31.5 dB), whatever the distribution's scale.
  for (double sigma : {1e-6, 1.0, 1e6}) {
    DistSpec d;
    d.scale = sigma;
    const auto x = sample(d, 1 << 18, 5);
    EXPECT_NEAR(measured_snr_db(parse_scaled("e4m3fn@tensor:fp32:ceil"), x, 1024), 31.5, 0.5) << sigma;
  }
  // On heavy tails, smaller blocks help FP4 and cost it nothing to its fixed-bias self.
  const auto x = sample(parse_dist_spec("student-t:3"), 1 << 18, 6);
  const double b16 = measured_snr_db(parse_scaled("e2m1fn@1x16:e8m0:floor"), x, 1024);
  const double b128 = measured_snr_db(parse_scaled("e2m1fn@1x128:e8m0:floor"), x, 1024);
  const double tensor = measured_snr_db(parse_scaled("e2m1fn@tensor:e8m0:floor"), x, 1024);
  EXPECT_GT(b16, b128);
  EXPECT_GT(b128, tensor);
  EXPECT_EQ(measured_snr_db(parse_scaled("1.4.3:7"), x, 1024), measured_snr_db(parse_format("1.4.3:7"), x));
  EXPECT_THROW(measured_snr_db(parse_scaled("mxfp4"), x, 1000), Error);  // not whole rows
}
