// Several results stores read as one: `fp8lab report --db a.db --db b.db ...` and
// `fp8lab runs` over the stores a sharded sweep's jobs wrote (docs/experiments.md). The
// runs of every store are copied into one temporary store that the report reads; the
// stores themselves are only read.
//
// The same run (name, seed and config, config_identity) may be in more
// than one store, say when a shard was run twice. With the same outcome (status and final
// metric) it counts once; with different outcomes the stores conflict and StoreSet throws
// Error naming both stores, both run ids and both outcomes. An attempt without an outcome
// (failed, stopped, running) is left out where another store holds the run's outcome.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "fp8lab/results/store.hpp"

namespace fp8lab::results {

class StoreSet {
 public:
  // Throws Error when `paths` is empty, a path holds no store, or two stores conflict.
  explicit StoreSet(const std::vector<std::string>& paths);
  ~StoreSet();
  StoreSet(const StoreSet&) = delete;
  StoreSet& operator=(const StoreSet&) = delete;

  Store& store() { return *store_; }
  // Where run `id` of store() came from: "<path> run <id there>".
  const std::string& origin(std::int64_t id) const { return origins_.at(id); }

 private:
  std::string temp_;  // the combined store's file ("" : a single store, read in place)
  std::unique_ptr<Store> store_;
  std::map<std::int64_t, std::string> origins_;
};

}  // namespace fp8lab::results
