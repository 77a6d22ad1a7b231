#include "fp8lab/core/text.hpp"
#include "fp8lab/study/sweep.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>


#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>

#include "fp8lab/core/error.hpp"
#include "fp8lab/core/files.hpp"
#include "fp8lab/core/machine.hpp"
#include "fp8lab/core/progress.hpp"
#include "fp8lab/core/stop.hpp"

extern char** environ;

namespace fp8lab::study {

namespace fs = std::filesystem;

Sweep load_sweep(const std::string& path, ConfigCheck check) {
  return parse_sweep(read_file(path), path, fs::path(path).parent_path().string(), check);
}

std::optional<results::RunRow> find_run(const SweepRun& run, const std::vector<results::RunRow>& rows) {
  std::optional<results::RunRow> best;
  for (const auto& r : rows)
    if (r.seed == run.seed && identity_of(r.config_json) == run.identity && (!best || r.id > best->id)) best = r;
  return best;
}

RunState run_state(const SweepRun& run, const std::vector<results::RunRow>& rows,
                   const std::string& checkpoint) {
  RunState st;
  // One pass: the newest row of this config, and the newest finished or diverged one (which
  // counts even if a newer attempt failed).
  std::optional<results::RunRow> done;
  for (const auto& r : rows) {
    if (r.seed != run.seed || identity_of(r.config_json) != run.identity) continue;
    if (!st.row || r.id > st.row->id) st.row = r;
    if (results::has_outcome(r.status) && (!done || r.id > done->id)) done = r;
  }
  if (done) {
    st.row = done;
    st.kind = RunState::done;
    return st;
  }
  // The store marks a running row whose process has died as incomplete when it is opened.
  using results::RunStatus;
  if (st.row && st.row->status == RunStatus::running) st.kind = RunState::running;
  else if (st.row && (st.row->status == RunStatus::stopped || st.row->status == RunStatus::incomplete) &&
           fs::exists(checkpoint))
    st.kind = RunState::resume;
  return st;
}

// --- shards ----------------------------------------------------------------------------

Shard parse_shard(std::string_view text) {
  const auto bad = [&](const std::string& why) {
    return Error("--shard '" + std::string(text) + "': " + why + " (expected I/N with 0 <= I < N, e.g. 0/4)");
  };
  const std::size_t slash = text.find('/');
  if (slash == std::string_view::npos) throw bad("no '/'");
  const auto number = [&](std::string_view part, const char* what) {
    const std::optional<std::int64_t> v = parse_integer(part);
    if (!v || *v < std::numeric_limits<int>::min() || *v > std::numeric_limits<int>::max())
      throw bad(std::string(what) + " '" + std::string(part) + "' is not a whole number");
    return static_cast<int>(*v);
  };
  Shard s{number(text.substr(0, slash), "I"), number(text.substr(slash + 1), "N")};
  if (s.count < 1) throw bad("N must be at least 1");
  if (s.index < 0 || s.index >= s.count) throw bad("I must be in 0.." + std::to_string(s.count - 1));
  return s;
}

std::string to_string(const Shard& s) { return std::to_string(s.index) + "/" + std::to_string(s.count); }

void keep_shard(Sweep& sweep, const Shard& s) {
  std::vector<std::size_t> order(sweep.runs.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const SweepRun &x = sweep.runs[a], &y = sweep.runs[b];
    return std::tie(x.key, x.seed) < std::tie(y.key, y.seed);
  });
  std::vector<bool> keep(sweep.runs.size(), false);
  for (std::size_t pos = static_cast<std::size_t>(s.index); pos < order.size(); pos += static_cast<std::size_t>(s.count))
    keep[order[pos]] = true;
  std::vector<SweepRun> runs;
  for (std::size_t i = 0; i < sweep.runs.size(); ++i)
    if (keep[i]) runs.push_back(std::move(sweep.runs[i]));
  sweep.runs = std::move(runs);
}

// --- running ---------------------------------------------------------------------------

namespace {
std::mutex g_pids_m;
constexpr int kMaxPids = 256;
std::atomic<pid_t> g_pids[kMaxPids];
}  // namespace

void interrupt_launched() {
  for (auto& p : g_pids) {
    const pid_t pid = p.load();
    if (pid > 0) ::kill(pid, SIGINT);
  }
}

int launch_process(const std::vector<std::string>& args, const std::string& log_path) {
  if (args.empty()) throw Error("launch_process: no program");
  std::vector<std::string> copy = args;
  std::vector<char*> argv;
  for (auto& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setpgroup(&attr, 0);  // own group: the terminal's Ctrl-C goes to the sweep only
  // SIGINT starts held and at its default action (not ignored, even where the sweep itself
  // started with it ignored, as a background job does): one that the sweep passes on while
  // the run is still starting waits until the run has its handler and releases it, rather
  // than ending the run before it can stop with a checkpoint, or being lost.
  sigset_t sigint;
  sigemptyset(&sigint);
  sigaddset(&sigint, SIGINT);
  posix_spawnattr_setsigmask(&attr, &sigint);
  posix_spawnattr_setsigdefault(&attr, &sigint);
  const short flags = POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF;
  posix_spawnattr_setflags(&attr, flags);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, copy[0].c_str(), &fa, &attr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) throw Error("cannot start " + copy[0] + ": " + std::strerror(rc));
  int slot = -1;
  for (int i = 0; i < kMaxPids && slot < 0; ++i) {
    pid_t expected = 0;
    if (g_pids[i].compare_exchange_strong(expected, pid)) slot = i;
  }
  if (slot >= 0 && stop_requested()) ::kill(pid, SIGINT);  // asked to stop while starting
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (slot >= 0) g_pids[slot].store(0);
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

namespace {

// One run the sweep starts or resumes, with its files <dir>/<key>.{toml,log,ckpt}.
struct Job {
  const SweepRun* run;
  bool resume;
  std::string config, log, ckpt;
};

// "<machine>: <n>; ..." for runs counted by processor, and their total.
std::pair<std::string, int> count_list(const std::map<std::string, int>& by_machine) {
  int n = 0;
  std::string list;
  for (const auto& [m, k] : by_machine) {
    n += k;
    list += (list.empty() ? "" : "; ") + results::machine_label(m) + ": " + std::to_string(k);
  }
  return {list, n};
}

// Runs made on other processors than this one are not bit-comparable with runs made here:
// say so for the stored runs the sweep counts as done (by processor); plan_jobs says it for
// each it resumes.
void warn_other_machines(const Sweep& s, const std::map<std::string, int>& done_elsewhere) {
  if (done_elsewhere.empty()) return;
  const auto [list, n] = count_list(done_elsewhere);
  std::fprintf(stderr,
               "sweep %s: warning: %d of the runs it counts as done were made on another processor or do not record "
               "theirs (%s); runs made here, on %s, may differ from them in the last bits (the report's table names "
               "the processors)\n",
               s.name.c_str(), n, list.c_str(), machine_description().c_str());
}

// With same_machine: refuses a sweep whose store holds runs it would count as done or resume
// that were made elsewhere (or record no processor), before anything runs.
void refuse_other_machines(const Sweep& s, const std::map<std::string, int>& elsewhere) {
  if (elsewhere.empty()) return;
  const auto [list, n] = count_list(elsewhere);
  throw Error("sweep " + s.name + ": --same-machine: " + std::to_string(n) +
              " of the runs it would count as done or resume were made on another processor or do not record theirs (" +
              list + "), and this is " + machine_description() +
              "; give the sweep a store of its own (--db), or drop --same-machine to count them with a warning");
}

// The runs still to do; those done, or running in another process, are counted in `sum`.
std::vector<Job> plan_jobs(const Sweep& s, const std::vector<results::RunRow>& rows, const std::string& dir,
                           bool same_machine, SweepSummary& sum) {
  std::vector<Job> jobs;
  // Runs made elsewhere that it counts as done, and with same_machine those it would resume.
  std::map<std::string, int> elsewhere;
  for (const auto& r : s.runs) {
    const std::string base = (fs::path(dir) / r.key).string();
    const RunState st = run_state(r, rows, base + ".ckpt");
    if (st.kind == RunState::done) {
      ++sum.skipped;
      if (st.row->machine != machine_description()) ++elsewhere[st.row->machine];
      continue;
    }
    if (st.kind == RunState::running) {
      ++sum.busy;
      std::fprintf(stderr, "%s seed %llu: running in another process (run %lld); left alone\n",
                   s.points[static_cast<std::size_t>(r.point)].label().c_str(),
                   static_cast<unsigned long long>(r.seed), static_cast<long long>(st.row->id));
      continue;
    }
    if (st.kind == RunState::resume && st.row->machine != machine_description()) {
      if (same_machine)
        ++elsewhere[st.row->machine];
      else
        std::fprintf(stderr, "%s seed %llu: warning: started on %s, resumes here on %s\n",
                     s.points[static_cast<std::size_t>(r.point)].label().c_str(),
                     static_cast<unsigned long long>(r.seed),
                     st.row->machine.empty() ? "a processor it does not record" : st.row->machine.c_str(),
                     machine_description().c_str());
    }
    jobs.push_back({&r, st.kind == RunState::resume, base + ".toml", base + ".log", base + ".ckpt"});
  }
  if (same_machine)
    refuse_other_machines(s, elsewhere);
  else
    warn_other_machines(s, elsewhere);
  return jobs;
}

void print_plan(const Sweep& s, const std::vector<Job>& jobs, const SweepSummary& sum) {
  for (const auto& j : jobs)
    std::fprintf(stderr, "%s %s seed %llu  (%s)\n", j.resume ? "resume" : "start ",
                 s.points[j.run->point].label().c_str(), static_cast<unsigned long long>(j.run->seed),
                 j.config.c_str());
  std::fprintf(stderr, "%d runs: %d done, %zu to run\n", sum.total, sum.skipped, jobs.size());
}

// The run's config file, written atomically (a config half-written by a killed sweep is
// never read). A resumed run keeps the config it started with: its thread count may differ
// from this sweep's, and only the same count resumes bit for bit. A fresh start removes a
// stale checkpoint of a failed attempt. Returns the thread count the run will use.
int write_run_config(const Sweep& s, const Job& j, int threads) {
  if (!j.resume) {
    std::error_code ec;
    fs::remove(j.ckpt, ec);
  }
  if (j.resume && fs::exists(j.config)) {
    try {
      const int kept = settings::read_train_config(read_file(j.config), j.config, {}, true).threads;
      return threads_or_all_cores(kept);
    } catch (const std::exception&) {
      return threads;  // the run itself says what is wrong with it
    }
  }
  settings::TrainConfig cfg = j.run->cfg;
  cfg.threads = threads;
  cfg.train.checkpoint = j.ckpt;
  write_file_atomic(j.config, "# " + s.name + ": " + s.points[static_cast<std::size_t>(j.run->point)].label() +
                                  ", seed " + std::to_string(j.run->seed) + " (written by fp8lab sweep " + s.source +
                                  ")\n" + to_toml(cfg));
  return threads;
}

// Runs the jobs on `opt.jobs` threads, each launching one run at a time.
class SweepRunner {
 public:
  SweepRunner(const Sweep& s, results::Store& store, const SweepOptions& opt, std::vector<Job>& jobs,
              SweepSummary& sum)
      : s_(s), store_(store), opt_(opt), jobs_(jobs), sum_(sum) {
    const int cores = threads_or_all_cores(opt.cores);
    threads_ = std::max(1, cores / std::max(1, opt.jobs));
    if (opt.progress && !jobs.empty())
      bar_ = std::make_unique<Progress>("sweep " + s.name, static_cast<std::int64_t>(jobs.size()), "runs");
  }

  void run() {
    const int workers = std::max(1, std::min<int>(opt_.jobs, static_cast<int>(jobs_.size())));
    std::vector<std::thread> pool;
    for (int i = 1; i < workers; ++i) pool.emplace_back([this] { work(); });
    work();
    for (auto& t : pool) t.join();
    if (bar_) bar_->finish();
  }

 private:
  Job* next_job() {
    std::lock_guard<std::mutex> lk(m_);
    if (next_ >= jobs_.size() || stop_requested()) return nullptr;
    Job* j = &jobs_[next_++];
    j->resume ? ++sum_.resumed : ++sum_.started;
    return j;
  }

  void work() {
    while (Job* j = next_job()) {
      const int threads = write_run_config(s_, *j, threads_);
      if (threads > threads_) warn_threads(*j, threads);
      const auto t0 = std::chrono::steady_clock::now();
      const int rc = launch(*j);
      report(*j, rc, seconds_since(t0));
    }
  }

  // What a line to stderr starts with: a carriage return and erase-line where the progress
  // bar is on a terminal, so that the line replaces the bar (which redraws below it).
  const char* clear_bar() const { return bar_ && isatty(2) ? "\r\033[K" : ""; }

  // A resumed run that keeps more threads than this sweep gives a run shares the cores with
  // the other runs: slower, and its wall time does not compare.
  void warn_threads(const Job& j, int threads) {
    std::lock_guard<std::mutex> lk(m_);
    std::fprintf(stderr,
                 "%ssweep %s: warning: %s seed %llu resumes with the %d threads it started with (%s), more than the %d "
                 "a run gets here: the runs oversubscribe the cores until it ends\n",
                 clear_bar(), s_.name.c_str(), s_.points[j.run->point].label().c_str(),
                 static_cast<unsigned long long>(j.run->seed), threads, j.config.c_str(), threads_);
  }

  int launch(const Job& j) {
    try {
      return opt_.launch(*j.run, j.config, j.resume, j.log);
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lk(m_);
      std::fprintf(stderr, "%ssweep %s: %s\n", clear_bar(), s_.name.c_str(), e.what());
      return 3;
    }
  }

  // The outcome as the store has it (the run wrote it); the exit status only says how the
  // process ended.
  void report(const Job& j, int rc, double seconds) {
    using results::RunStatus;
    std::lock_guard<std::mutex> lk(m_);
    ++ended_;
    const auto row = find_run(*j.run, store_.runs({.name = s_.name}));
    const RunStatus status = row ? row->status : RunStatus::failed;
    // The process this sweep started has ended, yet the newest row of its config is still
    // running: another sweep on the same store started the same run first, and this one's
    // was refused by the checkpoint's lock. Not a failure of either (a process killed by a
    // signal while it ran is one, and its row stays running until the store is reopened).
    if (status == RunStatus::running && rc != 0 && rc < 128) {
      ++sum_.busy;
      std::fprintf(stderr, "%s[%d/%zu] %s seed %llu: running in another process (run %lld); left alone\n", clear_bar(),
                   ended_, jobs_.size(), s_.points[j.run->point].label().c_str(),
                   static_cast<unsigned long long>(j.run->seed), static_cast<long long>(row->id));
      if (bar_) bar_->update(ended_);
      return;
    }
    if (status == RunStatus::finished) ++sum_.finished;
    else if (status == RunStatus::diverged) ++sum_.diverged;
    else if (status != RunStatus::stopped) ++sum_.failed;
    const std::string metric = row && row->final_metric ? " " + row->metric_name + " " + fixed(*row->final_metric, 2) : "";
    const std::string exit = rc != 0 && status != RunStatus::stopped ? ", exit " + std::to_string(rc) + ", see " + j.log : "";
    char line[512];
    std::snprintf(line, sizeof line, "[%d/%zu] %s seed %llu: %s%s (%.0f s%s)", ended_, jobs_.size(),
                  s_.points[j.run->point].label().c_str(), static_cast<unsigned long long>(j.run->seed),
                  std::string(to_string(status)).c_str(), metric.c_str(), seconds, exit.c_str());
    std::fprintf(stderr, "%s%s\n", clear_bar(), line);
    if (bar_) bar_->update(ended_);
  }

  const Sweep& s_;
  results::Store& store_;
  const SweepOptions& opt_;
  std::vector<Job>& jobs_;
  SweepSummary& sum_;
  int threads_ = 1;
  std::mutex m_;
  std::size_t next_ = 0;
  int ended_ = 0;
  std::unique_ptr<Progress> bar_;
};

}  // namespace

SweepSummary run_sweep(const Sweep& s, results::Store& store, const SweepOptions& opt) {
  if (!opt.launch && !opt.dry_run) throw Error("run_sweep: no launcher");
  const std::string dir = opt.dir.empty() ? "runs/" + s.name : opt.dir;
  SweepSummary sum;
  sum.total = static_cast<int>(s.runs.size());
  std::vector<Job> jobs = plan_jobs(s, store.runs({.name = s.name}), dir, opt.same_machine, sum);
  if (opt.dry_run) {  // changes nothing on disk
    print_plan(s, jobs, sum);
    return sum;
  }
  make_folder(dir);
  SweepRunner(s, store, opt, jobs, sum).run();
  sum.stopped = stop_requested();
  return sum;
}

}  // namespace fp8lab::study
