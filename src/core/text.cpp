#include "fp8lab/core/text.hpp"

#include "fp8lab/core/format.hpp"

namespace fp8lab {

namespace {

// The end of a string starting at `i` (just after its opening quote(s)); `quote` and
// `multi` say which kind; basic strings have backslash escapes. Returns text.size() when it
// does not end (the TOML parser reports that).
std::size_t skip_string(std::string_view text, std::size_t i, char quote, bool multi) {
  const bool escapes = quote == '"';
  while (i < text.size()) {
    const char c = text[i];
    if (escapes && c == '\\') {
      i += 2;
      continue;
    }
    if (!multi && c == '\n') return i;  // unterminated: left to the parser
    if (c == quote) {
      if (!multi) return i + 1;
      if (text.substr(i, 3) == std::string_view(std::string(3, quote))) return i + 3;
    }
    ++i;
  }
  return text.size();
}

}  // namespace

void check_toml_text(std::string_view text, const std::string& source) {
  std::size_t line = 1;
  char last = '\n';  // the last character outside strings and comments that is not a blank
  for (std::size_t i = 0; i < text.size();) {
    const char c = text[i];
    // A quote opens a string only where a key or a value starts: at the start of a line,
    // after '=', '[', '{', ',' or the '.' of a dotted key. Elsewhere (inside a bare word or
    // a number) it is part of that token for the parser, and so is what follows it.
    const bool string_may_start = last == '\n' || last == '=' || last == '[' || last == '{' || last == ',' ||
                                  last == '.';
    if (c == '#') {
      while (i < text.size() && text[i] != '\n') ++i;
    } else if ((c == '"' || c == '\'') && string_may_start) {
      const bool multi = text.substr(i, 3) == std::string_view(std::string(3, c));
      const std::size_t end = skip_string(text, i + (multi ? 3 : 1), c, multi);
      for (std::size_t k = i; k < end; ++k) line += text[k] == '\n';
      i = end;
      last = c;
    } else {
      if (static_cast<unsigned char>(c) >= 0x80)
        throw Error(at_line(source, static_cast<std::int64_t>(line)) +
                    "a non-ASCII character outside a string or comment (TOML keys and values are ASCII there)");
      line += c == '\n';
      if (c != ' ' && c != '\t' && c != '\r') last = c;
      ++i;
    }
  }
}

}  // namespace fp8lab
