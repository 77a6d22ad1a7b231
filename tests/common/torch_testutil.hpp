// Helpers for tests of libtorch code.
#pragma once

#include <torch/torch.h>

#include <cstring>

namespace fp8lab::test {

// Same shape and the same bytes (NaNs and signed zeros included).
inline bool bit_equal(const torch::Tensor& a, const torch::Tensor& b) {
  if (!a.defined() || !b.defined()) return a.defined() == b.defined();
  if (a.sizes() != b.sizes() || a.scalar_type() != b.scalar_type()) return false;
  const auto x = a.contiguous(), y = b.contiguous();
  return std::memcmp(x.data_ptr(), y.data_ptr(), x.numel() * x.element_size()) == 0;
}

}  // namespace fp8lab::test
