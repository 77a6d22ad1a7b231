// Parsing TOML text that comes from outside (recipes here; configs and sweep files in
// experiments): toml++, used header-only, behind one function that shields it from the
// characters it mishandles (core/text.hpp, shield_toml_text).
#pragma once

#ifndef TOML_HEADER_ONLY
#define TOML_HEADER_ONLY 1
#endif
#include <toml++/toml.h>

#include <string>
#include <string_view>
#include <vector>

#include "fp8lab/core/error.hpp"
#include "fp8lab/core/text.hpp"

namespace fp8lab {

namespace toml_detail {

// Undoes shield_toml_text in every key and string below `n`.
inline void unshield(toml::node& n) {
  if (auto* s = n.as_string()) {
    s->get() = unshield_toml_text(s->get());
  } else if (auto* a = n.as_array()) {
    for (auto& e : *a) unshield(e);
  } else if (auto* t = n.as_table()) {
    std::vector<std::string> renamed;
    for (auto&& [k, v] : *t) {
      unshield(v);
      if (unshield_toml_text(k.str()) != k.str()) renamed.emplace_back(k.str());
    }
    for (const std::string& old : renamed) {  // distinct: the shield is one-to-one
      const auto it = t->find(old);
      t->insert(toml::key(unshield_toml_text(old), it->first.source()), std::move(it->second));
      t->erase(old);
    }
  }
}

}  // namespace toml_detail

// The TOML document in `text`; `source` names it in errors. A syntax error, or text that is
// not UTF-8, is an Error "<source>:<line>: <what>".
inline toml::table parse_toml(std::string_view text, const std::string& source) {
  const std::string shielded = shield_toml_text(text, source);
  try {
    toml::table t = toml::parse(shielded, source);
    toml_detail::unshield(t);
    return t;
  } catch (const toml::parse_error& e) {
    throw Error(at_line(source, e.source().begin.line) + unshield_toml_text(e.description()));
  }
}

}  // namespace fp8lab
