// The scaled sum of a product's chunks (kernels::scaled_chunk_sum, docs/spec.md §6.8): per
// Highway target, chosen at run time. Each output is one fused multiply-add per chunk, so the
// result is the same bits on every target that has a fused multiply-add; targets without one
// take std::fma, which rounds once too.

#include <algorithm>
#include <cmath>
#include <cstddef>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/kernels/scaled_sum.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

#include "fp8lab/kernels/scaled.hpp"

HWY_BEFORE_NAMESPACE();
namespace fp8lab::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// One output row: c = s * p (first) or fma(s, p, c) with s = fl32(a * b[n]).
void ScaledRow(float a, const float* HWY_RESTRICT b, const float* HWY_RESTRICT p, float* HWY_RESTRICT c,
               std::size_t n, bool first) {
  std::size_t i = 0;
#if HWY_NATIVE_FMA
  const hn::ScalableTag<float> d;
  const std::size_t lanes = hn::Lanes(d);
  const auto va = hn::Set(d, a);
  if (first) {
    for (; i + lanes <= n; i += lanes)
      hn::StoreU(hn::Mul(hn::Mul(va, hn::LoadU(d, b + i)), hn::LoadU(d, p + i)), d, c + i);
  } else {
    for (; i + lanes <= n; i += lanes)
      hn::StoreU(hn::MulAdd(hn::Mul(va, hn::LoadU(d, b + i)), hn::LoadU(d, p + i), hn::LoadU(d, c + i)), d, c + i);
  }
#endif
  for (; i < n; ++i) {
    const float s = a * b[i];
    c[i] = first ? s * p[i] : std::fma(s, p[i], c[i]);
  }
}

}  // namespace fp8lab::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace fp8lab::kernels {

HWY_EXPORT(ScaledRow);

void scaled_chunk_sum(const float* parts, const float* row_scales, const float* col_scales, float* out,
                      const ChunkSumShape& shape, bool first, const Runner& run) {
  const std::size_t rows = shape.batch * shape.rows;
  if (rows == 0 || shape.cols == 0) return;
  const std::size_t align = std::max<std::size_t>(1, 4096 / std::max<std::size_t>(1, shape.cols * shape.chunks));
  run.parallel_for(rows, align, [&](std::size_t begin, std::size_t end) {
    for (std::size_t r = begin; r < end; ++r) {
      const std::size_t b = r / shape.rows, m = r % shape.rows;
      float* c = out + r * shape.cols;
      for (std::size_t j = 0; j < shape.chunks; ++j) {
        const std::size_t bj = b * shape.chunks + j;
        HWY_DYNAMIC_DISPATCH(ScaledRow)(row_scales[bj * shape.rows + m], col_scales + bj * shape.cols,
                                        parts + (bj * shape.rows + m) * shape.cols, c, shape.cols, first && j == 0);
      }
    }
  });
}

}  // namespace fp8lab::kernels
#endif
