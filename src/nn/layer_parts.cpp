// The parts of a quantized layer's state (layer_state.hpp): the statistics log, the random
// streams, the amax histories, the counts and statistics, the product path.
#include <ATen/ATen.h>
#include <torch/torch.h>

#include "fp8lab/core/random.hpp"
#include "fp8lab/nn/layer_state.hpp"

namespace fp8lab::nn {

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

// ---- streams ------------------------------------------------------------------------------

std::uint32_t LayerStreams::begin_call() {
  std::lock_guard<std::mutex> lk(m_);
  const std::uint64_t step = ctx_.step.load();
  const std::uint32_t micro = ctx_.micro.load();
  if (step != call_step_ || micro != call_micro_) {
    call_step_ = step;
    call_micro_ = micro;
    calls_ = 0;
  }
  return calls_++;
}

std::uint64_t LayerStreams::seed_for(TensorKind k, std::uint32_t call, std::uint32_t operand) const {
  const std::uint64_t step = ctx_.step.load();
  const std::uint32_t micro = ctx_.micro.load();
  return mix64(layer_seed_ ^ mix64(step) ^
               mix64((static_cast<std::uint64_t>(call) << 8) | (operand << 4) | static_cast<std::uint64_t>(k)) ^
               (micro == 0 ? 0 : mix64(0x3C6EF372FE94F82BULL + micro)));
}

std::vector<float> LayerStreams::hadamard_signs_for(std::uint32_t call, BackwardProduct product, int n) const {
  return hadamard_signs(seed_for(product == BackwardProduct::grad_x ? TensorKind::gx : TensorKind::gw, call, 15), n);
}

// ---- amax histories -----------------------------------------------------------------------

ScaledCall AmaxHistories::scaled_call(TensorKind k, std::uint32_t operand) const {
  ScaledCall c;
  if (quant_[k]->history == 0) return c;
  std::lock_guard<std::mutex> lk(m_);
  const auto it = histories_.find({static_cast<int>(k), operand});
  if (it != histories_.end()) c.delayed_amax = it->second.amax();
  return c;
}

void AmaxHistories::push(TensorKind k, std::uint32_t operand, float amax) {
  if (!ctx_.recording || quant_[k]->history == 0) return;
  std::lock_guard<std::mutex> lk(m_);
  histories_.try_emplace({static_cast<int>(k), operand}, quant_[k]->history).first->second.push(amax);
}

std::vector<AmaxHistories::History> AmaxHistories::get() const {
  std::lock_guard<std::mutex> lk(m_);
  std::vector<History> out;
  for (const auto& [key, h] : histories_)
    out.push_back({static_cast<TensorKind>(key.first), key.second, {h.values().begin(), h.values().end()}});
  return out;
}

void AmaxHistories::restore(const std::vector<History>& hs) {
  std::lock_guard<std::mutex> lk(m_);
  histories_.clear();
  for (const History& h : hs) {
    const KindQuant& q = quant_[h.kind];
    if (!q || q->history == 0)
      throw Error("layer '" + layer_ + "': an amax history for " + std::string(to_string(h.kind)) +
                  ", whose quantizer has no delayed scaling");
    AmaxHistory a(q->history);
    a.restore({h.amaxes.begin(), h.amaxes.end()});
    histories_.insert_or_assign({static_cast<int>(h.kind), h.operand}, std::move(a));
  }
}

// ---- counts and statistics ----------------------------------------------------------------

std::array<QuantCounts, kKinds> LayerStats::counts() const {
  std::lock_guard<std::mutex> lk(m_);
  return counts_;
}
void LayerStats::add_counts(const std::array<QuantCounts, kKinds>& c) {
  std::lock_guard<std::mutex> lock(m_);
  for (int k = 0; k < kKinds; ++k) counts_[k] += c[k];
}
void LayerStats::reset_counts() {
  std::lock_guard<std::mutex> lk(m_);
  counts_ = {};
}

bool LayerStats::due(std::uint32_t call) const {
  const int every = ctx_.stats_interval;
  return ctx_.recording && every > 0 && call == 0 && ctx_.micro.load() == 0 &&
         ctx_.step.load() % static_cast<std::uint64_t>(every) == 0;
}

namespace {
// The histogram of a scaled quantization's group scales, by their exponent.
kernels::ExpHistogram scale_histogram(const KindQuant& quant, const ScaledTensor& q) {
  const auto* codes = reinterpret_cast<const std::uint32_t*>(q.scales.data_ptr<std::int32_t>());
  std::vector<float> scales(static_cast<std::size_t>(q.scales.numel()));
  for (std::size_t i = 0; i < scales.size(); ++i) scales[i] = scale_from_code(*quant, codes[i], q.tensor_scale).value;
  return kernels::exponent_histogram(scales.data(), scales.size());
}
}  // namespace

void LayerStats::record(TensorKind k, const QuantizeRecord& q, std::uint32_t call) {
  if (!ctx_.recording) return;
  {
    std::lock_guard<std::mutex> lk(m_);
    counts_[static_cast<int>(k)] += q.counts;
  }
  if (!due(call)) return;
  const torch::Tensor x = q.input.contiguous();
  TensorStats s;
  s.step = ctx_.step.load();
  s.layer = layer_;
  s.kind = k;
  s.hist = kernels::exponent_histogram(x.data_ptr<float>(), static_cast<std::size_t>(x.numel()));
  s.counts = q.counts;
  s.absmax = x.numel() ? x.abs().max().item<float>() : 0.0f;
  if (q.groups && q.scaled) {
    s.scaled = true;
    s.groups = *q.groups;
    s.scale_hist = scale_histogram(quant_[k], *q.scaled);
  }
  ctx_.stats->add(std::move(s));
}

// ---- products -----------------------------------------------------------------------------

torch::Tensor LayerProducts::matmul(const torch::Tensor& a, const torch::Tensor& b) {
  Compute taken = Compute::fp32;
  torch::Tensor y = nn::matmul(a, b, ctx_.compute, &taken, ctx_.accumulate);
  count(taken);
  return y;
}

torch::Tensor LayerProducts::matmul_scaled(const torch::Tensor& a, const ReductionScales& sa, const torch::Tensor& b,
                                           const ReductionScales& sb) {
  Compute taken = Compute::fp32;
  torch::Tensor y = nn::matmul_scaled(a, sa, b, sb, ctx_.compute, &taken, ctx_.accumulate);
  count(taken);
  return y;
}

torch::Tensor LayerProducts::conv(const torch::Tensor& x, const torch::Tensor& w, const ConvGeometry& g) {
  Compute taken = Compute::fp32;
  torch::Tensor y = conv2d(x, w, g, ctx_.compute, &taken, ctx_.accumulate);
  count(taken);
  return y;
}

ConvGrads LayerProducts::conv_backward(const torch::Tensor& gy_dx, const torch::Tensor& gy_dw, const torch::Tensor& x,
                                       const torch::Tensor& w, const ConvGeometry& g, bool want_dx, bool want_dw) {
  ConvGrads r = conv2d_backward(gy_dx, gy_dw, x, w, g, ctx_.compute, want_dx, want_dw, ctx_.accumulate);
  if (want_dx) count(r.dx_path);
  if (want_dw) count(r.dw_path);
  return r;
}

}  // namespace fp8lab::nn
