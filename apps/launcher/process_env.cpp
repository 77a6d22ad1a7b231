#include "process_env.hpp"

#include <cstdlib>
#include <cstring>

namespace fp8lab::launcher {

namespace {

bool is_set(const char* name) {
  const char* v = std::getenv(name);
  return v && *v;
}

// The OpenBLAS kernel family for this CPU's vector instructions, or nullptr (leave
// OpenBLAS's own choice).
const char* openblas_core() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
    return "SKYLAKEX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "HASWELL";
  return nullptr;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> recommended_environment() {
  std::vector<std::pair<std::string, std::string>> env;
  const char* keep = std::getenv("FP8LAB_KEEP_BLAS");
  if (keep && std::strcmp(keep, "1") == 0) return env;
  if (!is_set("OPENBLAS_CORETYPE"))
    if (const char* core = openblas_core()) env.emplace_back("OPENBLAS_CORETYPE", core);
  if (!is_set("GOMP_SPINCOUNT") && !is_set("OMP_WAIT_POLICY")) env.emplace_back("GOMP_SPINCOUNT", "10000");
  return env;
}

}  // namespace fp8lab::launcher
