// Mann-Whitney U against published and hand-worked examples.
#include <gtest/gtest.h>

#include <cmath>

#include "../common/testutil.hpp"
#include "fp8lab/results/stats.hpp"

using namespace fp8lab;
using results::Alternative;

TEST(MannWhitney, ScipyDocumentationExample) {
  // scipy.stats.mannwhitneyu's example (Conover): males vs females.
  const std::vector<double> x = {19, 22, 16, 29, 24}, y = {20, 11, 17, 12};
  const auto e = results::mann_whitney_u(x, y, Alternative::two_sided);
  EXPECT_TRUE(e.exact);
  EXPECT_DOUBLE_EQ(e.u, 17.0);
  EXPECT_NEAR(e.p, 0.1111111111111111, 1e-12);  // scipy: method="exact"
  // 7 of the C(9,4) = 126 orderings have U >= 17.
  EXPECT_NEAR(results::mann_whitney_u(x, y, Alternative::greater).p, 7.0 / 126, 1e-12);
  EXPECT_NEAR(results::mann_whitney_u(x, y, Alternative::less).p, 1 - 4.0 / 126, 1e-12);  // U <= 17
  const auto a = results::mann_whitney_u(x, y, Alternative::two_sided, "asymptotic");
  EXPECT_FALSE(a.exact);
  EXPECT_NEAR(a.p, 0.11134688653314041, 1e-12);  // scipy: method="asymptotic"
}

TEST(MannWhitney, HandWorkedWithTies) {
  // x = 1 2 3, y = 3 4 5: ranks 1 2 3.5 | 3.5 5 6, U_x = 6.5 - 6 = 0.5. Of the C(6,3) = 20
  // ways to pick x's ranks, only {1, 2, 3.5} (either 3.5) has a rank sum as low: p = 2/20.
  const auto r = results::mann_whitney_u({1, 2, 3}, {3, 4, 5}, Alternative::less);
  EXPECT_TRUE(r.exact);  // ties are part of the exact distribution
  EXPECT_DOUBLE_EQ(r.u, 0.5);
  EXPECT_NEAR(r.p, 2.0 / 20, 1e-15);
  EXPECT_NEAR(results::mann_whitney_u({1, 2, 3}, {3, 4, 5}, Alternative::greater).p, 1.0, 1e-15);
  EXPECT_NEAR(results::mann_whitney_u({1, 2, 3}, {3, 4, 5}, Alternative::two_sided).p, 4.0 / 20, 1e-15);
  // The normal approximation, one tie pair: sigma^2 = 9/12 (7 - 6/30) = 5.1;
  // less: z = (0.5 - 4.5 + 0.5) / sqrt(5.1) = -1.54983.
  const auto a = results::mann_whitney_u({1, 2, 3}, {3, 4, 5}, Alternative::less, "asymptotic");
  EXPECT_FALSE(a.exact);
  EXPECT_NEAR(a.z, -3.5 / std::sqrt(5.1), 1e-12);
  EXPECT_NEAR(a.p, 0.060597, 1e-5);
  // Every value tied: every assignment has the same U, so p is 1 either way.
  EXPECT_DOUBLE_EQ(results::mann_whitney_u({2, 2}, {2, 2}, Alternative::less).p, 1.0);
}

TEST(MannWhitney, AlternativesParseAndPrintBack) {
  for (Alternative a : {Alternative::less, Alternative::greater, Alternative::two_sided})
    EXPECT_EQ(results::parse_alternative(results::to_string(a)), a);
  EXPECT_EQ(results::to_string(Alternative::two_sided), "two-sided");
  EXPECT_NE(test::error_of([] { (void)results::parse_alternative("lower"); })
                .find("unknown alternative 'lower' (known: less, greater, two-sided)"),
            std::string::npos);
}

TEST(MannWhitney, AutoTakesTheApproximationPastOneHundredValues) {
  std::vector<double> x, y;
  for (int i = 0; i < 50; ++i) x.push_back(i), y.push_back(i + 10.5);
  EXPECT_TRUE(results::mann_whitney_u(x, y, Alternative::less).exact);  // 100 values
  y.push_back(99);
  EXPECT_FALSE(results::mann_whitney_u(x, y, Alternative::less).exact);  // 101
  EXPECT_TRUE(results::mann_whitney_u(x, y, Alternative::less, "exact").exact);
}

TEST(MannWhitney, ExactDistributionProperties) {
  // Complete separation of 5 vs 5: p = 1 / C(10, 5) one-sided.
  const std::vector<double> lo = {1, 2, 3, 4, 5}, hi = {6, 7, 8, 9, 10};
  EXPECT_NEAR(results::mann_whitney_u(lo, hi, Alternative::less).p, 1.0 / 252, 1e-15);
  EXPECT_NEAR(results::mann_whitney_u(lo, hi, Alternative::two_sided).p, 2.0 / 252, 1e-15);
  EXPECT_DOUBLE_EQ(results::mann_whitney_u(lo, hi, Alternative::greater).p, 1.0);
  // Swapping the samples swaps the one-sided alternatives.
  const std::vector<double> a = {3.1, 0.5, 2.2, 7.4, 1.9, 4.4}, b = {2.8, 5.9, 6.1, 8.8, 3.7};
  EXPECT_NEAR(results::mann_whitney_u(a, b, Alternative::less).p, results::mann_whitney_u(b, a, Alternative::greater).p,
              1e-15);
  // For larger samples the exact and normal p-values come close.
  std::vector<double> x, y;
  for (int i = 0; i < 20; ++i) x.push_back(i * 1.0), y.push_back(i * 1.0 + 4.5);
  const double pe = results::mann_whitney_u(x, y, Alternative::less).p;
  const double pa = results::mann_whitney_u(x, y, Alternative::less, "asymptotic").p;
  EXPECT_NEAR(pe, pa, 0.01);
  EXPECT_LT(pe, 0.1);
}

TEST(MannWhitney, BadInputAndMeanSd) {
  EXPECT_NE(test::error_of([] { results::mann_whitney_u({}, {1}); }).find("at least one"), std::string::npos);
  EXPECT_NE(test::error_of([] { results::mann_whitney_u({1, NAN}, {1}); }).find("not finite"), std::string::npos);
  EXPECT_DOUBLE_EQ(results::mann_whitney_u({2, 2}, {2, 2}, Alternative::less, "asymptotic").p, 1.0);
  const auto m = results::mean_sd({70.42, 70.30, 70.02});
  EXPECT_NEAR(m.mean, 70.24666666666667, 1e-12);
  EXPECT_NEAR(m.sd, std::sqrt(((0.17333333) * (0.17333333) + (0.05333333) * (0.05333333) + (0.22666667) * (0.22666667)) / 2), 1e-6);
  EXPECT_EQ(results::mean_sd({5}).sd, 0.0);
}
