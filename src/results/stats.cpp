#include "fp8lab/results/stats.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "fp8lab/core/format.hpp"

namespace fp8lab::results {

namespace {

double normal_cdf(double z) { return 0.5 * std::erfc(-z / std::sqrt(2.0)); }

// Counts of each U in 0..n1*n2 over all C(n1+n2, n1) orderings without ties:
// f(n1, n2, u) = f(n1-1, n2, u-n2) + f(n1, n2-1, u)   (is the largest value an x or a y?)
std::vector<double> exact_counts(int n1, int n2) {
  // table[b][u] for the current a, built up over a = 0..n1.
  std::vector<std::vector<double>> prev(n2 + 1), cur(n2 + 1);
  for (int b = 0; b <= n2; ++b) prev[b] = {1.0};  // a = 0: U is 0
  for (int a = 1; a <= n1; ++a) {
    cur[0] = {1.0};  // b = 0: U is 0
    for (int b = 1; b <= n2; ++b) {
      cur[b].assign(static_cast<std::size_t>(a * b + 1), 0.0);
      for (std::size_t u = 0; u < prev[b].size(); ++u) cur[b][u + b] += prev[b][u];  // largest is x: beats b ys
      for (std::size_t u = 0; u < cur[b - 1].size(); ++u) cur[b][u] += cur[b - 1][u];
    }
    std::swap(prev, cur);
  }
  return prev[n2];
}

}  // namespace

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
  // Mid-ranks; tie groups for the variance correction.
  double rank_x = 0, tie_term = 0;
  bool ties = false;
  for (std::size_t i = 0; i < n;) {
    std::size_t j = i;
    while (j < n && all[j].first == all[i].first) ++j;
    const double t = static_cast<double>(j - i), mid = (static_cast<double>(i + 1) + static_cast<double>(j)) / 2;
    if (j - i > 1) ties = true, tie_term += t * t * t - t;
    for (std::size_t k = i; k < j; ++k)
      if (all[k].second == 0) rank_x += mid;
    i = j;
  }
  MannWhitney r;
  r.u = rank_x - static_cast<double>(n1 * (n1 + 1)) / 2;
  const bool exact = method == "exact" || (method == "auto" && !ties && n1 <= 20 && n2 <= 20);
  if (exact && ties) throw Error("Mann-Whitney U: the exact distribution needs samples without ties");
  if (exact) {
    r.exact = true;
    const std::vector<double> f = exact_counts(static_cast<int>(n1), static_cast<int>(n2));
    const double total = std::accumulate(f.begin(), f.end(), 0.0);
    const auto u = static_cast<std::size_t>(std::llround(r.u));
    double le = 0, ge = 0;
    for (std::size_t k = 0; k < f.size(); ++k) {
      if (k <= u) le += f[k];
      if (k >= u) ge += f[k];
    }
    le /= total, ge /= total;
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
