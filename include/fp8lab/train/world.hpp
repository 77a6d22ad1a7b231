// The processes of one data-parallel run (docs/training.md): torch's distributed engine
// (c10d) with its Gloo backend, which moves tensors between CPU processes over TCP, on one
// machine or many. Rank 0 hosts the rendezvous (c10d's TCP store) at MASTER_ADDR:MASTER_PORT.
//
// Every collective here is deterministic: all_gather hands every rank every rank's tensor,
// in rank order, so a reduction the caller then performs in a fixed order gives the same
// bits on every rank and for every process count (Gloo's own all-reduce sums in an order
// that depends on the number of processes). A collective that fails (a rank died: its
// connections close) or does not complete within the timeout (a rank hangs) throws Error
// naming the collective and the timeout; it never waits forever.
//
// The world is set up by the application (the CLI reads the conventional variables RANK,
// WORLD_SIZE, MASTER_ADDR, MASTER_PORT); the library never reads the environment itself.
#pragma once

#include <torch/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace fp8lab::train {

struct WorldConfig {
  int rank = 0, size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::chrono::milliseconds timeout{std::chrono::minutes(10)};  // each collective, and the rendezvous
};

// The world the conventional variables describe: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
// given as `lookup(name)` (nullopt: not set). None of them set: nullopt (one process). Some
// set but not all, or a value out of range: Error naming the variable and its value.
std::optional<WorldConfig> world_from_variables(
    const std::function<std::optional<std::string>(const std::string&)>& lookup, std::chrono::milliseconds timeout);

// What the collectives of this process cost: time spent in them and bytes this process
// contributed (what it sends to each other rank counted once per recipient).
struct CommStats {
  double seconds = 0;
  std::int64_t bytes_sent = 0;
  std::int64_t collectives = 0;
};

class World {
 public:
  // Joins the run's process group: every rank blocks until all `size` have arrived (or the
  // timeout passes: Error naming the address and the ranks that did not come).
  explicit World(const WorldConfig& cfg);
  ~World();
  World(const World&) = delete;
  World& operator=(const World&) = delete;

  int rank() const { return cfg_.rank; }
  int size() const { return cfg_.size; }
  const WorldConfig& config() const { return cfg_; }

  // Every rank's `mine` (same shape and dtype on every rank, contiguous), stacked in rank
  // order: [size, mine.sizes()...]. Long tensors travel in buckets of `bucket_bytes`, all
  // in flight at once. `what` names the exchange in errors.
  torch::Tensor all_gather(const torch::Tensor& mine, const std::string& what,
                           std::int64_t bucket_bytes = std::int64_t{4} << 20);
  // The same in pieces, overlapping the caller's work: start_gather sends this rank's
  // contiguous `mine` and receives every rank's into outs[r] (each the size of mine; views
  // into a larger tensor are fine); wait_gathers finishes every gather started, in order.
  void start_gather(const torch::Tensor& mine, const std::vector<torch::Tensor>& outs, const std::string& what);
  void wait_gathers();

  // Rank 0's `bytes` on every rank.
  std::string broadcast(const std::string& bytes, const std::string& what);
  // Elementwise sums of integers over ranks (exact, so the order does not matter).
  std::vector<std::int64_t> sum(const std::vector<std::int64_t>& mine, const std::string& what);
  // Throws Error on every rank when any rank's `value` differs from rank 0's, naming `what`
  // and the first rank that differs.
  void require_same(std::uint64_t value, const std::string& what);

  const CommStats& stats() const { return stats_; }

 private:
  struct Impl;
  WorldConfig cfg_;
  std::unique_ptr<Impl> impl_;
  CommStats stats_;
};

}  // namespace fp8lab::train
