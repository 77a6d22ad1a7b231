// A scaled format's codes on disk (docs/spec.md §6.5), one result in up to four files:
//   PATH                    the element codes (uint8, the input's shape)
//   STEM.scales.npy         the scale codes
//   STEM.tensor_scale.npy   the float32 tensor scale, for formats that have one
//   STEM.codeset            the manifest: the format, the axis, and each part's file name,
//                           length and FNV-1a checksum
// (STEM is PATH without its ".npy"). A set is written whole or not at all; a set whose
// parts do not belong together (a part replaced, lost or from another set, another format
// or axis) is refused when it is read.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "fp8lab/core/npy.hpp"

namespace fp8lab {

struct CodeSetFiles {
  std::string codes, scales, tensor_scale, manifest;
};
CodeSetFiles code_set_files(const std::string& codes_path);

struct CodeSet {
  NpyArray codes, scales;
  std::optional<NpyArray> tensor_scale;
};

// Writes `set` (a tensor scale where the format has one) as the set at `path` under
// `format` (its canonical name) and `axis` (0-based, as the codes' shape counts), through
// write_files_atomic: the manifest first, then the side files, the codes last, so that a
// process killed between two renames leaves a set that the manifest refuses.
void write_code_set(const std::string& path, const std::string& format, int axis, const CodeSet& set);

// Reads the set at `path`, written for `format` and `axis` (0-based); `tensor_scale`: the
// format has one. With a manifest, every part must be the one it lists, and the format and
// axis those given, else Error naming the part and what differs. Without one (a set made
// by another program) the parts are read as they are; their shapes are the caller's to check.
CodeSet read_code_set(const std::string& path, const std::string& format, int axis, bool tensor_scale);

// The files of the set at `path` that exist or would be written (for checking that an
// output names none of the inputs).
std::vector<std::string> code_set_paths(const std::string& path, bool tensor_scale);

}  // namespace fp8lab
