// File helpers shared by the data loaders (private to src/data).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace fp8lab::data::io {

// Throws Error("<path>: offset <offset>: <what>").
[[noreturn]] void fail(const std::string& path, std::uint64_t offset, const std::string& what);

// The whole file, gzip-decompressed when it is compressed (plain files pass through).
std::vector<std::uint8_t> slurp(const std::string& path);

// FNV-1a, continued from `h` (start with kFnvBasis).
inline constexpr std::uint64_t kFnvBasis = 0xcbf29ce484222325ULL;
inline std::uint64_t fnv1a(std::uint64_t h, const void* data, std::size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ULL;
  return h;
}

}  // namespace fp8lab::data::io
