// Code sets on disk (fp8lab/core/code_set.hpp): whatever the manifest and the scales file
// hold, read_code_set returns the set or throws fp8lab::Error; a set it accepts with a
// manifest is byte for byte the set that write_code_set wrote.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>

#include "fp8lab/core/code_set.hpp"
#include "fp8lab/core/files.hpp"
#include "fp8lab/core/error.hpp"

namespace {
// The fuzzer's scratch folder, removed when the process exits normally.
struct Folder {
  std::string path;
  Folder() {
    const auto p = std::filesystem::temp_directory_path() / ("fp8lab-fuzz-code-set-" + std::to_string(::getpid()));
    std::filesystem::create_directories(p);
    path = p.string();
  }
  ~Folder() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

const std::string& folder() {
  static const Folder d;
  return d.path;
}

fp8lab::CodeSet reference_set() {
  fp8lab::CodeSet s;
  s.codes = fp8lab::NpyArray{fp8lab::DType::u8, {2, 32}, false, std::vector<std::uint8_t>(64, 3)};
  s.scales = fp8lab::NpyArray{fp8lab::DType::u8, {2, 1}, false, {127, 120}};
  return s;
}
}  // namespace

// The input: the manifest's text, then after a NUL byte (where there is one) the scales
// file's bytes in place of the ones written.
extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const std::size_t nul = in.find('\0');
  const std::string path = folder() + "/c.npy";
  const char* format = "e2m1fn@1x32:e8m0:floor";
  fp8lab::write_code_set(path, format, 1, reference_set());
  const fp8lab::CodeSetFiles f = fp8lab::code_set_files(path);
  fp8lab::write_file_atomic(f.manifest, std::string(in.substr(0, nul)));
  if (nul != std::string_view::npos) fp8lab::write_file_atomic(f.scales, std::string(in.substr(nul + 1)));
  try {
    const fp8lab::CodeSet s = fp8lab::read_code_set(path, format, 1, false);
    // Accepted: the parts are those written, unless the scales were replaced and the
    // manifest is the one that lists the replacement (then they are what the input says).
    if (s.codes.data != reference_set().codes.data) __builtin_trap();
  } catch (const fp8lab::Error&) {
  }
  return 0;
}
