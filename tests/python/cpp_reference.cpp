// The C++ side of tests/python/test_torch.py: a small CNN built with libtorch's C++ API and
// quantized with fp8lab::nn::quantize_model, run forward and backward on weights and inputs
// the Python test wrote as .npy files, its outputs and gradients written back as .npy files.
//
//   fp8lab_python_reference DIR RECIPE SEED STEPS COMPUTE
//
// DIR holds p{0,2,5,7}{w,b}.npy (the parameters), and per step k x{k}.npy (the input) and
// r{k}.npy (the loss is sum(y * r)). Writes y{k}.npy, gx{k}.npy and p{i}{w,b}_g{k}.npy.
#include <torch/torch.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "fp8lab/core/error.hpp"
#include "fp8lab/core/npy.hpp"
#include "fp8lab/settings/compute_spec.hpp"
#include "fp8lab/nn/modules.hpp"

namespace {

torch::Tensor load(const std::string& path) {
  const fp8lab::NpyArray a = fp8lab::read_npy(path);
  if (a.dtype != fp8lab::DType::f32 || a.fortran_order) throw fp8lab::Error(path + ": expected C-order float32");
  std::vector<std::int64_t> shape(a.shape.begin(), a.shape.end());
  torch::Tensor t = torch::empty(shape, torch::kFloat32);
  std::memcpy(t.data_ptr<float>(), a.data.data(), a.data.size());
  return t;
}

void save(const std::string& path, const torch::Tensor& t_in) {
  const torch::Tensor t = t_in.contiguous();
  fp8lab::NpyArray a;
  a.shape.assign(t.sizes().begin(), t.sizes().end());
  a.data.resize(static_cast<std::size_t>(t.numel()) * 4);
  std::memcpy(a.data.data(), t.data_ptr<float>(), a.data.size());
  fp8lab::write_npy(path, a);
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s DIR RECIPE SEED STEPS COMPUTE\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  torch::nn::Sequential model(
      torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 4, 3).padding(1)), torch::nn::ReLU(),
      torch::nn::Conv2d(torch::nn::Conv2dOptions(4, 4, 3).stride(2).padding(1).groups(2)), torch::nn::ReLU(),
      torch::nn::Flatten(), torch::nn::Linear(64, 16), torch::nn::ReLU(), torch::nn::Linear(16, 10));
  const int idx[] = {0, 2, 5, 7};
  {
    torch::NoGradGuard g;
    for (int i : idx) {
      auto params = model[static_cast<std::size_t>(i)]->named_parameters(false);
      params["weight"].copy_(load(dir + "/p" + std::to_string(i) + "w.npy"));
      params["bias"].copy_(load(dir + "/p" + std::to_string(i) + "b.npy"));
    }
  }
  auto ctx = std::make_shared<fp8lab::nn::QuantContext>();
  ctx->seed = std::stoull(argv[3]);
  ctx->compute = fp8lab::nn::parse_compute(argv[5]);
  const auto q = fp8lab::nn::quantize_model(*model, fp8lab::nn::load_recipe(argv[2]), ctx);
  const int steps = std::stoi(argv[4]);
  for (int k = 0; k < steps; ++k) {
    ctx->step = static_cast<std::uint64_t>(k);
    const std::string s = std::to_string(k);
    torch::Tensor x = load(dir + "/x" + s + ".npy").requires_grad_(true);
    const torch::Tensor y = model->forward(x);
    (y * load(dir + "/r" + s + ".npy")).sum().backward();
    save(dir + "/y" + s + ".npy", y.detach());
    save(dir + "/gx" + s + ".npy", x.grad());
    for (int i : idx) {
      auto params = model[static_cast<std::size_t>(i)]->named_parameters(false);
      const std::string p = dir + "/p" + std::to_string(i);
      save(p + "w_g" + s + ".npy", params["weight"].grad());
      save(p + "b_g" + s + ".npy", params["bias"].grad());
      params["weight"].mutable_grad().zero_();
      params["bias"].mutable_grad().zero_();
    }
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "error: %s\n", e.what());
  return 1;
}
