// One training step (forward, backward, SGD update) of a small CIFAR ResNet and of a
// Transformer encoder layer, float32 versus the paper's 1.4.3/1.5.2 recipe, timed in the
// same run. Counters: ms_per_step, vs_fp32 (quantized step time / float32 step time: the
// overhead of simulating 8-bit training), and saved_ratio (bytes the quantized ops save for
// backward with 8-bit codes / with float32).
//
//   build/bench_train --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>

#include <torch/torch.h>

#include <chrono>
#include <malloc.h>
#include <cstdlib>
#include <thread>

#include "fp8lab/nn/blas.hpp"
#include "fp8lab/kernels/kernels.hpp"
#include "fp8lab/models/resnet.hpp"
#include "fp8lab/models/transformer.hpp"
#include "fp8lab/nn/tensor_quant.hpp"

using namespace fp8lab;

namespace {

struct Setup {
  std::shared_ptr<torch::nn::Module> model;
  std::function<torch::Tensor()> loss;
  std::shared_ptr<nn::QuantContext> ctx;
};

template <int kWidth>
Setup resnet(const std::string& recipe, bool save_codes) {
  torch::manual_seed(0);
  models::CifarResNetOptions o;
  o.depth = 20;
  o.width = kWidth;
  auto m = models::CifarResNet(o);
  auto ctx = std::make_shared<nn::QuantContext>();
  ctx->save_codes = save_codes;
  nn::quantize_model(*m, nn::parse_recipe(recipe), ctx);
  auto x = torch::randn({32, 3, 32, 32});
  auto t = torch::randint(0, 10, {32});
  return {m.ptr(), [m, x, t]() mutable { return torch::nn::functional::cross_entropy(m->forward(x), t); }, ctx};
}

Setup transformer(const std::string& recipe, bool save_codes) {
  torch::manual_seed(0);
  auto m = models::EncoderLayer(512, 8, 2048, 0.0);
  auto ctx = std::make_shared<nn::QuantContext>();
  ctx->save_codes = save_codes;
  nn::quantize_model(*m, nn::parse_recipe(recipe), ctx);
  auto x = torch::randn({8, 32, 512});
  return {m.ptr(), [m, x]() mutable { return m->forward(x).pow(2).mean(); }, ctx};
}

double step_ms(Setup& s, torch::optim::SGD& opt, int reps) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    opt.zero_grad();
    s.loss().backward();
    opt.step();
    s.ctx->step++;
    best = std::min(best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

void run(benchmark::State& state, Setup (*make)(const std::string&, bool), const char* recipe) {
  Setup q = make(recipe, true);
  Setup f = make("fp32", true);
  torch::optim::SGD opt_q(q.model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  torch::optim::SGD opt_f(f.model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  step_ms(q, opt_q, 1);
  step_ms(f, opt_f, 1);  // warm up
  for (auto _ : state) {
    opt_q.zero_grad();
    q.loss().backward();
    opt_q.step();
    q.ctx->step++;
  }
  // Interleave the two so that machine noise hits both alike.
  double tq = 1e30, tf = 1e30;
  for (int i = 0; i < 6; ++i) {
    tq = std::min(tq, step_ms(q, opt_q, 2));
    tf = std::min(tf, step_ms(f, opt_f, 2));
  }
  // Saved-for-backward bytes of one forward, codes versus float32.
  Setup fl = make(recipe, false);
  q.ctx->saved_bytes = 0;
  fl.ctx->saved_bytes = 0;
  { auto l = q.loss(); }
  { auto l = fl.loss(); }
  state.counters["ms_per_step"] = tq;
  state.counters["fp32_ms_per_step"] = tf;
  state.counters["vs_fp32"] = tq / tf;
  state.counters["saved_MiB"] = q.ctx->saved_bytes.load() / 1048576.0;
  state.counters["saved_ratio"] = static_cast<double>(q.ctx->saved_bytes.load()) / fl.ctx->saved_bytes.load();
  state.SetLabel(recipe);
}

// Where the quantized step's extra time goes: each tensor kind quantized alone, and the
// whole recipe saving float32 instead of 8-bit codes (no encode in forward, no decode in
// backward), all interleaved with the float32 step in the same run. Counters are the
// extra milliseconds over float32.
void breakdown(benchmark::State& state, Setup (*make)(const std::string&, bool), const char* recipe) {
  const nn::Recipe full = nn::parse_recipe(recipe);
  struct Variant {
    std::string name, recipe;
    bool codes;
  };
  std::vector<Variant> vs = {{"fp32", "fp32", true}};
  for (nn::TensorKind k : nn::kAllKinds) {
    std::string line = std::string(nn::to_string(k)) + "=" + nn::to_string(full.base[k]);
    vs.push_back({"only_" + std::string(nn::to_string(k)), line, true});
  }
  vs.push_back({"all_float_saved", recipe, false});
  vs.push_back({"all_codes_saved", recipe, true});
  std::vector<Setup> setups;
  std::vector<torch::optim::SGD> opts;
  for (const auto& v : vs) {
    setups.push_back(make(v.recipe, v.codes));
    opts.emplace_back(setups.back().model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  }
  for (std::size_t i = 0; i < vs.size(); ++i) step_ms(setups[i], opts[i], 1);  // warm up
  for (auto _ : state) step_ms(setups[0], opts[0], 1);
  std::vector<double> best(vs.size(), 1e30);
  for (int r = 0; r < 6; ++r)
    for (std::size_t i = 0; i < vs.size(); ++i) best[i] = std::min(best[i], step_ms(setups[i], opts[i], 2));
  state.counters["fp32_ms"] = best[0];
  for (std::size_t i = 1; i < vs.size(); ++i) state.counters[vs[i].name + "_extra_ms"] = best[i] - best[0];
  state.SetLabel(recipe);
}

// One recipe alone, for profilers: FP8LAB_BENCH_RECIPE (default fp32), FP8LAB_BENCH_CODES=0
// to save float32. perf record build/bench_train --benchmark_filter=profile_resnet20
void profile(benchmark::State& state, Setup (*make)(const std::string&, bool)) {
  const char* r = std::getenv("FP8LAB_BENCH_RECIPE");
  const char* c = std::getenv("FP8LAB_BENCH_CODES");
  Setup s = make(r ? r : "fp32", !(c && std::string(c) == "0"));
  torch::optim::SGD opt(s.model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  step_ms(s, opt, 2);
  double best = 1e30;
  for (auto _ : state) best = std::min(best, step_ms(s, opt, 1));
  state.counters["best_ms"] = best;
  state.SetLabel(r ? r : "fp32");
}

// The tensor passes the quantized ops make, on one ResNet-20 activation (32x16x32x32 after a
// ReLU, 2 MiB: it stays in cache as it does between the layers of a step), on libtorch's
// threads, beside x.clone() of the same tensor (a plain copy: the reference). Counters:
// each pass's time over the copy's, and its speed-up from 1 to 2 threads (1.0 would mean
// the pass runs on one thread).
void tensor_passes(benchmark::State& state) {
  const auto x = torch::randn({32, 16, 32, 32}).relu();
  QuantSpec q;
  q.format = parse_format("1.4.3:10");
  const auto codes = nn::encode_tensor(x, q, 1);
  auto time_us = [&](int threads, auto&& fn) {
    torch::set_num_threads(threads);
    double best = 1e30;
    for (int r = 0; r < 200; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      auto out = fn();
      benchmark::DoNotOptimize(out);
      best = std::min(best, std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }
    return best;
  };
  const int cores = torch::get_num_threads();
  auto copy = [&] { return x.clone(); };
  auto qe = [&] { QuantCounts c; return nn::quantize_and_encode_tensor(x, q, 1, &c); };
  auto fq = [&] { QuantCounts c; return nn::fake_quantize(x, q, 1, &c); };
  auto dec = [&] { return nn::decode_tensor(codes, q.format); };
  for (auto _ : state) benchmark::DoNotOptimize(qe());
  const double tc = time_us(cores, copy), tqe = time_us(cores, qe), tfq = time_us(cores, fq),
               tdec = time_us(cores, dec);
  const double tqe1 = time_us(1, qe), tdec1 = time_us(1, dec);
  torch::set_num_threads(cores);
  state.counters["copy_us"] = tc;
  state.counters["quantize_encode_us"] = tqe;
  state.counters["quantize_us"] = tfq;
  state.counters["decode_us"] = tdec;
  state.counters["qe_vs_copy"] = tqe / tc;
  state.counters["decode_vs_copy"] = tdec / tc;
  state.counters["qe_speedup_2thr"] = tqe1 / tqe;
  state.counters["decode_speedup_2thr"] = tdec1 / tdec;
}

}  // namespace

BENCHMARK(tensor_passes)->Unit(benchmark::kMillisecond)->Iterations(20);
BENCHMARK_CAPTURE(profile, profile_resnet20, resnet<16>)->Unit(benchmark::kMillisecond)->Iterations(100);
BENCHMARK_CAPTURE(profile, profile_transformer, transformer)->Unit(benchmark::kMillisecond)->Iterations(100);
BENCHMARK_CAPTURE(breakdown, resnet20_cifar_b32_breakdown, resnet<16>, "resnet32-mixed")
    ->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK_CAPTURE(breakdown, transformer_layer_breakdown, transformer, "transformer-mixed")
    ->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK_CAPTURE(run, resnet20_cifar_b32, resnet<16>, "resnet32-mixed")->Unit(benchmark::kMillisecond)->Iterations(5);
BENCHMARK_CAPTURE(run, resnet20_cifar_b32_sr, resnet<16>,
                  "a=1.4.3:10,w=1.4.3:14,gx=1.5.2:33/stochastic,gw=1.5.2:31/stochastic")
    ->Unit(benchmark::kMillisecond)->Iterations(5);
// Four times the channels: more arithmetic per activation byte quantized.
BENCHMARK_CAPTURE(run, resnet20x4_cifar_b32, resnet<64>, "resnet32-mixed")->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK_CAPTURE(run, transformer_layer_d512_b8x32, transformer, "transformer-mixed")
    ->Unit(benchmark::kMillisecond)->Iterations(5);

int main(int argc, char** argv) {
  fp8lab::nn::fix_blas_kernels(argv);  // OpenBLAS's fallback kernels on unknown CPUs: see blas.hpp
  benchmark::AddCustomContext("blas_core", fp8lab::nn::blas_core());
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  torch::set_num_threads(cores);  // libtorch defaults to one thread here
  if (!std::getenv("FP8LAB_DEFAULT_MALLOC")) {
    // Keep freed activation buffers in the heap instead of returning them to the kernel:
    // otherwise every step pays page faults for its fresh tensors (both recipes alike).
    mallopt(M_MMAP_THRESHOLD, 1 << 30);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
