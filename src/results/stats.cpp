#include "fp8lab/results/stats.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "fp8lab/core/enum_names.hpp"
#include "fp8lab/core/error.hpp"

namespace fp8lab::results {

namespace {

double normal_cdf(double z) { return 0.5 * std::erfc(-z / std::sqrt(2.0)); }

// "auto" takes the exact distribution up to this many values in all (about 50 ms at 100).
constexpr std::size_t kExactUpTo = 100;

// The exact (permutation) distribution of x's rank sum: over all C(n, n1) ways to choose
// which n1 of the n pooled values are x's, the number of ways that give each doubled rank
// sum. `ranks2` holds every value's doubled mid-rank (an integer: tied values share
// the mean of their ranks), so ties are part of the distribution, not approximated away.
// ways[j][s]: subsets of j of the values seen so far whose doubled ranks sum to s.
std::vector<double> rank_sum_counts(const std::vector<long>& ranks2, std::size_t n1) {
  const long total = std::accumulate(ranks2.begin(), ranks2.end(), 0L);
  std::vector<std::vector<double>> ways(n1 + 1, std::vector<double>(static_cast<std::size_t>(total) + 1, 0.0));
  ways[0][0] = 1;
  std::size_t seen = 0;
  for (long r : ranks2) {
    ++seen;
    for (std::size_t j = std::min(seen, n1); j >= 1; --j) {
      std::vector<double>& to = ways[j];
      const std::vector<double>& from = ways[j - 1];
      for (std::size_t sum = static_cast<std::size_t>(r); sum < to.size(); ++sum) to[sum] += from[sum - r];
    }
  }
  return ways[n1];
}

constexpr EnumName<Alternative> kAlternatives[] = {
    {Alternative::less, "less"}, {Alternative::greater, "greater"}, {Alternative::two_sided, "two-sided"}};

}  // namespace

std::string_view to_string(Alternative a) { return enum_name(kAlternatives, a); }

Alternative parse_alternative(std::string_view name) { return enum_parse(kAlternatives, name, "alternative"); }

MannWhitney mann_whitney_u(const std::vector<double>& x, const std::vector<double>& y, Alternative alt,
                           const std::string& method) {
  if (x.empty() || y.empty()) throw Error("Mann-Whitney U: both samples need at least one value");
  if (method != "auto" && method != "exact" && method != "asymptotic")
    throw Error("Mann-Whitney U: method '" + method + "' is not auto, exact or asymptotic");
  const std::size_t n1 = x.size(), n2 = y.size(), n = n1 + n2;
  std::vector<std::pair<double, int>> all;
  for (double v : x) all.emplace_back(v, 0);
  for (double v : y) all.emplace_back(v, 1);
  for (const auto& [v, s] : all)
    if (!std::isfinite(v)) throw Error("Mann-Whitney U: a value is not finite");
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  // Mid-ranks, doubled so that they are integers; tie groups for the variance correction.
  std::vector<long> ranks2;
  long rank2_x = 0;
  double tie_term = 0;
  for (std::size_t i = 0; i < n;) {
    std::size_t j = i;
    while (j < n && all[j].first == all[i].first) ++j;
    const double t = static_cast<double>(j - i);
    const long mid2 = static_cast<long>(i + 1 + j);
    if (j - i > 1) tie_term += t * t * t - t;
    for (std::size_t k = i; k < j; ++k) {
      ranks2.push_back(mid2);
      if (all[k].second == 0) rank2_x += mid2;
    }
    i = j;
  }
  MannWhitney r;
  const long u2 = rank2_x - static_cast<long>(n1 * (n1 + 1));  // 2 U
  r.u = static_cast<double>(u2) / 2;
  if (method == "exact" || (method == "auto" && n <= kExactUpTo)) {
    r.exact = true;
    const std::vector<double> f = rank_sum_counts(ranks2, n1);
    double le = 0, ge = 0, all_ways = 0;
    for (std::size_t s2 = 0; s2 < f.size(); ++s2) {
      all_ways += f[s2];
      if (static_cast<long>(s2) <= rank2_x) le += f[s2];
      if (static_cast<long>(s2) >= rank2_x) ge += f[s2];
    }
    le /= all_ways, ge /= all_ways;
    r.p = alt == Alternative::less ? le : alt == Alternative::greater ? ge : std::min(1.0, 2 * std::min(le, ge));
    return r;
  }
  const double d1 = static_cast<double>(n1), d2 = static_cast<double>(n2), dn = static_cast<double>(n);
  const double mu = d1 * d2 / 2;
  const double sigma = std::sqrt(d1 * d2 / 12 * ((dn + 1) - tie_term / (dn * (dn - 1))));
  if (sigma == 0) {  // every value equal: no evidence either way
    r.p = 1;
    return r;
  }
  if (alt == Alternative::greater) {
    r.z = (r.u - mu - 0.5) / sigma;
    r.p = 1 - normal_cdf(r.z);
  } else if (alt == Alternative::less) {
    r.z = (r.u - mu + 0.5) / sigma;
    r.p = normal_cdf(r.z);
  } else {
    r.z = (std::abs(r.u - mu) - 0.5) / sigma;
    r.p = std::min(1.0, 2 * (1 - normal_cdf(r.z)));
  }
  return r;
}

MeanSd mean_sd(const std::vector<double>& v) {
  MeanSd m;
  m.n = v.size();
  if (v.empty()) return m;
  m.mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  if (v.size() > 1) {
    double s = 0;
    for (double x : v) s += (x - m.mean) * (x - m.mean);
    m.sd = std::sqrt(s / static_cast<double>(v.size() - 1));
  }
  return m;
}

}  // namespace fp8lab::results
