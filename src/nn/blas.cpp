#include "fp8lab/nn/blas.hpp"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace fp8lab::nn {

std::string blas_core() {
  using Fn = char* (*)();
  auto fn = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  if (!fn) return "";
  const char* name = fn();
  return name ? name : "";
}

void fix_blas_kernels(char** argv) {
  if (std::getenv("FP8LAB_KEEP_BLAS") || std::getenv("FP8LAB_BLAS_FIXED")) return;
  std::string core = blas_core();
  if (core.empty()) return;  // not OpenBLAS
  bool changed = false;
  std::transform(core.begin(), core.end(), core.begin(), [](unsigned char c) { return std::tolower(c); });
  // OpenBLAS's generic and pre-AVX fallbacks.
  const bool fallback = core == "prescott" || core == "core2" || core == "nehalem" || core == "penryn" ||
                        core == "dunnington" || core == "atom" || core == "unknown" || core == "generic";
  if (fallback && !std::getenv("OPENBLAS_CORETYPE")) {
    __builtin_cpu_init();
    const char* target = nullptr;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
      target = "SKYLAKEX";
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
      target = "HASWELL";
    if (target) setenv("OPENBLAS_CORETYPE", target, 1), changed = true;
  }
  if (!std::getenv("GOMP_SPINCOUNT") && !std::getenv("OMP_WAIT_POLICY"))
    setenv("GOMP_SPINCOUNT", "10000", 1), changed = true;
  if (!changed) return;
  setenv("FP8LAB_BLAS_FIXED", "1", 1);  // once: never loop
  execv("/proc/self/exe", argv);  // returns only on failure: carry on as we are
}

}  // namespace fp8lab::nn
