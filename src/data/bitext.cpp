#include "fp8lab/data/bitext.hpp"

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "fp8lab/core/error.hpp"
#include "fp8lab/core/files.hpp"
#include "fp8lab/core/random.hpp"
#include "fp8lab/core/text.hpp"
#include "io.hpp"

namespace fp8lab::data {

namespace fs = std::filesystem;

namespace {
// Bump when preparation changes: a cached corpus of another version is rebuilt.
constexpr int kCorpusVersion = 1;
constexpr double kAgree = 0.5;      // fewer shared Strong's numbers than this: not a translation
constexpr double kNeighbour = 0.1;  // a neighbour agreeing this much better: shift evidence
}  // namespace

std::vector<ImpEntry> parse_imp(std::string_view text, const std::string& source) {
  std::vector<ImpEntry> out;
  bool in_verse = false, skipping = false;
  std::size_t line_no = 0, pos = 0;
  while (pos <= text.size()) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    ++line_no;
    pos = end + 1;
    if (line.rfind("$$$", 0) == 0) {
      const std::string_view key = line.substr(3);
      in_verse = false;
      skipping = true;
      if (!key.empty() && key.front() == '[') continue;  // module / testament heading
      const std::size_t sp = key.rfind(' '), colon = key.rfind(':');
      if (sp == std::string_view::npos || colon == std::string_view::npos || colon < sp)
        throw Error(source + ":" + std::to_string(line_no) + ": bad verse key '" + std::string(key) +
                    "' (expected $$$Book C:V)");
      int c = 0, v = 0;
      try {
        std::size_t u1 = 0, u2 = 0;
        const std::string cs(key.substr(sp + 1, colon - sp - 1)), vs(key.substr(colon + 1));
        c = std::stoi(cs, &u1);
        v = std::stoi(vs, &u2);
        if (u1 != cs.size() || u2 != vs.size() || c < 0 || v < 0) throw std::invalid_argument("");
      } catch (const std::exception&) {
        throw Error(source + ":" + std::to_string(line_no) + ": bad chapter:verse in '" + std::string(key) + "'");
      }
      if (c == 0 || v == 0) continue;  // book or chapter introduction
      out.push_back({std::string(key.substr(0, sp)), c, v, ""});
      in_verse = true;
      skipping = false;
      continue;
    }
    if (in_verse) {
      if (line.empty()) continue;
      if (!out.back().raw.empty()) out.back().raw += ' ';
      out.back().raw += line;
    } else if (!skipping && !line.empty()) {
      throw Error(source + ":" + std::to_string(line_no) + ": text before the first $$$ key (not mod2imp output?)");
    }
    if (end == text.size()) break;
  }
  return out;
}

namespace {

// Tag at text[i] == '<': name, closing?, self-closing?, attribute text, and the index after '>'.
struct Tag {
  std::string name, attrs;
  bool closing = false, self_closing = false;
  std::size_t end = 0;
};
Tag read_tag(std::string_view t, std::size_t i) {
  Tag g;
  const std::size_t close = t.find('>', i);
  if (close == std::string_view::npos) {
    g.end = t.size();
    return g;
  }
  std::string_view inner = t.substr(i + 1, close - i - 1);
  if (!inner.empty() && inner.front() == '/') g.closing = true, inner.remove_prefix(1);
  if (!inner.empty() && inner.back() == '/') g.self_closing = true, inner.remove_suffix(1);
  const std::size_t sp = inner.find_first_of(" \t");
  g.name = std::string(inner.substr(0, sp));
  if (sp != std::string_view::npos) g.attrs = std::string(inner.substr(sp + 1));
  g.end = close + 1;
  return g;
}

// Index after the element closing `name` at nesting depth 0, from i (just after its start tag).
std::size_t skip_element(std::string_view t, std::size_t i, const std::string& name) {
  int depth = 1;
  while (i < t.size()) {
    const std::size_t lt = t.find('<', i);
    if (lt == std::string_view::npos) return t.size();
    const Tag g = read_tag(t, lt);
    if (g.name == name && !g.self_closing) depth += g.closing ? -1 : 1;
    i = g.end;
    if (depth == 0) return i;
  }
  return t.size();
}

bool inline_tag(const std::string& n) {
  return n == "w" || n == "transChange" || n == "divineName" || n == "foreign" || n == "q" || n == "seg" ||
         n == "hi" || n == "rdg" || n == "catchWord";
}

}  // namespace

std::string strip_osis(std::string_view t) {
  std::string out;
  for (std::size_t i = 0; i < t.size();) {
    if (t[i] == '<') {
      const Tag g = read_tag(t, i);
      i = g.end;
      if (g.closing || g.self_closing) {
        if (!inline_tag(g.name)) out += ' ';
        continue;
      }
      if (g.name == "note") {
        i = skip_element(t, i, "note");
        out += ' ';
      } else if (g.name == "title" && g.attrs.find("canonical=\"true\"") == std::string::npos) {
        i = skip_element(t, i, "title");
        out += ' ';
      } else if (!inline_tag(g.name)) {
        out += ' ';
      }
      continue;
    }
    if (t[i] == '&') {
      static const std::array<std::pair<std::string_view, char>, 5> ents = {
          {{"&amp;", '&'}, {"&lt;", '<'}, {"&gt;", '>'}, {"&quot;", '"'}, {"&apos;", '\''}}};
      bool done = false;
      for (const auto& [e, c] : ents)
        if (t.substr(i, e.size()) == e) {
          out += c;
          i += e.size();
          done = true;
          break;
        }
      if (done) continue;
    }
    if (t.substr(i, 2) == "\xc2\xb6") {  // the pilcrow paragraph mark is typography, not text
      i += 2;
      continue;
    }
    out += t[i++];
  }
  // Collapse whitespace and trim; no space before punctuation that a removed tag separated.
  std::string r;
  bool space = false;
  for (char c : out) {
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      space = !r.empty();
      continue;
    }
    if (space && !(c == ',' || c == '.' || c == ';' || c == ':' || c == '!' || c == '?' || c == ')')) r += ' ';
    space = false;
    r += c;
  }
  return r;
}

std::vector<std::string> strongs_numbers(std::string_view raw) {
  std::vector<std::string> out;
  for (std::size_t p = raw.find("strong:"); p != std::string_view::npos; p = raw.find("strong:", p + 1)) {
    std::size_t i = p + 7;
    if (i >= raw.size() || (raw[i] != 'H' && raw[i] != 'G')) continue;
    const char kind = raw[i++];
    while (i < raw.size() && raw[i] == '0') ++i;
    const std::size_t b = i;
    while (i < raw.size() && raw[i] >= '0' && raw[i] <= '9') ++i;
    if (i > b) out.push_back(kind + std::string(raw.substr(b, i - b)));
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

double strongs_agreement(const std::vector<std::string>& a, const std::vector<std::string>& b) {
  if (a.empty() || b.empty()) return -1;
  std::vector<std::string> common;
  std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(common));
  return static_cast<double>(common.size()) / static_cast<double>(std::min(a.size(), b.size()));
}

std::vector<VersePair> align_verses(const std::vector<ImpEntry>& en, const std::vector<ImpEntry>& es,
                                    AlignReport* report) {
  AlignReport rep;
  std::map<std::string, const ImpEntry*> es_by_ref;
  for (const auto& e : es) es_by_ref[e.ref()] = &e;
  // Per verse of the English order that both modules have.
  struct V {
    const ImpEntry* en;
    const ImpEntry* es;
    std::string en_text, es_text;
    std::vector<std::string> en_s, es_s;
    bool empty = false, low = false, evidence = false, drop = false;
  };
  std::vector<V> vs;
  for (const auto& e : en) {
    auto it = es_by_ref.find(e.ref());
    if (it == es_by_ref.end()) continue;
    V v{&e, it->second, strip_osis(e.raw), strip_osis(it->second->raw), strongs_numbers(e.raw),
        strongs_numbers(it->second->raw)};
    v.empty = v.en_text.empty() || v.es_text.empty();
    vs.push_back(std::move(v));
  }
  rep.verses = vs.size();
  auto same_chapter = [&](std::size_t i, std::size_t j) {
    return vs[i].en->book == vs[j].en->book && vs[i].en->chapter == vs[j].en->chapter;
  };
  for (std::size_t i = 0; i < vs.size(); ++i) {
    V& v = vs[i];
    if (v.empty) continue;
    const double a0 = strongs_agreement(v.en_s, v.es_s);
    if (a0 < 0) continue;  // no numbers on a side: no evidence either way
    v.low = a0 < kAgree;
    double best = -1;
    for (std::size_t j : {i - 1, i + 1})
      if (j < vs.size() && same_chapter(i, j)) best = std::max(best, strongs_agreement(vs[j].en_s, v.es_s));
    v.evidence = v.low || best > a0 + kNeighbour;
  }
  // Shifted chapters: from the first evidence on, at least half of the (non-empty) verses
  // are evidence, and at least 3.
  for (std::size_t b = 0; b < vs.size();) {
    std::size_t e = b;
    while (e < vs.size() && same_chapter(b, e)) ++e;
    for (std::size_t i = b; i < e; ++i) {
      if (!vs[i].evidence) continue;
      std::size_t n = 0, ev = 0;
      for (std::size_t k = i; k < e; ++k)
        if (!vs[k].empty) ++n, ev += vs[k].evidence;
      if (ev >= 3 && 2 * ev >= n) {
        for (std::size_t k = i; k < e; ++k)
          if (!vs[k].empty) vs[k].drop = true, ++rep.shifted;
        rep.shifted_chapters.push_back(vs[i].en->book + " " + std::to_string(vs[i].en->chapter) + " (from " +
                                       std::to_string(vs[i].en->verse) + ")");
      }
      break;
    }
    b = e;
  }
  std::vector<VersePair> out;
  for (auto& v : vs) {
    if (v.empty) {
      ++rep.empty;
      continue;
    }
    if (v.drop) continue;
    if (v.low) {
      ++rep.disagreeing;
      continue;
    }
    out.push_back({v.en->ref(), v.en_text, v.es_text});
  }
  rep.pairs = out.size();
  if (report) *report = rep;
  return out;
}

std::string split_of(const std::string& ref, int dev_percent, int test_percent) {
  const auto bucket = static_cast<int>(mix64(fnv1a(kFnvBasis, ref.data(), ref.size())) % 100);
  if (bucket < dev_percent) return "dev";
  if (bucket < dev_percent + test_percent) return "test";
  return "train";
}

namespace {

std::string run_mod2imp(const std::string& module) {
  if (std::system("command -v mod2imp >/dev/null 2>&1") != 0)
    throw Error("mod2imp not found: install Debian's libsword-utils (and sword-text-kjv, sword-text-sparv)");
  const std::string cmd = "mod2imp '" + module + "' 2>&1";
  std::unique_ptr<FILE, int (*)(FILE*)> p(popen(cmd.c_str(), "r"), pclose);
  if (!p) throw Error("cannot run mod2imp");
  std::string out;
  char buf[1 << 16];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p.get())) > 0) out.append(buf, n);
  if (out.find("Couldn't find module") != std::string::npos || out.rfind("$$$", 0) != 0)
    throw Error("SWORD module '" + module + "' not found: install Debian's " +
                (module.rfind("eng", 0) == 0 ? std::string("sword-text-kjv") : std::string("sword-text-sparv")));
  return out;
}

void write_text(const fs::path& p, const std::string& s) { write_file_atomic(p.string(), s.data(), s.size()); }

// The report of a corpus built before in `d` for these modules, or nullopt where there is none
// to reuse: no report.json, one of another version or modules, one that is not what fp8lab
// writes (edited, damaged: the corpus is built again), or a split file missing. A report.json
// that is not a regular file (a folder, a FIFO) is refused by read_file, never waited on.
std::optional<AlignReport> cached_report(const fs::path& d, const std::string& en_module, const std::string& es_module) {
  const fs::path rep_path = d / "report.json";
  if (!fs::exists(rep_path)) return std::nullopt;
  const auto j = nlohmann::json::parse(read_file(rep_path.string()), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return std::nullopt;
  auto text = [&](const char* k) { return j.contains(k) && j[k].is_string() ? j[k].get<std::string>() : std::string(); };
  auto count = [&](const char* k) -> std::optional<std::size_t> {
    if (!j.contains(k) || !j[k].is_number_unsigned()) return std::nullopt;
    return j[k].get<std::size_t>();
  };
  if (!j.contains("version") || j["version"] != kCorpusVersion || text("en_module") != en_module ||
      text("es_module") != es_module)
    return std::nullopt;
  for (const char* s : {"train", "dev", "test"})
    for (const char* e : {".en", ".es", ".ref"})
      if (!fs::exists(d / (std::string(s) + e))) return std::nullopt;
  AlignReport r;
  const auto verses = count("verses"), empty = count("empty"), disagreeing = count("disagreeing"),
             shifted = count("shifted"), pairs = count("pairs");
  if (!verses || !empty || !disagreeing || !shifted || !pairs || !j.contains("shifted_chapters") ||
      !j["shifted_chapters"].is_array())
    return std::nullopt;
  for (const auto& c : j["shifted_chapters"]) {
    if (!c.is_string()) return std::nullopt;
    r.shifted_chapters.push_back(c.get<std::string>());
  }
  r.verses = *verses, r.empty = *empty, r.disagreeing = *disagreeing, r.shifted = *shifted, r.pairs = *pairs;
  return r;
}

}  // namespace

CorpusFiles prepare_bible_corpus(const std::string& dir, const std::string& en_module, const std::string& es_module) {
  CorpusFiles files;
  files.dir = dir;
  const fs::path d(dir), rep_path = d / "report.json";
  if (auto cached = cached_report(d, en_module, es_module)) {
    files.report = std::move(*cached);
    return files;
  }
  const auto en = parse_imp(run_mod2imp(en_module), "mod2imp " + en_module);
  const auto es = parse_imp(run_mod2imp(es_module), "mod2imp " + es_module);
  const auto pairs = align_verses(en, es, &files.report);
  make_folder(d.string());
  std::map<std::string, std::array<std::string, 3>> parts;
  for (const auto& p : pairs) {
    auto& f = parts[split_of(p.ref)];
    f[0] += p.en + "\n";
    f[1] += p.es + "\n";
    f[2] += p.ref + "\n";
  }
  for (const char* s : {"train", "dev", "test"}) {
    write_text(d / (std::string(s) + ".en"), parts[s][0]);
    write_text(d / (std::string(s) + ".es"), parts[s][1]);
    write_text(d / (std::string(s) + ".ref"), parts[s][2]);
  }
  const auto& r = files.report;
  const nlohmann::json j = {{"version", kCorpusVersion}, {"en_module", en_module}, {"es_module", es_module},
                            {"verses", r.verses}, {"empty", r.empty}, {"disagreeing", r.disagreeing},
                            {"shifted", r.shifted}, {"pairs", r.pairs}, {"shifted_chapters", r.shifted_chapters}};
  write_text(rep_path, j.dump(2) + "\n");  // last: its presence marks a complete corpus
  return files;
}

std::vector<std::string> parse_lines(std::string_view text, const std::string& path) {
  std::vector<std::string> lines;
  for (std::size_t offset = 0; offset < text.size();) {
    const std::size_t nl = std::min(text.find('\n', offset), text.size());
    std::string_view l = text.substr(offset, nl - offset);
    if (!l.empty() && l.back() == '\r') l.remove_suffix(1);
    const std::string at = path + ":" + std::to_string(lines.size() + 1) + ": ";
    if (l.empty()) throw Error(at + "empty line (offset " + std::to_string(offset) + ")");
    if (!valid_utf8(l)) throw Error(at + "invalid UTF-8 (offset " + std::to_string(offset) + ")");
    lines.emplace_back(l);
    offset = nl + 1;
  }
  return lines;
}

std::pair<std::vector<std::string>, std::vector<std::string>> read_bitext(const std::string& prefix,
                                                                            const std::string& src,
                                                                            const std::string& tgt) {
  const std::string a = prefix + "." + src, b = prefix + "." + tgt;
  auto x = parse_lines(read_file(a), a), y = parse_lines(read_file(b), b);
  if (x.size() != y.size())
    throw Error(a + " has " + std::to_string(x.size()) + " lines but " + b + " has " + std::to_string(y.size()));
  return {std::move(x), std::move(y)};
}

}  // namespace fp8lab::data
