#include "process.hpp"

#include <malloc.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <system_error>

#include "fp8lab/core/format.hpp"

namespace fp8lab::cli {

void setup_process() {
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

std::string self_program() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) throw Error("cannot find this program's path (/proc/self/exe)");
  return std::string(buf, static_cast<std::size_t>(n));
}

ProgramCopy::ProgramCopy() {
  namespace fs = std::filesystem;
  const fs::path self = self_program();
  std::string pattern = (fs::temp_directory_path() / "fp8lab-sweep-XXXXXX").string();
  if (::mkdtemp(pattern.data()) == nullptr)
    throw Error("cannot make a folder for a copy of this program (" + pattern + "): " + std::strerror(errno));
  dir_ = pattern;
  try {
    for (const fs::path& src : {self, self.parent_path() / "libfp8lab_cli.so"}) {
      const fs::path dst = dir_ / src.filename();
      std::error_code ec;
      fs::copy_file(src, dst, ec);
      if (!ec) fs::permissions(dst, fs::status(src).permissions(), ec);
      if (ec) throw Error("cannot copy " + src.string() + " to " + dst.string() + ": " + ec.message());
    }
  } catch (...) {
    std::error_code ec;
    fs::remove_all(dir_, ec);
    throw;
  }
  program_ = (dir_ / self.filename()).string();
}

ProgramCopy::~ProgramCopy() {
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

}  // namespace fp8lab::cli
