#include "fp8lab/core/text.hpp"
#include "fp8lab/experiments/sweep.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <toml++/toml.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "fp8lab/core/format.hpp"
#include "fp8lab/core/files.hpp"
#include "fp8lab/experiments/progress.hpp"
#include "fp8lab/experiments/trainer.hpp"
#include "fp8lab/nn/loss_scale.hpp"
#include "fp8lab/nn/recipe.hpp"

extern char** environ;

namespace fp8lab::experiments {

namespace fs = std::filesystem;

namespace {

std::string where(const std::string& source, const toml::node& n) {
  const auto& b = n.source().begin;
  return source + ":" + std::to_string(b.line) + ": ";
}

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

// The shortest text that reads back to the same double, always with a '.' or exponent
// (so that TOML reads it as a float): 0.1, 2.0, 1e-05.
std::string shortest(double v) {
  if (!std::isfinite(v)) return v > 0 ? "inf" : v < 0 ? "-inf" : "nan";
  char b[64];
  auto r = std::to_chars(b, b + sizeof b, v);
  std::string t(b, r.ptr);
  if (t.find_first_of(".eE") == std::string::npos) t += ".0";
  return t;
}

Value scalar(const toml::node& n, const std::string& what, const std::string& source) {
  if (auto s = n.value_exact<std::string>()) return {*s, quote(*s)};
  if (auto i = n.value_exact<std::int64_t>()) return {std::to_string(*i), std::to_string(*i)};
  if (auto b = n.value_exact<bool>()) return {*b ? "true" : "false", *b ? "true" : "false"};
  if (auto d = n.value_exact<double>()) {
    const std::string t = shortest(*d);
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
    if (!(step > 0) || to < from)
      throw Error(where(source, n) + "variable '" + name + "': range needs from <= to and step > 0");
    const bool integral = t->get("from")->is_integer() && t->get("to")->is_integer() &&
                          (!t->get("step") || t->get("step")->is_integer());
    const auto count = static_cast<std::int64_t>(std::floor((to - from) / step + 1e-9)) + 1;
    if (count > 100000) throw Error(where(source, n) + "variable '" + name + "': range has over 100000 values");
    for (std::int64_t i = 0; i < count; ++i) {
      const double v = from + static_cast<double>(i) * step;
      if (integral) {
        const auto iv = static_cast<std::int64_t>(std::llround(v));
        out.push_back({std::to_string(iv), std::to_string(iv)});
      } else {
        out.push_back({shortest(v), shortest(v)});
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
    auto t = toml::parse("v = " + s);
    return t.get("v")->is_number();
  } catch (const toml::parse_error&) {
    return false;
  }
}

std::string fmt2(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f", v);
  return b;
}

std::string hex16(std::uint64_t h) {
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(h));
  return b;
}

}  // namespace

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

std::string identity_of(const std::string& config_json) {
  nlohmann::json j = nlohmann::json::parse(config_json, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return config_json;
  j.erase("threads");
  if (j.contains("train") && j["train"].is_object()) j["train"].erase("checkpoint");
  return j.dump();
}

Sweep parse_sweep(const std::string& text, const std::string& source, const std::string& base_dir) {
  toml::table root;
  try {
    root = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    throw Error(at_line(source, e.source().begin.line) + std::string(e.description()));
  }
  Sweep s;
  s.source = source;
  std::string baseline;
  std::vector<const toml::table*> grids;
  for (const auto& [k, v] : root) {
    const std::string key(k.str());
    if (key == "name") {
      if (auto x = v.value_exact<std::string>()) s.name = *x;
      else throw Error(where(source, v) + "'name' must be a string");
    } else if (key == "base") {
      if (auto x = v.value_exact<std::string>()) s.base = (fs::path(base_dir) / *x).lexically_normal().string();
      else throw Error(where(source, v) + "'base' must be a string (a config file)");
    } else if (key == "seeds") {
      if (auto n = v.value_exact<std::int64_t>()) {
        if (*n < 1 || *n > 1000) throw Error(where(source, v) + "'seeds' must be 1..1000");
        for (std::int64_t i = 1; i <= *n; ++i) s.seeds.push_back(static_cast<std::uint64_t>(i));
      } else if (const auto* a = v.as_array()) {
        for (const auto& e : *a) {
          auto x = e.value_exact<std::int64_t>();
          if (!x || *x < 0) throw Error(where(source, e) + "'seeds' must hold non-negative integers");
          s.seeds.push_back(static_cast<std::uint64_t>(*x));
        }
      } else throw Error(where(source, v) + "'seeds' must be a count or an array of integers");
    } else if (key == "baseline") {
      if (auto x = v.value_exact<std::string>()) baseline = *x;
      else throw Error(where(source, v) + "'baseline' must be a string like \"recipe=fp32\"");
    } else if (key == "metric") {
      if (auto x = v.value_exact<std::string>()) s.metric = *x;
      else throw Error(where(source, v) + "'metric' must be a string");
    } else if (key == "better") {
      auto x = v.value_exact<std::string>();
      if (!x || (*x != "higher" && *x != "lower"))
        throw Error(where(source, v) + "'better' must be \"higher\" or \"lower\"");
      s.better = *x;
    } else if (key == "set") {
      const auto* t = v.as_table();
      if (!t) throw Error(where(source, v) + "'set' must be a table of config keys");
      for (const auto& [ck, cv] : *t)
        s.set.push_back(std::string(ck.str()) + "=" + scalar(cv, "[set] " + std::string(ck.str()), source).toml);
    } else if (key == "grid") {
      const auto* a = v.as_array();
      if (!a) throw Error(where(source, v) + "'grid' must be an array of tables ([[grid]])");
      for (const auto& g : *a) {
        if (!g.is_table()) throw Error(where(source, g) + "each [[grid]] must be a table");
        grids.push_back(g.as_table());
      }
    } else if (key == "plot") {
      const auto* a = v.as_array();
      if (!a) throw Error(where(source, v) + "'plot' must be an array of tables ([[plot]])");
      for (const auto& pn : *a) {
        const auto* t = pn.as_table();
        if (!t) throw Error(where(source, pn) + "each [[plot]] must be a table");
        PlotSpec p;
        for (const auto& [pk, pv] : *t) {
          const std::string k2(pk.str());
          auto str = [&]() {
            if (auto x = pv.value_exact<std::string>()) return *x;
            throw Error(where(source, pv) + "plot '" + k2 + "' must be a string");
          };
          auto list = [&]() {
            std::vector<std::string> out;
            const auto* arr = pv.as_array();
            if (!arr) throw Error(where(source, pv) + "plot '" + k2 + "' must be an array of strings");
            for (const auto& e : *arr) {
              auto x = e.value_exact<std::string>();
              if (!x) throw Error(where(source, e) + "plot '" + k2 + "' must hold strings");
              out.push_back(*x);
            }
            return out;
          };
          if (k2 == "type") p.type = str();
          else if (k2 == "title") p.title = str();
          else if (k2 == "x") p.x = str();
          else if (k2 == "y") p.y = str();
          else if (k2 == "series") p.series = str();
          else if (k2 == "file") p.file = str();
          else if (k2 == "formats") p.formats = list();
          else if (k2 == "kinds") p.kinds = list();
          else if (k2 == "where") {
            const auto* wt = pv.as_table();
            if (!wt) throw Error(where(source, pv) + "plot 'where' must be a table of variable = value");
            for (const auto& [wk, wv] : *wt) p.where[std::string(wk.str())] = scalar(wv, "where", source).text;
          } else
            throw Error(where(source, pv) + "unknown plot key '" + k2 +
                        "' (expected type, title, x, y, series, file, where, formats, kinds)");
        }
        static const std::set<std::string> kTypes = {"metric", "heatmap", "loss-scale", "histograms",
                                                      "fixed-point-snr"};
        if (!kTypes.count(p.type))
          throw Error(where(source, pn) + "plot type '" + p.type +
                      "' (expected metric, heatmap, loss-scale, histograms or fixed-point-snr)");
        if ((p.type == "metric" || p.type == "heatmap") && p.x.empty())
          throw Error(where(source, pn) + p.type + " plot needs 'x' (a variable)");
        if (p.type == "heatmap" && p.y.empty()) throw Error(where(source, pn) + "heatmap plot needs 'y' (a variable)");
        for (const auto& f : p.formats) {
          try {
            (void)parse_format(f);
          } catch (const Error& e) {
            throw Error(where(source, pn) + "plot formats: " + e.what());
          }
        }
        if (p.file.empty()) p.file = "plot" + std::to_string(s.plots.size() + 1) + "-" + p.type;
        s.plots.push_back(std::move(p));
      }
    } else
      throw Error(where(source, v) + "unknown key '" + key +
                  "' (expected name, base, seeds, baseline, metric, better, set, grid, plot)");
  }
  if (s.name.empty()) throw Error(source + ": the sweep needs a 'name'");
  if (s.seeds.empty()) s.seeds.push_back(1);
  if (grids.empty()) s.points.push_back({});

  // Expand every grid: the product of its variables (array-valued config keys are variables
  // named by the key), each combination setting the grid's config keys.
  for (const toml::table* g : grids) {
    std::vector<std::pair<std::string, std::vector<Value>>> vars;
    std::vector<std::pair<std::string, const toml::node*>> keys;
    // toml++ orders a table's keys by name; the grid's order is the file's.
    struct Entry {
      std::string key;
      const toml::node* node;
      toml::source_position at;
    };
    std::vector<Entry> entries;
    for (const auto& [k, v] : *g) entries.push_back({std::string(k.str()), &v, k.source().begin});
    std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
      return a.at.line != b.at.line ? a.at.line < b.at.line : a.at.column < b.at.column;
    });
    for (const auto& e : entries) {
      const std::string& key = e.key;
      const toml::node& v = *e.node;
      const bool config_key = key.find('.') != std::string::npos || key == "seed" || key == "name" || key == "task";
      if (key == "seed" || key == "name")
        throw Error(where(source, v) + "'" + key + "' is set by the sweep (use 'seeds')");
      if (config_key && !v.is_array()) keys.emplace_back(key, &v);
      else vars.emplace_back(key, values_of(v, key, source));
      if (config_key && v.is_array()) keys.emplace_back(key, nullptr);
    }
    std::size_t combos = 1;
    for (const auto& [n, vals] : vars) combos *= vals.size();
    if (combos > 100000) throw Error(where(source, *g) + "grid has over 100000 points");
    for (std::size_t c = 0; c < combos; ++c) {
      SweepPoint p;
      std::map<std::string, std::string> env;
      std::size_t rest = c;
      std::vector<std::size_t> idx(vars.size());
      for (std::size_t i = vars.size(); i-- > 0;) {
        idx[i] = rest % vars[i].second.size();
        rest /= vars[i].second.size();
      }
      for (std::size_t i = 0; i < vars.size(); ++i) {
        p.vars.emplace_back(vars[i].first, vars[i].second[idx[i]].text);
        env[vars[i].first] = vars[i].second[idx[i]].text;
      }
      for (const auto& [key, node] : keys) {
        if (!node) {  // an array-valued config key: the variable of the same name
          for (std::size_t i = 0; i < vars.size(); ++i)
            if (vars[i].first == key) p.sets.push_back(key + "=" + vars[i].second[idx[i]].toml);
          continue;
        }
        const std::string what = where(source, *node) + "'" + key + "'";
        if (auto str = node->value_exact<std::string>()) {
          const std::string v = substitute(*str, env, what);
          p.sets.push_back(key + "=" + (is_number(v) || v == "true" || v == "false" ? v : quote(v)));
        } else {
          p.sets.push_back(key + "=" + scalar(*node, key, source).toml);
        }
      }
      s.points.push_back(std::move(p));
    }
    for (const auto& [n, vals] : vars)
      if (std::find(s.variables.begin(), s.variables.end(), n) == s.variables.end()) s.variables.push_back(n);
  }

  if (!baseline.empty()) {
    std::map<std::string, std::string> want;
    std::stringstream ss(baseline);
    std::string part;
    while (std::getline(ss, part, ',')) {
      const auto eq = part.find('=');
      if (eq == std::string::npos) throw Error(source + ": baseline \"" + baseline + "\": expected variable=value[, ...]");
      want[std::string(trim(std::string_view(part).substr(0, eq)))] = std::string(trim(std::string_view(part).substr(eq + 1)));
    }
    for (std::size_t i = 0; i < s.points.size(); ++i) {
      bool ok = true;
      for (const auto& [k, v] : want) ok = ok && s.points[i].var(k) == v;
      if (ok) {
        s.baseline = static_cast<int>(i);
        break;
      }
    }
    if (s.baseline < 0) throw Error(source + ": baseline \"" + baseline + "\" matches no point of the grid");
  }
  for (const auto& p : s.plots)
    for (const std::string* v : {&p.x, &p.y, &p.series})
      if (!v->empty() && std::find(s.variables.begin(), s.variables.end(), *v) == s.variables.end())
        throw Error(source + ": plot '" + p.file + "' uses variable '" + *v + "', which no grid defines");

  // Build every run's config now: a bad value is an error before anything runs.
  std::string base_text;
  if (!s.base.empty()) {
    base_text = read_file(s.base);
  }
  std::set<std::string> checked;
  for (std::size_t pi = 0; pi < s.points.size(); ++pi) {
    for (std::uint64_t seed : s.seeds) {
      std::vector<std::string> ov = s.set;
      ov.insert(ov.end(), s.points[pi].sets.begin(), s.points[pi].sets.end());
      ov.push_back("name=" + quote(s.name));
      ov.push_back("seed=" + std::to_string(seed));
      SweepRun r;
      r.point = static_cast<int>(pi);
      r.seed = seed;
      try {
        r.cfg = parse_train_config(base_text, s.base.empty() ? "(defaults)" : s.base, ov);
      } catch (const Error& e) {
        throw Error(source + ": point " + s.points[pi].label() + ": " + e.what());
      }
      // What the trainer would reject only when the run starts: the recipe and loss scaling.
      try {
        if (checked.insert(r.cfg.quant.recipe + "\n" + r.cfg.quant.loss_scale).second) {
          (void)nn::load_recipe(r.cfg.quant.recipe);
          (void)nn::parse_loss_scale(r.cfg.quant.loss_scale);
        }
      } catch (const Error& e) {
        throw Error(source + ": point " + s.points[pi].label() + ": " + e.what());
      }
      r.cfg.train.checkpoint.clear();
      r.identity = identity_of(to_json(r.cfg));
      r.key = hex16(fnv1a(kFnvBasis, r.identity.data(), r.identity.size()));
      s.runs.push_back(std::move(r));
    }
  }
  return s;
}

Sweep load_sweep(const std::string& path) {
  return parse_sweep(read_file(path), path, fs::path(path).parent_path().string());
}

std::optional<results::RunRow> find_run(const SweepRun& run, const std::vector<results::RunRow>& rows) {
  std::optional<results::RunRow> best;
  for (const auto& r : rows)
    if (r.seed == run.seed && identity_of(r.config_json) == run.identity && (!best || r.id > best->id)) best = r;
  return best;
}

RunState run_state(const SweepRun& run, const std::vector<results::RunRow>& rows,
                   const std::string& checkpoint) {
  RunState st;
  // One pass: the newest row of this config, and the newest finished or diverged one (which
  // counts even if a newer attempt failed).
  std::optional<results::RunRow> done;
  for (const auto& r : rows) {
    if (r.seed != run.seed || identity_of(r.config_json) != run.identity) continue;
    if (!st.row || r.id > st.row->id) st.row = r;
    if (results::has_outcome(r.status) && (!done || r.id > done->id)) done = r;
  }
  if (done) {
    st.row = done;
    st.kind = RunState::done;
    return st;
  }
  // The store marks a running row whose process has died as incomplete when it is opened.
  using results::RunStatus;
  if (st.row && st.row->status == RunStatus::running) st.kind = RunState::running;
  else if (st.row && (st.row->status == RunStatus::stopped || st.row->status == RunStatus::incomplete) &&
           fs::exists(checkpoint))
    st.kind = RunState::resume;
  return st;
}

// --- running ---------------------------------------------------------------------------

namespace {
std::mutex g_pids_m;
constexpr int kMaxPids = 256;
std::atomic<pid_t> g_pids[kMaxPids];
}  // namespace

void interrupt_launched() {
  for (auto& p : g_pids) {
    const pid_t pid = p.load();
    if (pid > 0) ::kill(pid, SIGINT);
  }
}

int launch_process(const std::string& exe, const std::string& db, const std::string& config_path,
                   bool resume, const std::string& log_path) {
  std::vector<std::string> args = {exe, "train", config_path, "--db", db, "--no-progress"};
  if (resume) args.push_back("--resume");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setpgroup(&attr, 0);  // own group: the terminal's Ctrl-C goes to the sweep only
  short flags = POSIX_SPAWN_SETPGROUP;
  posix_spawnattr_setflags(&attr, flags);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, exe.c_str(), &fa, &attr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) throw Error("cannot start " + exe + ": " + std::strerror(rc));
  int slot = -1;
  for (int i = 0; i < kMaxPids && slot < 0; ++i) {
    pid_t expected = 0;
    if (g_pids[i].compare_exchange_strong(expected, pid)) slot = i;
  }
  if (slot >= 0 && stop_requested()) ::kill(pid, SIGINT);  // asked to stop while starting
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (slot >= 0) g_pids[slot].store(0);
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

SweepSummary run_sweep(const Sweep& s, results::Store& store, const SweepOptions& opt) {
  if (!opt.launch && !opt.dry_run) throw Error("run_sweep: no launcher");
  const std::string dir = opt.dir.empty() ? "runs/" + s.name : opt.dir;
  fs::create_directories(dir);
  SweepSummary sum;
  sum.total = static_cast<int>(s.runs.size());
  const auto rows = store.runs({.name = s.name});

  struct Job {
    const SweepRun* run;
    bool resume;
    std::string config, log, ckpt;
  };
  std::vector<Job> jobs;
  for (const auto& r : s.runs) {
    const std::string base = (fs::path(dir) / r.key).string();
    const RunState st = run_state(r, rows, base + ".ckpt");
    if (st.kind == RunState::done) {
      ++sum.skipped;
      continue;
    }
    if (st.kind == RunState::running) {
      ++sum.busy;
      std::fprintf(stderr, "%s seed %llu: running in another process (run %lld); left alone\n",
                   s.points[static_cast<std::size_t>(r.point)].label().c_str(),
                   static_cast<unsigned long long>(r.seed), static_cast<long long>(st.row->id));
      continue;
    }
    jobs.push_back({&r, st.kind == RunState::resume, base + ".toml", base + ".log", base + ".ckpt"});
  }
  if (opt.dry_run) {
    for (const auto& j : jobs)
      std::fprintf(stderr, "%s %s seed %llu  (%s)\n", j.resume ? "resume" : "start ",
                   s.points[j.run->point].label().c_str(), static_cast<unsigned long long>(j.run->seed),
                   j.config.c_str());
    std::fprintf(stderr, "%d runs: %d done, %zu to run\n", sum.total, sum.skipped, jobs.size());
    return sum;
  }

  const int jobs_n = std::max(1, std::min<int>(opt.jobs, static_cast<int>(jobs.size())));
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int threads = std::max(1, cores / std::max(1, opt.jobs));
  std::mutex m;
  std::size_t next = 0;
  int ended = 0;
  std::unique_ptr<Progress> bar;
  if (opt.progress && !jobs.empty()) bar = std::make_unique<Progress>("sweep " + s.name, static_cast<std::int64_t>(jobs.size()), "runs");
  auto worker = [&] {
    for (;;) {
      Job* j;
      {
        std::lock_guard<std::mutex> lk(m);
        if (next >= jobs.size() || stop_requested()) return;
        j = &jobs[next++];
        j->resume ? ++sum.resumed : ++sum.started;
      }
      TrainConfig cfg = j->run->cfg;
      cfg.threads = threads;
      cfg.train.checkpoint = j->ckpt;
      if (!j->resume) {
        std::error_code ec;
        fs::remove(j->ckpt, ec);  // a stale checkpoint of a failed attempt
      }
      // Atomic: a config half-written by a killed sweep is never read. A resumed run keeps
      // the config it started with (its thread count may differ from this sweep's).
      if (!(j->resume && fs::exists(j->config))) {
        const std::string text = "# " + s.name + ": " + s.points[static_cast<std::size_t>(j->run->point)].label() +
                                 ", seed " + std::to_string(j->run->seed) + " (written by fp8lab sweep " + s.source +
                                 ")\n" + to_toml(cfg);
        write_file_atomic(j->config, text.data(), text.size());
      }
      const auto t0 = std::chrono::steady_clock::now();
      int rc;
      try {
        rc = opt.launch(*j->run, j->config, j->resume, j->log);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lk(m);
        std::fprintf(stderr, "\nsweep %s: %s\n", s.name.c_str(), e.what());
        rc = 3;
      }
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::lock_guard<std::mutex> lk(m);
      ++ended;
      // The outcome as the store has it (the run wrote it); the exit status only says how
      // the process ended.
      using results::RunStatus;
      const auto row = find_run(*j->run, store.runs({.name = s.name}));
      const RunStatus status = row ? row->status : RunStatus::failed;
      if (status == RunStatus::finished) ++sum.finished;
      else if (status == RunStatus::diverged) ++sum.diverged;
      else if (status != RunStatus::stopped) ++sum.failed;
      char line[512];
      std::snprintf(line, sizeof line, "[%d/%zu] %s seed %llu: %s%s (%.0f s%s)", ended, jobs.size(),
                    s.points[j->run->point].label().c_str(), static_cast<unsigned long long>(j->run->seed),
                    std::string(to_string(status)).c_str(),
                    row && row->final_metric ? (" " + row->metric_name + " " + fmt2(*row->final_metric)).c_str() : "",
                    secs, rc != 0 && status != RunStatus::stopped ? (", exit " + std::to_string(rc) + ", see " + j->log).c_str() : "");
      if (bar) {
        std::fprintf(stderr, isatty(2) ? "\r\033[K%s\n" : "%s\n", line);
        bar->update(ended);
      } else {
        std::fprintf(stderr, "%s\n", line);
      }
    }
  };
  std::vector<std::thread> pool;
  for (int i = 1; i < jobs_n; ++i) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  if (bar) bar->finish();
  sum.stopped = stop_requested();
  return sum;
}

}  // namespace fp8lab::experiments
