// File helpers of the data loaders (private to src/data); the helpers every layer shares
// are in fp8lab/core/files.hpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fp8lab/data/idx_array.hpp"

namespace fp8lab::data::io {

// Throws Error("<path>: offset <offset>: <what>").
[[noreturn]] void fail(const std::string& path, std::uint64_t offset, const std::string& what);

// The whole file, gzip-decompressed when it is compressed (plain files pass through).
std::vector<std::uint8_t> slurp(const std::string& path);

// An IDX array of unsigned bytes from a file's bytes; `path` names it in errors;
// `expected_rank` (if > 0) is checked.
IdxArray parse_idx(const std::vector<std::uint8_t>& bytes, const std::string& path, int expected_rank);

// The records of a CIFAR binary file (label byte(s), then 3x32x32 pixels, channel-major)
// appended to `labels` and `pixels`. CIFAR-10 records have one label byte; CIFAR-100
// records a coarse label (< 20) and then the fine one, which is the label kept.
constexpr std::size_t kCifarPixels = 3 * 32 * 32;
void parse_cifar(const std::vector<std::uint8_t>& bytes, const std::string& path, int classes,
                 std::vector<std::uint8_t>& labels, std::vector<std::uint8_t>& pixels);

}  // namespace fp8lab::data::io
