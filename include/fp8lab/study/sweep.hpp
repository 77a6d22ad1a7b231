// Sweeps: a grid of training runs (points) times seeds, defined in one TOML file, recorded
// in the results store; `fp8lab sweep` runs what is missing, `fp8lab report` tabulates and
// plots what is there.
//
//   name = "fmnist-recipes"                 # every run is recorded under this name
//   base = "../configs/resnet8-fmnist.toml"  # relative to the sweep file
//   seeds = [1, 2, 3, 4, 5]                  # or a count: seeds = 5 (1..5)
//   baseline = "recipe=fp32"                 # the point the others are tested against
//   [set]                                    # config keys set in every run
//   "train.epochs" = 1
//   [[grid]]                                 # a grid: the product of its variables
//   recipe = ["fp32", "resnet32-mixed"]      # a variable: an array, a range table
//   bias = { from = 0, to = 40, step = 4 }   #   {from, to, step} (inclusive) or a scalar
//   "quant.recipe" = "{recipe}"              # a config key (dotted): a value or a template
//   [[plot]]                                 # figures for `fp8lab report`; see docs/experiments.md
//   type = "metric"  x = "bias"  series = "kind"
//
// Several [[grid]] tables are concatenated (a point is a combination of one grid's
// variables). A run's identity is its full config without the checkpoint path and thread
// count, so a sweep started again skips runs that finished (or diverged), resumes stopped
// or killed ones from their checkpoints, and starts the rest.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "fp8lab/settings/config.hpp"
#include "fp8lab/results/store.hpp"

namespace fp8lab::study {

struct SweepPoint {
  std::vector<std::pair<std::string, std::string>> vars;  // variable -> value text, grid order
  std::vector<std::string> sets;                          // "key=value" beyond the base and [set]
  std::vector<std::uint64_t> seeds;                       // its grid's `seeds`; empty: the sweep's
  std::string label() const;                              // "recipe=fp32, seed-independent"
  std::string var(const std::string& name) const;         // "" if the point has no such variable
};

struct SweepRun {
  int point = 0;
  std::uint64_t seed = 0;
  settings::TrainConfig cfg;
  std::string identity;  // canonical JSON of the config (see above)
  std::string key;       // 16 hex digits of its hash: names the config, log and checkpoint
};

// The kinds of [[plot]] a sweep file can ask for (docs/experiments.md, "Plot types").
enum class PlotType { metric, heatmap, loss_scale, histograms, fixed_point_snr, points, block_stats, curve };
std::string_view to_string(PlotType t);  // as a sweep file writes it: "loss-scale", ...
// Throws Error naming the text and listing the types.
PlotType parse_plot_type(std::string_view text);

struct PlotSpec {
  PlotType type = PlotType::metric;
  std::string title, x, y, series, file;  // file: output name without extension
  std::string metric;                        // curve: the logged metric drawn over training
  std::map<std::string, std::string> where;  // only points whose variables have these values
  std::vector<std::string> formats;          // histograms: ranges to draw; snr: unused
  std::vector<std::string> kinds;            // histograms (default all four), block-stats (a, w, gx): tensor kinds
  std::vector<std::string> layers;           // histograms: layer groups by glob (default first, middle, last)
};

struct Sweep {
  std::string name, source, base;  // source: the sweep file; base: the base config's path
  std::vector<std::uint64_t> seeds;
  std::vector<std::string> set;     // [set] as "key=value"
  std::vector<SweepPoint> points;
  std::vector<std::string> variables;  // every variable name, first-seen order
  int baseline = -1;                   // index into points, -1: none
  std::string metric;                  // "" : each run's final metric; else the last logged value of this one
  std::vector<std::string> also;       // further logged metrics, each in a table of its own
  std::string better;                  // higher, lower, "": lower_is_better(metric)
  std::vector<PlotSpec> plots;
  std::string page;  // the study page's Markdown template (study/page.hpp); "": none
  std::vector<SweepRun> runs;  // points x seeds, point-major
};

// Parses and expands a sweep; every run's config is built, completed and checked here by
// `check`, so a bad key or value is reported (with the grid and variable it came from)
// before anything runs. `check` is the training layer's complete_config
// (fp8lab/train/registry.hpp), or complete_settings where that layer is not linked
// (a build without libtorch, the fuzz target): both complete a config the same way, so a
// run's identity does not depend on which one read it.
using ConfigCheck = void (*)(settings::TrainConfig&);
Sweep parse_sweep(const std::string& toml_text, const std::string& source, const std::string& base_dir,
                  ConfigCheck check);
Sweep load_sweep(const std::string& path, ConfigCheck check);
// A metric whose name says loss or perplexity is better lower; any other higher.
bool lower_is_better(const std::string& metric);

// Where a run stands in a store: done (finished or diverged: skip), running (in another
// live process, e.g. a second sweep over the same store: skip), resumable (stopped or
// killed with a checkpoint on disk), or to start. `row` is the newest matching run.
struct RunState {
  enum Kind { todo, resume, running, done } kind = todo;
  std::optional<results::RunRow> row;
};
RunState run_state(const SweepRun& run, const std::vector<results::RunRow>& rows,
                   const std::string& checkpoint);
// The newest row of the store whose config is `run`'s (any status).
std::optional<results::RunRow> find_run(const SweepRun& run, const std::vector<results::RunRow>& rows);
std::string identity_of(const std::string& config_json);  // canonical form of a stored config

// One of `count` deterministic shares of a sweep's runs (`fp8lab sweep --shard I/N`), for
// running a sweep as N jobs on any scheduler: the runs ordered by key (the hash of their
// config) and seed, every N-th from position `index`. Shards never overlap, together hold
// every run, and differ in size by at most one, whatever order the sweep file lists its
// points in. Changing the grid may move runs between shards.
struct Shard {
  int index = 0, count = 1;
};
Shard parse_shard(std::string_view text);  // "I/N" with 0 <= I < N; throws Error naming the text
std::string to_string(const Shard& s);      // "I/N"
// Keeps only the runs of shard `s`.
void keep_shard(Sweep& sweep, const Shard& s);

// `fp8lab sweep FILE --emit slurm`: a Slurm job-array script that runs the sweep as
// `shards` array tasks, task i running `fp8lab sweep FILE --shard i/shards` into its own
// store <dir>/shard-<i>.db (SQLite on a shared folder, one writer each), with the runs'
// configs, logs and checkpoints under <dir>/runs. Arguments given to the script are passed
// on to each task's `fp8lab sweep` (e.g. --dry-run). Paths are made absolute.
struct SlurmOptions {
  std::string program;    // the fp8lab program the tasks run
  std::string sweep_file; // the sweep file
  std::string dir;        // stores, runs and Slurm's logs
  int shards = 1;
  int jobs = 1;           // runs at once in each task
  int cpus_per_task = 1;
  std::string time;       // --time of each task ("" : the cluster's default)
};
std::string slurm_script(const Sweep& s, const SlurmOptions& o);

struct SweepOptions {
  int jobs = 1;
  int cores = 0;         // cores the runs share (each run gets cores / jobs threads); 0: this machine's
  std::string dir;       // configs, logs and checkpoints: <dir>/<key>.{toml,log,ckpt}
  bool progress = true;
  bool dry_run = false;  // list what would run
  // Refuse (Error, before anything runs) when runs it would count as done or resume were made
  // on another processor or record none; otherwise it counts them with a warning.
  bool same_machine = false;
  // Runs one training run to completion (blocking) and returns its exit status. The CLI
  // spawns its own `train` command through launch_process; tests may train in-process.
  std::function<int(const SweepRun&, const std::string& config_path, bool resume,
                    const std::string& log_path)>
      launch;
};

struct SweepSummary {
  int total = 0, skipped = 0, started = 0, resumed = 0, finished = 0, diverged = 0, failed = 0;
  int busy = 0;          // running in another process: left alone
  bool stopped = false;  // a stop was requested: not every run was attempted
};

// Runs what is missing, `jobs` at a time, reporting each end on stderr.
SweepSummary run_sweep(const Sweep& s, results::Store& store, const SweepOptions& opt);

// Runs `args` (program first) to completion with its output appended to `log_path`, in
// its own process group (a Ctrl-C reaches the sweep, which passes exactly one SIGINT on, so
// each run stops with a checkpoint); returns its exit status (128 + signal if killed). The
// program starts with SIGINT held (blocked) and at its default action: it releases SIGINT
// once its handler is in place (the CLI's `train` does), and one sent meanwhile arrives
// then. The application builds the command line (the CLI: `fp8lab train CONFIG --db DB ...`).
int launch_process(const std::vector<std::string>& args, const std::string& log_path);
// Sends SIGINT to every process launch_process is waiting on (async-signal-safe).
void interrupt_launched();

}  // namespace fp8lab::study
