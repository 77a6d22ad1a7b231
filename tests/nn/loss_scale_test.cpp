#include <gtest/gtest.h>

#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>

#include "fp8lab/core/error.hpp"
#include "fp8lab/nn/loss_scale.hpp"

using namespace fp8lab;
using namespace fp8lab::nn;

TEST(LossScale, ParsesConfigs) {
  EXPECT_EQ(parse_loss_scale("none").method, LossScaleMethod::none);
  EXPECT_EQ(parse_loss_scale("static:22").init_log2, 22);
  const auto b = parse_loss_scale("backoff:init=10,interval=50,factor=4");
  EXPECT_EQ(b.method, LossScaleMethod::backoff);
  EXPECT_EQ(b.init_log2, 10);
  EXPECT_EQ(b.interval, 50);
  EXPECT_EQ(b.backoff_log2_factor, 2);
  EXPECT_EQ(parse_loss_scale("logmax:c=2").c, 2.0);
  EXPECT_THROW(parse_loss_scale("dynamic"), Error);
  EXPECT_EQ(parse_loss_scale("fixed:3").method, LossScaleMethod::fixed);  // another name of static
  for (LossScaleMethod m : {LossScaleMethod::none, LossScaleMethod::backoff, LossScaleMethod::logmax})
    EXPECT_EQ(parse_loss_scale(std::string(to_string(m))).method, m);
  EXPECT_EQ(to_string(LossScaleMethod::fixed), "static");
  EXPECT_THROW(parse_loss_scale("backoff:c=1"), Error);
  EXPECT_THROW(parse_loss_scale("backoff:factor=3"), Error);
  EXPECT_THROW(parse_loss_scale("logmax:c=x"), Error);
}

TEST(LossScale, OneLineFormWritesWhatDiffersFromTheMethodsDefault) {
  EXPECT_EQ(to_string(parse_loss_scale("none")), "none");
  EXPECT_EQ(to_string(parse_loss_scale("backoff")), "backoff");
  EXPECT_EQ(to_string(parse_loss_scale("backoff:init=16,interval=2000")), "backoff");
  EXPECT_EQ(to_string(parse_loss_scale("fixed:22")), "static:22");
  EXPECT_EQ(to_string(parse_loss_scale("static:22,max_log2=30")), "static:22,max_log2=30");
  EXPECT_EQ(to_string(parse_loss_scale("backoff:factor=4,interval=50,init=10")), "backoff:init=10,interval=50,factor=4");
  EXPECT_EQ(to_string(parse_loss_scale("logmax:c=1,init=10,beta2=0.99,max=448")),
            "logmax:init=10,c=1,beta2=0.99,max=448");
}

// Every config the parser can produce prints to a line that parses back to it: drawn at
// random over every key of every method, values at the edges of their ranges included.
TEST(LossScale, EveryConfigRoundTripsThroughItsOneLineForm) {
  std::mt19937_64 rng(7);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int i = 0; i < 20000; ++i) {
    LossScaleConfig c;
    c.method = static_cast<LossScaleMethod>(pick(0, 3));
    c.min_log2 = pick(-126, 0);
    c.max_log2 = pick(0, 127);
    c.init_log2 = pick(c.min_log2, c.max_log2);
    if (c.method == LossScaleMethod::backoff) {
      c.interval = pick(0, 1) ? pick(1, 1000000000) : 2000;
      c.backoff_log2_factor = pick(1, 64);
    }
    if (c.method == LossScaleMethod::logmax) {
      c.c = std::uniform_real_distribution<double>(-8, 8)(rng);
      c.beta1 = std::uniform_real_distribution<double>(1e-9, 1 - 1e-9)(rng);
      c.beta2 = pick(0, 1) ? 0.999 : std::uniform_real_distribution<double>(1e-9, 1 - 1e-9)(rng);
      c.grad_format_max = std::ldexp(std::uniform_real_distribution<double>(0.5, 1)(rng), pick(-100, 100));
    }
    const std::string line = to_string(c);
    ASSERT_EQ(parse_loss_scale(line), c) << line;
  }
}

TEST(LossScale, OutOfRangeValuesAreErrorsNotConversions) {
  // A scale that is no float32 (2^1e300, 2^-1e300) or a fraction of an exponent is refused
  // with the value named, instead of becoming some other scale.
  for (const char* bad : {"static:1e300", "static:-1e300", "static:22.5", "static:128", "backoff:init=-127",
                          "backoff:interval=0", "backoff:interval=1e12", "backoff:factor=1e300",
                          "logmax:min_log2=1e300", "logmax:max=0", "logmax:max=-1",
                          "backoff:init=70"}) {  // above the default max_log2 = 64
    try {
      parse_loss_scale(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const fp8lab::Error& e) {
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(parse_loss_scale("static:127,max_log2=127").init_log2, 127);
  EXPECT_EQ(parse_loss_scale("static:-126,min_log2=-126").init_log2, -126);
}

TEST(LossScale, BackoffSkipsAndHalvesThenDoubles) {
  LossScaler s(parse_loss_scale("backoff:init=8,interval=3"));
  EXPECT_EQ(s.scale(), 256.0);
  auto r = s.update_from(-5, /*overflow=*/true);
  EXPECT_TRUE(r.skipped);
  EXPECT_EQ(r.scale, 256.0);
  EXPECT_EQ(s.scale(), 128.0);
  EXPECT_FALSE(s.update_from(-5, false).skipped);
  EXPECT_FALSE(s.update_from(-5, false).skipped);
  EXPECT_EQ(s.scale(), 128.0);
  s.update_from(-5, false);  // third clean step in a row
  EXPECT_EQ(s.scale(), 256.0);
  s.update_from(-5, false);
  s.update_from(-5, true);  // an overflow resets the clean-step count
  EXPECT_EQ(s.scale(), 128.0);
  s.update_from(-5, false);
  s.update_from(-5, false);
  EXPECT_EQ(s.scale(), 128.0);
  EXPECT_EQ(s.skipped_steps(), 2u);
}

TEST(LossScale, BackoffOnRealTensorsUnscalesAndDetectsNaN) {
  LossScaler s(parse_loss_scale("backoff:init=4,interval=100"));
  torch::Tensor g1 = torch::tensor({16.0f, -32.0f});
  torch::Tensor g2 = torch::tensor({8.0f});
  auto r = s.update({g1, g2});
  EXPECT_FALSE(r.overflow);
  EXPECT_EQ(g1[1].item<float>(), -2.0f);  // divided by alpha = 16
  EXPECT_EQ(g2[0].item<float>(), 0.5f);
  EXPECT_DOUBLE_EQ(r.log2_max_grad, 1.0);
  torch::Tensor bad = torch::tensor({1.0f, std::numeric_limits<float>::quiet_NaN()});
  r = s.update({g1, bad});
  EXPECT_TRUE(r.overflow);
  EXPECT_TRUE(r.skipped);
  EXPECT_EQ(s.scale(), 8.0);
}

// LogMax on a scripted sequence of gradient maxima: the scale follows
// floor(log2(max) - (mu + c sigma)), with mu and sigma recomputed here from their
// definition (bias-corrected exponential averages).
TEST(LossScale, LogMaxFollowsTheFormula) {
  for (double c : {0.0, 1.0, 2.0, 3.0}) {
    LossScaleConfig cfg = parse_loss_scale("logmax:init=5");
    cfg.c = c;
    cfg.grad_format_max = 57344;  // 1.5.2 bias 15
    LossScaler s(cfg);
    EXPECT_EQ(s.log2_scale(), 5);
    double m1 = 0, mx = 0, mx2 = 0, p1 = 1, p2 = 1;
    for (int i = 0; i < 300; ++i) {
      const double l = -20.0 + 3.0 * std::sin(i * 0.37) + (i % 7) * 0.25;
      s.update_from(l, false);
      m1 = 0.99 * m1 + 0.01 * l;
      mx = 0.999 * mx + 0.001 * l;
      mx2 = 0.999 * mx2 + 0.001 * l * l;
      p1 *= 0.99;
      p2 *= 0.999;
      const double mu = m1 / (1 - p1);
      const double mean2 = mx / (1 - p2);
      const double sigma = std::sqrt(std::max(0.0, mx2 / (1 - p2) - mean2 * mean2));
      const int want = static_cast<int>(std::floor(std::log2(57344.0) - (mu + c * sigma)));
      ASSERT_EQ(s.log2_scale(), want) << "step " << i << " c " << c;
    }
  }
  // Around l = -20 with 1.5.2 bias 15 the scale settles near 2^35 for c = 0.
  LossScaler s(parse_loss_scale("logmax"));
  for (int i = 0; i < 1000; ++i) s.update_from(-20, false);
  EXPECT_EQ(s.log2_scale(), 35);
}

#include "fp8lab/nn/modules.hpp"

// End to end: a model whose gradient quantizers use overflow mode nan; a huge loss scale
// makes grad_x overflow into NaN, Backoff skips the step and halves the scale until the
// gradients fit, and the weights are untouched by the skipped steps.
TEST(LossScale, BackoffRecoversFromRealOverflowInAQuantizedModel) {
  torch::manual_seed(0);
  torch::nn::Sequential net(torch::nn::Linear(8, 8), torch::nn::ReLU(), torch::nn::Linear(8, 2));
  auto qm = quantize_model(*net, parse_recipe("a=1.4.3:10,w=1.4.3:14,gx=1.5.2:15/nan,gw=1.5.2:15/nan,first=0"));
  LossScaler scaler(parse_loss_scale("backoff:init=40,interval=1000"));
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.01));
  auto x = torch::randn({4, 8});
  const auto w_before = net->parameters()[0].detach().clone();
  int skipped = 0;
  for (int step = 0; step < 60; ++step) {
    opt.zero_grad();
    (net->forward(x).pow(2).mean() * scaler.scale()).backward();
    std::vector<torch::Tensor> grads;
    for (auto& p : net->parameters()) grads.push_back(p.grad());
    const auto r = scaler.update(grads);
    if (r.skipped) {
      ++skipped;
      EXPECT_TRUE(r.overflow);
      EXPECT_TRUE(torch::equal(net->parameters()[0].detach(), w_before));  // nothing applied yet
      continue;
    }
    opt.step();
    break;
  }
  EXPECT_GT(skipped, 5);  // 2^40 is far above what 1.5.2 bias 15 (max 57344) holds
  EXPECT_LT(scaler.log2_scale(), 40);
  EXPECT_EQ(scaler.skipped_steps(), static_cast<std::uint64_t>(skipped));
  EXPECT_FALSE(torch::equal(net->parameters()[0].detach(), w_before));  // then it trains
  EXPECT_GT(qm.layers[1]->stats.counts()[static_cast<int>(TensorKind::gx)].nan, 0u);
}
