#include "fp8lab/nn/modules.hpp"

#include <torch/torch.h>

#include <cmath>

namespace fp8lab::nn {

namespace {
LayerStatePtr float_state(const std::string& name) {
  return make_layer_state(name, LayerQuant{}, nullptr);
}
}  // namespace

QuantLinearImpl::QuantLinearImpl(torch::nn::LinearOptions o) : options(std::move(o)) { reset(); }

QuantLinearImpl::QuantLinearImpl(torch::nn::LinearOptions o, torch::Tensor w, torch::Tensor b)
    : options(std::move(o)) {
  weight = register_parameter("weight", std::move(w));
  bias = b.defined() ? register_parameter("bias", std::move(b)) : register_parameter("bias", {}, false);
}

void QuantLinearImpl::reset() {
  weight = register_parameter("weight", torch::empty({options.out_features(), options.in_features()}));
  if (options.bias()) bias = register_parameter("bias", torch::empty(options.out_features()));
  else bias = register_parameter("bias", {}, /*requires_grad=*/false);
  // As torch::nn::Linear: kaiming_uniform(a = sqrt(5)) and a uniform bias.
  torch::NoGradGuard no_grad;
  torch::nn::init::kaiming_uniform_(weight, std::sqrt(5));
  if (bias.defined()) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(options.in_features()));
    torch::nn::init::uniform_(bias, -bound, bound);
  }
}

torch::Tensor QuantLinearImpl::forward(const torch::Tensor& x) {
  if (!state) state = float_state("linear");
  return quant_linear(x, weight, bias, state);
}

torch::Tensor QuantTiedLinearImpl::forward(const torch::Tensor& x) {
  if (!state) state = float_state("tied_linear");
  return quant_linear(x, weight, {}, state);
}

void QuantLinearImpl::pretty_print(std::ostream& os) const {
  os << "fp8lab::QuantLinear(in_features=" << options.in_features()
     << ", out_features=" << options.out_features() << ", bias=" << options.bias();
  if (state) os << ", recipe=" << to_string(state->quant[TensorKind::a]) << "|"
                << to_string(state->quant[TensorKind::w]) << "|" << to_string(state->quant[TensorKind::gx])
                << "|" << to_string(state->quant[TensorKind::gw]);
  if (state && state->quant.a_bwd) os << ", a_bwd=" << to_string(state->quant.a_bwd);
  if (state && state->quant.w_bwd) os << ", w_bwd=" << to_string(state->quant.w_bwd);
  os << ")";
}

QuantConv2dImpl::QuantConv2dImpl(torch::nn::Conv2dOptions o) : options(std::move(o)) { reset(); }

QuantConv2dImpl::QuantConv2dImpl(torch::nn::Conv2dOptions o, torch::Tensor w, torch::Tensor b)
    : options(std::move(o)) {
  if (!std::holds_alternative<torch::ExpandingArray<2>>(options.padding()) ||
      !std::holds_alternative<torch::enumtype::kZeros>(options.padding_mode()))
    throw Error("QuantConv2d: only numeric zero padding is supported");
  weight = register_parameter("weight", std::move(w));
  bias = b.defined() ? register_parameter("bias", std::move(b)) : register_parameter("bias", {}, false);
}

void QuantConv2dImpl::reset() {
  if (!std::holds_alternative<torch::ExpandingArray<2>>(options.padding()))
    throw Error("QuantConv2d: padding must be given as numbers ('same'/'valid' are not supported)");
  if (!std::holds_alternative<torch::enumtype::kZeros>(options.padding_mode()))
    throw Error("QuantConv2d: only zero padding is supported");
  const auto& k = *options.kernel_size();
  weight = register_parameter(
      "weight", torch::empty({options.out_channels(), options.in_channels() / options.groups(), k[0], k[1]}));
  if (options.bias()) bias = register_parameter("bias", torch::empty(options.out_channels()));
  else bias = register_parameter("bias", {}, false);
  torch::NoGradGuard no_grad;
  torch::nn::init::kaiming_uniform_(weight, std::sqrt(5));
  if (bias.defined()) {
    const double fan_in = static_cast<double>(weight.size(1) * k[0] * k[1]);
    const double bound = 1.0 / std::sqrt(fan_in);
    torch::nn::init::uniform_(bias, -bound, bound);
  }
}

torch::Tensor QuantConv2dImpl::forward(const torch::Tensor& x) {
  if (!state) state = float_state("conv2d");
  const auto& s = *options.stride();
  const auto& p = *std::get<torch::ExpandingArray<2>>(options.padding());
  const auto& d = *options.dilation();
  return quant_conv2d(x, weight, bias, {s[0], s[1]}, {p[0], p[1]}, {d[0], d[1]}, options.groups(),
                      state);
}

void QuantConv2dImpl::pretty_print(std::ostream& os) const {
  os << "fp8lab::QuantConv2d(" << options.in_channels() << ", " << options.out_channels()
     << ", kernel_size=" << options.kernel_size() << ", stride=" << options.stride()
     << ", groups=" << options.groups() << ")";
}

torch::Tensor QuantMatmulImpl::forward(const torch::Tensor& a, const torch::Tensor& b) {
  if (!state) state = float_state("matmul");
  return quant_matmul(a, b, state);
}

const LayerStatePtr& QuantizedModel::layer(const std::string& path) const {
  for (const auto& l : layers)
    if (l->name == path) return l;
  throw Error("no quantized layer '" + path + "'");
}

namespace {

struct Site {
  std::string path;
  Quantized* q;  // the module, once converted
};

std::shared_ptr<torch::nn::Module> converted(const std::shared_ptr<torch::nn::Module>& m,
                                             const std::string& path) {
  if (auto* lin = m->as<torch::nn::Linear>())
    // The same parameter tensors: optimizers and state dicts made before stay valid.
    return QuantLinear(lin->options, lin->weight, lin->bias).ptr();
  if (auto* conv = m->as<torch::nn::Conv2d>()) {
    const auto& src = conv->options;
    if (src.transposed()) throw Error("layer '" + path + "': transposed convolutions are not supported");
    torch::nn::Conv2dOptions o(src.in_channels(), src.out_channels(), src.kernel_size());
    o.stride(src.stride()).padding(src.padding()).dilation(src.dilation()).groups(src.groups())
        .bias(src.bias()).padding_mode(src.padding_mode());
    return QuantConv2d(o, conv->weight, conv->bias).ptr();
  }
  return nullptr;
}

// A Sequential runs its own list of modules: replace the entries of that list (and the
// registered children, for names and parameters) with converted layers.
void convert_sequential(torch::nn::SequentialImpl& seq, const std::string& prefix) {
  const auto names = seq.named_children().keys();
  std::size_t i = 0;
  for (auto it = seq.begin(); it != seq.end(); ++it, ++i) {
    const std::string path = prefix.empty() ? names[i] : prefix + "." + names[i];
    const auto ptr = converted(it->ptr(), path);
    if (!ptr) continue;
    if (auto lin = std::dynamic_pointer_cast<QuantLinearImpl>(ptr)) {
      *it = torch::nn::AnyModule(QuantLinear(lin));
      seq.replace_module(names[i], lin);
    } else if (auto conv = std::dynamic_pointer_cast<QuantConv2dImpl>(ptr)) {
      *it = torch::nn::AnyModule(QuantConv2d(conv));
      seq.replace_module(names[i], conv);
    }
  }
}

// Depth-first in registration order.
void collect(torch::nn::Module& m, const std::string& prefix, std::vector<Site>& out,
             std::vector<std::string>& plain) {
  if (auto* seq = dynamic_cast<torch::nn::SequentialImpl*>(&m)) convert_sequential(*seq, prefix);
  for (const auto& item : m.named_children()) {
    const std::string path = prefix.empty() ? item.key() : prefix + "." + item.key();
    const std::shared_ptr<torch::nn::Module>& child = item.value();
    if (auto* q = dynamic_cast<Quantized*>(child.get())) {
      out.push_back({path, q});
      continue;
    }
    if (child->as<torch::nn::Linear>() || child->as<torch::nn::Conv2d>()) {
      plain.push_back(path);
      continue;
    }
    collect(*child, path, out, plain);
  }
}

}  // namespace

QuantizedModel quantize_model(torch::nn::Module& model, const Recipe& recipe,
                              std::shared_ptr<QuantContext> ctx) {
  if (!ctx) ctx = std::make_shared<QuantContext>();
  std::vector<Site> sites;
  std::vector<std::string> plain;
  collect(model, "", sites, plain);
  if (!plain.empty()) {
    std::string list;
    for (const auto& p : plain) list += (list.empty() ? "" : ", ") + ("'" + p + "'");
    throw Error("layer " + list +
                " is a plain torch::nn::Linear/Conv2d held by a module member, which libtorch "
                "cannot swap in place: declare it as fp8lab::nn::QuantLinear/QuantConv2d "
                "(same options and initialisation) or put it in a torch::nn::Sequential");
  }
  std::vector<std::string> paths;
  for (const auto& s : sites) paths.push_back(s.path);
  check_overrides(recipe, paths);
  QuantizedModel out;
  out.ctx = ctx;
  const int count = static_cast<int>(sites.size());
  for (int i = 0; i < count; ++i) {
    auto st = make_layer_state(sites[i].path, recipe.resolve(sites[i].path, i, count), ctx, i);
    sites[i].q->state = st;
    out.layers.push_back(st);
  }
  return out;
}

}  // namespace fp8lab::nn
