// fp8lab train [CONFIG.toml] [--set key=value ...] [--resume]: one training run from a config
// file (or from the built-in defaults when none is given), recorded in the results store,
// checkpointed, resumable. Ctrl-C stops at the next step with a checkpoint.
//
// Data-parallel (docs/training.md): `--nproc N` runs the run as N processes on this machine
// (ranks.hpp); a process started with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set (by
// torchrun, a Slurm script or --nproc) is one rank of a run and joins the others.
#include <pthread.h>
#include <signal.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "commands.hpp"
#include "fp8lab/core/machine.hpp"
#include "fp8lab/core/text.hpp"
#include "fp8lab/settings/config.hpp"
#include "fp8lab/train/trainer.hpp"
#include "fp8lab/train/world.hpp"
#include "ranks.hpp"
#include "table.hpp"

namespace fp8lab::cli {

namespace {
struct TrainArgs {
  std::string config;
  std::vector<std::string> set;
  bool resume = false, restart = false, print_config = false, no_progress = false;
  std::int64_t stop_after = 0;
  std::string db = "results.db";
  int nproc = 1;
  double timeout = 600;
  std::int64_t bucket_kb = 1024;
};

std::optional<std::string> env(const std::string& name) {
  const char* v = std::getenv(name.c_str());
  return v ? std::optional<std::string>(v) : std::nullopt;
}

// The arguments a rank of `--nproc` runs with: these, less --nproc, with the config's
// thread count set to the rank's share of the cores where the config leaves it to all cores.
std::vector<std::string> rank_arguments(const TrainArgs& a, const settings::TrainConfig& cfg) {
  std::vector<std::string> args = {"train"};
  if (!a.config.empty()) args.push_back(a.config);
  for (const auto& x : a.set) args.insert(args.end(), {"--set", x});
  if (cfg.threads == 0) {
    const int cores = core_count();
    args.insert(args.end(), {"--set", "threads=" + std::to_string(std::max(1, cores / a.nproc))});
  }
  if (a.resume) args.push_back("--resume");
  if (a.restart) args.push_back("--restart");
  if (a.stop_after > 0) args.insert(args.end(), {"--stop-after", std::to_string(a.stop_after)});
  if (a.no_progress) args.push_back("--no-progress");
  args.insert(args.end(), {"--db", a.db, "--timeout", std::to_string(a.timeout), "--bucket-kb",
                           std::to_string(a.bucket_kb)});
  return args;
}

extern "C" void on_sigint(int) {
  request_stop();
  std::signal(SIGINT, SIG_DFL);  // a second Ctrl-C ends the process at once
}

// Unblocks SIGINT in this thread: a sweep starts its runs with SIGINT held, so that one it
// passes on while the run is starting arrives here, once on_sigint is in place (the run
// then stops at its first step, with a checkpoint). Threads started before this keep it
// blocked, so that the signal comes to this one.
void release_sigint() {
  sigset_t sigint;
  sigemptyset(&sigint);
  sigaddset(&sigint, SIGINT);
  pthread_sigmask(SIG_UNBLOCK, &sigint, nullptr);
}

// Gloo writes to the other ranks with writev(), which raises SIGPIPE when a peer has died:
// left at its default, the signal would end this rank at once, before it reports the failed
// exchange and marks the run failed in the store. Ignored, the write fails with EPIPE and
// the exchange with an error that says so (docs/training.md, "Failures"). This is the program's own
// process state, set before Gloo starts its threads.
void ignore_sigpipe() { std::signal(SIGPIPE, SIG_IGN); }

// The exit status of a run: 0 finished, or stopped as --stop-after asked; 130 stopped by
// Ctrl-C; 1 diverged.
int exit_status(const TrainArgs& a, results::RunStatus s) {
  if (s == results::RunStatus::stopped) return a.stop_after > 0 ? 0 : 130;
  return s == results::RunStatus::finished ? 0 : 1;
}

int run_train(const TrainArgs& a) {
  const settings::TrainConfig cfg = a.config.empty() ? train::parse_train_config("", "(defaults)", a.set)
                                                        : train::load_train_config(a.config, a.set);
  if (a.print_config) {
    std::fputs(settings::to_toml(cfg).c_str(), stdout);
    return 0;
  }
  const auto timeout = std::chrono::milliseconds(static_cast<std::int64_t>(a.timeout * 1000));
  const std::optional<train::WorldConfig> wc = train::world_from_variables(env, timeout);
  if (a.nproc > 1) {
    if (wc) throw Error("--nproc starts its own processes, but this one is already rank " + std::to_string(wc->rank) +
                        " of a launched run (RANK is set): give --nproc or the launcher's variables, not both");
    train::check_process_count(cfg.train.micro_batches, a.nproc);
    return run_ranks(a.nproc, rank_arguments(a, cfg), a.timeout);
  }
  std::optional<train::World> world;
  if (wc && wc->size > 1) {
    ignore_sigpipe();
    world.emplace(*wc);
  }
  const bool writer = !world || world->rank() == 0;
  std::optional<results::Store> store;
  if (writer) store.emplace(a.db);
  train::TrainOptions opt;
  opt.resume = a.resume;
  opt.restart = a.restart;
  opt.stop_after = a.stop_after;
  opt.progress = !a.no_progress && writer;
  opt.world = world ? &*world : nullptr;
  opt.bucket_bytes = a.bucket_kb * 1024;
  clear_stop_request();
  std::signal(SIGINT, on_sigint);
  release_sigint();
  // on_sigint stays in place: a Ctrl-C that comes after the run has ended (a sweep passing
  // one on as the run finishes) does not cut off its summary; a second one ends the process.
  const train::TrainResult r = train::train(cfg, store ? &*store : nullptr, opt);
  if (!writer) return exit_status(a, r.status);  // rank 0 reports the run

  Table t({"run", "status", "model", "steps", r.metric_name, "train_loss", "loss_scale", "skipped",
           "overflow_pct", "underflow_pct", "samples_per_s", "seconds"});
  std::uint64_t ovf = 0, und = 0, tot = 0;
  for (const auto& c : r.counts) ovf += c.overflow, und += c.underflow, tot += c.total;
  t.add({std::to_string(r.run_id), std::string(results::to_string(r.status)), r.model_description,
         std::to_string(r.steps) + "/" + std::to_string(r.total_steps),
         r.status == results::RunStatus::finished ? fmt_f(r.final_metric, 2) : "-", fmt_f(r.final_train_loss, 4),
         "2^" + std::to_string(r.final_log2_scale), std::to_string(r.skipped_steps), pct(ovf, tot), pct(und, tot),
         fmt_f(r.samples_per_second, 1), fmt_f(r.seconds, 1)});
  t.print(false);
  const nn::Compute compute = settings::compute_of(cfg.quant);
  const nn::Accumulation accumulate = settings::accumulation_of(cfg.quant);
  if (r.products_bf16 > 0 || compute != nn::Compute::fp32 || !accumulate.plain())
    std::fprintf(stderr, "products (quant.compute = %s, quant.accumulate = %s): %lld on bfloat16, %lld on float32\n",
                 std::string(nn::to_string(compute)).c_str(), nn::to_string(accumulate).c_str(),
                 static_cast<long long>(r.products_bf16),
                 static_cast<long long>(r.products_fp32));
  if (r.status == results::RunStatus::stopped) {
    std::fprintf(stderr, "stopped at step %lld; checkpoint %s. Continue with: fp8lab train %s%s --resume\n",
                 static_cast<long long>(r.steps), r.checkpoint.c_str(), a.config.c_str(),
                 [&] {
                   std::string s;
                   for (const auto& x : a.set) s += " --set " + shell_quote(x);
                   return s;
                 }().c_str());
    return exit_status(a, r.status);
  }
  std::fprintf(stderr, "evaluation: %.1f s in all, %.1f s the final one\n", r.eval_seconds, r.final_eval_seconds);
  if (r.processes > 1)
    std::fprintf(stderr, "%d processes: %.1f ms and %.0f kB per step in collectives (this rank)\n", r.processes,
                 1e3 * r.comm_seconds_per_step, r.comm_bytes_per_step / 1e3);
  std::fprintf(stderr, "recorded as run %lld in %s; weights in %s (fnv1a64 %016llx)\n", static_cast<long long>(r.run_id),
               a.db.c_str(), r.checkpoint.c_str(), static_cast<unsigned long long>(r.weights_fnv));
  return exit_status(a, r.status);
}
}  // namespace

void register_train(CLI::App& app) {
  auto args = std::make_shared<TrainArgs>();
  auto* cmd = app.add_subcommand("train", "Train a model from a config file (see configs/)");
  cmd->add_option("config", args->config,
                  "Config file (TOML, starting with its schema line); none: the built-in defaults");
  cmd->add_option("--set", args->set, "Override a config key: --set optimizer.lr=0.05 (repeatable)");
  auto* resume = cmd->add_flag("--resume", args->resume, "Continue the run from its checkpoint");
  cmd->add_flag("--restart", args->restart, "Start afresh, discarding an unfinished run's checkpoint")->excludes(resume);
  cmd->add_option("--stop-after", args->stop_after, "Stop after N steps with a checkpoint (resume later)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1'000'000'000'000}));
  cmd->add_option("--db", args->db, "Results store (SQLite)")->capture_default_str();
  cmd->add_flag("--print-config", args->print_config, "Print the full config (all defaults filled in) and exit");
  cmd->add_flag("--no-progress", args->no_progress, "No progress bar");
  cmd->add_option("--nproc", args->nproc,
                  "Data-parallel: run as N processes on this machine (train.micro_batches a multiple of N)")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  cmd->add_option("--timeout", args->timeout,
                  "Data-parallel: seconds a process waits for the others at any exchange before it fails the run")
      ->check(finite_range(1.0, 86400.0))
      ->capture_default_str();
  cmd->add_option("--bucket-kb", args->bucket_kb,
                  "Data-parallel: gradients leave in buckets of about N KiB while the backward pass runs (one "
                  "micro-batch per process); 0: all after the backward pass")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 22))
      ->capture_default_str();
  cmd->callback([args] {
    const int rc = run_train(*args);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace fp8lab::cli
