// The names of an enum's values, written once: a constexpr table of {value, name} pairs
// that printing and parsing both read, so a name one prints is a name the other accepts,
// and an unknown name is an error that lists the known ones (as Registry does for the
// tables whose entries are objects rather than enum values).
//
//   constexpr EnumName<Colour> kColours[] = {{Colour::red, "red"}, {Colour::green, "green"}};
//   std::string_view to_string(Colour c) { return enum_name(kColours, c); }
//   Colour parse_colour(std::string_view s) { return enum_parse(kColours, s, "colour"); }
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "fp8lab/core/error.hpp"

namespace fp8lab {

template <class E>
using EnumName = std::pair<E, std::string_view>;

// The name of `v`, or "?" for a value the table does not list.
template <class E, std::size_t N>
constexpr std::string_view enum_name(const EnumName<E> (&table)[N], E v) {
  for (const auto& [value, name] : table)
    if (value == v) return name;
  return "?";
}

// The table's names in its order: "a, b, c".
template <class E, std::size_t N>
std::string enum_names(const EnumName<E> (&table)[N]) {
  std::string out;
  for (const auto& entry : table) out += (out.empty() ? "" : ", ") + std::string(entry.second);
  return out;
}

// Other spellings a parser accepts besides the table's names (listed in no error).
template <class E>
using EnumAliases = std::type_identity_t<std::span<const EnumName<E>>>;

// The value named `text` in `table`, or else in `aliases`; nullopt where neither has it.
template <class E, std::size_t N>
constexpr std::optional<E> enum_find(const EnumName<E> (&table)[N], std::string_view text,
                                     EnumAliases<E> aliases = {}) {
  for (const auto& [value, name] : table)
    if (name == text) return value;
  for (const auto& [value, name] : aliases)
    if (name == text) return value;
  return std::nullopt;
}

// The error for a name `text` the table does not have: "unknown <what> '<text>' (known:
// a, b, c)", listing the table's names (for parsers that look up a normalized form of the
// text but quote what they were given).
template <class E, std::size_t N>
Error enum_unknown(const EnumName<E> (&table)[N], std::string_view text, std::string_view what) {
  return Error("unknown " + std::string(what) + " '" + std::string(text) + "' (known: " + enum_names(table) + ")");
}

// The value named `text` (in `table` or `aliases`); throws enum_unknown's Error.
template <class E, std::size_t N>
E enum_parse(const EnumName<E> (&table)[N], std::string_view text, std::string_view what, EnumAliases<E> aliases = {}) {
  if (const auto v = enum_find(table, text, aliases)) return *v;
  throw enum_unknown(table, text, what);
}

}  // namespace fp8lab
