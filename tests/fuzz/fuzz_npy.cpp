// .npy files: any bytes either parse into an array whose data fits its shape, or throw
// fp8lab::Error; nothing is allocated beyond the bytes given.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fp8lab/core/error.hpp"
#include "fp8lab/core/npy.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const fp8lab::NpyArray a =
        fp8lab::parse_npy(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.npy");
    if (a.data.size() != a.size() * fp8lab::itemsize(a.dtype) || a.data.size() > size) __builtin_trap();
  } catch (const fp8lab::Error&) {
  }
  return 0;
}
