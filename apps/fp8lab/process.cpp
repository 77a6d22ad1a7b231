#include "process.hpp"

#include <malloc.h>
#include <unistd.h>

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

}  // namespace fp8lab::cli
