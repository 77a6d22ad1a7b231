#include "fp8lab/results/figures.hpp"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <set>

#include "fp8lab/core/analysis.hpp"
#include "fp8lab/core/format.hpp"
#include "fp8lab/core/text.hpp"

namespace fp8lab::results {

namespace plt = plot;

namespace {

// The baseline's mean +- sd as a grey band and a dashed line (nothing without its runs).
void add_baseline(plt::Panel& p, const std::optional<BaselineBand>& b) {
  if (!b || !b->stats.n) return;
  p.bands.push_back({b->stats.mean - b->stats.sd, b->stats.mean + b->stats.sd, "", 7, false, 0.18});
  p.lines.push_back({b->stats.mean, b->label, 7, false, true});
}

// A figure of one panel of `width` x `height` pixels.
plt::Figure one_panel(const FigureTitle& title, plt::Panel p, int width, int height) {
  plt::Figure fig;
  fig.title = title.text();
  fig.panels.push_back(std::move(p));
  fig.panel_width = width;
  fig.panel_height = height;
  return fig;
}

// `se`'s points in increasing x.
plt::Series sorted_by_x(const plt::Series& se) {
  std::vector<std::size_t> idx(se.x.size());
  for (std::size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  std::sort(idx.begin(), idx.end(), [&](auto a, auto b) { return se.x[a] < se.x[b]; });
  plt::Series sorted{se.label};
  for (auto i : idx) sorted.x.push_back(se.x[i]), sorted.y.push_back(se.y[i]), sorted.err.push_back(se.err[i]);
  return sorted;
}

// A histogram's lowest exponent and counts as stored: nullopt where the JSON does not hold
// them (a store edited by hand or damaged: such a row is left out, as one that does not
// parse, never an internal error).
std::optional<std::pair<int, std::vector<double>>> exponent_bins(const nlohmann::json& h) {
  constexpr double kMaxExponent = 1 << 20;  // far beyond any format's exponents
  const auto lo = h.find("lo");
  const auto counts = h.find("counts");
  if (lo == h.end() || !lo->is_number() || !(std::fabs(lo->get<double>()) <= kMaxExponent)) return std::nullopt;
  if (counts == h.end() || !counts->is_array() || counts->size() > kMaxExponent) return std::nullopt;
  std::vector<double> c;
  for (const auto& v : *counts) {
    if (!v.is_number()) return std::nullopt;
    c.push_back(v.get<double>());
  }
  return std::make_pair(static_cast<int>(lo->get<double>()), std::move(c));
}

// A number stored under `key` of object j, or `fallback` where there is none or it is no number.
double number_in(const nlohmann::json& j, const char* key, double fallback) {
  const auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : fallback;
}


// The panel of one tensor kind at one step: each layer group's exponent histogram, summed
// over its layers, as percent of its values; nullopt where the step recorded none of `kind`.
std::optional<plt::Panel> histogram_panel(const std::vector<Store::StatRow>& stats, const KindName& kind,
                                          std::int64_t step, const LayerGroups& layer_groups) {
  std::map<int, std::map<int, double>> groups;  // group -> exponent -> count
  std::map<int, double> zeros, totals;
  for (const auto& r : stats) {
    if (r.kind != kind.name || r.step != step) continue;
    const auto gi = layer_groups.group.find(r.layer);  // a layer without activations: the others
    const int g = gi != layer_groups.group.end() ? gi->second : static_cast<int>(layer_groups.names.size()) - 1;
    const auto h = exponent_counts(r.histogram);
    if (!h) continue;
    for (std::size_t i = 0; i < h->counts.size(); ++i) groups[g][h->lo + static_cast<int>(i)] += h->counts[i];
    zeros[g] += h->zero;
    totals[g] += static_cast<double>(r.total);
  }
  if (groups.empty()) return std::nullopt;
  plt::Panel p;
  p.title = kind.title + ", step " + std::to_string(step);
  p.xlabel = "exponent e = floor(log2 |x|)";
  p.ylabel = "% of values";
  p.ymin = 0;
  for (auto& [g, hist] : groups) {
    plt::Series se;
    se.label = layer_groups.names[g] + " (" + fixed(totals[g] > 0 ? 100 * zeros[g] / totals[g] : 0, 0) + "% zero)";
    se.color = g;
    se.markers = false;
    for (const auto& [e, c] : hist) {
      se.x.push_back(e + 0.5);
      se.y.push_back(totals[g] > 0 ? 100 * c / totals[g] : 0);
    }
    p.series.push_back(std::move(se));
  }
  return p;
}

// Each format's normal range (and subnormal range, lighter) as a band behind the histograms.
void add_format_bands(plt::Panel& p, const std::vector<std::string>& formats) {
  static constexpr int kBandColors[] = {4, 8, 9, 5};
  for (std::size_t fi = 0; fi < formats.size(); ++fi) {
    const Format f = parse_format(formats[fi]);
    const int emin = f.emin();
    const int emax = static_cast<int>(std::floor(std::log2(f.max_finite())));
    const int color = kBandColors[fi % 4];
    p.bands.push_back({static_cast<double>(emin), static_cast<double>(emax + 1), formats[fi] + " normal", color, true, 0.2});
    if (f.subnormals && f.man_bits > 0)
      p.bands.push_back({static_cast<double>(emin - f.man_bits), static_cast<double>(emin), formats[fi] + " subnormal", color, true, 0.08});
  }
}

// One run's block-scale histogram of `kind` at its last recorded step, as a series labelled
// with the shares of groups that saturate and that are all zero; nullopt without groups.
std::optional<plt::Series> block_scale_series(const LabelledStats& run, const std::string& kind, int color) {
  std::int64_t last = -1;
  for (const auto& r : run.stats) last = std::max(last, r.step);
  std::map<int, double> hist;
  double groups = 0, saturated = 0, zero = 0;
  for (const auto& r : run.stats) {
    if (r.kind != kind || r.step != last) continue;
    const auto h = nlohmann::json::parse(r.histogram, nullptr, false);
    if (h.is_discarded() || !h.is_object() || !h.contains("groups") || !h.contains("scales")) continue;
    const auto& g = h["groups"];
    const auto bins = h["scales"].is_object() ? exponent_bins(h["scales"]) : std::nullopt;
    if (!g.is_object() || !bins) continue;
    groups += number_in(g, "total", 0.0);
    saturated += number_in(g, "saturated", 0.0);
    zero += number_in(g, "zero", 0.0);
    for (std::size_t j = 0; j < bins->second.size(); ++j) hist[bins->first + static_cast<int>(j)] += bins->second[j];
  }
  if (groups == 0) return std::nullopt;
  plt::Series se;
  se.label = run.label + ": " + fixed(100 * saturated / groups, 2) + "% sat, " + fixed(100 * zero / groups, 1) + "% zero";
  se.color = color;
  se.markers = false;
  for (const auto& [e, c] : hist) se.x.push_back(e + 0.5), se.y.push_back(100 * c / groups);
  return se;
}

}  // namespace

std::optional<ExponentCounts> exponent_counts(const std::string& histogram_json) {
  const auto h = nlohmann::json::parse(histogram_json, nullptr, false);
  if (h.is_discarded() || !h.is_object()) return std::nullopt;
  auto bins = exponent_bins(h);
  if (!bins) return std::nullopt;
  return ExponentCounts{bins->first, std::move(bins->second), number_in(h, "zero", 0.0)};
}

std::optional<double> share_rounding_to_zero(const std::vector<Store::StatRow>& rows, const Format& f) {
  // A value with floor(log2|x|) = e lies in [2^e, 2^(e+1)): wholly below t = m/2 when
  // 2^(e+1) <= t, i.e. e <= floor(log2 t) - 1 (t = 2^(t_exp - 1) * frac, frac in [0.5, 1)).
  int t_exp = 0;
  std::frexp(f.min_positive() / 2, &t_exp);
  const int last_zeroed = t_exp - 2;
  double zeroed = 0, nonzero = 0;
  for (const auto& r : rows) {
    const auto h = exponent_counts(r.histogram);
    if (!h) continue;
    for (std::size_t i = 0; i < h->counts.size(); ++i) {
      nonzero += h->counts[i];
      if (h->lo + static_cast<int>(i) <= last_zeroed) zeroed += h->counts[i];
    }
  }
  if (nonzero == 0) return std::nullopt;
  return zeroed / nonzero;
}

std::optional<plt::Figure> metric_figure(const MetricFigure& in) {
  plt::Panel p;
  p.xlabel = in.xlabel;
  p.ylabel = in.metric + " (mean +- sd over seeds)";
  std::map<std::string, plt::Series> by_series;
  std::vector<std::string> order;
  // Points whose every run diverged have no mean: drawn at 0 (as the paper's tables give a
  // non-converged model 0.00) in grey, for metrics where higher is better.
  plt::Series diverged{"all runs diverged (drawn at 0)"};
  diverged.color = 7;
  diverged.line = false;
  for (const MetricPoint& pt : in.points) {
    if (!by_series.count(pt.series)) order.push_back(pt.series), by_series[pt.series].label = pt.series;
    auto& se = by_series[pt.series];
    se.x.push_back(pt.x);
    se.y.push_back(pt.stats.n ? pt.stats.mean : std::nan(""));
    se.err.push_back(pt.stats.n > 1 ? pt.stats.sd : 0);
    if (pt.all_diverged) diverged.x.push_back(pt.x), diverged.y.push_back(0);
  }
  if (order.empty()) return std::nullopt;
  for (const auto& k : order) p.series.push_back(sorted_by_x(by_series[k]));
  if (!diverged.x.empty() && in.higher_is_better) p.series.push_back(std::move(diverged));
  add_baseline(p, in.baseline);
  return one_panel(in.title, std::move(p), 760, 430);
}

std::optional<plt::Figure> heatmap_figure(const HeatmapFigure& in) {
  std::set<double> xs, ys;
  for (const auto& [xy, v] : in.cells) xs.insert(xy.first), ys.insert(xy.second);
  if (xs.empty()) return std::nullopt;
  plt::Heat h;
  h.xs.assign(xs.begin(), xs.end());
  h.ys.assign(ys.begin(), ys.end());
  h.value_label = in.metric + " (mean over seeds)";
  h.decimals = in.decimals;
  for (double y : h.ys) {
    std::vector<double> row;
    for (double x : h.xs) {
      const auto c = in.cells.find({x, y});
      row.push_back(c != in.cells.end() ? c->second : std::nan(""));
    }
    h.v.push_back(std::move(row));
  }
  plt::Panel p;
  p.xlabel = in.xlabel;
  p.ylabel = in.ylabel;
  p.heat = std::move(h);
  return one_panel(in.title, std::move(p), std::max(520, 90 + 46 * static_cast<int>(xs.size()) + 110),
                   std::max(360, 90 + 34 * static_cast<int>(ys.size())));
}

std::optional<plt::Figure> loss_scale_figure(const FigureTitle& title, const std::vector<LabelledTrace>& traces) {
  plt::Panel p;
  p.xlabel = "training step";
  p.ylabel = "loss scale (log2)";
  for (const LabelledTrace& t : traces) {
    if (t.trace.empty()) continue;
    plt::Series se;
    se.label = t.label;
    se.markers = false;
    for (const auto& [step, l2, skipped] : t.trace) se.x.push_back(static_cast<double>(step)), se.y.push_back(l2);
    plt::drop_flat_interior_points(se);  // a step trace: the same line from its change points
    p.series.push_back(std::move(se));
  }
  if (p.series.empty()) return std::nullopt;
  return one_panel(title, std::move(p), 760, 420);
}

std::optional<plt::Figure> histogram_figure(const HistogramFigure& in) {
  plt::Figure fig;
  fig.title = in.title.text();
  fig.cols = static_cast<int>(in.steps.size());
  fig.panel_width = 600;
  fig.panel_height = 330;
  for (const KindName& kind : in.kinds) {
    for (const std::int64_t step : in.steps) {
      std::optional<plt::Panel> p = histogram_panel(*in.stats, kind, step, in.groups);
      if (!p) continue;
      add_format_bands(*p, in.formats);
      fig.panels.push_back(std::move(*p));
    }
  }
  if (fig.panels.empty()) return std::nullopt;
  return fig;
}

std::optional<plt::Figure> block_stats_figure(const FigureTitle& title, const std::vector<KindName>& kinds,
                                              const std::vector<LabelledStats>& runs) {
  plt::Figure fig;
  fig.title = title.text();
  fig.panel_width = 900;
  fig.panel_height = 360;
  std::vector<plt::Panel> panels(kinds.size());
  for (std::size_t k = 0; k < kinds.size(); ++k) {
    panels[k].title = kinds[k].title;
    panels[k].xlabel = "scale exponent floor(log2 X)";
    panels[k].ylabel = "% of groups";
    panels[k].ymin = 0;
  }
  int color = 0;  // one per run that has any groups
  for (const LabelledStats& run : runs) {
    bool any = false;
    for (std::size_t k = 0; k < kinds.size(); ++k)
      if (auto se = block_scale_series(run, kinds[k].name, color)) panels[k].series.push_back(std::move(*se)), any = true;
    color += any;
  }
  for (auto& p : panels)
    if (!p.series.empty()) fig.panels.push_back(std::move(p));
  if (fig.panels.empty()) return std::nullopt;
  return fig;
}

std::optional<plt::Figure> points_figure(const FigureTitle& title, const std::string& metric,
                                         const std::vector<NamedPoint>& points,
                                         const std::optional<BaselineBand>& baseline) {
  plt::Panel p;
  p.xlabel = "point (see legend)";
  p.ylabel = metric + " (mean +- sd over seeds)";
  int x = 0;
  for (const NamedPoint& pt : points) {
    plt::Series se;
    se.label = std::to_string(x) + ": " + pt.name + (pt.significant ? " *" : "");
    se.line = false;
    se.color = x;
    p.xticks.emplace_back(x, std::to_string(x));
    se.x.push_back(x++);
    se.y.push_back(pt.stats.n ? pt.stats.mean : std::nan(""));
    se.err.push_back(pt.stats.n > 1 ? pt.stats.sd : 0);
    p.series.push_back(std::move(se));
  }
  if (p.series.empty()) return std::nullopt;
  add_baseline(p, baseline);
  return one_panel(title, std::move(p), 820, 460);
}

std::optional<plt::Figure> curve_figure(const FigureTitle& title, const std::string& metric,
                                        const std::vector<Curve>& curves) {
  plt::Panel p;
  p.xlabel = "training step";
  p.ylabel = metric + " (mean +- sd over seeds)";
  for (const Curve& c : curves) {
    plt::Series se;
    se.label = c.label;
    for (std::size_t i = 0; i < c.steps.size(); ++i) {
      se.x.push_back(static_cast<double>(c.steps[i]));
      se.y.push_back(c.mean[i]);
      se.err.push_back(c.sd[i]);
    }
    p.series.push_back(std::move(se));
  }
  if (p.series.empty()) return std::nullopt;
  return one_panel(title, std::move(p), 820, 460);
}

// Appendix A: SNR of the scaled integer 1.0.7 on N(0, 1) against its quantization step,
// the closed form and the measured value, beside the float formats' SNR.
plt::Figure fixed_point_snr_figure(const FigureTitle& title) {
  plt::Panel p;
  p.xlabel = "quantization step q (log2)";
  p.ylabel = "SNR (dB), input N(0, 1)";
  DistSpec d;
  d.dist = Distribution::normal;
  d.scale = 1;
  const auto x = sample(d, 1 << 16, 1);
  plt::Series model{"1.0.7 model (Appendix A)"}, measured{"1.0.7 measured (65,536 samples)"};
  model.markers = false;
  measured.line = false;
  for (int b = -4; b <= 12; ++b) {
    const Format f = make_format(0, 7, b);
    const double q = std::log2(f.min_positive());
    measured.x.push_back(q), measured.y.push_back(measured_snr_db(f, x));
  }
  for (double lq = std::log2(make_format(0, 7, 12).min_positive()); lq <= std::log2(make_format(0, 7, -4).min_positive()) + 1e-9; lq += 0.125) {
    model.x.push_back(lq);
    model.y.push_back(fixed_point_snr_model_db(127, std::exp2(lq), d));
  }
  p.series.push_back(std::move(model));
  p.series.push_back(std::move(measured));
  int color = 2;
  for (const char* name : {"1.4.3", "1.5.2"}) {
    const Format f = parse_format(name);
    p.lines.push_back({measured_snr_db(f, x), std::string(name) + " measured (bias " + std::to_string(f.bias) + ")", color++, false, true});
  }
  return one_panel(title, std::move(p), 760, 430);
}

}  // namespace fp8lab::results
