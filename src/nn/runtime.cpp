#include "fp8lab/nn/runtime.hpp"

#include <dlfcn.h>
#include <torch/torch.h>

#include "fp8lab/core/machine.hpp"

namespace fp8lab::nn {

namespace {
// Whether the CPU flushes denormals now. libtorch can set the mode but not report it;
// flushing shows in arithmetic: the smallest normal float32 halved is 0.
bool flushing_denormals() {
  volatile float tiny = 1.17549435e-38f;  // 2^-126
  volatile float half = tiny * 0.5f;
  return half == 0.0f;
}
}  // namespace

TorchSettings current_torch_settings() {
  return {static_cast<int>(torch::get_num_threads()), flushing_denormals()};
}

void apply(const TorchSettings& s) {
  const int threads = threads_or_all_cores(s.threads);
  if (torch::get_num_threads() != threads) torch::set_num_threads(threads);
  at::globalContext().setFlushDenormal(s.flush_denormals);
}

ScopedTorchSettings::ScopedTorchSettings(const TorchSettings& s) : before_(current_torch_settings()) { apply(s); }

ScopedTorchSettings::~ScopedTorchSettings() { apply(before_); }

std::string blas_core() {
  using Fn = char* (*)();
  auto fn = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  if (!fn) return "";
  const char* name = fn();
  return name ? name : "";
}

}  // namespace fp8lab::nn
