// What the compute layer's matmul and convolution share (internal to src/nn): the library
// of bfloat16 products, the bfloat16 check and the choice of path.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "fp8lab/core/error.hpp"
#include "fp8lab/nn/compute.hpp"
#include "onednn/onednn_api.h"

namespace fp8lab::nn::detail {

// The bfloat16 products (onednn/onednn_api.h), loaded on first use (onednn_loader.cpp);
// Error naming the paths tried where the library cannot be loaded.
const fp8lab_onednn_api& onednn();

// Throws Error with `message` where a call of the library failed (message not null).
void check_onednn(const char* message);

// Throws Error if this CPU has no bfloat16 products (`what` names the product).
void require_bf16_products(const char* what);

// The dtypes the compute layer's products take: float32, or bfloat16 given as such.
inline bool float_or_bf16(const torch::Tensor& t) {
  return t.scalar_type() == torch::kFloat || t.scalar_type() == torch::kBFloat16;
}

// A float32 path's operand: a bfloat16 one widened (exactly).
inline torch::Tensor widened(const torch::Tensor& t) {
  return t.scalar_type() == torch::kFloat ? t : t.to(torch::kFloat);
}

// A channels-last float32 activation (a bfloat16 one widened): the float32 paths keep one
// layout, so that a network whose layers take both paths never mixes layouts (element-wise
// ops on mixed layouts are several times slower than on either).
inline torch::Tensor cl(const torch::Tensor& t) { return widened(t).contiguous(torch::MemoryFormat::ChannelsLast); }

// A convolution's geometry pair as libtorch takes it.
inline std::vector<std::int64_t> vec(const std::array<std::int64_t, 2>& a) { return {a[0], a[1]}; }

// A convolution's output size along one axis (torch's, rounding down).
inline std::int64_t out_size(std::int64_t in, std::int64_t k, std::int64_t stride, std::int64_t pad,
                             std::int64_t dil) {
  return (in + 2 * pad - dil * (k - 1) - 1) / stride + 1;
}

// The path choice of every product (docs/spec.md §7): `bf16()` (nullopt: an operand is not
// bfloat16) where `c` allows and the CPU has bfloat16 products, `fp32()` otherwise; bf16
// forced on an operand that is not bfloat16 is an Error naming `what`.
template <class Bf16, class Fp32>
torch::Tensor choose_path(Compute c, Compute* taken, const char* what, const Bf16& bf16, const Fp32& fp32) {
  if (c != Compute::fp32 && (c == Compute::bf16 || bf16_products_available())) {
    if (std::optional<torch::Tensor> y = bf16()) {
      if (taken) *taken = Compute::bf16;
      return *y;
    }
    if (c == Compute::bf16)
      throw Error(std::string("compute = bf16: ") + what +
                  " operand holds values that are not bfloat16 values (a format with more than 7 mantissa bits, "
                  "or scaled values past bfloat16's range)");
  }
  if (taken) *taken = Compute::fp32;
  return fp32();
}

}  // namespace fp8lab::nn::detail
