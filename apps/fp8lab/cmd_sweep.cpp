// fp8lab sweep SWEEP.toml [--jobs N]: run every point x seed of a sweep that the store does
// not already hold (finished or diverged); resume stopped ones from their checkpoints.
// Ctrl-C stops each running run with a checkpoint; running the sweep again continues.
// The runs start from a private copy of the program (ProgramCopy), so rebuilding meanwhile
// is safe.
#include <unistd.h>

#include <csignal>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "build.hpp"
#include "commands.hpp"
#include "process.hpp"
#include "fp8lab/core/files.hpp"
#include "fp8lab/core/error.hpp"
#include "fp8lab/study/sweep.hpp"
#include "fp8lab/core/stop.hpp"

namespace fp8lab::cli {

namespace {
struct SweepArgs {
  std::string sweep, db = "results.db", dir, shard, emit, time;
  int jobs = 1, cores = 0, shards = 0, cpus_per_task = 0;
  bool dry_run = false, no_progress = false, same_machine = false;
};

extern "C" void on_sweep_second_sigint(int) {
  study::interrupt_launched();  // the runs die now, keeping their last checkpoints
  _exit(130);
}
extern "C" void on_sweep_sigint(int) {
  request_stop();
  study::interrupt_launched();
  std::signal(SIGINT, on_sweep_second_sigint);
}

// --emit slurm: the job-array script on stdout; its folder is made now, since Slurm opens
// the tasks' log files there before a task starts.
int emit_slurm(const SweepArgs& a, const study::Sweep& s) {
  study::SlurmOptions o;
  o.program = self_program();
  o.sweep_file = a.sweep;
  o.dir = a.dir.empty() ? "slurm/" + s.name : a.dir;
  o.shards = a.shards > 0 ? a.shards : static_cast<int>(s.runs.size());
  o.jobs = a.jobs;
  o.cpus_per_task = a.cpus_per_task > 0 ? a.cpus_per_task : a.jobs;
  o.time = a.time;
  const std::string script = study::slurm_script(s, o);
  make_folder(o.dir);
  std::fputs(script.c_str(), stdout);
  std::fprintf(stderr, "sweep %s: %zu runs in %d array tasks; submit with sbatch\n", s.name.c_str(), s.runs.size(),
               o.shards);
  return 0;
}

int run_sweep_cmd(const SweepArgs& a) {
  if (!kCanTrain && !a.dry_run) throw Error(std::string(kNoTrainingLayer) + "; this one lists a sweep's runs with --dry-run");
  study::Sweep s = study::load_sweep(a.sweep, kConfigCheck);
  if (!kCanTrain)
    std::fprintf(stderr, "sweep %s: built without libtorch: the runs' configs are checked for their settings and "
                 "ranges, not for the names of their tasks, models and data sets\n", s.name.c_str());
  if (!a.emit.empty()) {
    if (!a.shard.empty()) throw Error("--emit slurm makes every shard's task; leave out --shard");
    return emit_slurm(a, s);
  }
  if (a.shards > 0 || a.cpus_per_task > 0 || !a.time.empty())
    throw Error("--shards, --cpus-per-task and --time describe the Slurm script: use them with --emit slurm");
  const std::size_t all_runs = s.runs.size();
  std::optional<study::Shard> shard;
  if (!a.shard.empty()) {
    shard = study::parse_shard(a.shard);
    study::keep_shard(s, *shard);
  }
  results::Store store(a.db);
  study::SweepOptions opt;
  opt.jobs = a.jobs;
  opt.cores = a.cores;
  opt.dir = a.dir;
  opt.progress = !a.no_progress;
  opt.dry_run = a.dry_run;
  opt.same_machine = a.same_machine;
  std::optional<ProgramCopy> copy;
  if (!a.dry_run) copy.emplace();
  opt.launch = [&](const study::SweepRun&, const std::string& config, bool resume, const std::string& log) {
    std::vector<std::string> args = {copy->program(), "train", config, "--db", a.db, "--no-progress"};
    if (resume) args.push_back("--resume");
    return study::launch_process(args, log);
  };
  const bool same_seeds = std::all_of(s.points.begin(), s.points.end(), [](const auto& p) { return p.seeds.empty(); });
  if (same_seeds)
    std::fprintf(stderr, "sweep %s: %zu points x %zu seeds = %zu runs, store %s\n", s.name.c_str(), s.points.size(),
                 s.seeds.size(), all_runs, a.db.c_str());
  else
    std::fprintf(stderr, "sweep %s: %zu points, %zu runs (seeds per grid), store %s\n", s.name.c_str(),
                 s.points.size(), all_runs, a.db.c_str());
  if (copy)
    std::fprintf(stderr, "sweep %s: runs start from a copy of this program in %s (removed at the end)\n",
                 s.name.c_str(), copy->folder().c_str());
  if (copy)
    for (const long pid : other_sweeps(std::filesystem::temp_directory_path()))
      std::fprintf(stderr,
                   "sweep %s: warning: another sweep (process %ld) is running on this machine; both start runs on "
                   "the same cores, so each run is slower than alone and its wall time does not compare "
                   "(--cores shares out the cores)\n",
                   s.name.c_str(), pid);
  if (shard)
    std::fprintf(stderr, "sweep %s: shard %s holds %zu of the %zu runs\n", s.name.c_str(), to_string(*shard).c_str(),
                 s.runs.size(), all_runs);
  clear_stop_request();
  std::signal(SIGINT, on_sweep_sigint);
  const auto sum = study::run_sweep(s, store, opt);
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
  cmd->add_option("--cores", args->cores, "Cores the runs share (default: this machine's; a cluster task's allocation)")
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--emit", args->emit, "Print a job script instead of running: slurm (a job array, one shard per task)")
      ->check(CLI::IsMember({"slurm"}));
  cmd->add_option("--shards", args->shards, "With --emit: array tasks (default: one per run)")->check(CLI::Range(1, 100000));
  cmd->add_option("--cpus-per-task", args->cpus_per_task, "With --emit: cores per task (default --jobs)")
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--time", args->time, "With --emit: each task's time limit (Slurm's --time, e.g. 4:00:00)");
  cmd->add_flag("--dry-run", args->dry_run, "List what would run");
  cmd->add_flag("--no-progress", args->no_progress, "No progress bar");
  cmd->add_flag("--same-machine", args->same_machine,
                "Refuse to count or resume runs made on another processor (or recording none): every run of the "
                "report made here");
  cmd->callback([args] {
    const int rc = run_sweep_cmd(*args);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace fp8lab::cli
