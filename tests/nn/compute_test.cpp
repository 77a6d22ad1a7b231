// The compute layer (docs/spec.md §7): names, the bfloat16 exactness rule, the choice of
// path, and bfloat16 products against float32 ones. This file also runs as the ctest
// `compute_without_bf16`, with oneDNN limited to AVX2 as on a CPU without bfloat16
// products: there auto must take float32 and bf16 be refused.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "../common/testutil.hpp"
#include "../common/torch_testutil.hpp"
#include "fp8lab/core/format.hpp"
#include "fp8lab/nn/compute.hpp"
#include "fp8lab/nn/ops.hpp"
#include "fp8lab/nn/recipe.hpp"

namespace fp8lab::nn {
namespace {

using test::error_of;

// Whether this process runs with oneDNN limited below AVX512_CORE_BF16.
bool isa_limited() {
  const char* isa = std::getenv("ONEDNN_MAX_CPU_ISA");
  return isa != nullptr && std::strcmp(isa, "AVX2") == 0;
}

TEST(Compute, NamesParseAndPrintBack) {
  for (Compute c : {Compute::auto_, Compute::fp32, Compute::bf16}) EXPECT_EQ(parse_compute(to_string(c)), c);
  EXPECT_EQ(to_string(Compute::auto_), "auto");
  const std::string e = error_of([] { (void)parse_compute("fp16"); });
  EXPECT_NE(e.find("'fp16'"), std::string::npos) << e;
  EXPECT_NE(e.find("auto, fp32 or bf16"), std::string::npos) << e;
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
    EXPECT_NE(error_of([&] { (void)matmul(exact, exact.t(), Compute::bf16); }).find("has none"), std::string::npos);
  }
}

// Small integers: every product and partial sum is an integer below 2^24, exact in float32
// in any order, so the bfloat16 product must equal float32's bit for bit.
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
    o.products = st->products();
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

}  // namespace
}  // namespace fp8lab::nn
