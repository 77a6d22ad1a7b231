// Small helpers shared by the test suites.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <functional>
#include <set>
#include <string>
#include <system_error>

#include "fp8lab/core/error.hpp"

namespace fp8lab::test {

// The message of the fp8lab::Error that f throws, or "" when it throws none.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// The scratch folders this process made, removed when it exits normally. A forked
// child inherits the list but removes nothing: the folders belong to the process
// that made them.
class ScratchFolders {
 public:
  void add(const std::filesystem::path& d) { folders_.insert(d); }
  ~ScratchFolders() {
    if (::getpid() != owner_) return;
    std::error_code ec;
    for (const auto& d : folders_) std::filesystem::remove_all(d, ec);
  }

 private:
  pid_t owner_ = ::getpid();
  std::set<std::filesystem::path> folders_;
};

inline ScratchFolders& scratch_folders() {
  static ScratchFolders folders;
  return folders;
}

// A per-process scratch folder under the system temp folder, removed when the
// process exits normally (a failed test's folder stays when it crashes).
inline std::filesystem::path temp_dir(const std::string& prefix) {
  std::filesystem::path d =
      std::filesystem::temp_directory_path() / (prefix + "_" + std::to_string(::getpid()));
  std::filesystem::create_directories(d);
  scratch_folders().add(d);
  return d;
}

}  // namespace fp8lab::test
