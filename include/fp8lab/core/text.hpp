// Small text helpers shared by the parsers (formats, recipes, configs, sweeps).
#pragma once

#include <cctype>
#include <cstdint>
#include <string>
#include <string_view>

namespace fp8lab {

// `s` without leading and trailing white space.
inline std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// The prefix of an error at a line of a file: "<source>:<line>: ".
inline std::string at_line(const std::string& source, std::int64_t line) {
  return source + ":" + std::to_string(line) + ": ";
}

}  // namespace fp8lab
