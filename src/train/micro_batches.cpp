#include "micro_batches.hpp"

#include <algorithm>
#include <cmath>

#include "fp8lab/core/error.hpp"
#include "fp8lab/core/random.hpp"
#include "fp8lab/train/trainer.hpp"
#include "fp8lab/nn/tensor_quant.hpp"

namespace fp8lab::train {

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

MicroBatches::MicroBatches(torch::nn::Module& model, int micro, World* world, const nn::KindQuant& comm,
                           std::int64_t bucket_bytes)
    : micro_(micro), world_(world), comm_(comm) {
  const int procs = world ? world->size() : 1;
  check_process_count(micro, procs);
  count_ = micro / procs;
  first_ = (world ? world->rank() : 0) * count_;
  single_ = micro == 1 && !world && !comm;
  if (single_) {
    for (auto& p : model.parameters()) params_.push_back(p);
    return;
  }
  offset_ = {0};
  for (auto& p : model.parameters()) {
    params_.push_back(p);
    grad_numel_ += p.numel();
    offset_.push_back(grad_numel_);
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
  overlap_ = world_ && world_->size() > 1 && count_ == 1 && bucket_bytes > 0;
  if (!overlap_) return;
  // Buckets of about bucket_bytes of float32 gradients over the parameters from the last to the first.
  const std::int64_t bucket_elements = std::max<std::int64_t>(1, bucket_bytes / 4);
  bucket_of_.assign(params_.size(), 0);
  for (std::size_t k = params_.size(); k-- > 0;) {
    if (buckets_.empty() || buckets_.back().end - buckets_.back().begin >= bucket_elements)
      buckets_.push_back({offset_[k + 1], offset_[k + 1], 0, 0});
    Bucket& b = buckets_.back();
    b.begin = offset_[k];
    ++b.params;
    bucket_of_[k] = static_cast<int>(buckets_.size() - 1);
  }
  taken_.assign(params_.size(), 0);
  gathered_ = torch::empty({world_->size(), grad_numel_}, (comm_ ? codes_ : grads_).options());
  for (std::size_t j = 0; j < params_.size(); ++j)
    params_[j].register_hook([this, j](torch::Tensor grad) {
      if (capturing_) on_gradient(j, grad);
    });
}

// Parameter j's gradient, just made by autograd: into this process's row; its bucket is
// sent when it was the last one missing.
void MicroBatches::on_gradient(std::size_t j, const torch::Tensor& grad) {
  torch::NoGradGuard g;
  if (taken_[j]) throw Error("data-parallel exchange: a parameter's gradient arrived twice in one backward");
  take(0, j, grad);
  taken_[j] = 1;
  --buckets_[static_cast<std::size_t>(bucket_of_[j])].left;
  send_ready();
}

void MicroBatches::send_ready() {
  const torch::Tensor row = (comm_ ? codes_ : grads_)[0];
  for (; next_bucket_ < buckets_.size() && buckets_[next_bucket_].left == 0; ++next_bucket_) {
    const Bucket& b = buckets_[next_bucket_];
    std::vector<torch::Tensor> outs;
    for (int r = 0; r < world_->size(); ++r) outs.push_back(gathered_[r].slice(0, b.begin, b.end));
    const torch::Tensor mine = row.slice(0, b.begin, b.end);
    world_->start_gather(mine, outs, "the all-gather of the step's gradients");
    count_sent(mine);
  }
}

void MicroBatches::count_sent(const torch::Tensor& t) {
  if (world_) gradient_bytes_ += t.numel() * t.element_size() * (world_->size() - 1);
}

// Every process's rows of `mine` ([count, k]) as [micro, k], counted as gradient bytes.
torch::Tensor MicroBatches::gather_gradients(const torch::Tensor& mine, const std::string& what) {
  count_sent(mine);
  return world_->all_gather(mine, what).reshape({micro_, -1});
}

// Parameter j's gradient (undefined: none) into row `row`: float32, or its codes, scales and
// tensor scale in the exchange format.
void MicroBatches::take(std::int64_t row, std::size_t j, const torch::Tensor& grad) {
  const std::int64_t off = offset_[j], n = offset_[j + 1] - off;
  const torch::Tensor dst = grads_[row].slice(0, off, off + n);
  if (grad.defined()) dst.copy_(grad.reshape({-1}));
  else dst.zero_();
  if (!comm_) return;
  const std::uint64_t s = mix64(comm_seed_ ^ mix64(0xC033000000000000ULL + j));
  if (comm_->scaled()) {
    const nn::ScaledTensor q = nn::scaled_quantize_matrix(dst.view({1, n}), *comm_, s, {}, {.codes = true});
    codes_[row].slice(0, off, off + n).copy_(q.codes.view({n}));
    scales_[row].slice(0, scale_off_[j], scale_off_[j + 1]).copy_(q.scales);
    tensor_scales_[row][static_cast<std::int64_t>(j)] = q.tensor_scale;
  } else {
    codes_[row].slice(0, off, off + n).copy_(nn::encode_tensor(dst, comm_->element, s));
  }
}

void MicroBatches::begin_step() {
  if (single_) return;
  torch::NoGradGuard g;
  start_.clear();
  for (auto& b : buffers_) start_.push_back(b.detach().clone());
}

void MicroBatches::before(int m, std::uint64_t comm_seed) {
  torch::NoGradGuard g;
  for (auto& p : params_) p.mutable_grad() = torch::Tensor();
  if (single_) return;
  if (m != first_)
    for (std::size_t i = 0; i < buffers_.size(); ++i) buffers_[i].copy_(start_[i]);
  comm_seed_ = comm_seed;
  if (overlap_) {
    std::fill(taken_.begin(), taken_.end(), 0);
    for (Bucket& b : buckets_) b.left = b.params;
    next_bucket_ = 0;
    capturing_ = true;
  }
}

void MicroBatches::after(int m, double loss, std::int64_t n, bool stop) {
  if (single_) {
    single_step_ = {loss, std::isfinite(loss), stop};
    return;
  }
  torch::NoGradGuard g;
  capturing_ = false;
  const std::int64_t row = m - first_;
  torch::Tensor side = side_[row];
  double* s = side.data_ptr<double>();
  s[kLoss] = loss;
  s[kCount] = static_cast<double>(n);
  s[kStop] = stop ? 1 : 0;
  std::int64_t flag = kFlags;
  for (std::size_t j = 0; j < params_.size(); ++j) {
    const torch::Tensor& grad = params_[j].grad();
    s[flag++] = grad.defined() ? 1 : 0;
    if (overlap_ && taken_[j]) continue;  // taken as backward made it
    take(row, j, grad);
    if (overlap_) {  // a parameter no gradient reached in this shard
      taken_[j] = 1;
      --buckets_[static_cast<std::size_t>(bucket_of_[j])].left;
    }
  }
  if (overlap_) send_ready();  // every bucket not yet sent
  std::int64_t voff = kFlags + static_cast<std::int64_t>(params_.size() + buffers_.size());
  for (std::size_t i = 0; i < buffers_.size(); ++i) {
    const torch::Tensor& b = buffers_[i];
    s[flag++] = torch::equal(b, start_[i]) ? 0 : 1;
    side.slice(0, voff, voff + b.numel()).copy_(b.reshape({-1}).to(torch::kFloat64));
    voff += b.numel();
  }
}

// Every shard's gradients, float32 [shards, grad_numel], from their codes.
torch::Tensor MicroBatches::decode(const torch::Tensor& codes, const torch::Tensor& scales,
                                   const torch::Tensor& tensor_scales) {
  torch::Tensor out = torch::empty({codes.size(0), grad_numel_}, torch::kFloat32);
  for (std::int64_t m = 0; m < codes.size(0); ++m) {
    for (std::size_t j = 0; j < params_.size(); ++j) {
      const std::int64_t off = offset_[j], n = offset_[j + 1] - off;
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
    }
  }
  return out;
}

MicroBatches::Step MicroBatches::reduce() {
  if (single_) return single_step_;
  torch::NoGradGuard g;
  const bool several = world_ && world_->size() > 1;
  const torch::Tensor side =
      several ? world_->all_gather(side_, "the exchange of the step's losses and buffers").reshape({micro_, side_numel_})
              : side_;
  // Every shard's gradients as they travel: float32, or codes in the exchange format. With
  // the overlap they were sent during the backward pass (the gather above waited for them).
  torch::Tensor grads = comm_ ? codes_ : grads_;
  if (overlap_) grads = gathered_;
  else if (several) grads = gather_gradients(grads, "the all-gather of the step's gradients");
  if (comm_) {
    torch::Tensor scales = scales_, tensor_scales = tensor_scales_;
    if (several && scales_.numel() > 0) {
      // Scale codes of 8-bit scale formats (E8M0, UE4M3) travel as bytes.
      const bool narrow = scale_format(comm_->scale).width() <= 8;
      scales = gather_gradients(narrow ? scales_.to(torch::kUInt8) : scales_, "the all-gather of the gradients' scales")
                   .to(torch::kInt32);
    }
    if (several && comm_->scaled())
      tensor_scales = gather_gradients(tensor_scales_, "the all-gather of the gradients' tensor scales");
    grads = decode(grads, scales, tensor_scales);
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
  for (std::size_t j = 0; j < params_.size(); ++j) {
    bool defined = false;
    for (int m : used) defined = defined || at(m, kFlags + static_cast<std::int64_t>(j)) != 0;
    params_[j].mutable_grad() =
        defined ? sum.slice(0, offset_[j], offset_[j + 1]).view_as(params_[j]) : torch::Tensor();
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

}  // namespace fp8lab::train
