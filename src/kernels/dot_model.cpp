// Matrix products under the dot-product model: each operand split once into m * 2^e
// (a's rows, b's columns laid out contiguously), then one model_dot per output.
#include "fp8lab/kernels/dot_model.hpp"

#include <algorithm>
#include <vector>

#include "fp8lab/core/dot_model_detail.hpp"

namespace fp8lab::kernels {

void model_matmul(const float* a, const float* b, float* out, const MatmulShape& shape, const DotModel& m,
                  const Runner& run) {
  validate(m);
  using dot_detail::Split;
  const std::size_t rows = shape.rows, inner = shape.inner, cols = shape.cols;
  std::vector<Split> sa(rows * inner), sb(cols * inner);
  for (std::size_t batch = 0; batch < shape.batch; ++batch) {
    const float* ab = a + batch * rows * inner;
    const float* bb = b + batch * inner * cols;
    float* ob = out + batch * rows * cols;
    for (std::size_t i = 0; i < rows * inner; ++i) sa[i] = dot_detail::split(ab[i]);
    for (std::size_t k = 0; k < inner; ++k)
      for (std::size_t j = 0; j < cols; ++j) sb[j * inner + k] = dot_detail::split(bb[k * cols + j]);
    std::vector<char> row_special(rows), col_special(cols);  // whether the scan for infinities and NaNs is needed
    for (std::size_t i = 0; i < rows; ++i) row_special[i] = dot_detail::any_special(sa.data() + i * inner, inner);
    for (std::size_t j = 0; j < cols; ++j) col_special[j] = dot_detail::any_special(sb.data() + j * inner, inner);
    // Split by products, not outputs: a few outputs of a long reduction are work enough for
    // every thread. Ranges start and end at whole outputs (multiples of inner).
    const std::size_t per = std::max<std::size_t>(inner, 1);
    run.parallel_for(rows * cols * per, per, [&](std::size_t begin, std::size_t end) {
      for (std::size_t o = begin / per; o < end / per; ++o) {
        const std::size_t i = o / cols, j = o % cols;
        ob[o] = dot_detail::model_dot(sa.data() + i * inner, sb.data() + j * inner, static_cast<std::int64_t>(inner), m,
                                      row_special[i] || col_special[j]);
      }
    });
  }
}

}  // namespace fp8lab::kernels
