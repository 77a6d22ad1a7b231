// The Slurm job-array script of `fp8lab sweep --emit slurm` (docs/experiments.md). What the
// user gives (folders, paths, names, the time limit) goes into it as data: checked for what
// would change the script's lines, and shell-quoted (docs/reliability.md).
#include <filesystem>
#include <regex>
#include <string>

#include "fp8lab/core/error.hpp"
#include "fp8lab/core/text.hpp"
#include "fp8lab/study/sweep.hpp"

namespace fp8lab::study {

namespace fs = std::filesystem;

namespace {

// Text that goes into a job script's lines: no control character (a newline would start a
// line of its own, which the shell runs, even after a '#').
void check_script_text(const std::string& what, const std::string& v) {
  for (std::size_t i = 0; i < v.size(); ++i) {
    const auto c = static_cast<unsigned char>(v[i]);
    if (c < 0x20 || c == 0x7f)
      throw Error(what + " '" + printable(v) + "': a control character (code " + std::to_string(c) +
                  ") cannot go into a job script");
  }
}

// A folder that goes into #SBATCH --output as it is: Slurm splits directives at white space,
// reads quotes and expands '%' patterns there.
void check_directive_path(const std::string& what, const std::string& v) {
  check_script_text(what, v);
  for (const char c : v)
    if (c == ' ' || c == '"' || c == '\'' || c == '%' || c == '\\')
      throw Error(what + " '" + v + "': Slurm's #SBATCH --output cannot hold '" + std::string(1, c) +
                  "'; choose a folder without spaces, quotes, '%' or '\\'");
}

// Slurm's --time: minutes, minutes:seconds, hours:minutes:seconds, days-hours,
// days-hours:minutes, days-hours:minutes:seconds, or UNLIMITED / INFINITE.
void check_slurm_time(const std::string& t) {
  static const std::regex form(R"(\d{1,9}(:\d{1,2}){0,2}|\d{1,9}-\d{1,2}(:\d{1,2}){0,2}|UNLIMITED|INFINITE)");
  if (!std::regex_match(t, form))
    throw Error("--time '" + printable(t) + "': not a Slurm time limit (MINUTES, MINUTES:SECONDS, HOURS:MINUTES:SECONDS, " +
                "DAYS-HOURS, DAYS-HOURS:MINUTES, DAYS-HOURS:MINUTES:SECONDS, UNLIMITED)");
}

}  // namespace

std::string slurm_script(const Sweep& s, const SlurmOptions& o) {
  if (o.shards < 1) throw Error("--shards must be >= 1");
  const std::string dir = fs::absolute(o.dir).lexically_normal().string();
  const std::string file = fs::absolute(o.sweep_file).lexically_normal().string();
  check_directive_path("--dir", dir);
  check_script_text("the sweep file", file);
  check_script_text("the fp8lab program's path", o.program);
  check_script_text("the sweep's name", s.name);
  if (!o.time.empty()) check_slurm_time(o.time);
  const std::string last = std::to_string(o.shards - 1), n = std::to_string(o.shards);
  std::string stores;
  for (int i = 0; i < o.shards && i < 4; ++i) stores += " --db " + shell_quote(dir + "/shard-" + std::to_string(i) + ".db");
  if (o.shards > 4) stores += " ... --db " + shell_quote(dir + "/shard-" + last + ".db");
  std::string t = "#!/bin/bash\n";
  t += "# fp8lab sweep " + s.name + " (" + std::to_string(s.runs.size()) + " runs) as a Slurm job array: array task i\n";
  t += "# runs shard i/" + n + " of the runs into its own results store. Submit as it is: sbatch THIS_FILE\n";
  t += "# (arguments after the file go to each task's fp8lab sweep). When every task has ended:\n";
  t += "#   fp8lab report " + shell_quote(file) + stores + "\n";
  t += "#SBATCH --job-name=" + s.name + "\n";
  t += "#SBATCH --array=0-" + last + "\n";
  t += "#SBATCH --ntasks=1\n";
  t += "#SBATCH --cpus-per-task=" + std::to_string(o.cpus_per_task) + "\n";
  if (!o.time.empty()) t += "#SBATCH --time=" + o.time + "\n";
  t += "#SBATCH --output=" + dir + "/slurm-%A_%a.out\n";
  t += "set -euo pipefail\n";
  t += ": \"${SLURM_ARRAY_TASK_ID:?run this script with sbatch (it is a job array)}\"\n";
  t += "mkdir -p " + shell_quote(dir) + "\n";
  t += "exec " + shell_quote(o.program) + " sweep " + shell_quote(file) + " --shard \"${SLURM_ARRAY_TASK_ID}/" + n +
       "\" --db " + shell_quote(dir) + "/shard-\"${SLURM_ARRAY_TASK_ID}\".db --dir " + shell_quote(dir + "/runs") +
       " --jobs " + std::to_string(o.jobs) + " --cores \"${SLURM_CPUS_PER_TASK:-" + std::to_string(o.cpus_per_task) +
       "}\" --no-progress \"$@\"\n";
  return t;
}

}  // namespace fp8lab::study
