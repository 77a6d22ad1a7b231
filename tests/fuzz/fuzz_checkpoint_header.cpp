// The header line of a checkpoint (length and checksum of the archive after it): any bytes
// either unframe to a payload whose length and checksum match, are passed through as an
// unframed older file, or throw fp8lab::Error; framing any payload unframes back to it.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fp8lab/core/files.hpp"
#include "fp8lab/core/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  constexpr std::string_view magic = "fp8lab-checkpoint ";
  try {
    std::string bytes = input;
    if (!fp8lab::checksum_unframe(bytes, magic, "fuzz.ckpt", "checkpoint")) {
      if (bytes != input) __builtin_trap();
    } else if (fp8lab::checksum_frame(magic, bytes) != input) {
      __builtin_trap();
    }
  } catch (const fp8lab::Error&) {
  }
  std::string framed = fp8lab::checksum_frame(magic, input);
  if (!fp8lab::checksum_unframe(framed, magic, "fuzz.ckpt", "checkpoint") || framed != input) __builtin_trap();
  return 0;
}
