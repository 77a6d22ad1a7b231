// Matrix products under the dot-product hardware model (docs/spec.md §7.4): every output is
// model_dot of its row and column, the same bits for any runner.
#pragma once

#include <cstddef>

#include "fp8lab/core/dot_model.hpp"
#include "fp8lab/kernels/threads.hpp"

namespace fp8lab::kernels {

struct MatmulShape {
  std::size_t batch = 1, rows = 0, inner = 0, cols = 0;
};
// out[b] = a[b] (rows x inner) times b[b] (inner x cols), all row-major and contiguous, each
// output model_dot(row of a, column of b, m) over the inner dimension in order.
void model_matmul(const float* a, const float* b, float* out, const MatmulShape& shape, const DotModel& m,
                  const Runner& run = {});

}  // namespace fp8lab::kernels
