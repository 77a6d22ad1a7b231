#include "fp8lab/nn/tensor_quant.hpp"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

// Without OpenMP, at::parallel_for (an inline template) runs every pass on one thread:
// CMakeLists.txt compiles this file with -fopenmp.
#ifndef _OPENMP
#error "src/nn/tensor_quant.cpp must be compiled with OpenMP, or at::parallel_for is serial"
#endif

#include <mutex>

#include "fp8lab/kernels/kernels.hpp"

namespace fp8lab::nn {

namespace {
void check_float_cpu(const torch::Tensor& t, const char* what) {
  if (!t.device().is_cpu())
    throw Error(std::string(what) + ": fp8lab quantizes CPU tensors; got one on " + t.device().str());
  if (t.scalar_type() != torch::kFloat32)
    throw Error(std::string(what) + ": expected a float32 tensor, got " +
                std::string(c10::toString(t.scalar_type())));
}
torch::Tensor float_input(const torch::Tensor& t, const char* what) {
  check_float_cpu(t, what);
  return t.contiguous();
}
// Runs body(begin, end, counts*) over [0, n) on libtorch's threads, kernels serial inside.
template <class Body>
void torch_parallel(std::int64_t n, QuantCounts* counts, const Body& body) {
  constexpr std::int64_t kGrain = 1 << 15;
  std::mutex m;
  at::parallel_for(0, n, kGrain, [&](std::int64_t b, std::int64_t e) {
    kernels::SerialScope serial;
    QuantCounts local;
    body(static_cast<std::size_t>(b), static_cast<std::size_t>(e), counts ? &local : nullptr);
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
  torch_parallel(n, counts, [&](std::size_t b, std::size_t e, QuantCounts* c) {
    kernels::quantize(in + b, out + b, e - b, q, b, c);
  });
}

}  // namespace

torch::Tensor fake_quantize(const torch::Tensor& t, const QuantSpec& q_in, std::uint64_t seed,
                            QuantCounts* counts) {
  const torch::Tensor x = float_input(t, "fake_quantize");
  torch::Tensor y = torch::empty_like(x, torch::MemoryFormat::Contiguous);
  quantize_into(x.data_ptr<float>(), y.data_ptr<float>(), x.numel(), q_in, seed, counts);
  return y;
}

void fake_quantize_(torch::Tensor& t, const QuantSpec& q_in, std::uint64_t seed,
                    QuantCounts* counts) {
  check_float_cpu(t, "fake_quantize_");
  if (!t.is_contiguous()) throw Error("fake_quantize_: the tensor must be contiguous");
  float* p = t.data_ptr<float>();
  quantize_into(p, p, t.numel(), q_in, seed, counts);  // element-wise: in place is exact
}

torch::Tensor encode_tensor(const torch::Tensor& t, const QuantSpec& q_in, std::uint64_t seed,
                            QuantCounts* counts) {
  const torch::Tensor x = float_input(t, "encode_tensor");
  QuantSpec q = q_in;
  q.seed = seed;
  require_codable(q.format);
  const float* in = x.data_ptr<float>();
  if (q.format.width() <= 8) {
    torch::Tensor c = torch::empty(x.sizes(), torch::TensorOptions().dtype(torch::kUInt8));
    std::uint8_t* out = c.data_ptr<std::uint8_t>();
    torch_parallel(x.numel(), counts, [&](std::size_t b, std::size_t e, QuantCounts* cc) {
      kernels::encode(in + b, out + b, e - b, q, b, cc);
    });
    return c;
  }
  torch::Tensor c = torch::empty(x.sizes(), torch::TensorOptions().dtype(torch::kInt16));
  auto* out = reinterpret_cast<std::uint16_t*>(c.data_ptr<std::int16_t>());
  torch_parallel(x.numel(), counts, [&](std::size_t b, std::size_t e, QuantCounts* cc) {
    kernels::encode(in + b, out + b, e - b, q, b, cc);
  });
  return c;
}

torch::Tensor decode_tensor(const torch::Tensor& codes_in, const Format& f) {
  const torch::Tensor codes = codes_in.contiguous();
  torch::Tensor y = torch::empty(codes.sizes(), torch::TensorOptions().dtype(torch::kFloat32));
  float* out = y.data_ptr<float>();
  if (codes.scalar_type() == torch::kUInt8) {
    const std::uint8_t* in = codes.data_ptr<std::uint8_t>();
    torch_parallel(codes.numel(), nullptr, [&](std::size_t b, std::size_t e, QuantCounts*) {
      kernels::decode(in + b, out + b, e - b, f);
    });
  } else if (codes.scalar_type() == torch::kInt16) {
    const auto* in = reinterpret_cast<const std::uint16_t*>(codes.data_ptr<std::int16_t>());
    torch_parallel(codes.numel(), nullptr, [&](std::size_t b, std::size_t e, QuantCounts*) {
      kernels::decode(in + b, out + b, e - b, f);
    });
  } else
    throw Error("decode_tensor: codes must be uint8 or int16, got " +
                std::string(c10::toString(codes.scalar_type())));
  return y;
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
  const torch::Tensor x = float_input(t, "quantize_and_encode_tensor");
  QuantSpec q = q_in;
  q.seed = seed;
  torch::Tensor y = torch::empty_like(x, torch::MemoryFormat::Contiguous);
  torch::Tensor c = torch::empty(x.sizes(), torch::TensorOptions().dtype(torch::kUInt8));
  const float* in = x.data_ptr<float>();
  float* out = y.data_ptr<float>();
  std::uint8_t* codes = c.data_ptr<std::uint8_t>();
  torch_parallel(x.numel(), counts, [&](std::size_t b, std::size_t e, QuantCounts* cc) {
    kernels::quantize_and_encode(in + b, out + b, codes + b, e - b, q, b, cc);
  });
  return {y, c};
}

}  // namespace fp8lab::nn
