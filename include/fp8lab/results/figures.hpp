// The report's figures from plain numbers: each builder takes what a plot shows (points with
// their mean and standard deviation, loss-scale traces, a run's statistics rows, curves) and
// lays it out as a plot::Figure. Which points, runs and steps a plot shows is the study
// layer's choice (src/study/report.cpp); the figure types and their options are in
// docs/experiments.md ("Plots").
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "fp8lab/core/format.hpp"
#include "fp8lab/results/plot.hpp"
#include "fp8lab/results/stats.hpp"
#include "fp8lab/results/store.hpp"

namespace fp8lab::results {

// The baseline of a sweep as a plot draws it: its mean +- sd as a grey band and a dashed line.
struct BaselineBand {
  MeanSd stats;
  std::string label;
};

// `title`: the figure's title where the sweep file gives one; "" for the builder's own.
struct FigureTitle {
  std::string given, fallback;
  const std::string& text() const { return given.empty() ? fallback : given; }
};

// --- a metric against a numeric variable, one line per series --------------------------------
struct MetricPoint {
  std::string series;  // the line the point belongs to ("" for the only one)
  double x = 0;
  MeanSd stats;
  bool all_diverged = false;  // no run finished and at least one diverged: drawn at 0
};
struct MetricFigure {
  FigureTitle title;
  std::string xlabel, metric;
  bool higher_is_better = true;   // diverged points are drawn (at 0) only then
  std::vector<MetricPoint> points;  // series in order of first appearance
  std::optional<BaselineBand> baseline;
};
std::optional<plot::Figure> metric_figure(const MetricFigure& in);

// --- a metric over two numeric variables ------------------------------------------------------
struct HeatmapFigure {
  FigureTitle title;
  std::string xlabel, ylabel, metric;
  int decimals = 1;
  std::map<std::pair<double, double>, double> cells;  // (x, y) -> mean (NaN: no result)
};
std::optional<plot::Figure> heatmap_figure(const HeatmapFigure& in);

// --- loss-scale traces -------------------------------------------------------------------------
using LossScaleTrace = std::vector<std::tuple<std::int64_t, int, bool>>;  // Store::loss_scale_trace
struct LabelledTrace {
  std::string label;
  LossScaleTrace trace;
};
std::optional<plot::Figure> loss_scale_figure(const FigureTitle& title, const std::vector<LabelledTrace>& traces);

// --- exponent histograms of one run ------------------------------------------------------------
// A statistics row's exponent histogram (Store::StatRow::histogram): the lowest exponent, the
// counts of finite nonzero values per exponent from it, and the zeros; nullopt where the JSON
// does not hold them (a store edited by hand or damaged).
struct ExponentCounts {
  int lo = 0;
  std::vector<double> counts;
  double zero = 0;
};
std::optional<ExponentCounts> exponent_counts(const std::string& histogram_json);

// Of the finite nonzero values counted in `rows` (summed; rows that do not parse left out), the
// share that rounds to zero in `f` under round-to-nearest: those below half its smallest
// positive value m, counted by whole exponent bins [2^e, 2^(e+1)) that lie below m/2. Where
// m is a power of two (every format with subnormals) that is exact but for the tie m/2
// itself, which shares its bin with values that round up and is counted as kept. Without
// subnormals m = (1 + 2^-M) 2^emin, and the bin holding m/2 is counted as kept: a lower
// bound. nullopt where the rows count no such value.
std::optional<double> share_rounding_to_zero(const std::vector<Store::StatRow>& rows, const Format& f);

struct KindName {
  std::string name, title;  // "gx", "grad_x"
};
struct LayerGroups {
  std::map<std::string, int> group;  // layer path -> group; a layer not named: the last group
  std::vector<std::string> names;    // of each group
};
struct HistogramFigure {
  FigureTitle title;
  const std::vector<Store::StatRow>* stats = nullptr;  // the run's statistics
  LayerGroups groups;
  std::vector<KindName> kinds;     // one row of panels each
  std::vector<std::int64_t> steps;  // one column each
  std::vector<std::string> formats;  // drawn as bands of their normal and subnormal ranges
};
std::optional<plot::Figure> histogram_figure(const HistogramFigure& in);

// --- block-scale histograms of several runs ----------------------------------------------------
struct LabelledStats {
  std::string label;
  std::vector<Store::StatRow> stats;
};
std::optional<plot::Figure> block_stats_figure(const FigureTitle& title, const std::vector<KindName>& kinds,
                                               const std::vector<LabelledStats>& runs);

// --- the metric of each point side by side -----------------------------------------------------
struct NamedPoint {
  std::string name;
  MeanSd stats;
  bool significant = false;  // worse than the baseline: '*'
};
std::optional<plot::Figure> points_figure(const FigureTitle& title, const std::string& metric,
                                          const std::vector<NamedPoint>& points,
                                          const std::optional<BaselineBand>& baseline);

// --- a metric over training steps --------------------------------------------------------------
struct Curve {
  std::string label;
  std::vector<std::int64_t> steps;
  std::vector<double> mean, sd;
};
std::optional<plot::Figure> curve_figure(const FigureTitle& title, const std::string& metric,
                                         const std::vector<Curve>& curves);

// --- Appendix A: the scaled integer 1.0.7 against its quantization step -----------------------
plot::Figure fixed_point_snr_figure(const FigureTitle& title);

}  // namespace fp8lab::results
