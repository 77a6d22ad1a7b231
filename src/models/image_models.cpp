#include "fp8lab/models/image_models.hpp"

#include <torch/torch.h>

#include <cmath>

#include "fp8lab/models/resnet.hpp"

namespace fp8lab::models {

namespace {
torch::nn::Conv2dOptions conv(std::int64_t in, std::int64_t out, std::int64_t k, std::int64_t stride = 1,
                              std::int64_t groups = 1) {
  return torch::nn::Conv2dOptions(in, out, k).stride(stride).padding(k / 2).groups(groups).bias(false);
}
}  // namespace

// --- ResNet-18/34/50 ----------------------------------------------------------------------

BottleneckImpl::BottleneckImpl(std::int64_t in, std::int64_t mid, std::int64_t stride) {
  const std::int64_t out = 4 * mid;
  conv1 = register_module("conv1", nn::QuantConv2d(conv(in, mid, 1)));
  bn1 = register_module("bn1", torch::nn::BatchNorm2d(mid));
  // Stride on the 3x3 convolution (ResNet v1.5, as torchvision).
  conv2 = register_module("conv2", nn::QuantConv2d(conv(mid, mid, 3, stride)));
  bn2 = register_module("bn2", torch::nn::BatchNorm2d(mid));
  conv3 = register_module("conv3", nn::QuantConv2d(conv(mid, out, 1)));
  bn3 = register_module("bn3", torch::nn::BatchNorm2d(out));
  if (stride != 1 || in != out) {
    shortcut = register_module("shortcut", nn::QuantConv2d(conv(in, out, 1, stride)));
    bn_sc = register_module("bn_sc", torch::nn::BatchNorm2d(out));
  }
}

torch::Tensor BottleneckImpl::forward(const torch::Tensor& x) {
  torch::Tensor y = torch::relu(bn1->forward(conv1->forward(x)));
  y = torch::relu(bn2->forward(conv2->forward(y)));
  y = bn3->forward(conv3->forward(y));
  return torch::relu(y + (shortcut ? bn_sc->forward(shortcut->forward(x)) : x));
}

ResNetImpl::ResNetImpl(ResNetOptions o) : options(o) {
  std::vector<int> counts;
  bool bottleneck = false;
  if (o.depth == 18) counts = {2, 2, 2, 2};
  else if (o.depth == 34) counts = {3, 4, 6, 3};
  else if (o.depth == 50) counts = {3, 4, 6, 3}, bottleneck = true;
  else throw Error("ResNet depth must be 18, 34 or 50, got " + std::to_string(o.depth));
  const std::int64_t w = o.width;
  stem = register_module("stem", nn::QuantConv2d(o.small_input ? conv(o.in_channels, w, 3) : conv(o.in_channels, w, 7, 2)));
  bn = register_module("bn", torch::nn::BatchNorm2d(w));
  std::int64_t in = w;
  for (int s = 0; s < 4; ++s) {
    torch::nn::Sequential stage;
    const std::int64_t width = w << s;
    for (int i = 0; i < counts[s]; ++i) {
      const std::int64_t stride = (i == 0 && s > 0) ? 2 : 1;
      if (bottleneck) {
        stage->push_back(Bottleneck(in, width, stride));
        in = 4 * width;
      } else {
        stage->push_back(BasicBlock(in, width, stride));
        in = width;
      }
    }
    stages.push_back(register_module("layer" + std::to_string(s + 1), stage));
  }
  fc = register_module("fc", nn::QuantLinear(in, o.num_classes));
}

torch::Tensor ResNetImpl::forward(const torch::Tensor& x) {
  torch::Tensor y = torch::relu(bn->forward(stem->forward(x)));
  if (!options.small_input) y = torch::max_pool2d(y, 3, 2, 1);
  for (auto& s : stages) y = s->forward(y);
  return fc->forward(torch::adaptive_avg_pool2d(y, {1, 1}).flatten(1));
}

// --- EfficientNet ---------------------------------------------------------------------------

MBConvImpl::MBConvImpl(std::int64_t in_, std::int64_t out_, std::int64_t expand, std::int64_t kernel,
                       std::int64_t stride_, double se_ratio, double dc, double bn_momentum)
    : in(in_), out(out_), stride(stride_), drop_connect(dc) {
  const std::int64_t mid = in * expand;
  if (expand != 1) {
    expand_conv = register_module("expand_conv", nn::QuantConv2d(conv(in, mid, 1)));
    bn0 = register_module("bn0", torch::nn::BatchNorm2d(torch::nn::BatchNorm2dOptions(mid).momentum(bn_momentum).eps(1e-3)));
  }
  depthwise = register_module("depthwise", nn::QuantConv2d(conv(mid, mid, kernel, stride, mid)));
  bn1 = register_module("bn1", torch::nn::BatchNorm2d(torch::nn::BatchNorm2dOptions(mid).momentum(bn_momentum).eps(1e-3)));
  // Squeeze-excitation on the block's input width (as the reference implementation).
  const std::int64_t squeezed = std::max<std::int64_t>(1, static_cast<std::int64_t>(in * se_ratio));
  se_reduce = register_module("se_reduce", nn::QuantConv2d(torch::nn::Conv2dOptions(mid, squeezed, 1)));
  se_expand = register_module("se_expand", nn::QuantConv2d(torch::nn::Conv2dOptions(squeezed, mid, 1)));
  project = register_module("project", nn::QuantConv2d(conv(mid, out, 1)));
  bn2 = register_module("bn2", torch::nn::BatchNorm2d(torch::nn::BatchNorm2dOptions(out).momentum(bn_momentum).eps(1e-3)));
}

torch::Tensor MBConvImpl::forward(const torch::Tensor& x) {
  torch::Tensor y = x;
  if (expand_conv) y = torch::silu(bn0->forward(expand_conv->forward(y)));
  y = torch::silu(bn1->forward(depthwise->forward(y)));
  const torch::Tensor s = torch::adaptive_avg_pool2d(y, {1, 1});
  y = y * torch::sigmoid(se_expand->forward(torch::silu(se_reduce->forward(s))));
  y = bn2->forward(project->forward(y));
  if (stride == 1 && in == out) {
    if (is_training() && drop_connect > 0) {
      // Stochastic depth: drop the residual branch per sample, rescale the survivors.
      const double keep = 1.0 - drop_connect;
      const torch::Tensor mask = torch::rand({y.size(0), 1, 1, 1}, y.options()).add_(keep).floor_();
      y = y / keep * mask;
    }
    y = y + x;
  }
  return y;
}

EfficientNetOptions efficientnet_preset(int b) {
  // (width, depth, resolution, dropout) from the EfficientNet paper / reference code.
  static const double table[8][3] = {{1.0, 1.0, 0.2}, {1.0, 1.1, 0.2}, {1.1, 1.2, 0.3}, {1.2, 1.4, 0.3},
                                     {1.4, 1.8, 0.4}, {1.6, 2.2, 0.4}, {1.8, 2.6, 0.5}, {2.0, 3.1, 0.5}};
  if (b < 0 || b > 7) throw Error("EfficientNet-B" + std::to_string(b) + " does not exist (B0..B7)");
  EfficientNetOptions o;
  o.width_mult = table[b][0];
  o.depth_mult = table[b][1];
  o.dropout = table[b][2];
  return o;
}

namespace {
// Channels scaled by the width multiplier, rounded to a multiple of 8 (never down by >10%).
std::int64_t round_filters(std::int64_t c, double mult) {
  const double scaled = c * mult;
  std::int64_t r = std::max<std::int64_t>(8, static_cast<std::int64_t>(scaled + 4) / 8 * 8);
  if (r < 0.9 * scaled) r += 8;
  return r;
}
std::int64_t round_repeats(std::int64_t r, double mult) { return static_cast<std::int64_t>(std::ceil(r * mult)); }
}  // namespace

EfficientNetImpl::EfficientNetImpl(EfficientNetOptions o) : options(o) {
  if (o.width_mult <= 0 || o.depth_mult <= 0) throw Error("EfficientNet: width and depth multipliers must be > 0");
  // B0's stages: expansion, kernel, stride, input and output channels, repeats.
  struct Stage { std::int64_t e, k, s, in, out, r; };
  const Stage b0[7] = {{1, 3, 1, 32, 16, 1},  {6, 3, 2, 16, 24, 2},  {6, 5, 2, 24, 40, 2},  {6, 3, 2, 40, 80, 3},
                       {6, 5, 1, 80, 112, 3}, {6, 5, 2, 112, 192, 4}, {6, 3, 1, 192, 320, 1}};
  const std::int64_t stem_c = round_filters(32, o.width_mult);
  stem = register_module("stem", nn::QuantConv2d(conv(o.in_channels, stem_c, 3, o.stem_stride)));
  const double bn_momentum = o.bn_momentum;
  bn_stem = register_module("bn_stem", torch::nn::BatchNorm2d(torch::nn::BatchNorm2dOptions(stem_c).momentum(bn_momentum).eps(1e-3)));
  std::int64_t total = 0;
  for (const auto& s : b0) total += round_repeats(s.r, o.depth_mult);
  blocks = torch::nn::Sequential();
  std::int64_t index = 0, in = stem_c;
  for (const auto& s : b0) {
    const std::int64_t out = round_filters(s.out, o.width_mult);
    for (std::int64_t i = 0; i < round_repeats(s.r, o.depth_mult); ++i, ++index) {
      blocks->push_back(MBConv(in, out, s.e, s.k, i == 0 ? s.s : 1, 0.25,
                               o.drop_connect * static_cast<double>(index) / static_cast<double>(total),
                               o.bn_momentum));
      in = out;
    }
  }
  blocks = register_module("blocks", blocks);
  const std::int64_t head_c = round_filters(1280, o.width_mult);
  head = register_module("head", nn::QuantConv2d(conv(in, head_c, 1)));
  bn_head = register_module("bn_head", torch::nn::BatchNorm2d(torch::nn::BatchNorm2dOptions(head_c).momentum(bn_momentum).eps(1e-3)));
  drop = register_module("drop", torch::nn::Dropout(o.dropout));
  fc = register_module("fc", nn::QuantLinear(head_c, o.num_classes));
}

torch::Tensor EfficientNetImpl::forward(const torch::Tensor& x) {
  torch::Tensor y = torch::silu(bn_stem->forward(stem->forward(x)));
  y = blocks->forward(y);
  y = torch::silu(bn_head->forward(head->forward(y)));
  return fc->forward(drop->forward(torch::adaptive_avg_pool2d(y, {1, 1}).flatten(1)));
}

// --- Factory --------------------------------------------------------------------------------

std::vector<std::string> image_model_presets() {
  return {"resnet8",  "resnet20", "resnet32", "resnet44", "resnet56", "resnet110", "resnet18", "resnet34",
          "resnet50", "efficientnet-b0", "efficientnet-b1", "efficientnet-b2", "efficientnet-b3",
          "efficientnet-b4", "efficientnet-b5", "efficientnet-b6", "efficientnet-b7"};
}

void to_channels_last(torch::nn::Module& m) {
  torch::NoGradGuard no_grad;
  for (auto& p : m.parameters())
    if (p.dim() == 4) p.set_data(p.data().contiguous(torch::MemoryFormat::ChannelsLast));
}

namespace {
std::string count_params(const torch::nn::Module& m) {
  std::int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.numel();
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f M parameters", static_cast<double>(n) / 1e6);
  return buf;
}
}  // namespace

ImageModel make_image_model(const ImageModelSpec& s) {
  const std::string& n = s.name;
  ImageModel m;
  auto depth_of = [&](const std::string& prefix) { return std::stoi(n.substr(prefix.size())); };
  const auto presets = image_model_presets();
  if (std::find(presets.begin(), presets.end(), n) == presets.end()) {
    std::string list;
    for (const auto& p : presets) list += (list.empty() ? "" : ", ") + p;
    throw Error("unknown model '" + n + "' (image models: " + list + ")");
  }
  if (n.rfind("efficientnet-b", 0) == 0) {
    const int b = depth_of("efficientnet-b");
    EfficientNetOptions o = efficientnet_preset(b);
    if (s.width_mult > 0) o.width_mult = s.width_mult;
    if (s.depth_mult > 0) o.depth_mult = s.depth_mult;
    if (s.dropout >= 0) o.dropout = s.dropout;
    if (s.bn_momentum > 0) o.bn_momentum = s.bn_momentum;
    o.in_channels = s.in_channels;
    o.num_classes = s.num_classes;
    o.stem_stride = s.image_size <= 64 ? 1 : 2;  // keep some resolution for 28-32 px images
    EfficientNet net(o);
    m.module = net.ptr();
    m.forward = [net](const torch::Tensor& x) mutable { return net->forward(x); };
    char buf[96];
    std::snprintf(buf, sizeof buf, "%s (width x%.2f, depth x%.2f, batch-norm momentum %g, ", n.c_str(), o.width_mult,
                  o.depth_mult, o.bn_momentum);
    m.description = buf + count_params(*net) + ")";
    return m;
  }
  const int depth = depth_of("resnet");
  if (depth == 18 || depth == 34 || depth == 50) {
    ResNetOptions o;
    o.depth = depth;
    o.in_channels = s.in_channels;
    o.num_classes = s.num_classes;
    if (s.width > 0) o.width = s.width;
    o.small_input = s.image_size <= 64;
    ResNet net(o);
    m.module = net.ptr();
    m.forward = [net](const torch::Tensor& x) mutable { return net->forward(x); };
    m.description = n + " (width " + std::to_string(o.width) + ", " + count_params(*net) + ")";
    return m;
  }
  CifarResNetOptions o;
  o.depth = depth;
  o.in_channels = s.in_channels;
  o.num_classes = s.num_classes;
  if (s.width > 0) o.width = s.width;
  CifarResNet net(o);
  m.module = net.ptr();
  m.forward = [net](const torch::Tensor& x) mutable { return net->forward(x); };
  m.description = n + " (width " + std::to_string(o.width) + ", " + count_params(*net) + ")";
  return m;
}

}  // namespace fp8lab::models
