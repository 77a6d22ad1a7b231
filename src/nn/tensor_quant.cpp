#include "fp8lab/nn/tensor_quant.hpp"

#include <torch/torch.h>

#include "fp8lab/kernels/kernels.hpp"

namespace fp8lab::nn {

namespace {
torch::Tensor float_input(const torch::Tensor& t, const char* what) {
  if (!t.device().is_cpu())
    throw Error(std::string(what) + ": fp8lab quantizes CPU tensors; got one on " + t.device().str());
  if (t.scalar_type() != torch::kFloat32)
    throw Error(std::string(what) + ": expected a float32 tensor, got " +
                std::string(c10::toString(t.scalar_type())));
  return t.contiguous();
}
}  // namespace

torch::Tensor fake_quantize(const torch::Tensor& t, const QuantSpec& q_in, std::uint64_t seed,
                            QuantCounts* counts) {
  const torch::Tensor x = float_input(t, "fake_quantize");
  QuantSpec q = q_in;
  q.seed = seed;
  torch::Tensor y = torch::empty_like(x, torch::MemoryFormat::Contiguous);
  kernels::quantize(x.data_ptr<float>(), y.data_ptr<float>(), static_cast<std::size_t>(x.numel()),
                    q, 0, counts);
  return y;
}

torch::Tensor encode_tensor(const torch::Tensor& t, const QuantSpec& q_in, std::uint64_t seed,
                            QuantCounts* counts) {
  const torch::Tensor x = float_input(t, "encode_tensor");
  QuantSpec q = q_in;
  q.seed = seed;
  require_codable(q.format);
  const auto n = static_cast<std::size_t>(x.numel());
  if (q.format.width() <= 8) {
    torch::Tensor c = torch::empty(x.sizes(), torch::TensorOptions().dtype(torch::kUInt8));
    kernels::encode(x.data_ptr<float>(), c.data_ptr<std::uint8_t>(), n, q, 0, counts);
    return c;
  }
  torch::Tensor c = torch::empty(x.sizes(), torch::TensorOptions().dtype(torch::kInt16));
  kernels::encode(x.data_ptr<float>(), reinterpret_cast<std::uint16_t*>(c.data_ptr<std::int16_t>()),
                  n, q, 0, counts);
  return c;
}

torch::Tensor decode_tensor(const torch::Tensor& codes_in, const Format& f) {
  const torch::Tensor codes = codes_in.contiguous();
  torch::Tensor y = torch::empty(codes.sizes(), torch::TensorOptions().dtype(torch::kFloat32));
  const auto n = static_cast<std::size_t>(codes.numel());
  if (codes.scalar_type() == torch::kUInt8)
    kernels::decode(codes.data_ptr<std::uint8_t>(), y.data_ptr<float>(), n, f);
  else if (codes.scalar_type() == torch::kInt16)
    kernels::decode(reinterpret_cast<const std::uint16_t*>(codes.data_ptr<std::int16_t>()),
                    y.data_ptr<float>(), n, f);
  else
    throw Error("decode_tensor: codes must be uint8 or int16, got " +
                std::string(c10::toString(codes.scalar_type())));
  return y;
}

}  // namespace fp8lab::nn
