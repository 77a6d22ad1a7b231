// The results store: one SQLite database holding every run (its full config, recipe, seed,
// code version, status, metrics, loss-scale trace, wall time). Safe with several
// processes writing at once (WAL journal, busy timeout); a run whose process died is
// reported as incomplete.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

struct sqlite3;

namespace fp8lab::results {

inline constexpr int kSchemaVersion = 3;  // 2: tensor_stats table; 3: runs.machine
inline constexpr int kApplicationId = 0x38666c62;  // "8flb": SQLite's application_id of a store

// Where a run stands. `running` while its process trains; `incomplete` when that process
// died without saying (found when a store is opened); `stopped` when it ended on request
// with a checkpoint to resume from; `finished`, `diverged` (a NaN/Inf loss) and `failed`
// (an error) are final.
enum class RunStatus { running, finished, diverged, stopped, failed, incomplete };

std::string_view to_string(RunStatus s);
// Throws Error naming the text and listing the statuses.
RunStatus parse_run_status(std::string_view text);
// finished or diverged: the run's outcome is known and it cannot be resumed.
bool has_outcome(RunStatus s);

struct RunInfo {
  std::string name;         // e.g. "quickstart"
  std::string kind;         // e.g. "image-classification"
  std::string config_json;  // the full configuration
  std::string recipe;
  std::string loss_scale;
  std::uint64_t seed = 0;
};

struct RunRow {
  std::int64_t id = 0;
  std::string created, name, kind, recipe, loss_scale, code_version, config_json;
  // The processor it ran on (machine_description()); "<first>; resumed on <other>" for a run
  // resumed on another; "" for a run recorded before stores kept it (schema version 3), and
  // "not recorded; resumed on <other>" when such a run was resumed.
  std::string machine;
  RunStatus status = RunStatus::running;
  std::uint64_t seed = 0;
  std::optional<double> final_metric;
  std::string metric_name;
  double wall_seconds = 0;
};

// A run's machine as tables and warnings name it: "not recorded" where it is "".
std::string machine_label(const std::string& machine);
// Runs counted by the machine they record, as tables name them: "<label>: <n> run(s); ...".
std::string machine_counts(const std::map<std::string, int>& runs_by_machine);

struct RunFilter {
  std::optional<RunStatus> status;  // empty: any
  std::string recipe, name;         // empty: any
};

class Store {
 public:
  // Opens or creates the database. Before it changes anything it checks that the file is an
  // fp8lab store (an empty file or a new one becomes one), not of a newer schema, and
  // passes SQLite's quick integrity check; otherwise it throws Error naming the file and
  // the problem, the file untouched.
  explicit Store(const std::string& path);
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  std::int64_t begin_run(const RunInfo& info);  // status running
  void log_metric(std::int64_t run, std::int64_t step, const std::string& name, double value);
  // A trace of (step, log2 scale, skipped) points, written in one transaction.
  void log_loss_scale(std::int64_t run, const std::vector<std::tuple<std::int64_t, int, bool>>& trace);
  // Per-layer tensor statistics (the nn statistics hooks), written in one transaction.
  struct StatRow {
    std::int64_t step = 0;
    std::string layer, kind;
    std::uint64_t total = 0, overflow = 0, underflow = 0, nan = 0;
    double absmax = 0;
    // JSON {"lo": e_lo, "counts": [n(e_lo), n(e_lo + 1), ...], "zero": n, "inf": n, "nan": n}:
    // counts of values with floor(log2|x|) = e, then zeros, infinities and NaNs.
    std::string histogram;
  };
  void log_stats(std::int64_t run, const std::vector<StatRow>& rows);
  std::vector<StatRow> stats(std::int64_t run) const;
  // A stopped or killed run taken up again by this process (`fp8lab train --resume`): status
  // back to running, and metrics, statistics and trace points after `from_step` (written
  // after the checkpoint being resumed) dropped.
  void resume_run(std::int64_t run, std::int64_t from_step);
  void finish_run(std::int64_t run, RunStatus status, std::optional<double> final_metric,
                  const std::string& metric_name, double wall_seconds);

  // Copies the runs `ids` of the store at `path` (an fp8lab store: open it with Store first),
  // with their metrics, loss-scale traces and statistics, into this one under new ids, in
  // one transaction.
  void absorb(const std::string& path, const std::vector<std::int64_t>& ids);

  std::vector<RunRow> runs(const RunFilter& f = {}) const;
  std::vector<std::pair<std::int64_t, double>> metric(std::int64_t run, const std::string& name) const;
  std::vector<std::tuple<std::int64_t, int, bool>> loss_scale_trace(std::int64_t run) const;

  const std::string& path() const { return path_; }
  // SQLite's full integrity check: "" when the store is sound, else its first findings.
  std::string check() const;
  static std::string code_version();

 private:
  void exec(const char* sql) const;
  void transaction(const std::function<void()>& body);  // BEGIN IMMEDIATE .. COMMIT, ROLLBACK on throw
  void mark_dead_runs();
  void check_before_writing();
  std::string path_;
  sqlite3* db_ = nullptr;
};

// A stored config in canonical form, without what does not change a run's results' identity
// (threads, train.checkpoint): two runs with the same name, seed and identity are the same
// run. Text that is not a JSON object is its own identity.
std::string config_identity(const std::string& config_json);

std::string to_csv(const std::vector<RunRow>& rows);
std::string to_json(const std::vector<RunRow>& rows);

}  // namespace fp8lab::results
