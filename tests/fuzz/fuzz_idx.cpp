// IDX files (MNIST layout, after gzip): any bytes either parse into an array whose data
// fits its dimensions, or throw fp8lab::Error.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "../../src/data/io.hpp"
#include "fp8lab/core/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const std::vector<std::uint8_t> bytes(data, data + size);
    const auto a = fp8lab::data::io::parse_idx(bytes, "fuzz-idx", 0);
    std::size_t n = 1;
    for (auto d : a.dims) n *= d;
    if (a.data.size() != n) __builtin_trap();
  } catch (const fp8lab::Error&) {
  }
  return 0;
}
