#include "fp8lab/study/page.hpp"

#include <algorithm>
#include <optional>
#include <string_view>

#include "fp8lab/core/error.hpp"
#include "fp8lab/core/format.hpp"
#include "fp8lab/core/text.hpp"
#include "fp8lab/results/figures.hpp"
#include "fp8lab/settings/recipe.hpp"

namespace fp8lab::study {

namespace {

// Where a placeholder stands, for messages: "<source>:<line>: '{{...}}'".
struct Place {
  const std::string& source;
  std::int64_t line;
  std::string_view text;
  std::string operator()(const std::string& what) const {
    return at_line(source, line) + "placeholder '{{" + std::string(text) + "}}': " + what;
  }
};

// Whether some point of `s` has variable `key` at exactly `value`.
bool some_point_has(const Sweep& s, const std::string& key, const std::string& value) {
  return std::any_of(s.points.begin(), s.points.end(), [&](const SweepPoint& p) { return p.var(key) == value; });
}

using Pairs = std::vector<std::pair<std::string, std::string>>;

// The var=value pairs of `selector`: the whole text as one pair where some point has that
// value (a loss scaling "backoff:init=16,interval=100", say), else its comma-separated items.
Pairs wanted_pairs(const Sweep& s, std::string_view selector, const Place& at) {
  const auto whole = key_value(trim(selector));
  if (whole) {
    std::string key(trim(whole->key)), value(trim(whole->value));
    if (some_point_has(s, key, value)) return {{std::move(key), std::move(value)}};
  }
  Pairs want;
  for (const std::string_view item : split(selector, ',')) {
    const auto kv = key_value(trim(item));
    if (!kv || trim(kv->key).empty()) throw Error(at("expected var=value[,var=value], got '" + std::string(item) + "'"));
    want.emplace_back(std::string(trim(kv->key)), std::string(trim(kv->value)));
  }
  return want;
}

// The points of `rep` whose variables have every value `selector` names (wanted_pairs), in
// the sweep's order.
std::vector<const PointResult*> points_matching(const Sweep& s, const SweepReport& rep, std::string_view selector,
                                                const Place& at) {
  const Pairs want = wanted_pairs(s, selector, at);
  std::vector<const PointResult*> found;
  for (const PointResult& p : rep.points) {
    const SweepPoint& pt = s.points[static_cast<std::size_t>(p.point)];
    if (std::all_of(want.begin(), want.end(), [&](const auto& kv) { return pt.var(kv.first) == kv.second; }))
      found.push_back(&p);
  }
  if (found.empty()) throw Error(at("names no point of sweep '" + s.name + "'"));
  return found;
}

// The one point of `s` that `selector` names.
const PointResult& point_of(const Sweep& s, const SweepReport& rep, std::string_view selector, const Place& at) {
  const auto found = points_matching(s, rep, selector, at);
  if (found.size() > 1)
    throw Error(at("names more than one point (" + s.points[static_cast<std::size_t>(found[0]->point)].label() + "; " +
                   s.points[static_cast<std::size_t>(found[1]->point)].label() + "): add a variable"));
  return *found[0];
}

std::string commands(const PageInputs& in, std::string_view, const Place&) {
  return "```sh\nfp8lab sweep " + in.sweep_path + " --jobs 2\nfp8lab report " + in.sweep_path + " --out " + in.out_dir +
         "\n```";
}

std::string runs(const PageInputs& in, std::string_view, const Place&) { return std::to_string(in.sweep.runs.size()); }

std::string table(const PageInputs& in, std::string_view metric, const Place& at) {
  if (metric.empty()) return to_markdown(in.sweep, in.report);
  for (const auto& [s, r] : in.also)
    if (s.metric == metric) return to_markdown(s, r);
  throw Error(at("the sweep has no 'also' metric '" + std::string(metric) + "'"));
}

std::string figure(const PageInputs& in, std::string_view file, const Place& at) {
  for (const PlotSpec& p : in.sweep.plots)
    if (p.file == file) {
      const std::string f(file);
      return "![" + (p.title.empty() ? f : p.title) + "](" + f + ".png)\n([SVG](" + f + ".svg))";
    }
  throw Error(at("the sweep has no [[plot]] with file = \"" + std::string(file) + "\""));
}

std::string value(const PageInputs& in, std::string_view selector, const Place& at) {
  return value_text(in.report, point_of(in.sweep, in.report, selector, at));
}

std::string p_value(const PageInputs& in, std::string_view selector, const Place& at) {
  return p_text(in.sweep, point_of(in.sweep, in.report, selector, at));
}

// One of a point's loss-scale figures (its mean log2 scale, its skipped steps) as the table
// gives it; an error for a point without loss scaling.
std::string scale_figure(const PageInputs& in, std::string_view selector, const Place& at,
                         std::optional<double> PointResult::*figure) {
  const PointResult& p = point_of(in.sweep, in.report, selector, at);
  if (!(p.*figure)) throw Error(at("the point has no loss scale (its runs scale by 1 or have no trace)"));
  return fixed(*(p.*figure), 1);
}

std::string log2_scale(const PageInputs& in, std::string_view selector, const Place& at) {
  return scale_figure(in, selector, at, &PointResult::mean_log2_scale);
}

std::string skipped(const PageInputs& in, std::string_view selector, const Place& at) {
  return scale_figure(in, selector, at, &PointResult::skipped_steps);
}

// The baseline point's mean; an error where the sweep has none or it has no finished run.
double baseline_mean(const PageInputs& in, const Place& at) {
  for (const PointResult& p : in.report.points)
    if (p.point == in.sweep.baseline && p.stats.n) return p.stats.mean;
  throw Error(at("needs the sweep's baseline with a finished run"));
}

// Runs of consecutive entries of `in_window` as "A..B" (or "A" alone), joined by ", ".
std::string ranges(const std::vector<std::string>& values, const std::vector<bool>& in_window) {
  std::string o;
  for (std::size_t i = 0; i < values.size();) {
    if (!in_window[i]) {
      ++i;
      continue;
    }
    std::size_t j = i;
    while (j + 1 < values.size() && in_window[j + 1]) ++j;
    o += (o.empty() ? "" : ", ") + values[i] + (j > i ? ".." + values[j] : "");
    i = j + 1;
  }
  return o.empty() ? "none" : o;
}

// {{window:VAR:WITHIN:POINTS}}: the values of VAR, among the points POINTS names, whose mean
// lies within WITHIN of the baseline's (or beats it) as ranges of consecutive points, then
// the best of them: "4..12, 20..32 (best 78.10 at 4)". A point without a finished run is
// outside the window.
std::string window(const PageInputs& in, std::string_view arg, const Place& at) {
  const auto parts = split(arg, ':');
  if (parts.size() < 3) throw Error(at("expected window:VAR:WITHIN:POINTS"));
  const std::string var(trim(parts[0]));
  const auto within = parse_number(trim(parts[1]));
  if (!within || *within < 0) throw Error(at("WITHIN must be a number >= 0, got '" + std::string(parts[1]) + "'"));
  const std::string_view selector = arg.substr(parts[0].size() + parts[1].size() + 2);
  const double base = baseline_mean(in, at);
  const bool higher = in.report.higher_is_better;
  std::vector<std::string> values;
  std::vector<bool> inside;
  const PointResult* best = nullptr;
  for (const PointResult* p : points_matching(in.sweep, in.report, selector, at)) {
    const std::string v = in.sweep.points[static_cast<std::size_t>(p->point)].var(var);
    if (v.empty()) throw Error(at("a point it names has no variable '" + var + "'"));
    values.push_back(v);
    const double m = p->stats.mean;
    inside.push_back(p->stats.n > 0 && (higher ? m >= base - *within : m <= base + *within));
    if (p->stats.n && (!best || (higher ? m > best->stats.mean : m < best->stats.mean))) best = p;
  }
  const std::string best_text = best ? " (best " + fixed(best->stats.mean, decimals_for(in.report.metric)) + " at " +
                                           in.sweep.points[static_cast<std::size_t>(best->point)].var(var) + ")"
                                     : " (no finished run)";
  return ranges(values, inside) + best_text;
}

std::string machines(const PageInputs& in, std::string_view, const Place&) {
  std::string m = machines_note(in.report);
  if (!m.empty() && m.back() == '\n') m.pop_back();
  return m;
}

// The statistics rows of `stats` of tensor kind `kind` at `step` in the layers `layers`
// names (a glob; "!GLOB": the layers it does not match).
std::vector<results::Store::StatRow> rows_of(const std::vector<results::Store::StatRow>& stats, std::string_view kind,
                                             std::int64_t step, std::string_view layers) {
  const bool negated = !layers.empty() && layers.front() == '!';
  const std::string_view glob = negated ? layers.substr(1) : layers;
  std::vector<results::Store::StatRow> out;
  for (const auto& r : stats)
    if (r.step == step && r.kind == kind && nn::glob_match(glob, r.layer) != negated) out.push_back(r);
  return out;
}

// The steps `stats` records, for a message: "0, 140, 280".
std::string recorded_steps(const std::vector<results::Store::StatRow>& stats) {
  std::vector<std::int64_t> steps;
  for (const auto& r : stats) steps.push_back(r.step);
  std::sort(steps.begin(), steps.end());
  steps.erase(std::unique(steps.begin(), steps.end()), steps.end());
  std::string o;
  for (const auto s : steps) o += (o.empty() ? "" : ", ") + std::to_string(s);
  return o;
}

// {{zeroed:KIND;STEP;LAYERS;FORMAT;POINT}} (page.hpp).
std::string zeroed(const PageInputs& in, std::string_view arg, const Place& at) {
  const auto parts = split(arg, ';');
  if (parts.size() != 5) throw Error(at("expected zeroed:KIND;STEP;LAYERS;FORMAT;POINT"));
  const std::string kind(trim(parts[0]));
  try {
    if (nn::to_string(nn::parse_kind(kind)) != kind) throw Error("not a short kind name");
  } catch (const Error&) {
    throw Error(at("KIND must be a, w, gx or gw, got '" + kind + "'"));
  }
  const auto step = parse_integer(trim(parts[1]));
  if (!step || *step < 0) throw Error(at("STEP must be a step number, got '" + std::string(parts[1]) + "'"));
  const std::string_view layers = trim(parts[2]);
  Format f;
  try {
    f = parse_format(trim(parts[3]));
  } catch (const Error& e) {
    throw Error(at(e.what()));
  }
  const PointResult& p = point_of(in.sweep, in.report, trim(parts[4]), at);
  const auto stats = in.point_stats ? in.point_stats(p.point) : std::vector<results::Store::StatRow>{};
  if (stats.empty()) throw Error(at("the point's first run has no tensor statistics (set train.stats_interval)"));
  const auto rows = rows_of(stats, kind, *step, layers);
  if (rows.empty())
    throw Error(at("no " + kind + " statistics at step " + std::to_string(*step) + " in layers '" + std::string(layers) +
                   "' (steps recorded: " + recorded_steps(stats) + ")"));
  const auto share = results::share_rounding_to_zero(rows, f);
  if (!share) throw Error(at("the statistics count no finite nonzero value"));
  return fixed(100 * *share, 0);
}

// The placeholders: name, whether it takes ":ARG" (optional for table), what it becomes.
enum class Arg { none, optional, required };
struct Placeholder {
  std::string_view name;
  Arg arg;
  std::string (*fill)(const PageInputs&, std::string_view, const Place&);
};
constexpr Placeholder kPlaceholders[] = {
    {"commands", Arg::none, commands}, {"runs", Arg::none, runs},          {"table", Arg::optional, table},
    {"figure", Arg::required, figure}, {"value", Arg::required, value},    {"p", Arg::required, p_value},
    {"scale", Arg::required, log2_scale},  {"skipped", Arg::required, skipped},
    {"window", Arg::required, window},     {"machines", Arg::none, machines},
    {"zeroed", Arg::required, zeroed},
};

std::string known_placeholders() {
  std::string o;
  for (const Placeholder& p : kPlaceholders)
    o += (o.empty() ? "" : ", ") + std::string(p.name) + (p.arg == Arg::required ? ":ARG" : p.arg == Arg::optional ? "[:ARG]" : "");
  return o;
}

std::string expand(const PageInputs& in, std::string_view inner, const Place& at) {
  const std::size_t colon = inner.find(':');
  const std::string_view name = trim(inner.substr(0, colon));
  const bool has_arg = colon != std::string_view::npos;
  const std::string_view arg = has_arg ? trim(inner.substr(colon + 1)) : std::string_view{};
  for (const Placeholder& p : kPlaceholders) {
    if (p.name != name) continue;
    if (p.arg == Arg::none && has_arg) throw Error(at("'" + std::string(name) + "' takes no argument"));
    if (p.arg == Arg::required && arg.empty()) throw Error(at("'" + std::string(name) + "' needs an argument after ':'"));
    return p.fill(in, arg, at);
  }
  throw Error(at("unknown placeholder (expected " + known_placeholders() + ")"));
}

}  // namespace

std::string fill_page(const std::string& text, const std::string& source, const PageInputs& in) {
  std::string out;
  std::int64_t line = 1;
  std::size_t i = 0;
  while (i < text.size()) {
    const std::size_t open = text.find("{{", i);
    const std::size_t upto = open == std::string::npos ? text.size() : open;
    line += std::count(text.begin() + static_cast<std::ptrdiff_t>(i), text.begin() + static_cast<std::ptrdiff_t>(upto), '\n');
    out.append(text, i, upto - i);
    if (open == std::string::npos) break;
    const std::size_t close = text.find("}}", open + 2);
    const std::size_t newline = text.find('\n', open);
    if (close == std::string::npos || (newline != std::string::npos && newline < close))
      throw Error(at_line(source, line) + "'{{' without '}}' on the same line");
    const std::string_view inner(text.data() + open + 2, close - open - 2);
    out += expand(in, inner, Place{source, line, inner});
    i = close + 2;
  }
  return out;
}

}  // namespace fp8lab::study
