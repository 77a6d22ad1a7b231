// The figure builders read the statistics a store holds; a store edited by hand or damaged
// may hold any JSON there. Such rows are left out of the plots, never an internal error.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "fp8lab/core/codec.hpp"
#include "fp8lab/core/format.hpp"
#include "fp8lab/results/figures.hpp"

using namespace fp8lab;
using results::Store;

namespace {
Store::StatRow row(const std::string& kind, std::string histogram) {
  Store::StatRow r;
  r.step = 0, r.layer = "l", r.kind = kind, r.total = 10, r.histogram = std::move(histogram);
  return r;
}

const std::vector<std::string> kHostileJson = {
    "[1, 2]", "3", "\"text\"", "null", "{}", "{\"lo\": \"x\", \"counts\": [1]}", "{\"lo\": 1e30, \"counts\": [1]}",
    "{\"lo\": -2147483648, \"counts\": [1, 2]}", "{\"lo\": 0, \"counts\": \"many\"}", "{\"lo\": 0, \"counts\": [\"a\"]}",
    "{\"lo\": 0, \"counts\": [1, null]}", "{\"lo\": 0, \"counts\": {\"a\": 1}}", "not json",
    "{\"groups\": 5, \"scales\": {\"lo\": 0, \"counts\": [1]}}", "{\"groups\": {\"total\": \"x\"}, \"scales\": []}",
    "{\"groups\": {\"total\": 4}, \"scales\": {\"lo\": \"y\", \"counts\": [1]}}",
};
}  // namespace

TEST(Figures, HistogramsSkipRowsWhoseJsonIsNotAHistogram) {
  for (const auto& json : kHostileJson) {
    std::vector<Store::StatRow> stats = {row("a", json), row("a", "{\"lo\": -3, \"counts\": [1, 2, 3], \"zero\": 1}")};
    results::HistogramFigure in;
    in.stats = &stats;
    in.groups.names = {"all"};
    in.kinds = {{"a", "activations"}};
    in.steps = {0};
    std::optional<results::plot::Figure> f;
    ASSERT_NO_THROW(f = results::histogram_figure(in)) << json;
    ASSERT_TRUE(f) << json;  // the good row is drawn
    ASSERT_EQ(f->panels.size(), 1u);
    ASSERT_EQ(f->panels[0].series.size(), 1u);
    EXPECT_EQ(f->panels[0].series[0].x.size(), 3u) << json;  // the hostile row added no exponent
  }
}

TEST(Figures, BlockStatisticsSkipRowsWhoseJsonIsNotOne) {
  const std::string good = "{\"groups\": {\"total\": 4, \"saturated\": 1, \"zero\": 0}, \"scales\": {\"lo\": -2, \"counts\": [3, 1]}}";
  for (const auto& json : kHostileJson) {
    std::vector<results::LabelledStats> runs = {{"run", {row("w", json), row("w", good)}}};
    std::optional<results::plot::Figure> f;
    ASSERT_NO_THROW(f = results::block_stats_figure({"t", "t"}, {{"w", "weights"}}, runs)) << json;
    ASSERT_TRUE(f) << json;
    ASSERT_EQ(f->panels[0].series.size(), 1u);
    EXPECT_EQ(f->panels[0].series[0].x.size(), 2u) << json;
  }
}

// The share of values that round to zero, read from exponent bins, against the reference
// quantizer applied to each value: 15 values a binade (1 + k/16, both signs) over 40 binades
// around each format's smallest positive value m, weighted so that the share is not a
// round number. The one value the bins cannot place, m/2 itself (a tie the quantizer rounds
// to zero), is left out, as the function documents.
TEST(Figures, ShareRoundingToZeroAgreesWithTheQuantizer) {
  for (const char* name : {"1.5.2:24", "1.4.3:10", "1.5.2", "1.4.3:7:fn", "1.3.4:-2", "1.6.1", "1.5.10", "1.2.5:3:fn:nosub"}) {
    const Format f = parse_format(name);
    const int c = static_cast<int>(std::lround(std::log2(f.min_positive())));
    const int lo = c - 20;
    std::vector<double> counts(40, 0.0);
    double zeroed = 0, all = 0;
    for (int e = lo; e < lo + 40; ++e)
      for (int k = 0; k < 16; ++k)
        for (const double sign : {1.0, -1.0}) {
          const double x = sign * std::ldexp(1.0 + k / 16.0, e);
          if (std::fabs(x) == std::ldexp(f.min_positive(), -1)) continue;
          const double weight = 1 + (e - lo) % 3 + k % 2;
          counts[static_cast<std::size_t>(e - lo)] += weight;
          all += weight;
          if (quantize(static_cast<float>(x), f) == 0.0f) zeroed += weight;
        }
    std::string json = "{\"lo\": " + std::to_string(lo) + ", \"counts\": [";
    for (std::size_t i = 0; i < counts.size(); ++i) json += (i ? ", " : "") + std::to_string(counts[i]);
    json += "], \"zero\": 7}";
    ASSERT_GT(zeroed, 0) << name;
    const auto share = results::share_rounding_to_zero({row("gx", json)}, f);
    ASSERT_TRUE(share) << name;
    if (f.subnormals) {
      EXPECT_DOUBLE_EQ(*share, zeroed / all) << name;
    } else {  // the bin of m/2 counted as kept: a lower bound, short by at most that bin
      int t_exp = 0;
      std::frexp(f.min_positive() / 2, &t_exp);
      const double straddling = counts[static_cast<std::size_t>(t_exp - 1 - lo)];
      EXPECT_LT(*share, zeroed / all) << name;
      EXPECT_GE(*share + straddling / all, zeroed / all) << name;
    }
    // Rows are summed; rows that do not parse are left out.
    const auto split = results::share_rounding_to_zero({row("gx", json), row("gx", json), row("gx", "not json")}, f);
    EXPECT_DOUBLE_EQ(*split, *share) << name;
  }
  EXPECT_FALSE(results::share_rounding_to_zero({row("gx", "{\"lo\": 0, \"counts\": [], \"zero\": 4}")}, parse_format("1.4.3")));
  EXPECT_FALSE(results::share_rounding_to_zero({}, parse_format("1.4.3")));
}
