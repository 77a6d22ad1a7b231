// libtorch's process-wide run-time settings that decide a training run's speed and its
// float32 arithmetic, as one value a caller applies on purpose. The library never changes
// them behind its caller's back: train::train applies its run's settings with a
// ScopedTorchSettings and restores the caller's when it returns.
//
// What must be set before libtorch loads (OpenBLAS's kernel family, OpenMP's spinning) is
// the program's business, not the library's: see apps/launcher/process_env.hpp and
// docs/training.md.
#pragma once

#include <exception>
#include <string>

namespace fp8lab::nn {

struct TorchSettings {
  int threads = 1;               // libtorch's intra-op threads
  bool flush_denormals = false;  // the CPU's flush-to-zero / denormals-are-zero for float32
  // OpenBLAS's own threads, which libtorch's float32 matmuls run on and which
  // torch::set_num_threads does not reach; 0: as many as `threads`. Ignored when libtorch's
  // BLAS is not OpenBLAS.
  int blas_threads = 0;
};

// The settings in force now (blas_threads: OpenBLAS's count, 0 without OpenBLAS).
TorchSettings current_torch_settings();

// Applies `s` (threads < 1: one per core; blas_threads < 1: as many as threads).
void apply(const TorchSettings& s);

// Applies settings for its lifetime and restores the ones in force before.
class ScopedTorchSettings {
 public:
  explicit ScopedTorchSettings(const TorchSettings& s);
  ~ScopedTorchSettings();
  ScopedTorchSettings(const ScopedTorchSettings&) = delete;
  ScopedTorchSettings& operator=(const ScopedTorchSettings&) = delete;

 private:
  TorchSettings before_;
};

// The OpenBLAS kernel family in use ("" when libtorch's BLAS is not OpenBLAS).
std::string blas_core();

// OpenBLAS's thread count (0 when libtorch's BLAS is not OpenBLAS).
int blas_threads();

// What an exception from libtorch says, as a part of one of fp8lab's messages: c10::Error's
// text without the C++ backtrace libtorch appends ("Exception raised from ...", frames),
// its first line only, at most `limit` characters.
std::string torch_error_text(const std::exception& e, std::size_t limit = 300);

}  // namespace fp8lab::nn
