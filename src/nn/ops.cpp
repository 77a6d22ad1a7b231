#include "fp8lab/nn/ops.hpp"

#include <ATen/ATen.h>
#include <torch/torch.h>

#include "fp8lab/core/random.hpp"
#include "fp8lab/nn/tensor_quant.hpp"

namespace fp8lab::nn {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

void StatsLog::add(TensorStats s) {
  std::lock_guard<std::mutex> lk(m_);
  records_.push_back(std::move(s));
}
std::vector<TensorStats> StatsLog::take() {
  std::lock_guard<std::mutex> lk(m_);
  std::vector<TensorStats> out;
  out.swap(records_);
  return out;
}
std::size_t StatsLog::size() const {
  std::lock_guard<std::mutex> lk(m_);
  return records_.size();
}

LayerStatePtr make_layer_state(std::string name, const LayerQuant& q,
                               std::shared_ptr<QuantContext> ctx, int index) {
  auto st = c10::make_intrusive<LayerState>();
  st->name = std::move(name);
  st->quant = q;
  st->ctx = ctx ? std::move(ctx) : std::make_shared<QuantContext>();
  st->index = index;
  std::uint64_t h = mix64(st->ctx->seed);
  for (char c : st->name) h = mix64(h ^ static_cast<unsigned char>(c));
  st->layer_seed = h;
  (void)backward_grad_refs();  // measured here, outside any backward pass
  return st;
}

std::array<QuantCounts, kKinds> LayerState::counts() const {
  std::lock_guard<std::mutex> lk(m_);
  return counts_;
}
void LayerState::add_counts(const std::array<QuantCounts, kKinds>& c) {
  std::lock_guard<std::mutex> lock(m_);
  for (int k = 0; k < kKinds; ++k) counts_[k] += c[k];
}
void LayerState::reset_counts() {
  std::lock_guard<std::mutex> lk(m_);
  counts_ = {};
}

std::uint32_t LayerState::begin_call() {
  std::lock_guard<std::mutex> lk(m_);
  const std::uint64_t step = ctx->step.load();
  if (step != call_step_) {
    call_step_ = step;
    calls_ = 0;
  }
  return calls_++;
}

std::uint64_t LayerState::seed_for(TensorKind k, std::uint32_t call, std::uint32_t operand) const {
  const std::uint64_t step = ctx->step.load();
  return mix64(layer_seed ^ mix64(step) ^
               mix64((static_cast<std::uint64_t>(call) << 8) | (operand << 4) |
                     static_cast<std::uint64_t>(k)));
}

bool LayerState::stats_due(std::uint32_t call) const {
  const int every = ctx->stats_interval;
  return ctx->recording && every > 0 && call == 0 &&
         ctx->step.load() % static_cast<std::uint64_t>(every) == 0;
}

void LayerState::record(TensorKind k, const torch::Tensor& t, const QuantCounts& c,
                        std::uint32_t call) {
  if (!ctx->recording) return;
  {
    std::lock_guard<std::mutex> lk(m_);
    counts_[static_cast<int>(k)] += c;
  }
  if (!stats_due(call)) return;
  const std::uint64_t step = ctx->step.load();
  const torch::Tensor x = t.contiguous();
  TensorStats s;
  s.step = step;
  s.layer = name;
  s.kind = k;
  s.hist = kernels::exponent_histogram(x.data_ptr<float>(), static_cast<std::size_t>(x.numel()));
  s.counts = c;
  s.absmax = x.numel() ? x.abs().max().item<float>() : 0.0f;
  ctx->stats->add(std::move(s));
}

torch::Tensor LayerState::quantize(TensorKind k, const torch::Tensor& t, std::uint32_t call,
                                   std::uint32_t operand) {
  const KindQuant& q = quant[k];
  QuantCounts c;
  torch::Tensor out;
  if (q) {
    out = fake_quantize(t, *q, seed_for(k, call, operand), &c);
  } else {
    out = t;
    c.total = static_cast<std::uint64_t>(t.numel());
  }
  record(k, t, c, call);
  return out;
}

torch::Tensor LayerState::quantize_owned(TensorKind k, torch::Tensor t, std::uint32_t call,
                                        std::int64_t refs) {
  const KindQuant& q = quant[k];
  // In place only when the caller's handles are the only references to the tensor and
  // its storage (no view, no other node's input or saved tensor), and not on a statistics
  // step, whose histogram is of the values before quantization.
  const bool exclusive = t.defined() && t.use_count() <= refs && t.has_storage() &&
                         t.storage().use_count() == 1 && t.is_contiguous() &&
                         t.device().is_cpu() && t.scalar_type() == torch::kFloat32;
  if (!q || !exclusive || stats_due(call)) return quantize(k, t, call);
  QuantCounts c;
  fake_quantize_(t, *q, seed_for(k, call), &c);
  record(k, t, c, call);
  ++ctx->in_place;
  return t;
}

std::pair<torch::Tensor, torch::Tensor> LayerState::quantize_and_save(TensorKind k,
                                                                      const torch::Tensor& t,
                                                                      std::uint32_t call,
                                                                      std::uint32_t operand) {
  const KindQuant& q = quant[k];
  const bool weight = k == TensorKind::w;
  std::atomic<std::int64_t>& bytes = weight ? ctx->saved_weight_bytes : ctx->saved_bytes;
  if (!q || !(weight ? ctx->save_weight_codes : ctx->save_codes) || !q->format.codable()) {
    torch::Tensor y = quantize(k, t, call, operand);
    bytes += static_cast<std::int64_t>(y.numel()) * 4;
    return {y, y};
  }
  QuantCounts c;
  auto [y, codes] = quantize_and_encode_tensor(t, *q, seed_for(k, call, operand), &c);
  record(k, t, c, call);
  bytes += static_cast<std::int64_t>(codes.numel() * codes.element_size());
  return {y, codes};
}

torch::Tensor LayerState::restore(TensorKind k, const torch::Tensor& saved) const {
  if (saved.scalar_type() == torch::kFloat32) return saved;
  return decode_tensor(saved, quant[k]->format);
}

namespace {

LayerStatePtr state_of(AutogradContext* ctx) {
  return c10::static_intrusive_pointer_cast<LayerState>(ctx->saved_data["st"].toCapsule());
}

struct Operand {
  const torch::Tensor& t;
  TensorKind kind;
  std::uint32_t index;  // which operand of the op: selects its own random stream
};

// Forward prologue shared by the ops: Q(first), Q(second), and what backward needs (the
// saved forms, the layer state, the call number). Returns the two quantized operands.
std::pair<torch::Tensor, torch::Tensor> quantize_operands(AutogradContext* ctx,
                                                          const LayerStatePtr& st, Operand a,
                                                          Operand b) {
  const std::uint32_t call = st->begin_call();
  auto [aq, as] = st->quantize_and_save(a.kind, a.t, call, a.index);
  auto [bq, bs] = st->quantize_and_save(b.kind, b.t, call, b.index);
  ctx->save_for_backward({as, bs});
  ctx->saved_data["st"] = c10::IValue::make_capsule(st);
  ctx->saved_data["call"] = static_cast<std::int64_t>(call);
  return {aq, bq};
}

// Backward prologue: the layer state, the call number and the two quantized operands.
struct Saved {
  LayerStatePtr st;
  std::uint32_t call;
  torch::Tensor a, b;
};
Saved restore_operands(AutogradContext* ctx, TensorKind ka, TensorKind kb) {
  Saved s{state_of(ctx), static_cast<std::uint32_t>(ctx->saved_data["call"].toInt()), {}, {}};
  const auto saved = ctx->get_saved_variables();
  s.a = s.st->restore(ka, saved[0]);
  s.b = s.st->restore(kb, saved[1]);
  return s;
}

class LinearFn : public torch::autograd::Function<LinearFn> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& w,
                               const torch::Tensor& b, LayerStatePtr st) {
    auto [xq, wq] = quantize_operands(ctx, st, {x, TensorKind::a, 0}, {w, TensorKind::w, 0});
    ctx->saved_data["bias"] = b.numel() > 0;
    return torch::linear(xq, wq, b.numel() > 0 ? b : torch::Tensor());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto [st, call, xq_saved, wq] = restore_operands(ctx, TensorKind::a, TensorKind::w);
    torch::Tensor g = std::move(grads[0]);
    const std::int64_t out_f = wq.size(0), in_f = wq.size(1);
    torch::Tensor dx, dw, db;
    // The bias gradient is of the float32 gradient: before g may be quantized in place.
    if (ctx->saved_data["bias"].toBool() && ctx->needs_input_grad(2))
      db = g.reshape({-1, out_f}).sum(0);
    const std::vector<std::int64_t> g_shape(g.sizes().begin(), g.sizes().end());
    const torch::Tensor gq =
        st->quantize_owned(TensorKind::gx, std::move(g), call, backward_grad_refs())
            .reshape({-1, out_f});
    // The same products libtorch's addmm/mm backward forms, so that with float32
    // quantizers the gradients are bit-identical to torch::linear's.
    if (ctx->needs_input_grad(0)) {
      dx = gq.mm(wq);
      std::vector<std::int64_t> shape = g_shape;
      shape.back() = in_f;
      dx = dx.reshape(shape);
    }
    if (ctx->needs_input_grad(1)) {
      const torch::Tensor xq = xq_saved.reshape({-1, in_f});
      dw = st->quantize_owned(TensorKind::gw, xq.t().mm(gq).t().contiguous(), call);
    }
    return {dx, dw, db, torch::Tensor()};
  }
};

class Conv2dFn : public torch::autograd::Function<Conv2dFn> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& w,
                               const torch::Tensor& b, std::vector<std::int64_t> stride,
                               std::vector<std::int64_t> padding,
                               std::vector<std::int64_t> dilation, std::int64_t groups,
                               LayerStatePtr st) {
    auto [xq, wq] = quantize_operands(ctx, st, {x, TensorKind::a, 0}, {w, TensorKind::w, 0});
    ctx->saved_data["bias"] = b.numel() > 0;
    ctx->saved_data["stride"] = stride;
    ctx->saved_data["padding"] = padding;
    ctx->saved_data["dilation"] = dilation;
    ctx->saved_data["groups"] = groups;
    return torch::conv2d(xq, wq, b.numel() > 0 ? b : torch::Tensor(), stride, padding, dilation,
                         groups);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto [st, call, xq, wq] = restore_operands(ctx, TensorKind::a, TensorKind::w);
    torch::Tensor g = std::move(grads[0]);
    const auto stride = ctx->saved_data["stride"].toIntVector();
    const auto padding = ctx->saved_data["padding"].toIntVector();
    const auto dilation = ctx->saved_data["dilation"].toIntVector();
    const std::int64_t groups = ctx->saved_data["groups"].toInt();
    torch::Tensor db;
    if (ctx->saved_data["bias"].toBool() && ctx->needs_input_grad(2)) {
      // libtorch's own bias reduction of the float32 g (so that float32 quantizers match
      // exactly), before g may be quantized in place.
      const std::vector<std::int64_t> bias_sizes{wq.size(0)};
      db = std::get<2>(at::convolution_backward(g, xq, wq, bias_sizes, stride, padding, dilation,
                                                false, {0, 0}, groups, {false, false, true}));
    }
    const torch::Tensor gq =
        st->quantize_owned(TensorKind::gx, std::move(g), call, backward_grad_refs());
    auto [dx, dw, unused] = at::convolution_backward(
        gq, xq, wq, c10::nullopt, stride, padding, dilation, false, {0, 0}, groups,
        {ctx->needs_input_grad(0), ctx->needs_input_grad(1), false});
    (void)unused;
    if (dw.defined()) dw = st->quantize_owned(TensorKind::gw, std::move(dw), call);
    return {dx, dw, db, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(),
            torch::Tensor()};
  }
};

class MatmulFn : public torch::autograd::Function<MatmulFn> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& a, const torch::Tensor& b,
                               LayerStatePtr st) {
    auto [aq, bq] = quantize_operands(ctx, st, {a, TensorKind::a, 0}, {b, TensorKind::a, 1});
    return torch::matmul(aq, bq);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto [st, call, aq, bq] = restore_operands(ctx, TensorKind::a, TensorKind::a);
    const torch::Tensor gq =
        st->quantize_owned(TensorKind::gx, std::move(grads[0]), call, backward_grad_refs());
    torch::Tensor da, db;
    if (ctx->needs_input_grad(0)) da = at::sum_to(gq.matmul(bq.transpose(-2, -1)), aq.sizes());
    if (ctx->needs_input_grad(1)) db = at::sum_to(aq.transpose(-2, -1).matmul(gq), bq.sizes());
    return {da, db, torch::Tensor()};
  }
};

// The probe of backward_grad_refs(): its backward sees the gradient as the ops' do.
class RefProbeFn : public torch::autograd::Function<RefProbeFn> {
 public:
  static torch::Tensor forward(AutogradContext*, const torch::Tensor& x) { return x.clone(); }
  static variable_list backward(AutogradContext*, variable_list grads) {
    torch::Tensor g = std::move(grads[0]);  // as the ops take it
    probe_refs = g.storage().use_count() == 1 ? g.use_count() : 0;
    return {g};
  }
  static inline std::int64_t probe_refs = 0;
};

void check_cpu_float(const torch::Tensor& t, const char* op, const char* what) {
  if (!t.defined()) return;
  if (!t.device().is_cpu() || t.scalar_type() != torch::kFloat32)
    throw Error(std::string(op) + ": " + what + " must be a float32 CPU tensor");
}

}  // namespace

std::int64_t backward_grad_refs() {
  static const std::int64_t refs = [] {
    // (x * 2) hands the probe a fresh gradient that nothing else holds. 0 (never in place)
    // if the probe saw anything else.
    try {
      c10::InferenceMode off(false);
      torch::AutoGradMode on(true);
      const torch::Tensor x = torch::ones({4}, torch::requires_grad());
      (RefProbeFn::apply(x) * 2).sum().backward();
      return RefProbeFn::probe_refs;
    } catch (const std::exception&) {
      return std::int64_t{0};
    }
  }();
  return refs;
}

torch::Tensor quant_linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                           const LayerStatePtr& st) {
  check_cpu_float(x, "quant_linear", "input");
  check_cpu_float(w, "quant_linear", "weight");
  if (w.dim() != 2 || x.dim() < 1 || x.size(-1) != w.size(1))
    throw Error("quant_linear '" + st->name + "': input's last dimension " +
                std::to_string(x.dim() ? x.size(-1) : 0) + " does not match weight " +
                std::to_string(w.size(0)) + "x" + std::to_string(w.size(1)));
  // Autograd functions take no undefined tensors: an empty one stands for "no bias".
  return LinearFn::apply(x, w, b.defined() ? b : torch::empty({0}), st);
}

torch::Tensor quant_conv2d(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                           std::vector<std::int64_t> stride, std::vector<std::int64_t> padding,
                           std::vector<std::int64_t> dilation, std::int64_t groups,
                           const LayerStatePtr& st) {
  check_cpu_float(x, "quant_conv2d", "input");
  check_cpu_float(w, "quant_conv2d", "weight");
  if (x.dim() != 4 || w.dim() != 4 || x.size(1) != w.size(1) * groups)
    throw Error("quant_conv2d '" + st->name + "': expected NCHW input with " +
                std::to_string(w.size(1) * groups) + " channels");
  return Conv2dFn::apply(x, w, b.defined() ? b : torch::empty({0}), std::move(stride), std::move(padding), std::move(dilation),
                         groups, st);
}

torch::Tensor quant_matmul(const torch::Tensor& a, const torch::Tensor& b, const LayerStatePtr& st) {
  check_cpu_float(a, "quant_matmul", "first operand");
  check_cpu_float(b, "quant_matmul", "second operand");
  if (a.dim() < 2 || b.dim() < 2 || a.size(-1) != b.size(-2))
    throw Error("quant_matmul '" + st->name + "': shapes do not multiply");
  return MatmulFn::apply(a, b, st);
}

}  // namespace fp8lab::nn
