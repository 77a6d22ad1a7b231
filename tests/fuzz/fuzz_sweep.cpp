// Sweep files: any bytes either parse into a sweep, every run's config checked for ranges
// (the registries of task and model names are not linked here), or throw fp8lab::Error.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fp8lab/core/error.hpp"
#include "fp8lab/study/sweep.hpp"

using namespace fp8lab::study;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const Sweep s = parse_sweep(std::string(reinterpret_cast<const char*>(data), size), "fuzz.toml",
                                "/nonexistent-fuzz-dir", fp8lab::settings::complete_settings);
    if (s.runs.size() != s.points.size() * s.seeds.size()) __builtin_trap();
  } catch (const fp8lab::Error&) {
  }
  return 0;
}
