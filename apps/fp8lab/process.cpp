#include "process.hpp"

#include <malloc.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <system_error>

#include "fp8lab/core/error.hpp"

namespace fp8lab::cli {

void setup_process() {
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  ::signal(SIGXFSZ, SIG_IGN);
}

std::string self_program() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) throw Error("cannot find this program's path (/proc/self/exe)");
  return std::string(buf, static_cast<std::size_t>(n));
}

namespace {

constexpr const char* kCopyPrefix = "fp8lab-sweep-";
constexpr const char* kOwnerFile = "owner";  // the pid of the sweep that made the copy

// The pid in a copy's owner file, or 0 where there is none (a copy being made, or one
// made before copies named their owner).
pid_t owner_of(const std::filesystem::path& dir) {
  std::ifstream in(dir / kOwnerFile);
  long pid = 0;
  if (!(in >> pid) || pid <= 0) return 0;
  return static_cast<pid_t>(pid);
}

bool process_gone(pid_t pid) { return ::kill(pid, 0) != 0 && errno == ESRCH; }

}  // namespace

namespace {

// Calls f(folder, owner pid) for each folder fp8lab-sweep-* in `tmp`; the pid is 0 where
// the folder names no owner.
template <class F>
void for_each_copy(const std::filesystem::path& tmp, F f) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (fs::directory_iterator it(tmp, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::path dir = it->path();
    std::error_code kind;
    if (dir.filename().string().rfind(kCopyPrefix, 0) != 0 || !it->is_directory(kind)) continue;
    f(dir, owner_of(dir));
  }
}

}  // namespace

void remove_stale_copies(const std::filesystem::path& tmp) {
  for_each_copy(tmp, [](const std::filesystem::path& dir, pid_t pid) {
    if (pid == 0 || !process_gone(pid)) return;
    std::error_code rm;
    std::filesystem::remove_all(dir, rm);
    if (!rm)
      std::fprintf(stderr, "sweep: removed %s, a copy of the program left by sweep process %ld, which has ended\n",
                   dir.string().c_str(), static_cast<long>(pid));
  });
}

std::vector<long> other_sweeps(const std::filesystem::path& tmp) {
  std::vector<long> out;
  for_each_copy(tmp, [&](const std::filesystem::path&, pid_t pid) {
    if (pid != 0 && pid != ::getpid() && !process_gone(pid)) out.push_back(static_cast<long>(pid));
  });
  std::sort(out.begin(), out.end());
  return out;
}

ProgramCopy::ProgramCopy() {
  namespace fs = std::filesystem;
  const fs::path self = self_program();
  const fs::path tmp = fs::temp_directory_path();
  remove_stale_copies(tmp);
  std::string pattern = (tmp / (std::string(kCopyPrefix) + "XXXXXX")).string();
  if (::mkdtemp(pattern.data()) == nullptr)
    throw Error("cannot make a folder for a copy of this program (" + pattern + "): " + std::strerror(errno));
  dir_ = pattern;
  try {
    std::ofstream owner(dir_ / kOwnerFile);
    owner << ::getpid() << '\n';
    if (!owner.flush()) throw Error("cannot write " + (dir_ / kOwnerFile).string());
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
