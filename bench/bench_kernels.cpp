// Kernel throughput on 64 MiB of float32, one thread and all threads, each beside its
// physical-limit reference: a plain streaming loop over the same bytes (y[i] = a * x[i]
// for float -> float; the same with a narrowing or widening store for codes), timed in the
// same run. Counter `vs_stream` = reference time / kernel time (1.0 = memory speed).
// The in_cache_* benchmarks run them on L1-resident data instead (their compute rate).
//
//   build/bench_kernels --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <cstring>
#include <random>
#include <vector>

#include "fp8lab/kernels/threads.hpp"
#include "fp8lab/core/codec.hpp"
#include "fp8lab/core/dot_model.hpp"
#include "fp8lab/kernels/dot_model.hpp"
#include "fp8lab/kernels/kernels.hpp"
#include "fp8lab/kernels/scaled.hpp"

using namespace fp8lab;

namespace {

constexpr std::size_t kN = (std::size_t{64} << 20) / sizeof(float);  // 64 MiB of float32

struct Data {
  std::vector<float> x, xr, y;  // xr: max(x, 0), what a ReLU hands the next layer
  std::vector<std::uint8_t> c;
  Data() : x(kN), xr(kN), y(kN), c(kN) {
    std::mt19937 rng(1);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (auto& v : x) v = nd(rng);
    for (std::size_t i = 0; i < kN; ++i) xr[i] = std::max(x[i], 0.0f);
    QuantSpec q;
    q.format = parse_format("e4m3fnuz");
    kernels::encode(x.data(), c.data(), kN, q);
    std::memcpy(y.data(), x.data(), kN * 4);
  }
};
Data& data() {
  static Data d;
  return d;
}

// The reference loops, split over the kernels' own thread pool.
void stream_f32(const float* x, float* y, std::size_t n, float a) {
  kernels::parallel_for(n, 1024, [&](std::size_t b, std::size_t e) {
    const float* __restrict in = x;
    float* __restrict out = y;
    for (std::size_t i = b; i < e; ++i) out[i] = a * in[i];
  });
}
// Reads 4 bytes and writes 1 per element, as encoding does (the top byte of each float).
void stream_f32_u8(const float* x, std::uint8_t* y, std::size_t n) {
  const auto* u = reinterpret_cast<const std::uint32_t*>(x);
  kernels::parallel_for(n, 1024, [&](std::size_t b, std::size_t e) {
    const std::uint32_t* __restrict in = u;
    std::uint8_t* __restrict out = y;
    for (std::size_t i = b; i < e; ++i) out[i] = static_cast<std::uint8_t>(in[i] >> 24);
  });
}
void stream_u8_f32(const std::uint8_t* x, float* y, std::size_t n, float a) {
  kernels::parallel_for(n, 1024, [&](std::size_t b, std::size_t e) {
    const std::uint8_t* __restrict in = x;
    float* __restrict out = y;
    for (std::size_t i = b; i < e; ++i) out[i] = a * static_cast<float>(in[i]);
  });
}

template <class F>
double seconds_per_call(const F& f, int reps = 5) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

// Read-only reference for the histogram: the same 4 bytes per element, summed.
float stream_read(const float* x, std::size_t n) {
  float total = 0;
  std::mutex m;
  kernels::parallel_for(n, 1024, [&](std::size_t b, std::size_t e) {
    float acc[16] = {};
    for (std::size_t i = b; i + 16 <= e; i += 16)
      for (int k = 0; k < 16; ++k) acc[k] += x[i + k];
    float s = 0;
    for (float a : acc) s += a;
    std::lock_guard<std::mutex> lk(m);
    total += s;
  });
  return total;
}

enum class Kind { quantize, quantize_relu, quantize_sr, encode, decode, quantize_counts, histogram };

void run(benchmark::State& state, Kind kind, const char* fmt) {
  const int threads = static_cast<int>(state.range(0));
  const int before = kernels::num_threads();
  kernels::set_num_threads(threads);
  Data& d = data();
  QuantSpec q;
  q.format = parse_format(fmt);
  if (kind == Kind::quantize_sr) q.rounding = Rounding::stochastic;
  QuantCounts counts;
  auto kernel = [&] {
    switch (kind) {
      case Kind::quantize:
      case Kind::quantize_sr: kernels::quantize(d.x.data(), d.y.data(), kN, q); break;
      case Kind::quantize_relu: kernels::quantize(d.xr.data(), d.y.data(), kN, q); break;
      case Kind::quantize_counts: kernels::quantize(d.x.data(), d.y.data(), kN, q, 0, &counts); break;
      case Kind::encode: kernels::encode(d.x.data(), d.c.data(), kN, q); break;
      case Kind::decode: kernels::decode(d.c.data(), d.y.data(), kN, q.format); break;
      case Kind::histogram: benchmark::DoNotOptimize(kernels::exponent_histogram(d.x.data(), kN)); break;
    }
  };
  auto reference = [&] {
    switch (kind) {
      case Kind::encode: stream_f32_u8(d.x.data(), d.c.data(), kN); break;
      case Kind::decode: stream_u8_f32(d.c.data(), d.y.data(), kN, 3.0f); break;
      case Kind::histogram: benchmark::DoNotOptimize(stream_read(d.x.data(), kN)); break;
      default: stream_f32(d.x.data(), d.y.data(), kN, 3.0f); break;
    }
  };
  kernel();  // warm up (page faults, decode tables)
  for (auto _ : state) {
    kernel();
    benchmark::ClobberMemory();
  }
  const double t_kernel = seconds_per_call(kernel);
  const double t_ref = seconds_per_call(reference);
  const std::size_t bytes =
      kind == Kind::histogram ? 4 : (kind == Kind::encode || kind == Kind::decode ? 5 : 8);
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * kN));
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * kN * bytes));
  state.counters["Gelem_s"] = kN / t_kernel * 1e-9;
  state.counters["stream_Gelem_s"] = kN / t_ref * 1e-9;
  state.counters["vs_stream"] = t_ref / t_kernel;
  state.SetLabel(std::string(fmt) + " " + kernels::current_target());
  kernels::set_num_threads(before);
}

// Runs `kernel` (over the kN elements of data()) as the benchmark's loop, then times it and
// the float -> float streaming loop on the same data: items, G elem/s and the ratio.
template <class Kernel>
void time_against_stream(benchmark::State& state, const Kernel& kernel) {
  Data& d = data();
  auto reference = [&] { stream_f32(d.x.data(), d.y.data(), kN, 3.0f); };
  kernel();  // warm up
  for (auto _ : state) {
    kernel();
    benchmark::ClobberMemory();
  }
  const double t_kernel = seconds_per_call(kernel);
  const double t_ref = seconds_per_call(reference);
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * kN));
  state.counters["Gelem_s"] = kN / t_kernel * 1e-9;
  state.counters["stream_Gelem_s"] = kN / t_ref * 1e-9;
  state.counters["vs_stream"] = t_ref / t_kernel;
}

// Scaled quantization (fake-quantized float32 out) of the same 64 MiB as a [kN/1024, 1024]
// matrix, groups along the rows, beside the float -> float streaming loop.
void scaled(benchmark::State& state, const char* spec) {
  const int threads = static_cast<int>(state.range(0));
  const int before = kernels::num_threads();
  kernels::set_num_threads(threads);
  Data& d = data();
  const ScaledSpec s = parse_scaled(spec);
  constexpr std::size_t cols = 1024, rows = kN / cols;
  time_against_stream(state, [&] { kernels::scaled_quantize(d.x.data(), rows, cols, s, ScaledOut{d.y.data()}); });
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * kN * 8));
  state.SetLabel(to_string(s) + " " + kernels::current_target());
  kernels::set_num_threads(before);
}

// Scaled quantization of the [rows, kN/rows] matrix given by its transpose (the backward
// operand of a convolution: rows = channels, columns = batch x positions), bfloat16 out as
// the training path asks, beside the same streaming loop.
void scaled_transposed(benchmark::State& state, const char* spec, std::size_t rows) {
  const int threads = static_cast<int>(state.range(0));
  const int before = kernels::num_threads();
  kernels::set_num_threads(threads);
  Data& d = data();
  const ScaledSpec s = parse_scaled(spec);
  const std::size_t cols = kN / rows;
  std::vector<std::uint16_t> b16(kN);
  std::vector<std::uint32_t> scales(block_layout(s, rows, cols).groups());
  bool exact = false;
  auto kernel = [&] {
    kernels::scaled_quantize_transposed(d.x.data(), rows, cols, s,
                                        ScaledOut{nullptr, nullptr, scales.data(), nullptr, b16.data(), &exact});
  };
  time_against_stream(state, kernel);
  state.SetLabel(to_string(s) + " [" + std::to_string(rows) + ", " + std::to_string(cols) + "] from its transpose, " +
                 kernels::current_target());
  kernels::set_num_threads(before);
}

// Scaled quantization of a row-major [kN/cols, cols] matrix as a training step asks for a
// forward operand: bfloat16 values and the scale codes (a convolution's channels-last
// activation: cols = channels, 16 in ResNet-20's first stage, shorter than an MX block),
// beside the same streaming loop.
void scaled_rows(benchmark::State& state, const char* spec, std::size_t cols) {
  const int threads = static_cast<int>(state.range(0));
  const int before = kernels::num_threads();
  kernels::set_num_threads(threads);
  Data& d = data();
  const ScaledSpec s = parse_scaled(spec);
  const std::size_t rows = kN / cols;
  std::vector<std::uint16_t> b16(kN);
  std::vector<std::uint32_t> scales(block_layout(s, rows, cols).groups());
  bool exact = false;
  auto kernel = [&] {
    kernels::scaled_quantize(d.x.data(), rows, cols, s,
                             ScaledOut{nullptr, nullptr, scales.data(), nullptr, b16.data(), &exact});
  };
  time_against_stream(state, kernel);
  state.SetLabel(to_string(s) + " [" + std::to_string(rows) + ", " + std::to_string(cols) + "] bfloat16 out, " +
                 kernels::current_target());
  kernels::set_num_threads(before);
}

// Both forms of an activation as a training step makes them in forward: the row form's
// bfloat16 values for the product, the column form's codes for backward's weight gradient
// (kernels::scaled_quantize_both, one read), beside the same two forms made by two calls
// (scaled_quantize, then scaled_quantize_transposed) and the streaming loop, in the same run.
// Counter vs_two_calls: the two calls' time over the joint one's.
void scaled_both(benchmark::State& state, const char* spec, std::size_t cols) {
  const int threads = static_cast<int>(state.range(0));
  const int before = kernels::num_threads();
  kernels::set_num_threads(threads);
  Data& d = data();
  const ScaledSpec s = parse_scaled(spec);
  const std::size_t rows = kN / cols;
  std::vector<std::uint16_t> b16(kN);
  std::vector<std::uint8_t> codes(kN);
  std::vector<std::uint32_t> scales(block_layout(s, rows, cols).groups()), t_scales(block_layout(s, cols, rows).groups());
  float ts = 1, t_ts = 1;
  bool exact = false;
  const ScaledOut out{nullptr, nullptr, scales.data(), &ts, b16.data(), &exact};
  const ScaledOut t_out{nullptr, codes.data(), t_scales.data(), &t_ts};
  auto joint = [&] { kernels::scaled_quantize_both(d.x.data(), rows, cols, s, out, {}, nullptr, s, t_out, {}, nullptr); };
  auto two_calls = [&] {
    kernels::scaled_quantize(d.x.data(), rows, cols, s, out);
    kernels::scaled_quantize_transposed(d.x.data(), cols, rows, s, t_out);
  };
  time_against_stream(state, joint);
  two_calls();
  state.counters["vs_two_calls"] = seconds_per_call(two_calls) / seconds_per_call(joint);
  state.SetLabel(to_string(s) + " [" + std::to_string(rows) + ", " + std::to_string(cols) +
                 "]: bfloat16 rows, codes of columns, " + kernels::current_target());
  kernels::set_num_threads(before);
}

// The same kernels on 4096 elements that stay in L1, one thread: their compute rate, the
// bound they run at on tensors that are still in cache (as activations between the layers
// of a training step are). Reference: the streaming loop y = a * x on the same buffers.
enum class Hot { quantize, quantize_counts, quantize_encode, encode, decode };
void in_cache(benchmark::State& state, Hot kind) {
  constexpr std::size_t n = 4096;
  std::vector<float> x(n), y(n);
  std::vector<std::uint8_t> c(n);
  std::mt19937 rng(2);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (auto& v : x) v = std::max(nd(rng), 0.0f);  // a ReLU output: half zeros
  QuantSpec q;
  q.format = parse_format("1.4.3:10");
  kernels::encode(x.data(), c.data(), n, q);
  const kernels::Runner serial = kernels::Runner::serial();
  QuantCounts counts;
  auto kernel = [&] {
    switch (kind) {
      case Hot::quantize: kernels::quantize(x.data(), y.data(), n, q, 0, nullptr, serial); break;
      case Hot::quantize_counts: kernels::quantize(x.data(), y.data(), n, q, 0, &counts, serial); break;
      case Hot::quantize_encode:
        kernels::quantize_and_encode(x.data(), y.data(), c.data(), n, q, 0, &counts, serial);
        break;
      case Hot::encode: kernels::encode(x.data(), c.data(), n, q, 0, nullptr, serial); break;
      case Hot::decode: kernels::decode(c.data(), y.data(), n, q.format, serial); break;
    }
    benchmark::ClobberMemory();
  };
  auto reference = [&] {
    const float* __restrict in = x.data();
    float* __restrict out = y.data();
    for (std::size_t i = 0; i < n; ++i) out[i] = 3.0f * in[i];
    benchmark::ClobberMemory();
  };
  // Best of 20 timings of 100 calls each: one call is about a microsecond.
  auto per_call = [](const auto& f) {
    return seconds_per_call([&] { for (int k = 0; k < 100; ++k) f(); }, 20) / 100;
  };
  for (auto _ : state) kernel();
  const double t_kernel = per_call(kernel), t_ref = per_call(reference);
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * n));
  state.counters["Gelem_s"] = n / t_kernel * 1e-9;
  state.counters["stream_Gelem_s"] = n / t_ref * 1e-9;
  state.counters["vs_stream"] = t_ref / t_kernel;
  state.SetLabel(std::string("1.4.3:10 relu ") + kernels::current_target());
}

// A [256, 512] x [512, 256] product under a dot-product model (docs/spec.md §7.4) beside the
// float32 product of the same operands as a plain i-k-j loop (which the compiler vectorizes):
// what the model costs against float32 arithmetic, as products per second and the ratio.
void model_matmul(benchmark::State& state, const char* preset) {
  const int threads = static_cast<int>(state.range(0));
  const int before = kernels::num_threads();
  kernels::set_num_threads(threads);
  constexpr std::size_t m = 256, k = 512, n = 256;
  const Data& d = data();
  const float* a = d.x.data();
  const float* b = d.x.data() + m * k;
  std::vector<float> out(m * n);
  const DotModel model = parse_dot_model(preset);
  const auto kernel = [&] { kernels::model_matmul(a, b, out.data(), {1, m, k, n}, model); };
  const auto reference = [&] {
    kernels::parallel_for(m, 1, [&](std::size_t begin, std::size_t end) {
      for (std::size_t i = begin; i < end; ++i) {
        float* row = out.data() + i * n;
        std::fill(row, row + n, 0.0f);
        for (std::size_t t = 0; t < k; ++t)
          for (std::size_t j = 0; j < n; ++j) row[j] += a[i * k + t] * b[t * n + j];
      }
    });
  };
  kernel();
  for (auto _ : state) {
    kernel();
    benchmark::ClobberMemory();
  }
  const double t_kernel = seconds_per_call(kernel), t_ref = seconds_per_call(reference);
  constexpr double products = double(m) * k * n;
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * products));
  state.counters["Gproducts_s"] = products / t_kernel * 1e-9;
  state.counters["fp32_Gproducts_s"] = products / t_ref * 1e-9;
  state.counters["vs_fp32"] = t_ref / t_kernel;
  state.SetLabel(preset);
  kernels::set_num_threads(before);
}

void Threads(benchmark::internal::Benchmark* b) {
  b->Arg(1);
  const int all = kernels::num_threads();
  if (all > 1) b->Arg(all);
  b->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.5);
}

}  // namespace

BENCHMARK_CAPTURE(run, quantize_rne, Kind::quantize, "e4m3fnuz")->Apply(Threads);
BENCHMARK_CAPTURE(run, quantize_rne_e5m2, Kind::quantize, "e5m2")->Apply(Threads);
BENCHMARK_CAPTURE(run, quantize_rne_relu, Kind::quantize_relu, "e4m3fnuz")->Apply(Threads);
BENCHMARK_CAPTURE(run, quantize_rne_counts, Kind::quantize_counts, "e4m3fnuz")->Apply(Threads);
BENCHMARK_CAPTURE(run, quantize_stochastic, Kind::quantize_sr, "e4m3fnuz")->Apply(Threads);
BENCHMARK_CAPTURE(run, encode_rne, Kind::encode, "e4m3fnuz")->Apply(Threads);
BENCHMARK_CAPTURE(run, decode, Kind::decode, "e4m3fnuz")->Apply(Threads);
BENCHMARK_CAPTURE(run, exponent_histogram, Kind::histogram, "e4m3fnuz")->Apply(Threads);
BENCHMARK_CAPTURE(scaled, scaled_mxfp8_e4m3, "mxfp8_e4m3")->Apply(Threads);
BENCHMARK_CAPTURE(scaled, scaled_mxfp4, "mxfp4")->Apply(Threads);
BENCHMARK_CAPTURE(scaled, scaled_nvfp4, "nvfp4")->Apply(Threads);
BENCHMARK_CAPTURE(scaled, scaled_nvfp4_4over6, "nvfp4_4over6")->Apply(Threads);
BENCHMARK_CAPTURE(scaled, scaled_nvfp4_te, "nvfp4:te")->Apply(Threads);
BENCHMARK_CAPTURE(scaled, scaled_nvfp4_quartet, "nvfp4_quartet")->Apply(Threads);
BENCHMARK_CAPTURE(scaled, scaled_nvfp4_eden, "nvfp4_eden")->Apply(Threads);
BENCHMARK_CAPTURE(scaled, scaled_mxfp4_dither, "mxfp4:dither-scale")->Apply(Threads);
BENCHMARK_CAPTURE(scaled, scaled_deepseek_1x128, "deepseek_1x128")->Apply(Threads);
BENCHMARK_CAPTURE(scaled, scaled_e4m3_tensor, "e4m3_tensor")->Apply(Threads);
BENCHMARK_CAPTURE(scaled_transposed, scaled_transposed_mxfp8_16, "mxfp8_e4m3", 16)->Apply(Threads);
BENCHMARK_CAPTURE(scaled_transposed, scaled_transposed_mxfp8_64, "mxfp8_e4m3", 64)->Apply(Threads);
BENCHMARK_CAPTURE(scaled_transposed, scaled_transposed_nvfp4_64, "nvfp4", 64)->Apply(Threads);
BENCHMARK_CAPTURE(scaled_rows, scaled_rows_mxfp8_16, "mxfp8_e4m3", 16)->Apply(Threads);
BENCHMARK_CAPTURE(scaled_rows, scaled_rows_mxfp8_64, "mxfp8_e4m3", 64)->Apply(Threads);
BENCHMARK_CAPTURE(scaled_both, scaled_both_mxfp8_16, "mxfp8_e4m3", 16)->Apply(Threads);
BENCHMARK_CAPTURE(scaled_both, scaled_both_mxfp8_64, "mxfp8_e4m3", 64)->Apply(Threads);
BENCHMARK_CAPTURE(scaled_both, scaled_both_nvfp4_64, "nvfp4", 64)->Apply(Threads);
BENCHMARK_CAPTURE(model_matmul, model_matmul_hopper_fp8, "hopper-fp8")->Apply(Threads);
BENCHMARK_CAPTURE(model_matmul, model_matmul_ocp_mx, "ocp-mx")->Apply(Threads);
BENCHMARK_CAPTURE(in_cache, in_cache_quantize, Hot::quantize);
BENCHMARK_CAPTURE(in_cache, in_cache_quantize_counts, Hot::quantize_counts);
BENCHMARK_CAPTURE(in_cache, in_cache_quantize_encode, Hot::quantize_encode);
BENCHMARK_CAPTURE(in_cache, in_cache_encode, Hot::encode);
BENCHMARK_CAPTURE(in_cache, in_cache_decode, Hot::decode);

int main(int argc, char** argv) {
  // FP8LAB_TARGET=AVX2 (say) runs the kernels on one SIMD target.
  if (const char* t = std::getenv("FP8LAB_TARGET")) kernels::use_target(t);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
