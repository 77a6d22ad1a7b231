// Sweep files: parsing, grid expansion and the runs' configs (everything up to running
// them, which is sweep.cpp). Needs no layer below experiments but config.cpp: each run's
// config is checked by the ConfigCheck the caller gives (validate by default).
#include "fp8lab/core/toml_parse.hpp"
#include "fp8lab/core/text.hpp"
#include "fp8lab/study/sweep.hpp"
#include "fp8lab/results/store.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "fp8lab/core/enum_names.hpp"
#include "fp8lab/core/files.hpp"
#include "fp8lab/core/format.hpp"

namespace fp8lab::study {

namespace fs = std::filesystem;

namespace {

std::string where(const std::string& source, const toml::node& n) { return at_line(source, n.source().begin.line); }

// The text of a TOML scalar as a label and as a value for `--set`.
struct Value {
  std::string text;  // label form: strings raw, numbers as written
  std::string toml;  // TOML form: strings quoted
};

std::string quote(const std::string& s) {
  std::ostringstream o;
  o << toml::value<std::string>(s);
  return o.str();
}

Value scalar(const toml::node& n, const std::string& what, const std::string& source) {
  if (auto s = n.value_exact<std::string>()) return {*s, quote(*s)};
  if (auto i = n.value_exact<std::int64_t>()) return {std::to_string(*i), std::to_string(*i)};
  if (auto b = n.value_exact<bool>()) return {*b ? "true" : "false", *b ? "true" : "false"};
  if (auto d = n.value_exact<double>()) {
    const std::string t = shortest_float(*d);
    return {t, t};
  }
  throw Error(where(source, n) + what + ": expected a string, number or boolean");
}

// A variable's values: an array of scalars, a {from, to, step} range, or one scalar.
std::vector<Value> values_of(const toml::node& n, const std::string& name, const std::string& source) {
  std::vector<Value> out;
  if (const auto* a = n.as_array()) {
    for (const auto& e : *a) out.push_back(scalar(e, "variable '" + name + "'", source));
    if (out.empty()) throw Error(where(source, n) + "variable '" + name + "' has no values");
    return out;
  }
  if (const auto* t = n.as_table()) {
    for (const auto& [k, v] : *t)
      if (k != "from" && k != "to" && k != "step")
        throw Error(where(source, v) + "variable '" + name + "': unknown range key '" +
                    std::string(k.str()) + "' (expected from, to, step)");
    auto num = [&](const char* k, std::optional<double> dflt) -> double {
      const toml::node* v = t->get(k);
      if (!v) {
        if (dflt) return *dflt;
        throw Error(where(source, n) + "variable '" + name + "': range needs '" + k + "'");
      }
      if (auto d = v->value<double>()) return *d;
      throw Error(where(source, *v) + "variable '" + name + "': '" + k + "' must be a number");
    };
    const double from = num("from", std::nullopt), to = num("to", std::nullopt), step = num("step", 1.0);
    if (!std::isfinite(from) || !std::isfinite(to) || !std::isfinite(step))
      throw Error(where(source, n) + "variable '" + name + "': range ends and step must be finite numbers (got from = " +
                  shortest_float(from) + ", to = " + shortest_float(to) + ", step = " + shortest_float(step) + ")");
    if (!(step > 0) || to < from)
      throw Error(where(source, n) + "variable '" + name + "': range needs from <= to and step > 0");
    const bool integral = t->get("from")->is_integer() && t->get("to")->is_integer() &&
                          (!t->get("step") || t->get("step")->is_integer());
    const double values = std::floor((to - from) / step + 1e-9) + 1;  // Inf where the quotient overflows
    if (!(values <= 100000)) throw Error(where(source, n) + "variable '" + name + "': range has over 100000 values");
    const auto count = static_cast<std::int64_t>(values);
    for (std::int64_t i = 0; i < count; ++i) {
      const double v = from + static_cast<double>(i) * step;
      if (integral) {
        const auto iv = static_cast<std::int64_t>(std::llround(v));
        out.push_back({std::to_string(iv), std::to_string(iv)});
      } else {
        out.push_back({shortest_float(v), shortest_float(v)});
      }
    }
    return out;
  }
  out.push_back(scalar(n, "variable '" + name + "'", source));
  return out;
}

// "{var}" replaced by the variable's text; "{{" and "}}" are literal braces.
std::string substitute(const std::string& tmpl, const std::map<std::string, std::string>& vars,
                       const std::string& what) {
  std::string out;
  for (std::size_t i = 0; i < tmpl.size(); ++i) {
    const char c = tmpl[i];
    if (c == '{' && i + 1 < tmpl.size() && tmpl[i + 1] == '{') { out += '{'; ++i; continue; }
    if (c == '}' && i + 1 < tmpl.size() && tmpl[i + 1] == '}') { out += '}'; ++i; continue; }
    if (c == '{') {
      const std::size_t end = tmpl.find('}', i);
      if (end == std::string::npos) throw Error(what + ": unclosed '{' in \"" + tmpl + "\"");
      const std::string name = tmpl.substr(i + 1, end - i - 1);
      auto it = vars.find(name);
      if (it == vars.end()) throw Error(what + ": \"" + tmpl + "\" uses {" + name + "}, which is not a variable of this grid");
      out += it->second;
      i = end;
      continue;
    }
    out += c;
  }
  return out;
}

bool is_number(const std::string& s) {
  if (s.empty()) return false;
  try {
    return parse_toml("v = " + s, "value").get("v")->is_number();
  } catch (const Error&) {
    return false;
  }
}

// Each plot type with its name in sweep files, in the order the docs list them.
constexpr EnumName<PlotType> kPlotTypes[] = {
    {PlotType::metric, "metric"},         {PlotType::heatmap, "heatmap"},
    {PlotType::loss_scale, "loss-scale"}, {PlotType::histograms, "histograms"},
    {PlotType::fixed_point_snr, "fixed-point-snr"}, {PlotType::points, "points"},
    {PlotType::block_stats, "block-stats"}, {PlotType::curve, "curve"},
};

}  // namespace

std::string_view to_string(PlotType t) { return enum_name(kPlotTypes, t); }

PlotType parse_plot_type(std::string_view text) { return enum_parse(kPlotTypes, text, "plot type"); }

std::string SweepPoint::label() const {
  std::string s;
  for (const auto& [k, v] : vars) s += (s.empty() ? "" : ", ") + k + "=" + v;
  return s.empty() ? "(base)" : s;
}
std::string SweepPoint::var(const std::string& name) const {
  for (const auto& [k, v] : vars)
    if (k == name) return v;
  return "";
}

std::string identity_of(const std::string& config_json) { return results::config_identity(config_json); }

namespace {

// What the top level of a sweep file holds besides the Sweep's own fields.
struct SweepFile {
  std::string baseline;                  // "variable=value, ..."
  std::vector<const toml::table*> grids;
};

std::string string_of(const toml::node& v, const std::string& source, const std::string& what) {
  if (auto x = v.value_exact<std::string>()) return *x;
  throw Error(where(source, v) + what);
}

std::vector<std::uint64_t> seeds_of(const toml::node& v, const std::string& source) {
  std::vector<std::uint64_t> seeds;
  if (auto n = v.value_exact<std::int64_t>()) {
    if (*n < 1 || *n > 1000) throw Error(where(source, v) + "'seeds' must be 1..1000");
    for (std::int64_t i = 1; i <= *n; ++i) seeds.push_back(static_cast<std::uint64_t>(i));
    return seeds;
  }
  const auto* a = v.as_array();
  if (!a) throw Error(where(source, v) + "'seeds' must be a count or an array of integers");
  for (const auto& e : *a) {
    auto x = e.value_exact<std::int64_t>();
    if (!x || *x < 0) throw Error(where(source, e) + "'seeds' must hold non-negative integers");
    if (std::find(seeds.begin(), seeds.end(), static_cast<std::uint64_t>(*x)) != seeds.end())
      throw Error(where(source, e) + "seed " + std::to_string(*x) + " is given twice");
    seeds.push_back(static_cast<std::uint64_t>(*x));
  }
  if (seeds.empty()) throw Error(where(source, v) + "'seeds' is empty: a sweep needs at least one seed");
  return seeds;
}

std::vector<std::string> strings_of(const toml::node& v, const std::string& source, const std::string& what) {
  std::vector<std::string> out;
  const auto* arr = v.as_array();
  if (!arr) throw Error(where(source, v) + what + " must be an array of strings");
  for (const auto& e : *arr) {
    auto x = e.value_exact<std::string>();
    if (!x) throw Error(where(source, e) + what + " must hold strings");
    out.push_back(*x);
  }
  return out;
}

void set_plot_key(PlotSpec& p, const std::string& key, const toml::node& v, const std::string& source) {
  const std::string what = "plot '" + key + "'";
  if (key == "type") {
    try {
      p.type = parse_plot_type(string_of(v, source, what + " must be a string"));
    } catch (const Error& e) {
      throw Error(where(source, v) + e.what());
    }
  }
  else if (key == "title") p.title = string_of(v, source, what + " must be a string");
  else if (key == "x") p.x = string_of(v, source, what + " must be a string");
  else if (key == "y") p.y = string_of(v, source, what + " must be a string");
  else if (key == "series") p.series = string_of(v, source, what + " must be a string");
  else if (key == "file") {
    p.file = string_of(v, source, what + " must be a string");
    try {
      check_file_name(p.file, "plot 'file'");  // written inside the report's folder, nowhere else
    } catch (const Error& e) {
      throw Error(where(source, v) + e.what());
    }
  }
  else if (key == "formats") p.formats = strings_of(v, source, what);
  else if (key == "kinds") p.kinds = strings_of(v, source, what);
  else if (key == "layers") p.layers = strings_of(v, source, what);
  else if (key == "metric") p.metric = string_of(v, source, what + " must be a string (a logged metric)");
  else if (key == "where") {
    const auto* wt = v.as_table();
    if (!wt) throw Error(where(source, v) + "plot 'where' must be a table of variable = value");
    for (const auto& [wk, wv] : *wt) p.where[std::string(wk.str())] = scalar(wv, "where", source).text;
  } else {
    throw Error(where(source, v) + "unknown plot key '" + key +
                "' (expected type, title, x, y, series, file, where, formats, kinds, layers, metric)");
  }
}

void check_plot(const PlotSpec& p, const toml::node& at, const std::string& source) {
  const std::string type(to_string(p.type));
  if (p.type == PlotType::curve && p.metric.empty())
    throw Error(where(source, at) + "curve plot needs 'metric' (a metric the runs log during training, e.g. dev_bleu)");
  if (!p.metric.empty() && p.type != PlotType::curve)
    throw Error(where(source, at) + "'metric' is a key of curve plots, not of " + type);
  if ((p.type == PlotType::metric || p.type == PlotType::heatmap) && p.x.empty())
    throw Error(where(source, at) + type + " plot needs 'x' (a variable)");
  if (p.type == PlotType::heatmap && p.y.empty()) throw Error(where(source, at) + "heatmap plot needs 'y' (a variable)");
  if (!p.layers.empty() && p.type != PlotType::histograms)
    throw Error(where(source, at) + "'layers' is a key of histograms plots, not of " + type);
  for (const auto& l : p.layers)
    if (l.empty()) throw Error(where(source, at) + "plot layers: an empty pattern");
  for (const auto& f : p.formats) {
    try {
      (void)parse_format(f);
    } catch (const Error& e) {
      throw Error(where(source, at) + "plot formats: " + e.what());
    }
  }
}

// The [[plot]] tables, in file order; a plot without a file name gets "plotN-<type>".
std::vector<PlotSpec> plots_of(const toml::node& v, const std::string& source) {
  const auto* a = v.as_array();
  if (!a) throw Error(where(source, v) + "'plot' must be an array of tables ([[plot]])");
  std::vector<PlotSpec> plots;
  for (const auto& pn : *a) {
    const auto* t = pn.as_table();
    if (!t) throw Error(where(source, pn) + "each [[plot]] must be a table");
    if (!t->contains("type"))
      throw Error(where(source, pn) + "a [[plot]] needs 'type' (" + enum_names(kPlotTypes) + ")");
    PlotSpec p;
    for (const auto& [pk, pv] : *t) set_plot_key(p, std::string(pk.str()), pv, source);
    check_plot(p, pn, source);
    if (p.file.empty()) p.file = "plot" + std::to_string(plots.size() + 1) + "-" + std::string(to_string(p.type));
    plots.push_back(std::move(p));
  }
  return plots;
}

std::vector<const toml::table*> grids_of(const toml::node& v, const std::string& source) {
  const auto* a = v.as_array();
  if (!a) throw Error(where(source, v) + "'grid' must be an array of tables ([[grid]])");
  std::vector<const toml::table*> grids;
  for (const auto& g : *a) {
    if (!g.is_table()) throw Error(where(source, g) + "each [[grid]] must be a table");
    if (g.as_table()->empty()) throw Error(where(source, g) + "a [[grid]] with nothing in it");
    grids.push_back(g.as_table());
  }
  if (grids.empty()) throw Error(where(source, v) + "'grid' is empty (leave it out for one point)");
  return grids;
}

// The top-level keys of a sweep file, each read into `s` or `f`.
using TopKeyReader = void (*)(Sweep& s, SweepFile& f, const toml::node& v, const std::string& source,
                              const std::string& base_dir);
struct TopKey {
  std::string_view name;
  TopKeyReader read;
};
// A path given relative to the sweep file.
std::string beside(const std::string& base_dir, const std::string& path) {
  return (fs::path(base_dir) / path).lexically_normal().string();
}
constexpr TopKey kTopKeys[] = {
    {"name", [](Sweep& s, SweepFile&, const toml::node& v, const std::string& source, const std::string&) {
       s.name = string_of(v, source, "'name' must be a string");
     }},
    {"base", [](Sweep& s, SweepFile&, const toml::node& v, const std::string& source, const std::string& base_dir) {
       s.base = beside(base_dir, string_of(v, source, "'base' must be a string (a config file)"));
     }},
    {"seeds", [](Sweep& s, SweepFile&, const toml::node& v, const std::string& source, const std::string&) {
       s.seeds = seeds_of(v, source);
     }},
    {"baseline", [](Sweep&, SweepFile& f, const toml::node& v, const std::string& source, const std::string&) {
       f.baseline = string_of(v, source, "'baseline' must be a string like \"recipe=fp32\"");
     }},
    {"metric", [](Sweep& s, SweepFile&, const toml::node& v, const std::string& source, const std::string&) {
       s.metric = string_of(v, source, "'metric' must be a string");
     }},
    {"also", [](Sweep& s, SweepFile&, const toml::node& v, const std::string& source, const std::string&) {
       s.also = strings_of(v, source, "'also'");
     }},
    {"better", [](Sweep& s, SweepFile&, const toml::node& v, const std::string& source, const std::string&) {
       auto x = v.value_exact<std::string>();
       if (!x || (*x != "higher" && *x != "lower")) throw Error(where(source, v) + "'better' must be \"higher\" or \"lower\"");
       s.better = *x;
     }},
    {"page", [](Sweep& s, SweepFile&, const toml::node& v, const std::string& source, const std::string& base_dir) {
       const std::string p = string_of(v, source, "'page' must be a string (a Markdown template)");
       if (p.empty()) throw Error(where(source, v) + "'page' is empty");
       s.page = beside(base_dir, p);
     }},
    {"set", [](Sweep& s, SweepFile&, const toml::node& v, const std::string& source, const std::string&) {
       const auto* t = v.as_table();
       if (!t) throw Error(where(source, v) + "'set' must be a table of config keys");
       for (const auto& [ck, cv] : *t)
         s.set.push_back(std::string(ck.str()) + "=" + scalar(cv, "[set] " + std::string(ck.str()), source).toml);
     }},
    {"grid", [](Sweep&, SweepFile& f, const toml::node& v, const std::string& source, const std::string&) {
       f.grids = grids_of(v, source);
     }},
    {"plot", [](Sweep& s, SweepFile&, const toml::node& v, const std::string& source, const std::string&) {
       s.plots = plots_of(v, source);
     }},
};

void read_top_key(Sweep& s, SweepFile& f, const std::string& key, const toml::node& v, const std::string& source,
                  const std::string& base_dir) {
  for (const TopKey& k : kTopKeys)
    if (k.name == key) return k.read(s, f, v, source, base_dir);
  std::string expected;
  for (const TopKey& k : kTopKeys) expected += (expected.empty() ? "" : ", ") + std::string(k.name);
  throw Error(where(source, v) + "unknown key '" + key + "' (expected " + expected + ")");
}

// A grid's variables (with their values) and its config keys (set from a value or a
// template; nullptr: an array-valued key, which is also the variable of the same name).
struct Grid {
  std::vector<std::pair<std::string, std::vector<Value>>> vars;
  std::vector<std::pair<std::string, const toml::node*>> keys;
  std::vector<std::uint64_t> seeds;  // `seeds` in the grid: its points' seeds instead of the sweep's
  std::size_t size() const {
    std::size_t n = 1;
    for (const auto& [name, vals] : vars) n *= vals.size();
    return n;
  }
};

Grid grid_of(const toml::table& g, const std::string& source) {
  // toml++ orders a table's keys by name; the grid's order is the file's.
  struct Entry {
    std::string key;
    const toml::node* node;
    toml::source_position at;
  };
  std::vector<Entry> entries;
  for (const auto& [k, v] : g) entries.push_back({std::string(k.str()), &v, k.source().begin});
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.at.line != b.at.line ? a.at.line < b.at.line : a.at.column < b.at.column;
  });
  Grid grid;
  for (const auto& [key, node, at] : entries) {
    const toml::node& v = *node;
    if (key == "seeds") {
      grid.seeds = seeds_of(v, source);
      continue;
    }
    const bool config_key = key.find('.') != std::string::npos || key == "seed" || key == "name" || key == "task";
    if (key == "seed" || key == "name") throw Error(where(source, v) + "'" + key + "' is set by the sweep (use 'seeds')");
    if (config_key && !v.is_array()) grid.keys.emplace_back(key, &v);
    else grid.vars.emplace_back(key, values_of(v, key, source));
    if (config_key && v.is_array()) grid.keys.emplace_back(key, nullptr);
  }
  if (grid.size() > 100000) throw Error(where(source, g) + "grid has over 100000 points");
  return grid;
}

// Point `c` of the grid: the c-th combination of its variables' values, the last variable
// varying fastest, and the config keys it sets.
SweepPoint point_of(const Grid& grid, std::size_t c, const std::string& source) {
  SweepPoint p;
  p.seeds = grid.seeds;
  std::vector<std::size_t> idx(grid.vars.size());
  for (std::size_t i = grid.vars.size(); i-- > 0;) {
    idx[i] = c % grid.vars[i].second.size();
    c /= grid.vars[i].second.size();
  }
  std::map<std::string, std::string> env;
  for (std::size_t i = 0; i < grid.vars.size(); ++i) {
    p.vars.emplace_back(grid.vars[i].first, grid.vars[i].second[idx[i]].text);
    env[grid.vars[i].first] = grid.vars[i].second[idx[i]].text;
  }
  for (const auto& [key, node] : grid.keys) {
    if (!node) {
      for (std::size_t i = 0; i < grid.vars.size(); ++i)
        if (grid.vars[i].first == key) p.sets.push_back(key + "=" + grid.vars[i].second[idx[i]].toml);
      continue;
    }
    if (auto str = node->value_exact<std::string>()) {
      const std::string v = substitute(*str, env, where(source, *node) + "'" + key + "'");
      p.sets.push_back(key + "=" + (is_number(v) || v == "true" || v == "false" ? v : quote(v)));
    } else {
      p.sets.push_back(key + "=" + scalar(*node, key, source).toml);
    }
  }
  return p;
}

// Every grid expanded into points (the product of its variables); no grid: one point.
void expand_grids(Sweep& s, const std::vector<const toml::table*>& grids, const std::string& source) {
  if (grids.empty()) s.points.push_back({});
  for (const toml::table* g : grids) {
    const Grid grid = grid_of(*g, source);
    for (std::size_t c = 0; c < grid.size(); ++c) s.points.push_back(point_of(grid, c, source));
    for (const auto& [n, vals] : grid.vars)
      if (std::find(s.variables.begin(), s.variables.end(), n) == s.variables.end()) s.variables.push_back(n);
  }
}

// The index of the first point whose variables match "variable=value, ...".
int baseline_point(const Sweep& s, const std::string& baseline, const std::string& source) {
  std::map<std::string, std::string> want;
  for (const std::string_view part : split(baseline, ',')) {
    if (trim(part).empty()) continue;
    const std::optional<KeyValue> kv = key_value(part);
    if (!kv) throw Error(source + ": baseline \"" + baseline + "\": expected variable=value[, ...]");
    want[std::string(trim(kv->key))] = std::string(trim(kv->value));
  }
  for (std::size_t i = 0; i < s.points.size(); ++i) {
    bool ok = true;
    for (const auto& [k, v] : want) ok = ok && s.points[i].var(k) == v;
    if (ok) return static_cast<int>(i);
  }
  throw Error(source + ": baseline \"" + baseline + "\" matches no point of the grid");
}

void check_plot_variables(const Sweep& s, const std::string& source) {
  for (const auto& p : s.plots)
    for (const std::string* v : {&p.x, &p.y, &p.series})
      if (!v->empty() && std::find(s.variables.begin(), s.variables.end(), *v) == s.variables.end())
        throw Error(source + ": plot '" + p.file + "' uses variable '" + *v + "', which no grid defines");
}

// The run of point `pi` and `seed`, its config built and checked now (recipe and loss
// scaling included): a bad value is an error before anything runs.
SweepRun run_of(const Sweep& s, const std::string& base_text, std::size_t pi, std::uint64_t seed,
                const std::string& source, ConfigCheck check) {
  std::vector<std::string> ov = s.set;
  ov.insert(ov.end(), s.points[pi].sets.begin(), s.points[pi].sets.end());
  ov.push_back("name=" + quote(s.name));
  ov.push_back("seed=" + std::to_string(seed));
  SweepRun r;
  r.point = static_cast<int>(pi);
  r.seed = seed;
  try {
    r.cfg = settings::read_train_config(base_text, s.base.empty() ? "(defaults)" : s.base, ov);
    check(r.cfg);
  } catch (const Error& e) {
    throw Error(source + ": point " + s.points[pi].label() + ": " + e.what());
  }
  r.cfg.train.checkpoint.clear();
  r.identity = identity_of(to_json(r.cfg));
  r.key = hex64(fnv1a(kFnvBasis, r.identity.data(), r.identity.size()));
  return r;
}

// Two points that train the same config (the same values given twice, or two grids that
// overlap, for a seed both have) would be one run counted twice: refused, naming both points.
void refuse_duplicate_runs(const Sweep& s, const std::string& source) {
  std::map<std::string, int> first;  // config identity (the seed included) -> point
  for (const auto& r : s.runs) {
    const auto [it, fresh] = first.emplace(r.identity, r.point);
    if (!fresh)
      throw Error(source + ": points " + s.points[static_cast<std::size_t>(it->second)].label() + " and " +
                  s.points[static_cast<std::size_t>(r.point)].label() + " train the same config");
  }
}

}  // namespace

Sweep parse_sweep(const std::string& text, const std::string& source, const std::string& base_dir,
                  ConfigCheck check) {
  const toml::table root = parse_toml(text, source);
  Sweep s;
  s.source = source;
  SweepFile f;
  for (const auto& [k, v] : root) read_top_key(s, f, std::string(k.str()), v, source, base_dir);
  if (s.name.empty()) throw Error(source + ": the sweep needs a 'name'");
  try {
    check_file_name(s.name, "sweep name");  // runs/<name>, the report's folder
  } catch (const Error& e) {
    throw Error(source + ": " + e.what());
  }
  if (s.seeds.empty()) s.seeds.push_back(1);
  for (const auto& m : s.also) {
    if (m.empty() || m == s.metric)
      throw Error(source + ": 'also' names " + (m.empty() ? "an empty metric" : "the main metric '" + m + "'"));
    check_file_name("table-" + m, source + ": 'also' metric (the report writes table-<metric>.md)");
  }
  expand_grids(s, f.grids, source);
  if (!f.baseline.empty()) s.baseline = baseline_point(s, f.baseline, source);
  check_plot_variables(s, source);
  const std::string base_text = s.base.empty() ? std::string() : read_file(s.base);
  for (std::size_t pi = 0; pi < s.points.size(); ++pi)
    for (std::uint64_t seed : s.points[pi].seeds.empty() ? s.seeds : s.points[pi].seeds)
      s.runs.push_back(run_of(s, base_text, pi, seed, source, check));
  refuse_duplicate_runs(s, source);
  return s;
}


}  // namespace fp8lab::study
