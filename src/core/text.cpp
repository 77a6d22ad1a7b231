#include "fp8lab/core/text.hpp"

#include <cstdio>

#include "fp8lab/core/error.hpp"

namespace fp8lab {

std::string escape_controls(std::string_view text, bool keep_line_breaks) {
  std::string out;
  out.reserve(text.size());
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if ((c >= 0x20 && c != 0x7f) || (keep_line_breaks && (c == '\n' || c == '\t'))) {
      out += ch;
    } else if (c == 0) {
      out += "\\0";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else {
      static constexpr char hex[] = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}


std::optional<Utf8Char> utf8_at(std::string_view text, std::size_t i) {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(text[i + k]); };
  const unsigned char c = byte(0);
  if (c < 0x80) return Utf8Char{c, 1};
  // The length, the first byte's payload, and the range of the second byte (Table 3-7).
  std::size_t n = 0;
  char32_t cp = 0;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2, cp = c & 0x1F;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3, cp = c & 0x0F;
    if (c == 0xE0) lo = 0xA0;  // no overlong forms
    if (c == 0xED) hi = 0x9F;  // no surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4, cp = c & 0x07;
    if (c == 0xF0) lo = 0x90;  // no overlong forms
    if (c == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    return std::nullopt;
  }
  if (text.size() - i < n) return std::nullopt;
  for (std::size_t k = 1; k < n; ++k) {
    const unsigned char b = byte(k);
    if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) return std::nullopt;
    cp = (cp << 6) | (b & 0x3F);
  }
  return Utf8Char{cp, n};
}

bool valid_utf8(std::string_view text) {
  for (std::size_t i = 0; i < text.size();) {
    const auto ch = utf8_at(text, i);
    if (!ch) return false;
    i += ch->size;
  }
  return true;
}

std::string utf8_encode(char32_t cp) {
  const auto b = [](char32_t v) { return static_cast<char>(v); };
  if (cp < 0x80) return std::string(1, b(cp));
  if (cp < 0x800) return {b(0xC0 | (cp >> 6)), b(0x80 | (cp & 0x3F))};
  if (cp < 0x10000) return {b(0xE0 | (cp >> 12)), b(0x80 | ((cp >> 6) & 0x3F)), b(0x80 | (cp & 0x3F))};
  return {b(0xF0 | (cp >> 18)), b(0x80 | ((cp >> 12) & 0x3F)), b(0x80 | ((cp >> 6) & 0x3F)), b(0x80 | (cp & 0x3F))};
}

namespace {

constexpr char32_t kShieldOffset = 0xF0000;  // plane 15, private use


std::int64_t line_of(std::string_view text, std::size_t i) {
  std::int64_t line = 1;
  for (std::size_t k = 0; k < i; ++k) line += text[k] == '\n';
  return line;
}

// Offset of the first `\U000F` that is an escape: preceded by an odd run of backslashes
// (`\\U000F` is an escaped backslash followed by text). Inside a literal string ('...')
// this also refuses text that is no escape; that errs on the side of a clear error.
std::optional<std::size_t> plane_15_escape(std::string_view text) {
  for (std::size_t at = text.find("\\U000"); at != std::string_view::npos; at = text.find("\\U000", at + 1)) {
    if (at + 5 >= text.size() || (text[at + 5] != 'F' && text[at + 5] != 'f')) continue;
    std::size_t run = 1;
    while (run <= at && text[at - run] == '\\') ++run;
    if (run % 2 == 1) return at;
  }
  return std::nullopt;
}

}  // namespace

bool reserved_by_toml_shield(char32_t cp) { return cp >= kShieldOffset && cp < kShieldOffset + 0x10000; }

std::string shield_toml_text(std::string_view text, const std::string& source) {
  if (const auto at = plane_15_escape(text))
    throw Error(at_line(source, line_of(text, *at)) +
                "an escape of a plane-15 private-use character (U+F0000-U+FFFFF); fp8lab reserves them while parsing");
  std::string out;
  out.reserve(text.size() + text.size() / 2);
  for (std::size_t i = 0; i < text.size();) {
    const auto ch = utf8_at(text, i);
    if (!ch) {
      char b[8];
      std::snprintf(b, sizeof b, "0x%02X", static_cast<unsigned>(static_cast<unsigned char>(text[i])));
      throw Error(at_line(source, line_of(text, i)) + "not UTF-8 (byte " + b + " at offset " + std::to_string(i) + ")");
    }
    if (reserved_by_toml_shield(ch->code_point))
      throw Error(at_line(source, line_of(text, i)) +
                  "a plane-15 private-use character (U+F0000-U+FFFFF); fp8lab reserves them while parsing");
    if (ch->code_point >= 0x80 && ch->code_point < 0x10000)
      out += utf8_encode(kShieldOffset + ch->code_point);
    else
      out.append(text.substr(i, ch->size));
    i += ch->size;
  }
  return out;
}

std::string unshield_toml_text(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    const auto ch = utf8_at(text, i);
    const std::size_t n = ch ? ch->size : 1;  // bytes that are not UTF-8 pass unchanged
    if (ch && reserved_by_toml_shield(ch->code_point))
      out += utf8_encode(ch->code_point - kShieldOffset);
    else
      out.append(text.substr(i, n));
    i += n;
  }
  return out;
}

std::string printable(std::string_view text) { return escape_controls(text, false); }

}  // namespace fp8lab
