// A step's batch as micro-batches (private to src/train; docs/training.md,
// "Data-parallel training"). train.micro_batches = M splits the global batch into M shards of
// nearly equal size; shard m runs its own forward and backward, from the step's starting
// buffers (batch norm's running statistics), with its own random streams. The step's
// gradient is then
//     g = sum over m = 0..M-1, in that order, of (n_m / n) g_m
// and each floating buffer that a shard changed becomes sum (n_m / n) b_m (integer buffers,
// such as batch norm's step count, take shard 0's value). With N processes each computes M/N
// consecutive shards and every process receives every shard's gradient (World::all_gather),
// so every process forms the same sum in the same order: the same bits for any N dividing M.
// With M = 1, one process and float32 gradients the step is the plain step: one shard whose
// gradients stay where backward put them, with nothing copied or exchanged.
//
// With one shard per process (M = N > 1) the exchange overlaps the backward pass: a hook on
// every parameter takes its gradient as autograd produces it, and each bucket of
// parameters (about 1 MiB, in the reverse of their order, the order backward produces
// them) starts its all-gather as soon as its last gradient is in and every bucket before it
// has started (every process must start the same gathers in the same order, also when
// stochastic depth leaves a bucket's parameters without gradients on one of them).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "fp8lab/train/world.hpp"
#include "fp8lab/settings/recipe.hpp"

namespace fp8lab::train {

// The shard of `n` examples that micro-batch m of M holds: [begin, end).
std::pair<std::int64_t, std::int64_t> micro_range(std::int64_t n, int micro, int m);

// The stream seed of micro-batch m of a step whose own seed is `step_seed` (m = 0: itself).
std::uint64_t micro_seed(std::uint64_t step_seed, int m);

class MicroBatches {
 public:
  // `world` null: one process computes every shard. `comm`: the format each shard's
  // gradients travel in (nullopt: float32), quantized per parameter as one row, decoded
  // before the sum. `bucket_bytes`: the overlap's buckets (0: no overlap; the gradients
  // leave after the backward pass).
  MicroBatches(torch::nn::Module& model, int micro, World* world, const nn::KindQuant& comm = std::nullopt,
               std::int64_t bucket_bytes = std::int64_t{1} << 20);

  int first() const { return first_; }  // the shards this process computes: first .. first + count - 1
  int count() const { return count_; }

  void begin_step();          // remembers the buffers the step starts from
  // The model's buffers back to the step's start; gradients cleared. `comm_seed` seeds the
  // stochastic rounding of shard m's gradients in the exchange format.
  void before(int m, std::uint64_t comm_seed = 0);
  // Takes shard m's gradients and buffers (after its backward); `loss` is its mean loss over
  // `n` examples; `stop` this process's wish to stop after the step.
  void after(int m, double loss, std::int64_t n, bool stop);

  struct Step {
    double loss = 0;          // sum (n_m / n) loss_m
    bool loss_finite = true;  // every shard's loss finite
    bool stop = false;        // some process asked to stop after this step
  };
  // Exchanges the shards (with a world), sets every parameter's gradient to the step's sum
  // (undefined where no shard produced one) and the buffers to theirs.
  Step reduce();

  // Bytes of gradients (codes, scales) this process has sent to the others so far.
  std::int64_t gradient_bytes_sent() const { return gradient_bytes_; }

 private:
  std::vector<torch::Tensor> params_, buffers_, start_;
  int micro_ = 1, first_ = 0, count_ = 1;
  World* world_ = nullptr;
  bool single_ = false;  // one shard, one process, float32: the gradients stay in .grad
  Step single_step_;     // its loss and stop wish
  std::int64_t grad_numel_ = 0, side_numel_ = 0, gradient_bytes_ = 0;
  nn::KindQuant comm_;
  std::vector<std::int64_t> scale_off_;  // comm_ scaled: each parameter's first scale, then the total
  torch::Tensor grads_;  // [count, grad_numel] float32: this process's shards' gradients
  torch::Tensor codes_, scales_, tensor_scales_;  // comm_: [count, grad_numel], [count, scales], [count, params]
  std::vector<std::int64_t> offset_;  // each parameter's first element in a row, then the total
  std::uint64_t comm_seed_ = 0;
  void take(std::int64_t row, std::size_t j, const torch::Tensor& grad);  // parameter j's gradient into a row
  torch::Tensor decode(const torch::Tensor& codes, const torch::Tensor& scales, const torch::Tensor& tensor_scales);
  void count_sent(const torch::Tensor& t);
  torch::Tensor gather_gradients(const torch::Tensor& mine, const std::string& what);

  // The overlap (one shard per process, several processes).
  struct Bucket {
    std::int64_t begin = 0, end = 0;  // elements of a row
    int params = 0, left = 0;         // its parameters; those whose gradient is not in yet
  };
  bool overlap_ = false;
  bool capturing_ = false;            // inside this process's shard's backward
  std::vector<Bucket> buckets_;
  std::size_t next_bucket_ = 0;       // the next bucket to send
  std::vector<int> bucket_of_;        // per parameter
  std::vector<char> taken_;           // per parameter: its gradient is in this step
  torch::Tensor gathered_;            // [processes, grad_numel]: every shard's row, as it arrives
  void on_gradient(std::size_t j, const torch::Tensor& grad);
  void send_ready();  // the buckets, in order, up to the first with a gradient not yet in
  torch::Tensor side_;   // [count, side_numel] float64: loss, n, stop, defined and changed flags, buffers
};

}  // namespace fp8lab::train
