#include "fp8lab/results/store_set.hpp"

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <map>

#include "fp8lab/core/error.hpp"

namespace fp8lab::results {

namespace fs = std::filesystem;


namespace {

std::string outcome(const RunRow& r) {
  std::string s(to_string(r.status));
  if (r.final_metric) s += " " + r.metric_name + " " + std::to_string(*r.final_metric);
  return s;
}

bool same_outcome(const RunRow& a, const RunRow& b) {
  return a.status == b.status && a.final_metric.has_value() == b.final_metric.has_value() &&
         (!a.final_metric || *a.final_metric == *b.final_metric) && a.metric_name == b.metric_name;
}

std::string key_of(const RunRow& r) { return r.name + '\n' + std::to_string(r.seed) + '\n' + config_identity(r.config_json); }

std::string temp_path() {
  static std::atomic<int> counter{0};
  return (fs::temp_directory_path() /
          ("fp8lab-stores-" + std::to_string(::getpid()) + "-" + std::to_string(counter++) + ".db"))
      .string();
}

}  // namespace

StoreSet::StoreSet(const std::vector<std::string>& paths) {
  if (paths.empty()) throw Error("no results store given (--db)");
  for (const auto& p : paths)
    if (!fs::exists(p)) throw Error(p + ": no results store here (run a training first, or pass --db)");
  if (paths.size() == 1) {
    store_ = std::make_unique<Store>(paths[0]);
    for (const auto& r : store_->runs()) origins_[r.id] = paths[0] + " run " + std::to_string(r.id);
    return;
  }
  // Every store's runs, and the outcome of each run identity in the first store that has one.
  // Within one store every run counts, as when the store is read alone.
  struct Keyed {
    RunRow row;
    std::string key;  // key_of(row)
  };
  std::vector<std::vector<Keyed>> rows;
  struct Seen {
    RunRow row;
    std::size_t store = 0;
  };
  std::map<std::string, Seen> outcomes;
  for (std::size_t i = 0; i < paths.size(); ++i) {
    const Store s(paths[i]);
    rows.emplace_back();
    for (RunRow& r : s.runs()) {
      std::string key = key_of(r);
      rows.back().push_back({std::move(r), std::move(key)});
    }
    for (const auto& [r, key] : rows.back()) {
      if (!has_outcome(r.status)) continue;
      const auto [it, fresh] = outcomes.try_emplace(key, Seen{r, i});
      if (!fresh && it->second.store != i && !same_outcome(it->second.row, r))
        throw Error("conflicting results: " + paths[it->second.store] + " run " + std::to_string(it->second.row.id) +
                    " and " + paths[i] + " run " + std::to_string(r.id) + " are the same run ('" + r.name +
                    "', seed " + std::to_string(r.seed) + ", the same config) with different outcomes (" +
                    outcome(it->second.row) + "; " + outcome(r) +
                    "); keep one of them, or report the stores separately");
    }
  }
  temp_ = temp_path();
  store_ = std::make_unique<Store>(temp_);
  std::int64_t next_id = 1;  // absorb numbers the runs of the new store from 1, in order
  for (std::size_t i = 0; i < paths.size(); ++i) {
    std::vector<std::int64_t> ids;
    for (const auto& [r, key] : rows[i]) {
      const auto it = outcomes.find(key);
      // A copy of a run another store already gave, or an attempt without outcome of one.
      if (it != outcomes.end() && it->second.store != i) continue;
      ids.push_back(r.id);
      origins_[next_id++] = paths[i] + " run " + std::to_string(r.id);
    }
    store_->absorb(fs::absolute(paths[i]).string(), ids);
  }
}

StoreSet::~StoreSet() {
  store_.reset();
  if (temp_.empty()) return;
  std::error_code ec;
  for (const char* suffix : {"", "-wal", "-shm", "-journal"}) fs::remove(temp_ + suffix, ec);
}

}  // namespace fp8lab::results
