// Significance against a baseline, as the paper marks its tables: the Mann-Whitney U test
// (Wilcoxon rank-sum), exact for small samples without ties, otherwise the normal
// approximation with tie correction and continuity correction (as scipy.stats.mannwhitneyu).
#pragma once

#include <string>
#include <vector>

namespace fp8lab::results {

enum class Alternative { less, greater, two_sided };  // of x against y

struct MannWhitney {
  double u = 0;        // U of the first sample: rank sum of x minus n_x (n_x + 1) / 2
  double p = 1;        // p-value for the alternative
  bool exact = false;  // exact distribution (else normal approximation)
  double z = 0;        // the normal statistic (0 when exact)
};

// `exact`: "auto" (exact when both samples have at most 20 values and there are no ties),
// "exact" (an Error if there are ties), or "asymptotic". Throws Error for an empty sample
// or a non-finite value.
MannWhitney mann_whitney_u(const std::vector<double>& x, const std::vector<double>& y,
                           Alternative alt = Alternative::two_sided, const std::string& method = "auto");

// Mean and sample standard deviation (n - 1); sd is 0 for one value.
struct MeanSd {
  double mean = 0, sd = 0;
  std::size_t n = 0;
};
MeanSd mean_sd(const std::vector<double>& v);

}  // namespace fp8lab::results
