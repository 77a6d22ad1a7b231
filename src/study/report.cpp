#include "fp8lab/study/report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>

#include "fp8lab/core/files.hpp"
#include "fp8lab/core/text.hpp"
#include "fp8lab/core/error.hpp"
#include "fp8lab/study/page.hpp"
#include "fp8lab/settings/recipe.hpp"
#include "fp8lab/results/figures.hpp"
#include "fp8lab/results/plot.hpp"

namespace fp8lab::study {

namespace fs = std::filesystem;
namespace plt = results::plot;

namespace {

std::string pvalue(double p) {
  char b[32];
  if (p < 1e-4) std::snprintf(b, sizeof b, "%.1e", p);
  else std::snprintf(b, sizeof b, "%.4f", p);
  return b;
}

}  // namespace

int decimals_for(const std::string& metric) { return metric.find("loss") != std::string::npos ? 4 : 2; }

bool lower_is_better(const std::string& metric) {
  return metric.find("loss") != std::string::npos || metric.find("perplexity") != std::string::npos;
}

namespace {

void write_text(const std::string& path, const std::string& text) { write_file_atomic(path, text.data(), text.size()); }

bool matches(const SweepPoint& p, const std::map<std::string, std::string>& where) {
  for (const auto& [k, v] : where)
    if (p.var(k) != v) return false;
  return true;
}

double as_number(const std::string& s) { return parse_number(s).value_or(std::nan("")); }

// The finished/diverged run of a point with the smallest seed (for traces and histograms).
std::optional<results::RunRow> first_run(const Sweep& s, int point, const std::vector<results::RunRow>& rows) {
  for (const auto& r : s.runs)
    if (r.point == point) {
      const RunState st = run_state(r, rows, "");
      if (st.kind == RunState::done) return st.row;
    }
  return std::nullopt;
}

std::string point_title(const Sweep& s, int point, const PlotSpec& spec) {
  std::string t;
  for (const auto& [k, v] : s.points[static_cast<std::size_t>(point)].vars)
    if (!spec.where.count(k)) t += (t.empty() ? "" : ", ") + k + "=" + v;
  return t.empty() ? s.points[static_cast<std::size_t>(point)].label() : t;
}

// A point's name in a plot's legend: its value of the plot's `series` variable, or where
// the plot names none or the point has no such variable (a baseline), its variables.
std::string legend_name(const Sweep& s, int point, const PlotSpec& spec) {
  const std::string v = spec.series.empty() ? "" : s.points[static_cast<std::size_t>(point)].var(spec.series);
  return v.empty() ? point_title(s, point, spec) : v;
}

// --- plots: which points, runs and steps each shows; the figures are results/figures.cpp ---

std::optional<results::BaselineBand> baseline_band(const Sweep& s, const SweepReport& rep, const std::string& label) {
  if (s.baseline < 0) return std::nullopt;
  return results::BaselineBand{rep.points[static_cast<std::size_t>(s.baseline)].stats, label};
}

results::FigureTitle title_of(const PlotSpec& spec, std::string fallback) { return {spec.title, std::move(fallback)}; }

std::optional<plt::Figure> metric_plot(const Sweep& s, const SweepReport& rep, const PlotSpec& spec) {
  results::MetricFigure in;
  in.title = title_of(spec, s.name + ": " + rep.metric + " against " + spec.x);
  in.xlabel = spec.x;
  in.metric = rep.metric;
  in.higher_is_better = rep.higher_is_better;
  for (const auto& pr : rep.points) {
    const SweepPoint& pt = s.points[static_cast<std::size_t>(pr.point)];
    if (!matches(pt, spec.where) || pt.var(spec.x).empty()) continue;
    const double x = as_number(pt.var(spec.x));
    if (!std::isfinite(x)) continue;
    in.points.push_back({spec.series.empty() ? "" : spec.series + "=" + pt.var(spec.series), x, pr.stats,
                         pr.stats.n == 0 && pr.diverged > 0});
  }
  in.baseline = baseline_band(s, rep, "baseline (" + (s.baseline >= 0 ? s.points[static_cast<std::size_t>(s.baseline)].label() : "") + ") +- sd");
  return results::metric_figure(in);
}

std::optional<plt::Figure> heatmap_plot(const Sweep& s, const SweepReport& rep, const PlotSpec& spec) {
  results::HeatmapFigure in;
  in.title = title_of(spec, s.name + ": " + rep.metric);
  in.xlabel = spec.x;
  in.ylabel = spec.y;
  in.metric = rep.metric;
  in.decimals = decimals_for(rep.metric) == 4 ? 3 : 1;
  for (const auto& pr : rep.points) {
    const SweepPoint& pt = s.points[static_cast<std::size_t>(pr.point)];
    if (!matches(pt, spec.where)) continue;
    const double x = as_number(pt.var(spec.x)), y = as_number(pt.var(spec.y));
    if (!std::isfinite(x) || !std::isfinite(y)) continue;
    in.cells[{x, y}] = pr.stats.n ? pr.stats.mean : std::nan("");
  }
  return results::heatmap_figure(in);
}

// The first seed's trace of each point with loss scaling (the others' flat trace at 2^0 is
// left out).
std::optional<plt::Figure> loss_scale_plot(const Sweep& s, const results::Store& store, const PlotSpec& spec,
                                           const std::vector<results::RunRow>& rows) {
  std::vector<results::LabelledTrace> traces;
  for (std::size_t i = 0; i < s.points.size(); ++i) {
    if (!matches(s.points[i], spec.where)) continue;
    const bool scaled = std::any_of(s.runs.begin(), s.runs.end(), [&](const SweepRun& r) {
      return r.point == static_cast<int>(i) && r.cfg.quant.loss_scale.value.method != nn::LossScaleMethod::none;
    });
    if (!scaled) continue;
    const auto row = first_run(s, static_cast<int>(i), rows);
    if (row) traces.push_back({legend_name(s, static_cast<int>(i), spec), store.loss_scale_trace(row->id)});
  }
  return results::loss_scale_figure(title_of(spec, s.name + ": loss scale over training (first seed)"), traces);
}

// The histogram plot's layer groups: by default 0 the first layer, 1 the middle one, 2 the
// last, 3 the others; with `patterns`, group i holds the layers whose path matches pattern
// i first (glob, docs/experiments.md) and the last group the rest. `sizes`: the layers in
// each pattern's group (with `patterns`).
results::LayerGroups histogram_groups(const std::vector<std::string>& layer_order, const std::vector<std::string>& patterns,
                                      std::vector<int>& sizes) {
  results::LayerGroups out;
  auto& [group, names] = out;
  if (patterns.empty()) {
    const std::size_t middle = layer_order.size() / 2;
    for (std::size_t pos = 0; pos < layer_order.size(); ++pos)
      group[layer_order[pos]] = pos == 0 ? 0 : pos + 1 >= layer_order.size() ? 2 : pos == middle ? 1 : 3;
    names = {"first layer", "middle layer (" + (layer_order.empty() ? std::string() : layer_order[middle]) + ")",
             "last layer", "other layers"};
    return out;
  }
  sizes.assign(patterns.size() + 1, 0);
  for (const auto& layer : layer_order) {
    std::size_t g = 0;
    while (g < patterns.size() && !nn::glob_match(patterns[g], layer)) ++g;
    group[layer] = static_cast<int>(g);
    ++sizes[g];
  }
  for (std::size_t g = 0; g <= patterns.size(); ++g) {
    const std::string n = std::to_string(sizes[g]) + (sizes[g] == 1 ? " layer" : " layers");
    names.push_back((g < patterns.size() ? patterns[g] : std::string("others")) + ": " + n);
  }
  return out;
}

results::KindName kind_name(const std::string& kind) { return {kind, std::string(nn::kind_title(nn::parse_kind(kind)))}; }

// The first, the middle and the last step of `stats` (the start, middle and end of
// training), and the layers in forward order (as their activations were recorded).
void steps_and_layers(const std::vector<results::Store::StatRow>& stats, std::vector<std::int64_t>& steps,
                      std::vector<std::string>& layer_order) {
  std::set<std::int64_t> recorded;
  for (const auto& r : stats) {
    recorded.insert(r.step);
    if (r.kind == nn::to_string(nn::TensorKind::a) && std::find(layer_order.begin(), layer_order.end(), r.layer) == layer_order.end())
      layer_order.push_back(r.layer);
  }
  const std::vector<std::int64_t> all_steps(recorded.begin(), recorded.end());
  steps = {all_steps.front(), all_steps[all_steps.size() / 2], all_steps.back()};
  steps.erase(std::unique(steps.begin(), steps.end()), steps.end());
}

// Exponent histograms of the first matching point's first run: for each tensor kind, the
// first, middle and last recorded step, with the layer groups summed, against the formats'
// ranges.
std::optional<plt::Figure> histogram_plot(const Sweep& s, const results::Store& store, const PlotSpec& spec,
                                          const std::vector<results::RunRow>& rows) {
  std::optional<results::RunRow> row;
  std::string which;
  for (std::size_t i = 0; i < s.points.size() && !row; ++i)
    if (matches(s.points[i], spec.where)) row = first_run(s, static_cast<int>(i), rows), which = s.points[i].label();
  if (!row) return std::nullopt;
  const auto stats = store.stats(row->id);
  if (stats.empty()) {
    std::fprintf(stderr, "report: run %lld (%s) has no tensor statistics (set train.stats_interval)\n",
                 static_cast<long long>(row->id), which.c_str());
    return std::nullopt;
  }
  results::HistogramFigure in;
  in.title = title_of(spec, s.name + ": exponent histograms (" + which + ", seed " + std::to_string(row->seed) + ")");
  in.stats = &stats;
  std::vector<std::string> layer_order;
  steps_and_layers(stats, in.steps, layer_order);
  std::vector<int> sizes;
  in.groups = histogram_groups(layer_order, spec.layers, sizes);
  for (std::size_t i = 0; i < spec.layers.size(); ++i)
    if (sizes[i] == 0)
      std::fprintf(stderr, "report: plot %s: layers pattern '%s' matches no layer of run %lld\n", spec.file.c_str(),
                   spec.layers[i].c_str(), static_cast<long long>(row->id));
  for (const auto& k : spec.kinds) in.kinds.push_back(kind_name(k));
  for (int k = 0; k < nn::kKinds && spec.kinds.empty(); ++k)
    in.kinds.push_back(kind_name(std::string(nn::to_string(static_cast<nn::TensorKind>(k)))));
  in.formats = spec.formats;
  return results::histogram_figure(in);
}

}  // namespace

std::string paper_notation(const nn::KindQuant& q) {
  if (!q) return "fp32";
  if (q->scaled()) {
    std::string s = to_string(*q);
    if (q->element.rounding == Rounding::stochastic) s += " SR";
    return s;
  }
  const Format& f = q->element.format;
  std::string s = "1." + std::to_string(f.exp_bits) + "." + std::to_string(f.man_bits) + " b" + std::to_string(f.bias);
  if (f.policy != Policy::fnuz) s += " " + std::string(to_string(f.policy));
  if (!f.subnormals) s += " nosub";
  if (q->element.rounding == Rounding::stochastic) s += " SR";
  else if (q->element.rounding == Rounding::toward_zero) s += " RZ";
  else if (q->element.rounding == Rounding::nearest_away) s += " RNA";
  if (q->element.overflow != Overflow::saturate) s += " ovf:" + std::string(to_string(q->element.overflow));
  return s;
}

namespace {

// Adds one run's mean log2 scale (each trace point weighted by the steps it held) and its
// skipped steps to a point's sums {sum of run means, runs} and skipped steps.
void add_trace(const std::vector<std::tuple<std::int64_t, int, bool>>& trace, std::pair<double, double>& scale_sum,
               double& skipped_sum) {
  if (trace.empty()) return;
  double sum = 0, steps = 0, skipped = 0;
  for (std::size_t i = 0; i < trace.size(); ++i) {
    const double len = i + 1 < trace.size() ? static_cast<double>(std::get<0>(trace[i + 1]) - std::get<0>(trace[i])) : 1.0;
    sum += std::get<1>(trace[i]) * len, steps += len;
    skipped += std::get<2>(trace[i]);
  }
  scale_sum.first += sum / steps;
  scale_sum.second += 1;
  skipped_sum += skipped;
}

// The figures of every point once its runs are in: loss-scale means, the metric's name and
// direction, mean +- sd, and the test against the baseline.
void conclude(const Sweep& s, SweepReport& rep, const std::set<std::string>& metric_names,
              const std::map<int, std::pair<double, double>>& scale_sums, const std::map<int, double>& skipped_sums) {
  for (const auto& [pt, acc] : scale_sums) {
    if (acc.second == 0) continue;
    rep.points[static_cast<std::size_t>(pt)].mean_log2_scale = acc.first / acc.second;
    rep.points[static_cast<std::size_t>(pt)].skipped_steps = skipped_sums.at(pt) / acc.second;
  }
  rep.metric = !s.metric.empty() ? s.metric : metric_names.empty() ? "metric" : *metric_names.begin();
  const bool higher = s.better.empty() ? !lower_is_better(rep.metric) : s.better == "higher";
  rep.higher_is_better = higher;
  for (auto& pr : rep.points) pr.stats = results::mean_sd(pr.values);
  if (s.baseline >= 0) {
    const auto& base = rep.points[static_cast<std::size_t>(s.baseline)].values;
    for (auto& pr : rep.points) {
      if (pr.point == s.baseline || pr.values.empty() || base.empty()) continue;
      // One-sided: is this point worse than the baseline?
      pr.test = results::mann_whitney_u(pr.values, base, higher ? results::Alternative::less : results::Alternative::greater);
      pr.significant = pr.test->p < rep.alpha;
    }
  }
}

void kinds_of(PointResult& pr) {
  try {
    const nn::Recipe rec = nn::load_recipe(pr.recipe);
    for (int k = 0; k < 4; ++k) pr.kinds[k] = paper_notation(rec.base.q[static_cast<std::size_t>(k)]);
  } catch (const Error&) {
    for (auto& k : pr.kinds) k = "?";
  }
}

}  // namespace

SweepReport analyse(const Sweep& s, const results::Store& store) {
  SweepReport rep;
  const auto rows = store.runs({.name = s.name});
  rep.points.resize(s.points.size());
  for (std::size_t i = 0; i < s.points.size(); ++i) rep.points[i].point = static_cast<int>(i);
  std::set<std::string> metric_names;
  std::map<int, std::pair<double, double>> scale_sums;  // point -> (sum of run means, runs)
  std::map<int, double> skipped_sums;
  for (const auto& r : s.runs) {
    PointResult& pr = rep.points[static_cast<std::size_t>(r.point)];
    if (pr.recipe.empty()) {
      pr.recipe = r.cfg.quant.recipe.text;
      pr.loss_scale = r.cfg.quant.loss_scale.text;
      kinds_of(pr);
    }
    const RunState st = run_state(r, rows, "");
    if (st.kind != RunState::done) {
      ++pr.missing;
      continue;
    }
    pr.run_ids.push_back(st.row->id);
    ++rep.machines[st.row->machine];
    if (st.row->status == results::RunStatus::diverged) {
      ++pr.diverged;
      continue;
    }
    double v = std::nan("");
    // A metric named in the sweep is its last logged value (the final weights' test BLEU
    // is logged as test_bleu even when the run's final metric is that of averaged weights);
    // otherwise the run's own final metric.
    const auto logged = s.metric.empty() ? decltype(store.metric(0, "")){} : store.metric(st.row->id, s.metric);
    if (!logged.empty()) {
      v = logged.back().second;
      metric_names.insert(s.metric);
    } else if ((s.metric.empty() || s.metric == st.row->metric_name) && st.row->final_metric) {
      v = *st.row->final_metric;
      metric_names.insert(st.row->metric_name);
    }
    if (std::isfinite(v)) pr.values.push_back(v);
    else ++pr.missing;
    if (r.cfg.quant.loss_scale.value.method != nn::LossScaleMethod::none) add_trace(store.loss_scale_trace(st.row->id), scale_sums[r.point], skipped_sums[r.point]);
  }
  conclude(s, rep, metric_names, scale_sums, skipped_sums);
  return rep;
}

SweepReport analyse_named(const results::Store& store, const std::string& name, Sweep& s) {
  s = Sweep{};
  s.name = name;
  s.variables = {"recipe", "loss_scale"};
  SweepReport rep;
  std::map<std::pair<std::string, std::string>, int> point_of;
  std::set<std::string> metric_names;
  std::map<int, std::pair<double, double>> scale_sums;
  std::map<int, double> skipped_sums;
  auto rows = store.runs({.name = name});
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
  for (const auto& r : rows) {
    auto [it, fresh] = point_of.try_emplace({r.recipe, r.loss_scale}, static_cast<int>(s.points.size()));
    if (fresh) {
      s.points.push_back({{{"recipe", r.recipe}, {"loss_scale", r.loss_scale}}, {}});
      PointResult pr;
      pr.point = it->second;
      pr.recipe = r.recipe;
      pr.loss_scale = r.loss_scale;
      kinds_of(pr);
      rep.points.push_back(std::move(pr));
      if (r.recipe == "fp32" && r.loss_scale == "none") s.baseline = it->second;
    }
    PointResult& pr = rep.points[static_cast<std::size_t>(it->second)];
    if (!results::has_outcome(r.status)) {
      ++pr.missing;
      continue;
    }
    pr.run_ids.push_back(r.id);
    ++rep.machines[r.machine];
    if (r.status == results::RunStatus::diverged) {
      ++pr.diverged;
      continue;
    }
    if (!r.final_metric || !std::isfinite(*r.final_metric)) {
      ++pr.missing;
      continue;
    }
    pr.values.push_back(*r.final_metric);
    metric_names.insert(r.metric_name);
    if (r.loss_scale != "none") add_trace(store.loss_scale_trace(r.id), scale_sums[pr.point], skipped_sums[pr.point]);
  }
  if (metric_names.size() > 1) {
    std::string list;
    for (const auto& m : metric_names) list += (list.empty() ? "" : ", ") + m;
    throw Error("runs named '" + name + "' report different final metrics (" + list + "): they cannot share a table");
  }
  if (s.points.empty()) throw Error("no run named '" + name + "' in " + store.path());
  conclude(s, rep, metric_names, scale_sums, skipped_sums);
  return rep;
}

namespace {
struct Columns {
  std::vector<std::string> vars;  // variables that vary (others are constant)
  bool loss_scale = false;  // a loss-scaling column (some point scales the loss)
};
Columns columns(const Sweep& s, const SweepReport& r) {
  Columns c;
  for (const auto& v : s.variables) {
    std::set<std::string> seen;
    for (const auto& p : s.points) seen.insert(p.var(v));
    if (seen.size() > 1 || s.points.size() == 1) c.vars.push_back(v);
  }
  std::set<std::string> scales;
  for (const auto& p : r.points) scales.insert(p.loss_scale);
  c.loss_scale = scales.size() > 1 || (scales.size() == 1 && *scales.begin() != "none");
  return c;
}
}  // namespace

std::string machines_note(const SweepReport& r) {
  if (r.machines.empty() || (r.machines.size() == 1 && r.machines.begin()->first.empty())) return "";
  if (r.machines.size() == 1) return "Runs made on " + r.machines.begin()->first + ".\n";
  std::string o = r.machines.count("") ? "**Not every run records its processor**"
                                       : "**Runs made on " + std::to_string(r.machines.size()) + " processors**";
  return o + "; results from different processors may differ in the last bits (their kernels differ): " +
         results::machine_counts(r.machines) + ".\n";
}

std::string value_text(const SweepReport& r, const PointResult& p) {
  if (!p.stats.n) return "-";
  const int dec = decimals_for(r.metric);
  std::string o = fixed(p.stats.mean, dec);
  if (p.stats.n > 1) o += " ± " + fixed(p.stats.sd, dec);  // one run has no spread: its value alone
  return o + (p.significant ? "*" : "");
}

std::string p_text(const Sweep& s, const PointResult& p) {
  return p.point == s.baseline ? "baseline" : p.test ? pvalue(p.test->p) : "-";
}

std::string to_markdown(const Sweep& s, const SweepReport& r) {
  const Columns c = columns(s, r);
  std::ostringstream o;
  o << "| ";
  for (const auto& v : c.vars) o << v << " | ";
  o << "activations | weights | grad_x | grad_w | ";
  if (c.loss_scale) o << "loss scaling | mean log2 scale | skipped steps | ";
  o << r.metric << " | runs | p (MWU vs baseline) |\n|";
  const std::size_t left = c.vars.size() + 4 + (c.loss_scale ? 1 : 0);
  const std::size_t ncols = left + (c.loss_scale ? 2 : 0) + 3;
  for (std::size_t i = 0; i < ncols; ++i) o << (i < left ? "---|" : "---:|");
  o << "\n";
  for (const auto& p : r.points) {
    const SweepPoint& pt = s.points[static_cast<std::size_t>(p.point)];
    o << "| ";
    for (const auto& v : c.vars) o << pt.var(v) << " | ";
    for (const auto& k : p.kinds) o << k << " | ";
    if (c.loss_scale) {
      o << p.loss_scale << " | " << (p.mean_log2_scale ? fixed(*p.mean_log2_scale, 1) : "-") << " | "
        << (p.skipped_steps ? fixed(*p.skipped_steps, 1) : "-") << " | ";
    }
    o << value_text(r, p) << " | " << p.stats.n;
    if (p.diverged) o << " (+" << p.diverged << " diverged)";
    if (p.missing) o << " (" << p.missing << " missing)";
    o << " | " << p_text(s, p) << " |\n";
  }
  o << "\n" << r.metric << ": mean ± sample standard deviation over seeds";
  if (std::any_of(r.points.begin(), r.points.end(), [](const PointResult& p) { return p.stats.n == 1; }))
    o << " (a point of one run: its value alone)";
  if (s.baseline >= 0)
    o << "; * = worse than the baseline (" << s.points[static_cast<std::size_t>(s.baseline)].label()
      << ") by a one-sided Mann-Whitney U test at " << fixed(r.alpha * 100, 0) << " %";
  o << ".\n";
  const std::string machines = machines_note(r);
  if (!machines.empty()) o << "\n" << machines;
  return o.str();
}

std::string to_csv(const Sweep& s, const SweepReport& r) {
  std::ostringstream o;
  for (const auto& v : s.variables) o << csv_field(v) << ",";
  o << "recipe,a,w,gx,gw,loss_scale,mean_log2_scale,skipped_steps,n,diverged,missing,mean,sd,u,p,significant,values\n";
  for (const auto& p : r.points) {
    const SweepPoint& pt = s.points[static_cast<std::size_t>(p.point)];
    for (const auto& v : s.variables) o << csv_field(pt.var(v)) << ",";
    o << csv_field(p.recipe) << ",";
    for (const auto& kind : p.kinds) o << csv_field(kind) << ",";
    o << csv_field(p.loss_scale) << ","
      << (p.mean_log2_scale ? fixed(*p.mean_log2_scale, 3) : "") << "," << (p.skipped_steps ? fixed(*p.skipped_steps, 1) : "")
      << "," << p.stats.n << "," << p.diverged << "," << p.missing << ",";
    if (p.stats.n) o << fixed(p.stats.mean, 6) << "," << (p.stats.n > 1 ? fixed(p.stats.sd, 6) : "");
    else o << ",";
    o << ",";
    if (p.test) o << fixed(p.test->u, 1) << "," << pvalue(p.test->p) << "," << (p.significant ? 1 : 0);
    else o << ",,";
    std::string vals;
    for (double v : p.values) vals += (vals.empty() ? "" : " ") + fixed(v, 4);
    o << "," << csv_field(vals) << "\n";
  }
  return o.str();
}

namespace {

// The metric of every point (mean +- sd over seeds) side by side, numbered and named in the
// legend (a '*' where it is worse than the baseline), with the baseline's band.
std::optional<plt::Figure> points_plot(const Sweep& s, const SweepReport& rep, const PlotSpec& spec) {
  std::vector<results::NamedPoint> points;
  for (const auto& pr : rep.points)
    if (matches(s.points[static_cast<std::size_t>(pr.point)], spec.where))
      points.push_back({legend_name(s, pr.point, spec), pr.stats, pr.significant});
  return results::points_figure(title_of(spec, s.name + ": " + rep.metric + " by point (* worse than the baseline)"),
                                rep.metric, points, baseline_band(s, rep, "baseline +- sd"));
}

// Block-scaled quantizers' statistics (docs/spec.md §6.6) of each matching point's first run.
std::optional<plt::Figure> block_stats_plot(const Sweep& s, const results::Store& store, const PlotSpec& spec,
                                            const std::vector<results::RunRow>& rows) {
  std::vector<results::KindName> kinds;
  for (const auto& k : spec.kinds.empty() ? std::vector<std::string>{"a", "w", "gx"} : spec.kinds) kinds.push_back(kind_name(k));
  std::vector<results::LabelledStats> runs;
  for (std::size_t i = 0; i < s.points.size(); ++i) {
    if (!matches(s.points[i], spec.where)) continue;
    if (const auto row = first_run(s, static_cast<int>(i), rows)) runs.push_back({s.points[i].label(), store.stats(row->id)});
  }
  return results::block_stats_figure(
      title_of(spec, s.name + ": block scales at the last statistics step (first seed; sat: groups that saturate)"), kinds, runs);
}

}  // namespace

std::vector<MetricCurve> metric_curves(const SweepReport& rep, const Sweep& s, const results::Store& store,
                                       const std::string& metric, const std::map<std::string, std::string>& where) {
  std::vector<MetricCurve> out;
  for (const auto& pr : rep.points) {
    if (!matches(s.points[static_cast<std::size_t>(pr.point)], where)) continue;
    std::map<std::int64_t, std::vector<double>> at;  // step -> the runs' values there
    for (const std::int64_t id : pr.run_ids)
      for (const auto& [step, value] : store.metric(id, metric)) at[step].push_back(value);
    if (at.empty()) continue;
    MetricCurve c;
    c.point = pr.point;
    for (const auto& [step, values] : at) {
      const results::MeanSd m = results::mean_sd(values);
      c.steps.push_back(step);
      c.mean.push_back(m.mean);
      c.sd.push_back(m.sd);
      c.runs.push_back(static_cast<int>(m.n));
    }
    out.push_back(std::move(c));
  }
  return out;
}

namespace {

// `metric` over training steps, one line per point (mean +- sd over its runs).
std::optional<plt::Figure> curve_plot(const Sweep& s, const std::vector<MetricCurve>& curves, const PlotSpec& spec) {
  std::vector<results::Curve> lines;
  for (const MetricCurve& c : curves) lines.push_back({legend_name(s, c.point, spec), c.steps, c.mean, c.sd});
  return results::curve_figure(title_of(spec, s.name + ": " + spec.metric + " over training"), spec.metric, lines);
}

// The curves' numbers: one row per point and step.
std::string curves_csv(const Sweep& s, const std::vector<MetricCurve>& curves, const std::string& metric) {
  std::ostringstream o;
  o << "point,step," << metric << "_mean," << metric << "_sd,runs\n";
  for (const MetricCurve& c : curves)
    for (std::size_t i = 0; i < c.steps.size(); ++i)
      o << csv_field(s.points[static_cast<std::size_t>(c.point)].label()) << ',' << c.steps[i] << ','
        << fixed(c.mean[i], 6) << ',' << fixed(c.sd[i], 6) << ',' << c.runs[i] << '\n';
  return o.str();
}

}  // namespace

std::vector<std::pair<Sweep, SweepReport>> also_reports(const Sweep& s, const results::Store& store) {
  std::vector<std::pair<Sweep, SweepReport>> out;
  for (const auto& m : s.also) {
    Sweep t = s;
    t.metric = m;
    t.better.clear();  // the direction of the metric's own name
    t.also.clear();
    t.plots.clear();
    SweepReport r = analyse(t, store);
    out.emplace_back(std::move(t), std::move(r));
  }
  return out;
}

namespace {

// The page filled from `page_template` as <out>/README.md; refuses a template that is that file.
std::string write_page(const std::string& page_template, const PageInputs& in) {
  const std::string path = (fs::path(in.out_dir) / "README.md").string();
  std::error_code ec;
  if (fs::exists(path) && fs::equivalent(page_template, path, ec))
    throw Error("report: the page template " + page_template + " is the page it would write (" + path +
                "): keep the template beside the sweep file");
  write_text(path, fill_page(read_file(page_template), page_template, in));
  return path;
}

}  // namespace

std::vector<std::string> write_report(const Sweep& s, const SweepReport& rep, const results::Store& store,
                                      const std::string& out_dir) {
  make_folder(out_dir);
  const auto rows = store.runs({.name = s.name});
  std::vector<std::string> files;
  const std::string md = (fs::path(out_dir) / "table.md").string(), csv = (fs::path(out_dir) / "table.csv").string();
  write_text(md, to_markdown(s, rep));
  write_text(csv, to_csv(s, rep));
  files.push_back(md);
  files.push_back(csv);
  const auto also = also_reports(s, store);
  for (const auto& extra : also) {
    const std::string stem = (fs::path(out_dir) / ("table-" + extra.first.metric)).string();
    write_text(stem + ".md", to_markdown(extra.first, extra.second));
    write_text(stem + ".csv", to_csv(extra.first, extra.second));
    files.push_back(stem + ".md");
    files.push_back(stem + ".csv");
  }
  for (const auto& spec : s.plots) {
    std::optional<plt::Figure> fig;
    switch (spec.type) {
      case PlotType::metric: fig = metric_plot(s, rep, spec); break;
      case PlotType::heatmap: fig = heatmap_plot(s, rep, spec); break;
      case PlotType::loss_scale: fig = loss_scale_plot(s, store, spec, rows); break;
      case PlotType::histograms: fig = histogram_plot(s, store, spec, rows); break;
      case PlotType::fixed_point_snr:
        fig = results::fixed_point_snr_figure(title_of(spec, "Fixed point (1.0.7) SNR against the quantization step"));
        break;
      case PlotType::points: fig = points_plot(s, rep, spec); break;
      case PlotType::block_stats: fig = block_stats_plot(s, store, spec, rows); break;
      case PlotType::curve: {
        const auto curves = metric_curves(rep, s, store, spec.metric, spec.where);
        if (!curves.empty()) {
          const std::string csv_path = (fs::path(out_dir) / (spec.file + ".csv")).string();
          write_text(csv_path, curves_csv(s, curves, spec.metric));
          files.push_back(csv_path);
        }
        fig = curve_plot(s, curves, spec);
        break;
      }
    }
    if (!fig) {
      std::fprintf(stderr, "report: plot '%s' (%s) has no data yet; skipped\n", spec.file.c_str(),
                   std::string(to_string(spec.type)).c_str());
      continue;
    }
    const std::string stem = (fs::path(out_dir) / spec.file).string();
    plt::save(*fig, stem);
    files.push_back(stem + ".svg");
    files.push_back(stem + ".png");
  }
  if (!s.page.empty()) {
    const auto point_stats = [&](int point) {
      const auto row = first_run(s, point, rows);
      return row ? store.stats(row->id) : std::vector<results::Store::StatRow>{};
    };
    files.push_back(write_page(s.page, {s, rep, also, s.source, out_dir, point_stats}));
  }
  return files;
}

}  // namespace fp8lab::study
