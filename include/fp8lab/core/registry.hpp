// A table of named choices: the one place a set of names (optimizers, schedules, tasks,
// data sets, models, ...) is written down. Validation and construction look names up in
// the same table, so a name one accepts is a name the other knows, and an unknown name is
// an error that lists the known ones.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fp8lab/core/error.hpp"

namespace fp8lab {

template <class T>
class Registry {
 public:
  // `what` names the kind of choice in errors: "optimizer", "schedule", ...
  Registry(std::string what, std::vector<std::pair<std::string, T>> entries)
      : what_(std::move(what)), entries_(std::move(entries)) {}

  const T* find(std::string_view name) const {
    for (const auto& [n, v] : entries_)
      if (n == name) return &v;
    return nullptr;
  }
  bool contains(std::string_view name) const { return find(name) != nullptr; }

  // Throws Error "unknown <what> '<name>' (known: a, b, c)".
  const T& at(std::string_view name) const {
    if (const T* v = find(name)) return *v;
    throw Error("unknown " + what_ + " '" + std::string(name) + "' (known: " + known() + ")");
  }

  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& e : entries_) out.push_back(e.first);
    return out;
  }
  // "a, b, c"
  std::string known() const {
    std::string s;
    for (const auto& e : entries_) s += (s.empty() ? "" : ", ") + e.first;
    return s;
  }
  const std::string& what() const { return what_; }
  const std::vector<std::pair<std::string, T>>& entries() const { return entries_; }

 private:
  std::string what_;
  std::vector<std::pair<std::string, T>> entries_;
};

}  // namespace fp8lab
