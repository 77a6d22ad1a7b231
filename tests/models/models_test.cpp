// Models on tiny shapes with every quantizer on: forward and backward run, every
// convolution and matmul is a quantized layer, gradients reach every parameter.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <set>

#include "../common/testutil.hpp"
#include "fp8lab/models/bert.hpp"
#include "fp8lab/models/gpt.hpp"
#include "fp8lab/models/image_models.hpp"
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
    EXPECT_GT(l->stats.counts()[static_cast<int>(nn::TensorKind::w)].total, 0u) << l->name;
  EXPECT_THROW(models::CifarResNet(models::CifarResNetOptions{.depth = 21}), Error);
}

TEST(Models, EncoderLayerForwardBackwardQuantized) {
  torch::manual_seed(0);
  auto m = models::EncoderLayer(16, 4, 32, 0.0);
  auto qm = nn::quantize_model(*m, nn::parse_recipe("transformer-mixed"));
  // wq wk wv wo, scores, context, ff1, ff2
  EXPECT_EQ(qm.layers.size(), 8u);
  EXPECT_EQ(qm.layer("attn.scores")->quant[nn::TensorKind::a]->element.format, parse_format("1.4.3:10"));
  auto x = torch::randn({2, 5, 16}, torch::requires_grad());
  auto mask = torch::zeros({1, 1, 5, 5}, torch::kBool);
  mask.index_put_({0, 0, 0, 4}, true);
  auto y = m->forward(x, mask);
  EXPECT_EQ(y.sizes(), x.sizes());
  y.pow(2).sum().backward();
  EXPECT_TRUE(torch::isfinite(x.grad()).all().item<bool>());
  for (const auto& p : m->named_parameters()) ASSERT_TRUE(p.value().grad().defined()) << p.key();
  EXPECT_GT(qm.layer("attn.context")->stats.counts()[static_cast<int>(nn::TensorKind::gx)].total, 0u);
}

namespace {
// Every quantized layer saw weights (or, for attention matmuls, activations), and every
// parameter got a finite gradient.
void check_quantized_training_step(const models::ImageModel& m, const nn::QuantizedModel& qm,
                                   const torch::Tensor& x, std::int64_t classes) {
  auto y = m.forward(x);
  ASSERT_EQ(y.sizes(), (std::vector<std::int64_t>{x.size(0), classes}));
  torch::nn::functional::cross_entropy(y, torch::arange(x.size(0), torch::kInt64).remainder(classes)).backward();
  for (const auto& p : m.module->named_parameters()) {
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    EXPECT_TRUE(torch::isfinite(p.value().grad()).all().item<bool>()) << p.key();
  }
  for (const auto& l : qm.layers) {
    const auto c = l->stats.counts();
    EXPECT_GT(c[static_cast<int>(nn::TensorKind::w)].total, 0u) << l->name;
    EXPECT_GT(c[static_cast<int>(nn::TensorKind::gx)].total, 0u) << l->name;
    EXPECT_GT(c[static_cast<int>(nn::TensorKind::gw)].total, 0u) << l->name;
  }
}
std::size_t count_convs_and_linears(torch::nn::Module& m) {
  std::size_t n = 0;
  for (const auto& c : m.modules(false))
    if (c->as<nn::QuantConv2dImpl>() || c->as<nn::QuantLinearImpl>()) ++n;
  return n;
}
}  // namespace

TEST(Models, ImageNetResNetsForwardBackwardQuantized) {
  for (int depth : {18, 50}) {
    torch::manual_seed(0);
    models::ImageModelSpec s;
    s.name = "resnet" + std::to_string(depth);
    s.width = 4;
    s.num_classes = 5;
    s.image_size = 16;
    auto m = models::make_image_model(s);
    auto qm = nn::quantize_model(*m.module, nn::parse_recipe("resnet50-mixed"));
    // stem + blocks x (2 or 3 convs) + 4 projection shortcuts (the first stage of
    // ResNet-18 keeps its width, so 3 there) + fc
    const std::size_t expect = depth == 18 ? 1 + 8 * 2 + 3 + 1 : 1 + 16 * 3 + 4 + 1;
    EXPECT_EQ(qm.layers.size(), expect) << depth;
    EXPECT_EQ(count_convs_and_linears(*m.module), qm.layers.size());
    check_quantized_training_step(m, qm, torch::randn({2, 3, 16, 16}), 5);
  }
  // The ImageNet stem (7x7 stride 2 + max pooling) for large images.
  models::ImageModelSpec s;
  s.name = "resnet18";
  s.width = 4;
  s.image_size = 96;
  auto m = models::make_image_model(s);
  EXPECT_EQ(m.forward(torch::randn({1, 3, 96, 96})).sizes(), (std::vector<std::int64_t>{1, 10}));
}

TEST(Models, EfficientNetForwardBackwardQuantized) {
  torch::manual_seed(0);
  models::ImageModelSpec s;
  s.name = "efficientnet-b0";
  s.width_mult = 0.25;
  s.depth_mult = 0.5;
  s.num_classes = 3;
  s.image_size = 16;
  auto m = models::make_image_model(s);
  // Squeeze-excitation convolutions and depthwise convolutions are quantized layers too.
  auto qm = nn::quantize_model(*m.module, nn::parse_recipe("efficientnet-mixed"));
  EXPECT_EQ(count_convs_and_linears(*m.module), qm.layers.size());
  int depthwise = 0;
  for (const auto& c : m.module->modules(false))
    if (auto* q = c->as<nn::QuantConv2dImpl>(); q && q->options.groups() > 1) ++depthwise;
  EXPECT_GE(depthwise, 7);  // at least one block per stage
  check_quantized_training_step(m, qm, torch::randn({2, 3, 16, 16}), 3);
  // The published scalings: B0 has 16 MBConv blocks and 5.3 M parameters; B4 32 blocks.
  auto b0 = std::dynamic_pointer_cast<models::EfficientNetImpl>(
      models::make_image_model({.name = "efficientnet-b0", .num_classes = 1000, .image_size = 224}).module);
  ASSERT_TRUE(b0);
  EXPECT_EQ(b0->blocks->size(), 16u);
  std::int64_t params = 0;
  for (const auto& p : b0->parameters()) params += p.numel();
  EXPECT_NEAR(static_cast<double>(params) / 1e6, 5.29, 0.02);
  auto b4 = std::dynamic_pointer_cast<models::EfficientNetImpl>(
      models::make_image_model({.name = "efficientnet-b4", .num_classes = 1000, .image_size = 380}).module);
  EXPECT_EQ(b4->blocks->size(), 32u);
  EXPECT_NE(test::error_of([] { models::make_image_model({.name = "efficientnet-b9"}); }).find("unknown model"),
            std::string::npos);
}

// to_channels_last lays every convolution weight out NHWC without changing a value; a
// channels-last batch then gives the NCHW model's outputs and gradients up to the order of
// float32 sums (through batch norms on 4 images: relative 1e-4 to 1e-3 of the largest
// gradient; a layout mix-up would be of order 1).
TEST(Models, ChannelsLastKeepsValuesAndLayout) {
  for (const char* name : {"resnet8", "efficientnet-b0"}) {
    SCOPED_TRACE(name);
    models::ImageModelSpec s;
    s.name = name;
    s.width_mult = 0.25;
    s.depth_mult = 0.5;
    s.num_classes = 3;
    s.image_size = 16;
    torch::manual_seed(0);
    auto a = models::make_image_model(s);
    torch::manual_seed(0);
    auto b = models::make_image_model(s);
    models::to_channels_last(*b.module);
    const auto pa = a.module->parameters(), pb = b.module->parameters();
    ASSERT_EQ(pa.size(), pb.size());
    int convs = 0;
    for (std::size_t i = 0; i < pa.size(); ++i) {
      EXPECT_TRUE(torch::equal(pa[i], pb[i]));
      if (pb[i].dim() == 4) {
        ++convs;
        EXPECT_TRUE(pb[i].is_contiguous(torch::MemoryFormat::ChannelsLast));
        if (pb[i].size(2) * pb[i].size(3) > 1 && pb[i].size(1) > 1) {
          EXPECT_FALSE(pb[i].is_contiguous()) << "weight " << i << " " << pb[i].sizes();
        }
      }
    }
    EXPECT_GE(convs, 7);
    torch::manual_seed(1);
    const torch::Tensor x = torch::randn({4, 3, 16, 16});
    a.module->train();
    b.module->train();
    torch::manual_seed(2);  // the same dropout and stochastic-depth draws (per sample and per
    const torch::Tensor ya = a.forward(x);  // feature: no mask has the layout of an image)
    torch::manual_seed(2);
    const torch::Tensor yb = b.forward(x.contiguous(torch::MemoryFormat::ChannelsLast));
    EXPECT_TRUE(torch::allclose(ya, yb, 1e-4, 1e-5)) << (ya - yb).abs().max().item<double>();
    ya.pow(2).sum().backward();
    yb.pow(2).sum().backward();
    double largest = 0;  // gradients that vanish in exact arithmetic are rounding noise of this size
    for (const auto& p : pa) largest = std::max(largest, p.grad().abs().max().item<double>());
    for (std::size_t i = 0; i < pa.size(); ++i) {
      const double diff = (pa[i].grad() - pb[i].grad()).abs().max().item<double>();
      const double scale = pa[i].grad().abs().max().item<double>();
      EXPECT_LE(diff, 2e-3 * scale + 1e-6 * largest) << "parameter " << i << " " << pa[i].sizes() << ": " << diff << " of " << scale;
    }
  }
}

TEST(Models, EfficientNetBatchNormMomentum) {
  // Every batch norm takes the spec's momentum; 0 keeps the reference's 0.01.
  for (const auto& [given, expected] : std::vector<std::pair<double, double>>{{0, 0.01}, {0.1, 0.1}}) {
    models::ImageModelSpec s;
    s.name = "efficientnet-b0";
    s.width_mult = 0.25;
    s.depth_mult = 0.5;
    s.image_size = 16;
    s.bn_momentum = given;
    const auto m = models::make_image_model(s);
    int norms = 0;
    for (const auto& c : m.module->modules(false))
      if (auto* bn = c->as<torch::nn::BatchNorm2dImpl>()) {
        ++norms;
        ASSERT_TRUE(bn->options.momentum().has_value());
        EXPECT_EQ(*bn->options.momentum(), expected);
      }
    EXPECT_GE(norms, 2 + 3 * 7 - 1);  // stem, head, three per block (two in the first)
    EXPECT_NE(m.description.find("batch-norm momentum " + std::string(given == 0 ? "0.01" : "0.1")), std::string::npos)
        << m.description;
  }
}

TEST(Models, TransformerForwardBackwardQuantizedAndMasks) {
  torch::manual_seed(0);
  models::TransformerOptions o = models::transformer_preset("transformer-tiny");
  o.vocab = 50;
  o.dropout = 0;
  auto m = models::Transformer(o);
  auto qm = nn::quantize_model(*m, nn::parse_recipe("transformer-mixed"));
  // Per encoder layer 4 projections + 2 attention matmuls + 2 feed-forward; per decoder
  // layer twice the attention; plus the tied output projection.
  EXPECT_EQ(qm.layers.size(), 2u * 8 + 2u * 14 + 1u);
  EXPECT_EQ(qm.layers.back()->name, "out");
  const torch::Tensor src = torch::tensor({{5, 6, 7, 8, 0, 0}, {9, 10, 11, 12, 13, 14}}, torch::kInt64);
  const torch::Tensor tgt = torch::tensor({{2, 20, 21, 0}, {2, 22, 23, 24}}, torch::kInt64);
  auto logits = m->forward(src, tgt);
  ASSERT_EQ(logits.sizes(), (std::vector<std::int64_t>{2, 4, 50}));
  torch::nn::functional::cross_entropy(logits.reshape({-1, 50}), torch::tensor({20, 21, 3, 0, 22, 23, 24, 3}),
                                       torch::nn::functional::CrossEntropyFuncOptions().ignore_index(0))
      .backward();
  for (const auto& p : m->named_parameters()) {
    if (p.key() == "positions") continue;
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    EXPECT_TRUE(torch::isfinite(p.value().grad()).all().item<bool>()) << p.key();
  }
  // The tied output projection is the embedding: one parameter, seen once.
  std::size_t same = 0;
  for (const auto& p : m->parameters()) same += p.is_same(m->embed->weight);
  EXPECT_EQ(same, 1u);
  // Masks, in float32: padding the source does not change the first sentence's output, and
  // position t of the decoder does not see later target tokens.
  auto f = models::Transformer(o);
  f->eval();
  torch::NoGradGuard g;
  const torch::Tensor a = f->forward(src.slice(0, 0, 1).slice(1, 0, 4), tgt.slice(0, 0, 1).slice(1, 0, 3));
  const torch::Tensor b = f->forward(src.slice(0, 0, 1), tgt.slice(0, 0, 1).slice(1, 0, 3));
  EXPECT_TRUE(torch::allclose(a, b, 1e-5, 1e-5));
  torch::Tensor tgt2 = tgt.clone();
  tgt2[1][3] = 40;  // change the last target token only
  const torch::Tensor c = f->forward(src, tgt), d = f->forward(src, tgt2);
  EXPECT_TRUE(torch::allclose(c.select(0, 1).slice(0, 0, 3), d.select(0, 1).slice(0, 0, 3), 1e-5, 1e-5));
  EXPECT_FALSE(torch::allclose(c.select(0, 1).slice(0, 3, 4), d.select(0, 1).slice(0, 3, 4), 1e-5, 1e-5));
  // Decoding: greedy equals a beam of one; lengths are bounded.
  const auto gr = f->greedy(src, 7, 2, 3);
  const auto bm = f->beam_search(src, 1, 7, 2, 3, 0.0);
  EXPECT_EQ(gr, bm);
  for (const auto& s : f->beam_search(src, 4, 7, 2, 3)) EXPECT_LE(s.size(), 7u);
  EXPECT_THROW(models::transformer_preset("transformer-huge"), Error);
}

namespace {

// A small Transformer (d 64, 2+2 layers) trained for a few seconds (float32) on a "translation" that maps each
// token x of a 2..9-token sentence to x + 1: outputs of varied lengths that end with eos,
// the case the decoders must agree on.
struct ToyTranslation {
  static constexpr int kBos = 2, kEos = 3, kVocab = 40;
  models::Transformer model{nullptr};
  torch::Tensor test_src;  // 24 sentences, padded

  static std::pair<torch::Tensor, torch::Tensor> batch(torch::Generator& g, std::int64_t n) {
    const torch::Tensor lens = torch::randint(2, 10, {n}, g, torch::kInt64);
    torch::Tensor src = torch::zeros({n, 9}, torch::kInt64), tgt = torch::zeros({n, 11}, torch::kInt64);
    const torch::Tensor words = torch::randint(4, kVocab - 1, {n, 9}, g, torch::kInt64);
    for (std::int64_t i = 0; i < n; ++i) {
      std::int64_t t = 0;
      tgt[i][t++] = kBos;
      for (std::int64_t k = 0; k < lens[i].item<std::int64_t>(); ++k) {
        const std::int64_t w = words[i][k].item<std::int64_t>();
        src[i][k] = w;
        tgt[i][t++] = w + 1;
      }
      tgt[i][t] = kEos;
    }
    return {src, tgt};
  }

  ToyTranslation() {
    torch::manual_seed(3);
    models::TransformerOptions o = models::transformer_preset("transformer-tiny");
    o.vocab = kVocab;
    o.d_model = 64, o.d_ff = 256;
    o.dropout = 0;
    o.max_len = 32;
    model = models::Transformer(o);
    auto g = at::make_generator<at::CPUGeneratorImpl>(11);
    torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(3e-3).betas({0.9, 0.98}));
    for (int step = 0; step < 800; ++step) {
      const auto [src, tgt] = batch(g, 32);
      const torch::Tensor logits = model->forward(src, tgt.slice(1, 0, -1));
      const torch::Tensor loss = torch::nn::functional::cross_entropy(
          logits.reshape({-1, kVocab}), tgt.slice(1, 1).reshape({-1}),
          torch::nn::functional::CrossEntropyFuncOptions().ignore_index(0));
      opt.zero_grad();
      loss.backward();
      opt.step();
    }
    model->eval();
    test_src = batch(g, 24).first;
  }
};

}  // namespace

TEST(Models, CachedDecodingEqualsTheReference) {
  ToyTranslation toy;
  auto& m = toy.model;
  torch::NoGradGuard no_grad;
  const int bos = ToyTranslation::kBos, eos = ToyTranslation::kEos;
  // The cache's step gives decode()'s logits of the last position, also after rows are
  // repeated and dropped.
  {
    const torch::Tensor src = toy.test_src.slice(0, 0, 4);
    const torch::Tensor memory = m->encode(src);
    models::DecoderCache c = m->start_decoding(memory, src);
    const torch::Tensor ys = torch::tensor({{bos, 5, 9, 0}, {bos, 6, 7, 8}, {bos, 9, 9, 9}, {bos, 30, 4, 12}});
    for (std::int64_t t = 0; t < ys.size(1); ++t) {
      const torch::Tensor step = m->decode_step(c, ys.select(1, t));
      const torch::Tensor full = m->decode(ys.slice(1, 0, t + 1), memory, src).select(1, -1);
      EXPECT_TRUE(torch::allclose(step, full, 1e-4, 1e-4)) << "position " << t;
    }
    const torch::Tensor rows = torch::tensor({3, 1, 1}, torch::kInt64);
    models::TransformerImpl::select_rows(c, rows);
    ASSERT_EQ(c.rows(), 3);
    const torch::Tensor ys2 = torch::cat({ys.index_select(0, rows), torch::tensor({{11}, {12}, {13}})}, 1);
    const torch::Tensor full = m->decode(ys2, memory.index_select(0, rows), src.index_select(0, rows)).select(1, -1);
    EXPECT_TRUE(torch::allclose(m->decode_step(c, torch::tensor({11, 12, 13})), full, 1e-4, 1e-4));
  }
  // The model translates: most greedy outputs are the mapping, so the searches run to eos
  // at different lengths.
  const auto gr32 = m->greedy_reference(toy.test_src, 14, bos, eos);
  int right = 0;
  std::set<std::size_t> lengths;
  for (std::int64_t i = 0; i < toy.test_src.size(0); ++i) {
    std::vector<int> want;
    for (std::int64_t k = 0; k < toy.test_src.size(1); ++k) {
      const auto w = toy.test_src[i][k].item<std::int64_t>();
      if (w != 0) want.push_back(static_cast<int>(w + 1));
    }
    right += gr32[static_cast<std::size_t>(i)] == want;
    lengths.insert(gr32[static_cast<std::size_t>(i)].size());
  }
  EXPECT_GE(right, 18) << "the toy model did not learn its mapping";
  EXPECT_GE(lengths.size(), 4u);
  // Cached and batched decoding give the reference's tokens, in float32 and with the
  // paper's element formats, on both compute paths. So do block formats once the decoder's
  // A V product is not blocked along positions: there a block's scale mixes a position's
  // values with later positions', which the reference (recomputing the prefix) sees and a
  // causal cache cannot (docs/training.md, "Decoding").
  auto context_fp32 = [](nn::Recipe r) {
    nn::RecipeOverride o;
    o.pattern = "dec*.self_attn.context";
    o.set[static_cast<int>(nn::TensorKind::a)].emplace(std::nullopt);
    r.overrides.push_back(o);
    return r;
  };
  const std::vector<std::pair<std::string, nn::Recipe>> recipes = {
      {"fp32", nn::Recipe{}},
      {"transformer-mixed", nn::parse_recipe("transformer-mixed")},
      {"transformer-152", nn::parse_recipe("transformer-152")},
      {"mxfp8, A V fp32", context_fp32(nn::parse_recipe("mxfp8"))},
      {"mxfp4, A V fp32", context_fp32(nn::parse_recipe("mxfp4"))},
      {"deepseek, A V fp32", context_fp32(nn::parse_recipe("deepseek"))}};
  for (const auto& [name, recipe] : recipes)
    for (const char* compute : {"fp32", "auto"}) {
      const bool blocks = name.find("A V") != std::string::npos;
      SCOPED_TRACE("recipe " + name + ", compute " + compute);
      auto ctx = std::make_shared<nn::QuantContext>();
      ctx->compute = nn::parse_compute(compute);
      ctx->recording = false;
      nn::quantize_model(*m, recipe, ctx);
      const auto greedy = m->greedy(toy.test_src, 14, bos, eos);
      EXPECT_EQ(greedy, m->greedy_reference(toy.test_src, 14, bos, eos));
      EXPECT_EQ(m->beam_search(toy.test_src, 1, 14, bos, eos), greedy);
      // The reference beam search encodes each sentence without padding. Padding changes a
      // block format's encoder output too (the padded positions' values share blocks with
      // the sentence's), so block formats compare sentences that need none.
      if (blocks) {
        for (std::int64_t i = 0; i < 6; ++i) {
          const torch::Tensor s = toy.test_src[i];
          const torch::Tensor one = s.slice(0, 0, s.ne(0).sum().item<std::int64_t>()).unsqueeze(0);
          EXPECT_EQ(m->beam_search(one, 4, 14, bos, eos), m->beam_search_reference(one, 4, 14, bos, eos)) << i;
        }
      } else {
        EXPECT_EQ(m->beam_search(toy.test_src, 4, 14, bos, eos),
                  m->beam_search_reference(toy.test_src, 4, 14, bos, eos));
      }
    }
  // MXFP8 everywhere: the first position is the reference's bit for bit. From the second on,
  // the two may differ (by how much depends on the machine's float32 sums: on AMD EPYC they
  // stay within 1e-3), which is why the block formats above keep A and V in float32.
  {
    nn::quantize_model(*m, nn::parse_recipe("mxfp8"));
    const torch::Tensor src = toy.test_src.slice(0, 0, 4), memory = m->encode(src);
    models::DecoderCache c = m->start_decoding(memory, src);
    const torch::Tensor ys = torch::tensor({{bos, 5}, {bos, 6}, {bos, 9}, {bos, 30}});
    EXPECT_TRUE(torch::equal(m->decode_step(c, ys.select(1, 0)), m->decode(ys.slice(1, 0, 1), memory, src).select(1, 0)));
    nn::quantize_model(*m, nn::Recipe{});
  }
  // Lengths stay bounded when no hypothesis ends.
  for (const auto& s : m->beam_search(toy.test_src, 3, 2, bos, eos)) EXPECT_LE(s.size(), 2u);
  for (const auto& s : m->greedy(toy.test_src, 2, bos, eos)) EXPECT_LE(s.size(), 2u);
}

TEST(Models, GptForwardBackwardQuantizedAndCausal) {
  for (const std::string name : {"gpt-tiny", "gpt-small-swiglu"}) {
    SCOPED_TRACE(name);
    torch::manual_seed(0);
    models::GptOptions o = models::gpt_preset(name);
    o.vocab = 50;
    o.max_len = 12;
    o.dropout = 0;
    if (name != "gpt-tiny") o.layers = 2, o.d_model = 64, o.d_ff = 96;
    auto m = models::Gpt(o);
    auto qm = nn::quantize_model(*m, nn::parse_recipe("transformer-mixed"));
    // Per block 4 projections + 2 attention matmuls + the MLP's 2 (SwiGLU: 3); the head.
    const std::size_t mlp = o.mlp == models::Mlp::swiglu ? 3 : 2;
    EXPECT_EQ(qm.layers.size(), static_cast<std::size_t>(o.layers) * (6 + mlp) + 1);
    EXPECT_EQ(qm.layers.back()->name, "head");
    const torch::Tensor ids = torch::randint(1, 50, {2, 10}, torch::kInt64);
    const torch::Tensor logits = m->forward(ids);
    ASSERT_EQ(logits.sizes(), (std::vector<std::int64_t>{2, 10, 50}));
    torch::nn::functional::cross_entropy(logits.slice(1, 0, 9).reshape({-1, 50}), ids.slice(1, 1).reshape({-1}))
        .backward();
    for (const auto& p : m->named_parameters()) {
      ASSERT_TRUE(p.value().grad().defined()) << p.key();
      EXPECT_TRUE(torch::isfinite(p.value().grad()).all().item<bool>()) << p.key();
      EXPECT_GT(p.value().grad().abs().sum().item<double>(), 0.0) << p.key();
    }
    std::size_t tied = 0;
    for (const auto& p : m->parameters()) tied += p.is_same(m->tokens->weight);
    EXPECT_EQ(tied, 1u);
    // Causal, in float32: a later token changes no earlier position's logits.
    nn::quantize_model(*m, nn::Recipe{});
    torch::NoGradGuard g;
    torch::Tensor other = ids.clone();
    other[0][6] = ids[0][6].item<std::int64_t>() == 7 ? 8 : 7;
    const torch::Tensor a = m->forward(ids), b = m->forward(other);
    EXPECT_TRUE(torch::equal(a.select(0, 0).slice(0, 0, 6), b.select(0, 0).slice(0, 0, 6)));
    EXPECT_FALSE(torch::allclose(a.select(0, 0).slice(0, 6), b.select(0, 0).slice(0, 6)));
    EXPECT_NE(test::error_of([&] { m->forward(torch::ones({1, 13}, torch::kInt64)); }).find("longer than the context of 12"),
              std::string::npos);
  }
  EXPECT_EQ(models::parse_mlp("swiglu"), models::Mlp::swiglu);
  EXPECT_NE(test::error_of([] { models::parse_mlp("relu"); }).find("neither gelu nor swiglu"), std::string::npos);
  EXPECT_NE(test::error_of([] { models::gpt_preset("gpt-huge"); }).find("gpt-small"), std::string::npos);
}

TEST(Models, BertForwardBackwardQuantized) {
  torch::manual_seed(0);
  models::BertOptions o = models::bert_preset("bert-tiny");
  o.vocab = 40;
  o.max_len = 16;
  auto m = models::Bert(o);
  auto qm = nn::quantize_model(*m, nn::parse_recipe("bert-mixed"));
  // 2 layers x 8 quantized ops, MLM dense + tied output, pooler, NSP classifier.
  EXPECT_EQ(qm.layers.size(), 2u * 8 + 4u);
  const torch::Tensor ids = torch::tensor({{5, 4, 7, 6, 9, 6, 0, 0}, {5, 10, 11, 6, 12, 13, 14, 6}}, torch::kInt64);
  const torch::Tensor seg = torch::tensor({{0, 0, 0, 0, 1, 1, 0, 0}, {0, 0, 0, 0, 1, 1, 1, 1}}, torch::kInt64);
  const auto [mlm, nsp] = m->forward(ids, seg);
  ASSERT_EQ(mlm.sizes(), (std::vector<std::int64_t>{2, 8, 40}));
  ASSERT_EQ(nsp.sizes(), (std::vector<std::int64_t>{2, 2}));
  torch::Tensor labels = torch::full({2, 8}, -1, torch::kInt64);
  labels[0][1] = 8;
  labels[1][4] = 12;
  (torch::nn::functional::cross_entropy(mlm.reshape({-1, 40}), labels.reshape({-1}),
                                        torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-1)) +
   torch::nn::functional::cross_entropy(nsp, torch::tensor({1, 0})))
      .backward();
  for (const auto& p : m->named_parameters()) {
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    EXPECT_TRUE(torch::isfinite(p.value().grad()).all().item<bool>()) << p.key();
  }
  std::size_t same = 0;
  for (const auto& p : m->parameters()) same += p.is_same(m->tokens->weight);
  EXPECT_EQ(same, 1u);
  EXPECT_THROW(m->forward(torch::ones({1, 17}, torch::kInt64), torch::zeros({1, 17}, torch::kInt64)), Error);
  EXPECT_THROW(models::bert_preset("bert-huge"), Error);
}
