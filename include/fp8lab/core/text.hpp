// Small text helpers shared by the parsers (formats, recipes, configs, sweeps).
#pragma once

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
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

// The shortest text that reads back to the same double, always with a '.' or an exponent
// so that TOML reads it as a float: 0.1, 2.0, 1e-05, inf, -inf, nan.
inline std::string shortest_float(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char b[64];
  const auto r = std::to_chars(b, b + sizeof b, v);
  std::string t(b, r.ptr);
  if (t.find_first_of(".eE") == std::string::npos) t += ".0";
  return t;
}

// `v` with a fixed number of decimals ("%.*f").
inline std::string fixed(double v, int decimals) {
  char b[64];
  std::snprintf(b, sizeof b, "%.*f", decimals, v);
  return b;
}

// TOML text may hold non-ASCII characters only inside strings and comments (bare keys are
// ASCII). Throws Error "<source>:<line>: ..." at the first one outside them. Every TOML
// parse of outside text runs this first: the toml++ of Debian 12 reaches
// __builtin_unreachable() (undefined behaviour) on some such characters, e.g. U+00E9 or
// U+FDFF, where it expects white space.
void check_toml_text(std::string_view text, const std::string& source);

}  // namespace fp8lab
