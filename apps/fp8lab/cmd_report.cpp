// fp8lab report SWEEP.toml [--out DIR]: the sweep's table (mean +- sd per point, one-sided
// Mann-Whitney U against the baseline, asterisks) printed and written as Markdown and CSV,
// and its plots as SVG and PNG. fp8lab report --name NAME: the same table over every run of
// that name, grouped by recipe and loss scaling (runs trained from Python, say). Several
// --db read as one (results/store_set.hpp).
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "build.hpp"
#include "commands.hpp"
#include "fp8lab/core/files.hpp"
#include "fp8lab/core/error.hpp"
#include "fp8lab/study/report.hpp"
#include "fp8lab/results/store_set.hpp"

namespace fp8lab::cli {

namespace {
struct ReportArgs {
  std::string sweep, name, out;
  std::vector<std::string> db;
};

void run_report(const ReportArgs& a) {
  if (a.sweep.empty() == a.name.empty()) throw Error("report: give a sweep file or --name NAME (one of them)");
  results::StoreSet stores(a.db.empty() ? std::vector<std::string>{"results.db"} : a.db);
  const results::Store& store = stores.store();
  study::Sweep s;
  study::SweepReport rep;
  if (a.name.empty()) {
    s = study::load_sweep(a.sweep, kConfigCheck);
    rep = study::analyse(s, store);
  } else {
    rep = study::analyse_named(store, a.name, s);
  }
  // The default folder is named after the sweep or the runs: a name that is no plain file
  // name (a run's name from Python may be "../x") needs an --out of the user's choosing.
  if (a.out.empty()) check_file_name(s.name, "run name (for the default folder reports/<name>; or give --out)");
  const std::string out = a.out.empty() ? "reports/" + s.name : a.out;
  const auto files = study::write_report(s, rep, store, out);
  std::fputs(study::to_markdown(s, rep).c_str(), stdout);
  if (rep.machines.size() > 1)
    std::fprintf(stderr, "report %s: warning: its runs were not all made on one recorded processor (the table's last "
                 "line names them); results from different processors are not bit-comparable\n", s.name.c_str());
  for (const auto& f : files) std::fprintf(stderr, "wrote %s\n", f.c_str());
}
}  // namespace

void register_report(CLI::App& app) {
  auto args = std::make_shared<ReportArgs>();
  auto* cmd = app.add_subcommand("report", "Tables (Markdown, CSV) and plots (SVG, PNG) of a sweep's results");
  cmd->add_option("sweep", args->sweep, "Sweep file (TOML)");
  cmd->add_option("--name", args->name, "Instead of a sweep: every run of this name, by recipe and loss scaling");
  cmd->add_option("--db", args->db,
                  "Results store (SQLite; default results.db). Repeat to read several as one (a sharded sweep's "
                  "stores); the same run with different results in two stores is an error");
  cmd->add_option("--out", args->out, "Output folder (default reports/<sweep name>)");
  cmd->callback([args] { run_report(*args); });
}

}  // namespace fp8lab::cli
