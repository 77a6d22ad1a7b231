#include "fp8lab/results/store.hpp"

#include <signal.h>
#include <sqlite3.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <functional>
#include <ctime>
#include <nlohmann/json.hpp>
#include <sstream>
#include <tuple>

#include "fp8lab/core/enum_names.hpp"
#include "fp8lab/core/error.hpp"
#include "fp8lab/core/machine.hpp"
#include "fp8lab/core/text.hpp"

#include "fp8lab_code_version.hpp"  // generated at every build (cmake/code_version.cmake)

namespace fp8lab::results {

namespace {

constexpr EnumName<RunStatus> kStatusNames[] = {
    {RunStatus::running, "running"},   {RunStatus::finished, "finished"}, {RunStatus::diverged, "diverged"},
    {RunStatus::stopped, "stopped"},   {RunStatus::failed, "failed"},     {RunStatus::incomplete, "incomplete"},
};

}  // namespace

std::string_view to_string(RunStatus s) { return enum_name(kStatusNames, s); }

RunStatus parse_run_status(std::string_view text) { return enum_parse(kStatusNames, text, "run status"); }

bool has_outcome(RunStatus s) { return s == RunStatus::finished || s == RunStatus::diverged; }

namespace {

std::string hostname() {
  char buf[256] = {};
  ::gethostname(buf, sizeof buf - 1);
  return buf;
}

std::string now_utc() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// A prepared statement, finalized on scope exit.
class Stmt {
 public:
  Stmt(sqlite3* db, const std::string& path, const char* sql) : db_(db), path_(path) {
    if (sqlite3_prepare_v2(db, sql, -1, &s_, nullptr) != SQLITE_OK) fail("prepare");
  }
  ~Stmt() { sqlite3_finalize(s_); }
  Stmt& bind(int i, std::int64_t v) { return check(sqlite3_bind_int64(s_, i, v)); }
  Stmt& bind(int i, double v) { return check(sqlite3_bind_double(s_, i, v)); }
  Stmt& bind(int i, const std::string& v) {
    return check(sqlite3_bind_text(s_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT));
  }
  Stmt& bind_null(int i) { return check(sqlite3_bind_null(s_, i)); }
  bool step() {
    const int rc = sqlite3_step(s_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    fail("step");
  }
  void reset() {
    sqlite3_reset(s_);
    sqlite3_clear_bindings(s_);
  }
  std::int64_t i64(int c) const { return sqlite3_column_int64(s_, c); }
  double dbl(int c) const { return sqlite3_column_double(s_, c); }
  bool null(int c) const { return sqlite3_column_type(s_, c) == SQLITE_NULL; }
  std::string text(int c) const {
    const auto* p = sqlite3_column_text(s_, c);
    return p ? reinterpret_cast<const char*>(p) : "";
  }

 private:
  Stmt& check(int rc) {
    if (rc != SQLITE_OK) fail("bind");
    return *this;
  }
  [[noreturn]] void fail(const char* what) const {
    throw Error(path_ + ": results store " + what + " failed: " + sqlite3_errmsg(db_));
  }
  sqlite3* db_;
  std::string path_;
  sqlite3_stmt* s_ = nullptr;
};

const char* kSchema = R"(
CREATE TABLE IF NOT EXISTS runs (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  created TEXT NOT NULL, name TEXT NOT NULL, kind TEXT NOT NULL,
  config TEXT NOT NULL, recipe TEXT NOT NULL, loss_scale TEXT NOT NULL, seed INTEGER NOT NULL,
  code_version TEXT NOT NULL, status TEXT NOT NULL, final_metric REAL, metric_name TEXT,
  wall_seconds REAL NOT NULL DEFAULT 0, host TEXT NOT NULL, pid INTEGER NOT NULL,
  machine TEXT NOT NULL DEFAULT '');
CREATE TABLE IF NOT EXISTS metrics (
  run_id INTEGER NOT NULL REFERENCES runs(id), step INTEGER NOT NULL,
  name TEXT NOT NULL, value REAL NOT NULL);
CREATE INDEX IF NOT EXISTS metrics_run ON metrics(run_id, name, step);
CREATE TABLE IF NOT EXISTS loss_scale (
  run_id INTEGER NOT NULL REFERENCES runs(id), step INTEGER NOT NULL,
  log2_scale INTEGER NOT NULL, skipped INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS loss_scale_run ON loss_scale(run_id, step);
CREATE TABLE IF NOT EXISTS tensor_stats (
  run_id INTEGER NOT NULL REFERENCES runs(id), step INTEGER NOT NULL, layer TEXT NOT NULL,
  kind TEXT NOT NULL, total INTEGER NOT NULL, overflow INTEGER NOT NULL, underflow INTEGER NOT NULL,
  nan INTEGER NOT NULL, absmax REAL, histogram TEXT NOT NULL);  -- absmax NULL: NaN
CREATE INDEX IF NOT EXISTS tensor_stats_run ON tensor_stats(run_id, step);
)";

}  // namespace

std::string Store::code_version() { return FP8LAB_CODE_VERSION; }

namespace {
// The first rows of an integrity check, or "" when SQLite says "ok".
std::string integrity_problems(sqlite3* db, const std::string& path, const char* pragma) {
  std::string out;
  try {
    Stmt s(db, path, pragma);
    int n = 0;
    while (s.step()) {
      const std::string row = s.text(0);
      if (row == "ok") return "";
      if (n++ < 3) out += (out.empty() ? "" : "; ") + row;
    }
  } catch (const Error&) {
    out += (out.empty() ? "" : "; ") + std::string(sqlite3_errmsg(db));  // too damaged to check
  }
  return out;
}

// Whether `table` of the main database has `column`.
bool has_column(sqlite3* db, const std::string& path, const char* table, const char* column) {
  Stmt s(db, path, (std::string("PRAGMA table_info(") + table + ")").c_str());
  while (s.step())
    if (s.text(1) == column) return true;
  return false;
}

// What a failed SQLite call on the store means for the user, by its error code: a store
// that cannot be written (permissions, a full disk, another process's lock) is named as
// such, not as something that is not a store.
std::string access_problem(sqlite3* db, const std::string& path) {
  const int code = sqlite3_errcode(db) & 0xff;
  const std::string msg = sqlite3_errmsg(db);
  switch (code) {
    case SQLITE_READONLY:
    case SQLITE_PERM:
      return path + ": cannot write the results store (" + msg +
             "): check the permissions of the file and of its folder (SQLite also writes " + path + "-wal and " + path +
             "-shm beside it); nothing was changed";
    case SQLITE_FULL:
      return path + ": cannot write the results store: the disk is full; nothing was changed";
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      return path + ": the results store is locked by another process (" + msg + "); try again when it is done";
    case SQLITE_CANTOPEN:
    case SQLITE_IOERR:
      return path + ": cannot read or write the results store (" + msg + ")";
    case SQLITE_NOTADB:
      return path + ": not an fp8lab results store (not an SQLite database); nothing was changed";
    default:
      return "";
  }
}

std::string damaged(const std::string& path, const std::string& problems) {
  return path + ": the results store is damaged (" + problems +
         "); nothing was written. Restore it from a copy, or recover what is readable with `sqlite3 " + path +
         " .recover`";
}
}  // namespace

void Store::check_before_writing() {
  int version = 0, app = 0, tables = 0;
  bool has_runs = false;
  try {
    Stmt v(db_, path_, "PRAGMA user_version");
    if (v.step()) version = static_cast<int>(v.i64(0));
    Stmt a(db_, path_, "PRAGMA application_id");
    if (a.step()) app = static_cast<int>(a.i64(0));
    Stmt t(db_, path_, "SELECT name FROM sqlite_master WHERE type = 'table'");
    while (t.step()) ++tables, has_runs = has_runs || t.text(0) == "runs";
  } catch (const Error&) {
    if (sqlite3_errcode(db_) == SQLITE_CORRUPT) throw Error(damaged(path_, sqlite3_errmsg(db_)));
    if (const std::string why = access_problem(db_, path_); !why.empty()) throw Error(why);
    throw Error(path_ + ": not a results store (" + std::string(sqlite3_errmsg(db_)) + "); nothing was changed");
  }
  const bool ours = app == kApplicationId || (app == 0 && version >= 1 && has_runs);
  if (tables > 0 && !ours)
    throw Error(path_ + ": an SQLite database that is not an fp8lab results store; nothing was changed");
  if (version > kSchemaVersion)
    throw Error(path_ + ": results store has schema version " + std::to_string(version) +
                ", newer than this fp8lab's " + std::to_string(kSchemaVersion) + ": update fp8lab");
  if (tables == 0) return;
  const std::string problems = integrity_problems(db_, path_, "PRAGMA quick_check(3)");
  if (!problems.empty()) throw Error(damaged(path_, problems));
}

std::string Store::check() const { return integrity_problems(db_, path_, "PRAGMA integrity_check(20)"); }

Store::Store(const std::string& path) : path_(path) {
  if (sqlite3_open_v2(path.c_str(), &db_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr) != SQLITE_OK) {
    const std::string msg = db_ ? sqlite3_errmsg(db_) : "out of memory";
    sqlite3_close(db_);
    db_ = nullptr;
    throw Error(path + ": cannot open results store (" + msg + ")");
  }
  sqlite3_busy_timeout(db_, 30000);  // several training processes may write at once
  try {
    check_before_writing();
    exec("PRAGMA journal_mode=WAL");
    exec("PRAGMA synchronous=NORMAL");
    exec("BEGIN IMMEDIATE");
    exec(kSchema);
    // Version 2 stores gain the machine column; their runs' machine reads "" (not recorded).
    if (!has_column(db_, path_, "runs", "machine")) exec("ALTER TABLE runs ADD COLUMN machine TEXT NOT NULL DEFAULT ''");
    exec(("PRAGMA user_version=" + std::to_string(kSchemaVersion)).c_str());
    exec(("PRAGMA application_id=" + std::to_string(kApplicationId)).c_str());
    exec("COMMIT");
    mark_dead_runs();
  } catch (...) {
    sqlite3_close(db_);
    db_ = nullptr;
    throw;
  }
}

Store::~Store() { sqlite3_close(db_); }

void Store::exec(const char* sql) const {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    const std::string msg = err ? err : sqlite3_errmsg(db_);
    sqlite3_free(err);
    if (const std::string why = access_problem(db_, path_); !why.empty()) throw Error(why);
    throw Error(path_ + ": results store: " + msg);
  }
}

void Store::mark_dead_runs() {
  // A run still "running" whose process (on this host) is gone was killed.
  std::vector<std::int64_t> dead;
  {
    Stmt s(db_, path_, "SELECT id, pid FROM runs WHERE status = 'running' AND host = ?");
    s.bind(1, hostname());
    while (s.step()) {
      const auto pid = static_cast<pid_t>(s.i64(1));
      if (::kill(pid, 0) != 0 && errno == ESRCH) dead.push_back(s.i64(0));
    }
  }
  for (auto id : dead) {
    Stmt u(db_, path_, "UPDATE runs SET status = 'incomplete' WHERE id = ? AND status = 'running'");
    u.bind(1, id).step();
  }
}

std::int64_t Store::begin_run(const RunInfo& r) {
  Stmt s(db_, path_,
         "INSERT INTO runs (created, name, kind, config, recipe, loss_scale, seed, code_version, "
         "status, host, pid, machine) VALUES (?,?,?,?,?,?,?,?,'running',?,?,?)");
  s.bind(1, now_utc()).bind(2, r.name).bind(3, r.kind).bind(4, r.config_json).bind(5, r.recipe);
  s.bind(6, r.loss_scale).bind(7, static_cast<std::int64_t>(r.seed)).bind(8, code_version());
  s.bind(9, hostname()).bind(10, static_cast<std::int64_t>(::getpid())).bind(11, machine_description());
  s.step();
  return sqlite3_last_insert_rowid(db_);
}

void Store::log_metric(std::int64_t run, std::int64_t step, const std::string& name, double value) {
  Stmt s(db_, path_, "INSERT INTO metrics (run_id, step, name, value) VALUES (?,?,?,?)");
  s.bind(1, run).bind(2, step).bind(3, name).bind(4, value);
  s.step();
}

void Store::transaction(const std::function<void()>& body) {
  exec("BEGIN IMMEDIATE");  // takes the write lock now: waits (busy timeout) for other writers
  try {
    body();
    exec("COMMIT");
  } catch (...) {
    sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
    throw;
  }
}

void Store::absorb(const std::string& path, const std::vector<std::int64_t>& ids) {
  if (ids.empty()) return;
  {
    Stmt attach(db_, path_, "ATTACH DATABASE ? AS src");
    attach.bind(1, path);
    attach.step();
  }
  try {
    transaction([&] {
      exec("CREATE TEMP TABLE IF NOT EXISTS absorbed (old INTEGER PRIMARY KEY, new INTEGER NOT NULL)");
      exec("DELETE FROM absorbed");
      Stmt next(db_, path_, "SELECT COALESCE(MAX(id), 0) FROM main.runs");
      next.step();
      std::int64_t id = next.i64(0);
      Stmt map(db_, path_, "INSERT INTO absorbed (old, new) VALUES (?, ?)");
      for (const std::int64_t old : ids) {
        map.bind(1, old).bind(2, ++id);
        map.step();
        map.reset();
      }
      exec("INSERT INTO main.runs (id, created, name, kind, config, recipe, loss_scale, seed, code_version, status, "
           "final_metric, metric_name, wall_seconds, host, pid, machine) SELECT a.new, created, name, kind, config, "
           "recipe, loss_scale, seed, code_version, status, final_metric, metric_name, wall_seconds, host, pid, "
           "machine "
           "FROM src.runs r JOIN absorbed a ON r.id = a.old ORDER BY a.new");
      exec("INSERT INTO main.metrics (run_id, step, name, value) SELECT a.new, step, name, value "
           "FROM src.metrics m JOIN absorbed a ON m.run_id = a.old ORDER BY m.rowid");
      exec("INSERT INTO main.loss_scale (run_id, step, log2_scale, skipped) SELECT a.new, step, log2_scale, skipped "
           "FROM src.loss_scale l JOIN absorbed a ON l.run_id = a.old ORDER BY l.rowid");
      exec("INSERT INTO main.tensor_stats (run_id, step, layer, kind, total, overflow, underflow, nan, absmax, "
           "histogram) SELECT a.new, step, layer, kind, total, overflow, underflow, nan, absmax, histogram "
           "FROM src.tensor_stats t JOIN absorbed a ON t.run_id = a.old ORDER BY t.rowid");
    });
  } catch (...) {
    sqlite3_exec(db_, "DETACH DATABASE src", nullptr, nullptr, nullptr);
    throw;
  }
  exec("DETACH DATABASE src");
}

void Store::log_loss_scale(std::int64_t run, const std::vector<std::tuple<std::int64_t, int, bool>>& trace) {
  transaction([&] {
    Stmt s(db_, path_, "INSERT INTO loss_scale (run_id, step, log2_scale, skipped) VALUES (?,?,?,?)");
    for (const auto& [step, k, skipped] : trace) {
      s.bind(1, run).bind(2, step).bind(3, static_cast<std::int64_t>(k)).bind(4, static_cast<std::int64_t>(skipped));
      s.step();
      s.reset();
    }
  });
}

void Store::log_stats(std::int64_t run, const std::vector<StatRow>& rows) {
  if (rows.empty()) return;
  transaction([&] {
    Stmt s(db_, path_,
           "INSERT INTO tensor_stats (run_id, step, layer, kind, total, overflow, underflow, nan, absmax, "
           "histogram) VALUES (?,?,?,?,?,?,?,?,?,?)");
    for (const auto& r : rows) {
      s.bind(1, run).bind(2, r.step).bind(3, r.layer).bind(4, r.kind);
      s.bind(5, static_cast<std::int64_t>(r.total)).bind(6, static_cast<std::int64_t>(r.overflow));
      s.bind(7, static_cast<std::int64_t>(r.underflow)).bind(8, static_cast<std::int64_t>(r.nan));
      if (std::isnan(r.absmax)) s.bind_null(9);  // SQLite has no NaN
      else s.bind(9, r.absmax);
      s.bind(10, r.histogram);
      s.step();
      s.reset();
    }
  });
}

std::vector<Store::StatRow> Store::stats(std::int64_t run) const {
  Stmt s(db_, path_,
         "SELECT step, layer, kind, total, overflow, underflow, nan, absmax, histogram FROM tensor_stats "
         "WHERE run_id = ? ORDER BY rowid");
  s.bind(1, run);
  std::vector<StatRow> out;
  while (s.step()) {
    StatRow r;
    r.step = s.i64(0);
    r.layer = s.text(1);
    r.kind = s.text(2);
    r.total = static_cast<std::uint64_t>(s.i64(3));
    r.overflow = static_cast<std::uint64_t>(s.i64(4));
    r.underflow = static_cast<std::uint64_t>(s.i64(5));
    r.nan = static_cast<std::uint64_t>(s.i64(6));
    r.absmax = s.null(7) ? std::nan("") : s.dbl(7);
    r.histogram = s.text(8);
    out.push_back(std::move(r));
  }
  return out;
}

std::string machine_label(const std::string& machine) { return machine.empty() ? "not recorded" : machine; }

std::string machine_counts(const std::map<std::string, int>& runs_by_machine) {
  std::string o;
  for (const auto& [m, n] : runs_by_machine)
    o += (o.empty() ? "" : "; ") + machine_label(m) + ": " + std::to_string(n) + (n == 1 ? " run" : " runs");
  return o;
}

namespace {
// A run's machine after it resumes `here`: unchanged where it ran here last, else with
// "; resumed on <here>" added.
std::string machine_after_resume(const std::string& recorded, const std::string& here) {
  const std::string resumed = "; resumed on " + here;
  if (recorded == here) return recorded;
  if (recorded.empty()) return machine_label(recorded) + resumed;
  if (recorded.size() >= resumed.size() && recorded.compare(recorded.size() - resumed.size(), resumed.size(), resumed) == 0)
    return recorded;  // resumed here before
  return recorded + resumed;
}
}  // namespace

void Store::resume_run(std::int64_t run, std::int64_t from_step) {
  transaction([&] {
    std::string machine;
    {
      Stmt s(db_, path_, "SELECT status, machine FROM runs WHERE id = ?");
      s.bind(1, run);
      if (!s.step()) throw Error(path_ + ": no run " + std::to_string(run) + " to resume");
      const std::string st = s.text(0);
      if (has_outcome(parse_run_status(st)))
        throw Error(path_ + ": run " + std::to_string(run) + " has already ended (" + st + ")");
      machine = machine_after_resume(s.text(1), machine_description());
    }
    for (const char* sql : {"DELETE FROM metrics WHERE run_id = ? AND step > ?",
                            "DELETE FROM tensor_stats WHERE run_id = ? AND step >= ?",
                            "DELETE FROM loss_scale WHERE run_id = ? AND step >= ?"}) {
      Stmt d(db_, path_, sql);
      d.bind(1, run).bind(2, from_step).step();
    }
    Stmt u(db_, path_, "UPDATE runs SET status = 'running', host = ?, pid = ?, machine = ? WHERE id = ?");
    u.bind(1, hostname()).bind(2, static_cast<std::int64_t>(::getpid())).bind(3, machine).bind(4, run).step();
  });
}

void Store::finish_run(std::int64_t run, RunStatus status, std::optional<double> final_metric,
                       const std::string& metric_name, double wall_seconds) {
  Stmt s(db_, path_, "UPDATE runs SET status = ?, final_metric = ?, metric_name = ?, wall_seconds = ? WHERE id = ?");
  s.bind(1, std::string(to_string(status)));
  if (final_metric) s.bind(2, *final_metric);
  else s.bind_null(2);
  s.bind(3, metric_name).bind(4, wall_seconds).bind(5, run);
  s.step();
}

std::vector<RunRow> Store::runs(const RunFilter& f) const {
  Stmt s(db_, path_,
         "SELECT id, created, name, kind, recipe, loss_scale, status, code_version, config, seed, "
         "final_metric, metric_name, wall_seconds, machine FROM runs WHERE (?1 = '' OR status = ?1) AND "
         "(?2 = '' OR recipe = ?2) AND (?3 = '' OR name = ?3) ORDER BY id");
  s.bind(1, f.status ? std::string(to_string(*f.status)) : std::string()).bind(2, f.recipe).bind(3, f.name);
  std::vector<RunRow> out;
  while (s.step()) {
    RunRow r;
    r.id = s.i64(0);
    r.created = s.text(1);
    r.name = s.text(2);
    r.kind = s.text(3);
    r.recipe = s.text(4);
    r.loss_scale = s.text(5);
    try {
      r.status = parse_run_status(s.text(6));
    } catch (const Error& e) {
      throw Error(path_ + ": run " + std::to_string(r.id) + ": " + e.what());
    }
    r.code_version = s.text(7);
    r.config_json = s.text(8);
    r.seed = static_cast<std::uint64_t>(s.i64(9));
    if (!s.null(10)) r.final_metric = s.dbl(10);
    r.metric_name = s.text(11);
    r.wall_seconds = s.dbl(12);
    r.machine = s.text(13);
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<std::pair<std::int64_t, double>> Store::metric(std::int64_t run, const std::string& name) const {
  Stmt s(db_, path_, "SELECT step, value FROM metrics WHERE run_id = ? AND name = ? ORDER BY step");
  s.bind(1, run).bind(2, name);
  std::vector<std::pair<std::int64_t, double>> out;
  while (s.step()) out.emplace_back(s.i64(0), s.dbl(1));
  return out;
}

std::vector<std::tuple<std::int64_t, int, bool>> Store::loss_scale_trace(std::int64_t run) const {
  Stmt s(db_, path_, "SELECT step, log2_scale, skipped FROM loss_scale WHERE run_id = ? ORDER BY step");
  s.bind(1, run);
  std::vector<std::tuple<std::int64_t, int, bool>> out;
  while (s.step()) out.emplace_back(s.i64(0), static_cast<int>(s.i64(1)), s.i64(2) != 0);
  return out;
}

std::string to_csv(const std::vector<RunRow>& rows) {
  std::ostringstream o;
  o << "id,created,name,kind,recipe,loss_scale,seed,status,metric_name,final_metric,wall_seconds,code_version,"
       "machine\n";
  for (const auto& r : rows) {
    o << r.id << ',' << r.created << ',' << csv_field(r.name) << ',' << csv_field(r.kind) << ','
      << csv_field(r.recipe) << ',' << csv_field(r.loss_scale) << ',' << r.seed << ',' << to_string(r.status) << ','
      << csv_field(r.metric_name) << ',';
    if (r.final_metric) o << *r.final_metric;
    o << ',' << r.wall_seconds << ',' << csv_field(r.code_version) << ',' << csv_field(r.machine) << '\n';
  }
  return o.str();
}

std::string to_json(const std::vector<RunRow>& rows) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& r : rows) {
    nlohmann::json j = {{"id", r.id}, {"created", r.created}, {"name", r.name}, {"kind", r.kind},
                        {"recipe", r.recipe}, {"loss_scale", r.loss_scale}, {"seed", r.seed},
                        {"status", std::string(to_string(r.status))}, {"metric_name", r.metric_name},
                        {"wall_seconds", r.wall_seconds}, {"code_version", r.code_version},
                        {"machine", r.machine}};
    j["final_metric"] = r.final_metric ? nlohmann::json(*r.final_metric) : nlohmann::json(nullptr);
    const auto cfg = nlohmann::json::parse(r.config_json, nullptr, false);
    j["config"] = cfg.is_discarded() ? nlohmann::json(r.config_json) : cfg;
    a.push_back(std::move(j));
  }
  return a.dump(2) + "\n";
}

}  // namespace fp8lab::results
