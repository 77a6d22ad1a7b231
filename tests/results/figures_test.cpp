// The figure builders read the statistics a store holds; a store edited by hand or damaged
// may hold any JSON there. Such rows are left out of the plots, never an internal error.
#include <gtest/gtest.h>

#include <string>
#include <vector>

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
