#include "micro_batches.hpp"

#include <cmath>

#include "fp8lab/core/format.hpp"
#include "fp8lab/core/random.hpp"
#include "fp8lab/nn/tensor_quant.hpp"

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

MicroBatches::MicroBatches(torch::nn::Module& model, int micro, World* world, const nn::KindQuant& comm)
    : micro_(micro), world_(world), comm_(comm) {
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
  if (comm_) {
    const bool wide = comm_->element.format.width() > 8;
    codes_ = torch::zeros({count_, grad_numel_}, wide ? torch::kInt16 : torch::kUInt8);
    scale_off_ = {0};
    for (auto& p : params_) {
      const std::int64_t groups =
          comm_->scaled()
              ? static_cast<std::int64_t>(block_layout(*comm_, 1, static_cast<std::size_t>(p.numel())).groups())
              : 0;
      scale_off_.push_back(scale_off_.back() + groups);
    }
    scales_ = torch::zeros({count_, scale_off_.back()}, torch::kInt32);
    tensor_scales_ = torch::ones({count_, static_cast<std::int64_t>(params_.size())}, torch::kFloat32);
  }
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

void MicroBatches::after(int m, double loss, std::int64_t n, bool stop, std::uint64_t comm_seed) {
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
  if (comm_) encode(row, comm_seed);
  std::int64_t voff = kFlags + static_cast<std::int64_t>(params_.size() + buffers_.size());
  for (std::size_t i = 0; i < buffers_.size(); ++i) {
    const torch::Tensor& b = buffers_[i];
    s[flag++] = torch::equal(b, start_[i]) ? 0 : 1;
    side.slice(0, voff, voff + b.numel()).copy_(b.reshape({-1}).to(torch::kFloat64));
    voff += b.numel();
  }
}

// Shard row `row`'s gradients (in grads_) into codes, scales and tensor scales: each
// parameter's gradient as one row of its own.
void MicroBatches::encode(std::int64_t row, std::uint64_t seed) {
  std::int64_t off = 0;
  for (std::size_t j = 0; j < params_.size(); ++j) {
    const std::int64_t n = params_[j].numel();
    const torch::Tensor g = grads_[row].slice(0, off, off + n);
    const std::uint64_t s = mix64(seed ^ mix64(0xC033000000000000ULL + j));
    if (comm_->scaled()) {
      const nn::ScaledTensor q = nn::scaled_quantize_matrix(g.view({1, n}), *comm_, s, {}, false, true);
      codes_[row].slice(0, off, off + n).copy_(q.codes.view({n}));
      scales_[row].slice(0, scale_off_[j], scale_off_[j + 1]).copy_(q.scales);
      tensor_scales_[row][static_cast<std::int64_t>(j)] = q.tensor_scale;
    } else {
      codes_[row].slice(0, off, off + n).copy_(nn::encode_tensor(g, comm_->element, s));
    }
    off += n;
  }
}

// Every shard's gradients, float32 [shards, grad_numel], from their codes.
torch::Tensor MicroBatches::decode(const torch::Tensor& codes, const torch::Tensor& scales,
                                   const torch::Tensor& tensor_scales) {
  torch::Tensor out = torch::empty({codes.size(0), grad_numel_}, torch::kFloat32);
  for (std::int64_t m = 0; m < codes.size(0); ++m) {
    std::int64_t off = 0;
    for (std::size_t j = 0; j < params_.size(); ++j) {
      const std::int64_t n = params_[j].numel();
      const torch::Tensor c = codes[m].slice(0, off, off + n);
      if (comm_->scaled()) {
        nn::ScaledTensor q;
        q.codes = c.view({1, n}).contiguous();
        q.scales = scales[m].slice(0, scale_off_[j], scale_off_[j + 1]).contiguous();
        q.tensor_scale = tensor_scales[m][static_cast<std::int64_t>(j)].item<float>();
        out[m].slice(0, off, off + n).copy_(nn::scaled_decode_matrix(q, *comm_).view({n}));
      } else {
        out[m].slice(0, off, off + n).copy_(nn::decode_tensor(c.contiguous(), comm_->element.format));
      }
      off += n;
    }
  }
  return out;
}

MicroBatches::Step MicroBatches::reduce() {
  torch::NoGradGuard g;
  torch::Tensor grads = grads_, side = side_;
  const bool several = world_ && world_->size() > 1;
  if (several)
    side = world_->all_gather(side_, "the exchange of the step's losses and buffers").reshape({micro_, side_numel_});
  const std::int64_t sent_before = several ? world_->stats().bytes_sent : 0;
  if (comm_) {
    torch::Tensor codes = codes_, scales = scales_, tensor_scales = tensor_scales_;
    if (several) {
      codes = world_->all_gather(codes_, "the all-gather of the step's gradients").reshape({micro_, grad_numel_});
      if (scales_.numel() > 0) {
        // Scale codes of 8-bit scale formats (E8M0, UE4M3) travel as bytes.
        const bool narrow = scale_format(comm_->scale).width() <= 8;
        scales = world_
                     ->all_gather(narrow ? scales_.to(torch::kUInt8) : scales_,
                                  "the all-gather of the gradients' scales")
                     .reshape({micro_, -1})
                     .to(torch::kInt32);
      }
      if (comm_->scaled())
        tensor_scales = world_->all_gather(tensor_scales_, "the all-gather of the gradients' tensor scales")
                            .reshape({micro_, -1});
    }
    grads = decode(codes, scales, tensor_scales);
  } else if (several) {
    grads = world_->all_gather(grads_, "the all-gather of the step's gradients").reshape({micro_, grad_numel_});
  }
  if (several) gradient_bytes_ += world_->stats().bytes_sent - sent_before;
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
