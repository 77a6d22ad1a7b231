// A step's batch as micro-batches (private to src/experiments; docs/training.md,
// "Data-parallel training"). train.micro_batches = M splits the global batch into M shards of
// nearly equal size; shard m runs its own forward and backward, from the step's starting
// buffers (batch norm's running statistics), with its own random streams. The step's
// gradient is then
//     g = sum over m = 0..M-1, in that order, of (n_m / n) g_m
// and each floating buffer that a shard changed becomes sum (n_m / n) b_m (integer buffers,
// such as batch norm's step count, take shard 0's value). With N processes each computes M/N
// consecutive shards and every process receives every shard's gradient (World::all_gather),
// so every process forms the same sum in the same order: the same bits for any N dividing M.
// With M = 1 and one process the step is the plain step, bit for bit.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "fp8lab/experiments/world.hpp"
#include "fp8lab/nn/recipe.hpp"

namespace fp8lab::experiments {

// The shard of `n` examples that micro-batch m of M holds: [begin, end).
std::pair<std::int64_t, std::int64_t> micro_range(std::int64_t n, int micro, int m);

// The stream seed of micro-batch m of a step whose own seed is `step_seed` (m = 0: itself).
std::uint64_t micro_seed(std::uint64_t step_seed, int m);

class MicroBatches {
 public:
  // `world` null: one process computes every shard. `comm`: the format each shard's
  // gradients travel in (nullopt: float32), quantized per parameter as one row, decoded
  // before the sum.
  MicroBatches(torch::nn::Module& model, int micro, World* world, const nn::KindQuant& comm = std::nullopt);

  int first() const { return first_; }  // the shards this process computes: first .. first + count - 1
  int count() const { return count_; }

  void begin_step();          // remembers the buffers the step starts from
  void before(int m);         // the model's buffers back to the step's start; gradients cleared
  // Takes shard m's gradients and buffers (after its backward); `loss` is its mean loss over
  // `n` examples; `stop` this process's wish to stop after the step; `comm_seed` seeds the
  // stochastic rounding of the gradients' format.
  void after(int m, double loss, std::int64_t n, bool stop, std::uint64_t comm_seed = 0);

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
  std::int64_t grad_numel_ = 0, side_numel_ = 0, gradient_bytes_ = 0;
  nn::KindQuant comm_;
  std::vector<std::int64_t> scale_off_;  // comm_ scaled: each parameter's first scale, then the total
  torch::Tensor grads_;  // [count, grad_numel] float32: this process's shards' gradients
  torch::Tensor codes_, scales_, tensor_scales_;  // comm_: [count, grad_numel], [count, scales], [count, params]
  void encode(std::int64_t row, std::uint64_t seed);
  torch::Tensor decode(const torch::Tensor& codes, const torch::Tensor& scales, const torch::Tensor& tensor_scales);
  torch::Tensor side_;   // [count, side_numel] float64: loss, n, stop, defined and changed flags, buffers
};

}  // namespace fp8lab::experiments
