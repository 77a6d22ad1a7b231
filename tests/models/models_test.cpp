// Models on tiny shapes with every quantizer on: forward and backward run, every
// convolution and matmul is a quantized layer, gradients reach every parameter.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "fp8lab/models/resnet.hpp"
#include "fp8lab/models/transformer.hpp"

using namespace fp8lab;

TEST(Models, CifarResNetForwardBackwardQuantized) {
  torch::manual_seed(0);
  models::CifarResNetOptions o;
  o.depth = 8;
  o.in_channels = 1;
  o.width = 4;
  auto m = models::CifarResNet(o);
  auto qm = nn::quantize_model(*m, nn::parse_recipe("resnet32-mixed"));
  // stem, 3 stages x 1 block x 2 convs, 2 projection shortcuts, fc
  EXPECT_EQ(qm.layers.size(), 1u + 6u + 2u + 1u);
  EXPECT_EQ(qm.layers.front()->name, "stem");
  EXPECT_EQ(qm.layers.back()->name, "fc");
  auto y = m->forward(torch::randn({2, 1, 12, 12}));
  EXPECT_EQ(y.sizes(), (std::vector<std::int64_t>{2, 10}));
  torch::nn::functional::cross_entropy(y, torch::tensor({1, 2})).backward();
  for (const auto& p : m->named_parameters()) {
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    EXPECT_TRUE(torch::isfinite(p.value().grad()).all().item<bool>()) << p.key();
  }
  for (const auto& l : qm.layers)
    EXPECT_GT(l->counts()[static_cast<int>(nn::TensorKind::w)].total, 0u) << l->name;
  EXPECT_THROW(models::CifarResNet(models::CifarResNetOptions{.depth = 21}), Error);
}

TEST(Models, EncoderLayerForwardBackwardQuantized) {
  torch::manual_seed(0);
  auto m = models::EncoderLayer(16, 4, 32, 0.0);
  auto qm = nn::quantize_model(*m, nn::parse_recipe("transformer-mixed"));
  // wq wk wv wo, scores, context, ff1, ff2
  EXPECT_EQ(qm.layers.size(), 8u);
  EXPECT_EQ(qm.layer("attn.scores")->quant[nn::TensorKind::a]->format, parse_format("1.4.3:10"));
  auto x = torch::randn({2, 5, 16}, torch::requires_grad());
  auto mask = torch::zeros({1, 1, 5, 5}, torch::kBool);
  mask.index_put_({0, 0, 0, 4}, true);
  auto y = m->forward(x, mask);
  EXPECT_EQ(y.sizes(), x.sizes());
  y.pow(2).sum().backward();
  EXPECT_TRUE(torch::isfinite(x.grad()).all().item<bool>());
  for (const auto& p : m->named_parameters()) ASSERT_TRUE(p.value().grad().defined()) << p.key();
  EXPECT_GT(qm.layer("attn.context")->counts()[static_cast<int>(nn::TensorKind::gx)].total, 0u);
}
