// Tables for the terminal (aligned columns) or CSV, from the same rows.
#pragma once

#include "fp8lab/core/text.hpp"

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace fp8lab::cli {

class Table {
 public:
  explicit Table(std::vector<std::string> header) : header_(std::move(header)) {}
  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  void print(bool csv, std::FILE* out = stdout) const {
    if (csv) {
      print_csv_row(header_, out);
      for (const auto& r : rows_) print_csv_row(r, out);
      return;
    }
    std::vector<std::size_t> w(header_.size());
    for (std::size_t i = 0; i < header_.size(); ++i) w[i] = header_[i].size();
    for (const auto& r : rows_)
      for (std::size_t i = 0; i < r.size() && i < w.size(); ++i) w[i] = std::max(w[i], r[i].size());
    auto line = [&](const std::vector<std::string>& r) {
      std::string s;
      for (std::size_t i = 0; i < r.size(); ++i) {
        const std::string cell = r[i];
        const bool left = i == 0;
        const std::string pad(w[i] - cell.size(), ' ');
        s += (i ? "  " : "") + (left ? cell + pad : pad + cell);
      }
      while (!s.empty() && s.back() == ' ') s.pop_back();
      std::fprintf(out, "%s\n", s.c_str());
    };
    line(header_);
    std::vector<std::string> rule;
    for (auto n : w) rule.emplace_back(n, '-');
    line(rule);
    for (const auto& r : rows_) line(r);
  }

 private:
  static void print_csv_row(const std::vector<std::string>& r, std::FILE* out) {
    std::string s;
    for (std::size_t i = 0; i < r.size(); ++i) {
      std::string c = r[i];
      if (c.find_first_of(",\"\n") != std::string::npos) {
        std::string q = "\"";
        for (char ch : c) q += (ch == '"') ? std::string("\"\"") : std::string(1, ch);
        c = q + "\"";
      }
      s += (i ? "," : "") + c;
    }
    std::fprintf(out, "%s\n", s.c_str());
  }
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};

inline std::string fmt_g(double v, int digits = 6) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*g", digits, v);
  return buf;
}
inline std::string fmt_f(double v, int decimals = 1) { return fixed(v, decimals); }
// part / total as a percentage with 3 decimals; "-" when total is 0.
inline std::string pct(std::uint64_t part, std::uint64_t total) {
  if (total == 0) return "-";
  return fmt_f(100.0 * static_cast<double>(part) / static_cast<double>(total), 3);
}

}  // namespace fp8lab::cli
