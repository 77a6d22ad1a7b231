// Training semantics of scaled quantizers (docs/spec.md §6.6): every operand of every product
// is quantized from float32 with its blocks along that product's reduction dimension. The
// expected results are built from the scalar reference on matrices laid out by explicit
// index loops (not by the ops' MatrixView code) and composed with libtorch's own ops.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "../common/testutil.hpp"
#include "../common/torch_testutil.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>

#include "fp8lab/core/scaled.hpp"
#include "fp8lab/nn/compute.hpp"
#include "fp8lab/nn/ops.hpp"

using namespace fp8lab;
using namespace fp8lab::nn;

namespace {

using fp8lab::test::bit_equal;
using fp8lab::test::error_of;

// A matrix [rows, cols] whose element (r, c) is t's element at flat index at(r, c); quantized
// by the scalar reference; scattered back to t's shape through the same index map.
using IndexMap = std::function<std::int64_t(std::int64_t r, std::int64_t c)>;
// With `unit` (the operand of a product that applies the tensor scale to its output,
// docs/spec.md §6.7): the values without the tensor scale, which goes to *ts.
torch::Tensor ref_quantize(const torch::Tensor& t, std::int64_t rows, std::int64_t cols, const IndexMap& at,
                           const ScaledSpec& s, ScaledCall call = {}, float* ts = nullptr) {
  const torch::Tensor x = t.contiguous();
  const float* p = x.data_ptr<float>();
  std::vector<float> m(static_cast<std::size_t>(rows * cols)), y(m.size());
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) m[static_cast<std::size_t>(r * cols + c)] = p[at(r, c)];
  ScaledOut to{y.data()};
  to.tensor_scale = ts;
  to.without_tensor_scale = ts != nullptr;
  scaled_quantize_reference(m.data(), static_cast<std::size_t>(rows), static_cast<std::size_t>(cols), s, to, call);
  torch::Tensor out = torch::empty_like(x);
  float* q = out.data_ptr<float>();
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) q[at(r, c)] = y[static_cast<std::size_t>(r * cols + c)];
  return out;
}

LayerQuant all(const std::string& spec, const std::string& gw = "fp32") {
  return parse_recipe("a=" + spec + ",w=" + spec + ",gx=" + spec + ",gw=" + gw).base;
}

}  // namespace

TEST(ScaledOps, LinearQuantizesEachOperandAlongEachProductsReduction) {
  torch::manual_seed(3);
  const std::int64_t N = 6, in = 40, out = 24;  // 40 = 16 + 16 + 8: a short block per row
  const torch::Tensor x0 = torch::randn({N, in}) * 3, w0 = torch::randn({out, in}), b = torch::randn({out});
  const torch::Tensor g = torch::randn({N, out}) * 1e-3;
  for (const bool save_codes : {true, false}) {
    const std::string spec = "e2m1fn@1x16:e8m0:ceil";
    const ScaledSpec s = parse_scaled(spec);
    auto ctx = std::make_shared<QuantContext>();
    ctx->save_codes = ctx->save_weight_codes = save_codes;
    auto st = make_layer_state("lin", all(spec, spec), ctx);
    const torch::Tensor x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_();
    const torch::Tensor y = quant_linear(x, w, b, st);
    const auto grads = torch::autograd::grad({(y * g).sum()}, {x, w});

    const auto row_major = [](std::int64_t cols) { return [cols](std::int64_t r, std::int64_t c) { return r * cols + c; }; };
    const auto transposed = [](std::int64_t cols) { return [cols](std::int64_t r, std::int64_t c) { return c * cols + r; }; };
    // Forward: both along `in`.
    const torch::Tensor xf = ref_quantize(x0, N, in, row_major(in), s), wf = ref_quantize(w0, out, in, row_major(in), s);
    EXPECT_TRUE(bit_equal(y, torch::linear(xf, wf, b))) << "save_codes " << save_codes;
    // grad_x = g w: g and w along `out`.
    const torch::Tensor gd = ref_quantize(g, N, out, row_major(out), s), wb = ref_quantize(w0, in, out, transposed(in), s);
    EXPECT_TRUE(bit_equal(grads[0], gd.mm(wb)));
    // grad_w = g^T x: g and x along the batch; then Q_gw along `in`.
    const torch::Tensor gb = ref_quantize(g, out, N, transposed(out), s), xb = ref_quantize(x0, in, N, transposed(in), s);
    const torch::Tensor dw = xb.t().mm(gb).t().contiguous();
    EXPECT_TRUE(bit_equal(grads[1], ref_quantize(dw, out, in, row_major(in), s)));
    // What backward kept: the codes and one 4-byte scale per block of x^T [40, 6], and of w^T [40, 24].
    if (save_codes) {
      EXPECT_EQ(ctx->saved_bytes.load(), in * N + in * 1 * 4);
      EXPECT_EQ(ctx->saved_weight_bytes.load(), in * out + in * 2 * 4);
    } else {
      EXPECT_EQ(ctx->saved_bytes.load(), in * N * 4);
    }
  }
}

TEST(ScaledOps, GroupedConvBlocksAlongInputChannelsAndBatchPositions) {
  torch::manual_seed(4);
  const std::int64_t N = 2, C = 4, H = 5, W = 5, O = 6, G = 2, Cg = C / G, K = 3, Og = O / G;
  const torch::Tensor x0 = torch::randn({N, C, H, W}), w0 = torch::randn({O, Cg, K, K}) * 0.2;
  const torch::Tensor g = torch::randn({N, O, H, W}) * 1e-2;
  const std::string spec = "e4m3fn@1x4:e8m0:floor";
  const ScaledSpec s = parse_scaled(spec);
  auto st = make_layer_state("conv", all(spec), nullptr);
  const torch::Tensor x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_();
  const torch::Tensor y = quant_conv2d(x, w, {}, {1, 1}, {1, 1}, {1, 1}, G, st);
  const auto grads = torch::autograd::grad({(y * g).sum()}, {x, w});

  const auto nchw = [&](std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t ww, std::int64_t ch) {
    return ((n * ch + c) * H + h) * W + ww;
  };
  const auto position = [&](std::int64_t p, std::int64_t& n, std::int64_t& h, std::int64_t& ww) {
    n = p / (H * W);
    h = p / W % H;
    ww = p % W;
  };
  // Activations and gradients: [positions, channels] and [channels, positions].
  const auto by_channels = [&](std::int64_t ch) {
    return [&, ch](std::int64_t r, std::int64_t c) {
      std::int64_t n, h, ww;
      position(r, n, h, ww);
      return nchw(n, c, h, ww, ch);
    };
  };
  const auto by_positions = [&](std::int64_t ch) {
    return [&, ch](std::int64_t r, std::int64_t c) {
      std::int64_t n, h, ww;
      position(c, n, h, ww);
      return nchw(n, r, h, ww, ch);
    };
  };
  // Weights: forward rows o, columns (i, j, c); grad_x rows (group, c), columns (i, j, o in group).
  const auto w_forward = [&](std::int64_t o, std::int64_t k) {
    const std::int64_t i = k / (K * Cg), j = k / Cg % K, c = k % Cg;
    return ((o * Cg + c) * K + i) * K + j;
  };
  const auto w_grad_x = [&](std::int64_t r, std::int64_t k) {
    const std::int64_t gi = r / Cg, c = r % Cg, i = k / (K * Og), j = k / Og % K, o = gi * Og + k % Og;
    return ((o * Cg + c) * K + i) * K + j;
  };
  const std::int64_t P = N * H * W;
  const torch::Tensor xf = ref_quantize(x0, P, C, by_channels(C), s);
  const torch::Tensor wf = ref_quantize(w0, O, K * K * Cg, w_forward, s);
  EXPECT_TRUE(bit_equal(y, torch::conv2d(xf, wf, {}, {1, 1}, {1, 1}, {1, 1}, G)));
  const torch::Tensor xb = ref_quantize(x0, C, P, by_positions(C), s);
  const torch::Tensor wb = ref_quantize(w0, G * Cg, K * K * Og, w_grad_x, s);
  const torch::Tensor gd = ref_quantize(g, P, O, by_channels(O), s), gb = ref_quantize(g, O, P, by_positions(O), s);
  const auto backward = [&](const torch::Tensor& gq, bool dx, bool dw) {
    return at::convolution_backward(gq, xb, wb, std::nullopt, {1, 1}, {1, 1}, {1, 1}, false, {0, 0}, G,
                                    {dx, dw, false});
  };
  EXPECT_TRUE(bit_equal(grads[0], std::get<0>(backward(gd, true, false))));
  EXPECT_TRUE(bit_equal(grads[1], std::get<1>(backward(gb, false, true))));  // gw: float32
}

TEST(ScaledOps, MatmulBlocksAlongKForwardAndAlongTheOtherDimensionsBackward) {
  torch::manual_seed(5);
  const std::int64_t B = 2, M = 5, Kd = 8, Nd = 6;
  const torch::Tensor a0 = torch::randn({B, M, Kd}), b0 = torch::randn({B, Kd, Nd}), g = torch::randn({B, M, Nd});
  const std::string spec = "e4m3fn@1x4:e8m0:ceil";
  const ScaledSpec s = parse_scaled(spec);
  auto st = make_layer_state("attn", all(spec), nullptr);
  const torch::Tensor a = a0.clone().requires_grad_(), b = b0.clone().requires_grad_();
  const torch::Tensor y = quant_matmul(a, b, st);
  const auto grads = torch::autograd::grad({(y * g).sum()}, {a, b});
  // [batch * rows, cols] of a [B, R, C] tensor as stored, and of its transpose.
  const auto plain = [](std::int64_t cols) { return [cols](std::int64_t r, std::int64_t c) { return r * cols + c; }; };
  const auto swapped = [](std::int64_t R, std::int64_t C) {
    return [R, C](std::int64_t r, std::int64_t c) { return (r / C) * R * C + c * C + r % C; };
  };
  const torch::Tensor af = ref_quantize(a0, B * M, Kd, plain(Kd), s), bf = ref_quantize(b0, B * Nd, Kd, swapped(Kd, Nd), s);
  EXPECT_TRUE(bit_equal(y, af.matmul(bf)));
  const torch::Tensor gd = ref_quantize(g, B * M, Nd, plain(Nd), s), bb = ref_quantize(b0, B * Kd, Nd, plain(Nd), s);
  EXPECT_TRUE(bit_equal(grads[0], gd.matmul(bb.transpose(-2, -1))));
  const torch::Tensor ab = ref_quantize(a0, B * Kd, M, swapped(M, Kd), s), gb = ref_quantize(g, B * Nd, M, swapped(M, Nd), s);
  EXPECT_TRUE(bit_equal(grads[1], ab.transpose(-2, -1).matmul(gb)));
}

TEST(ScaledOps, DelayedScalingUsesTheHistoryAndKeepsIt) {
  const std::string spec = "e4m3fn@tensor:fp32:nearest:delayed-2";
  const ScaledSpec s = parse_scaled(spec);
  auto ctx = std::make_shared<QuantContext>();
  auto st = make_layer_state("lin", parse_recipe("a=" + spec).base, ctx);
  const torch::Tensor w = torch::eye(4);
  const auto x_with_amax = [](float amax) { return torch::tensor({0.3f, -amax, 0.01f, 0.7f}).reshape({1, 4}); };
  const auto row = [](std::int64_t r, std::int64_t c) { return r * 4 + c; };
  std::vector<torch::Tensor> outputs;
  for (float amax : {1.0f, 4.0f, 2.0f, 1.5f}) {
    outputs.push_back(quant_linear(x_with_amax(amax), w, {}, st));
    ctx->step += 1;
  }
  // Step 0 has no history (current amax 1); then the largest of the last two steps' amaxes.
  const float used[] = {1.0f, 1.0f, 4.0f, 4.0f};
  const float amaxes[] = {1.0f, 4.0f, 2.0f, 1.5f};
  for (int i = 0; i < 4; ++i) {
    ScaledCall call;
    if (i > 0) call.delayed_amax = used[i];
    const torch::Tensor want = ref_quantize(x_with_amax(amaxes[i]), 1, 4, row, s, call).mm(w.t());
    EXPECT_TRUE(bit_equal(outputs[static_cast<std::size_t>(i)], want)) << "step " << i;
  }
  const auto h = st->amax.get();
  ASSERT_EQ(h.size(), 1u);
  EXPECT_EQ(h[0].kind, TensorKind::a);
  EXPECT_EQ(h[0].amaxes, (std::vector<float>{2.0f, 1.5f}));
  // A second layer given the history scales as the first does; evaluation leaves it alone.
  auto other = make_layer_state("lin", parse_recipe("a=" + spec).base, ctx);
  other->amax.restore(h);
  ctx->recording = false;
  EXPECT_TRUE(bit_equal(quant_linear(x_with_amax(0.5f), w, {}, st), quant_linear(x_with_amax(0.5f), w, {}, other)));
  EXPECT_EQ(st->amax.get(), h);
  auto fixed = make_layer_state("lin", parse_recipe("a=e4m3fn@tensor:fp32:nearest").base, ctx);
  EXPECT_THROW(fixed->amax.restore(h), Error);
}

TEST(ScaledOps, StatisticsHoldTheGroupFiguresAndTheScales) {
  auto ctx = std::make_shared<QuantContext>();
  ctx->stats_interval = 1;
  auto st = make_layer_state("lin", parse_recipe("a=e2m1fn@1x16:e8m0:floor,w=mxfp8_e4m3").base, ctx);
  torch::Tensor x = torch::zeros({3, 40});
  x[0].fill_(1.0f);            // 1 = 2^0: scale 2^(0 - 2) for E2M1 (emax 2)
  x[1][5] = 7.0f;              // amax 7 -> 2^0 scale; 7 saturates to 6 under floor
  (void)quant_linear(x, torch::ones({2, 40}), {}, st);
  const auto records = ctx->stats->take();
  const TensorStats* a = nullptr;
  for (const auto& r : records)
    if (r.kind == TensorKind::a) a = &r;
  ASSERT_NE(a, nullptr);
  ASSERT_TRUE(a->scaled);
  EXPECT_EQ(a->groups.groups, 9u);            // 3 rows x 3 blocks
  EXPECT_EQ(a->groups.zero_groups, 5u);       // row 2 and the rest of row 1
  EXPECT_EQ(a->groups.saturated_groups, 1u);
  EXPECT_EQ(a->scale_hist.at(-2), 3u);        // row 0's three blocks
  EXPECT_EQ(a->scale_hist.at(0), 1u);         // the block holding 7
  EXPECT_EQ(a->scale_hist.at(-127), 5u);      // zero blocks: scale code 0 (2^-127)
}

TEST(ScaledOps, HadamardTransformIsTheSignedSylvesterMatrixOverFour) {
  torch::manual_seed(6);
  const torch::Tensor x0 = torch::randn({3, 37});  // two runs of 16 and a tail of 5
  torch::Tensor x = x0.clone();
  const auto signs = hadamard_signs(42, 16);
  hadamard_(x, signs);
  int negative = 0;
  for (float s : signs) negative += s < 0;
  EXPECT_GT(negative, 0);
  EXPECT_LT(negative, 16);
  for (std::int64_t r = 0; r < 3; ++r) {
    for (std::int64_t c0 = 0; c0 + 16 <= 37; c0 += 16)
      for (int i = 0; i < 16; ++i) {
        double want = 0;  // H[i][j] = (-1)^popcount(i & j)
        for (int j = 0; j < 16; ++j)
          want += (__builtin_popcount(i & j) % 2 ? -1.0 : 1.0) * signs[static_cast<std::size_t>(j)] *
                  x0[r][c0 + j].item<float>();
        EXPECT_NEAR(x[r][c0 + i].item<float>(), want / 4, 1e-5) << r << " " << c0 + i;
      }
    for (std::int64_t c = 32; c < 37; ++c) EXPECT_EQ(x[r][c].item<float>(), x0[r][c].item<float>());
  }
  // Orthonormal: a product over the transformed columns is the product (to float rounding).
  const torch::Tensor y0 = torch::randn({2, 37});
  torch::Tensor y = y0.clone();
  hadamard_(y, signs);
  EXPECT_TRUE(torch::allclose(x.mm(y.t()), x0.mm(y0.t()), 1e-5, 1e-5));
}

namespace {

// A grad_w operand [N, features] as the layer's product reads it: transposed ([features, N]),
// transformed along N with `signs`, quantized by the reference, transposed back.
torch::Tensor hadamard_quantized(const torch::Tensor& t, std::span<const float> signs, const ScaledSpec& s) {
  torch::Tensor m = t.t().contiguous();
  hadamard_(m, signs);
  return ref_quantize(m, m.size(0), m.size(1), [&](std::int64_t r, std::int64_t c) { return r * m.size(1) + c; }, s)
      .t()
      .contiguous();
}

// grad_w of a linear layer's quantized product: g^T x from the two operands as the
// reference gives them.
torch::Tensor grad_w_of(const torch::Tensor& xq, const torch::Tensor& gq) { return xq.t().mm(gq).t().contiguous(); }

}  // namespace

TEST(ScaledOps, HadamardGoesOnBothGradWOperandsOfALinearLayer) {
  torch::manual_seed(7);
  const std::int64_t N = 32, in = 20, out = 8;
  const torch::Tensor x0 = torch::randn({N, in}), w0 = torch::randn({out, in}), g = torch::randn({N, out});
  const std::string spec = "e2m1fn@1x16:ue4m3:nearest";
  const ScaledSpec s = parse_scaled(spec);
  LayerQuant lq = all(spec);
  lq.hadamard = 16;
  auto st = make_layer_state("lin", lq, nullptr);
  ASSERT_TRUE(st->hadamard_applies(BackwardProduct::grad_w, TensorKind::a));
  const torch::Tensor x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_();
  const auto grads = torch::autograd::grad({(quant_linear(x, w, {}, st) * g).sum()}, {x, w});
  // x^T [in, N] and g^T [out, N], transformed along N with the call's signs, then quantized.
  const auto signs = hadamard_signs(st->streams.seed_for(TensorKind::gw, 0, 15), 16);
  EXPECT_TRUE(bit_equal(grads[1], grad_w_of(hadamard_quantized(x0, signs, s), hadamard_quantized(g, signs, s))));
  // Without the transform the weight gradient differs; grad_x does not.
  auto plain = make_layer_state("lin", all(spec), nullptr);
  const torch::Tensor x2 = x0.clone().requires_grad_(), w2 = w0.clone().requires_grad_();
  const auto plain_grads = torch::autograd::grad({(quant_linear(x2, w2, {}, plain) * g).sum()}, {x2, w2});
  EXPECT_TRUE(bit_equal(grads[0], plain_grads[0]));
  EXPECT_FALSE(bit_equal(grads[1], plain_grads[1]));
  // Both estimate the same product g^T x (FP4 elements: to a few tens of percent).
  const torch::Tensor exact = g.t().mm(x0);
  for (const auto& dw : {grads[1], plain_grads[1]})
    EXPECT_LT((dw - exact).norm().item<double>() / exact.norm().item<double>(), 0.35);
}

// Every size: each run of n values becomes H (s * v) * fl32(1 / sqrt(n)), H[i][j] =
// (-1)^popcount(i & j); the signs of each size are the first n of the stream (so 16's are
// the first 16 of 128's); products over transformed columns keep their value.
TEST(ScaledOps, HadamardTransformOfEverySize) {
  torch::manual_seed(9);
  for (int n : {16, 32, 64, 128}) {
    const torch::Tensor x0 = torch::randn({2, 2 * n + 7});  // two runs and a tail
    torch::Tensor x = x0.clone();
    const std::vector<float> signs = hadamard_signs(77, n);
    EXPECT_EQ(std::vector<float>(signs.begin(), signs.begin() + 16), hadamard_signs(77, 16)) << n;
    hadamard_(x, signs);
    const double norm = static_cast<float>(1.0 / std::sqrt(n));
    for (std::int64_t r = 0; r < 2; ++r) {
      for (std::int64_t c0 = 0; c0 < 2 * n; c0 += n)
        for (int i = 0; i < n; ++i) {
          double want = 0;
          for (int j = 0; j < n; ++j)
            want += (__builtin_popcount(i & j) % 2 ? -1.0 : 1.0) * signs[static_cast<std::size_t>(j)] *
                    x0[r][c0 + j].item<float>();
          EXPECT_NEAR(x[r][c0 + i].item<float>(), want * norm, 1e-4) << n << " " << r << " " << c0 + i;
        }
      for (std::int64_t c = 2 * n; c < 2 * n + 7; ++c) EXPECT_EQ(x[r][c].item<float>(), x0[r][c].item<float>());
    }
    torch::Tensor y0 = torch::randn({3, 2 * n + 7}), y = y0.clone();
    hadamard_(y, signs);
    EXPECT_TRUE(torch::allclose(x.mm(y.t()), x0.mm(y0.t()), 1e-4, 1e-4)) << n;
  }
  torch::Tensor m = torch::randn({2, 48});
  EXPECT_NE(error_of([&] { hadamard_(m, hadamard_signs(1, 48)); }).find("16, 32, 64 or 128"), std::string::npos);
}

// hadamard_on = backward: grad_x's operands (g along the output features, W^T along the
// same) get a transform of their own, with the call's grad_x signs; grad_w's stays as with
// hadamard_on = grad_w. A convolution takes none.
TEST(ScaledOps, HadamardOnBothBackwardProductsOfALinearLayer) {
  torch::manual_seed(10);
  const std::int64_t N = 64, in = 20, out = 64;
  const torch::Tensor x0 = torch::randn({N, in}), w0 = torch::randn({out, in}), g = torch::randn({N, out});
  const std::string spec = "e2m1fn@1x16:ue4m3:nearest";
  const ScaledSpec s = parse_scaled(spec);
  const auto grads_of = [&](const LayerStatePtr& st) {
    const torch::Tensor x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_();
    return torch::autograd::grad({(quant_linear(x, w, {}, st) * g).sum()}, {x, w});
  };
  LayerQuant lq = all(spec);
  lq.hadamard = 64;
  lq.hadamard_on = HadamardProducts::backward;
  auto st = make_layer_state("lin", lq, nullptr);
  ASSERT_TRUE(st->hadamard_applies(BackwardProduct::grad_x, TensorKind::w));
  const auto grads = grads_of(st);
  const std::vector<float> gx_signs = hadamard_signs(st->streams.seed_for(TensorKind::gx, 0, 15), 64);
  const std::vector<float> gw_signs = hadamard_signs(st->streams.seed_for(TensorKind::gw, 0, 15), 64);
  EXPECT_NE(gx_signs, gw_signs);
  // grad_x = Q(H g) Q(H W^T)^T: both transformed along the output features.
  torch::Tensor gm = g.clone(), wm = w0.t().contiguous();
  hadamard_(gm, gx_signs);
  hadamard_(wm, gx_signs);
  const auto q = [&](const torch::Tensor& m) {
    return ref_quantize(m, m.size(0), m.size(1), [&](std::int64_t r, std::int64_t c) { return r * m.size(1) + c; }, s);
  };
  EXPECT_TRUE(bit_equal(grads[0], q(gm).mm(q(wm).t())));
  EXPECT_TRUE(bit_equal(grads[1], grad_w_of(hadamard_quantized(x0, gw_signs, s), hadamard_quantized(g, gw_signs, s))));
  // hadamard_on = grad_w: grad_w the same, grad_x that of no transform.
  LayerQuant on_w = lq;
  on_w.hadamard_on = HadamardProducts::grad_w;
  auto st_w = make_layer_state("lin", on_w, nullptr);
  EXPECT_FALSE(st_w->hadamard_applies(BackwardProduct::grad_x, TensorKind::w));
  const auto grads_w = grads_of(st_w);
  EXPECT_TRUE(bit_equal(grads_w[1], grads[1]));
  EXPECT_TRUE(bit_equal(grads_w[0], grads_of(make_layer_state("lin", all(spec), nullptr))[0]));
  EXPECT_FALSE(bit_equal(grads_w[0], grads[0]));
  // Both estimate g W (FP4 elements: to a few tens of percent).
  const torch::Tensor exact = g.mm(w0);
  EXPECT_LT((grads[0] - exact).norm().item<double>() / exact.norm().item<double>(), 0.35);
  // A matmul a b (attention's): grad_a's operands are g and b, both along b's columns, with
  // the matmul's grad_x signs; its partner b is an activation.
  {
    const torch::Tensor a0 = torch::randn({16, 32}), b0 = torch::randn({32, 64}), gm2 = torch::randn({16, 64});
    LayerQuant mq = all(spec);
    mq.hadamard = 64;
    mq.hadamard_on = HadamardProducts::backward;
    auto ms = make_layer_state("mm", mq, nullptr);
    const torch::Tensor a = a0.clone().requires_grad_(), b = b0.clone().requires_grad_();
    const torch::Tensor da = torch::autograd::grad({(quant_matmul(a, b, ms) * gm2).sum()}, {a})[0];
    const std::vector<float> signs = hadamard_signs(ms->streams.seed_for(TensorKind::gx, 0, 15), 64);
    torch::Tensor gh = gm2.clone(), bh = b0.clone();
    hadamard_(gh, signs);
    hadamard_(bh, signs);
    EXPECT_TRUE(bit_equal(da, q(gh).mm(q(bh).t())));
  }
  // TransformerEngine's 16 signs do not make a transform of 64.
  LayerQuant te = lq;
  te.hadamard_signs = HadamardSigns::te;
  EXPECT_NE(error_of([&] { (void)grads_of(make_layer_state("lin", te, nullptr)); }).find("16 fixed signs"),
            std::string::npos);
}

// Backward forms (docs/spec.md §6.12): the forward product reads a and w as their own
// quantizers give them (bfloat16 here), the backward products read a_bwd's and w_bwd's
// quantizations of the float32 tensors, each along that product's reduction dimension, with
// the Hadamard transform where the recipe asks for it on that product.
TEST(ScaledOps, BackwardFormsAreTheOperandsOfTheBackwardProductsOnly) {
  torch::manual_seed(11);
  const std::int64_t N = 64, in = 32, out = 64;
  const torch::Tensor x0 = torch::randn({N, in}), w0 = torch::randn({out, in}), g = torch::randn({N, out});
  const std::string spec = "mxfp4:dither-scale";
  const ScaledSpec s = parse_scaled(spec);
  const auto q = [&](const torch::Tensor& m) {
    return ref_quantize(m, m.size(0), m.size(1), [&](std::int64_t r, std::int64_t c) { return r * m.size(1) + c; }, s);
  };
  const auto bf16 = [](const torch::Tensor& t) { return t.to(torch::kBFloat16).to(torch::kFloat32); };
  for (const int hadamard : {0, 64}) {
    SCOPED_TRACE("hadamard " + std::to_string(hadamard));
    const Recipe r = parse_recipe("a=bf16,w=bf16,gx=" + spec + ",gw=fp32,a_bwd=" + spec + ",w_bwd=" + spec +
                                  ",hadamard=" + std::to_string(hadamard) + ",hadamard_on=backward");
    auto st = make_layer_state("lin", r.resolve("lin", 1, 3), nullptr);
    ASSERT_TRUE(st->has_backward_form(TensorKind::a) && st->has_backward_form(TensorKind::w));
    EXPECT_EQ(st->hadamard_applies(BackwardProduct::grad_x, TensorKind::w), hadamard > 0);
    const torch::Tensor x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_();
    const torch::Tensor y = quant_linear(x, w, {}, st);
    EXPECT_TRUE(bit_equal(y, torch::linear(bf16(x0), bf16(w0))));
    const auto grads = torch::autograd::grad({(y * g).sum()}, {x, w});
    std::vector<float> gx_signs(64, 1.0f), gw_signs(64, 1.0f);
    torch::Tensor gm = g.clone(), wm = w0.t().contiguous(), xt = x0.t().contiguous(), gt = g.t().contiguous();
    if (hadamard > 0) {
      gx_signs = hadamard_signs(st->streams.seed_for(TensorKind::gx, 0, 15), 64);
      gw_signs = hadamard_signs(st->streams.seed_for(TensorKind::gw, 0, 15), 64);
      hadamard_(gm, gx_signs);
      hadamard_(wm, gx_signs);
      hadamard_(xt, gw_signs);
      hadamard_(gt, gw_signs);
    }
    // grad_x = Q(g) Q(w^T)^T along the output features; grad_w = Q(g^T) Q(x^T)^T along N.
    EXPECT_TRUE(bit_equal(grads[0], q(gm).mm(q(wm).t())));
    EXPECT_TRUE(bit_equal(grads[1], grad_w_of(q(xt).t().contiguous(), q(gt).t().contiguous())));
  }
  // bwd_from = forward: the backward forms quantize the forward's values (Quartet II): here
  // x's NVFP4 values (1x16 blocks along `in`) requantized along N, and w's bfloat16 ones.
  {
    const std::string nv = "e2m1fn@1x16:ue4m3:nearest:tensor-scale";
    const Recipe r = parse_recipe("a=" + nv + ",w=bf16,gx=" + spec + ",gw=fp32,a_bwd=" + spec + ",w_bwd=" + spec +
                                  ",bwd_from=forward");
    auto st = make_layer_state("lin", r.resolve("lin", 1, 3), nullptr);
    const torch::Tensor x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_();
    const auto grads = torch::autograd::grad({(quant_linear(x, w, {}, st) * g).sum()}, {x, w});
    const ScaledSpec nvs = parse_scaled(nv);
    const torch::Tensor xq = ref_quantize(x0, N, in, [&](std::int64_t rr, std::int64_t c) { return rr * in + c; }, nvs);
    EXPECT_TRUE(bit_equal(grads[0], q(g).mm(q(bf16(w0).t().contiguous()).t())));
    EXPECT_TRUE(bit_equal(grads[1], grad_w_of(q(xq.t().contiguous()).t().contiguous(), q(g.t().contiguous()).t().contiguous())));
    EXPECT_FALSE(bit_equal(xq, x0));
  }
  // Without the backward forms the backward products read the bfloat16 operands.
  auto plain = make_layer_state("lin", parse_recipe("a=bf16,w=bf16,gx=" + spec + ",gw=fp32").base, nullptr);
  const torch::Tensor x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_();
  const auto grads = torch::autograd::grad({(quant_linear(x, w, {}, plain) * g).sum()}, {x, w});
  EXPECT_TRUE(bit_equal(grads[0], q(g).mm(bf16(w0))));
}

// hadamard_signs = none: the plain transform H x / 4 on both operands, whatever the call;
// te: TransformerEngine's fixed signs.
TEST(ScaledOps, ThePlainHadamardTransformHasNoSigns) {
  torch::manual_seed(8);
  const std::int64_t N = 48, in = 16, out = 8;
  const torch::Tensor x0 = torch::randn({N, in}), w0 = torch::randn({out, in}), g = torch::randn({N, out});
  const std::string spec = "e2m1fn@1x16:ue4m3:nearest";
  const ScaledSpec s = parse_scaled(spec);
  LayerQuant lq = all(spec);
  lq.hadamard = 16;
  lq.hadamard_signs = HadamardSigns::none;
  auto st = make_layer_state("lin", lq, nullptr);
  const auto grad_w = [&](const LayerStatePtr& state) {
    const torch::Tensor x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_();
    return torch::autograd::grad({(quant_linear(x, w, {}, state) * g).sum()}, {w})[0];
  };
  const auto& plain = fixed_hadamard_signs(HadamardSigns::none);
  const torch::Tensor dw = grad_w(st);
  EXPECT_TRUE(bit_equal(dw, grad_w_of(hadamard_quantized(x0, plain, s), hadamard_quantized(g, plain, s))));
  LayerQuant random = lq;
  random.hadamard_signs = HadamardSigns::random;
  EXPECT_FALSE(bit_equal(dw, grad_w(make_layer_state("lin", random, nullptr))));
  // te: TransformerEngine's fixed signs, the same for every call; neither of the others.
  LayerQuant te = lq;
  te.hadamard_signs = HadamardSigns::te;
  const auto& s_te = fixed_hadamard_signs(HadamardSigns::te);
  EXPECT_EQ(std::count(s_te.begin(), s_te.end(), -1.0f), 10);
  const torch::Tensor dw_te = grad_w(make_layer_state("lin", te, nullptr));
  EXPECT_FALSE(bit_equal(dw_te, dw));
  EXPECT_TRUE(bit_equal(dw_te, grad_w_of(hadamard_quantized(x0, s_te, s), hadamard_quantized(g, s_te, s))));
}

// On the bfloat16 path (docs/spec.md §7), scaled operands reach the compute layer's products
// as the same values in the same layouts as the float32 path's: each product equals
// nn::matmul_bf16 of the reference's contiguous float32 operands, laid out as the float32
// path lays them out, bit for bit. The reduction of grad_w's product (4096 rows) is long
// enough that oneDNN's sums depend on the operands' layout on AMX.
TEST(ScaledOps, Bf16ProductsReadTheFloat32PathsOperandsInTheirLayouts) {
  if (!bf16_products_available()) GTEST_SKIP() << "no bfloat16 products on this CPU";
  torch::manual_seed(6);
  const std::string spec = "e4m3fn@1x32:e8m0:floor";
  const ScaledSpec s = parse_scaled(spec);
  const auto row_major = [](std::int64_t cols) { return [cols](std::int64_t r, std::int64_t c) { return r * cols + c; }; };
  const auto transposed = [](std::int64_t cols) { return [cols](std::int64_t r, std::int64_t c) { return c * cols + r; }; };
  {  // linear: x [4096, 64], w [128, 64]
    const std::int64_t N = 4096, in = 64, out = 128;
    const torch::Tensor x0 = torch::randn({N, in}), w0 = torch::randn({out, in}) * 0.1, g = torch::randn({N, out}) * 1e-3;
    auto ctx = std::make_shared<QuantContext>();
    ctx->compute = Compute::bf16;
    auto st = make_layer_state("lin", all(spec), ctx);
    const torch::Tensor x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_();
    const torch::Tensor y = quant_linear(x, w, {}, st);
    const auto grads = torch::autograd::grad({(y * g).sum()}, {x, w});
    const torch::Tensor xf = ref_quantize(x0, N, in, row_major(in), s), wf = ref_quantize(w0, out, in, row_major(in), s);
    EXPECT_TRUE(bit_equal(y, *matmul_bf16(xf, wf.t())));
    const torch::Tensor gd = ref_quantize(g, N, out, row_major(out), s), wb = ref_quantize(w0, in, out, transposed(in), s);
    EXPECT_TRUE(bit_equal(grads[0], *matmul_bf16(gd, wb)));
    const torch::Tensor gb = ref_quantize(g, out, N, transposed(out), s), xb = ref_quantize(x0, in, N, transposed(in), s);
    EXPECT_TRUE(bit_equal(grads[1], matmul_bf16(xb.t(), gb)->t().contiguous()));  // gw: float32
    EXPECT_EQ(st->products.counts(), std::make_pair(std::int64_t{0}, std::int64_t{3}));
  }
  {  // batched matmul: a [2, 64, 2048], b [2, 2048, 64]
    const std::int64_t B = 2, M = 64, K = 2048, Nd = 64;
    const torch::Tensor a0 = torch::randn({B, M, K}), b0 = torch::randn({B, K, Nd}), g = torch::randn({B, M, Nd});
    auto ctx = std::make_shared<QuantContext>();
    ctx->compute = Compute::bf16;
    auto st = make_layer_state("attn", all(spec), ctx);
    const torch::Tensor a = a0.clone().requires_grad_(), b = b0.clone().requires_grad_();
    const torch::Tensor y = quant_matmul(a, b, st);
    const auto grads = torch::autograd::grad({(y * g).sum()}, {a, b});
    const auto swapped = [](std::int64_t R, std::int64_t C) {
      return [R, C](std::int64_t r, std::int64_t c) { return (r / C) * R * C + c * C + r % C; };
    };
    const torch::Tensor af = ref_quantize(a0, B * M, K, row_major(K), s), bf = ref_quantize(b0, B * Nd, K, swapped(K, Nd), s);
    EXPECT_TRUE(bit_equal(y, *bmm_bf16(af, bf)));
    const torch::Tensor gd = ref_quantize(g, B * M, Nd, row_major(Nd), s), bb = ref_quantize(b0, B * K, Nd, row_major(Nd), s);
    EXPECT_TRUE(bit_equal(grads[0], *bmm_bf16(gd, bb.transpose(-2, -1))));
    const torch::Tensor ab = ref_quantize(a0, B * K, M, swapped(M, K), s), gb = ref_quantize(g, B * Nd, M, swapped(M, Nd), s);
    EXPECT_TRUE(bit_equal(grads[1], *bmm_bf16(ab.transpose(-2, -1), gb)));
    EXPECT_EQ(st->products.counts(), std::make_pair(std::int64_t{0}, std::int64_t{3}));
  }
}

// NVFP4's tensor scale on the product's output (docs/spec.md §6.7): each operand reaches its
// product as element times block scale, and the product's float32 output is multiplied by
// fl32(ts_a * ts_b), then the bias added; in the linear layer's three products (forward,
// grad_x, grad_w), on the float32 path and on bfloat16 products (now exact, so taken), and in
// a convolution and a batched matmul. With `tensor-scale-folded` the products read the
// fake-quantized values, as before. Expected values: the reference's quantizations composed
// with libtorch's ops (float32) or nn::matmul_bf16 (bfloat16).
TEST(ScaledOps, TensorScalesGoOnTheProductsOutput) {
  torch::manual_seed(8);
  const std::int64_t N = 64, in = 48, out = 32;  // in: three blocks of 16
  const torch::Tensor x0 = torch::randn({N, in}) * 3, w0 = torch::randn({out, in}) * 0.1;
  const torch::Tensor b = torch::randn({out}), g = torch::randn({N, out}) * 1e-3;
  const ScaledSpec s = parse_scaled("nvfp4");
  const auto row_major = [](std::int64_t cols) { return [cols](std::int64_t r, std::int64_t c) { return r * cols + c; }; };
  const auto transposed = [](std::int64_t cols) { return [cols](std::int64_t r, std::int64_t c) { return c * cols + r; }; };
  float tx = 0, tw = 0, tg = 0, twb = 0, txb = 0, tgb = 0;
  const torch::Tensor xu = ref_quantize(x0, N, in, row_major(in), s, {}, &tx);
  const torch::Tensor wu = ref_quantize(w0, out, in, row_major(in), s, {}, &tw);
  const torch::Tensor gd = ref_quantize(g, N, out, row_major(out), s, {}, &tg);
  const torch::Tensor wb = ref_quantize(w0, in, out, transposed(in), s, {}, &twb);
  const torch::Tensor gb = ref_quantize(g, out, N, transposed(out), s, {}, &tgb);
  const torch::Tensor xb = ref_quantize(x0, in, N, transposed(in), s, {}, &txb);
  ASSERT_TRUE(tx != 1 && tw != 1 && tg != 1) << "the test needs tensor scales other than 1";
  const auto check = [&](Compute compute) {
    auto ctx = std::make_shared<QuantContext>();
    ctx->compute = compute;
    auto st = make_layer_state("lin", all("nvfp4"), ctx);
    const torch::Tensor x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_();
    const torch::Tensor y = quant_linear(x, w, b, st);
    const auto grads = torch::autograd::grad({(y * g).sum()}, {x, w});
    const bool bf16 = compute == Compute::bf16;
    const auto mm = [&](const torch::Tensor& p, const torch::Tensor& q) { return bf16 ? *matmul_bf16(p, q) : p.mm(q); };
    const std::string what = bf16 ? "bf16" : "fp32";
    EXPECT_TRUE(bit_equal(y, mm(xu, wu.t()).mul_(tx * tw).add_(b))) << what;
    EXPECT_TRUE(bit_equal(grads[0], mm(gd, wb).mul_(tg * twb))) << what;
    EXPECT_TRUE(bit_equal(grads[1], mm(xb.t(), gb).mul_(txb * tgb).t().contiguous())) << what;  // gw: float32
    if (bf16) EXPECT_EQ(st->products.counts(), std::make_pair(std::int64_t{0}, std::int64_t{3}));
  };
  check(Compute::fp32);
  if (bf16_products_available()) check(Compute::bf16);
  {  // folded: the fake-quantized values, as the float32 product reads them
    auto st = make_layer_state("lin", all("nvfp4:tensor-scale-folded"), nullptr);
    const ScaledSpec folded = parse_scaled("nvfp4:tensor-scale-folded");
    const torch::Tensor y = quant_linear(x0, w0, b, st);
    const torch::Tensor xf = ref_quantize(x0, N, in, row_major(in), folded), wf = ref_quantize(w0, out, in, row_major(in), folded);
    EXPECT_TRUE(bit_equal(y, torch::linear(xf, wf, b)));
    EXPECT_FALSE(bit_equal(y, xu.mm(wu.t()).mul_(tx * tw).add_(b))) << "the two orders round differently";
  }
  {  // a convolution, float32 products: [N*H*W, C] activations, [O, 3*3*C] weights
    const std::int64_t Nc = 2, C = 16, H = 4, W = 4, O = 8, K = 3;
    const torch::Tensor xc = torch::randn({Nc, C, H, W}), wc = torch::randn({O, C, K, K}) * 0.2, bc = torch::randn({O});
    auto st = make_layer_state("conv", all("nvfp4"), nullptr);
    const torch::Tensor y = quant_conv2d(xc, wc, bc, {1, 1}, {1, 1}, {1, 1}, 1, st);
    const auto by_channels = [&](std::int64_t r, std::int64_t c) { return ((r / (H * W) * C + c) * H + r / W % H) * W + r % W; };
    const auto w_forward = [&](std::int64_t o, std::int64_t k) {
      return ((o * C + k % C) * K + k / (K * C)) * K + k / C % K;
    };
    float ta = 0, tb = 0;
    const torch::Tensor xcu = ref_quantize(xc, Nc * H * W, C, by_channels, s, {}, &ta);
    const torch::Tensor wcu = ref_quantize(wc, O, K * K * C, w_forward, s, {}, &tb);
    EXPECT_TRUE(bit_equal(y, torch::conv2d(xcu, wcu, {}, {1, 1}, {1, 1}).mul_(ta * tb).add_(bc.reshape({1, -1, 1, 1}))));
  }
  {  // a batched matmul a [2, 5, 32] b [2, 32, 6], float32 products
    const torch::Tensor a0 = torch::randn({2, 5, 32}), b0 = torch::randn({2, 32, 6});
    auto st = make_layer_state("attn", all("nvfp4"), nullptr);
    const torch::Tensor y = quant_matmul(a0, b0, st);
    const auto swapped = [](std::int64_t r, std::int64_t c) { return (r / 6) * 32 * 6 + c * 6 + r % 6; };
    float ta = 0, tb = 0;
    const torch::Tensor au = ref_quantize(a0, 10, 32, row_major(32), s, {}, &ta), bu = ref_quantize(b0, 12, 32, swapped, s, {}, &tb);
    EXPECT_TRUE(bit_equal(y, au.matmul(bu).mul_(ta * tb)));
  }
}

namespace {

// An operand split as a product with float32 scales on its output reads it (docs/spec.md
// §6.8): its elements alone and one scale per matrix row and group along the reduction,
// from the scalar reference's codes and scale codes laid out by explicit index loops.
struct Split {
  std::vector<float> e;      // [rows, cols] elements
  std::vector<float> scale;  // [rows, groups]: a tile's scale repeated over its rows
  std::int64_t rows = 0, cols = 0, group = 0, groups = 0;
  float at(std::int64_t r, std::int64_t c) const { return e[static_cast<std::size_t>(r * cols + c)]; }
  float scale_at(std::int64_t r, std::int64_t c) const {
    return scale[static_cast<std::size_t>(r * groups + c / group)];
  }
};
Split ref_split(const torch::Tensor& t, std::int64_t rows, std::int64_t cols, const IndexMap& at, const ScaledSpec& s) {
  const torch::Tensor x = t.contiguous();
  std::vector<float> m(static_cast<std::size_t>(rows * cols));
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) m[static_cast<std::size_t>(r * cols + c)] = x.data_ptr<float>()[at(r, c)];
  const BlockLayout l = block_layout(s, static_cast<std::size_t>(rows), static_cast<std::size_t>(cols));
  std::vector<std::uint8_t> codes(m.size());
  std::vector<std::uint32_t> scales(l.groups()), unit(l.groups(), std::bit_cast<std::uint32_t>(1.0f));
  ScaledOut out;
  out.codes = codes.data();
  out.scale_codes = scales.data();
  scaled_quantize_reference(m.data(), static_cast<std::size_t>(rows), static_cast<std::size_t>(cols), s, out);
  Split sp{std::vector<float>(m.size()), {}, rows, cols, static_cast<std::int64_t>(l.block_cols),
           static_cast<std::int64_t>(l.grid_cols())};
  scaled_decode_reference(codes.data(), unit.data(), 1.0f, static_cast<std::size_t>(rows), static_cast<std::size_t>(cols),
                          s, sp.e.data());
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t g = 0; g < sp.groups; ++g)
      sp.scale.push_back(std::bit_cast<float>(
          scales[static_cast<std::size_t>(r / static_cast<std::int64_t>(l.block_rows)) * l.grid_cols() +
                 static_cast<std::size_t>(g)]));
  return sp;
}

// §6.8's definition, output by output: the reduction cut into chunks of gcd(group a, group b)
// positions; a chunk's partial sum P (exact here: the test's elements make every partial sum
// a float32 value, checked); c = fl32(s * P) for the first chunk, then fma(s, P, c), with
// s = fl32(scale_a * scale_b).
// With `partial`, each P is first rounded to that format (a chunked accumulation, §7.3, whose
// chunk is the scales' chunk).
torch::Tensor ref_scaled_product(const Split& a, const Split& b, const QuantSpec* partial = nullptr) {
  const std::int64_t k = a.cols, chunk = std::gcd(std::min(a.group, k), std::min(b.group, k));
  torch::Tensor c = torch::empty({a.rows, b.rows});
  for (std::int64_t m = 0; m < a.rows; ++m)
    for (std::int64_t n = 0; n < b.rows; ++n) {
      float acc = 0;
      for (std::int64_t k0 = 0; k0 < k; k0 += chunk) {
        double p = 0;
        for (std::int64_t i = k0; i < std::min(k, k0 + chunk); ++i) p += double(a.at(m, i)) * double(b.at(n, i));
        EXPECT_EQ(p, double(float(p))) << "the test's partial sums must be float32 values";
        const float s = a.scale_at(m, k0) * b.scale_at(n, k0);
        const float part = partial ? quantize(float(p), *partial) : float(p);
        acc = k0 == 0 ? s * part : std::fma(s, part, acc);
      }
      c.index_put_({m, n}, acc);
    }
  return c;
}

}  // namespace

TEST(ScaledOps, Float32ScalesGoOnTheChunksOfTheProductsOutput) {
  // Magnitudes within a factor of 2 of each group's largest: E4M3 elements from 224 to 448,
  // multiples of 16, so every partial sum of 16 products is exact in float32 on any path and
  // in any order; the group scales (amax / 448) are not powers of two.
  torch::manual_seed(12);
  const auto values = [](std::vector<std::int64_t> shape, double f) {
    const torch::Tensor u = torch::rand(shape) * 0.5 + 0.5;
    return (u * torch::where(torch::rand(shape) < 0.5, -1.0, 1.0) * f).to(torch::kFloat32);
  };
  const std::int64_t N = 6, in = 40, out = 24;  // in: 16 + 16 + 8
  const torch::Tensor x0 = values({N, in}, 3.7), w0 = values({out, in}, 0.113), g = values({N, out}, 1.3e-3);
  const torch::Tensor b = torch::randn({out});
  const std::string rows = "e4m3fn@1x16:fp32:nearest", tiles = "e4m3fn@16x16:fp32:nearest";
  const ScaledSpec sr = parse_scaled(rows), st16 = parse_scaled(tiles);
  ASSERT_TRUE(sr.scales_on_output() && st16.scales_on_output()) << "on the output by default";
  const auto row_major = [](std::int64_t cols) { return [cols](std::int64_t r, std::int64_t c) { return r * cols + c; }; };
  const auto transposed = [](std::int64_t cols) { return [cols](std::int64_t r, std::int64_t c) { return c * cols + r; }; };
  const Split xf = ref_split(x0, N, in, row_major(in), sr), wf = ref_split(w0, out, in, row_major(in), st16);
  const Split gd = ref_split(g, N, out, row_major(out), sr), wb = ref_split(w0, in, out, transposed(in), st16);
  const Split xb = ref_split(x0, in, N, transposed(in), sr), gb = ref_split(g, out, N, transposed(out), sr);
  const torch::Tensor y_ref = ref_scaled_product(xf, wf).add_(b);
  const torch::Tensor dx_ref = ref_scaled_product(gd, wb);
  const torch::Tensor dw_ref = ref_scaled_product(xb, gb).t().contiguous();
  for (const Compute compute : {Compute::fp32, Compute::bf16}) {
    if (compute == Compute::bf16 && !bf16_products_available()) continue;
    auto ctx = std::make_shared<QuantContext>();
    ctx->compute = compute;
    auto st = make_layer_state("lin", parse_recipe("a=" + rows + ",w=" + tiles + ",gx=" + rows + ",gw=fp32").base, ctx);
    const torch::Tensor x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_();
    const torch::Tensor y = quant_linear(x, w, b, st);
    const auto grads = torch::autograd::grad({(y * g).sum()}, {x, w});
    const std::string what = compute == Compute::bf16 ? "bf16" : "fp32";
    EXPECT_TRUE(bit_equal(y, y_ref)) << what;
    EXPECT_TRUE(bit_equal(grads[0], dx_ref)) << what;
    EXPECT_TRUE(bit_equal(grads[1], dw_ref)) << what;
    if (compute == Compute::bf16) EXPECT_EQ(st->products.counts(), std::make_pair(std::int64_t{0}, std::int64_t{3}));
  }
  {  // a chunked accumulation inside the scales' chunks: each partial sum rounded, then scaled
    auto ctx = std::make_shared<QuantContext>();
    ctx->accumulate = parse_accumulation("1.8.5@16");
    auto st = make_layer_state("lin", parse_recipe("a=" + rows + ",w=" + tiles).base, ctx);
    QuantSpec partial;
    partial.format = parse_format("1.8.5");
    partial.rounding = Rounding::nearest_even;
    partial.overflow = Overflow::saturate;
    const torch::Tensor y = quant_linear(x0, w0, {}, st);
    EXPECT_TRUE(bit_equal(y, ref_scaled_product(xf, wf, &partial)));
    EXPECT_FALSE(bit_equal(y, ref_scaled_product(xf, wf))) << "the partial sums must round";
  }
  {  // scales-folded: the fake-quantized values, as the float32 product reads them
    const std::string folded = rows + ":scales-folded";
    auto st = make_layer_state("lin", parse_recipe("a=" + folded + ",w=" + tiles + ":scales-folded").base, nullptr);
    const torch::Tensor y = quant_linear(x0, w0, b, st);
    const torch::Tensor xq = ref_quantize(x0, N, in, row_major(in), sr), wq = ref_quantize(w0, out, in, row_major(in), st16);
    EXPECT_TRUE(bit_equal(y, torch::linear(xq, wq, b)));
    EXPECT_FALSE(bit_equal(y, y_ref)) << "the two orders round differently";
  }
  {  // a batched matmul a [2, 5, 40] b [2, 40, 6]: a along K, b along K (its columns)
    const torch::Tensor a0 = values({2, 5, in}, 2.1), b0 = values({2, in, 6}, 0.7);
    auto st = make_layer_state("attn", parse_recipe("a=" + rows + ",gx=" + rows).base, nullptr);
    const torch::Tensor y = quant_matmul(a0, b0, st);
    for (std::int64_t i = 0; i < 2; ++i) {
      const Split as = ref_split(a0[i], 5, in, row_major(in), sr), bs = ref_split(b0[i], 6, in, transposed(6), sr);
      EXPECT_TRUE(bit_equal(y[i], ref_scaled_product(as, bs))) << "batch " << i;
    }
    // Backward: grad_a = g b^T along N (6: one short group), grad_b = a^T g along M (5).
    const torch::Tensor a = a0.clone().requires_grad_(), bb = b0.clone().requires_grad_();
    const torch::Tensor gm = values({2, 5, 6}, 0.03);
    const auto grads = torch::autograd::grad({(quant_matmul(a, bb, st) * gm).sum()}, {a, bb});
    for (std::int64_t i = 0; i < 2; ++i) {
      const Split ga = ref_split(gm[i], 5, 6, row_major(6), sr), bt = ref_split(b0[i], in, 6, row_major(6), sr);
      EXPECT_TRUE(bit_equal(grads[0][i], ref_scaled_product(ga, bt))) << "grad_a, batch " << i;
      const Split at = ref_split(a0[i], in, 5, transposed(in), sr), gb = ref_split(gm[i], 6, 5, transposed(6), sr);
      EXPECT_TRUE(bit_equal(grads[1][i], ref_scaled_product(at, gb))) << "grad_b, batch " << i;
    }
  }
  {  // a per-tensor float32 scale goes on the output whole: fl32(P * fl32(X_a * X_w))
    const std::string t = "e4m3fn@tensor:fp32:nearest";
    auto st = make_layer_state("lin", parse_recipe("a=" + t + ",w=" + t).base, nullptr);
    const Split xt = ref_split(x0, N, in, row_major(in), parse_scaled(t)), wt = ref_split(w0, out, in, row_major(in), parse_scaled(t));
    EXPECT_TRUE(bit_equal(quant_linear(x0, w0, {}, st), ref_scaled_product(xt, wt)));
  }
}
