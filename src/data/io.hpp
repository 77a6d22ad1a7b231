// File helpers of the data loaders (private to src/data); the helpers every layer shares
// are in fp8lab/core/files.hpp.
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

}  // namespace fp8lab::data::io
