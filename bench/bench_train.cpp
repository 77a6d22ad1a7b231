// One training step (forward, backward, SGD update) of a small CIFAR ResNet and of a
// Transformer encoder layer, float32 versus the paper's 1.4.3/1.5.2 recipe, timed in
// interleaved rounds of the same run. Counters of `run`: fp32_ms and ms (median step
// times), vs_fp32 (median over rounds of quantized / float32: the overhead of simulating
// 8-bit training; all_codes_vs_fp32 with weights saved as codes too; auto_ms and
// auto_vs_fp32 with quant.compute = auto), act_saved_ratio
// (activation bytes the quantized ops save for backward as 8-bit codes / as float32;
// act_saved_ratio_first0 with the first layer's input quantized too) and w_saved_MiB (the
// weights' float32 quantized copies).
//
//   build/bench_train --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>

#include <torch/csrc/autograd/profiler_legacy.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <malloc.h>
#include <cstdlib>
#include <thread>

#include "fp8lab/nn/compute.hpp"
#include "fp8lab/nn/runtime.hpp"
#include "fp8lab/kernels/kernels.hpp"
#include "fp8lab/models/bert.hpp"
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

// What the quantized ops save for backward: float32 only, 8-bit codes of activations
// (the default: weights keep a float32 quantized copy), or codes of weights too.
enum class Save { float32, activation_codes, all_codes };
void set_save(nn::QuantContext& ctx, Save s) {
  ctx.save_codes = s != Save::float32;
  ctx.save_weight_codes = s == Save::all_codes;
}

template <int kWidth, int kBatch = 32>
Setup resnet(const std::string& recipe, Save save) {
  torch::manual_seed(0);
  models::CifarResNetOptions o;
  o.depth = 20;
  o.width = kWidth;
  auto m = models::CifarResNet(o);
  auto ctx = std::make_shared<nn::QuantContext>();
  set_save(*ctx, save);
  nn::quantize_model(*m, nn::parse_recipe(recipe), ctx);
  // Channels-last images and convolution weights: libtorch's fastest float32 layout for
  // convolutions on the CPU (oneDNN's), which every variant then keeps.
  for (auto& p : m->parameters())
    if (p.dim() == 4) p.set_data(p.data().contiguous(torch::MemoryFormat::ChannelsLast));
  auto x = torch::randn({kBatch, 3, 32, 32}).contiguous(torch::MemoryFormat::ChannelsLast);
  auto t = torch::randint(0, 10, {kBatch});
  return {m.ptr(), [m, x, t]() mutable { return torch::nn::functional::cross_entropy(m->forward(x), t); }, ctx};
}

Setup transformer(const std::string& recipe, Save save) {
  torch::manual_seed(0);
  auto m = models::EncoderLayer(512, 8, 2048, 0.0);
  auto ctx = std::make_shared<nn::QuantContext>();
  set_save(*ctx, save);
  nn::quantize_model(*m, nn::parse_recipe(recipe), ctx);
  auto x = torch::randn({8, 32, 512});
  return {m.ptr(), [m, x]() mutable { return m->forward(x).pow(2).mean(); }, ctx};
}

// BERT-tiny pre-training on random tokens: 32 sequences of 128, MLM over every position
// and NSP.
Setup bert_tiny(const std::string& recipe, Save save) {
  torch::manual_seed(0);
  auto o = models::bert_preset("bert-tiny");
  o.dropout = 0.0;
  auto m = models::Bert(o);
  auto ctx = std::make_shared<nn::QuantContext>();
  set_save(*ctx, save);
  nn::quantize_model(*m, nn::parse_recipe(recipe), ctx);
  auto ids = torch::randint(1, o.vocab, {32, 128});
  auto segments = (torch::arange(128) >= 64).to(torch::kLong).expand({32, 128}).contiguous();
  auto nsp = torch::randint(0, 2, {32});
  return {m.ptr(),
          [m, ids, segments, nsp]() mutable {
            auto [mlm, next] = m->forward(ids, segments);
            return torch::nn::functional::cross_entropy(mlm.reshape({-1, mlm.size(-1)}), ids.reshape({-1})) +
                   torch::nn::functional::cross_entropy(next, nsp);
          },
          ctx};
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

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Variants of one model timed in rounds: each round steps every variant (best of 2 steps),
// so that the machine's slow phases (a shared VM) hit them alike. Returns per variant the
// step times of every round; compare variants within a round.
struct Variant {
  std::string name, recipe;
  Save save;
  nn::Compute compute = nn::Compute::fp32;
};
std::vector<std::vector<double>> time_rounds(Setup (*make)(const std::string&, Save),
                                             const std::vector<Variant>& vs, int rounds,
                                             benchmark::State& state) {
  std::vector<Setup> setups;
  std::vector<torch::optim::SGD> opts;
  for (const auto& v : vs) {
    setups.push_back(make(v.recipe, v.save));
    setups.back().ctx->compute = v.compute;
    opts.emplace_back(setups.back().model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  }
  for (std::size_t i = 0; i < vs.size(); ++i) step_ms(setups[i], opts[i], 1);  // warm up
  for (auto _ : state) step_ms(setups.back(), opts.back(), 1);
  std::vector<std::vector<double>> t(vs.size());
  for (int r = 0; r < rounds; ++r)
    for (std::size_t i = 0; i < vs.size(); ++i) t[i].push_back(step_ms(setups[i], opts[i], 2));
  return t;
}

// Median over rounds of a variant's time over the first variant's in the same round.
double median_ratio(const std::vector<std::vector<double>>& t, std::size_t i) {
  std::vector<double> r;
  for (std::size_t k = 0; k < t[0].size(); ++k) r.push_back(t[i][k] / t[0][k]);
  return median(r);
}

void run(benchmark::State& state, Setup (*make)(const std::string&, Save), const char* recipe) {
  const std::vector<Variant> vs = {{"fp32", "fp32", Save::float32},
                                   {"quantized", recipe, Save::activation_codes},
                                   {"quantized_all_codes", recipe, Save::all_codes},
                                   {"quantized_auto", recipe, Save::activation_codes, nn::Compute::auto_}};
  const auto t = time_rounds(make, vs, 15, state);
  // Saved-for-backward bytes of one forward: activations as codes versus float32, with the
  // recipe as given (its first layer's input stays float32) and with every layer's input
  // quantized (first=0: what each layer inside a deeper stack saves).
  Setup codes = make(recipe, Save::all_codes), fl = make(recipe, Save::float32);
  { auto l = codes.loss(); }
  { auto l = fl.loss(); }
  const std::string all_layers = nn::parse_recipe(recipe).to_line() + ",first=0";
  Setup codes_all = make(all_layers, Save::all_codes), fl_all = make(all_layers, Save::float32);
  { auto l = codes_all.loss(); }
  { auto l = fl_all.loss(); }
  state.counters["act_saved_ratio_first0"] =
      static_cast<double>(codes_all.ctx->saved_bytes.load()) / fl_all.ctx->saved_bytes.load();
  state.counters["fp32_ms"] = median(t[0]);
  state.counters["ms"] = median(t[1]);
  state.counters["vs_fp32"] = median_ratio(t, 1);
  state.counters["all_codes_vs_fp32"] = median_ratio(t, 2);
  state.counters["auto_ms"] = median(t[3]);  // quant.compute = auto (docs/spec.md §7)
  state.counters["auto_vs_fp32"] = median_ratio(t, 3);
  state.counters["act_saved_MiB"] = codes.ctx->saved_bytes.load() / 1048576.0;
  state.counters["act_saved_ratio"] =
      static_cast<double>(codes.ctx->saved_bytes.load()) / fl.ctx->saved_bytes.load();
  state.counters["w_saved_MiB"] = fl.ctx->saved_weight_bytes.load() / 1048576.0;
  state.SetLabel(recipe);
}

// Where the quantized step's extra time goes: each tensor kind quantized alone, and the
// whole recipe saving float32 only, activation codes (the default) and all codes, all
// timed in rounds with the float32 step. Counters: the median over rounds of the extra
// milliseconds over float32 in the same round.
void breakdown(benchmark::State& state, Setup (*make)(const std::string&, Save), const char* recipe) {
  const nn::Recipe full = nn::parse_recipe(recipe);
  std::vector<Variant> vs = {{"fp32", "fp32", Save::float32}};
  for (nn::TensorKind k : nn::kAllKinds) {
    std::string line = std::string(nn::to_string(k)) + "=" + nn::to_string(full.base[k]);
    vs.push_back({"only_" + std::string(nn::to_string(k)), line, Save::activation_codes});
  }
  vs.push_back({"all_float_saved", recipe, Save::float32});
  vs.push_back({"all", recipe, Save::activation_codes});
  vs.push_back({"all_codes_saved", recipe, Save::all_codes});
  const auto t = time_rounds(make, vs, 9, state);
  state.counters["fp32_ms"] = median(t[0]);
  for (std::size_t i = 1; i < vs.size(); ++i) {
    std::vector<double> extra;
    for (std::size_t k = 0; k < t[0].size(); ++k) extra.push_back(t[i][k] - t[0][k]);
    state.counters[vs[i].name + "_extra_ms"] = median(extra);
  }
  state.SetLabel(recipe);
}

// One recipe alone, for profilers: FP8LAB_BENCH_RECIPE (default fp32), FP8LAB_BENCH_CODES=0
// to save float32 only, 2 to save weight codes too, FP8LAB_BENCH_COMPUTE the compute path
// (default fp32), FP8LAB_BENCH_TRACE=FILE a chrome://tracing trace of ten more steps. perf record build/bench_train --benchmark_filter=profile_resnet20
void profile(benchmark::State& state, Setup (*make)(const std::string&, Save)) {
  const char* r = std::getenv("FP8LAB_BENCH_RECIPE");
  const char* c = std::getenv("FP8LAB_BENCH_CODES");
  const std::string save = c ? c : "1";
  Setup s = make(r ? r : "fp32", save == "0" ? Save::float32 : save == "2" ? Save::all_codes
                                                                          : Save::activation_codes);
  const char* compute = std::getenv("FP8LAB_BENCH_COMPUTE");
  s.ctx->compute = nn::parse_compute(compute ? compute : "fp32");
  torch::optim::SGD opt(s.model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  step_ms(s, opt, 2);
  double best = 1e30;
  for (auto _ : state) best = std::min(best, step_ms(s, opt, 1));
  state.counters["best_ms"] = best;
  state.SetLabel(r ? r : "fp32");
  if (const char* trace = std::getenv("FP8LAB_BENCH_TRACE")) {  // ten steps in libtorch's profiler
    torch::autograd::profiler::RecordProfile guard(std::string{trace});
    step_ms(s, opt, 10);
  }
}

// The best time of `reps` calls of fn, in units of Period (std::micro, std::milli).
template <class Period, class Fn>
double best_of(int reps, Fn&& fn) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    auto out = fn();
    benchmark::DoNotOptimize(out);
    best = std::min(best, std::chrono::duration<double, Period>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
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
    return best_of<std::micro>(200, fn);
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

// One matrix product [M, K] x [K, N] of bfloat16 values on the bfloat16 path
// (nn::matmul_bf16) beside libtorch's float32 matmul of the same float32 tensors, best of
// 20 each. Counters: fp32_ms, bf16_ms and bf16_speedup (fp32 / bf16).
void product(benchmark::State& state) {
  const std::int64_t m = state.range(0), k = state.range(1), n = state.range(2);
  if (!nn::bf16_products_available()) {
    state.SkipWithError("no bfloat16 products on this CPU");
    return;
  }
  const auto a = torch::randn({m, k}).to(torch::kBFloat16).to(torch::kFloat);
  const auto b = torch::randn({k, n}).to(torch::kBFloat16).to(torch::kFloat);
  auto bf16 = [&] { return nn::matmul_bf16(a, b); };
  auto fp32 = [&] { return torch::matmul(a, b); };
  for (auto _ : state) benchmark::DoNotOptimize(bf16());
  const double tf = best_of<std::milli>(20, fp32), tb = best_of<std::milli>(20, bf16);
  state.counters["fp32_ms"] = tf;
  state.counters["bf16_ms"] = tb;
  state.counters["bf16_speedup"] = tf / tb;
}

}  // namespace

BENCHMARK(product)
    ->Args({256, 512, 2048})   // the Transformer layer's feed-forward product (8x32 tokens)
    ->Args({512, 256, 2048})   // its weight gradient (reduction over the tokens)
    ->Args({1024, 1024, 1024})
    ->Unit(benchmark::kMillisecond)
    ->Iterations(5);
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
BENCHMARK_CAPTURE(run, resnet20_cifar_b128, (resnet<16, 128>), "resnet32-mixed")
    ->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK_CAPTURE(run, bert_tiny_b32x128, bert_tiny, "bert-mixed")->Unit(benchmark::kMillisecond)->Iterations(3);
// Scaled recipes (docs/spec.md §6.6): every operand quantized along each product's
// reduction dimension, so twice per tensor where the paper's recipe quantizes once.
BENCHMARK_CAPTURE(run, resnet20_cifar_b32_mxfp8, resnet<16>, "mxfp8")->Unit(benchmark::kMillisecond)->Iterations(5);
BENCHMARK_CAPTURE(run, resnet20_cifar_b32_nvfp4, resnet<16>, "nvfp4")->Unit(benchmark::kMillisecond)->Iterations(5);
BENCHMARK_CAPTURE(run, transformer_layer_d512_b8x32_mxfp8, transformer, "mxfp8")
    ->Unit(benchmark::kMillisecond)->Iterations(5);
BENCHMARK_CAPTURE(run, transformer_layer_d512_b8x32_nvfp4_rht, transformer, "nvfp4-rht")
    ->Unit(benchmark::kMillisecond)->Iterations(5);

int main(int argc, char** argv) {
  // Run through build/fp8lab-env for the OpenBLAS kernels and OpenMP spinning the fp8lab
  // program starts libtorch with (apps/launcher/process_env.hpp); blas_core says which ran.
  benchmark::AddCustomContext("blas_core", fp8lab::nn::blas_core());
  // FP8LAB_BENCH_THREADS=N: N threads (e.g. 1, pinned with taskset beside other work);
  // default one per core (libtorch defaults to one thread here).
  const char* threads = std::getenv("FP8LAB_BENCH_THREADS");
  const int cores = threads ? std::max(1, std::atoi(threads))
                            : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  torch::set_num_threads(cores);
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
