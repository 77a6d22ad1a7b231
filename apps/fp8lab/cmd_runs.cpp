// fp8lab runs: list and filter the runs in the results store; export as CSV or JSON.
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include "commands.hpp"
#include "fp8lab/core/error.hpp"
#include "fp8lab/results/store.hpp"
#include "fp8lab/results/store_set.hpp"
#include "table.hpp"

namespace fp8lab::cli {

namespace {
struct RunsArgs {
  std::vector<std::string> db;
  results::RunFilter filter;
  std::string status;
  bool csv = false, json = false, check = false;
};

// "Processors: <machine>: <n> runs; ..." for the rows listed (runs made on different processors may
// differ in the last bits); "" for none.
std::string processors_line(const std::vector<results::RunRow>& rows) {
  std::map<std::string, int> count;
  for (const auto& r : rows) ++count[r.machine];
  return count.empty() ? "" : "Processors: " + results::machine_counts(count) + "\n";
}

void run_runs(const RunsArgs& a) {
  const std::vector<std::string> dbs = a.db.empty() ? std::vector<std::string>{"results.db"} : a.db;
  results::RunFilter filter = a.filter;
  if (!a.status.empty()) filter.status = results::parse_run_status(a.status);
  if (a.check) {
    for (const auto& db : dbs) {
      if (!std::filesystem::exists(db)) throw Error(db + ": no results store here (run a training first, or pass --db)");
      const results::Store store(db);
      const std::string problems = store.check();
      if (!problems.empty()) throw Error(db + ": integrity check failed: " + problems);
      std::printf("%s: ok\n", db.c_str());
    }
    return;
  }
  results::StoreSet stores(dbs);
  const results::Store& store = stores.store();
  const auto rows = store.runs(filter);
  if (a.json) {
    std::fputs(results::to_json(rows).c_str(), stdout);
    return;
  }
  if (a.csv) {
    std::fputs(results::to_csv(rows).c_str(), stdout);
    return;
  }
  // Several stores: each run named by its store and its id there.
  Table t({dbs.size() > 1 ? "run" : "id", "created", "name", "recipe", "loss_scale", "seed", "status", "metric", "value", "seconds"});
  for (const auto& r : rows)
    t.add({dbs.size() > 1 ? stores.origin(r.id) : std::to_string(r.id), r.created, r.name, r.recipe, r.loss_scale, std::to_string(r.seed), std::string(to_string(r.status)),
           r.metric_name, r.final_metric ? fmt_f(*r.final_metric, 2) : "-", fmt_f(r.wall_seconds, 1)});
  t.print(false);
  std::fputs(processors_line(rows).c_str(), stdout);
}
}  // namespace

void register_runs(CLI::App& app) {
  auto args = std::make_shared<RunsArgs>();
  auto* cmd = app.add_subcommand("runs", "List the runs in the results store");
  cmd->add_option("--db", args->db,
                  "Results store (default results.db); repeat to list several as one (CSV and JSON then number "
                  "the runs afresh; the table names each run's store and id)");
  cmd->add_option("--status", args->status,
                  "Only runs with this status (running, finished, diverged, stopped, failed, incomplete)");
  cmd->add_option("--recipe", args->filter.recipe, "Only runs with this recipe");
  cmd->add_option("--name", args->filter.name, "Only runs with this name (e.g. quickstart)");
  cmd->add_flag("--check", args->check, "Run SQLite's full integrity check on the store and say what is wrong");
  auto* csv = cmd->add_flag("--csv", args->csv, "Print CSV");
  cmd->add_flag("--json", args->json, "Print JSON (with each run's full config)")->excludes(csv);
  cmd->callback([args] { run_runs(*args); });
}

}  // namespace fp8lab::cli
