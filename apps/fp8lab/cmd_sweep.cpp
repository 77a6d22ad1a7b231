// fp8lab sweep SWEEP.toml [--jobs N]: run every point x seed of a sweep that the store does
// not already hold (finished or diverged); resume stopped ones from their checkpoints.
// Ctrl-C stops each running run with a checkpoint; running the sweep again continues.
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "commands.hpp"
#include "fp8lab/experiments/sweep.hpp"
#include "fp8lab/experiments/trainer.hpp"

namespace fp8lab::cli {

namespace {
struct SweepArgs {
  std::string sweep, db = "results.db", dir, shard;
  int jobs = 1;
  bool dry_run = false, no_progress = false;
};

extern "C" void on_sweep_second_sigint(int) {
  experiments::interrupt_launched();  // the runs die now, keeping their last checkpoints
  _exit(130);
}
extern "C" void on_sweep_sigint(int) {
  experiments::request_stop();
  experiments::interrupt_launched();
  std::signal(SIGINT, on_sweep_second_sigint);
}

int run_sweep_cmd(const SweepArgs& a) {
  experiments::Sweep s = experiments::load_sweep(a.sweep);
  const std::size_t all_runs = s.runs.size();
  std::optional<experiments::Shard> shard;
  if (!a.shard.empty()) {
    shard = experiments::parse_shard(a.shard);
    experiments::keep_shard(s, *shard);
  }
  results::Store store(a.db);
  experiments::SweepOptions opt;
  opt.jobs = a.jobs;
  opt.dir = a.dir;
  opt.progress = !a.no_progress;
  opt.dry_run = a.dry_run;
  const std::string exe = "/proc/self/exe";
  char self[4096];
  const ssize_t n = ::readlink(exe.c_str(), self, sizeof self - 1);
  const std::string path = n > 0 ? std::string(self, static_cast<std::size_t>(n)) : exe;
  opt.launch = [&](const experiments::SweepRun&, const std::string& config, bool resume, const std::string& log) {
    std::vector<std::string> args = {path, "train", config, "--db", a.db, "--no-progress"};
    if (resume) args.push_back("--resume");
    return experiments::launch_process(args, log);
  };
  std::fprintf(stderr, "sweep %s: %zu points x %zu seeds = %zu runs, store %s\n", s.name.c_str(), s.points.size(),
               s.seeds.size(), all_runs, a.db.c_str());
  if (shard)
    std::fprintf(stderr, "sweep %s: shard %s holds %zu of the %zu runs\n", s.name.c_str(), to_string(*shard).c_str(),
                 s.runs.size(), all_runs);
  experiments::clear_stop_request();
  std::signal(SIGINT, on_sweep_sigint);
  const auto sum = experiments::run_sweep(s, store, opt);
  std::signal(SIGINT, SIG_DFL);
  if (a.dry_run) return 0;
  std::fprintf(stderr,
               "sweep %s: %d runs: %d already done, %d started, %d resumed; %d finished, %d diverged, %d failed\n",
               s.name.c_str(), sum.total, sum.skipped, sum.started, sum.resumed, sum.finished, sum.diverged,
               sum.failed);
  if (sum.stopped) {
    std::fprintf(stderr, "stopped; run the same command again to continue\n");
    return 130;
  }
  if (sum.busy > 0)
    std::fprintf(stderr, "%d runs are running in another process; run the sweep again when they end\n", sum.busy);
  if (sum.failed > 0) return 1;
  std::fprintf(stderr, "tables and plots: fp8lab report %s --db %s\n", a.sweep.c_str(), a.db.c_str());
  return 0;
}
}  // namespace

void register_sweep(CLI::App& app) {
  auto args = std::make_shared<SweepArgs>();
  auto* cmd = app.add_subcommand("sweep", "Run a grid of trainings x seeds (skips what the store already holds)");
  cmd->add_option("sweep", args->sweep, "Sweep file (TOML; see docs/experiments.md)")->required();
  cmd->add_option("--db", args->db, "Results store (SQLite)")->capture_default_str();
  cmd->add_option("--jobs,-j", args->jobs, "Runs at once (each gets cores/jobs threads)")->check(CLI::Range(1, 64))->capture_default_str();
  cmd->add_option("--shard", args->shard,
                  "Run only shard I of N (I/N, 0 <= I < N): a deterministic share of the runs, for N jobs or machines");
  cmd->add_option("--dir", args->dir, "Run configs, logs and checkpoints (default runs/<sweep name>)");
  cmd->add_flag("--dry-run", args->dry_run, "List what would run");
  cmd->add_flag("--no-progress", args->no_progress, "No progress bar");
  cmd->callback([args] {
    const int rc = run_sweep_cmd(*args);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace fp8lab::cli
