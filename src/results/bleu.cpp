#include "fp8lab/results/bleu.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "fp8lab/core/enum_names.hpp"
#include "fp8lab/core/error.hpp"

namespace fp8lab::results {

namespace {

bool is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  for (std::size_t p = s.find(from); p != std::string::npos; p = s.find(from, p + to.size()))
    s.replace(p, from.size(), to);
}

// The 13a punctuation class [\{-\~\[-\` -\&\(-\+\:-\@\/]: { | } ~ [ \ ] ^ _ ` space ! " # $
// % & ( ) * + : ; < = > ? @ /   (not ' - . , which have rules of their own).
bool is_13a_punct(unsigned char c) {
  return (c >= '{' && c <= '~') || (c >= '[' && c <= '`') || (c >= ' ' && c <= '&') || (c >= '(' && c <= '+') ||
         (c >= ':' && c <= '@') || c == '/';
}

// Length of a whitespace character at s[i] as Python's str.split() sees it (0: none).
std::size_t space_len(std::string_view s, std::size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  if (c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f)) return 1;
  auto at = [&](std::size_t k) { return i + k < s.size() ? static_cast<unsigned char>(s[i + k]) : 0; };
  if (c == 0xc2 && (at(1) == 0x85 || at(1) == 0xa0)) return 2;                  // U+0085, U+00A0
  if (c == 0xe1 && at(1) == 0x9a && at(2) == 0x80) return 3;                    // U+1680
  if (c == 0xe2 && at(1) == 0x80 && (at(2) <= 0x8a || at(2) == 0xa8 || at(2) == 0xa9 || at(2) == 0xaf))
    return 3;                                                                    // U+2000-200A, 2028, 2029, 202F
  if (c == 0xe2 && at(1) == 0x81 && at(2) == 0x9f) return 3;                    // U+205F
  if (c == 0xe3 && at(1) == 0x80 && at(2) == 0x80) return 3;                    // U+3000
  return 0;
}

std::vector<std::string_view> split_ws(std::string_view s) {
  std::vector<std::string_view> out;
  std::size_t i = 0, start = std::string_view::npos;
  while (i < s.size()) {
    const std::size_t w = space_len(s, i);
    if (w) {
      if (start != std::string_view::npos) out.push_back(s.substr(start, i - start));
      start = std::string_view::npos;
      i += w;
    } else {
      if (start == std::string_view::npos) start = i;
      ++i;
    }
  }
  if (start != std::string_view::npos) out.push_back(s.substr(start));
  return out;
}

}  // namespace

std::string tokenize_13a(std::string_view in) {
  std::string line(in);
  replace_all(line, "<skipped>", "");
  replace_all(line, "-\n", "");
  std::replace(line.begin(), line.end(), '\n', ' ');
  if (line.find('&') != std::string::npos) {
    replace_all(line, "&quot;", "\"");
    replace_all(line, "&amp;", "&");
    replace_all(line, "&lt;", "<");
    replace_all(line, "&gt;", ">");
  }
  line = " " + line + " ";
  // Each rule is one left-to-right, non-overlapping pass over the previous rule's output,
  // as Python's re.sub does.
  std::string a;  // 1: ([\{-\~\[-\` -\&\(-\+\:-\@\/]) -> " \1 "
  for (unsigned char c : line) {
    if (is_13a_punct(c)) a += ' ', a += static_cast<char>(c), a += ' ';
    else a += static_cast<char>(c);
  }
  std::string b;  // 2: ([^0-9])([\.,]) -> "\1 \2 "
  for (std::size_t i = 0; i < a.size();) {
    if (i + 1 < a.size() && !is_digit(a[i]) && (a[i + 1] == '.' || a[i + 1] == ',')) {
      b += a[i], b += ' ', b += a[i + 1], b += ' ';
      i += 2;
    } else {
      b += a[i++];
    }
  }
  std::string c;  // 3: ([\.,])([^0-9]) -> " \1 \2"
  for (std::size_t i = 0; i < b.size();) {
    if (i + 1 < b.size() && (b[i] == '.' || b[i] == ',') && !is_digit(b[i + 1])) {
      c += ' ', c += b[i], c += ' ', c += b[i + 1];
      i += 2;
    } else {
      c += b[i++];
    }
  }
  std::string d;  // 4: ([0-9])(-) -> "\1 \2 "
  for (std::size_t i = 0; i < c.size();) {
    if (i + 1 < c.size() && is_digit(c[i]) && c[i + 1] == '-') {
      d += c[i], d += ' ', d += '-', d += ' ';
      i += 2;
    } else {
      d += c[i++];
    }
  }
  std::string out;
  for (const auto& w : split_ws(d)) {
    if (!out.empty()) out += ' ';
    out += w;
  }
  return out;
}

std::string lowercase(std::string_view s) {
  std::string out(s);
  for (std::size_t i = 0; i < out.size(); ++i) {
    auto c = static_cast<unsigned char>(out[i]);
    if (c >= 'A' && c <= 'Z') {
      out[i] = static_cast<char>(c + 32);
    } else if (c == 0xc3 && i + 1 < out.size()) {
      // U+00C0..U+00DE (but not U+00D7, the multiplication sign) -> +0x20
      const auto n = static_cast<unsigned char>(out[i + 1]);
      if (n >= 0x80 && n <= 0x9e && n != 0x97) out[i + 1] = static_cast<char>(n + 0x20);
      ++i;
    }
  }
  return out;
}

BleuStats& BleuStats::operator+=(const BleuStats& o) {
  for (int n = 0; n < 4; ++n) correct[n] += o.correct[n], total[n] += o.total[n];
  sys_len += o.sys_len;
  ref_len += o.ref_len;
  return *this;
}

namespace {
using Ngrams = std::map<std::vector<std::string_view>, std::uint64_t>;
Ngrams count_ngrams(const std::vector<std::string_view>& w) {
  Ngrams m;
  for (std::size_t n = 1; n <= 4; ++n)
    for (std::size_t i = 0; i + n <= w.size(); ++i) ++m[std::vector<std::string_view>(w.begin() + i, w.begin() + i + n)];
  return m;
}
}  // namespace

BleuStats bleu_stats(std::string_view hyp, const std::vector<std::string_view>& refs) {
  if (refs.empty()) throw Error("BLEU: a hypothesis needs at least one reference");
  BleuStats s;
  const auto h = split_ws(hyp);
  s.sys_len = h.size();
  // Closest reference length; ties go to the shorter reference.
  std::size_t best = 0;
  long best_diff = -1;
  Ngrams ref_max;
  for (const auto& r : refs) {
    const auto w = split_ws(r);
    const long diff = std::labs(static_cast<long>(w.size()) - static_cast<long>(h.size()));
    if (best_diff < 0 || diff < best_diff || (diff == best_diff && w.size() < best)) best = w.size(), best_diff = diff;
    for (const auto& [g, c] : count_ngrams(w)) ref_max[g] = std::max(ref_max[g], c);
  }
  s.ref_len = best;
  for (const auto& [g, c] : count_ngrams(h)) {
    const auto it = ref_max.find(g);
    if (it != ref_max.end()) s.correct[g.size() - 1] += std::min(c, it->second);
  }
  for (std::size_t n = 1; n <= 4; ++n) s.total[n - 1] = h.size() >= n ? h.size() - n + 1 : 0;
  return s;
}

namespace {
constexpr EnumName<BleuTokenizer> kTokenizers[] = {{BleuTokenizer::t13a, "13a"}, {BleuTokenizer::none, "none"}};
constexpr EnumName<BleuSmoothing> kSmoothings[] = {
    {BleuSmoothing::exp, "exp"}, {BleuSmoothing::floor, "floor"}, {BleuSmoothing::add_k, "add-k"}, {BleuSmoothing::none, "none"}};
}  // namespace

std::string_view to_string(BleuTokenizer t) { return enum_name(kTokenizers, t); }
std::string_view to_string(BleuSmoothing s) { return enum_name(kSmoothings, s); }
BleuTokenizer parse_bleu_tokenizer(std::string_view name) { return enum_parse(kTokenizers, name, "BLEU tokenizer"); }
BleuSmoothing parse_bleu_smoothing(std::string_view name) { return enum_parse(kSmoothings, name, "BLEU smoothing"); }

BleuScore bleu_from_stats(const BleuStats& s, const BleuOptions& o, std::size_t nrefs) {
  BleuScore r;
  r.sys_len = s.sys_len;
  r.ref_len = s.ref_len;
  const double floor_v = o.smooth_value > 0 ? o.smooth_value : 0.1, k = o.smooth_value > 0 ? o.smooth_value : 1.0;
  double smooth_mteval = 1;
  int eff_order = 4;
  for (int n = 1; n <= 4; ++n) {
    std::uint64_t correct = s.correct[n - 1], total = s.total[n - 1];
    double c = static_cast<double>(correct), t = static_cast<double>(total);
    if (o.smooth == BleuSmoothing::add_k && n > 1) c += k, t += k;
    if (t == 0) break;
    if (o.effective_order) eff_order = n;
    if (c == 0) {
      if (o.smooth == BleuSmoothing::exp) {
        smooth_mteval *= 2;
        r.precisions[n - 1] = 100.0 / (smooth_mteval * t);
      } else if (o.smooth == BleuSmoothing::floor) {
        r.precisions[n - 1] = 100.0 * floor_v / t;
      }
    } else {
      r.precisions[n - 1] = 100.0 * c / t;
    }
  }
  r.ratio = s.ref_len > 0 ? static_cast<double>(s.sys_len) / static_cast<double>(s.ref_len) : 0;
  if (s.sys_len < s.ref_len) r.bp = s.sys_len > 0 ? std::exp(1.0 - static_cast<double>(s.ref_len) / static_cast<double>(s.sys_len)) : 0.0;
  else r.bp = 1.0;
  double logsum = 0;
  for (int n = 0; n < eff_order; ++n) logsum += r.precisions[n] > 0 ? std::log(r.precisions[n]) : -9999999999.0;
  r.score = r.bp * std::exp(logsum / eff_order);
  r.signature = "nrefs:" + std::to_string(nrefs) + "|case:" + (o.lowercase ? "lc" : "mixed") +
                "|eff:" + (o.effective_order ? "yes" : "no") + "|tok:" + std::string(to_string(o.tokenize)) +
                "|smooth:" + std::string(to_string(o.smooth)) + "|version:fp8lab";
  return r;
}

std::string BleuScore::text() const {
  char buf[256];
  std::snprintf(buf, sizeof buf, "BLEU = %.2f %.1f/%.1f/%.1f/%.1f (BP = %.3f ratio = %.3f hyp_len = %llu ref_len = %llu)",
                score, precisions[0], precisions[1], precisions[2], precisions[3], bp, ratio,
                static_cast<unsigned long long>(sys_len), static_cast<unsigned long long>(ref_len));
  return buf;
}

BleuScore corpus_bleu(const std::vector<std::string>& hyps, const std::vector<std::vector<std::string>>& refs,
                      const BleuOptions& o) {
  if (refs.empty()) throw Error("BLEU: no reference streams");
  for (std::size_t k = 0; k < refs.size(); ++k)
    if (refs[k].size() != hyps.size())
      throw Error("BLEU: reference stream " + std::to_string(k + 1) + " has " + std::to_string(refs[k].size()) +
                  " sentences but there are " + std::to_string(hyps.size()) + " hypotheses");
  auto prep = [&](const std::string& s) {
    std::string t = o.lowercase ? lowercase(s) : s;
    return o.tokenize == BleuTokenizer::t13a ? tokenize_13a(t) : t;
  };
  BleuStats total;
  for (std::size_t i = 0; i < hyps.size(); ++i) {
    const std::string h = prep(hyps[i]);
    std::vector<std::string> rs;
    for (const auto& stream : refs) rs.push_back(prep(stream[i]));
    std::vector<std::string_view> views(rs.begin(), rs.end());
    total += bleu_stats(h, views);
  }
  return bleu_from_stats(total, o, refs.size());
}

}  // namespace fp8lab::results
