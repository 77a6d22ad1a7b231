#include "fp8lab/nn/tensor_quant.hpp"
#include "fp8lab/settings/recipe.hpp"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

// Without OpenMP, at::parallel_for (an inline template) runs every pass on one thread:
// CMakeLists.txt compiles this file with -fopenmp.
#ifndef _OPENMP
#error "src/nn/tensor_quant.cpp must be compiled with OpenMP, or at::parallel_for is serial"
#endif

#include <atomic>
#include <mutex>

#include "fp8lab/core/random.hpp"
#include "fp8lab/kernels/kernels.hpp"
#include "fp8lab/kernels/scaled.hpp"

namespace fp8lab::nn {

namespace {
void check_float_cpu(const torch::Tensor& t, const char* what) {
  if (!t.device().is_cpu())
    throw Error(std::string(what) + ": fp8lab quantizes CPU tensors; got one on " + t.device().str());
  if (t.scalar_type() != torch::kFloat32)
    throw Error(std::string(what) + ": expected a float32 tensor, got " +
                std::string(c10::toString(t.scalar_type())));
}
// Whether an element-wise pass may run over t's memory in the order it lies (a dense
// layout such as channels-last) instead of the row-major order: where no element's result
// depends on its index, i.e. every rounding but stochastic's, whose random stream is
// indexed by the row-major position.
bool in_memory_order(const torch::Tensor& t, const QuantSpec& q) {
  return q.rounding != Rounding::stochastic && t.is_non_overlapping_and_dense();
}
// The input of an element-wise pass under q: t as it lies where in_memory_order allows,
// contiguous otherwise. Outputs are made like it (empty_like keeps a dense layout).
torch::Tensor elementwise_input(const torch::Tensor& t, const QuantSpec& q, const char* what) {
  check_float_cpu(t, what);
  return in_memory_order(t, q) ? t : t.contiguous();
}
// Runs body(begin, end, counts*, serial) over [0, n) on libtorch's threads, with the runner
// the kernels called inside take (each part on its own thread).
template <class Body>
void torch_parallel(std::int64_t n, QuantCounts* counts, const Body& body) {
  constexpr std::int64_t kGrain = 1 << 15;
  std::mutex m;
  const kernels::Runner serial = kernels::Runner::serial();
  at::parallel_for(0, n, kGrain, [&](std::int64_t b, std::int64_t e) {
    QuantCounts local;
    body(static_cast<std::size_t>(b), static_cast<std::size_t>(e), counts ? &local : nullptr, serial);
    if (counts) {
      std::lock_guard<std::mutex> lk(m);
      *counts += local;
    }
  });
}

// out[i] = Q(in[i]) over n elements (out may be in).
void quantize_into(const float* in, float* out, std::int64_t n, const QuantSpec& q_in,
                   std::uint64_t seed, QuantCounts* counts) {
  QuantSpec q = q_in;
  q.seed = seed;
  torch_parallel(n, counts, [&](std::size_t b, std::size_t e, QuantCounts* c, const kernels::Runner& serial) {
    kernels::quantize(in + b, out + b, e - b, q, b, c, serial);
  });
}

}  // namespace

torch::Tensor fake_quantize(const torch::Tensor& t, const QuantSpec& q_in, std::uint64_t seed,
                            QuantCounts* counts) {
  const torch::Tensor x = elementwise_input(t, q_in, "fake_quantize");
  torch::Tensor y = torch::empty_like(x, torch::MemoryFormat::Preserve);
  quantize_into(x.data_ptr<float>(), y.data_ptr<float>(), x.numel(), q_in, seed, counts);
  return y;
}

void fake_quantize_(torch::Tensor& t, const QuantSpec& q_in, std::uint64_t seed,
                    QuantCounts* counts) {
  check_float_cpu(t, "fake_quantize_");
  if (!t.is_contiguous() && !in_memory_order(t, q_in))
    throw Error("fake_quantize_: the tensor must be contiguous (or dense, without stochastic rounding)");
  float* p = t.data_ptr<float>();
  quantize_into(p, p, t.numel(), q_in, seed, counts);  // element-wise: in place is exact
}

torch::Tensor encode_tensor(const torch::Tensor& t, const QuantSpec& q_in, std::uint64_t seed,
                            QuantCounts* counts) {
  const torch::Tensor x = elementwise_input(t, q_in, "encode_tensor");
  QuantSpec q = q_in;
  q.seed = seed;
  require_codable(q.format);
  const float* in = x.data_ptr<float>();
  if (q.format.width() <= 8) {
    torch::Tensor c = torch::empty_like(x, torch::kUInt8);
    std::uint8_t* out = c.data_ptr<std::uint8_t>();
    torch_parallel(x.numel(), counts, [&](std::size_t b, std::size_t e, QuantCounts* cc, const kernels::Runner& serial) {
      kernels::encode(in + b, out + b, e - b, q, b, cc, serial);
    });
    return c;
  }
  torch::Tensor c = torch::empty_like(x, torch::kInt16);
  auto* out = reinterpret_cast<std::uint16_t*>(c.data_ptr<std::int16_t>());
  torch_parallel(x.numel(), counts, [&](std::size_t b, std::size_t e, QuantCounts* cc, const kernels::Runner& serial) {
    kernels::encode(in + b, out + b, e - b, q, b, cc, serial);
  });
  return c;
}

torch::Tensor decode_tensor(const torch::Tensor& codes_in, const Format& f) {
  // Decoding is element-wise and index-free: codes are read as they lie where dense.
  const torch::Tensor codes = codes_in.is_non_overlapping_and_dense() ? codes_in : codes_in.contiguous();
  torch::Tensor y = torch::empty_like(codes, torch::kFloat32);
  float* out = y.data_ptr<float>();
  if (codes.scalar_type() == torch::kUInt8) {
    const std::uint8_t* in = codes.data_ptr<std::uint8_t>();
    torch_parallel(codes.numel(), nullptr, [&](std::size_t b, std::size_t e, QuantCounts*, const kernels::Runner& serial) {
      kernels::decode(in + b, out + b, e - b, f, serial);
    });
  } else if (codes.scalar_type() == torch::kInt16) {
    const auto* in = reinterpret_cast<const std::uint16_t*>(codes.data_ptr<std::int16_t>());
    torch_parallel(codes.numel(), nullptr, [&](std::size_t b, std::size_t e, QuantCounts*, const kernels::Runner& serial) {
      kernels::decode(in + b, out + b, e - b, f, serial);
    });
  } else
    throw Error("decode_tensor: codes must be uint8 or int16, got " +
                std::string(c10::toString(codes.scalar_type())));
  return y;
}

std::optional<BfQuantized> quantize_bf16_tensor(const torch::Tensor& t, const QuantSpec& q_in, std::uint64_t seed,
                                                bool with_codes, QuantCounts* counts) {
  const torch::Tensor x = elementwise_input(t, q_in, "quantize_bf16_tensor");
  QuantSpec q = q_in;
  q.seed = seed;
  if (with_codes && q.format.width() > 8)
    throw Error("quantize_bf16_tensor: codes of " + to_string(q.format) + " do not fit 8 bits");
  BfQuantized r;
  r.values = torch::empty_like(x, torch::kBFloat16);
  if (with_codes) r.codes = torch::empty_like(x, torch::kUInt8);
  const float* in = x.data_ptr<float>();
  auto* out = reinterpret_cast<std::uint16_t*>(r.values.data_ptr());
  std::uint8_t* codes = with_codes ? r.codes.data_ptr<std::uint8_t>() : nullptr;
  std::atomic<bool> exact{true};
  torch_parallel(x.numel(), counts, [&](std::size_t b, std::size_t e, QuantCounts* c, const kernels::Runner& serial) {
    if (!kernels::quantize_bf16(in + b, out + b, codes ? codes + b : nullptr, e - b, q, b, c, serial)) exact.store(false);
  });
  if (!exact.load()) return std::nullopt;
  return r;
}

std::optional<torch::Tensor> decode_tensor_bf16(const torch::Tensor& codes_in, const Format& f) {
  if (codes_in.scalar_type() != torch::kUInt8)
    throw Error("decode_tensor_bf16: codes must be uint8, got " + std::string(c10::toString(codes_in.scalar_type())));
  const torch::Tensor codes = codes_in.is_non_overlapping_and_dense() ? codes_in : codes_in.contiguous();
  torch::Tensor y = torch::empty_like(codes, torch::kBFloat16);
  const std::uint8_t* in = codes.data_ptr<std::uint8_t>();
  auto* out = reinterpret_cast<std::uint16_t*>(y.data_ptr());
  std::atomic<bool> exact{true};
  torch_parallel(codes.numel(), nullptr, [&](std::size_t b, std::size_t e, QuantCounts*, const kernels::Runner& serial) {
    if (!kernels::decode_bf16(in + b, out + b, e - b, f, serial)) exact.store(false);  // the same answer in every range
  });
  if (!exact.load()) return std::nullopt;
  return y;
}

std::optional<torch::Tensor> exact_bf16(const torch::Tensor& t) {
  check_float_cpu(t, "exact_bf16");
  const torch::Tensor src = t.is_non_overlapping_and_dense() ? t : t.contiguous();
  torch::Tensor out = torch::empty_strided(src.sizes(), src.strides(), src.options().dtype(torch::kBFloat16));
  const float* in = src.data_ptr<float>();
  auto* bits = reinterpret_cast<std::uint16_t*>(out.data_ptr());
  std::atomic<bool> exact{true};
  torch_parallel(src.numel(), nullptr, [&](std::size_t b, std::size_t e, QuantCounts*, const kernels::Runner& serial) {
    if (!kernels::to_bf16_exact(in + b, bits + b, e - b, serial)) exact.store(false, std::memory_order_relaxed);
  });
  if (!exact.load()) return std::nullopt;
  return out;
}

}  // namespace fp8lab::nn

namespace fp8lab::nn {

std::pair<torch::Tensor, torch::Tensor> quantize_and_encode_tensor(const torch::Tensor& t,
                                                                   const QuantSpec& q_in,
                                                                   std::uint64_t seed,
                                                                   QuantCounts* counts) {
  if (q_in.format.width() > 8) {
    torch::Tensor codes = encode_tensor(t, q_in, seed, counts);
    return {decode_tensor(codes, q_in.format), codes};
  }
  const torch::Tensor x = elementwise_input(t, q_in, "quantize_and_encode_tensor");
  QuantSpec q = q_in;
  q.seed = seed;
  torch::Tensor y = torch::empty_like(x, torch::MemoryFormat::Preserve);
  torch::Tensor c = torch::empty_like(x, torch::kUInt8);
  const float* in = x.data_ptr<float>();
  float* out = y.data_ptr<float>();
  std::uint8_t* codes = c.data_ptr<std::uint8_t>();
  torch_parallel(x.numel(), counts, [&](std::size_t b, std::size_t e, QuantCounts* cc, const kernels::Runner& serial) {
    kernels::quantize_and_encode(in + b, out + b, codes + b, e - b, q, b, cc, serial);
  });
  return {y, c};
}

namespace {
// The kernels' parallel work on libtorch's threads (whose OpenMP workers would otherwise
// spin on the cores the kernels' own pool needs).
kernels::Runner on_torch_threads() {
  return kernels::Runner::external(at::get_num_threads(), [](std::size_t parts, const std::function<void(std::size_t)>& part) {
    at::parallel_for(0, static_cast<std::int64_t>(parts), 1, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t i = b; i < e; ++i) part(static_cast<std::size_t>(i));
    });
  });
}

std::vector<std::int64_t> inverse(const std::vector<std::int64_t>& perm) {
  std::vector<std::int64_t> inv(perm.size());
  for (std::size_t i = 0; i < perm.size(); ++i) inv[static_cast<std::size_t>(perm[i])] = static_cast<std::int64_t>(i);
  return inv;
}
}  // namespace

torch::Tensor matrix_of(const torch::Tensor& t, const MatrixView& v) {
  torch::Tensor x = v.view.empty() ? t : t.reshape(v.view);
  if (!v.perm.empty()) x = x.permute(v.perm);
  std::int64_t cols = 1;
  for (int d = 0; d < v.cols_dims; ++d) cols *= x.size(x.dim() - 1 - d);
  const std::int64_t rows = cols == 0 ? 0 : x.numel() / cols;
  x = x.reshape({rows, cols});
  return is_transposed_matrix(x) ? x : x.contiguous();
}

torch::Tensor to_matrix(const torch::Tensor& t, const MatrixView& v) { return matrix_of(t, v).contiguous(); }

torch::Tensor matrix_as(const torch::Tensor& m, at::IntArrayRef shape, const MatrixView& v) {
  std::vector<std::int64_t> viewed = v.view.empty() ? shape.vec() : v.view;
  std::vector<std::int64_t> permuted = viewed;
  for (std::size_t i = 0; i < v.perm.size(); ++i) permuted[i] = viewed[static_cast<std::size_t>(v.perm[i])];
  torch::Tensor x = m.reshape(permuted);
  if (!v.perm.empty()) x = x.permute(inverse(v.perm));
  return x.reshape(shape);
}

torch::Tensor from_matrix(const torch::Tensor& m, at::IntArrayRef shape, const MatrixView& v) {
  return matrix_as(m, shape, v).contiguous();
}

bool is_transposed_matrix(const torch::Tensor& m) {
  return m.dim() == 2 && m.size(0) > 1 && m.size(1) > 1 && m.stride(0) == 1 && m.stride(1) == m.size(0);
}

namespace {
// The outputs of one scaled quantization of a matrix [rows, cols] (ScaledTensor) and the
// ScaledOut that points at them; finish() hands them over. Pinned in place: out points into it.
class MatrixOutputs {
 public:
  MatrixOutputs(std::int64_t rows, std::int64_t cols, const ScaledSpec& s, ScaledForms forms, bool transposed)
      : forms_(forms), bf16_as_input_(forms.bf16 && forms.bf16_as_given && transposed) {
    if (forms.values) q_.values = torch::empty({rows, cols}, torch::kFloat32);
    if (forms.codes) q_.codes = torch::empty({rows, cols}, torch::kUInt8);
    q_.scales = torch::empty(
        {static_cast<std::int64_t>(block_layout(s, static_cast<std::size_t>(rows), static_cast<std::size_t>(cols)).groups())},
        torch::kInt32);
    q_.transposed = transposed;
    if (forms.bf16)
      q_.bf16 = bf16_as_input_ ? torch::empty({cols, rows}, torch::kBFloat16).t() : torch::empty({rows, cols}, torch::kBFloat16);
    q_.without_tensor_scale = forms.without_tensor_scale && s.tensor_scale;
    out_ = ScaledOut{forms.values ? q_.values.data_ptr<float>() : nullptr,
                     forms.codes ? q_.codes.data_ptr<std::uint8_t>() : nullptr,
                     reinterpret_cast<std::uint32_t*>(q_.scales.data_ptr<std::int32_t>()), &q_.tensor_scale,
                     forms.bf16 ? reinterpret_cast<std::uint16_t*>(q_.bf16.data_ptr()) : nullptr,
                     forms.bf16 ? &exact_ : nullptr, forms.without_tensor_scale};
  }
  MatrixOutputs(const MatrixOutputs&) = delete;
  MatrixOutputs& operator=(const MatrixOutputs&) = delete;

  const ScaledOut& out() const { return out_; }
  // Where the bfloat16 form goes for a matrix read from its transpose.
  kernels::Bf16Layout bf16_layout() const { return bf16_as_input_ ? kernels::Bf16Layout::input : kernels::Bf16Layout::matrix; }
  // The outputs, with the tensor's amax; a bfloat16 form with some inexact value is dropped.
  ScaledTensor finish(float amax) {
    q_.amax = amax;
    if (forms_.bf16 && !exact_) q_.bf16 = torch::Tensor();
    return std::move(q_);
  }

 private:
  ScaledForms forms_;
  bool bf16_as_input_;
  bool exact_ = false;
  ScaledTensor q_;
  ScaledOut out_;
};

ScaledSpec with_seed(ScaledSpec s, std::uint64_t seed) {
  s.element.seed = seed;
  return s;
}
}  // namespace

ScaledTensor scaled_quantize_matrix(const torch::Tensor& m_in, const ScaledSpec& s_in, std::uint64_t seed,
                                    const ScaledCall& call, ScaledForms forms, ScaledCounts* counts) {
  check_float_cpu(m_in, "scaled_quantize_matrix");
  if (m_in.dim() != 2) throw Error("scaled_quantize_matrix: expected a matrix");
  const bool transposed = is_transposed_matrix(m_in);  // read as it lies, no transposed copy
  const torch::Tensor m = transposed ? m_in : m_in.contiguous();
  const ScaledSpec s = with_seed(s_in, seed);
  const auto rows = static_cast<std::size_t>(m.size(0)), cols = static_cast<std::size_t>(m.size(1));
  MatrixOutputs o(m.size(0), m.size(1), s, forms, transposed);
  const float amax = transposed ? kernels::scaled_quantize_transposed(m.data_ptr<float>(), rows, cols, s, o.out(), call,
                                                                      counts, on_torch_threads(), o.bf16_layout())
                                : kernels::scaled_quantize(m.data_ptr<float>(), rows, cols, s, o.out(), call, counts,
                                                           on_torch_threads());
  return o.finish(amax);
}

bool is_transpose_of(const torch::Tensor& t, const torch::Tensor& m) {
  return m.dim() == 2 && m.is_contiguous() && is_transposed_matrix(t) && t.data_ptr() == m.data_ptr() &&
         t.size(0) == m.size(1) && t.size(1) == m.size(0);
}

std::pair<ScaledTensor, ScaledTensor> scaled_quantize_matrix_both(const torch::Tensor& m, const ScaledSpec& s_in,
                                                                  const ScaledForm& rows_form,
                                                                  const ScaledForm& cols_form) {
  check_float_cpu(m, "scaled_quantize_matrix_both");
  if (!is_transpose_of(m.t(), m)) throw Error("scaled_quantize_matrix_both: expected a contiguous matrix");
  const ScaledSpec s = with_seed(s_in, rows_form.seed), t_s = with_seed(s_in, cols_form.seed);
  const auto rows = static_cast<std::size_t>(m.size(0)), cols = static_cast<std::size_t>(m.size(1));
  MatrixOutputs o(m.size(0), m.size(1), s, rows_form.forms, false);
  MatrixOutputs t(m.size(1), m.size(0), t_s, cols_form.forms, true);
  const auto [amax, t_amax] = kernels::scaled_quantize_both(m.data_ptr<float>(), rows, cols, s, o.out(), rows_form.call,
                                                            rows_form.counts, t_s, t.out(), cols_form.call,
                                                            cols_form.counts, on_torch_threads(), t.bf16_layout());
  return {o.finish(amax), t.finish(t_amax)};
}

torch::Tensor scaled_decode_matrix(const ScaledTensor& q, const ScaledSpec& s) {
  torch::Tensor y = torch::empty(q.codes.sizes(), torch::kFloat32);
  kernels::scaled_decode(q.codes.data_ptr<std::uint8_t>(),
                         reinterpret_cast<const std::uint32_t*>(q.scales.data_ptr<std::int32_t>()), q.value_tensor_scale(),
                         static_cast<std::size_t>(q.codes.size(0)), static_cast<std::size_t>(q.codes.size(1)), s,
                         y.data_ptr<float>(), on_torch_threads());
  return y;
}

std::optional<torch::Tensor> scaled_decode_matrix_bf16(const ScaledTensor& q, const ScaledSpec& s) {
  const auto rows = static_cast<std::size_t>(q.codes.size(0)), cols = static_cast<std::size_t>(q.codes.size(1));
  const auto* scales = reinterpret_cast<const std::uint32_t*>(q.scales.data_ptr<std::int32_t>());
  const std::uint8_t* codes = q.codes.data_ptr<std::uint8_t>();
  if (q.transposed) {  // written [cols, rows], returned as its transpose
    torch::Tensor yt = torch::empty({q.codes.size(1), q.codes.size(0)}, torch::kBFloat16);
    if (!kernels::scaled_decode_bf16_transposed(codes, scales, q.value_tensor_scale(), rows, cols, s,
                                                reinterpret_cast<std::uint16_t*>(yt.data_ptr()), on_torch_threads()))
      return std::nullopt;
    return yt.t();
  }
  torch::Tensor y = torch::empty(q.codes.sizes(), torch::kBFloat16);
  if (!kernels::scaled_decode_bf16(codes, scales, q.value_tensor_scale(), rows, cols, s,
                                   reinterpret_cast<std::uint16_t*>(y.data_ptr()), on_torch_threads()))
    return std::nullopt;
  return y;
}

void hadamard_(torch::Tensor& m, std::span<const float> signs) {
  check_float_cpu(m, "hadamard_");
  if (m.dim() != 2 || !m.is_contiguous()) throw Error("hadamard_: expected a contiguous matrix");
  const auto n = static_cast<std::int64_t>(signs.size());
  if (!is_hadamard_size(static_cast<int>(n)))
    throw Error("hadamard_: the transform's size must be 16, 32, 64 or 128, got " + std::to_string(n));
  const auto norm = static_cast<float>(1.0 / std::sqrt(static_cast<double>(n)));
  const std::int64_t rows = m.size(0), cols = m.size(1);
  float* p = m.data_ptr<float>();
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c0 = 0; c0 + n <= cols; c0 += n) {
      float* x = p + r * cols + c0;
      for (std::int64_t i = 0; i < n; ++i) x[i] *= signs[static_cast<std::size_t>(i)];
      for (std::int64_t h = 1; h < n; h *= 2)
        for (std::int64_t i = 0; i < n; i += 2 * h)
          for (std::int64_t j = i; j < i + h; ++j) {
            const float a = x[j], b = x[j + h];
            x[j] = a + b;
            x[j + h] = a - b;
          }
      for (std::int64_t i = 0; i < n; ++i) x[i] *= norm;
    }
}

std::vector<float> hadamard_signs(std::uint64_t seed, int n) {
  std::vector<float> s(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i)
    s[static_cast<std::size_t>(i)] = (mix64(seed + static_cast<std::uint64_t>(i / 64)) >> (i % 64)) & 1 ? -1.0f : 1.0f;
  return s;
}

}  // namespace fp8lab::nn
