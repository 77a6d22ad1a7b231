#include "fp8lab/core/machine.hpp"

#include <algorithm>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <sched.h>
#endif

#include "fp8lab/core/text.hpp"

namespace fp8lab {

int core_count() {
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
#endif
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

int threads_or_all_cores(int threads) { return threads > 0 ? threads : core_count(); }

namespace {

// The first value of each key in the first processor's entry (up to the first blank line).
struct CpuEntry {
  std::string model_name, family, model, flags;
};

CpuEntry first_entry(std::string_view text) {
  CpuEntry e;
  std::istringstream in{std::string(text)};
  std::string line;
  bool started = false;
  while (std::getline(in, line)) {
    const std::string_view l = trim(line);
    if (l.empty()) {
      if (started) break;
      continue;
    }
    started = true;
    const auto colon = l.find(':');
    if (colon == std::string_view::npos) continue;
    const std::string_view key = trim(l.substr(0, colon)), value = trim(l.substr(colon + 1));
    std::string* field = key == "model name" ? &e.model_name
                         : key == "cpu family" ? &e.family
                         : key == "model"      ? &e.model
                         : key == "flags"      ? &e.flags
                                               : nullptr;
    if (field && field->empty()) *field = std::string(value);
  }
  return e;
}

// `words` joined by `sep`.
std::string joined(const std::vector<std::string>& words, std::string_view sep) {
  std::string out;
  for (const auto& w : words) {
    if (!out.empty()) out.append(sep);
    out.append(w);
  }
  return out;
}
}  // namespace

std::string describe_cpuinfo(std::string_view cpuinfo) {
  const CpuEntry e = first_entry(cpuinfo);
  if (e.model_name.empty()) return "unknown CPU";
  std::istringstream flag_words(e.flags);
  const std::set<std::string> has{std::istream_iterator<std::string>(flag_words), {}};
  std::vector<std::string> ids, flags;
  if (!e.family.empty()) ids.push_back("family " + e.family);
  if (!e.model.empty()) ids.push_back("model " + e.model);
  for (const std::string_view f : kMachineFlags)
    if (has.count(std::string(f))) flags.emplace_back(f);
  std::vector<std::string> parts;
  if (!ids.empty()) parts.push_back(joined(ids, ", "));
  if (!flags.empty()) parts.push_back(joined(flags, " "));
  std::string out = e.model_name;
  if (!parts.empty()) out.append(" (").append(joined(parts, "; ")).append(")");
  return out;
}

const std::string& machine_description() {
  static const std::string description = [] {
    std::ifstream in("/proc/cpuinfo");
    if (!in) return std::string("unknown CPU");
    const std::string text{std::istreambuf_iterator<char>(in), {}};
    return describe_cpuinfo(text);
  }();
  return description;
}

}  // namespace fp8lab
