// Significance against a baseline, as the paper marks its tables: the Mann-Whitney U test
// (Wilcoxon rank-sum). Exact for samples of up to 100 values in all, ties included: the
// p-value is the share of the C(n1 + n2, n1) assignments of the pooled values (tied values
// at their mid-ranks) to the two samples whose U is at least as extreme, as
// scipy.stats.mannwhitneyu's permutation method computes it. Larger samples take the normal
// approximation with tie and continuity corrections (scipy's "asymptotic").
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace fp8lab::results {

enum class Alternative { less, greater, two_sided };  // of x against y

// "less", "greater", "two-sided"; parse_alternative throws Error naming the known ones.
std::string_view to_string(Alternative a);
Alternative parse_alternative(std::string_view name);

struct MannWhitney {
  double u = 0;        // U of the first sample: rank sum of x minus n_x (n_x + 1) / 2
  double p = 1;        // p-value for the alternative
  bool exact = false;  // exact distribution (else normal approximation)
  double z = 0;        // the normal statistic (0 when exact)
};

// `method`: "auto" (exact for up to 100 values in all, else asymptotic), "exact" or
// "asymptotic". Throws Error for an empty sample or a non-finite value.
MannWhitney mann_whitney_u(const std::vector<double>& x, const std::vector<double>& y,
                           Alternative alt = Alternative::two_sided, const std::string& method = "auto");

// Mean and sample standard deviation (n - 1); sd is 0 for one value.
struct MeanSd {
  double mean = 0, sd = 0;
  std::size_t n = 0;
};
MeanSd mean_sd(const std::vector<double>& v);

}  // namespace fp8lab::results
