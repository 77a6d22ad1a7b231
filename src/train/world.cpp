// The data-parallel world on c10d's TCP store and Gloo process group (world.hpp).
#define USE_C10D_GLOO 1
#include "fp8lab/train/world.hpp"
#include "fp8lab/nn/runtime.hpp"

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/torch.h>

#include <charconv>
#include <cstdlib>

#include "fp8lab/core/error.hpp"
#include "fp8lab/core/text.hpp"
#include "fp8lab/core/progress.hpp"

namespace fp8lab::train {

namespace {

std::int64_t parse_int(const std::string& name, const std::string& v, std::int64_t lo, std::int64_t hi) {
  const std::optional<std::int64_t> x = parse_integer(v);
  if (!x || *x < lo || *x > hi)
    throw Error(name + "=" + v + ": expected an integer from " + std::to_string(lo) + " to " + std::to_string(hi));
  return *x;
}

std::string timeout_text(std::chrono::milliseconds t) {
  return fixed(std::chrono::duration<double>(t).count(), 1) + " s";
}

}  // namespace

std::optional<WorldConfig> world_from_variables(
    const std::function<std::optional<std::string>(const std::string&)>& lookup, std::chrono::milliseconds timeout) {
  const char* names[] = {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"};
  std::vector<std::optional<std::string>> v;
  std::string set, unset;
  for (const char* n : names) {
    v.push_back(lookup(n));
    std::string& list = v.back() ? set : unset;
    list += (list.empty() ? "" : ", ") + std::string(n);
  }
  if (set.empty()) return std::nullopt;
  if (!unset.empty())
    throw Error("data-parallel launch: " + set + " set but " + unset +
                " not (a launcher sets all four: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)");
  WorldConfig c;
  c.size = static_cast<int>(parse_int("WORLD_SIZE", *v[1], 1, 1 << 16));
  c.rank = static_cast<int>(parse_int("RANK", *v[0], 0, c.size - 1));
  c.master_addr = *v[2];
  if (c.master_addr.empty()) throw Error("MASTER_ADDR is empty");
  c.master_port = static_cast<int>(parse_int("MASTER_PORT", *v[3], 1, 65535));
  c.timeout = timeout;
  return c;
}

struct World::Impl {
  c10::intrusive_ptr<c10d::TCPStore> store;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> group;
  struct Pending {
    c10::intrusive_ptr<c10d::Work> work;
    std::string what;
  };
  std::vector<Pending> pending;  // gathers started, not yet waited for
};

namespace {

// The network device Gloo's connections use: GLOO_SOCKET_IFNAME's interface when the
// launcher names one (as torch does), loopback for a run on one machine, else the address
// this machine's host name resolves to.
std::shared_ptr<::gloo::transport::Device> gloo_device(const WorldConfig& c) {
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname)
    return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
  if (c.master_addr == "127.0.0.1" || c.master_addr == "localhost")
    return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

}  // namespace

World::World(const WorldConfig& cfg) : cfg_(cfg), impl_(std::make_unique<Impl>()) {
  if (cfg.size < 1 || cfg.rank < 0 || cfg.rank >= cfg.size)
    throw Error("data-parallel world: rank " + std::to_string(cfg.rank) + " of " + std::to_string(cfg.size));
  const std::string where = cfg.master_addr + ":" + std::to_string(cfg.master_port);
  try {
    c10d::TCPStoreOptions o;
    o.port = static_cast<std::uint16_t>(cfg.master_port);
    o.isServer = cfg.rank == 0;
    o.numWorkers = static_cast<std::size_t>(cfg.size);
    o.waitWorkers = true;
    o.timeout = cfg.timeout;
    impl_->store = c10::make_intrusive<c10d::TCPStore>(cfg.master_addr, o);
    auto opts = c10d::ProcessGroupGloo::Options::create(cfg.timeout);
    opts->devices.push_back(gloo_device(cfg));
    opts->threads = 2;
    impl_->group = c10::make_intrusive<c10d::ProcessGroupGloo>(impl_->store, cfg.rank, cfg.size, opts);
  } catch (const std::exception& e) {
    throw Error("data-parallel rendezvous at " + where + " (rank " + std::to_string(cfg.rank) + " of " +
                std::to_string(cfg.size) + ", timeout " + timeout_text(cfg.timeout) +
                ") failed: " + nn::torch_error_text(e));
  }
}

World::~World() = default;

namespace {

// Waits for `work`; a failure or timeout becomes Error naming the collective.
void finish(c10d::Work& work, const WorldConfig& c, const std::string& what) {
  try {
    work.wait(c.timeout);
  } catch (const std::exception& e) {
    throw Error("data-parallel rank " + std::to_string(c.rank) + " of " + std::to_string(c.size) + ": " + what +
                " failed (another rank died or did not answer within " + timeout_text(c.timeout) + "): " +
                nn::torch_error_text(e));
  }
}

}  // namespace

torch::Tensor World::all_gather(const torch::Tensor& mine, const std::string& what, std::int64_t bucket_bytes) {
  const torch::Tensor flat = mine.contiguous().reshape({-1});
  std::vector<std::int64_t> shape = {cfg_.size};
  for (auto s : mine.sizes()) shape.push_back(s);
  torch::Tensor out = torch::empty(shape, mine.options());
  const torch::Tensor rows = out.reshape({cfg_.size, -1});
  const std::int64_t n = flat.numel();
  const std::int64_t per = std::max<std::int64_t>(1, bucket_bytes / std::max<std::int64_t>(1, flat.element_size()));
  for (std::int64_t b = 0; b < std::max<std::int64_t>(n, 1); b += per) {
    const std::int64_t e = std::min(n, b + per);
    std::vector<torch::Tensor> outs;
    for (int r = 0; r < cfg_.size; ++r) outs.push_back(rows[r].slice(0, b, e));
    start_gather(flat.slice(0, b, e), outs, what);
  }
  wait_gathers();
  return out;
}

void World::start_gather(const torch::Tensor& mine, const std::vector<torch::Tensor>& outs, const std::string& what) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::vector<at::Tensor>> o(1, outs);
  std::vector<at::Tensor> in{mine};
  // Gloo gathers into one flat buffer and copies each rank's part into the views given.
  impl_->pending.push_back({impl_->group->allgather(o, in), what});
  stats_.seconds += seconds_since(t0);
  stats_.bytes_sent += mine.numel() * mine.element_size() * (cfg_.size - 1);
  ++stats_.collectives;
}

void World::wait_gathers() {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<Impl::Pending> pending;
  pending.swap(impl_->pending);
  for (auto& p : pending) finish(*p.work, cfg_, p.what);
  stats_.seconds += seconds_since(t0);
}

std::string World::broadcast(const std::string& bytes, const std::string& what) {
  const auto t0 = std::chrono::steady_clock::now();
  torch::Tensor len = torch::tensor({static_cast<std::int64_t>(bytes.size())}, torch::kInt64);
  std::vector<at::Tensor> v{len};
  finish(*impl_->group->broadcast(v), cfg_, what + " (length)");
  const std::int64_t n = v[0].item<std::int64_t>();
  torch::Tensor data = cfg_.rank == 0 ? torch::from_blob(const_cast<char*>(bytes.data()), {n}, torch::kUInt8).clone()
                                      : torch::empty({n}, torch::kUInt8);
  if (n > 0) {
    std::vector<at::Tensor> d{data};
    finish(*impl_->group->broadcast(d), cfg_, what);
    data = d[0];
  }
  stats_.seconds += seconds_since(t0);
  if (cfg_.rank == 0) stats_.bytes_sent += n * (cfg_.size - 1);
  ++stats_.collectives;
  return std::string(reinterpret_cast<const char*>(data.data_ptr<std::uint8_t>()), static_cast<std::size_t>(n));
}

std::vector<std::int64_t> World::sum(const std::vector<std::int64_t>& mine, const std::string& what) {
  const torch::Tensor all = all_gather(torch::tensor(mine, torch::kInt64), what).sum(0);
  return std::vector<std::int64_t>(all.data_ptr<std::int64_t>(), all.data_ptr<std::int64_t>() + all.numel());
}

void World::require_same(std::uint64_t value, const std::string& what) {
  const torch::Tensor all = all_gather(torch::tensor({static_cast<std::int64_t>(value)}, torch::kInt64), what);
  for (int r = 1; r < cfg_.size; ++r)
    if (all[r].item<std::int64_t>() != all[0].item<std::int64_t>())
      throw Error("data-parallel run: rank " + std::to_string(r) + "'s " + what + " differs from rank 0's");
}

}  // namespace fp8lab::train
