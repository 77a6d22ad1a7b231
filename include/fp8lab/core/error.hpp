// The one exception type of fp8lab's user-facing errors, and the escaping of the input
// text its messages quote. Most of the library needs only this, not the formats.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace fp8lab {

// `text` with its control characters (NUL, escape, DEL...) written as \\0, \\n, \\t, \\r
// or \\xNN; with `keep_line_breaks`, newlines and tabs stay as they are.
std::string escape_controls(std::string_view text, bool keep_line_breaks);

// A user-facing error with a message a person can act on. The CLI prints it and exits 2.
// Control characters that the message quotes from the input (a NUL, which would cut the
// C string what() returns short; an escape sequence) are escaped (escape_controls); line
// breaks and tabs stay.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(escape_controls(what, true)) {}
  explicit Error(const char* what) : Error(std::string(what)) {}
};

}  // namespace fp8lab
