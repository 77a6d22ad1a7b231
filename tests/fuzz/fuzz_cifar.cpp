// CIFAR binary files: any bytes either parse into whole records (one label per 3x32x32
// pixels, labels below the class count) or throw fp8lab::Error, for CIFAR-10 and CIFAR-100.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "../../src/data/io.hpp"
#include "fp8lab/core/error.hpp"

using fp8lab::data::io::kCifarPixels;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::vector<std::uint8_t> bytes(data, data + size);
  for (int classes : {10, 100}) {
    try {
      std::vector<std::uint8_t> labels, pixels;
      fp8lab::data::io::parse_cifar(bytes, "fuzz.bin", classes, labels, pixels);
      if (pixels.size() != labels.size() * kCifarPixels) __builtin_trap();
      for (auto l : labels)
        if (l >= classes) __builtin_trap();
    } catch (const fp8lab::Error&) {
    }
  }
  return 0;
}
