// Small text helpers shared by the parsers (formats, recipes, configs, sweeps).
#pragma once

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fp8lab {

// `s` without leading and trailing white space.
inline std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// The one tokenizer of the mini-languages (format names, scaled specs, recipes, loss
// scaling, accumulation, sweep axes): `text` cut at every `sep`, empty pieces kept ("a,,b"
// is "a", "", "b"; "" is one empty piece).
inline std::vector<std::string_view> split(std::string_view text, char sep) {
  std::vector<std::string_view> out;
  for (std::size_t start = 0;;) {
    const std::size_t at = text.find(sep, start);
    out.push_back(text.substr(start, at == std::string_view::npos ? std::string_view::npos : at - start));
    if (at == std::string_view::npos) return out;
    start = at + 1;
  }
}

// An item "key=value" cut at its first '='; nullopt where it has none.
struct KeyValue {
  std::string_view key, value;
};
inline std::optional<KeyValue> key_value(std::string_view item) {
  const std::size_t eq = item.find('=');
  if (eq == std::string_view::npos) return std::nullopt;
  return KeyValue{item.substr(0, eq), item.substr(eq + 1)};
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

// A whole decimal number, all of `s` (an optional '-', then digits; no '+', no spaces);
// nullopt when it is not one or does not fit.
inline std::optional<std::int64_t> parse_integer(std::string_view s) {
  std::int64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

// A finite decimal number, all of `s` (what strtod reads: "1e-3", "-2.5", "0x1p-3"; no
// spaces); nullopt when it is not one, or is infinite or NaN.
inline std::optional<double> parse_number(std::string_view s) {
  const std::string t(s);
  char* end = nullptr;
  if (t.empty() || std::isspace(static_cast<unsigned char>(t[0]))) return std::nullopt;  // strtod would skip it
  const double v = std::strtod(t.c_str(), &end);
  if (end != t.c_str() + t.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

// `s` as one word of a POSIX shell command: in single quotes, each ' written as '\''.
inline std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// `s` as one field of a CSV record (RFC 4180): as it is, or in double quotes with each '"'
// doubled where it holds a comma, a quote or a line break.
inline std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\r\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

// `v` with a fixed number of decimals ("%.*f").
inline std::string fixed(double v, int decimals) {
  char b[64];
  std::snprintf(b, sizeof b, "%.*f", decimals, v);
  return b;
}

// One character of UTF-8 text: its code point and its length in bytes.
struct Utf8Char {
  char32_t code_point;
  std::size_t size;
};

// The character at byte `i` of `text`, or nullopt where the bytes there are not well-formed
// UTF-8 (the Unicode standard's Table 3-7: no overlong forms, no surrogates, nothing above
// U+10FFFF, no stray continuation bytes, no sequence cut short).
std::optional<Utf8Char> utf8_at(std::string_view text, std::size_t i);

// Whether all of `text` is well-formed UTF-8.
bool valid_utf8(std::string_view text);

// `text` as it can be shown in one line of a message: escape_controls without keeping line
// breaks (fp8lab/core/error.hpp).
std::string printable(std::string_view text);

// The UTF-8 bytes of a code point (at most U+10FFFF, not a surrogate).
std::string utf8_encode(char32_t code_point);

// The toml++ of Debian 12 reaches __builtin_unreachable() (undefined behaviour) on many
// non-ASCII characters, U+00A1-U+0499 and U+FB26-U+FEFE among them, wherever it tests for
// white space: everywhere outside strings and comments, including inside the token it is
// reading. Every parse of outside TOML text therefore runs on shielded text.
// shield_toml_text checks that `text` is UTF-8 and moves each non-ASCII character c of the
// Basic Multilingual Plane to U+F0000 + c (plane 15, private use), which toml++ classifies
// as nothing; unshield_toml_text moves them back in the keys, strings and error messages the
// parser returns. Plane-15 characters, and \U000F escapes that would make one, are refused
// in `text`, so that the two are exact inverses. Errors: "<source>:<line>: ...".
std::string shield_toml_text(std::string_view text, const std::string& source);
std::string unshield_toml_text(std::string_view text);
// Whether the shield reserves this code point (plane 15, U+F0000-U+FFFFF): text meant to be
// written into TOML and read back must not hold one.
bool reserved_by_toml_shield(char32_t code_point);

}  // namespace fp8lab
