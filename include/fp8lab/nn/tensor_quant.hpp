// Quantizing libtorch tensors with the bulk kernels (CPU, float32).
#pragma once

#include <torch/types.h>

#include "fp8lab/core/codec.hpp"
#include "fp8lab/core/format.hpp"

namespace fp8lab::nn {

// The work is split over libtorch's own threads (at::parallel_for), so that the kernels
// do not compete with libtorch's pool for the cores; results do not depend on the split.
//
// A new contiguous float32 tensor: every element fake-quantized with q (its seed replaced
// by `seed`; element i of the flattened tensor uses stream index i).
torch::Tensor fake_quantize(const torch::Tensor& t, const QuantSpec& q, std::uint64_t seed,
                            QuantCounts* counts = nullptr);
// fake_quantize in place: t (a contiguous float32 CPU tensor) is overwritten by Q(t).
void fake_quantize_(torch::Tensor& t, const QuantSpec& q, std::uint64_t seed,
                    QuantCounts* counts = nullptr);
// Codes of the same shape: uint8 for formats up to 8 bits, int16 (holding the uint16
// code bits) up to 16 bits.
torch::Tensor encode_tensor(const torch::Tensor& t, const QuantSpec& q, std::uint64_t seed,
                            QuantCounts* counts = nullptr);
torch::Tensor decode_tensor(const torch::Tensor& codes, const Format& f);
// fake_quantize and encode_tensor in one pass: {float32 Q(t), its codes}.
std::pair<torch::Tensor, torch::Tensor> quantize_and_encode_tensor(const torch::Tensor& t,
                                                                   const QuantSpec& q,
                                                                   std::uint64_t seed,
                                                                   QuantCounts* counts = nullptr);

}  // namespace fp8lab::nn
