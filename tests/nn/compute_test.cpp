// The compute layer (docs/spec.md §7): names, the bfloat16 exactness rule, the choice of
// path, and bfloat16 products against float32 ones. This file also runs as the ctest
// `compute_without_bf16`, with oneDNN limited to AVX2 as on a CPU without bfloat16
// products: there auto must take float32 and bf16 be refused.
#include <dlfcn.h>
#include <link.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "../common/testutil.hpp"
#include "../common/torch_testutil.hpp"
#include "fp8lab/core/dot_model.hpp"
#include "fp8lab/core/format.hpp"
#include "fp8lab/nn/compute.hpp"
#include "fp8lab/nn/ops.hpp"
#include "fp8lab/settings/recipe.hpp"

namespace fp8lab::nn {
namespace {

using test::error_of;

// Whether this process runs with oneDNN limited below AVX512_CORE_BF16.
bool isa_limited() {
  const char* isa = std::getenv("ONEDNN_MAX_CPU_ISA");
  return isa != nullptr && std::strcmp(isa, "AVX2") == 0;
}

// The names of the shared objects loaded in this process.
std::vector<std::string> loaded_objects() {
  std::vector<std::string> names;
  dl_iterate_phdr(
      [](dl_phdr_info* info, std::size_t, void* out) {
        if (info->dlpi_name != nullptr) static_cast<std::vector<std::string>*>(out)->push_back(info->dlpi_name);
        return 0;
      },
      &names);
  return names;
}

bool loaded(const std::vector<std::string>& objects, const std::string& name) {
  return std::any_of(objects.begin(), objects.end(),
                     [&](const std::string& o) { return o.find(name) != std::string::npos; });
}

// Debian's oneDNN 2.x (the bfloat16 products) and the oneDNN 3.x inside libtorch_cpu run in
// one process without meeting (src/nn/onednn/onednn_api.h): libdnnl.so.2 is loaded, yet
// none of its symbols is in the global scope where libtorch's code would bind to them, and
// products on both give their right results one after the other.
TEST(Compute, DebiansOneDnnStaysApartFromLibtorchs) {
  const bool bf16 = bf16_products_available();  // loads libfp8lab_onednn.so
  const auto objects = loaded_objects();
  EXPECT_TRUE(loaded(objects, "libfp8lab_onednn.so"));
  EXPECT_TRUE(loaded(objects, "libdnnl.so.2"));
  EXPECT_TRUE(loaded(objects, "libtorch_cpu.so"));
  // oneDNN 2.x's C interface (dnnl_matmul_desc_init is gone from 3.x) and the weak call_once
  // trampoline both libraries define: neither is found from the global scope.
  EXPECT_EQ(dlsym(RTLD_DEFAULT, "dnnl_matmul_desc_init"), nullptr);
  EXPECT_EQ(dlsym(RTLD_DEFAULT, "dnnl_engine_create"), nullptr);
  torch::manual_seed(3);
  const torch::Tensor a = torch::randint(-8, 8, {64, 96}).to(torch::kFloat),
                      b = torch::randint(-8, 8, {96, 48}).to(torch::kFloat);
  const torch::Tensor want = torch::matmul(a.to(torch::kDouble), b.to(torch::kDouble)).to(torch::kFloat);
  for (int round = 0; round < 2; ++round) {
    // libtorch's own bfloat16 matmul (its oneDNN on this CPU): small integers, exact sums.
    EXPECT_TRUE(test::bit_equal(torch::matmul(a.to(torch::kBFloat16), b.to(torch::kBFloat16)).to(torch::kFloat),
                                want.to(torch::kBFloat16).to(torch::kFloat)));
    if (!bf16) continue;
    Compute taken = Compute::fp32;
    EXPECT_TRUE(test::bit_equal(matmul(a, b, Compute::bf16, &taken), want));
    EXPECT_EQ(taken, Compute::bf16);
  }
}

TEST(Compute, NamesParseAndPrintBack) {
  for (Compute c : {Compute::auto_, Compute::fp32, Compute::bf16}) EXPECT_EQ(parse_compute(to_string(c)), c);
  EXPECT_EQ(to_string(Compute::auto_), "auto");
  const std::string e = error_of([] { (void)parse_compute("fp16"); });
  EXPECT_NE(e.find("'fp16'"), std::string::npos) << e;
  EXPECT_NE(e.find("unknown compute path 'fp16' (known: auto, fp32, bf16)"), std::string::npos) << e;
}

TEST(Compute, ExactInBf16ByMantissaAndRange) {
  for (const char* yes : {"e4m3fn", "e5m2", "1.4.3:10", "1.5.2:33", "e2m1fn", "1.0.7:finite", "bf16"})
    EXPECT_TRUE(exact_in_bf16(parse_format(yes))) << yes;
  // More than 7 mantissa bits; subnormals below 2^-133; a largest value past bfloat16's
  // (fnuz and fn use the top binade, 2^128).
  for (const char* no : {"1.5.10:15", "1.6.9:31", "1.8.7:130", "1.8.7:-2", "1.8.7:127", "1.8.7:127:fn"})
    EXPECT_FALSE(exact_in_bf16(parse_format(no))) << no;
}

// auto takes bf16 exactly where the CPU has it and both operands hold bfloat16 values;
// bf16 refuses the rest with a message; fp32 never takes it.
TEST(Compute, AutoTakesBf16OnlyWhereBothHold) {
  if (isa_limited()) {
    EXPECT_FALSE(bf16_products_available());
  }
  const torch::Tensor exact = torch::ones({4, 3}), inexact = torch::full({3, 2}, 1.0f + 0x1p-10f);
  Compute taken = Compute::auto_;
  (void)matmul(exact, exact.t(), Compute::fp32, &taken);
  EXPECT_EQ(taken, Compute::fp32);
  EXPECT_TRUE(test::bit_equal(matmul(exact, inexact, Compute::auto_, &taken), torch::matmul(exact, inexact)));
  EXPECT_EQ(taken, Compute::fp32);
  (void)matmul(exact, exact.t(), Compute::auto_, &taken);
  if (bf16_products_available()) {
    EXPECT_EQ(taken, Compute::bf16);
    EXPECT_NE(error_of([&] { (void)matmul(exact, inexact, Compute::bf16); }).find("not bfloat16 values"),
              std::string::npos);
    EXPECT_FALSE(matmul_bf16(inexact.t(), exact.t()));  // nothing computed
  } else {
    EXPECT_EQ(taken, Compute::fp32);
    EXPECT_NE(error_of([&] { (void)matmul(exact, exact.t(), Compute::bf16); }).find("no bfloat16 products"), std::string::npos);
  }
}

// Small integers: every product and partial sum is an integer below 2^24, exact in float32
// in any order, so the bfloat16 product must equal float32's bit for bit.
// A dot model (docs/spec.md §7.4) under which products of small integers (up to 64) lose
// bits: terms below an eighth of a group's largest are truncated, the accumulator holds 6
// bits, promoted every 8 products.
constexpr const char* kModel = "dot:group=4:frac=3:align=truncate:acc=6:acc_round=truncate:promote=8";

torch::Tensor small_ints(std::int64_t r, std::int64_t c, std::uint64_t seed) {
  torch::manual_seed(seed);
  return torch::randint(-8, 9, {r, c}).to(torch::kFloat);
}

TEST(Compute, Bf16MatmulOfExactlySummableValuesIsFloat32s) {
  if (!bf16_products_available()) GTEST_SKIP() << "no bfloat16 products on this CPU (covered by the fp32 path)";
  struct Shape {
    std::int64_t m, k, n;
  };
  for (const Shape& s : {Shape{1, 1, 1}, Shape{7, 33, 5}, Shape{64, 256, 48}, Shape{3, 1000, 17}}) {
    const torch::Tensor a = small_ints(s.m, s.k, 1), b = small_ints(s.k, s.n, 2);
    EXPECT_TRUE(test::bit_equal(*matmul_bf16(a, b), torch::matmul(a, b))) << s.m << "x" << s.k << "x" << s.n;
    // Transposed operands as they lie (the backward products' layouts), and the same
    // shape twice (the cached primitive).
    const torch::Tensor at = small_ints(s.k, s.m, 3).t(), bt = small_ints(s.n, s.k, 4).t();
    EXPECT_TRUE(test::bit_equal(*matmul_bf16(at, bt), torch::matmul(at, bt)));
    EXPECT_TRUE(test::bit_equal(*matmul_bf16(at, bt), torch::matmul(at, bt)));
  }
  EXPECT_EQ(matmul_bf16(torch::ones({3, 0}), torch::ones({0, 2}))->sum().item<float>(), 0.0f);
}

// Random bfloat16 values: float32 sums in different orders differ by at most
// k * 2^-24 * sum |a_i b_i| (the classic bound for recursive summation, per order).
TEST(Compute, Bf16MatmulOfRandomBf16ValuesWithinTheSummationBound) {
  if (!bf16_products_available()) GTEST_SKIP() << "no bfloat16 products on this CPU";
  torch::manual_seed(5);
  const std::int64_t m = 40, k = 300, n = 24;
  const torch::Tensor a = torch::randn({m, k}).to(torch::kBFloat16).to(torch::kFloat);
  const torch::Tensor b = torch::randn({k, n}).to(torch::kBFloat16).to(torch::kFloat);
  const torch::Tensor want = torch::matmul(a.to(torch::kDouble), b.to(torch::kDouble));
  const torch::Tensor bound = torch::matmul(a.abs().to(torch::kDouble), b.abs().to(torch::kDouble)) *
                              (2.0 * static_cast<double>(k) * std::ldexp(1.0, -24));
  const torch::Tensor got = matmul_bf16(a, b)->to(torch::kDouble);
  EXPECT_TRUE(((got - want).abs() <= bound).all().item<bool>());
}

// A quantized linear layer with compute = bf16 (and auto) against compute = fp32 on
// small-integer inputs, weights and output gradients with the paper's 8-bit recipe (whose
// values on these inputs are the integers themselves): forward, grad_x and grad_w
// bit-identical, every product counted on the path it took.
TEST(Compute, LinearLayerOnBf16EqualsFloat32OnExactlySummableValues) {
  const LayerQuant q = parse_recipe("a=1.4.3:10,w=1.4.3:14,gx=1.5.2:33,gw=1.5.2:31").base;
  const torch::Tensor x0 = small_ints(6 * 5, 24, 7).reshape({6, 5, 24}), w0 = small_ints(16, 24, 8),
                      b0 = small_ints(1, 16, 9).reshape({16}), r = small_ints(6 * 5, 16, 10).reshape({6, 5, 16});
  struct Out {
    torch::Tensor y, gx, gw, gb;
    std::pair<std::int64_t, std::int64_t> products;
  };
  const auto run = [&](Compute c) {
    auto ctx = std::make_shared<QuantContext>();
    ctx->compute = c;
    auto st = make_layer_state("lin", q, ctx);
    const torch::Tensor x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_(),
                        b = b0.clone().requires_grad_();
    Out o;
    o.y = quant_linear(x, w, b, st);
    const auto g = torch::autograd::grad({(o.y * r).sum()}, {x, w, b});
    o.gx = g[0];
    o.gw = g[1];
    o.gb = g[2];
    o.products = st->products.counts();
    return o;
  };
  const Out want = run(Compute::fp32);
  EXPECT_EQ(want.products, std::make_pair(std::int64_t{0}, std::int64_t{0}));  // libtorch's own path
  for (Compute c : {Compute::auto_, Compute::bf16}) {
    if (c == Compute::bf16 && !bf16_products_available()) continue;
    const Out got = run(c);
    EXPECT_TRUE(test::bit_equal(got.y, want.y)) << to_string(c);
    EXPECT_TRUE(test::bit_equal(got.gx, want.gx)) << to_string(c);
    EXPECT_TRUE(test::bit_equal(got.gw, want.gw)) << to_string(c);
    EXPECT_TRUE(test::bit_equal(got.gb, want.gb)) << to_string(c);
    const std::int64_t on_bf16 = bf16_products_available() ? 3 : 0;
    EXPECT_EQ(got.products, std::make_pair(3 - on_bf16, on_bf16)) << to_string(c);
  }
}

// Batched products (attention's): [2, 3, M, K] x [2, 3, K, N] and transposed operands on
// bf16 equal float32 on small integers; a broadcast batch takes float32 under auto.
TEST(Compute, BatchedMatmulOnBf16EqualsFloat32OnExactlySummableValues) {
  const torch::Tensor a = small_ints(2 * 3 * 5, 7, 11).reshape({2, 3, 5, 7}),
                      b = small_ints(2 * 3 * 7, 4, 12).reshape({2, 3, 7, 4});
  Compute taken = Compute::fp32;
  EXPECT_TRUE(test::bit_equal(matmul(a, b, Compute::auto_, &taken), torch::matmul(a, b)));
  EXPECT_EQ(taken, bf16_products_available() ? Compute::bf16 : Compute::fp32);
  const torch::Tensor at = a.transpose(-2, -1).contiguous().transpose(-2, -1);  // column-major matrices
  EXPECT_TRUE(test::bit_equal(matmul(at, b, Compute::auto_), torch::matmul(at, b)));
  const torch::Tensor b1 = small_ints(7, 4, 13).reshape({1, 1, 7, 4});
  EXPECT_TRUE(test::bit_equal(matmul(a, b1, Compute::auto_, &taken), torch::matmul(a, b1)));
  EXPECT_EQ(taken, Compute::fp32);
  EXPECT_NE(error_of([&] { (void)matmul(a, b1, Compute::bf16); }).find("broadcast"), std::string::npos);
}

// The attention product op with compute = auto against fp32, forward and both gradients.
TEST(Compute, QuantMatmulOnBf16EqualsFloat32OnExactlySummableValues) {
  const LayerQuant q = parse_recipe("a=1.4.3:10,w=1.4.3:14,gx=1.5.2:33,gw=1.5.2:31").base;
  const torch::Tensor a0 = small_ints(2 * 4 * 6, 8, 14).reshape({2, 4, 6, 8}),
                      b0 = small_ints(2 * 4 * 8, 6, 15).reshape({2, 4, 8, 6}),
                      r = small_ints(2 * 4 * 6, 6, 16).reshape({2, 4, 6, 6});
  const auto run = [&](Compute c) {
    auto ctx = std::make_shared<QuantContext>();
    ctx->compute = c;
    auto st = make_layer_state("attn", q, ctx);
    const torch::Tensor a = a0.clone().requires_grad_(), b = b0.clone().requires_grad_();
    const torch::Tensor y = quant_matmul(a, b, st);
    const auto g = torch::autograd::grad({(y * r).sum()}, {a, b});
    return std::vector<torch::Tensor>{y, g[0], g[1]};
  };
  const auto want = run(Compute::fp32), got = run(Compute::auto_);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(test::bit_equal(got[i], want[i])) << i;
}

// Convolutions of every geometry the ops take: plain, strided with right-edge rounding,
// dilated, grouped, depthwise (with a channel multiplier), 1x1, 5x5.
struct Conv {
  std::int64_t n, c, h, w, o, k;
  ConvGeometry g;
};
const Conv kConvs[] = {
    {2, 3, 8, 8, 4, 3, {{1, 1}, {1, 1}, {1, 1}, 1}},  {2, 4, 9, 7, 6, 3, {{2, 2}, {0, 0}, {1, 1}, 2}},
    {1, 8, 10, 10, 8, 3, {{1, 1}, {2, 2}, {2, 2}, 8}}, {3, 16, 6, 6, 32, 1, {{1, 1}, {0, 0}, {1, 1}, 1}},
    {2, 5, 7, 9, 5, 5, {{3, 2}, {2, 1}, {1, 2}, 1}},   {2, 6, 5, 5, 12, 3, {{1, 1}, {1, 1}, {1, 1}, 6}},
    {4, 32, 12, 12, 64, 3, {{1, 1}, {1, 1}, {1, 1}, 1}}};

std::string name_of(const Conv& c) {
  return std::to_string(c.n) + "x" + std::to_string(c.c) + "x" + std::to_string(c.h) + "x" + std::to_string(c.w) +
         " -> " + std::to_string(c.o) + " k" + std::to_string(c.k) + " s" + std::to_string(c.g.stride[0]) + " p" +
         std::to_string(c.g.padding[0]) + " d" + std::to_string(c.g.dilation[0]) + " g" + std::to_string(c.g.groups);
}

std::vector<std::int64_t> v2(const std::array<std::int64_t, 2>& a) { return {a[0], a[1]}; }

// libtorch's float32 forward, backward-data and backward-weights of one convolution.
std::array<torch::Tensor, 3> float32_conv(const Conv& c, const torch::Tensor& x, const torch::Tensor& w,
                                          const torch::Tensor& gy) {
  const torch::Tensor y = torch::conv2d(x, w, {}, v2(c.g.stride), v2(c.g.padding), v2(c.g.dilation), c.g.groups);
  auto [gx, gw, unused] = at::convolution_backward(gy, x, w, std::nullopt, v2(c.g.stride), v2(c.g.padding),
                                                   v2(c.g.dilation), false, {0, 0}, c.g.groups, {true, true, false});
  return {y, gx, gw};
}

torch::Tensor ints(at::IntArrayRef sizes, std::uint64_t seed) {
  torch::manual_seed(seed);
  return torch::randint(-8, 9, sizes).to(torch::kFloat);
}

TEST(Compute, Bf16ConvolutionsOfExactlySummableValuesAreFloat32s) {
  if (!bf16_products_available()) GTEST_SKIP() << "no bfloat16 products on this CPU (covered by the fp32 path)";
  for (const Conv& c : kConvs) {
    const torch::Tensor x = ints({c.n, c.c, c.h, c.w}, 21), w = ints({c.o, c.c / c.g.groups, c.k, c.k}, 22);
    const torch::Tensor y0 = torch::conv2d(x, w, {}, v2(c.g.stride), v2(c.g.padding), v2(c.g.dilation), c.g.groups);
    const torch::Tensor gy = ints(y0.sizes(), 23);
    const auto want = float32_conv(c, x, w, gy);
    for (int again = 0; again < 2; ++again) {  // the second time from the cached primitives
      EXPECT_TRUE(test::bit_equal(*conv2d_bf16(x, w, c.g), want[0])) << name_of(c);
      EXPECT_TRUE(test::bit_equal(*conv2d_input_grad_bf16(gy, w, x.sizes(), c.g), want[1])) << name_of(c);
      EXPECT_TRUE(test::bit_equal(*conv2d_weight_grad_bf16(gy, x, w.sizes(), c.g), want[2])) << name_of(c);
    }
  }
}

// Random bfloat16 values: within k 2^-23 sum |x_i w_i| of the exact sum (k the reduction's
// length), the bound of the matrix products above.
TEST(Compute, Bf16ConvolutionsOfRandomBf16ValuesWithinTheSummationBound) {
  if (!bf16_products_available()) GTEST_SKIP() << "no bfloat16 products on this CPU";
  const Conv c = kConvs[6];
  torch::manual_seed(24);
  const auto bf = [](at::IntArrayRef s) { return torch::randn(s).to(torch::kBFloat16).to(torch::kFloat); };
  const torch::Tensor x = bf({c.n, c.c, c.h, c.w}), w = bf({c.o, c.c, c.k, c.k}), gy = bf({c.n, c.o, c.h, c.w});
  const auto d = [](const torch::Tensor& t) { return t.to(torch::kDouble); };
  const auto exact = [&](const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& g) {
    return float32_conv(c, d(a), d(b), d(g));
  };
  const auto want = exact(x, w, gy), magnitude = exact(x.abs(), w.abs(), gy.abs());
  const double k_fwd = static_cast<double>(c.c * c.k * c.k), k_gx = static_cast<double>(c.o * c.k * c.k),
               k_gw = static_cast<double>(c.n * c.h * c.w), u = std::ldexp(1.0, -23);
  const torch::Tensor got[3] = {*conv2d_bf16(x, w, c.g), *conv2d_input_grad_bf16(gy, w, x.sizes(), c.g),
                                *conv2d_weight_grad_bf16(gy, x, w.sizes(), c.g)};
  const double k[3] = {k_fwd, k_gx, k_gw};
  for (int i = 0; i < 3; ++i)
    EXPECT_TRUE(((d(got[i]) - want[static_cast<std::size_t>(i)]).abs() <= magnitude[static_cast<std::size_t>(i)] * (k[i] * u))
                    .all()
                    .item<bool>())
        << i;
}

// Operands that are not bfloat16 values: nothing computed, auto takes float32, bf16 refuses.
TEST(Compute, ConvolutionOfNonBf16ValuesTakesFloat32UnderAuto) {
  const Conv c = kConvs[0];
  const torch::Tensor x = torch::full({c.n, c.c, c.h, c.w}, 1.0f + 0x1p-12f), w = ints({c.o, c.c, c.k, c.k}, 25);
  Compute taken = Compute::bf16;
  EXPECT_TRUE(test::bit_equal(conv2d(x, w, c.g, Compute::auto_, &taken),
                              torch::conv2d(x, w, {}, v2(c.g.stride), v2(c.g.padding), v2(c.g.dilation))));
  EXPECT_EQ(taken, Compute::fp32);
  if (bf16_products_available()) {
    EXPECT_FALSE(conv2d_bf16(x, w, c.g));
    EXPECT_NE(error_of([&] { (void)conv2d(x, w, c.g, Compute::bf16); }).find("not bfloat16 values"), std::string::npos);
  } else {
    EXPECT_NE(error_of([&] { (void)conv2d(w, w, c.g, Compute::bf16); }).find("no bfloat16 products"),
              std::string::npos);
  }
}

// The quantized convolution op with compute = auto and bf16 against fp32 on small
// integers, every geometry: forward, grad_x, grad_w and the bias gradient bit-identical,
// each of the three products counted on the path it took.
TEST(Compute, ConvolutionLayerOnBf16EqualsFloat32OnExactlySummableValues) {
  const LayerQuant q = parse_recipe("a=1.4.3:10,w=1.4.3:14,gx=1.5.2:33,gw=1.5.2:31").base;
  for (const Conv& c : kConvs) {
    const torch::Tensor x0 = ints({c.n, c.c, c.h, c.w}, 26), w0 = ints({c.o, c.c / c.g.groups, c.k, c.k}, 27),
                        b0 = ints({c.o}, 28);
    const torch::Tensor r =
        ints(torch::conv2d(x0, w0, {}, v2(c.g.stride), v2(c.g.padding), v2(c.g.dilation), c.g.groups).sizes(), 29);
    const auto run = [&](Compute compute) {
      auto ctx = std::make_shared<QuantContext>();
      ctx->compute = compute;
      auto st = make_layer_state("conv", q, ctx);
      const torch::Tensor x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_(),
                          b = b0.clone().requires_grad_();
      const torch::Tensor y =
          quant_conv2d(x, w, b, v2(c.g.stride), v2(c.g.padding), v2(c.g.dilation), c.g.groups, st);
      const auto g = torch::autograd::grad({(y * r).sum()}, {x, w, b});
      return std::make_pair(std::vector<torch::Tensor>{y, g[0], g[1], g[2]}, st->products.counts());
    };
    const auto want = run(Compute::fp32);
    for (Compute compute : {Compute::auto_, Compute::bf16}) {
      if (compute == Compute::bf16 && !bf16_products_available()) continue;
      const auto got = run(compute);
      for (std::size_t i = 0; i < 4; ++i)
        EXPECT_TRUE(test::bit_equal(got.first[i], want.first[i])) << name_of(c) << " " << to_string(compute) << " " << i;
      const std::int64_t on_bf16 = bf16_products_available() ? 3 : 0;
      EXPECT_EQ(got.second, std::make_pair(3 - on_bf16, on_bf16)) << name_of(c);
    }
  }
}

}  // namespace
}  // namespace fp8lab::nn

namespace fp8lab::nn {
namespace {

TEST(Accumulation, NamesParseAndPrintBack) {
  for (const char* s : {"fp32", "1.5.2:ieee@32", "1.8.10@128", "1.5.2:14@1"})  // canonical names print back
    EXPECT_EQ(to_string(parse_accumulation(s)), s);
  EXPECT_EQ(parse_accumulation("e5m2@32"), parse_accumulation("1.5.2:ieee@32"));
  EXPECT_FALSE(parse_accumulation("fp32").chunked());
  EXPECT_EQ(parse_accumulation("1.8.10@128").chunk, 128);
  for (const char* bad : {"e5m2", "e5m2@0", "e5m2@-3", "e5m2@x", "e5m2@", "bogus@4", "@4"}) {
    const std::string e = error_of([&] { (void)parse_accumulation(bad); });
    EXPECT_NE(e.find(std::string("'") + bad + "'"), std::string::npos) << e;
  }
}

// Under a dot model (docs/spec.md §7.4), each output is model_dot of its row and column
// (model_dot is checked against the definition in tests/kernels/dot_model_test.cpp).
torch::Tensor modelled_reference(const torch::Tensor& a, const torch::Tensor& b, const DotModel& m) {
  const torch::Tensor ac = a.contiguous(), bc = b.contiguous();
  const std::int64_t rows = a.size(0), k = a.size(1), n = b.size(1);
  torch::Tensor y = torch::empty({rows, n});
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < n; ++j)
      y[i][j] = model_dot(ac.data_ptr<float>() + i * k, 1, bc.data_ptr<float>() + j, n, k, m);
  return y;
}

// The slow reference of docs/spec.md §7.3 for integer-valued operands (every chunk's sum
// is exact in double and in float32): per output, each chunk's sum rounded by the scalar
// quantizer, the rounded sums added in float32 in chunk order.
torch::Tensor chunked_reference(const torch::Tensor& a, const torch::Tensor& b, const Accumulation& acc) {
  if (acc.model) return modelled_reference(a, b, *acc.model);
  QuantSpec q;
  q.format = acc.partial;
  const auto A = a.accessor<float, 2>(), B = b.accessor<float, 2>();
  const std::int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  torch::Tensor y = torch::empty({m, n});
  auto Y = y.accessor<float, 2>();
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      float sum = 0;
      for (std::int64_t at = 0; at < k; at += acc.chunk) {
        double part = 0;
        for (std::int64_t t = at; t < std::min(k, at + acc.chunk); ++t) part += double(A[i][t]) * double(B[t][j]);
        const float rounded = quantize(static_cast<float>(part), q, 0);
        sum = at == 0 ? rounded : sum + rounded;
      }
      Y[i][j] = sum;
    }
  return y;
}

TEST(Accumulation, ChunkedProductsEqualTheSlowReference) {
  const Accumulation acc = parse_accumulation("1.5.2:15@8");  // 2 mantissa bits: partial sums round
  const torch::Tensor a = small_ints(9, 37, 31), b = small_ints(37, 6, 32);  // 4 chunks of 8 and one of 5
  const torch::Tensor want = chunked_reference(a, b, acc);
  EXPECT_FALSE(torch::equal(want, torch::matmul(a, b)));  // the rounding of the chunks shows
  for (Compute c : {Compute::fp32, Compute::auto_, Compute::bf16}) {
    if (c == Compute::bf16 && !bf16_products_available()) continue;
    Compute taken = Compute::auto_;
    EXPECT_TRUE(test::bit_equal(matmul(a, b, c, &taken, acc), want)) << to_string(c);
    EXPECT_EQ(taken, c == Compute::fp32 || !bf16_products_available() ? Compute::fp32 : Compute::bf16);
    // Transposed operands and batches of matrices: the same chunks of the same sums.
    EXPECT_TRUE(test::bit_equal(matmul(a.t().contiguous().t(), b.t().contiguous().t(), c, nullptr, acc), want));
    const torch::Tensor batched = matmul(torch::stack({a, a}), torch::stack({b, b}), c, nullptr, acc);
    EXPECT_TRUE(test::bit_equal(batched[1], want)) << to_string(c);
  }
  // One chunk covering the whole sum: the float32 product rounded once.
  const Accumulation whole = parse_accumulation("1.5.2:15@64");
  QuantSpec q;
  q.format = whole.partial;
  EXPECT_TRUE(test::bit_equal(matmul(a, b, Compute::fp32, nullptr, whole), fake_quantize(torch::matmul(a, b), q, 0)));
}

// Under a dot model every output is model_dot of its row and column, whatever the compute
// setting (reported as fp32), for plain, transposed, batched and broadcast operands and
// vectors.
TEST(Accumulation, DotModelProductsAreModelDotPerOutput) {
  const Accumulation acc = parse_accumulation(kModel);
  const torch::Tensor a = small_ints(9, 37, 31), b = small_ints(37, 6, 32);
  const torch::Tensor want = modelled_reference(a, b, *acc.model);
  EXPECT_FALSE(torch::equal(want, torch::matmul(a, b)));  // the model's truncation shows
  for (Compute c : {Compute::fp32, Compute::auto_, Compute::bf16}) {
    Compute taken = Compute::auto_;
    EXPECT_TRUE(test::bit_equal(matmul(a, b, c, &taken, acc), want)) << to_string(c);
    EXPECT_EQ(taken, Compute::fp32);
    EXPECT_TRUE(test::bit_equal(matmul(a.t().contiguous().t(), b.t().contiguous().t(), c, nullptr, acc), want));
    EXPECT_TRUE(test::bit_equal(matmul(torch::stack({a, a}), torch::stack({b, b}), c, nullptr, acc)[1], want));
    EXPECT_TRUE(test::bit_equal(matmul(torch::stack({a, a}), b, c, nullptr, acc)[0], want));  // broadcast
    EXPECT_TRUE(test::bit_equal(matmul(a[2], b, c, nullptr, acc), want[2]));                    // vector
  }
  EXPECT_EQ(to_string(acc), kModel);
  EXPECT_EQ(to_string(parse_accumulation("hopper-fp8")), "hopper-fp8");
  EXPECT_FALSE(acc.plain() || acc.chunked());
  EXPECT_NE(error_of([] { (void)parse_accumulation("dot:frac=200"); }).find("accumulation 'dot:frac=200': dot model"),
            std::string::npos);
  EXPECT_NE(error_of([] { (void)parse_accumulation("hoper-fp8"); }).find("a dot model, hopper-fp8"), std::string::npos);
}

// A linear layer under a chunked accumulation: its three products (forward over the input
// features, grad_x over the output features, grad_w over the batch) each as the reference.
TEST(Accumulation, LinearLayerAccumulatesEveryProductInChunks) {
  for (const char* spec : {"1.4.3:7@5", kModel}) {
  // Formats that hold every small integer (no saturation), so that the operands are x0,
  // w0 and r themselves.
  const LayerQuant q = parse_recipe("a=1.4.3:10,w=1.4.3:10,gx=1.5.2:15,gw=fp32").base;
  const Accumulation acc = parse_accumulation(spec);
  const torch::Tensor x0 = small_ints(12, 23, 33), w0 = small_ints(7, 23, 34), r = small_ints(12, 7, 35);
  auto ctx = std::make_shared<QuantContext>();
  ctx->accumulate = acc;
  auto st = make_layer_state("lin", q, ctx);
  const torch::Tensor x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_();
  const torch::Tensor y = quant_linear(x, w, torch::Tensor(), st);
  const auto g = torch::autograd::grad({(y * r).sum()}, {x, w});
  EXPECT_TRUE(test::bit_equal(y, chunked_reference(x0, w0.t().contiguous(), acc)));
  EXPECT_TRUE(test::bit_equal(g[0], chunked_reference(r, w0, acc)));
  EXPECT_TRUE(test::bit_equal(g[1], chunked_reference(r.t().contiguous(), x0, acc)));
  EXPECT_FALSE(torch::equal(y, torch::matmul(x0, w0.t())));  // the accumulation shows
  EXPECT_EQ(st->products.counts().first + st->products.counts().second, 3);
  }
}

// The slow reference of a chunked sum (docs/spec.md §7.3) of integer-valued terms: each
// chunk's sum (exact in double and in float32) rounded by the scalar quantizer, the rounded
// sums added in float32 in chunk order.
float chunked_sum(const std::vector<double>& terms, const Accumulation& acc) {
  if (acc.model) {  // the terms (exact products of small integers) as a times ones
    const std::vector<float> a(terms.begin(), terms.end()), ones(terms.size(), 1.0f);
    return model_dot(a.data(), 1, ones.data(), 1, static_cast<std::int64_t>(a.size()), *acc.model);
  }
  QuantSpec q;
  q.format = acc.partial;
  float sum = 0;
  for (std::size_t at = 0; at < terms.size(); at += static_cast<std::size_t>(acc.chunk)) {
    double part = 0;
    for (std::size_t t = at; t < std::min(terms.size(), at + static_cast<std::size_t>(acc.chunk)); ++t) part += terms[t];
    const float rounded = quantize(static_cast<float>(part), q, 0);
    sum = at == 0 ? rounded : sum + rounded;
  }
  return sum;
}

// A convolution's three products with a chunked accumulation, by direct loops over the
// definition of docs/spec.md §7.3 (no im2col): the forward sums over (channel, ky, kx) of
// the output's group; grad_w's over (image, output row, output column); grad_x's over the
// output channels of the group, one sum per kernel tap that reads the input position, the
// taps' sums added in float32 in (ky, kx) order.
std::array<torch::Tensor, 3> chunked_conv_reference(const Conv& c, const torch::Tensor& x, const torch::Tensor& w,
                                                    const torch::Tensor& gy, const Accumulation& acc) {
  const std::int64_t cg = c.c / c.g.groups, og = c.o / c.g.groups, ho = gy.size(2), wo = gy.size(3);
  const auto X = x.accessor<float, 4>(), W = w.accessor<float, 4>(), G = gy.accessor<float, 4>();
  // The input a tap meets at an output position (0 in the padding).
  const auto input = [&](std::int64_t n, std::int64_t ch, std::int64_t oy, std::int64_t ox, std::int64_t ky,
                         std::int64_t kx) -> double {
    const std::int64_t iy = oy * c.g.stride[0] - c.g.padding[0] + ky * c.g.dilation[0];
    const std::int64_t ix = ox * c.g.stride[1] - c.g.padding[1] + kx * c.g.dilation[1];
    return iy < 0 || iy >= c.h || ix < 0 || ix >= c.w ? 0.0 : X[n][ch][iy][ix];
  };
  torch::Tensor y = torch::empty(gy.sizes()), dx = torch::empty(x.sizes()), dw = torch::empty(w.sizes());
  auto Y = y.accessor<float, 4>(), DX = dx.accessor<float, 4>(), DW = dw.accessor<float, 4>();
  std::vector<double> terms;
  for (std::int64_t n = 0; n < c.n; ++n)
    for (std::int64_t o = 0; o < c.o; ++o)
      for (std::int64_t oy = 0; oy < ho; ++oy)
        for (std::int64_t ox = 0; ox < wo; ++ox) {
          terms.clear();
          for (std::int64_t ci = 0; ci < cg; ++ci)
            for (std::int64_t ky = 0; ky < c.k; ++ky)
              for (std::int64_t kx = 0; kx < c.k; ++kx)
                terms.push_back(W[o][ci][ky][kx] * input(n, o / og * cg + ci, oy, ox, ky, kx));
          Y[n][o][oy][ox] = chunked_sum(terms, acc);
        }
  for (std::int64_t o = 0; o < c.o; ++o)
    for (std::int64_t ci = 0; ci < cg; ++ci)
      for (std::int64_t ky = 0; ky < c.k; ++ky)
        for (std::int64_t kx = 0; kx < c.k; ++kx) {
          terms.clear();
          for (std::int64_t n = 0; n < c.n; ++n)
            for (std::int64_t oy = 0; oy < ho; ++oy)
              for (std::int64_t ox = 0; ox < wo; ++ox)
                terms.push_back(G[n][o][oy][ox] * input(n, o / og * cg + ci, oy, ox, ky, kx));
          DW[o][ci][ky][kx] = chunked_sum(terms, acc);
        }
  // The output position (or -1) from which tap k reads input position i along one axis.
  const auto reader = [&](std::int64_t i, std::int64_t k, int axis, std::int64_t out) -> std::int64_t {
    const std::int64_t at = i + c.g.padding[axis] - k * c.g.dilation[axis];
    if (at < 0 || at % c.g.stride[axis] != 0 || at / c.g.stride[axis] >= out) return -1;
    return at / c.g.stride[axis];
  };
  for (std::int64_t n = 0; n < c.n; ++n)
    for (std::int64_t ch = 0; ch < c.c; ++ch)
      for (std::int64_t iy = 0; iy < c.h; ++iy)
        for (std::int64_t ix = 0; ix < c.w; ++ix) {
          float total = 0;
          for (std::int64_t ky = 0; ky < c.k; ++ky)
            for (std::int64_t kx = 0; kx < c.k; ++kx) {
              const std::int64_t oy = reader(iy, ky, 0, ho), ox = reader(ix, kx, 1, wo);
              if (oy < 0 || ox < 0) continue;
              terms.clear();
              for (std::int64_t ol = 0; ol < og; ++ol) {
                const std::int64_t o = ch / cg * og + ol;
                terms.push_back(double(W[o][ch % cg][ky][kx]) * G[n][o][oy][ox]);
              }
              total += chunked_sum(terms, acc);
            }
          DX[n][ch][iy][ix] = total;
        }
  return {y, dx, dw};
}

// Every geometry, each compute path: the three products bit-identical to the reference,
// each on the path it reports.
TEST(Accumulation, ChunkedConvolutionsEqualTheSlowReference) {
  for (const char* spec : {"1.5.2:15@5", kModel})
  for (const Conv& c : kConvs) {
    const Accumulation acc = parse_accumulation(spec);
    const torch::Tensor x = ints({c.n, c.c, c.h, c.w}, 41), w = ints({c.o, c.c / c.g.groups, c.k, c.k}, 42);
    const torch::Tensor gy = ints(
        torch::conv2d(x, w, {}, v2(c.g.stride), v2(c.g.padding), v2(c.g.dilation), c.g.groups).sizes(), 43);
    const auto want = chunked_conv_reference(c, x, w, gy, acc);
    if (c.c == 32) {  // the rounding of the chunks shows in all three
      const auto plain = float32_conv(c, x, w, gy);
      for (std::size_t i = 0; i < 3; ++i) EXPECT_FALSE(torch::equal(want[i], plain[i])) << i;
    }
    for (Compute compute : {Compute::fp32, Compute::auto_, Compute::bf16}) {
      if (compute == Compute::bf16 && !bf16_products_available()) continue;
      const Compute expect =
          compute == Compute::fp32 || !bf16_products_available() || acc.model ? Compute::fp32 : Compute::bf16;
      Compute taken = Compute::auto_;
      const torch::Tensor y = conv2d(x, w, c.g, compute, &taken, acc);
      EXPECT_TRUE(test::bit_equal(y, want[0])) << name_of(c) << " " << to_string(compute);
      EXPECT_TRUE(y.is_contiguous(torch::MemoryFormat::ChannelsLast)) << name_of(c);
      EXPECT_EQ(taken, expect);
      const ConvGrads g = conv2d_backward(gy, gy, x, w, c.g, compute, true, true, acc);
      EXPECT_TRUE(test::bit_equal(g.dx, want[1])) << name_of(c) << " " << to_string(compute);
      EXPECT_TRUE(test::bit_equal(g.dw, want[2])) << name_of(c) << " " << to_string(compute);
      EXPECT_EQ(g.dx_path, expect);
      EXPECT_EQ(g.dw_path, expect);
    }
  }
}

// The quantized convolution op under a chunked accumulation, with compute = fp32 (which
// then runs through the compute layer too): forward, grad_x and grad_w as the reference,
// the bias gradient the float32 sum of the gradient, three products counted.
TEST(Accumulation, ConvolutionLayerAccumulatesEveryProductInChunks) {
  for (const char* spec : {"1.4.3:7@4", kModel}) {
  // Formats that hold every small integer, so that the operands are x0, w0 and r themselves.
  const LayerQuant q = parse_recipe("a=1.4.3:10,w=1.4.3:10,gx=1.5.2:15,gw=fp32").base;
  const Accumulation acc = parse_accumulation(spec);
  const Conv c = kConvs[1];  // strided, grouped, with a right edge the stride leaves out
  const torch::Tensor x0 = ints({c.n, c.c, c.h, c.w}, 44), w0 = ints({c.o, c.c / c.g.groups, c.k, c.k}, 45),
                      b0 = ints({c.o}, 46);
  const torch::Tensor r =
      ints(torch::conv2d(x0, w0, {}, v2(c.g.stride), v2(c.g.padding), v2(c.g.dilation), c.g.groups).sizes(), 47);
  const auto want = chunked_conv_reference(c, x0, w0, r, acc);
  for (Compute compute : {Compute::fp32, Compute::auto_}) {
    auto ctx = std::make_shared<QuantContext>();
    ctx->compute = compute;
    ctx->accumulate = acc;
    auto st = make_layer_state("stem.conv", q, ctx);
    const torch::Tensor x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_(),
                        b = b0.clone().requires_grad_();
    const torch::Tensor y = quant_conv2d(x, w, b, v2(c.g.stride), v2(c.g.padding), v2(c.g.dilation), c.g.groups, st);
    const auto g = torch::autograd::grad({(y * r).sum()}, {x, w, b});
    EXPECT_TRUE(test::bit_equal(y, want[0] + b0.reshape({1, -1, 1, 1}))) << to_string(compute);
    EXPECT_TRUE(test::bit_equal(g[0], want[1])) << to_string(compute);
    EXPECT_TRUE(test::bit_equal(g[1], want[2])) << to_string(compute);
    EXPECT_TRUE(test::bit_equal(g[2], r.sum({0, 2, 3}))) << to_string(compute);
    EXPECT_EQ(st->products.counts().first + st->products.counts().second, 3);
  }
  }
}

}  // namespace
}  // namespace fp8lab::nn
