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

// An OpenBLAS entry point, looked up in the libraries loaded (nullptr without OpenBLAS).
template <typename Fn>
Fn openblas_function(const char* name) {
  return reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, name));
}

// Sets OpenBLAS's thread count where OpenBLAS is loaded. OpenBLAS keeps a pool of its own:
// left at its default (every core) beside a one-thread run, its idle workers spin in
// sched_yield and take cores from the run, and from a second run beside it.
void set_blas_threads(int n) {
  auto set = openblas_function<void (*)(int)>("openblas_set_num_threads");
  if (set && blas_threads() != n) set(n);
}
}  // namespace

TorchSettings current_torch_settings() {
  return {static_cast<int>(torch::get_num_threads()), flushing_denormals(), blas_threads()};
}

void apply(const TorchSettings& s) {
  const int threads = threads_or_all_cores(s.threads);
  if (torch::get_num_threads() != threads) torch::set_num_threads(threads);
  set_blas_threads(s.blas_threads > 0 ? s.blas_threads : threads);
  at::globalContext().setFlushDenormal(s.flush_denormals);
}

ScopedTorchSettings::ScopedTorchSettings(const TorchSettings& s) : before_(current_torch_settings()) { apply(s); }

ScopedTorchSettings::~ScopedTorchSettings() { apply(before_); }

std::string blas_core() {
  auto fn = openblas_function<char* (*)()>("openblas_get_corename");
  if (!fn) return "";
  const char* name = fn();
  return name ? name : "";
}

int blas_threads() {
  auto fn = openblas_function<int (*)()>("openblas_get_num_threads");
  return fn ? fn() : 0;
}

std::string torch_error_text(const std::exception& e, std::size_t limit) {
  const auto* c10 = dynamic_cast<const c10::Error*>(&e);
  std::string msg = c10 ? c10->what_without_backtrace() : e.what();
  if (const auto at = msg.find("Exception raised from"); at != std::string::npos) msg.resize(at);
  if (const auto nl = msg.find('\n'); nl != std::string::npos) msg.resize(nl);
  while (!msg.empty() && (msg.back() == ' ' || msg.back() == '\r')) msg.pop_back();
  if (msg.size() > limit) msg = msg.substr(0, limit) + "...";
  return msg.empty() ? std::string("libtorch gave no reason") : msg;
}

}  // namespace fp8lab::nn
