#include "micro_batches.hpp"

#include <cmath>

#include "fp8lab/core/format.hpp"
#include "fp8lab/core/random.hpp"

namespace fp8lab::experiments {

std::pair<std::int64_t, std::int64_t> micro_range(std::int64_t n, int micro, int m) {
  const std::int64_t base = n / micro, extra = n % micro;
  const std::int64_t begin = m * base + std::min<std::int64_t>(m, extra);
  return {begin, begin + base + (m < extra ? 1 : 0)};
}

std::uint64_t micro_seed(std::uint64_t step_seed, int m) {
  return m == 0 ? step_seed : mix64(step_seed ^ mix64(0xB5297A4D00000000ULL + static_cast<std::uint64_t>(m)));
}

namespace {
constexpr std::int64_t kLoss = 0, kCount = 1, kStop = 2, kFlags = 3;  // side row layout
}

MicroBatches::MicroBatches(torch::nn::Module& model, int micro, World* world) : micro_(micro), world_(world) {
  const int procs = world ? world->size() : 1;
  if (micro < 1 || micro % procs != 0)
    throw Error("train.micro_batches = " + std::to_string(micro) + " cannot be shared by " + std::to_string(procs) +
                " processes: it must be a multiple of the process count");
  count_ = micro / procs;
  first_ = (world ? world->rank() : 0) * count_;
  for (auto& p : model.parameters()) {
    params_.push_back(p);
    grad_numel_ += p.numel();
  }
  std::int64_t buffer_numel = 0;
  for (auto& b : model.buffers()) {
    buffers_.push_back(b);
    buffer_numel += b.numel();
  }
  side_numel_ = kFlags + static_cast<std::int64_t>(params_.size() + buffers_.size()) + buffer_numel;
  grads_ = torch::zeros({count_, grad_numel_}, torch::kFloat32);
  side_ = torch::zeros({count_, side_numel_}, torch::kFloat64);
}

void MicroBatches::begin_step() {
  torch::NoGradGuard g;
  start_.clear();
  for (auto& b : buffers_) start_.push_back(b.detach().clone());
}

void MicroBatches::before(int m) {
  torch::NoGradGuard g;
  if (m != first_)
    for (std::size_t i = 0; i < buffers_.size(); ++i) buffers_[i].copy_(start_[i]);
  for (auto& p : params_) p.mutable_grad() = torch::Tensor();
}

void MicroBatches::after(int m, double loss, std::int64_t n, bool stop) {
  torch::NoGradGuard g;
  const std::int64_t row = m - first_;
  torch::Tensor grads = grads_[row], side = side_[row];
  double* s = side.data_ptr<double>();
  s[kLoss] = loss;
  s[kCount] = static_cast<double>(n);
  s[kStop] = stop ? 1 : 0;
  std::int64_t off = 0, flag = kFlags;
  for (auto& p : params_) {
    const torch::Tensor dst = grads.slice(0, off, off + p.numel());
    const bool defined = p.grad().defined();
    if (defined) dst.copy_(p.grad().reshape({-1}));
    else dst.zero_();
    s[flag++] = defined ? 1 : 0;
    off += p.numel();
  }
  std::int64_t voff = kFlags + static_cast<std::int64_t>(params_.size() + buffers_.size());
  for (std::size_t i = 0; i < buffers_.size(); ++i) {
    const torch::Tensor& b = buffers_[i];
    s[flag++] = torch::equal(b, start_[i]) ? 0 : 1;
    side.slice(0, voff, voff + b.numel()).copy_(b.reshape({-1}).to(torch::kFloat64));
    voff += b.numel();
  }
}

MicroBatches::Step MicroBatches::reduce() {
  torch::NoGradGuard g;
  torch::Tensor grads = grads_, side = side_;
  if (world_ && world_->size() > 1) {
    side = world_->all_gather(side_, "the exchange of the step's losses and buffers").reshape({micro_, side_numel_});
    grads = world_->all_gather(grads_, "the all-gather of the step's gradients").reshape({micro_, grad_numel_});
  }
  const auto* s = side.data_ptr<double>();
  auto at = [&](int m, std::int64_t i) { return s[m * side_numel_ + i]; };
  double total = 0;
  for (int m = 0; m < micro_; ++m) total += at(m, kCount);
  Step step;
  std::vector<int> used;  // shards with examples, in order
  for (int m = 0; m < micro_; ++m) {
    step.stop = step.stop || at(m, kStop) != 0;
    if (at(m, kCount) == 0) continue;
    used.push_back(m);
    const double w = at(m, kCount) / total, l = at(m, kLoss);
    step.loss_finite = step.loss_finite && std::isfinite(l);
    step.loss += w * l;
  }
  // The gradient: sum (n_m / n) g_m over the shards in order (w = 1 for a single shard: the
  // shard's own gradient, unchanged).
  torch::Tensor sum;
  for (int m : used) {
    const double w = at(m, kCount) / total;
    const torch::Tensor gm = w == 1.0 ? grads[m] : grads[m] * w;
    if (!sum.defined()) sum = gm.clone();
    else sum.add_(gm);
  }
  std::int64_t off = 0;
  for (std::size_t j = 0; j < params_.size(); ++j) {
    bool defined = false;
    for (int m : used) defined = defined || at(m, kFlags + static_cast<std::int64_t>(j)) != 0;
    const std::int64_t n = params_[j].numel();
    params_[j].mutable_grad() = defined ? sum.slice(0, off, off + n).view_as(params_[j]) : torch::Tensor();
    off += n;
  }
  // The buffers: the weighted sum where a shard changed them, else as the step began.
  std::int64_t voff = kFlags + static_cast<std::int64_t>(params_.size() + buffers_.size());
  for (std::size_t i = 0; i < buffers_.size(); ++i) {
    torch::Tensor& b = buffers_[i];
    const std::int64_t flag = kFlags + static_cast<std::int64_t>(params_.size() + i), n = b.numel();
    bool changed = false;
    for (int m : used) changed = changed || at(m, flag) != 0;
    if (!changed || used.empty()) {
      b.copy_(start_[i]);
    } else if (!b.is_floating_point()) {
      b.copy_(side[used.front()].slice(0, voff, voff + n).view(b.sizes()).to(b.scalar_type()));
    } else {
      torch::Tensor acc;
      for (int m : used) {
        const torch::Tensor v = side[m].slice(0, voff, voff + n) * (at(m, kCount) / total);
        acc = acc.defined() ? acc + v : v;
      }
      b.copy_(acc.view(b.sizes()).to(b.scalar_type()));
    }
    voff += n;
  }
  return step;
}

}  // namespace fp8lab::experiments
