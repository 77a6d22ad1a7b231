// The report's statistics, tables and plots, from a fixture store holding chosen metrics
// for a sweep's runs.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "../common/testutil.hpp"
#include "fp8lab/core/files.hpp"
#include "fp8lab/core/machine.hpp"
#include "fp8lab/study/page.hpp"
#include "fp8lab/study/report.hpp"
#include "fp8lab/study/sweep.hpp"
#include "fp8lab/results/store.hpp"
#include "fp8lab/results/store_set.hpp"
#include "small_sweep.hpp"

using namespace fp8lab;
namespace fs = std::filesystem;

namespace {
fs::path dir() { return test::temp_dir("fp8lab_report"); }

// dir()/name, emptied.
fs::path empty_dir(const std::string& name) {
  const fs::path d = dir() / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

study::Sweep parse(const std::string& body, const std::string& name = "t") {
  return study::parse_sweep("name = \"" + name + "\"\n" + body, "sweep.toml", dir().string(), settings::complete_settings);
}
}  // namespace

namespace {
// A store holding chosen metrics for a sweep's runs, as if it had been run.
void record(results::Store& store, const study::SweepRun& r, results::RunStatus status, double metric,
            bool with_stats = false) {
  results::RunInfo info;
  info.name = r.cfg.name;
  info.kind = r.cfg.task;
  info.config_json = settings::to_json(r.cfg);
  info.recipe = r.cfg.quant.recipe.text;
  info.loss_scale = r.cfg.quant.loss_scale.text;
  info.seed = r.seed;
  const auto id = store.begin_run(info);
  if (with_stats) {
    std::vector<results::Store::StatRow> rows;
    for (std::int64_t step : {0, 50, 100})
      for (const char* layer : {"conv1", "layer1.conv", "layer2.conv", "layer3.conv", "fc"})
        for (const char* kind : {"a", "w", "gx", "gw"}) {
          results::Store::StatRow s;
          s.step = step;
          s.layer = layer;
          s.kind = kind;
          s.total = 100;
          s.histogram = R"({"lo": -12, "counts": [5, 10, 20, 30, 20, 10], "zero": 5, "inf": 0, "nan": 0)";
          // Block-scaled kinds' group figures: 8 groups per layer, 1 saturated, 2 all zero.
          s.histogram += std::string(kind) == "gw" ? "}" : R"(, "groups": {"total": 8, "saturated": 1, "zero": 2, "nan": 0,
              "scale_underflow": 0, "scale_overflow": 0}, "scales": {"lo": -9, "counts": [2, 4, 2]}})";
          rows.push_back(s);
        }
    store.log_stats(id, rows);
    store.log_loss_scale(id, {{0, 10, false}, {50, 9, true}, {100, 10, false}});
  }
  store.log_metric(id, 50, "test_bleu", -1);  // an earlier evaluation: not the one reported
  store.log_metric(id, 100, "test_bleu", metric + 1000);
  store.finish_run(id, status, status == results::RunStatus::finished ? std::optional<double>(metric) : std::nullopt, "test_accuracy", 1.0);
}

bool valid_svg(const std::string& path) {
  const std::string s = read_file(path);
  if (s.rfind("<?xml", 0) != 0 || s.find("<svg") == std::string::npos || s.find("</svg>") == std::string::npos)
    return false;
  // Every element is closed: count opening tags against closing and self-closing ones.
  int depth = 0;
  for (std::size_t i = 0; (i = s.find('<', i)) != std::string::npos; ++i) {
    if (s.compare(i, 2, "<?") == 0) continue;
    const std::size_t end = s.find('>', i);
    if (end == std::string::npos) return false;
    if (s[i + 1] == '/') --depth;
    else if (s[end - 1] != '/') ++depth;
    if (depth < 0) return false;
  }
  return depth == 0;
}
}  // namespace

TEST(Report, TableMarksWorsePointsAndPlotsRender) {
  const fs::path d = empty_dir("report");
  const auto s = parse(R"(
seeds = 5
baseline = "recipe=fp32"
also = ["test_bleu"]
[[grid]]
recipe = ["fp32"]
"quant.recipe" = "fp32"
"quant.loss_scale" = "backoff"
[[grid]]
recipe = ["a"]
bias = [8, 12]
"quant.recipe" = "a=1.4.3:{bias}"
"quant.loss_scale" = "backoff"
[[plot]]
type = "metric"
x = "bias"
series = "recipe"
file = "acc"
[[plot]]
type = "heatmap"
x = "bias"
y = "bias"
file = "heat"
[[plot]]
type = "histograms"
where = { recipe = "fp32" }
formats = ["1.4.3:10", "1.5.2:33"]
file = "hist"
[[plot]]
type = "histograms"
where = { recipe = "fp32" }
layers = ["layer*.conv", "fc", "nothing.*"]
kinds = ["gx"]
file = "hist-layers"
[[plot]]
type = "loss-scale"
file = "scale"
[[plot]]
type = "fixed-point-snr"
file = "snr"
[[plot]]
type = "points"
file = "points"
[[plot]]
type = "points"
series = "bias"
file = "points-series"
[[plot]]
type = "block-stats"
file = "blocks"
[[plot]]
type = "curve"
metric = "test_bleu"
file = "curve"
)" + std::string(test::kSmall), "report-sweep");
  ASSERT_EQ(s.points.size(), 3u);
  results::Store store((d / "r.db").string());
  // Baseline 90..94; bias 8 clearly worse (80..84); bias 12 the same as the baseline, but one
  // seed diverged and one not run yet.
  for (const auto& r : s.runs) {
    const double k = static_cast<double>(r.seed);
    if (r.point == 0) record(store, r, results::RunStatus::finished, 89 + k, r.seed == 1);
    if (r.point == 1) record(store, r, results::RunStatus::finished, 79 + k);
    if (r.point == 2 && r.seed <= 3) record(store, r, results::RunStatus::finished, 89 + k);
    if (r.point == 2 && r.seed == 4) record(store, r, results::RunStatus::diverged, 0);
  }
  const auto rep = study::analyse(s, store);
  EXPECT_NEAR(rep.points[0].stats.mean, 92, 1e-12);
  EXPECT_NEAR(rep.points[0].stats.sd, std::sqrt(2.5), 1e-12);
  EXPECT_FALSE(rep.points[0].test.has_value());
  ASSERT_TRUE(rep.points[1].test.has_value());
  // All five of bias 8 below all five of the baseline: U = 0, exact one-sided p = 1/252.
  EXPECT_EQ(rep.points[1].test->u, 0);
  EXPECT_NEAR(rep.points[1].test->p, 1.0 / 252, 1e-12);
  EXPECT_TRUE(rep.points[1].significant);
  EXPECT_FALSE(rep.points[2].significant);
  EXPECT_EQ(rep.points[2].diverged, 1);
  EXPECT_EQ(rep.points[2].missing, 1);
  EXPECT_EQ(rep.points[2].kinds[0], "1.4.3 b12");
  EXPECT_EQ(rep.points[2].kinds[1], "fp32");

  const std::string md = study::to_markdown(s, rep);
  // The scale trace (2^10 for 50 steps, 2^9 for 50, then 2^10) of seed 1 only.
  ASSERT_TRUE(rep.points[0].mean_log2_scale.has_value());
  EXPECT_NEAR(*rep.points[0].mean_log2_scale, (10.0 * 50 + 9 * 50 + 10) / 101, 1e-12);
  EXPECT_EQ(*rep.points[0].skipped_steps, 1.0);
  EXPECT_FALSE(rep.points[1].mean_log2_scale.has_value());
  EXPECT_NE(md.find("| 8 | 1.4.3 b8 | fp32 | fp32 | fp32 | backoff | - | - | 82.00 ± 1.58* | 5 |"), std::string::npos) << md;
  EXPECT_NE(md.find("92.00 ± 1.58 | 5 | baseline"), std::string::npos) << md;
  EXPECT_NE(md.find("(+1 diverged) (1 missing)"), std::string::npos) << md;
  const std::string csv = study::to_csv(s, rep);
  EXPECT_NE(csv.find("recipe,bias,recipe,a,w,gx,gw"), std::string::npos) << csv;

  const auto files = study::write_report(s, rep, store, (d / "out").string());
  for (const char* stem : {"acc", "heat", "hist", "scale", "snr", "points", "blocks", "curve"}) {
    const fs::path svg = d / "out" / (std::string(stem) + ".svg"), png = d / "out" / (std::string(stem) + ".png");
    ASSERT_TRUE(fs::exists(svg)) << stem;
    EXPECT_TRUE(valid_svg(svg.string())) << stem;
    ASSERT_TRUE(fs::exists(png)) << stem;
    std::ifstream in(png, std::ios::binary);
    char sig[8] = {};
    in.read(sig, 8);
    EXPECT_EQ(std::string(sig, 8), std::string("\x89PNG\r\n\x1a\n", 8)) << stem;
    EXPECT_GT(fs::file_size(png), 5000u) << stem;
  }
  // Points are named by their variables, or with `series` by that variable's value where
  // they have it (the baseline has no bias).
  const std::string points = read_file((d / "out" / "points.svg").string());
  const std::string by_bias = read_file((d / "out" / "points-series.svg").string());
  EXPECT_NE(points.find(">1: recipe=a, bias=8 *<"), std::string::npos) << points;
  EXPECT_NE(by_bias.find(">0: recipe=fp32<"), std::string::npos) << by_bias;
  EXPECT_NE(by_bias.find(">1: 8 *<"), std::string::npos) << by_bias;
  EXPECT_NE(by_bias.find(">2: 12<"), std::string::npos) << by_bias;
  // The histogram figure shows each format's range and labels its axes.
  const std::string svg = read_file((d / "out" / "hist.svg").string());
  EXPECT_NE(svg.find("1.4.3:10 normal"), std::string::npos);
  EXPECT_NE(svg.find("1.5.2:33 subnormal"), std::string::npos);
  EXPECT_NE(svg.find("floor(log2 |x|)"), std::string::npos);
  EXPECT_NE(svg.find("grad_x, step 100"), std::string::npos);
  // Start, middle and end of training; the first, middle and last layers and the others.
  EXPECT_NE(svg.find("weights, step 0"), std::string::npos);
  EXPECT_NE(svg.find("activations, step 50"), std::string::npos);
  EXPECT_NE(svg.find("middle layer (layer2.conv)"), std::string::npos);
  EXPECT_NE(svg.find("other layers"), std::string::npos);
  EXPECT_NE(svg.find("last layer"), std::string::npos);
  // Layer groups chosen by pattern: each layer in the first group it matches, the rest apart.
  const std::string layers = read_file((d / "out" / "hist-layers.svg").string());
  EXPECT_NE(layers.find("layer*.conv: 3 layers"), std::string::npos) << layers;
  EXPECT_NE(layers.find("fc: 1 layer"), std::string::npos);
  EXPECT_NE(layers.find("others: 1 layer"), std::string::npos);
  EXPECT_EQ(layers.find("nothing.*"), std::string::npos);  // no layer: no curve
  EXPECT_EQ(layers.find("weights, step"), std::string::npos);  // kinds = ["gx"]
  EXPECT_TRUE(fs::exists(d / "out" / "table.md"));
  // The `also` metric's own table: its last logged values (metric + 1000), tested the same way.
  const std::string also = read_file((d / "out" / "table-test_bleu.md").string());
  EXPECT_NE(also.find("1092.00 ± 1.58 | 5 | baseline"), std::string::npos) << also;
  EXPECT_NE(also.find("1082.00 ± 1.58* | 5 |"), std::string::npos) << also;
  EXPECT_TRUE(fs::exists(d / "out" / "table-test_bleu.csv"));
  // The block figures: 5 layers x 8 groups, 5 saturated (12.50 %), 10 zero (25.0 %).
  const std::string blocks = read_file((d / "out" / "blocks.svg").string());
  EXPECT_NE(blocks.find("12.50% sat, 25.0% zero"), std::string::npos);
  EXPECT_NE(blocks.find("grad_x"), std::string::npos);
  EXPECT_NE(points.find("baseline +- sd"), std::string::npos);
  EXPECT_NE(points.find(" *"), std::string::npos);  // bias 8: worse than the baseline
  // One integer tick per point, numbered as in the legend; no fractional ticks.
  EXPECT_NE(points.find(">1: "), std::string::npos) << points;
  EXPECT_NE(points.find(">2</text>"), std::string::npos);
  EXPECT_EQ(points.find(">0.5</text>"), std::string::npos);

  // Curves: every logged value of the metric, mean +- sd over the point's finished and
  // diverged runs at each step (the fixture logs -1 at step 50 and metric + 1000 at 100).
  const auto curves = study::metric_curves(rep, s, store, "test_bleu", {});
  ASSERT_EQ(curves.size(), 3u);
  EXPECT_EQ(curves[0].steps, (std::vector<std::int64_t>{50, 100}));
  EXPECT_EQ(curves[0].runs, (std::vector<int>{5, 5}));
  EXPECT_DOUBLE_EQ(curves[0].mean[0], -1);
  EXPECT_DOUBLE_EQ(curves[0].sd[0], 0);
  EXPECT_NEAR(curves[0].mean[1], 1092, 1e-9);
  EXPECT_NEAR(curves[0].sd[1], std::sqrt(2.5), 1e-12);
  // Bias 12: seeds 1-3 finished (1090..1092) and seed 4 diverged (1000); seed 5 not run.
  EXPECT_EQ(curves[2].point, 2);
  EXPECT_EQ(curves[2].runs, (std::vector<int>{4, 4}));
  EXPECT_NEAR(curves[2].mean[1], (1090.0 + 1091 + 1092 + 1000) / 4, 1e-9);
  const auto only_a = study::metric_curves(rep, s, store, "test_bleu", {{"recipe", "a"}});
  ASSERT_EQ(only_a.size(), 2u);
  EXPECT_EQ(only_a[0].point, 1);
  EXPECT_TRUE(study::metric_curves(rep, s, store, "dev_bleu", {}).empty());  // never logged
  const std::string curve = read_file((d / "out" / "curve.svg").string());
  EXPECT_NE(curve.find("test_bleu (mean +- sd over seeds)"), std::string::npos);
  EXPECT_NE(curve.find("training step"), std::string::npos);
  const std::string curve_csv = read_file((d / "out" / "curve.csv").string());
  EXPECT_EQ(curve_csv.rfind("point,step,test_bleu_mean,test_bleu_sd,runs\n", 0), 0u) << curve_csv;
  EXPECT_NE(curve_csv.find(",100,1092.000000,1.581139,5\n"), std::string::npos) << curve_csv;
  EXPECT_NE(curve_csv.find(",100,1068.250000,"), std::string::npos) << curve_csv;

  // A metric named in the sweep is the run's last logged value of it, not its final metric.
  study::Sweep named = s;
  named.metric = "test_bleu";
  const auto rep2 = study::analyse(named, store);
  EXPECT_EQ(rep2.metric, "test_bleu");
  EXPECT_NEAR(rep2.points[0].stats.mean, 1092, 1e-9);
  EXPECT_NEAR(rep2.points[1].stats.mean, 1082, 1e-9);
}


TEST(Report, RunsOfANameGroupByRecipeAndLossScaling) {
  const fs::path db = dir() / "named.db";
  fs::remove(db);
  results::Store store(db.string());
  auto add = [&](const std::string& name, const std::string& recipe, const std::string& ls, double metric,
                 const std::string& metric_name = "test_accuracy",
                 results::RunStatus status = results::RunStatus::finished) {
    const auto id = store.begin_run({name, "python", "{}", recipe, ls, 0});
    if (ls != "none") store.log_loss_scale(id, {{0, 4, false}, {10, 3, true}});
    store.finish_run(id, status, metric, metric_name, 1.0);
  };
  for (double v : {90.0, 91.0, 92.0, 93.0, 94.0}) add("py", "fp32", "none", v);
  for (double v : {80.0, 81.0, 82.0, 83.0, 84.0}) add("py", "resnet32-152", "backoff", v);
  add("py", "resnet32-152", "backoff", 0, "test_accuracy", results::RunStatus::diverged);
  add("other", "fp32", "none", 10);
  study::Sweep s;
  const auto rep = study::analyse_named(store, "py", s);
  ASSERT_EQ(rep.points.size(), 2u);
  EXPECT_EQ(s.baseline, 0);
  EXPECT_EQ(rep.metric, "test_accuracy");
  EXPECT_DOUBLE_EQ(rep.points[0].stats.mean, 92.0);
  EXPECT_DOUBLE_EQ(rep.points[1].stats.mean, 82.0);
  EXPECT_EQ(rep.points[1].diverged, 1);
  EXPECT_EQ(rep.points[1].kinds[0], "1.5.2 b24");
  ASSERT_TRUE(rep.points[1].test.has_value());
  EXPECT_TRUE(rep.points[1].significant);  // every 8-bit run below every float32 run
  EXPECT_DOUBLE_EQ(*rep.points[1].mean_log2_scale, 43.0 / 11);  // 2^4 held for 10 steps, 2^3 for the last
  EXPECT_DOUBLE_EQ(*rep.points[1].skipped_steps, 1.0);
  const std::string md = study::to_markdown(s, rep);
  EXPECT_NE(md.find("| fp32 |"), std::string::npos) << md;
  EXPECT_NE(md.find("baseline"), std::string::npos) << md;
  EXPECT_THROW(study::analyse_named(store, "nobody", s), Error);
  add("py", "fp32", "none", 1.5, "test_loss");
  EXPECT_THROW(study::analyse_named(store, "py", s), Error);
}

// A point of one run has no spread: the table gives its value alone (not "± 0.00") and
// says so below; the CSV leaves its sd empty. Points of several runs keep mean ± sd.
TEST(Report, OneRunPointHasNoSpread) {
  const fs::path db = dir() / "one-run.db";
  fs::remove(db);
  results::Store store(db.string());
  auto add = [&](const std::string& recipe, double metric) {
    const auto id = store.begin_run({"one", "python", "{}", recipe, "none", 0});
    store.finish_run(id, results::RunStatus::finished, metric, "test_accuracy", 1.0);
  };
  add("fp32", 90.0);
  add("fp32", 92.0);
  add("resnet32-mixed", 88.5);
  study::Sweep s;
  const auto rep = study::analyse_named(store, "one", s);
  ASSERT_EQ(rep.points.size(), 2u);
  const std::string md = study::to_markdown(s, rep);
  EXPECT_NE(md.find("| 91.00 ± 1.41 | 2 | baseline |"), std::string::npos) << md;
  EXPECT_NE(md.find("| 88.50 | 1 |"), std::string::npos) << md;
  EXPECT_EQ(md.find("88.50 ±"), std::string::npos) << md;
  EXPECT_NE(md.find("(a point of one run: its value alone)"), std::string::npos) << md;
  const std::string csv = study::to_csv(s, rep);
  EXPECT_NE(csv.find(",1,0,0,88.500000,,"), std::string::npos) << csv;
  EXPECT_NE(csv.find(",2,0,0,91.000000,1.414214,"), std::string::npos) << csv;
}

// The table names the processor its runs were made on, and warns where they were made on
// several or some did not record theirs (results from different processors are not
// bit-comparable).
TEST(Report, TableNamesTheProcessorsOfItsRuns) {
  const fs::path db = dir() / "machines.db";
  fs::remove(db);
  results::Store store(db.string());
  for (const char* recipe : {"fp32", "fp32", "resnet32-mixed"}) {
    const auto id = store.begin_run({"machines", "python", "{}", recipe, "none", 0});
    store.finish_run(id, results::RunStatus::finished, 90.0, "test_accuracy", 1.0);
  }
  const auto unfinished = store.begin_run({"machines", "python", "{}", "fp32", "none", 0});
  store.finish_run(unfinished, results::RunStatus::failed, std::nullopt, "test_accuracy", 1.0);
  study::Sweep s;
  auto rep = study::analyse_named(store, "machines", s);
  const std::string here = machine_description();
  ASSERT_EQ(rep.machines.size(), 1u);
  EXPECT_EQ(rep.machines.at(here), 3);  // the failed run has no result in the table
  std::string md = study::to_markdown(s, rep);
  EXPECT_NE(md.find("\nRuns made on " + here + ".\n"), std::string::npos) << md;

  rep.machines = {{"A CPU (family 6, model 143; avx2 fma avx512f)", 2}, {"B CPU (family 25, model 1; avx2 fma)", 1}};
  md = study::to_markdown(s, rep);
  EXPECT_NE(md.find("**Runs made on 2 processors**; results from different processors may differ in the last bits"),
            std::string::npos) << md;
  EXPECT_NE(md.find(": A CPU (family 6, model 143; avx2 fma avx512f): 2 runs; B CPU (family 25, model 1; avx2 fma): 1 run.\n"),
            std::string::npos) << md;
  EXPECT_EQ(md.find("Runs made on A"), std::string::npos) << md;

  rep.machines = {{"", 4}, {"B CPU", 1}};
  EXPECT_EQ(study::machines_note(rep),
            "**Not every run records its processor**; results from different processors may differ in the last bits "
            "(their kernels differ): not recorded: 4 runs; B CPU: 1 run.\n");
  rep.machines = {{"", 4}};  // a store from before runs recorded it: no line
  EXPECT_EQ(study::machines_note(rep), "");
  EXPECT_EQ(study::to_markdown(s, rep).find("Runs made on"), std::string::npos);
  rep.machines.clear();
  EXPECT_EQ(study::machines_note(rep), "");
}

// Item 5 of the data-parallel issue: the stores of a sharded sweep read as one give the
// report of one store holding the same runs; the same run with another result in a second
// store is refused, an identical copy counts once, and a failed attempt beside another
// store's outcome is left out.
TEST(Report, SeveralStoresReadAsOne) {
  const fs::path d = empty_dir("stores");
  auto s = parse(R"(
seeds = 4
baseline = "recipe=fp32"
[[grid]]
recipe = ["fp32", "resnet32-mixed"]
"quant.recipe" = "{recipe}"
"quant.loss_scale" = "backoff"
)" + std::string(test::kSmall), "stores");
  const auto metric = [](const study::SweepRun& r) { return 80.0 + r.point * 5 + static_cast<double>(r.seed); };
  results::Store one((d / "one.db").string());
  for (const auto& r : s.runs) record(one, r, results::RunStatus::finished, metric(r), r.seed == 1);
  std::vector<std::string> shards;
  for (int i = 0; i < 3; ++i) {
    study::Sweep part = s;
    study::keep_shard(part, {i, 3});
    shards.push_back((d / ("shard" + std::to_string(i) + ".db")).string());
    results::Store st(shards.back());
    for (const auto& r : part.runs) record(st, r, results::RunStatus::finished, metric(r), r.seed == 1);
  }
  {  // a failed first attempt of a run that shard 0 finished
    results::Store st(shards[1]);
    study::Sweep part = s;
    study::keep_shard(part, {0, 3});
    record(st, part.runs[0], results::RunStatus::failed, 0);
  }
  results::StoreSet all(shards);
  const auto a = study::analyse(s, one), b = study::analyse(s, all.store());
  EXPECT_EQ(study::to_markdown(s, a), study::to_markdown(s, b));
  EXPECT_EQ(study::to_csv(s, a), study::to_csv(s, b));
  ASSERT_EQ(all.store().runs().size(), s.runs.size());
  EXPECT_EQ(all.store().runs()[0].machine, machine_description());  // copied with the run
  const auto id = all.store().runs()[0].id;
  EXPECT_FALSE(all.store().metric(id, "test_bleu").empty());
  // Every run of the combined store has its origin, and only those.
  EXPECT_EQ(all.origin(1), shards[0] + " run 1");
  EXPECT_NO_THROW(all.origin(static_cast<std::int64_t>(s.runs.size())));
  EXPECT_THROW(all.origin(static_cast<std::int64_t>(s.runs.size()) + 1), std::out_of_range);

  // The whole store next to its shards: every run twice, identical, counted once.
  shards.push_back((d / "one.db").string());
  results::StoreSet twice(shards);
  EXPECT_EQ(twice.store().runs().size(), s.runs.size());
  EXPECT_EQ(study::to_markdown(s, study::analyse(s, twice.store())), study::to_markdown(s, a));
  // A copy with another result conflicts.
  results::Store other((d / "other.db").string());
  record(other, s.runs[2], results::RunStatus::finished, 1.0);
  const std::string e = test::error_of([&] { results::StoreSet({(d / "one.db").string(), (d / "other.db").string()}); });
  EXPECT_NE(e.find("conflicting results: "), std::string::npos) << e;
  EXPECT_NE(e.find("one.db run 3 and "), std::string::npos) << e;
  EXPECT_NE(e.find("other.db run 1 are the same run ('stores', seed"), std::string::npos) << e;
  EXPECT_NE(test::error_of([&] { results::StoreSet({(d / "none.db").string()}); }).find("no results store here"),
            std::string::npos);
}

namespace {
// A sweep of three points (the baseline 90..94, bias 8 at 80..84, bias 12 at 91..95; 5
// seeds) with a plot and an `also` metric, its store and report, for the page tests.
struct PageFixture {
  fs::path d = empty_dir("page");
  study::Sweep s;
  std::unique_ptr<results::Store> store;
  study::SweepReport rep;
  std::vector<std::pair<study::Sweep, study::SweepReport>> also;
  explicit PageFixture(const std::string& extra = "") {
    s = parse(extra + R"(
seeds = 5
baseline = "recipe=fp32"
also = ["test_bleu"]
[[grid]]
recipe = ["fp32"]
"quant.recipe" = "fp32"
[[grid]]
recipe = ["a"]
bias = [8, 12]
"quant.recipe" = "a=1.4.3:{bias}"
[[plot]]
type = "points"
title = "By point"
file = "points"
)" + std::string(test::kSmall), "page-sweep");
    store = std::make_unique<results::Store>((d / "r.db").string());
    for (const auto& r : s.runs) {
      const double k = static_cast<double>(r.seed);
      record(*store, r, results::RunStatus::finished, (r.point == 1 ? 79 : r.point == 2 ? 90 : 89) + k);
    }
    rep = study::analyse(s, *store);
    also = study::also_reports(s, *store);
  }
  std::string fill(const std::string& text) const {
    return study::fill_page(text, "page.md", {s, rep, also, "sweeps/x.toml", "docs/results/x"});
  }
};
}  // namespace

// Every placeholder of a page template becomes the report's own text: the numbers on a page
// are the store's. The p-values are the exact one-sided ones given the ties, counted over the
// 252 splits of the ten values by hand (scipy's method="exact" ignores ties: 0.8452 for
// bias 12).
TEST(Page, PlaceholdersBecomeTheReportsNumbers) {
  const PageFixture f;
  EXPECT_EQ(f.fill("fp32 {{value:recipe=fp32}} ({{p:recipe=fp32}}), bias 8 {{value: bias = 8 }} (p = {{p:bias=8}}), "
                   "bias 12 {{value:recipe=a,bias=12}} (p = {{p:bias=12}}); {{runs}} runs."),
            "fp32 92.00 ± 1.58 (baseline), bias 8 82.00 ± 1.58* (p = 0.0040), bias 12 93.00 ± 1.58 (p = 0.8492); 15 runs.");
  EXPECT_EQ(f.fill("{{table}}"), study::to_markdown(f.s, f.rep));
  EXPECT_EQ(f.fill("{{table:test_bleu}}"), study::to_markdown(f.also[0].first, f.also[0].second));
  EXPECT_NE(f.fill("{{table:test_bleu}}").find("1092.00 ± 1.58"), std::string::npos);
  EXPECT_EQ(f.fill("{{figure:points}}"), "![By point](points.png)\n([SVG](points.svg))");
  EXPECT_EQ(f.fill("{{commands}}"),
            "```sh\nfp8lab sweep sweeps/x.toml --jobs 2\nfp8lab report sweeps/x.toml --out docs/results/x\n```");
  EXPECT_EQ(f.fill("{{machines}}"), "Runs made on " + machine_description() + ".");
  EXPECT_EQ(f.fill("no placeholder { here } {x}\n"), "no placeholder { here } {x}\n");
}

// A point whose value has commas in it (a loss scaling with options) is selected by that
// value whole; other commas separate pairs.
TEST(Page, AValueWithCommasSelectsItsPoint) {
  const std::string sweep = R"(
seeds = 5
baseline = "scaling=none"
[[grid]]
scaling = ["none", "backoff:init=16,interval=100"]
"quant.loss_scale" = "{scaling}"
)" + std::string(test::kSmall);
  const auto s = parse(sweep, "commas");
  const fs::path d = empty_dir("commas");
  results::Store store((d / "r.db").string());
  for (const auto& r : s.runs)
    record(store, r, results::RunStatus::finished, (r.point ? 80 : 90) + static_cast<double>(r.seed), r.seed == 1);
  const auto rep = study::analyse(s, store);
  const std::vector<std::pair<study::Sweep, study::SweepReport>> also;
  const study::PageInputs in{s, rep, also, "s.toml", "out"};
  EXPECT_EQ(study::fill_page("{{value:scaling=backoff:init=16,interval=100}} {{p:scaling=none}}", "page.md", in),
            "83.00 ± 1.58* baseline");
  EXPECT_NE(test::error_of([&] { study::fill_page("{{value:scaling=backoff:init=16}}", "page.md", in); })
                .find("names no point"),
            std::string::npos);
  // The fixture's trace (seed 1 only): 2^10 for 50 steps, 2^9 for 50 with one skipped, 2^10.
  EXPECT_EQ(study::fill_page("{{scale:scaling=backoff:init=16,interval=100}} {{skipped:scaling=backoff:init=16,interval=100}}",
                             "page.md", in),
            "9.5 1.0");
  EXPECT_NE(test::error_of([&] { study::fill_page("{{scale:scaling=none}}", "page.md", in); }).find("has no loss scale"),
            std::string::npos);
}

// {{window:VAR:WITHIN:POINTS}} gives the values of VAR whose points lie within WITHIN of the
// baseline as ranges of consecutive points, and the best: one seed per bias, the baseline at
// 90, bias 0..20 at 80, 90, 70, 91, 92 and a diverged run.
TEST(Page, AWindowListsTheValuesNearTheBaseline) {
  const auto s = parse(R"(
seeds = 1
baseline = "kind=fp32"
[[grid]]
kind = ["fp32"]
"quant.recipe" = "fp32"
[[grid]]
kind = ["a"]
bias = [0, 4, 8, 12, 16, 20]
"quant.recipe" = "a=1.4.3:{bias}"
)" + std::string(test::kSmall), "window");
  const fs::path d = empty_dir("window");
  results::Store store((d / "r.db").string());
  const double by_point[] = {90, 80, 90, 70, 91, 92, 0};
  for (const auto& r : s.runs)
    record(store, r, r.point == 6 ? results::RunStatus::diverged : results::RunStatus::finished,
           by_point[r.point]);
  auto rep = study::analyse(s, store);
  const std::vector<std::pair<study::Sweep, study::SweepReport>> also;
  const auto fill = [&](const std::string& text, const study::SweepReport& r) {
    return study::fill_page(text, "page.md", {s, r, also, "s.toml", "out"});
  };
  EXPECT_EQ(fill("{{window:bias:3:kind=a}}", rep), "4, 12..16 (best 92.00 at 16)");
  EXPECT_EQ(fill("{{window:bias:0:kind=a}}", rep), "4, 12..16 (best 92.00 at 16)");
  EXPECT_EQ(fill("{{window:bias:10:kind=a}}", rep), "0..4, 12..16 (best 92.00 at 16)");
  EXPECT_EQ(fill("{{window: bias : 0.5 : kind=a,bias=8}}", rep), "none (best 70.00 at 8)");
  EXPECT_EQ(fill("{{window:bias:1:kind=a,bias=20}}", rep), "none (no finished run)");
  // Where lower is better the window lies below the baseline plus WITHIN.
  rep.higher_is_better = false;
  EXPECT_EQ(fill("{{window:bias:0:kind=a}}", rep), "0..8 (best 70.00 at 8)");
  EXPECT_EQ(fill("{{window:bias:1:kind=a}}", rep), "0..12 (best 70.00 at 8)");
  const auto error = [&](const std::string& text) { return test::error_of([&] { fill(text, rep); }); };
  EXPECT_NE(error("{{window:bias:3}}").find("expected window:VAR:WITHIN:POINTS"), std::string::npos);
  EXPECT_NE(error("{{window:bias:-1:kind=a}}").find("WITHIN must be a number >= 0, got '-1'"), std::string::npos);
  EXPECT_NE(error("{{window:bias:x:kind=a}}").find("WITHIN must be a number >= 0, got 'x'"), std::string::npos);
  EXPECT_NE(error("{{window:seed:3:kind=a}}").find("a point it names has no variable 'seed'"), std::string::npos);
  EXPECT_NE(error("{{window:bias:3:kind=b}}").find("names no point"), std::string::npos);
}

// A template's mistakes are errors naming the file, the line and the placeholder.
TEST(Page, BadPlaceholdersAreErrorsWithTheirLine) {
  const PageFixture f;
  const auto error = [&](const std::string& text) { return test::error_of([&] { f.fill(text); }); };
  const std::string unknown = error("line 1\nline 2 {{value:bias=8}}\n{{tabel}}\n");
  EXPECT_NE(unknown.find("page.md:3: placeholder '{{tabel}}': unknown placeholder (expected commands, runs, table[:ARG], "
                         "figure:ARG, value:ARG, p:ARG, scale:ARG, skipped:ARG, window:ARG, machines, zeroed:ARG)"),
            std::string::npos)
      << unknown;
  EXPECT_NE(error("{{value:recipe=a}}").find("names more than one point (recipe=a, bias=8; recipe=a, bias=12)"),
            std::string::npos);
  EXPECT_NE(error("{{value:recipe=b}}").find("names no point of sweep 'page-sweep'"), std::string::npos);
  EXPECT_NE(error("{{p:bias}}").find("expected var=value[,var=value], got 'bias'"), std::string::npos);
  EXPECT_NE(error("{{figure:nope}}").find("no [[plot]] with file = \"nope\""), std::string::npos);
  EXPECT_NE(error("{{table:train_loss}}").find("no 'also' metric 'train_loss'"), std::string::npos);
  EXPECT_NE(error("{{runs:3}}").find("'runs' takes no argument"), std::string::npos);
  EXPECT_NE(error("{{value}}").find("'value' needs an argument"), std::string::npos);
  EXPECT_NE(error("a\n{{value:bias=8\n}}").find("page.md:2: '{{' without '}}' on the same line"), std::string::npos);
  EXPECT_NE(error("{{value:bias=8").find("page.md:1: '{{' without '}}'"), std::string::npos);
}

// `page` (relative to the sweep file) makes the report write <out>/README.md from it; a
// template that is the page it would write is refused, and the old page kept.
TEST(Page, TheReportWritesThePageBesideItsTables) {
  const fs::path base = empty_dir("page-files");
  fs::create_directories(base / "out");
  write_file_atomic((base / "study.md").string(), std::string("# A study\n\n{{table}}\n{{figure:points}}\n"));
  const PageFixture f("page = \"page-files/study.md\"\n");
  EXPECT_EQ(f.s.page, (base / "study.md").lexically_normal().string());
  const auto files = study::write_report(f.s, f.rep, *f.store, (base / "out").string());
  ASSERT_FALSE(files.empty());
  EXPECT_EQ(files.back(), (base / "out" / "README.md").string());
  EXPECT_EQ(read_file(files.back()), "# A study\n\n" + study::to_markdown(f.s, f.rep) + "\n![By point](points.png)\n([SVG](points.svg))\n");

  const std::string page = "{{runs}}";
  write_file_atomic((base / "out" / "README.md").string(), page);
  study::Sweep same = f.s;
  same.page = (base / "out" / "README.md").string();
  const std::string e = test::error_of([&] { study::write_report(same, f.rep, *f.store, (base / "out").string()); });
  EXPECT_NE(e.find("is the page it would write"), std::string::npos) << e;
  EXPECT_EQ(read_file((base / "out" / "README.md").string()), page);
  const std::string missing = test::error_of([&] {
    study::Sweep none = f.s;
    none.page = (base / "missing.md").string();
    study::write_report(none, f.rep, *f.store, (base / "out").string());
  });
  EXPECT_NE(missing.find("missing.md"), std::string::npos) << missing;
  EXPECT_NE(test::error_of([] { parse("page = 3\n"); }).find("'page' must be a string"), std::string::npos);
  EXPECT_NE(test::error_of([] { parse("page = \"\"\n"); }).find("'page' is empty"), std::string::npos);
}

// {{zeroed:KIND;STEP;LAYERS;FORMAT;POINT}} reads the point's first run's histograms from the
// store. record()'s histograms count 5, 10, 20, 30, 20, 10 values at exponents -12..-7 in each
// of 5 layers; 1.4.3 (bias 7) has 2^-9 as its smallest positive value, so exponents -12 and
// -11 (below 2^-10) round to zero: 15 of 95 = 16 %, in any set of layers. 1.4.3:5 (smallest
// 2^-7) zeroes exponents up to -9: 65 of 95 = 68 %; 1.5.2 (2^-16) none.
TEST(Page, ZeroedGivesTheShareOfARunsValuesBelowAFormatsRange) {
  const fs::path base = empty_dir("page-zeroed");
  write_file_atomic((base / "study.md").string(),
                    std::string("{{zeroed:gx;50;*;1.4.3;bias=8}} {{zeroed: gx ; 0 ; fc ; 1.4.3:5 ; bias=12 }} "
                                "{{zeroed:a;100;!fc;1.5.2;recipe=fp32}}\n"));
  const PageFixture f("page = \"page-zeroed/study.md\"\n");
  ASSERT_EQ(parse_format("1.4.3").min_positive(), std::ldexp(1.0, -9));
  ASSERT_EQ(parse_format("1.4.3:5").min_positive(), std::ldexp(1.0, -7));
  // The fixture's store has no statistics: a store of the same runs with them.
  const fs::path d = empty_dir("page-zeroed-store");
  results::Store store((d / "r.db").string());
  for (const auto& r : f.s.runs) record(store, r, results::RunStatus::finished, 90, true);
  const auto rep = study::analyse(f.s, store);
  const auto files = study::write_report(f.s, rep, store, (base / "out").string());
  EXPECT_EQ(read_file(files.back()), "16 68 0\n");

  const std::vector<std::pair<study::Sweep, study::SweepReport>> also;
  const auto error = [&](const std::string& text, bool with_stats = true) {
    study::PageInputs in{f.s, rep, also, "s.toml", "out"};
    if (with_stats) in.point_stats = [&](int) { return store.stats(store.runs()[0].id); };
    return test::error_of([&] { study::fill_page(text, "page.md", in); });
  };
  EXPECT_NE(error("{{zeroed:gx;50;*;1.4.3}}").find("expected zeroed:KIND;STEP;LAYERS;FORMAT;POINT"), std::string::npos);
  EXPECT_NE(error("{{zeroed:grad;50;*;1.4.3;bias=8}}").find("KIND must be a, w, gx or gw, got 'grad'"), std::string::npos);
  EXPECT_NE(error("{{zeroed:gx;-1;*;1.4.3;bias=8}}").find("STEP must be a step number, got '-1'"), std::string::npos);
  EXPECT_NE(error("{{zeroed:gx;50;*;1.9.3;bias=8}}").find("page.md:1: placeholder"), std::string::npos);
  EXPECT_NE(error("{{zeroed:gx;60;*;1.4.3;bias=8}}").find("no gx statistics at step 60 in layers '*' (steps recorded: 0, 50, 100)"),
            std::string::npos);
  EXPECT_NE(error("{{zeroed:gx;50;head*;1.4.3;bias=8}}").find("in layers 'head*'"), std::string::npos);
  EXPECT_NE(error("{{zeroed:gx;50;*;1.4.3;bias=9}}").find("names no point"), std::string::npos);
  EXPECT_NE(error("{{zeroed:gx;50;*;1.4.3;bias=8}}", false).find("has no tensor statistics"), std::string::npos);
}
