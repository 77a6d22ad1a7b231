// Small helpers shared by the test suites.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <functional>
#include <string>

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

// A per-process scratch folder under the system temp folder.
inline std::filesystem::path temp_dir(const std::string& prefix) {
  std::filesystem::path d =
      std::filesystem::temp_directory_path() / (prefix + "_" + std::to_string(::getpid()));
  std::filesystem::create_directories(d);
  return d;
}

}  // namespace fp8lab::test
