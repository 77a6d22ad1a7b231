#include "fp8lab/nn/compute.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include <ATen/ExpandUtils.h>
#include <c10/util/accumulate.h>

#include "fp8lab/core/format.hpp"
#include "fp8lab/kernels/dot_model.hpp"
#include "fp8lab/kernels/scaled.hpp"
#include "fp8lab/nn/tensor_quant.hpp"
#include "compute_detail.hpp"

namespace fp8lab::nn {

bool bf16_products_available() {
  static const bool available = detail::onednn().bf16_products() != 0;
  return available;
}

bool exact_in_bf16(const Format& f) {
  constexpr double bf16_max = 0x1.fep127;  // (2 - 2^-7) 2^127
  return f.man_bits <= 7 && f.min_positive() >= std::ldexp(1.0, -133) && f.max_finite() <= bf16_max;
}

namespace detail {

void require_bf16_products(const char* what) {
  if (!bf16_products_available())
    throw Error(std::string(what) + " on bfloat16: this CPU has no bfloat16 products (AMX-BF16 or AVX512-BF16)");
}

}  // namespace detail

namespace {

// a b on bfloat16 operands: [M, K] x [K, N], or with `batched` [B, M, K] x [B, K, N].
std::optional<torch::Tensor> product_bf16(const torch::Tensor& a, const torch::Tensor& b, bool batched) {
  detail::require_bf16_products("a matrix product");
  const std::int64_t dims = batched ? 3 : 2;
  TORCH_CHECK(a.dim() == dims && b.dim() == dims && a.size(-1) == b.size(-2) && (!batched || a.size(0) == b.size(0)),
              "bfloat16 product: [B,] M x K times [B,] K x N expected");
  TORCH_CHECK(detail::float_or_bf16(a) && detail::float_or_bf16(b),
              "bfloat16 product: float32 or bfloat16 operands expected");
  const std::int64_t batch = batched ? a.size(0) : 0, m = a.size(-2), k = a.size(-1), n = b.size(-1);
  const auto f32 = a.options().dtype(torch::kFloat);
  torch::Tensor c = batched ? torch::empty({batch, m, n}, f32) : torch::empty({m, n}, f32);
  if (c.numel() == 0) return c;
  if (k == 0) return c.zero_();
  // Each matrix row- or column-major, matrices back to back.
  const auto matrices = [](const torch::Tensor& t) {
    return t.is_contiguous() || t.transpose(-2, -1).is_contiguous() ? t : t.contiguous();
  };
  const auto form = [&](const torch::Tensor& t) {  // a bfloat16 operand is its own form
    const torch::Tensor m = matrices(t);
    return m.scalar_type() == torch::kBFloat16 ? std::optional<torch::Tensor>(m) : exact_bf16(m);
  };
  const auto ab = form(a);
  if (!ab) return std::nullopt;
  const auto bb = form(b);
  if (!bb) return std::nullopt;
  detail::check_onednn(detail::onednn().matmul(batch, m, k, n, ab->stride(-2), ab->stride(-1), bb->stride(-2),
                                               bb->stride(-1), ab->data_ptr(), bb->data_ptr(), c.data_ptr<float>()));
  return c;
}

}  // namespace

std::optional<torch::Tensor> matmul_bf16(const torch::Tensor& a, const torch::Tensor& b) {
  return product_bf16(a, b, false);
}

std::optional<torch::Tensor> bmm_bf16(const torch::Tensor& a, const torch::Tensor& b) {
  return product_bf16(a, b, true);
}

namespace {

// Chunked accumulation (docs/spec.md §7.3). The reduction dimension is cut into chunks,
// the chunks become a batch dimension (a [..., M, K] as [..., chunks, M, chunk], b
// [..., K, N] as [..., chunks, chunk, N]; zero terms fill the last chunk, which changes no
// sum), one batched product gives every chunk's sum, one pass rounds them all, and the
// rounded sums are added in chunk order. Chunks go in groups whose partial sums fit
// kPartialBudget values, so that small chunks of long reductions stay within memory.
constexpr std::int64_t kPartialBudget = std::int64_t{1} << 23;

// The operands cut into chunks of `chunk` reduction positions, as a batch dimension: a
// [..., M, K] as [..., chunks, M, chunk], b [..., K, N] as [..., chunks, chunk, N], zeros
// filling the last chunk (zero terms change no sum).
struct Chunked {
  torch::Tensor a, b;
  std::int64_t chunks = 0;
};
Chunked chunked_operands(const torch::Tensor& a, const torch::Tensor& b, std::int64_t chunk) {
  const std::int64_t k = a.size(-1);
  const std::int64_t chunks = (k + chunk - 1) / chunk, padded = chunks * chunk;
  const torch::Tensor ap = padded == k ? a : torch::constant_pad_nd(a, {0, padded - k});
  const torch::Tensor bp = padded == k ? b : torch::constant_pad_nd(b, {0, 0, 0, padded - k});
  std::vector<std::int64_t> a_shape(ap.sizes().begin(), ap.sizes().end() - 1);
  a_shape.insert(a_shape.end(), {chunks, chunk});
  std::vector<std::int64_t> b_shape(bp.sizes().begin(), bp.sizes().end() - 2);
  b_shape.insert(b_shape.end(), {chunks, chunk, bp.size(-1)});
  return {ap.view(a_shape).movedim(-2, -3), bp.view(b_shape), chunks};
}

// How many chunks go into one batched product: their partial sums within kPartialBudget.
std::int64_t chunks_per_group(const Chunked& c, std::int64_t n) {
  const std::int64_t per_chunk = std::max<std::int64_t>(1, c.a.numel() / c.a.size(-1) / c.chunks * n);
  return std::clamp<std::int64_t>(kPartialBudget / per_chunk, 1, c.chunks);
}

torch::Tensor chunked_matmul(const torch::Tensor& a, const torch::Tensor& b, Compute c, Compute* taken,
                             const Accumulation& acc) {
  QuantSpec round;
  round.format = acc.partial;
  round.rounding = Rounding::nearest_even;
  round.overflow = Overflow::saturate;
  const std::int64_t k = a.size(-1);
  if (k == 0) return matmul(a, b, c, taken);  // an empty sum: zeros
  const Chunked parts = chunked_operands(a, b, acc.chunk);
  const torch::Tensor& ac = parts.a;  // [..., chunks, M, chunk]
  const torch::Tensor& bc = parts.b;  // [..., chunks, chunk, N]
  const std::int64_t chunks = parts.chunks;
  const std::int64_t group = chunks_per_group(parts, b.size(-1));
  torch::Tensor sum;  // starts as the first chunk's rounded sum
  Compute path = Compute::bf16;  // bf16 only where every group took it
  for (std::int64_t at = 0; at < chunks; at += group) {
    const std::int64_t len = std::min(group, chunks - at);
    Compute group_path = Compute::fp32;
    const torch::Tensor parts =
        fake_quantize(matmul(ac.narrow(-3, at, len), bc.narrow(-3, at, len), c, &group_path), round, 0);
    if (group_path == Compute::fp32) path = Compute::fp32;
    for (std::int64_t i = 0; i < len; ++i)
      sum = sum.defined() ? sum.add_(parts.select(-3, i)) : parts.select(-3, i).clone();
  }
  if (taken) *taken = path;
  return sum;
}

// The batch shape of a product of [..., M, K] and [..., K, N] matrices: the operands' leading
// dimensions broadcast, and the shapes [batch..., r, c] within it.
struct BatchShape {
  std::vector<std::int64_t> batch;
  std::vector<std::int64_t> with(std::int64_t r, std::int64_t c) const {
    std::vector<std::int64_t> v = batch;
    v.insert(v.end(), {r, c});
    return v;
  }
  std::int64_t count() const { return c10::multiply_integers(batch); }
};

BatchShape broadcast_batch(const torch::Tensor& a, const torch::Tensor& b) {
  return {at::infer_size(a.sizes().slice(0, a.dim() - 2), b.sizes().slice(0, b.dim() - 2))};
}

// A product under a dot-product hardware model (docs/spec.md §7.4): the operands as float32
// (broadcast batches expanded, vectors as one-row or one-column matrices), one model_dot
// per output on the kernels' integer path. The compute setting does not apply: the model
// is the arithmetic, reported as the float32 path.
torch::Tensor modelled_matmul(const torch::Tensor& a_in, const torch::Tensor& b_in, const DotModel& model,
                              Compute* taken) {
  const torch::Tensor a = a_in.dim() == 1 ? a_in.unsqueeze(0) : a_in;
  const torch::Tensor b = b_in.dim() == 1 ? b_in.unsqueeze(1) : b_in;
  TORCH_CHECK(a.size(-1) == b.size(-2), "a product's inner dimensions differ: ", a.sizes(), " and ", b.sizes());
  const std::int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  const BatchShape shape = broadcast_batch(a, b);
  const torch::Tensor ac = detail::widened(a).expand(shape.with(m, k)).contiguous();
  const torch::Tensor bc = detail::widened(b).expand(shape.with(k, n)).contiguous();
  torch::Tensor out = torch::empty(shape.with(m, n), ac.options());
  kernels::model_matmul(ac.data_ptr<float>(), bc.data_ptr<float>(), out.data_ptr<float>(),
                        {static_cast<std::size_t>(shape.count()), static_cast<std::size_t>(m),
                         static_cast<std::size_t>(k), static_cast<std::size_t>(n)},
                        model);
  if (taken) *taken = Compute::fp32;
  if (a_in.dim() == 1) out = out.squeeze(-2);
  if (b_in.dim() == 1) out = out.squeeze(-1);
  return out;
}

// One operand's scale of each chunk, [batch, chunks, rows] contiguous: chunk j starts at
// position j * chunk, in group j * chunk / group.
torch::Tensor chunk_scales(const ReductionScales& s, at::IntArrayRef batch, std::int64_t rows, std::int64_t chunks,
                           std::int64_t chunk) {
  std::vector<std::int64_t> shape(batch.begin(), batch.end());
  shape.insert(shape.end(), {rows, chunks});
  if (!s.defined()) return torch::ones({c10::multiply_integers(batch), chunks, rows});
  std::vector<std::int64_t> groups(static_cast<std::size_t>(chunks));
  for (std::int64_t j = 0; j < chunks; ++j) groups[static_cast<std::size_t>(j)] = j * chunk / s.group;
  const torch::Tensor index = torch::tensor(groups, torch::kLong);
  return s.s.index_select(-1, index).expand(shape).reshape({-1, rows, chunks}).transpose(1, 2).contiguous();
}

}  // namespace

torch::Tensor matmul_scaled(const torch::Tensor& a_in, const ReductionScales& sa, const torch::Tensor& b_in,
                            const ReductionScales& sb, Compute c, Compute* taken, const Accumulation& acc) {
  TORCH_CHECK(a_in.dim() >= 2 && b_in.dim() >= 2 && a_in.size(-1) == b_in.size(-2),
              "scaled product: [..., M, K] times [..., K, N] expected");
  const std::int64_t m = a_in.size(-2), k = a_in.size(-1), n = b_in.size(-1);
  const BatchShape shape = broadcast_batch(a_in, b_in);
  const torch::Tensor a = a_in.expand(shape.with(m, k)), b = b_in.expand(shape.with(k, n));
  if (k == 0 || m == 0 || n == 0) return matmul(a, b, c, taken, acc);  // an empty sum: zeros
  const auto span = [k](const ReductionScales& s) { return s.defined() ? std::min(s.group, k) : k; };
  TORCH_CHECK((!sa.defined() || sa.group > 0) && (!sb.defined() || sb.group > 0), "scaled product: group of 0");
  const std::int64_t chunk = std::gcd(span(sa), span(sb));
  const Chunked parts = chunked_operands(a, b, chunk);
  const torch::Tensor ra = chunk_scales(sa, shape.batch, m, parts.chunks, chunk);
  const torch::Tensor rb = chunk_scales(sb, shape.batch, n, parts.chunks, chunk);
  const std::int64_t batches = shape.count();
  torch::Tensor out = torch::empty(shape.with(m, n), a.options().dtype(torch::kFloat));
  const std::int64_t group = chunks_per_group(parts, n);
  Compute path = Compute::bf16;  // bf16 only where every group took it
  for (std::int64_t at = 0; at < parts.chunks; at += group) {
    const std::int64_t len = std::min(group, parts.chunks - at);
    Compute group_path = Compute::fp32;
    const torch::Tensor p =
        matmul(parts.a.narrow(-3, at, len), parts.b.narrow(-3, at, len), c, &group_path, acc).contiguous();
    if (group_path == Compute::fp32) path = Compute::fp32;
    const torch::Tensor ga = ra.narrow(1, at, len).contiguous(), gb = rb.narrow(1, at, len).contiguous();
    kernels::scaled_chunk_sum(p.data_ptr<float>(), ga.data_ptr<float>(), gb.data_ptr<float>(), out.data_ptr<float>(),
                              {static_cast<std::size_t>(batches), static_cast<std::size_t>(len),
                               static_cast<std::size_t>(m), static_cast<std::size_t>(n)},
                              at == 0);
  }
  if (taken) *taken = path;
  return out;
}

torch::Tensor matmul(const torch::Tensor& a, const torch::Tensor& b, Compute c, Compute* taken,
                     const Accumulation& acc) {
  if (acc.model) return modelled_matmul(a, b, *acc.model, taken);
  if (acc.chunked()) return chunked_matmul(a, b, c, taken, acc);
  // Batched products whose leading dimensions agree run as one batch of matrices; others
  // (broadcast batches, vectors) take float32.
  const bool plain = a.dim() == 2 && b.dim() == 2;
  const bool batched = a.dim() >= 3 && a.dim() == b.dim() && a.sizes().slice(0, a.dim() - 2) == b.sizes().slice(0, b.dim() - 2);
  if (c == Compute::bf16 && !plain && !batched)
    throw Error("compute = bf16: a product of broadcast batches or vectors (it runs in float32 only)");
  using detail::widened;
  if (!plain && !batched) {
    if (taken) *taken = Compute::fp32;
    return torch::matmul(widened(a), widened(b));
  }
  return detail::choose_path(
      c, taken, "a matrix product",
      [&]() -> std::optional<torch::Tensor> {
        if (plain) return matmul_bf16(a, b);
        const std::int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
        std::optional<torch::Tensor> y = bmm_bf16(a.reshape({-1, m, k}), b.reshape({-1, k, n}));
        if (!y) return y;
        std::vector<std::int64_t> shape(a.sizes().begin(), a.sizes().end());
        shape.back() = n;
        return y->reshape(shape);
      },
      [&] { return torch::matmul(widened(a), widened(b)); });
}

}  // namespace fp8lab::nn
