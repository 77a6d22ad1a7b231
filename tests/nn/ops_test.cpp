// Quantized ops against libtorch's own ops (float32 quantizers) and against the reference
// composed from libtorch ops and the scalar codec (quantizers on).
#include <gtest/gtest.h>

#include <functional>

#include <torch/torch.h>

#include "../common/torch_testutil.hpp"

#include "fp8lab/core/codec.hpp"
#include "fp8lab/nn/modules.hpp"
#include "fp8lab/nn/ops.hpp"
#include "fp8lab/nn/tensor_quant.hpp"

using namespace fp8lab;
using namespace fp8lab::nn;

namespace {

using fp8lab::test::bit_equal;

// Element-wise scalar quantization: the reference for the bulk path.
torch::Tensor scalar_q(const torch::Tensor& t, const KindQuant& q, std::uint64_t seed) {
  if (!q) return t;
  QuantSpec s = q->element;
  s.seed = seed;
  torch::Tensor x = t.contiguous().clone();
  float* p = x.data_ptr<float>();
  for (std::int64_t i = 0; i < x.numel(); ++i) p[i] = quantize(p[i], s, static_cast<std::uint64_t>(i));
  return x;
}

LayerQuant float_quant() { return LayerQuant{}; }
LayerQuant paper_quant() {
  return parse_recipe("a=1.4.3:10,w=1.4.3:14,gx=1.5.2:33,gw=1.5.2:31").base;
}

}  // namespace

TEST(Ops, Float32LinearEqualsLibtorch) {
  torch::manual_seed(1);
  for (auto shape : {std::vector<std::int64_t>{5, 7}, std::vector<std::int64_t>{2, 3, 7}}) {
    auto x = torch::randn(shape, torch::requires_grad());
    auto w = torch::randn({4, 7}, torch::requires_grad());
    auto b = torch::randn({4}, torch::requires_grad());
    auto y_ref = torch::linear(x, w, b);
    auto r = torch::randn(y_ref.sizes());
    auto gx_ref = torch::autograd::grad({(y_ref * r).sum()}, {x, w, b});
    auto st = make_layer_state("lin", float_quant(), nullptr);
    auto y = quant_linear(x, w, b, st);
    auto gx = torch::autograd::grad({(y * r).sum()}, {x, w, b});
    EXPECT_TRUE(bit_equal(y, y_ref));
    for (int i = 0; i < 3; ++i) EXPECT_TRUE(bit_equal(gx[i], gx_ref[i])) << "grad " << i;
  }
}

TEST(Ops, Float32Conv2dEqualsLibtorchIncludingDepthwise) {
  torch::manual_seed(2);
  struct Case { int cin, cout, groups, stride, pad, dil; } cases[] = {
      {3, 8, 1, 1, 1, 1}, {4, 6, 2, 2, 0, 1}, {6, 6, 6, 1, 1, 1}, {4, 4, 1, 1, 2, 2}};
  for (const auto& c : cases) {
    auto x = torch::randn({2, c.cin, 9, 9}, torch::requires_grad());
    auto w = torch::randn({c.cout, c.cin / c.groups, 3, 3}, torch::requires_grad());
    auto b = torch::randn({c.cout}, torch::requires_grad());
    auto y_ref = torch::conv2d(x, w, b, c.stride, c.pad, c.dil, c.groups);
    auto r = torch::randn(y_ref.sizes());
    auto g_ref = torch::autograd::grad({(y_ref * r).sum()}, {x, w, b});
    auto st = make_layer_state("conv", float_quant(), nullptr);
    auto y = quant_conv2d(x, w, b, {c.stride, c.stride}, {c.pad, c.pad}, {c.dil, c.dil}, c.groups, st);
    auto g = torch::autograd::grad({(y * r).sum()}, {x, w, b});
    EXPECT_TRUE(bit_equal(y, y_ref)) << "groups " << c.groups;
    for (int i = 0; i < 3; ++i) EXPECT_TRUE(bit_equal(g[i], g_ref[i])) << "grad " << i << " groups " << c.groups;
  }
}

TEST(Ops, StridedOneByOneConvInChannelsLastGivesLibtorchsGradientsWithoutItsHeapBug) {
  // torch 2.13's own weight gradient of a 1x1, stride-2 convolution in channels-last with
  // fewer than 16 input channels corrupts the heap at batch sizes such as 3, 5, 7 and 21
  // (docs/spec.md §7.2); quant_conv2d takes it from the subsampled input. Without that, this
  // test dies within its first few hundred calls.
  torch::manual_seed(3);
  const auto cl = torch::MemoryFormat::ChannelsLast;
  for (int cin : {1, 4, 8, 15, 16}) {
    for (int n : {3, 5, 7, 21}) {
      for (int rep = 0; rep < 25; ++rep) {
        auto x = torch::randn({n, cin, 16, 16}).contiguous(cl).requires_grad_();
        auto w = torch::randn({2 * cin, cin, 1, 1}).contiguous(cl).requires_grad_();
        auto st = make_layer_state("shortcut", float_quant(), nullptr);
        auto y = quant_conv2d(x, w, torch::Tensor(), {2, 2}, {0, 0}, {1, 1}, 1, st);
        auto r = torch::randn(y.sizes());
        auto g = torch::autograd::grad({(y * r).sum()}, {x, w});
        // The reference in NCHW, where libtorch's kernels are sound.
        auto xr = x.detach().contiguous().requires_grad_(), wr = w.detach().contiguous().requires_grad_();
        auto yr = torch::conv2d(xr, wr, {}, 2);
        auto gr = torch::autograd::grad({(yr * r).sum()}, {xr, wr});
        ASSERT_TRUE(torch::allclose(y, yr, 1e-5, 1e-5)) << "cin " << cin << " batch " << n;
        ASSERT_TRUE(torch::allclose(g[0], gr[0], 1e-5, 1e-5)) << "dx, cin " << cin << " batch " << n;
        ASSERT_TRUE(torch::allclose(g[1], gr[1], 1e-4, 1e-4)) << "dw, cin " << cin << " batch " << n;
      }
    }
  }
}

TEST(Ops, Float32MatmulEqualsLibtorch) {
  torch::manual_seed(3);
  auto a = torch::randn({2, 3, 5, 4}, torch::requires_grad());
  auto b = torch::randn({2, 3, 4, 6}, torch::requires_grad());
  auto y_ref = torch::matmul(a, b);
  auto r = torch::randn(y_ref.sizes());
  auto g_ref = torch::autograd::grad({(y_ref * r).sum()}, {a, b});
  auto st = make_layer_state("mm", float_quant(), nullptr);
  auto y = quant_matmul(a, b, st);
  auto g = torch::autograd::grad({(y * r).sum()}, {a, b});
  EXPECT_TRUE(bit_equal(y, y_ref));
  EXPECT_TRUE(bit_equal(g[0], g_ref[0]));
  EXPECT_TRUE(bit_equal(g[1], g_ref[1]));
}

// Quantizers on: forward f(Q_a(x), Q_w(w)); dL/dx from Q_gx(g) and Q_w(w); Q_gw(dL/dw).
TEST(Ops, QuantizedLinearIsTheComposition) {
  torch::manual_seed(4);
  auto x = torch::randn({6, 8}, torch::requires_grad());
  auto w = (0.3 * torch::randn({5, 8})).requires_grad_();
  auto b = torch::randn({5}, torch::requires_grad());
  const LayerQuant lq = paper_quant();
  auto st = make_layer_state("lin", lq, nullptr);
  auto y = quant_linear(x, w, b, st);
  const auto sa = st->streams.seed_for(TensorKind::a, 0), sw = st->streams.seed_for(TensorKind::w, 0);
  const auto xq = scalar_q(x.detach(), lq[TensorKind::a], sa);
  const auto wq = scalar_q(w.detach(), lq[TensorKind::w], sw);
  EXPECT_TRUE(bit_equal(y.detach(), torch::linear(xq, wq, b.detach())));
  auto g = 1e-6 * torch::randn(y.sizes());  // small gradients, as in training
  auto grads = torch::autograd::grad({y}, {x, w, b}, {g});
  const auto gq = scalar_q(g, lq[TensorKind::gx], st->streams.seed_for(TensorKind::gx, 0));
  EXPECT_TRUE(bit_equal(grads[0], gq.mm(wq)));
  const auto dw = scalar_q(xq.t().mm(gq).t().contiguous(), lq[TensorKind::gw], st->streams.seed_for(TensorKind::gw, 0));
  EXPECT_TRUE(bit_equal(grads[1], dw));
  EXPECT_TRUE(bit_equal(grads[2], g.sum(0)));
  // The quantizers did something: values on the 1.5.2 grid, counts recorded.
  EXPECT_FALSE(bit_equal(gq, g));
  const auto counts = st->stats.counts();
  EXPECT_EQ(counts[static_cast<int>(TensorKind::a)].total, 48u);
  EXPECT_EQ(counts[static_cast<int>(TensorKind::gw)].total, 40u);
}

TEST(Ops, QuantizedConvAndMatmulAreTheComposition) {
  torch::manual_seed(5);
  LayerQuant lq = paper_quant();
  lq[TensorKind::gx]->element.rounding = Rounding::stochastic;  // a stream per tensor
  {
    auto x = torch::randn({2, 4, 7, 7}, torch::requires_grad());
    auto w = (0.2 * torch::randn({4, 1, 3, 3})).requires_grad_();
    auto st = make_layer_state("dw", lq, nullptr);
    auto y = quant_conv2d(x, w, {}, {1, 1}, {1, 1}, {1, 1}, 4, st);
    const auto xq = scalar_q(x.detach(), lq[TensorKind::a], st->streams.seed_for(TensorKind::a, 0));
    const auto wq = scalar_q(w.detach(), lq[TensorKind::w], st->streams.seed_for(TensorKind::w, 0));
    EXPECT_TRUE(bit_equal(y.detach(), torch::conv2d(xq, wq, {}, 1, 1, 1, 4)));
    auto g = 1e-5 * torch::randn(y.sizes());
    auto grads = torch::autograd::grad({y}, {x, w}, {g});
    const auto gq = scalar_q(g, lq[TensorKind::gx], st->streams.seed_for(TensorKind::gx, 0));
    auto [dx, dw, db] = at::convolution_backward(gq, xq, wq, std::nullopt, {1, 1}, {1, 1}, {1, 1},
                                                 false, {0, 0}, 4, {true, true, false});
    EXPECT_TRUE(bit_equal(grads[0], dx));
    EXPECT_TRUE(bit_equal(grads[1], scalar_q(dw, lq[TensorKind::gw], st->streams.seed_for(TensorKind::gw, 0))));
  }
  {
    auto a = torch::randn({3, 4, 5}, torch::requires_grad());
    auto b = torch::randn({3, 5, 2}, torch::requires_grad());
    auto st = make_layer_state("attn", lq, nullptr);
    auto y = quant_matmul(a, b, st);
    const auto aq = scalar_q(a.detach(), lq[TensorKind::a], st->streams.seed_for(TensorKind::a, 0, 0));
    const auto bq = scalar_q(b.detach(), lq[TensorKind::a], st->streams.seed_for(TensorKind::a, 0, 1));
    EXPECT_TRUE(bit_equal(y.detach(), torch::matmul(aq, bq)));
    auto g = torch::randn(y.sizes());
    auto grads = torch::autograd::grad({y}, {a, b}, {g});
    const auto gq = scalar_q(g, lq[TensorKind::gx], st->streams.seed_for(TensorKind::gx, 0));
    EXPECT_TRUE(bit_equal(grads[0], gq.matmul(bq.transpose(-2, -1))));
    EXPECT_TRUE(bit_equal(grads[1], aq.transpose(-2, -1).matmul(gq)));
  }
}

// Central differences on tiny shapes (float32 quantizers: the op must be differentiable).
TEST(Ops, GradientCheck) {
  torch::manual_seed(6);
  auto st = make_layer_state("lin", float_quant(), nullptr);
  auto x = torch::randn({3, 4}, torch::kFloat64).to(torch::kFloat32).requires_grad_();
  auto w = torch::randn({2, 4}).requires_grad_();
  auto r = torch::randn({3, 2});
  auto f = [&](const torch::Tensor& xx) { return (quant_linear(xx, w, {}, st) * r).sum().item<double>(); };
  auto y = (quant_linear(x, w, {}, st) * r).sum();
  auto gx = torch::autograd::grad({y}, {x})[0];
  const float eps = 1e-2f;
  for (int i = 0; i < 12; ++i) {
    auto xp = x.detach().clone(), xm = x.detach().clone();
    xp.view(-1)[i] += eps;
    xm.view(-1)[i] -= eps;
    const double num = (f(xp) - f(xm)) / (2 * eps);
    EXPECT_NEAR(gx.view(-1)[i].item<double>(), num, 2e-2 * (1 + std::abs(num)));
  }
}

TEST(Ops, SavingCodesGivesIdenticalGradientsAtAQuarterOfTheMemory) {
  torch::manual_seed(7);
  auto x = torch::randn({16, 64}, torch::requires_grad());
  auto w = (0.1 * torch::randn({32, 64})).requires_grad_();
  torch::Tensor grads[2][2];
  std::int64_t bytes[2], weight_bytes[2];
  for (int save = 0; save < 2; ++save) {
    auto ctx = std::make_shared<QuantContext>();
    ctx->save_codes = ctx->save_weight_codes = save == 1;
    auto st = make_layer_state("lin", paper_quant(), ctx);
    auto y = quant_linear(x, w, {}, st);
    bytes[save] = ctx->saved_bytes.load();
    weight_bytes[save] = ctx->saved_weight_bytes.load();
    auto g = torch::autograd::grad({y.pow(2).sum()}, {x, w});
    grads[save][0] = g[0];
    grads[save][1] = g[1];
  }
  EXPECT_TRUE(bit_equal(grads[0][0], grads[1][0]));
  EXPECT_TRUE(bit_equal(grads[0][1], grads[1][1]));
  EXPECT_EQ(bytes[0], 16 * 64 * 4);  // activations
  EXPECT_EQ(bytes[1] * 4, bytes[0]);
  EXPECT_EQ(weight_bytes[0], 32 * 64 * 4);  // weights
  EXPECT_EQ(weight_bytes[1] * 4, weight_bytes[0]);
}

// A gradient that only the op holds is quantized in its own memory; one that autograd
// also hands to another node (here through an add) is copied, or that node would receive
// quantized values.
TEST(Ops, GradientsAreQuantizedInPlaceOnlyWhenNothingElseHoldsThem) {
  torch::manual_seed(8);
  ASSERT_GT(backward_grad_refs(), 0) << "the probe could not measure libtorch's references";
  const LayerQuant lq = paper_quant();
  auto x = torch::randn({6, 8}, torch::requires_grad());
  auto w = (0.3 * torch::randn({5, 8})).requires_grad_();
  auto r = 1e-6 * torch::randn({6, 5});
  {
    // (y * r): MulBackward hands the op a fresh gradient, r, that nothing else holds.
    auto ctx = std::make_shared<QuantContext>();
    auto st = make_layer_state("lin", lq, ctx);
    auto y = quant_linear(x, w, {}, st);
    auto grads = torch::autograd::grad({(y * r).sum()}, {x, w});
    EXPECT_EQ(ctx->in_place.load(), 2);  // grad_x and grad_w
    const auto xq = scalar_q(x.detach(), lq[TensorKind::a], st->streams.seed_for(TensorKind::a, 0));
    const auto wq = scalar_q(w.detach(), lq[TensorKind::w], st->streams.seed_for(TensorKind::w, 0));
    const auto gq = scalar_q(r, lq[TensorKind::gx], st->streams.seed_for(TensorKind::gx, 0));
    EXPECT_FALSE(bit_equal(gq, r));
    EXPECT_TRUE(bit_equal(grads[0], gq.mm(wq)));
    EXPECT_TRUE(bit_equal(grads[1], scalar_q(xq.t().mm(gq).t().contiguous(), lq[TensorKind::gw],
                                             st->streams.seed_for(TensorKind::gw, 0))));
  }
  {
    // out = float_branch + quantized_branch, the quantized one built last so that its
    // backward runs first: the add gives both branches the same gradient tensor.
    auto x2 = torch::randn({6, 8});
    auto w2 = torch::randn({5, 8}, torch::requires_grad());
    auto float_branch = torch::linear(x2, w2);
    auto ctx = std::make_shared<QuantContext>();
    auto st = make_layer_state("lin", lq, ctx);
    auto out = float_branch + quant_linear(x, w, {}, st);
    auto grads = torch::autograd::grad({(out * r).sum()}, {x, w, w2});
    EXPECT_EQ(ctx->in_place.load(), 1);  // grad_w only
    EXPECT_TRUE(bit_equal(grads[2], r.t().mm(x2)));  // the float branch saw r, unquantized
    const auto wq = scalar_q(w.detach(), lq[TensorKind::w], st->streams.seed_for(TensorKind::w, 0));
    const auto gq = scalar_q(r, lq[TensorKind::gx], st->streams.seed_for(TensorKind::gx, 0));
    EXPECT_TRUE(bit_equal(grads[0], gq.mm(wq)));
  }
}

// The split products (forward and backward as two calls joined by a handle, what
// torch.compile's custom ops run) give the autograd functions' outputs and gradients bit
// for bit: fixed-bias with stochastic rounding, and block-scaled (NVFP4, with its
// stochastic grad_x and a Hadamard transform on grad_w).
TEST(Ops, SplitProductsEqualTheAutogradFunctions) {
  for (const char* recipe : {"a=1.4.3:10/stochastic,w=1.4.3:14,gx=1.5.2:33/stochastic,gw=1.5.2:31",
                             "a=nvfp4,w=nvfp4,gx=nvfp4/stochastic,gw=fp32"}) {
    const LayerQuant lq = parse_recipe(recipe).base;
    torch::manual_seed(12);
    const auto x = torch::randn({4, 3, 32}), w = torch::randn({16, 32}), b = torch::randn({16});
    const auto img = torch::randn({2, 4, 6, 6}), k = torch::randn({8, 2, 3, 3});
    const auto seq = torch::randn({2, 4, 8}), k1 = torch::randn({6, 4, 3});
    const auto p = torch::randn({2, 3, 5, 32}), q = torch::randn({2, 3, 32, 4});
    // Each product as a function of its tensor inputs, both ways.
    using Inputs = std::vector<torch::Tensor>;
    struct Case {
      const char* name;
      Inputs in;
      std::function<torch::Tensor(const Inputs&, const LayerStatePtr&)> autograd;
      std::function<SplitForward(const Inputs&, const LayerStatePtr&)> split;
    } cases[] = {
        {"linear", {x, w, b}, [](const Inputs& i, const LayerStatePtr& st) { return quant_linear(i[0], i[1], i[2], st); },
         [](const Inputs& i, const LayerStatePtr& st) { return quant_linear_forward(i[0], i[1], i[2], st); }},
        {"conv2d", {img, k, torch::randn({8})},
         [](const Inputs& i, const LayerStatePtr& st) { return quant_conv2d(i[0], i[1], i[2], {1}, {1}, {1}, 2, st); },
         [](const Inputs& i, const LayerStatePtr& st) {
           return quant_conv2d_forward(i[0], i[1], i[2], {1}, {1}, {1}, 2, st);
         }},
        {"conv1d", {seq, k1, torch::randn({6})},
         [](const Inputs& i, const LayerStatePtr& st) {
           return quant_conv(i[0], i[1], i[2], {2}, {1}, {1}, false, {0}, 1, st);
         },
         [](const Inputs& i, const LayerStatePtr& st) {
           return quant_conv_forward(i[0], i[1], i[2], {2}, {1}, {1}, false, {0}, 1, st);
         }},
        {"matmul", {p, q}, [](const Inputs& i, const LayerStatePtr& st) { return quant_matmul(i[0], i[1], st); },
         [](const Inputs& i, const LayerStatePtr& st) { return quant_matmul_forward(i[0], i[1], st); }},
    };
    for (const auto& c : cases) {
      SCOPED_TRACE(std::string(recipe) + " " + c.name);
      Inputs leaves;
      for (const auto& t : c.in) leaves.push_back(t.clone().requires_grad_());
      auto st_a = make_layer_state(c.name, lq, nullptr);
      const torch::Tensor y = c.autograd(leaves, st_a);
      const auto r = torch::randn(y.sizes());
      const auto grads = torch::autograd::grad({(y * r).sum()}, leaves);
      auto st_s = make_layer_state(c.name, lq, nullptr);
      SplitForward f = c.split(c.in, st_s);
      EXPECT_TRUE(bit_equal(f.y, y));
      const auto split_grads = quant_backward(r, f.handle, std::vector<bool>(c.in.size(), true));
      ASSERT_EQ(split_grads.size(), c.in.size());
      for (std::size_t i = 0; i < c.in.size(); ++i) EXPECT_TRUE(bit_equal(split_grads[i], grads[i])) << "grad " << i;
      EXPECT_EQ(st_s->stats.counts(), st_a->stats.counts());
      // A gradient not asked for is not computed.
      const auto only_x = quant_backward(r, f.handle, [&] {
        std::vector<bool> n(c.in.size(), false);
        n[0] = true;
        return n;
      }());
      EXPECT_TRUE(bit_equal(only_x[0], grads[0]));
      for (std::size_t i = 1; i < c.in.size(); ++i) EXPECT_FALSE(only_x[i].defined());
    }
  }
}

namespace {
// Built with the drop-in quantized layers (float32 until a recipe is applied).
struct TinyNetImpl : torch::nn::Module {
  TinyNetImpl() {
    conv = register_module("conv", QuantConv2d(torch::nn::Conv2dOptions(1, 4, 3).padding(1)));
    fc1 = register_module("fc1", QuantLinear(4 * 8 * 8, 16));
    fc2 = register_module("fc2", QuantLinear(16, 3));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(conv->forward(x)).flatten(1);
    return fc2->forward(torch::relu(fc1->forward(x)));
  }
  QuantConv2d conv{nullptr};
  QuantLinear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(TinyNet);

std::vector<float> train_tiny(std::uint64_t seed, std::vector<torch::Tensor>* weights = nullptr) {
  torch::manual_seed(0);
  TinyNet net;
  Recipe r = parse_recipe("a=1.4.3:10/stochastic,w=1.4.3:14,gx=1.5.2:33/stochastic,gw=1.5.2:31/stochastic");
  auto ctx = std::make_shared<QuantContext>();
  ctx->seed = seed;
  auto qm = quantize_model(*net, r, ctx);
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  auto x = torch::randn({8, 1, 8, 8});
  auto t = torch::randint(0, 3, {8});
  std::vector<float> losses;
  for (int step = 0; step < 20; ++step) {
    opt.zero_grad();
    auto loss = torch::nn::functional::cross_entropy(net->forward(x), t);
    loss.backward();
    opt.step();
    ctx->step++;
    losses.push_back(loss.item<float>());
  }
  if (weights)
    for (auto& p : net->parameters()) weights->push_back(p.detach().clone());
  return losses;
}
}  // namespace

TEST(Modules, ConvertsByPathAndAppliesTheRecipe) {
  TinyNet net;
  Recipe r = parse_recipe("resnet32-mixed");
  RecipeOverride o;
  o.pattern = "fc2";
  o.set[static_cast<int>(TensorKind::a)].emplace(std::nullopt);  // set to float32
  r.overrides.push_back(o);
  auto qm = quantize_model(*net, r);
  ASSERT_EQ(qm.layers.size(), 3u);
  EXPECT_EQ(qm.layers[0]->name, "conv");
  EXPECT_EQ(qm.layers[1]->name, "fc1");
  EXPECT_EQ(qm.layers[2]->name, "fc2");
  EXPECT_FALSE(qm.layer("conv")->quant[TensorKind::a]);   // first layer's input stays float32
  EXPECT_FALSE(qm.layer("conv")->quant[TensorKind::gx]);
  EXPECT_TRUE(qm.layer("conv")->quant[TensorKind::w]);
  EXPECT_TRUE(qm.layer("fc1")->quant[TensorKind::a]);
  EXPECT_FALSE(qm.layer("fc2")->quant[TensorKind::a]);     // the override
  EXPECT_TRUE(qm.layer("fc2")->quant[TensorKind::w]);
  auto y = net->forward(torch::randn({2, 1, 8, 8}));
  EXPECT_EQ(y.sizes(), (std::vector<std::int64_t>{2, 3}));
  EXPECT_EQ(qm.layer("fc1")->stats.counts()[static_cast<int>(TensorKind::a)].total, 2u * 16 * 16);
  Recipe bad = parse_recipe("fp32");
  bad.overrides.push_back({"decoder.*", {}});
  TinyNet net2;
  EXPECT_THROW(quantize_model(*net2, bad), Error);
}

TEST(Modules, ConvertsSequentialInPlace) {
  torch::manual_seed(3);
  torch::nn::Sequential seq(torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 2, 3)), torch::nn::ReLU(),
                            torch::nn::Flatten(), torch::nn::Linear(2 * 4 * 4, 3));
  auto params_before = seq->parameters();
  auto x = torch::randn({2, 1, 6, 6});
  auto y_float = seq->forward(x);
  auto qm = quantize_model(*seq, parse_recipe("a=1.4.3:10,w=1.4.3:14,first=0"));
  ASSERT_EQ(qm.layers.size(), 2u);
  EXPECT_EQ(qm.layers[0]->name, "0");
  EXPECT_EQ(qm.layers[1]->name, "3");
  // The same parameter tensors: an optimizer built before conversion still trains them.
  auto params_after = seq->parameters();
  ASSERT_EQ(params_before.size(), params_after.size());
  for (std::size_t i = 0; i < params_before.size(); ++i)
    EXPECT_TRUE(params_before[i].is_same(params_after[i]));
  auto y = seq->forward(x);  // now through the quantized layers
  EXPECT_FALSE(bit_equal(y, y_float));
  EXPECT_EQ(qm.layers[1]->stats.counts()[static_cast<int>(TensorKind::w)].total, 3u * 32);
}

TEST(Modules, PlainMemberLayersAreRefusedByName) {
  struct PlainImpl : torch::nn::Module {
    PlainImpl() { fc = register_module("fc", torch::nn::Linear(4, 2)); }
    torch::nn::Linear fc{nullptr};
  };
  auto m = std::make_shared<PlainImpl>();
  try {
    quantize_model(*m, parse_recipe("fp32"));
    ADD_FAILURE() << "accepted a plain member layer";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'fc'"), std::string::npos) << e.what();
  }
}

TEST(Modules, TrainingIsDeterministicAndWeightsStayFloat32) {
  std::vector<torch::Tensor> w1, w2;
  const auto a = train_tiny(42, &w1);
  const auto b = train_tiny(42, &w2);
  EXPECT_EQ(a, b);
  ASSERT_EQ(w1.size(), w2.size());
  for (std::size_t i = 0; i < w1.size(); ++i) EXPECT_TRUE(bit_equal(w1[i], w2[i]));
  EXPECT_NE(train_tiny(43), a);  // the seed matters
  EXPECT_LT(a.back(), a.front());  // and it learns
  // Master weights are float32, not on the 1.4.3 grid.
  const auto& fc1w = w1[2];
  const auto q = scalar_q(fc1w, parse_recipe("w=1.4.3:14").base[TensorKind::w], 0);
  EXPECT_FALSE(bit_equal(fc1w, q));
}

TEST(Stats, RecordsEveryNSteps) {
  torch::manual_seed(1);
  TinyNet net;
  auto ctx = std::make_shared<QuantContext>();
  ctx->stats_interval = 2;
  auto qm = quantize_model(*net, parse_recipe("resnet32-mixed"), ctx);
  for (int step = 0; step < 4; ++step) {
    auto y = net->forward(torch::randn({2, 1, 8, 8}));
    y.sum().backward();
    ctx->step++;
  }
  const auto recs = ctx->stats->take();
  // Steps 0 and 2, three layers, four kinds each.
  EXPECT_EQ(recs.size(), 2u * 3u * 4u);
  for (const auto& r : recs) {
    EXPECT_TRUE(r.step == 0 || r.step == 2);
    EXPECT_EQ(r.hist.total(), r.counts.total);
  }
}
