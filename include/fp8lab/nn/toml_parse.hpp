// Parsing TOML text that comes from outside (recipes here; configs and sweep files in
// experiments): toml++, used header-only, behind one function that checks the text first.
#pragma once

#ifndef TOML_HEADER_ONLY
#define TOML_HEADER_ONLY 1
#endif
#include <toml++/toml.h>

#include <string>
#include <string_view>

#include "fp8lab/core/format.hpp"
#include "fp8lab/core/text.hpp"

namespace fp8lab {

// The TOML document in `text`; `source` names it in errors. Non-ASCII characters outside
// strings and comments are refused first (check_toml_text); a syntax error is an Error
// "<source>:<line>: <what>".
inline toml::table parse_toml(std::string_view text, const std::string& source) {
  check_toml_text(text, source);
  try {
    return toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    throw Error(at_line(source, e.source().begin.line) + std::string(e.description()));
  }
}

}  // namespace fp8lab
