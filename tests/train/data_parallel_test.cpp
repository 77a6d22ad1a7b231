// Data-parallel training (docs/training.md): N processes give the run one process gives,
// bit for bit. The test program starts copies of itself as the ranks (FP8LAB_TEST_RANK_OF
// names the case; RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT the world, as any launcher
// sets them), each a plain call of train::train with a World; rank 0 writes the store
// and checkpoint, every rank writes what train() returned to a file the test reads.
#include <gtest/gtest.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../../src/train/micro_batches.hpp"
#include "../common/testutil.hpp"
#include "configs.hpp"
#include "fp8lab/train/trainer.hpp"
#include "fp8lab/train/world.hpp"
#include "fp8lab/results/store.hpp"

using namespace fp8lab;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The trainer tests' busy config (every source of randomness and state; Backoff skips steps
// in it) for 2 epochs of 8 batches, the last of 8 examples, as 2 micro-batches.
settings::TrainConfig busy(const std::string& name, const fs::path& dir, const std::string& model) {
  settings::TrainConfig c = test::busy_config(name, dir);
  c.model.name = model;
  if (model.rfind("efficientnet", 0) == 0) {  // dropout and stochastic depth: unused parameters
    c.model.width = 0;
    c.model.width_mult = 0.25;
    c.model.depth_mult = 0.3;
    c.model.dropout = 0.3;
  }
  c.data.synthetic_train = 120;
  c.train.epochs = 2;
  c.train.micro_batches = 2;
  return c;
}

// What a test case hands its ranks: the config, and what to do.
struct Case {
  settings::TrainConfig cfg;
  std::int64_t stop_after = 0;
  bool resume = false;
  std::uint64_t rank1_seed = 0;  // > 0: rank 1's config has this seed instead
  std::int64_t bucket_bytes = 4096;  // many buckets even for these small models
};

json to_json(const train::TrainResult& r) {
  json counts = json::array();
  for (const auto& c : r.counts) counts.push_back({c.total, c.overflow, c.underflow, c.nan});
  return {{"status", std::string(results::to_string(r.status))},
          {"metric", r.final_metric},
          {"evals", r.evals},
          {"loss", r.final_train_loss},
          {"log2_scale", r.final_log2_scale},
          {"skipped", r.skipped_steps},
          {"steps", r.steps},
          {"counts", counts},
          {"weights", r.weights_fnv},
          {"processes", r.processes},
          {"comm_bytes", r.comm_bytes_per_step},
          {"gradient_bytes", r.comm_gradient_bytes_per_step}};
}

// --- a model whose shards use different parameters ---------------------------------------------

// Layer b is used by shard 0 only: on 2 processes rank 1's backward never reaches it, so
// its gradients' buckets are complete there only after the backward pass. Layer d is used
// by no shard.
struct Branchy : torch::nn::Module {
  Branchy() {
    a = register_module("a", torch::nn::Linear(8, 8));
    b = register_module("b", torch::nn::Linear(8, 8));
    c = register_module("c", torch::nn::Linear(8, 2));
    d = register_module("d", torch::nn::Linear(8, 2));  // used by no shard
  }
  torch::Tensor forward(const torch::Tensor& x, bool use_b) {
    torch::Tensor h = torch::relu(a->forward(x));
    if (use_b) h = h + b->forward(h);
    return c->forward(h);
  }
  torch::nn::Linear a{nullptr}, b{nullptr}, c{nullptr}, d{nullptr};
};

// One step of Branchy on 6 examples as 2 shards, buckets of `bucket_bytes`: every
// parameter's gradient after the exchange, its float32 bits as integers ("none": undefined).
json branchy_step(train::World* world, std::int64_t bucket_bytes) {
  torch::manual_seed(7);
  Branchy net;
  const torch::Tensor x = torch::randn({6, 8});
  train::MicroBatches mb(net, 2, world, std::nullopt, bucket_bytes);
  mb.begin_step();
  for (int m = mb.first(); m < mb.first() + mb.count(); ++m) {
    mb.before(m);
    const auto [begin, end] = train::micro_range(6, 2, m);
    const torch::Tensor loss = net.forward(x.slice(0, begin, end), m == 0).pow(2).mean();
    loss.backward();
    mb.after(m, loss.item<double>(), end - begin, false);
  }
  mb.reduce();
  json out = json::array();
  for (const auto& p : net.parameters()) {
    if (!p.grad().defined()) {
      out.push_back("none");
      continue;
    }
    const torch::Tensor g = p.grad().contiguous();
    std::vector<std::uint32_t> bits(static_cast<std::size_t>(g.numel()));
    std::memcpy(bits.data(), g.data_ptr<float>(), bits.size() * 4);
    out.push_back(bits);
  }
  return out;
}

// --- the rank side ---------------------------------------------------------------------------

int run_rank(const std::string& case_file) {
  std::ifstream in(case_file);
  const json j = json::parse(in);
  settings::TrainConfig cfg =
      j.contains("config") ? train::parse_train_config(j.at("config").get<std::string>(), case_file)
                           : settings::TrainConfig{};
  const auto wc = train::world_from_variables(
      [](const std::string& n) {
        const char* v = std::getenv(n.c_str());
        return v ? std::optional<std::string>(v) : std::nullopt;
      },
      std::chrono::seconds(60));
  train::World world(*wc);
  if (j.contains("branchy")) {
    const json g = branchy_step(&world, j.at("branchy").get<std::int64_t>());
    std::ofstream(case_file + ".rank" + std::to_string(world.rank())) << json{{"grads", g}}.dump();
    return 0;
  }
  if (world.rank() == 1 && j.at("rank1_seed").get<std::uint64_t>() > 0) cfg.seed = j.at("rank1_seed").get<std::uint64_t>();
  std::optional<results::Store> store;
  if (world.rank() == 0) store.emplace(j.at("db").get<std::string>());
  train::TrainOptions o;
  o.progress = false;
  o.world = &world;
  o.stop_after = j.at("stop_after").get<std::int64_t>();
  o.resume = j.at("resume").get<bool>();
  o.bucket_bytes = j.at("bucket_bytes").get<std::int64_t>();
  json out;
  try {
    out = to_json(train::train(cfg, store ? &*store : nullptr, o));
  } catch (const std::exception& e) {
    out = {{"error", e.what()}};
  }
  std::ofstream(case_file + ".rank" + std::to_string(world.rank())) << out.dump();
  return 0;
}

// --- the test side ---------------------------------------------------------------------------

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// Runs the case file `file` as `n` ranks (copies of this program) and returns what each wrote.
std::vector<json> run_case(const fs::path& file, int n) {
  const int port = free_port();
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    // Everything the child needs is made before fork (the process has threads).
    std::vector<std::string> vars = {"FP8LAB_TEST_RANK_OF=" + file.string(), "RANK=" + std::to_string(r),
                                     "WORLD_SIZE=" + std::to_string(n), "MASTER_ADDR=127.0.0.1",
                                     "MASTER_PORT=" + std::to_string(port)};
    std::vector<char*> envp;
    for (auto& v : vars) envp.push_back(v.data());
    for (char** e = environ; *e; ++e) envp.push_back(*e);
    envp.push_back(nullptr);
    char self[] = "/proc/self/exe";
    char* argv[] = {self, nullptr};
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::execve(self, argv, envp.data());
      ::_exit(127);
    }
    pids.push_back(pid);
  }
  std::vector<json> out;
  for (int r = 0; r < n; ++r) {
    int st = 0;
    ::waitpid(pids[static_cast<std::size_t>(r)], &st, 0);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "rank " << r;
    std::ifstream in(file.string() + ".rank" + std::to_string(r));
    out.push_back(in ? json::parse(in) : json{{"error", "no result"}});
  }
  return out;
}

// Runs `c` as `n` ranks and returns what each rank's train() gave.
std::vector<json> run_ranks(const Case& c, int n, const fs::path& db) {
  const fs::path file = fs::path(c.cfg.train.checkpoint).parent_path() / (c.cfg.name + ".case");
  std::ofstream(file) << json{{"config", settings::to_toml(c.cfg)}, {"db", db.string()},
                              {"stop_after", c.stop_after}, {"resume", c.resume}, {"rank1_seed", c.rank1_seed},
                              {"bucket_bytes", c.bucket_bytes}}
                             .dump();
  return run_case(file, n);
}

json train_here(const Case& c, results::Store& store) {
  train::TrainOptions o;
  o.progress = false;
  o.stop_after = c.stop_after;
  o.resume = c.resume;
  return to_json(train::train(c.cfg, &store, o));
}

// The store of run `b` holds what the store of run `a` does: metrics, loss-scale trace,
// statistics.
void expect_same_record(results::Store& sa, results::Store& sb) {
  ASSERT_EQ(sa.runs().size(), 1u);
  ASSERT_EQ(sb.runs().size(), 1u);
  const auto a = sa.runs()[0].id, b = sb.runs()[0].id;
  EXPECT_EQ(sb.runs()[0].status, sa.runs()[0].status);
  EXPECT_EQ(sa.metric(a, "test_accuracy"), sb.metric(b, "test_accuracy"));
  EXPECT_EQ(sa.metric(a, "train_loss"), sb.metric(b, "train_loss"));
  EXPECT_FALSE(sa.metric(a, "train_loss").empty());
  EXPECT_EQ(sa.loss_scale_trace(a), sb.loss_scale_trace(b));
  const auto st1 = sa.stats(a), st2 = sb.stats(b);
  ASSERT_EQ(st1.size(), st2.size());
  ASSERT_FALSE(st1.empty());
  for (std::size_t i = 0; i < st1.size(); ++i) {
    EXPECT_EQ(st1[i].step, st2[i].step);
    EXPECT_EQ(st1[i].layer, st2[i].layer);
    EXPECT_EQ(st1[i].histogram, st2[i].histogram);
  }
}

// The results that must agree bit for bit (all but timing and process figures).
json outcome(json r) {
  r.erase("processes");
  r.erase("comm_bytes");
  r.erase("gradient_bytes");
  return r;
}

// Runs the case on one process and on two, checks they agree, and returns rank 0's result
// in `out`.
void check_processes_equal_one(const std::string& model, int micro, const std::string& comm = "fp32",
                               json* out = nullptr) {
  const fs::path d = test::temp_dir("fp8lab_dp");
  std::string tag = model + "_" + std::to_string(micro) + "_" + comm;
  for (char& ch : tag)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  Case one{busy("one_" + tag, d, model)}, two{busy("two_" + tag, d, model)};
  one.cfg.train.micro_batches = two.cfg.train.micro_batches = micro;
  one.cfg.quant.grad_comm = two.cfg.quant.grad_comm = settings::grad_comm_setting(comm);
  two.cfg.name = one.cfg.name;  // the same config but for the checkpoint path
  // Fresh stores: a case may run twice in one process (GradientsIn8Bits repeats the first).
  fs::remove(d / ("one_" + tag + ".db"));
  results::Store s1((d / ("one_" + tag + ".db")).string());
  const json here = train_here(one, s1);
  ASSERT_EQ(here.value("status", ""), "finished") << here.dump();
  fs::remove(d / ("two_" + tag + ".db"));
  const std::vector<json> ranks = run_ranks(two, 2, d / ("two_" + tag + ".db"));
  ASSERT_EQ(ranks.size(), 2u);
  for (const json& r : ranks) ASSERT_FALSE(r.contains("error")) << r.dump();
  EXPECT_EQ(outcome(ranks[0]), outcome(here)) << "rank 0 against one process";
  EXPECT_EQ(ranks[1].at("weights"), here.at("weights")) << "rank 1's weights";
  EXPECT_EQ(ranks[0].at("processes"), 2);
  EXPECT_GT(ranks[0].at("comm_bytes").get<double>(), 0);
  EXPECT_GT(here.at("skipped").get<int>(), 0) << "Backoff should skip steps in this config";
  results::Store s2((d / ("two_" + tag + ".db")).string());
  expect_same_record(s1, s2);
  if (out) *out = ranks[0];
}

}  // namespace

TEST(MicroBatches, ShardsCoverTheBatchInOrderAndBalance) {
  for (std::int64_t n : {1, 7, 8, 16, 17, 128})
    for (int micro : {1, 2, 3, 4, 8}) {
      std::int64_t next = 0;
      for (int m = 0; m < micro; ++m) {
        const auto [b, e] = train::micro_range(n, micro, m);
        EXPECT_EQ(b, next);
        EXPECT_GE(e - b, n / micro);
        EXPECT_LE(e - b, n / micro + 1);
        next = e;
      }
      EXPECT_EQ(next, n);
    }
  EXPECT_EQ(train::micro_seed(42, 0), 42u);  // shard 0 draws the whole batch's streams
  EXPECT_NE(train::micro_seed(42, 1), train::micro_seed(42, 2));
}

TEST(World, VariablesAllOrNone) {
  auto from = [](std::map<std::string, std::string> m) {
    return train::world_from_variables(
        [&](const std::string& n) { return m.count(n) ? std::optional<std::string>(m[n]) : std::nullopt; },
        std::chrono::seconds(1));
  };
  EXPECT_FALSE(from({}).has_value());
  const auto w = from({{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "node7"}, {"MASTER_PORT", "29500"}});
  ASSERT_TRUE(w.has_value());
  EXPECT_EQ(w->rank, 1);
  EXPECT_EQ(w->size, 4);
  EXPECT_EQ(w->master_addr, "node7");
  EXPECT_EQ(w->master_port, 29500);
  EXPECT_NE(test::error_of([&] { from({{"RANK", "0"}, {"WORLD_SIZE", "2"}}); }).find("MASTER_ADDR, MASTER_PORT not"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] {
              from({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "a"}, {"MASTER_PORT", "1"}});
            }).find("RANK=2"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] {
              from({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "a"}, {"MASTER_PORT", "70000"}});
            }).find("MASTER_PORT=70000"),
            std::string::npos);
}

// Item 2 of the data-parallel issue: a fixed global batch on 2 processes gives the losses,
// weights, counts, trace and statistics of 1 process, with quantization, stochastic
// rounding and Backoff on.
TEST(DataParallel, TwoProcessesGiveTheRunOfOne) { check_processes_equal_one("resnet8", 2); }
TEST(DataParallel, TwoShardsPerProcessGiveTheRunOfOne) { check_processes_equal_one("resnet8", 4); }
TEST(DataParallel, DropoutAndStochasticDepthGiveTheRunOfOne) { check_processes_equal_one("efficientnet-b0", 2); }

// A parameter one shard does not use: its gradient is the other shard's alone and defined,
// a parameter no shard uses keeps none, and the buckets leave in the same order on every
// process although rank 1's backward completes them in another (one bucket per tensor here).
TEST(DataParallel, ShardsThatUseDifferentParametersGiveTheStepOfOne) {
  const json one = branchy_step(nullptr, 16);
  const fs::path file = test::temp_dir("fp8lab_dp") / "branchy.case";
  std::ofstream(file) << json{{"branchy", 16}}.dump();
  const std::vector<json> ranks = run_case(file, 2);
  ASSERT_EQ(ranks.size(), 2u);
  for (const json& r : ranks) {
    ASSERT_TRUE(r.contains("grads")) << r.dump();
    EXPECT_EQ(r.at("grads"), one);
  }
  ASSERT_EQ(one.size(), 8u);
  for (std::size_t i = 0; i < 6; ++i) EXPECT_NE(one[i], "none") << i;
  EXPECT_EQ(one[6], "none");
  EXPECT_EQ(one[7], "none");
}

// Item 3: gradients travel in 8 bits (each shard's quantized, decoded, summed in float32):
// still the run of one process, a different run from float32 travel, and a quarter of the
// gradient bytes (plus scales) on the wire.
TEST(DataParallel, GradientsIn8BitsGiveTheRunOfOne) {
  json fp32, mx, fixed;
  check_processes_equal_one("resnet8", 2, "fp32", &fp32);
  check_processes_equal_one("resnet8", 2, "mxfp8_e5m2/stochastic", &mx);
  check_processes_equal_one("resnet8", 2, "1.5.2:20", &fixed);
  ASSERT_FALSE(fp32.is_null() || mx.is_null() || fixed.is_null());
  EXPECT_NE(mx.at("weights"), fp32.at("weights"));
  EXPECT_NE(fixed.at("weights"), fp32.at("weights"));
  const double f = fp32.at("gradient_bytes").get<double>(), m = mx.at("gradient_bytes").get<double>(),
               x = fixed.at("gradient_bytes").get<double>();
  EXPECT_EQ(x, 0.25 * f) << "1.5.2: one byte per gradient value against four";
  EXPECT_GT(m, x) << "mxfp8: one byte per value and a one-byte scale per 32 values";
  // A partial block per parameter tensor at most, and each tensor's float32 tensor scale.
  EXPECT_LT(m, 0.25 * f * (1 + 1.0 / 32) + 5 * 64);
}

// A run stopped on 2 processes resumes on 1 (and the other way round) and ends where the
// uninterrupted run ends.
TEST(DataParallel, ResumesOnAnotherProcessCount) {
  const fs::path d = test::temp_dir("fp8lab_dp");
  Case full{busy("full", d, "resnet8")};
  results::Store s1((d / "full.db").string());
  const json whole = train_here(full, s1);
  Case part{busy("part", d, "resnet8")};
  part.cfg.name = "full";
  part.stop_after = 7;
  fs::remove(d / "part.db");
  auto ranks = run_ranks(part, 2, d / "part.db");
  ASSERT_EQ(ranks[0].value("status", ""), "stopped") << ranks[0].dump();
  EXPECT_EQ(ranks[0].at("steps"), 7);
  {
    results::Store s2((d / "part.db").string());
    Case rest = part;
    rest.resume = true;
    rest.stop_after = 4;
    const json mid = train_here(rest, s2);  // steps 7..11 on one process
    ASSERT_EQ(mid.value("status", ""), "stopped") << mid.dump();
  }
  Case last = part;
  last.resume = true;
  last.stop_after = 0;
  ranks = run_ranks(last, 2, d / "part.db");  // and the rest on two
  ASSERT_EQ(ranks[0].value("status", ""), "finished") << ranks[0].dump();
  EXPECT_EQ(outcome(ranks[0]), outcome(whole));
  results::Store s2((d / "part.db").string());
  expect_same_record(s1, s2);
}

// What one rank refuses, every rank refuses: rank 0's checkpoint checks and a config that
// differs between ranks end every rank with the reason, before any step.
TEST(DataParallel, RanksAgreeBeforeTheFirstStep) {
  const fs::path d = test::temp_dir("fp8lab_dp");
  Case c{busy("agree", d, "resnet8")};
  c.stop_after = 3;
  fs::remove(d / "agree.db");
  auto ranks = run_ranks(c, 2, d / "agree.db");
  ASSERT_EQ(ranks[0].value("status", ""), "stopped") << ranks[0].dump();
  c.stop_after = 0;  // afresh over the stopped run's checkpoint: refused by rank 0, for both
  ranks = run_ranks(c, 2, d / "agree.db");
  EXPECT_NE(ranks[0].value("error", "").find("unfinished run"), std::string::npos) << ranks[0].dump();
  EXPECT_NE(ranks[1].value("error", "").find("rank 0: "), std::string::npos) << ranks[1].dump();
  c.cfg.train.checkpoint = (d / "agree2.ckpt").string();
  c.rank1_seed = 2;  // the ranks' configs differ
  ranks = run_ranks(c, 2, d / "agree.db");
  EXPECT_NE(ranks[0].value("error", "").find("rank 1's config differs from rank 0's"), std::string::npos)
      << ranks[0].dump();
  EXPECT_NE(ranks[1].value("error", "").find("rank 1's config differs from rank 0's"), std::string::npos)
      << ranks[1].dump();
  c.rank1_seed = 0;
  c.cfg.train.micro_batches = 3;  // not a multiple of 2
  ranks = run_ranks(c, 2, d / "agree.db");
  EXPECT_NE(ranks[0].value("error", "").find("micro_batches = 3 cannot be shared by 2"), std::string::npos)
      << ranks[0].dump();
}

int main(int argc, char** argv) {
  if (const char* file = std::getenv("FP8LAB_TEST_RANK_OF")) {
    try {
      return run_rank(file);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rank: %s\n", e.what());
      return 1;
    }
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
