// Sweeps: grid expansion and its errors; a sweep run again skips finished runs and resumes a
// stopped one from its checkpoint; runs of another live process are left alone.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>

#include <sqlite3.h>

#include "../common/testutil.hpp"
#include "fp8lab/core/machine.hpp"
#include "fp8lab/study/report.hpp"
#include "fp8lab/study/sweep.hpp"
#include "../study/small_sweep.hpp"
#include "fp8lab/train/trainer.hpp"

using namespace fp8lab;
namespace fs = std::filesystem;
using test::error_of;

namespace {
fs::path dir() { return test::temp_dir("fp8lab_sweep"); }

// An empty folder `name` of dir().
fs::path fresh(const std::string& name) {
  const fs::path d = dir() / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

study::Sweep parse(const std::string& body, const std::string& name = "t") {
  return study::parse_sweep("name = \"" + name + "\"\n" + body, "sweep.toml", dir().string(), train::complete_config);
}

// Trains in this process (the CLI spawns `fp8lab train` instead).
struct InProcess {
  std::string db;
  int calls = 0, resumed = 0;
  std::map<std::string, std::int64_t> stop_after;  // run key -> stop after N steps (once)
  int operator()(const study::SweepRun& run, const std::string& config, bool resume, const std::string&) {
    ++calls;
    resumed += resume;
    results::Store store(db);
    train::TrainOptions o;
    o.progress = false;
    o.resume = resume;
    if (auto it = stop_after.find(run.key); it != stop_after.end()) {
      o.stop_after = it->second;
      stop_after.erase(it);
    }
    const auto r = train::train(train::load_train_config(config), &store, o);
    return r.status == results::RunStatus::finished ? 0 : 1;
  }
};

// Says a stored run was made on `machine`, as a store shared with another computer would.
void set_machine(const std::string& db, std::int64_t run, const std::string& machine) {
  sqlite3* h = nullptr;
  ASSERT_EQ(sqlite3_open(db.c_str(), &h), SQLITE_OK);
  sqlite3_stmt* st = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(h, "UPDATE runs SET machine = ? WHERE id = ?", -1, &st, nullptr), SQLITE_OK);
  sqlite3_bind_text(st, 1, machine.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_int64(st, 2, run);
  EXPECT_EQ(sqlite3_step(st), SQLITE_DONE);
  sqlite3_finalize(st);
  sqlite3_close(h);
}

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
)" + std::string(test::kSmall));
  // 2 + 2 x 3 x 2 points, 2 seeds each.
  ASSERT_EQ(s.points.size(), 14u);
  EXPECT_EQ(s.runs.size(), 28u);
  EXPECT_EQ(s.baseline, 0);
  EXPECT_EQ(s.points[1].var("recipe"), "resnet32-mixed");
  EXPECT_EQ(s.runs[2].cfg.quant.recipe.text, "resnet32-mixed");
  EXPECT_EQ(s.runs[2].seed, 3u);
  EXPECT_EQ(s.runs[3].seed, 4u);
  // The second grid: kind-major, then bias, then the array-valued config key.
  const auto& p = s.points[2];
  EXPECT_EQ(p.label(), "kind=a, bias=10, optimizer.lr=0.1");
  EXPECT_EQ(s.runs[4].cfg.quant.recipe.text, "a=1.5.2:10");
  EXPECT_DOUBLE_EQ(s.runs[4].cfg.optimizer.lr, 0.1);
  EXPECT_EQ(s.points[13].label(), "kind=gx, bias=14, optimizer.lr=0.05");
  EXPECT_EQ(s.runs[27].cfg.quant.recipe.text, "gx=1.5.2:14");
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
  EXPECT_EQ(study::identity_of(settings::to_json(c)), s.runs[5].identity);
  c.seed = 99;
  EXPECT_NE(study::identity_of(settings::to_json(c)), s.runs[5].identity);
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
  // A range of NaN or infinite ends yields no points silently no longer; nor does one too
  // long to count.
  for (const char* r : {"{ from = 1, to = nan }", "{ from = nan, to = 1 }", "{ from = 0, to = inf }",
                        "{ from = 0, to = 1, step = nan }"})
    EXPECT_NE(error_of([&] { parse(std::string("[[grid]]\nb = ") + r + "\n"); }).find("must be finite numbers"),
              std::string::npos)
        << r;
  EXPECT_NE(error_of([] { parse("[[grid]]\nb = { from = 0, to = 1e300, step = 1e-300 }\n"); }).find("over 100000"),
            std::string::npos);
  // A plot's file and an 'also' metric stay inside the report's folder.
  for (const char* f : {"../../x", "/tmp/x", "a/b", ".hidden", ""})
    EXPECT_NE(error_of([&] { parse(std::string("[[plot]]\ntype = \"metric\"\nx = \"b\"\nfile = \"") + f + "\"\n"); })
                  .find("plot 'file'"),
              std::string::npos)
        << f;
  EXPECT_NE(error_of([] { parse("also = [\"../../x\"]\n"); }).find("'also' metric"), std::string::npos);
  EXPECT_NE(error_of([] { parse("[[plot]]\ntype = \"pie\"\n"); }).find("pie"), std::string::npos);
  EXPECT_NE(error_of([] { parse("metric = \"nsp_loss\"\nalso = [\"nsp_loss\"]\n"); }).find("'also'"), std::string::npos);
  EXPECT_NE(error_of([] { parse("[[plot]]\ntype = \"points\"\nlayers = [\"*.se_*\"]\n"); }).find("'layers'"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse("[[plot]]\ntitle = \"x\"\n"); }).find("needs 'type' (metric, heatmap,"), std::string::npos);
  // Every type's name parses back to it, and names the default file.
  for (auto t : {study::PlotType::metric, study::PlotType::loss_scale, study::PlotType::curve,
                 study::PlotType::fixed_point_snr, study::PlotType::block_stats})
    EXPECT_EQ(study::parse_plot_type(study::to_string(t)), t);
  EXPECT_EQ(parse("[[plot]]\ntype = \"loss-scale\"\n").plots.at(0).file, "plot1-loss-scale");
  EXPECT_NE(error_of([] { parse("[[plot]]\ntype = \"curve\"\n"); }).find("curve plot needs 'metric'"), std::string::npos);
  EXPECT_NE(error_of([] { parse("[[plot]]\ntype = \"points\"\nmetric = \"dev_bleu\"\n"); }).find("'metric' is a key of curve"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse("[[plot]]\ntype = \"histograms\"\nlayers = [\"\"]\n"); }).find("empty pattern"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse("[[grid]]\nb = [1]\n[[plot]]\ntype = \"metric\"\nx = \"c\"\n"); }).find("'c'"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse("[[grid]]\nb = [1]\n\"quant.recipe\" = \"a=1.9.9\"\n"); }), "");
  EXPECT_NE(error_of([] { study::parse_sweep("seeds = 2\n", "s.toml", ".", train::complete_config); }).find("'name'"), std::string::npos);
}

TEST(Sweep, AGridMayGiveItsOwnSeeds) {
  const std::string body = R"(
seeds = 3
baseline = "recipe=fp32"
[[grid]]
recipe = ["fp32", "mxfp8"]
seeds = [1, 2, 3, 4, 5]
"quant.recipe" = "{recipe}"
[[grid]]
recipe = ["mxfp4"]
"quant.recipe" = "{recipe}"
)" + std::string(test::kSmall);
  const auto s = parse(body);
  ASSERT_EQ(s.points.size(), 3u);
  ASSERT_EQ(s.runs.size(), 13u);  // 5 + 5 + 3
  EXPECT_EQ(s.points[0].var("recipe"), "fp32");  // `seeds` is not a variable
  EXPECT_EQ(s.points[0].seeds, (std::vector<std::uint64_t>{1, 2, 3, 4, 5}));
  EXPECT_TRUE(s.points[2].seeds.empty());
  EXPECT_EQ(s.runs[9].seed, 5u);
  EXPECT_EQ(s.runs[9].point, 1);
  EXPECT_EQ(s.runs[12].seed, 3u);
  EXPECT_EQ(s.runs[12].point, 2);
  // A run is the same run whichever sweep gave it its seed: seeds 1-3 of the first grid
  // are the runs of a sweep that gives every point 3 seeds.
  const auto plain = parse("seeds = 3\n[[grid]]\nrecipe = [\"fp32\"]\n\"quant.recipe\" = \"{recipe}\"\n" +
                           std::string(test::kSmall));
  ASSERT_EQ(plain.runs.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(plain.runs[i].key, s.runs[i].key);
  // Two grids may train one config on different seeds, but never on the same seed twice.
  EXPECT_NO_THROW(parse("[[grid]]\nr = [\"fp32\"]\nseeds = [1]\n[[grid]]\nr = [\"fp32\"]\nseeds = [2]\n" +
                        std::string(test::kSmall)));
  EXPECT_NE(error_of([] {
              parse("[[grid]]\nr = [\"fp32\"]\nseeds = [1, 2]\n[[grid]]\nr = [\"fp32\"]\nseeds = [2]\n" +
                    std::string(test::kSmall));
            }).find("train the same config"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse("[[grid]]\nr = [\"fp32\"]\nseeds = []\n"); }).find("seeds"), std::string::npos);
}

TEST(Sweep, EveryRunOnceAndAtLeastOne) {
  const auto fails = [](const std::string& body, const std::string& expected) {
    const std::string e = error_of([&] { parse(body); });
    EXPECT_NE(e.find(expected), std::string::npos) << body << "\n-> " << e;
  };
  fails("seeds = [1, 2, 1]\n", "seed 1 is given twice");
  fails("seeds = []\n", "'seeds' is empty");
  fails("grid = []\n", "'grid' is empty");
  fails("[[grid]]\n[[grid]]\n\"quant.recipe\" = [\"fp32\"]\n", "a [[grid]] with nothing in it");
  fails("[[grid]]\n\"quant.recipe\" = [\"fp32\", \"resnet32-mixed\", \"fp32\"]\n",
        "points quant.recipe=fp32 and quant.recipe=fp32 train the same config");
  fails("[[grid]]\nx = [1, 2]\n", "points x=1 and x=2 train the same config");  // x sets nothing
  fails("[[grid]]\nrecipe = [\"fp32\", \"resnet32-mixed\"]\n\"quant.recipe\" = \"{recipe}\"\n"
        "[[grid]]\nrecipe = [\"fp32\"]\n\"quant.recipe\" = \"{recipe}\"\n",
        "train the same config");  // two grids overlap
  const std::string escape = error_of([] { parse("", "../outside"); });
  EXPECT_NE(escape.find("sweep name '../outside' cannot name a file"), std::string::npos) << escape;
  const std::string run_name = error_of([] { train::parse_train_config("", "t.toml", {"name=\"a/b\""}); });
  EXPECT_NE(run_name.find("name 'a/b' cannot name a file"), std::string::npos) << run_name;
}

// A run starts with SIGINT held: one that arrives while it is starting (here the program
// sends it to itself at once) waits for the run to release it, instead of ending the run
// before it could stop with a checkpoint.
TEST(Sweep, LaunchedProgramStartsWithSigintHeld) {
  const fs::path log = dir() / "sigint.log";
  fs::remove(log);
  const int rc = study::launch_process({"/bin/sh", "-c", "kill -INT $$; echo still running"}, log.string());
  EXPECT_EQ(rc, 0);
  std::ifstream in(log);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "still running\n");  // without the hold, sh ends at the signal with status 130
}

// Two sweeps on one store that start the same run at once: the one whose process the
// checkpoint's lock refuses reports the run as running elsewhere, not as failed.
TEST(Sweep, ARunTheOtherSweepStartedFirstIsNotAFailure) {
  const fs::path d = fresh("race");
  const auto s = parse(R"(
seeds = 2
[[grid]]
recipe = ["fp32"]
"quant.recipe" = "{recipe}"
)" + std::string(test::kSmall), "race-sweep");
  const std::string db = (d / "r.db").string();
  results::Store store(db);
  int calls = 0;
  study::SweepOptions opt;
  opt.dir = (d / "runs").string();
  opt.progress = false;
  opt.cores = 2;
  // As the other sweep would: its row of the run is there, running, when this sweep's own
  // process is refused (exit 2) by the checkpoint's lock.
  opt.launch = [&](const study::SweepRun& run, const std::string& config, bool, const std::string&) {
    ++calls;
    results::Store other(db);
    const auto c = train::load_train_config(config);
    other.begin_run({c.name, c.task, settings::to_json(c), c.quant.recipe.text, c.quant.loss_scale.text, run.seed});
    return 2;
  };
  testing::internal::CaptureStderr();
  const auto sum = study::run_sweep(s, store, opt);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(sum.failed, 0) << err;
  EXPECT_EQ(sum.busy, 2) << err;
  EXPECT_NE(err.find("running in another process"), std::string::npos) << err;
}

TEST(Sweep, RunAgainSkipsFinishedAndResumesStopped) {
  const fs::path d = fresh("resume");
  const auto s = parse(R"(
seeds = 2
[[grid]]
recipe = ["fp32", "resnet32-mixed"]
"quant.recipe" = "{recipe}"
)" + std::string(test::kSmall), "resume-sweep");
  ASSERT_EQ(s.runs.size(), 4u);
  const std::string db = (d / "r.db").string();
  results::Store store(db);
  InProcess launcher{db};
  launcher.stop_after[s.runs[3].key] = 3;  // the last run stops after 3 of its 8 steps
  study::SweepOptions opt;
  opt.dir = (d / "runs").string();
  opt.progress = false;
  opt.launch = std::ref(launcher);
  opt.cores = 2;  // one job: 2 threads a run
  auto sum = study::run_sweep(s, store, opt);
  EXPECT_EQ(launcher.calls, 4);
  EXPECT_EQ(sum.started, 4);
  EXPECT_EQ(sum.finished, 3);
  EXPECT_EQ(sum.failed, 0);
  EXPECT_EQ(store.runs({.status = results::RunStatus::stopped}).size(), 1u);
  EXPECT_TRUE(fs::exists(d / "runs" / (s.runs[3].key + ".ckpt")));

  // Again, two jobs on the 2 cores: the three finished runs are skipped, the stopped one
  // resumes in its store row with the 2 threads it started with (only the same count
  // resumes bit for bit), and the sweep warns that it takes more than a run's share. It
  // started (the store says) on another processor: the sweep says so, and its row names both.
  const std::int64_t stopped_id = store.runs({.status = results::RunStatus::stopped})[0].id;
  set_machine(db, stopped_id, "Other CPU (family 1, model 2)");
  launcher.calls = 0;
  opt.jobs = 2;
  testing::internal::CaptureStderr();
  sum = study::run_sweep(s, store, opt);
  const std::string said = testing::internal::GetCapturedStderr();
  EXPECT_NE(said.find("resumes with the 2 threads it started with"), std::string::npos) << said;
  EXPECT_NE(said.find("more than the 1 a run gets here"), std::string::npos) << said;
  EXPECT_NE(said.find("warning: started on Other CPU (family 1, model 2), resumes here on " + machine_description()),
            std::string::npos) << said;
  EXPECT_EQ(said.find("counts as done were made on another processor"), std::string::npos) << said;
  EXPECT_EQ(train::load_train_config((d / "runs" / (s.runs[3].key + ".toml")).string()).threads, 2);
  EXPECT_EQ(launcher.calls, 1);
  EXPECT_EQ(launcher.resumed, 1);
  EXPECT_EQ(sum.skipped, 3);
  EXPECT_EQ(sum.resumed, 1);
  EXPECT_EQ(sum.finished, 1);
  const auto rows = store.runs({.name = "resume-sweep"});
  EXPECT_EQ(rows.size(), 4u);  // resumed into the same row, not a new one
  for (const auto& r : rows) EXPECT_EQ(r.status, results::RunStatus::finished) << r.id;

  for (const auto& r : rows)
    EXPECT_EQ(r.machine, r.id == stopped_id ? "Other CPU (family 1, model 2); resumed on " + machine_description()
                                            : machine_description());

  // And again: nothing to do. The runs it counts as done that were not all made here are
  // named by processor.
  launcher.calls = 0;
  opt.jobs = 1;
  set_machine(db, rows[0].id, "");
  testing::internal::CaptureStderr();
  sum = study::run_sweep(s, store, opt);
  const std::string again = testing::internal::GetCapturedStderr();
  EXPECT_EQ(launcher.calls, 0);
  EXPECT_EQ(sum.skipped, 4);
  EXPECT_NE(again.find("warning: 2 of the runs it counts as done were made on another processor or do not record "
                       "theirs (not recorded: 1; Other CPU (family 1, model 2); resumed on " + machine_description() +
                       ": 1); runs made here, on " + machine_description()),
            std::string::npos)
      << again;

  // With same_machine the sweep refuses those runs instead, naming them, and runs nothing.
  opt.same_machine = true;
  try {
    study::run_sweep(s, store, opt);
    ADD_FAILURE() << "a sweep with same_machine counted runs made elsewhere";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("--same-machine: 2 of the runs it would count as done or resume were made on another "
                        "processor or do not record theirs (not recorded: 1; Other CPU"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("this is " + machine_description()), std::string::npos) << what;
  }
  EXPECT_EQ(launcher.calls, 0);
  opt.same_machine = false;

  // The report sees all four.
  const auto rep = study::analyse(s, store);
  ASSERT_EQ(rep.points.size(), 2u);
  EXPECT_EQ(rep.points[0].stats.n, 2u);
  EXPECT_EQ(rep.points[1].stats.n, 2u);
  EXPECT_EQ(rep.metric, "test_accuracy");
}

TEST(Sweep, LeavesRunsOfAnotherLiveProcessAlone) {
  const fs::path d = fresh("busy");
  const auto s = parse("seeds = 2\n" + std::string(test::kSmall), "busy-sweep");
  ASSERT_EQ(s.runs.size(), 2u);
  const std::string db = (d / "b.db").string();
  results::Store store(db);
  // Seed 1 is "running" in a live process (this one, as far as the store can tell).
  results::RunInfo info;
  info.name = s.name;
  info.kind = s.runs[0].cfg.task;
  info.config_json = settings::to_json(s.runs[0].cfg);
  info.recipe = s.runs[0].cfg.quant.recipe.text;
  info.loss_scale = s.runs[0].cfg.quant.loss_scale.text;
  info.seed = s.runs[0].seed;
  store.begin_run(info);
  InProcess launcher{db};
  study::SweepOptions opt;
  opt.dir = (d / "runs").string();
  opt.progress = false;
  opt.launch = std::ref(launcher);
  const auto sum = study::run_sweep(s, store, opt);
  EXPECT_EQ(sum.busy, 1);
  EXPECT_EQ(launcher.calls, 1);  // seed 2 only
  EXPECT_EQ(sum.finished, 1);
}

TEST(Sweep, ShippedSweepsParse) {
  // Shipped sweeps run from the repository root (scripts/studies.sh), where the recipe files
  // they name are found.
  struct Cwd {
    fs::path old = fs::current_path();
    ~Cwd() { fs::current_path(old); }
  } cwd;
  fs::current_path(FP8LAB_SOURCE_DIR);
  int n = 0;
  for (const auto& e : fs::directory_iterator(fs::path(FP8LAB_SOURCE_DIR) / "configs" / "sweeps")) {
    if (e.path().extension() != ".toml") continue;
    const auto s = study::load_sweep(e.path().string(), train::complete_config);
    EXPECT_FALSE(s.runs.empty()) << e.path();
    ++n;
  }
  EXPECT_GE(n, 5);
}

TEST(Sweep, ShardsAreDisjointCoverTheRunsAndBalance) {
  const std::string body = R"(
seeds = [1, 2, 3]
[[grid]]
recipe = ["fp32", "resnet32-mixed", "resnet32-152", "a=1.4.3"]
"quant.recipe" = "{recipe}"
)";
  const auto all = parse(body);
  ASSERT_EQ(all.runs.size(), 12u);
  for (int n : {1, 2, 5, 12, 13}) {
    std::multiset<std::pair<std::string, std::uint64_t>> seen;
    std::size_t smallest = all.runs.size(), largest = 0;
    for (int i = 0; i < n; ++i) {
      auto s = parse(body);
      study::keep_shard(s, study::parse_shard(std::to_string(i) + "/" + std::to_string(n)));
      for (const auto& r : s.runs) seen.insert({r.key, r.seed});
      smallest = std::min(smallest, s.runs.size());
      largest = std::max(largest, s.runs.size());
    }
    EXPECT_EQ(seen.size(), all.runs.size()) << n;  // every run in some shard ...
    for (const auto& r : all.runs) EXPECT_EQ(seen.count({r.key, r.seed}), 1u) << n;  // ... in exactly one
    EXPECT_LE(largest - smallest, 1u) << n;
  }
  // The order of the points in the file does not change the shards.
  auto a = parse(body);
  auto b = parse(R"(
seeds = [3, 1, 2]
[[grid]]
recipe = ["a=1.4.3", "resnet32-152", "fp32", "resnet32-mixed"]
"quant.recipe" = "{recipe}"
)");
  study::keep_shard(a, {1, 3});
  study::keep_shard(b, {1, 3});
  std::set<std::pair<std::string, std::uint64_t>> ka, kb;
  for (const auto& r : a.runs) ka.insert({r.key, r.seed});
  for (const auto& r : b.runs) kb.insert({r.key, r.seed});
  EXPECT_EQ(ka, kb);
  for (const char* bad : {"1", "3/3", "-1/2", "0/0", "a/2", "1/2x", "/2"})
    EXPECT_THROW(study::parse_shard(bad), Error) << bad;
  EXPECT_EQ(study::to_string(study::parse_shard("2/7")), "2/7");
}
