// Sweeps: grid expansion and its errors; a sweep run again skips finished runs and resumes a
// stopped one from its checkpoint; the report's statistics, tables and plots from a fixture
// store.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include "../common/testutil.hpp"
#include "fp8lab/experiments/report.hpp"
#include "fp8lab/experiments/sweep.hpp"
#include "fp8lab/experiments/trainer.hpp"
#include "fp8lab/results/plot.hpp"

using namespace fp8lab;
namespace fs = std::filesystem;
using test::error_of;

namespace {
fs::path dir() { return test::temp_dir("fp8lab_sweep"); }

// A synthetic problem a width-4 ResNet-8 learns in a few steps.
const char* kSmall = R"(
[set]
"model.name" = "resnet8"
"model.width" = 4
"data.name" = "synthetic"
"data.image_size" = 8
"data.synthetic_train" = 64
"data.synthetic_test" = 32
"data.synthetic_classes" = 2
"data.synthetic_channels" = 1
"train.epochs" = 2
"train.batch" = 16
"threads" = 1
)";

experiments::Sweep parse(const std::string& body, const std::string& name = "t") {
  return experiments::parse_sweep("name = \"" + name + "\"\n" + body, "sweep.toml", dir().string());
}

// Trains in this process (the CLI spawns `fp8lab train` instead).
struct InProcess {
  std::string db;
  int calls = 0, resumed = 0;
  std::map<std::string, std::int64_t> stop_after;  // run key -> stop after N steps (once)
  int operator()(const experiments::SweepRun& run, const std::string& config, bool resume, const std::string&) {
    ++calls;
    resumed += resume;
    results::Store store(db);
    experiments::TrainOptions o;
    o.progress = false;
    o.resume = resume;
    if (auto it = stop_after.find(run.key); it != stop_after.end()) {
      o.stop_after = it->second;
      stop_after.erase(it);
    }
    const auto r = experiments::train(experiments::load_train_config(config), &store, o);
    return r.status == "finished" ? 0 : 1;
  }
};

}  // namespace

TEST(Sweep, ExpandsGridsTemplatesRangesAndSeeds) {
  const auto s = parse(R"(
seeds = [3, 4]
baseline = "recipe=fp32"
[[grid]]
recipe = ["fp32", "resnet32-mixed"]
"quant.recipe" = "{recipe}"
[[grid]]
kind = ["a", "gx"]
bias = { from = 10, to = 14, step = 2 }
"quant.recipe" = "{kind}=1.5.2:{bias}"
"optimizer.lr" = [0.1, 0.05]
)" + std::string(kSmall));
  // 2 + 2 x 3 x 2 points, 2 seeds each.
  ASSERT_EQ(s.points.size(), 14u);
  EXPECT_EQ(s.runs.size(), 28u);
  EXPECT_EQ(s.baseline, 0);
  EXPECT_EQ(s.points[1].var("recipe"), "resnet32-mixed");
  EXPECT_EQ(s.runs[2].cfg.quant.recipe, "resnet32-mixed");
  EXPECT_EQ(s.runs[2].seed, 3u);
  EXPECT_EQ(s.runs[3].seed, 4u);
  // The second grid: kind-major, then bias, then the array-valued config key.
  const auto& p = s.points[2];
  EXPECT_EQ(p.label(), "kind=a, bias=10, optimizer.lr=0.1");
  EXPECT_EQ(s.runs[4].cfg.quant.recipe, "a=1.5.2:10");
  EXPECT_DOUBLE_EQ(s.runs[4].cfg.optimizer.lr, 0.1);
  EXPECT_EQ(s.points[13].label(), "kind=gx, bias=14, optimizer.lr=0.05");
  EXPECT_EQ(s.runs[27].cfg.quant.recipe, "gx=1.5.2:14");
  EXPECT_DOUBLE_EQ(s.runs[27].cfg.optimizer.lr, 0.05);
  EXPECT_EQ(s.runs[27].cfg.model.width, 4);
  EXPECT_EQ(s.runs[27].cfg.name, "t");
  // Identities: distinct per run, and blind to the thread count and checkpoint path.
  std::set<std::string> keys;
  for (const auto& r : s.runs) keys.insert(r.key);
  EXPECT_EQ(keys.size(), s.runs.size());
  auto c = s.runs[5].cfg;
  c.threads = 7;
  c.train.checkpoint = "/elsewhere.ckpt";
  EXPECT_EQ(experiments::identity_of(experiments::to_json(c)), s.runs[5].identity);
  c.seed = 99;
  EXPECT_NE(experiments::identity_of(experiments::to_json(c)), s.runs[5].identity);
}

TEST(Sweep, ErrorsNameTheProblemAndLine) {
  EXPECT_NE(error_of([] { parse("[[grid]]\nx = [1, 2]\n\"quant.recipe\" = \"{y}\"\n"); }).find("{y}"), std::string::npos);
  const std::string bad_key = error_of([] { parse("[[grid]]\nx = [1]\n\"optimizer.nope\" = 1\n"); });
  EXPECT_NE(bad_key.find("nope"), std::string::npos) << bad_key;
  EXPECT_NE(bad_key.find("x=1"), std::string::npos) << bad_key;  // the point it came from
  const std::string unknown = error_of([] { parse("\nseedz = 3\n"); });
  EXPECT_NE(unknown.find("sweep.toml:3"), std::string::npos) << unknown;
  EXPECT_NE(unknown.find("seedz"), std::string::npos);
  EXPECT_NE(error_of([] { parse("baseline = \"recipe=fp16\"\n[[grid]]\nrecipe = [\"fp32\"]\n"); }).find("matches no point"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse("[[grid]]\nb = { from = 3, to = 1 }\n"); }).find("from <= to"), std::string::npos);
  EXPECT_NE(error_of([] { parse("[[plot]]\ntype = \"pie\"\n"); }).find("pie"), std::string::npos);
  EXPECT_NE(error_of([] { parse("[[grid]]\nb = [1]\n[[plot]]\ntype = \"metric\"\nx = \"c\"\n"); }).find("'c'"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse("[[grid]]\nb = [1]\n\"quant.recipe\" = \"a=1.9.9\"\n"); }), "");
  EXPECT_NE(error_of([] { experiments::parse_sweep("seeds = 2\n", "s.toml", "."); }).find("'name'"), std::string::npos);
}

TEST(Sweep, RunAgainSkipsFinishedAndResumesStopped) {
  const fs::path d = dir() / "resume";
  fs::remove_all(d);
  fs::create_directories(d);
  const auto s = parse(R"(
seeds = 2
[[grid]]
recipe = ["fp32", "resnet32-mixed"]
"quant.recipe" = "{recipe}"
)" + std::string(kSmall), "resume-sweep");
  ASSERT_EQ(s.runs.size(), 4u);
  const std::string db = (d / "r.db").string();
  results::Store store(db);
  InProcess launcher{db};
  launcher.stop_after[s.runs[3].key] = 3;  // the last run stops after 3 of its 8 steps
  experiments::SweepOptions opt;
  opt.dir = (d / "runs").string();
  opt.progress = false;
  opt.launch = std::ref(launcher);
  auto sum = experiments::run_sweep(s, store, opt);
  EXPECT_EQ(launcher.calls, 4);
  EXPECT_EQ(sum.started, 4);
  EXPECT_EQ(sum.finished, 3);
  EXPECT_EQ(sum.failed, 0);
  EXPECT_EQ(store.runs({.status = "stopped"}).size(), 1u);
  EXPECT_TRUE(fs::exists(d / "runs" / (s.runs[3].key + ".ckpt")));

  // Again: the three finished runs are skipped, the stopped one resumes in its store row.
  launcher.calls = 0;
  sum = experiments::run_sweep(s, store, opt);
  EXPECT_EQ(launcher.calls, 1);
  EXPECT_EQ(launcher.resumed, 1);
  EXPECT_EQ(sum.skipped, 3);
  EXPECT_EQ(sum.resumed, 1);
  EXPECT_EQ(sum.finished, 1);
  const auto rows = store.runs({.status = "", .recipe = "", .name = "resume-sweep"});
  EXPECT_EQ(rows.size(), 4u);  // resumed into the same row, not a new one
  for (const auto& r : rows) EXPECT_EQ(r.status, "finished") << r.id;

  // And again: nothing to do.
  launcher.calls = 0;
  sum = experiments::run_sweep(s, store, opt);
  EXPECT_EQ(launcher.calls, 0);
  EXPECT_EQ(sum.skipped, 4);

  // The report sees all four.
  const auto rep = experiments::analyse(s, store);
  ASSERT_EQ(rep.points.size(), 2u);
  EXPECT_EQ(rep.points[0].stats.n, 2u);
  EXPECT_EQ(rep.points[1].stats.n, 2u);
  EXPECT_EQ(rep.metric, "test_accuracy");
}

namespace {
// A store holding chosen metrics for a sweep's runs, as if it had been run.
void record(results::Store& store, const experiments::SweepRun& r, const std::string& status, double metric,
            bool with_stats = false) {
  results::RunInfo info;
  info.name = r.cfg.name;
  info.kind = r.cfg.task;
  info.config_json = experiments::to_json(r.cfg);
  info.recipe = r.cfg.quant.recipe;
  info.loss_scale = r.cfg.quant.loss_scale;
  info.seed = r.seed;
  const auto id = store.begin_run(info);
  if (with_stats) {
    std::vector<results::Store::StatRow> rows;
    for (std::int64_t step : {0, 100})
      for (const char* layer : {"conv1", "layer1.conv", "fc"})
        for (const char* kind : {"a", "w", "gx", "gw"}) {
          results::Store::StatRow s;
          s.step = step;
          s.layer = layer;
          s.kind = kind;
          s.total = 100;
          s.histogram = R"({"lo": -12, "counts": [5, 10, 20, 30, 20, 10], "zero": 5, "inf": 0, "nan": 0})";
          rows.push_back(s);
        }
    store.log_stats(id, rows);
    store.log_loss_scale(id, {{0, 10, false}, {50, 9, true}, {100, 10, false}});
  }
  store.log_metric(id, 50, "test_bleu", -1);  // an earlier evaluation: not the one reported
  store.log_metric(id, 100, "test_bleu", metric + 1000);
  store.finish_run(id, status, status == "finished" ? std::optional<double>(metric) : std::nullopt, "test_accuracy", 1.0);
}

bool valid_svg(const std::string& path) {
  std::ifstream in(path);
  const std::string s((std::istreambuf_iterator<char>(in)), {});
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
  const fs::path d = dir() / "report";
  fs::remove_all(d);
  fs::create_directories(d);
  const auto s = parse(R"(
seeds = 5
baseline = "recipe=fp32"
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
type = "loss-scale"
file = "scale"
[[plot]]
type = "fixed-point-snr"
file = "snr"
)" + std::string(kSmall), "report-sweep");
  ASSERT_EQ(s.points.size(), 3u);
  results::Store store((d / "r.db").string());
  // Baseline 90..94; bias 8 clearly worse (80..84); bias 12 the same as the baseline, but one
  // seed diverged and one not run yet.
  for (const auto& r : s.runs) {
    const double k = static_cast<double>(r.seed);
    if (r.point == 0) record(store, r, "finished", 89 + k, r.seed == 1);
    if (r.point == 1) record(store, r, "finished", 79 + k);
    if (r.point == 2 && r.seed <= 3) record(store, r, "finished", 89 + k);
    if (r.point == 2 && r.seed == 4) record(store, r, "diverged", 0);
  }
  const auto rep = experiments::analyse(s, store);
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

  const std::string md = experiments::to_markdown(s, rep);
  // The scale trace (2^10 for 50 steps, 2^9 for 50, then 2^10) of seed 1 only.
  ASSERT_TRUE(rep.points[0].mean_log2_scale.has_value());
  EXPECT_NEAR(*rep.points[0].mean_log2_scale, (10.0 * 50 + 9 * 50 + 10) / 101, 1e-12);
  EXPECT_EQ(*rep.points[0].skipped_steps, 1.0);
  EXPECT_FALSE(rep.points[1].mean_log2_scale.has_value());
  EXPECT_NE(md.find("| 8 | 1.4.3 b8 | fp32 | fp32 | fp32 | backoff | - | - | 82.00 ± 1.58* | 5 |"), std::string::npos) << md;
  EXPECT_NE(md.find("92.00 ± 1.58 | 5 | baseline"), std::string::npos) << md;
  EXPECT_NE(md.find("(+1 diverged) (1 missing)"), std::string::npos) << md;
  const std::string csv = experiments::to_csv(s, rep);
  EXPECT_NE(csv.find("recipe,bias,recipe,a,w,gx,gw"), std::string::npos) << csv;

  const auto files = experiments::write_report(s, rep, store, (d / "out").string());
  for (const char* stem : {"acc", "heat", "hist", "scale", "snr"}) {
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
  // The histogram figure shows each format's range and labels its axes.
  std::ifstream in(d / "out" / "hist.svg");
  const std::string svg((std::istreambuf_iterator<char>(in)), {});
  EXPECT_NE(svg.find("1.4.3:10 normal"), std::string::npos);
  EXPECT_NE(svg.find("1.5.2:33 subnormal"), std::string::npos);
  EXPECT_NE(svg.find("floor(log2 |x|)"), std::string::npos);
  EXPECT_NE(svg.find("grad_x, step 100"), std::string::npos);
  EXPECT_TRUE(fs::exists(d / "out" / "table.md"));

  // A metric named in the sweep is the run's last logged value of it, not its final metric.
  experiments::Sweep named = s;
  named.metric = "test_bleu";
  const auto rep2 = experiments::analyse(named, store);
  EXPECT_EQ(rep2.metric, "test_bleu");
  EXPECT_NEAR(rep2.points[0].stats.mean, 1092, 1e-9);
  EXPECT_NEAR(rep2.points[1].stats.mean, 1082, 1e-9);
}

TEST(Plot, RasterDrawsWhatTheFigureHolds) {
  results::plot::Figure f;
  results::plot::Panel p;
  p.series.push_back({"line", {0, 1}, {0, 1}, {}, 3});  // red
  p.xmin = 0, p.xmax = 1, p.ymin = 0, p.ymax = 1;
  f.panels.push_back(p);
  int w = 0, h = 0;
  const auto px = results::plot::rasterize(f, w, h);
  ASSERT_EQ(px.size(), static_cast<std::size_t>(w) * static_cast<std::size_t>(h) * 3);
  std::size_t red = 0;
  for (std::size_t i = 0; i < px.size(); i += 3) red += px[i] > 200 && px[i + 1] < 80 && px[i + 2] < 80;
  EXPECT_GT(red, 300u);  // a diagonal of some 400 pixels, 2 wide
  f.panels[0].series.clear();
  const auto blank = results::plot::rasterize(f, w, h);
  red = 0;
  for (std::size_t i = 0; i < blank.size(); i += 3) red += blank[i] > 200 && blank[i + 1] < 80 && blank[i + 2] < 80;
  EXPECT_EQ(red, 0u);
}

TEST(Sweep, LeavesRunsOfAnotherLiveProcessAlone) {
  const fs::path d = dir() / "busy";
  fs::remove_all(d);
  fs::create_directories(d);
  const auto s = parse("seeds = 2\n" + std::string(kSmall), "busy-sweep");
  ASSERT_EQ(s.runs.size(), 2u);
  const std::string db = (d / "b.db").string();
  results::Store store(db);
  // Seed 1 is "running" in a live process (this one, as far as the store can tell).
  results::RunInfo info;
  info.name = s.name;
  info.kind = s.runs[0].cfg.task;
  info.config_json = experiments::to_json(s.runs[0].cfg);
  info.recipe = s.runs[0].cfg.quant.recipe;
  info.loss_scale = s.runs[0].cfg.quant.loss_scale;
  info.seed = s.runs[0].seed;
  store.begin_run(info);
  InProcess launcher{db};
  experiments::SweepOptions opt;
  opt.dir = (d / "runs").string();
  opt.progress = false;
  opt.launch = std::ref(launcher);
  const auto sum = experiments::run_sweep(s, store, opt);
  EXPECT_EQ(sum.busy, 1);
  EXPECT_EQ(launcher.calls, 1);  // seed 2 only
  EXPECT_EQ(sum.finished, 1);
}
