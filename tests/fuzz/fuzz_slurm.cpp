// The Slurm emitter (docs/reliability.md): for any folder, sweep file, program path, sweep
// name and time limit, slurm_script either refuses with fp8lab::Error or writes a script
// whose every line is one of the lines it writes (no line of the input's choosing), with
// the user's text inside shell quotes.
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "fp8lab/core/error.hpp"
#include "fp8lab/study/sweep.hpp"

namespace {
// The input cut at NUL bytes into (at most) five fields.
std::vector<std::string> fields(std::string_view in) {
  std::vector<std::string> f;
  std::size_t start = 0;
  while (f.size() < 4) {
    const std::size_t nul = in.find('\0', start);
    if (nul == std::string_view::npos) break;
    f.emplace_back(in.substr(start, nul - start));
    start = nul + 1;
  }
  f.emplace_back(in.substr(start));
  f.resize(5);
  return f;
}

bool known_line(const std::string& l) {
  for (const char* p : {"#!/bin/bash", "# fp8lab sweep ", "# runs shard i/", "# (arguments after the file",
                        "#   fp8lab report ", "#SBATCH --job-name=", "#SBATCH --array=0-", "#SBATCH --ntasks=1",
                        "#SBATCH --cpus-per-task=", "#SBATCH --time=", "#SBATCH --output=", "set -euo pipefail",
                        ": \"${SLURM_ARRAY_TASK_ID:?", "mkdir -p '", "exec '"})
    if (l.rfind(p, 0) == 0) return true;
  return false;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto f = fields(std::string_view(reinterpret_cast<const char*>(data), size));
  fp8lab::study::Sweep s;
  s.name = f[0];
  fp8lab::study::SlurmOptions o;
  o.dir = f[1].empty() ? "slurm" : "/" + f[1];  // absolute: the script never depends on this process's folder
  o.sweep_file = "/" + f[2];
  o.program = "/" + f[3];
  o.time = f[4];
  o.shards = 3;
  std::string script;
  try {
    script = fp8lab::study::slurm_script(s, o);
  } catch (const fp8lab::Error&) {
    return 0;
  }
  std::istringstream lines(script);
  int n = 0;
  for (std::string l; std::getline(lines, l); ++n)
    if (!known_line(l)) __builtin_trap();
  if (n < 12) __builtin_trap();
  return 0;
}
