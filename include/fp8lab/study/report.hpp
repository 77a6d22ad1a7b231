// Reports of a sweep from the results store: per point the metric's mean and standard
// deviation over seeds, the one-sided Mann-Whitney U test against the baseline point at 5 %
// (an asterisk marks a point significantly worse, as the paper's tables do), in Markdown and
// CSV with the recipe as columns; and the sweep's [[plot]] figures as SVG and PNG.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "fp8lab/study/sweep.hpp"
#include "fp8lab/settings/recipe.hpp"
#include "fp8lab/results/stats.hpp"
#include "fp8lab/results/store.hpp"

namespace fp8lab::study {

struct PointResult {
  int point = 0;
  std::vector<double> values;            // the metric of each finished run
  std::vector<std::int64_t> run_ids;     // finished and diverged runs
  int diverged = 0, missing = 0;         // runs that diverged; seeds with no result yet
  results::MeanSd stats;
  std::optional<results::MannWhitney> test;  // against the baseline (not for the baseline)
  bool significant = false;                  // worse than the baseline at 5 %
  std::string recipe;                        // as configured (preset name or line)
  std::string kinds[4];                      // "1.4.3 b10" per a, w, gx, gw ("fp32" if float32)
  std::string loss_scale;
  // Loss scaling on: log2 of the scale averaged over each run's steps, then over runs; and
  // the steps skipped (mean over runs).
  std::optional<double> mean_log2_scale, skipped_steps;
};

struct SweepReport {
  std::string metric;  // e.g. test_accuracy
  std::vector<PointResult> points;
  double alpha = 0.05;
  bool higher_is_better = true;  // the direction the test looks for "worse"
  // The processors the table's runs (finished or diverged) were made on
  // (results::RunRow::machine; "" where the store did not record it) and how many runs each.
  std::map<std::string, int> machines;
};

// The table's line on where its runs were made: "Runs made on X." for one recorded
// processor; for several, a warning that names each with its run count (results from
// different processors may differ in the last bits); "" where no run recorded one.
std::string machines_note(const SweepReport& r);

SweepReport analyse(const Sweep& s, const results::Store& store);
// The same for every run named `name` whatever made it (a Python script through
// fp8lab.torch.RunRecorder, fp8lab train): one point per recipe and loss scaling, each
// run's final metric, the baseline the fp32 runs without loss scaling. Sets `s` to the
// sweep those points form (for to_markdown, to_csv and write_report). Throws Error when no
// run has the name or the runs report different metrics.
SweepReport analyse_named(const results::Store& store, const std::string& name, Sweep& s);
std::string to_markdown(const Sweep& s, const SweepReport& r);
// Decimals the table gives a metric: 4 for a loss, 2 for the rest (accuracies, BLEU, perplexity).
int decimals_for(const std::string& metric);
// A point's cells in the Markdown table: "mean ± sd" with the metric's decimals (the value
// alone for one run, a '*' where worse than the baseline, "-" without a finished run); and
// its p-value ("baseline" for the baseline, "-" without a test).
std::string value_text(const SweepReport& r, const PointResult& p);
std::string p_text(const Sweep& s, const PointResult& p);
std::string to_csv(const Sweep& s, const SweepReport& r);

// A metric the runs log during training (e.g. dev_bleu after every epoch), for one point:
// at each step where some of its finished or diverged runs logged it, the mean and sample
// standard deviation over those runs (sd 0 for one) and how many they were.
struct MetricCurve {
  int point = 0;
  std::vector<std::int64_t> steps;
  std::vector<double> mean, sd;
  std::vector<int> runs;
};
// The curve of `metric` for each point of `rep` whose variables match `where` and that has
// a run that logged it, in the report's point order.
std::vector<MetricCurve> metric_curves(const SweepReport& rep, const Sweep& s, const results::Store& store,
                                       const std::string& metric, const std::map<std::string, std::string>& where);

// The sweep's `also` metrics: for each, the sweep with that metric and its report.
std::vector<std::pair<Sweep, SweepReport>> also_reports(const Sweep& s, const results::Store& store);

// Writes `rep` (analyse(s, store)) as <out>/table.md, <out>/table.csv, each `also` metric's
// <out>/table-<metric>.{md,csv} and each plot's <out>/<file>.{svg,png} (a curve plot's
// numbers also as <out>/<file>.csv); returns the files written. A plot without data is skipped with a note on stderr.
std::vector<std::string> write_report(const Sweep& s, const SweepReport& rep, const results::Store& store,
                                      const std::string& out_dir);

// "1.4.3 b10" for a kind's quantizer (the paper's table notation, with " SR" for stochastic
// rounding, the policy when not the paper's fnuz and " ovf:nan" when overflow is not
// saturation); "fp32" for none.
std::string paper_notation(const nn::KindQuant& q);

}  // namespace fp8lab::study
