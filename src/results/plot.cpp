#include "fp8lab/results/plot.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <mutex>
#include <sstream>

#include "fp8lab/core/error.hpp"
#include "fp8lab/core/files.hpp"
#include "fp8lab/core/text.hpp"

#define STB_TRUETYPE_IMPLEMENTATION
#define STBTT_STATIC
#include <stb_truetype.h>
#define STB_IMAGE_WRITE_STATIC
#define STB_IMAGE_WRITE_IMPLEMENTATION
#include <stb_image_write.h>

namespace fp8lab::results::plot {

namespace fs = std::filesystem;

namespace {

struct RGB {
  std::uint8_t r, g, b;
};
constexpr RGB kPalette[] = {{31, 119, 180}, {255, 127, 14}, {44, 160, 44},  {214, 39, 40},  {148, 103, 189},
                            {140, 86, 75},  {227, 119, 194}, {127, 127, 127}, {188, 189, 34}, {23, 190, 207}};
constexpr RGB kBlack{0, 0, 0}, kGrid{225, 225, 225}, kText{30, 30, 30}, kWhite{255, 255, 255},
    kNoData{200, 200, 200};
RGB palette(int i) { return kPalette[((i % 10) + 10) % 10]; }

RGB viridis(double t) {
  static constexpr RGB stops[] = {{68, 1, 84}, {59, 82, 139}, {33, 145, 140}, {94, 201, 98}, {253, 231, 37}};
  t = std::clamp(t, 0.0, 1.0) * 4;
  const int i = std::min(3, static_cast<int>(t));
  const double f = t - i;
  auto mix = [&](std::uint8_t a, std::uint8_t b) { return static_cast<std::uint8_t>(std::lround(a + (b - a) * f)); };
  return {mix(stops[i].r, stops[i + 1].r), mix(stops[i].g, stops[i + 1].g), mix(stops[i].b, stops[i + 1].b)};
}

// The display list both back ends draw.
struct Prim {
  enum Kind { line, rect, circle, text } kind;
  double x0 = 0, y0 = 0, x1 = 0, y1 = 0, w = 1;  // line ends / rect corners / circle centre+radius(w)
  RGB c{0, 0, 0};
  double alpha = 1;
  bool dashed = false;
  std::string s;     // text (UTF-8)
  double size = 12;  // font size, pixels
  int anchor = 0;    // text: 0 start, 1 middle, 2 end (along the text direction)
  bool vertical = false;  // text rotated 90 degrees counter-clockwise
  bool bold = false;
};

using List = std::vector<Prim>;

void add_line(List& l, double x0, double y0, double x1, double y1, RGB c, double w = 1, bool dashed = false,
              double alpha = 1) {
  Prim p{Prim::line};
  p.x0 = x0, p.y0 = y0, p.x1 = x1, p.y1 = y1, p.c = c, p.w = w, p.dashed = dashed, p.alpha = alpha;
  l.push_back(p);
}
void add_rect(List& l, double x0, double y0, double x1, double y1, RGB c, double alpha = 1) {
  Prim p{Prim::rect};
  p.x0 = std::min(x0, x1), p.y0 = std::min(y0, y1), p.x1 = std::max(x0, x1), p.y1 = std::max(y0, y1);
  p.c = c, p.alpha = alpha;
  l.push_back(p);
}
void add_circle(List& l, double x, double y, double r, RGB c) {
  Prim p{Prim::circle};
  p.x0 = x, p.y0 = y, p.w = r, p.c = c;
  l.push_back(p);
}
void add_text(List& l, double x, double y, const std::string& s, double size, int anchor = 0, bool vertical = false,
              RGB c = kText, bool bold = false) {
  if (s.empty()) return;
  Prim p{Prim::text};
  p.x0 = x, p.y0 = y, p.s = s, p.size = size, p.anchor = anchor, p.vertical = vertical, p.c = c, p.bold = bold;
  l.push_back(p);
}

std::size_t utf8_length(const std::string& s) {
  std::size_t n = 0;
  for (unsigned char ch : s) n += (ch & 0xC0) != 0x80;
  return n;
}
double text_width(const std::string& s, double size) { return 0.58 * size * static_cast<double>(utf8_length(s)); }
// s, or its first code points and "..." where it is wider than `width` at size 11 (cut at a
// code point, never inside one).
std::string fitted_label(const std::string& s, double width) {
  if (text_width(s, 11) <= width) return s;
  const double keep = std::max(1.0, std::floor(width / (0.58 * 11)) - 3);
  std::size_t i = 0;
  for (double n = 0; n < keep && i < s.size(); ++n) {
    const auto ch = utf8_at(s, i);
    i += ch ? ch->size : 1;
  }
  return s.substr(0, i) + "...";
}
// The font size at which s fits `width` (at most `size`; a title too long for its plot is
// drawn smaller rather than cut off at the edges).
double fitting_size(const std::string& s, double size, double width) {
  const double w = text_width(s, size);
  return w > width && w > 0 ? size * width / w : size;
}

std::string num(double v) {
  if (v == 0) return "0";
  char b[32];
  const double a = std::fabs(v);
  if (a >= 1e5 || a < 1e-3) std::snprintf(b, sizeof b, "%.3g", v);
  else std::snprintf(b, sizeof b, "%.6g", v);
  return b;
}

// About n "nice" ticks (1, 2, 5 x 10^k) covering [lo, hi]. A range too narrow for ticks that
// differ in double precision (values a few ulps apart) gets one tick, lo: a step below the
// values' resolution would never advance.
std::vector<double> ticks(double lo, double hi, int n = 6) {
  if (!(hi > lo) || !std::isfinite(hi - lo)) return {lo};
  const double raw = (hi - lo) / n;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * mag >= raw) {
      step = m * mag;
      break;
    }
  const double first = std::ceil(lo / step - 1e-9), last = std::floor(hi / step + 1e-9);
  if (!(step > 0) || !std::isfinite(first) || !std::isfinite(last) || !(last - first <= 4.0 * n) ||
      lo + step == lo || hi - step == hi)
    return {lo};
  std::vector<double> t;
  for (int i = 0; i <= static_cast<int>(last - first); ++i) {
    const double v = (first + i) * step;
    t.push_back(std::fabs(v) < step * 1e-9 ? 0 : v);
  }
  return t;
}

// Values farther from zero than this are drawn at the edge: a range between them and their
// negatives stays finite, and so does every coordinate computed from it.
constexpr double kPlotLimit = 1e300;

struct Range {
  double lo = std::numeric_limits<double>::infinity(), hi = -std::numeric_limits<double>::infinity();
  void add(double v) {
    if (std::isfinite(v)) v = std::clamp(v, -kPlotLimit, kPlotLimit), lo = std::min(lo, v), hi = std::max(hi, v);
  }
  bool empty() const { return !(hi >= lo); }
};

// A legend entry: label, colour, kind (0 line, 1 patch, 2 dashed line, 3 marker), alpha.
struct LegendEntry {
  std::string label;
  RGB c;
  int kind;
  double alpha;
};

// The series' colours (automatic ones numbered in order) and the panel's legend entries.
std::vector<LegendEntry> legend_of(const Panel& p, std::vector<int>& colors) {
  int auto_color = 0;
  std::vector<LegendEntry> legend;
  for (const auto& b : p.bars)
    if (!b.label.empty()) legend.push_back({b.label, palette(b.color), 1, b.alpha});
  for (const auto& s : p.series) {
    const int c = s.color >= 0 ? s.color : auto_color++;
    colors.push_back(c);
    if (!s.label.empty()) legend.push_back({s.label, palette(c), !s.line ? 3 : s.dashed ? 2 : 0, 1});
  }
  for (const auto& b : p.bands)
    if (!b.label.empty()) legend.push_back({b.label, palette(b.color), 1, std::max(b.alpha, 0.3)});
  for (const auto& r : p.lines)
    if (!r.label.empty()) legend.push_back({r.label, palette(r.color), r.dashed ? 2 : 0, 1});
  return legend;
}

// The x and y ranges the panel shows: its heat map's cells, or its data padded a little;
// explicit limits win.
std::pair<Range, Range> ranges_of(const Panel& p) {
  Range xr, yr;
  if (p.heat) {
    xr = {-0.5, static_cast<double>(p.heat->xs.size()) - 0.5};
    yr = {-0.5, static_cast<double>(p.heat->ys.size()) - 0.5};
  } else {
    for (const auto& s : p.series)
      for (std::size_t i = 0; i < s.x.size(); ++i) {
        xr.add(s.x[i]);
        const double e = i < s.err.size() && std::isfinite(s.err[i]) ? s.err[i] : 0;
        yr.add(s.y[i] - e), yr.add(s.y[i] + e);
      }
    for (const auto& b : p.bars)
      for (std::size_t i = 0; i < b.left.size(); ++i) xr.add(b.left[i]), xr.add(b.left[i] + b.width), yr.add(b.h[i]), yr.add(0);
    for (const auto& b : p.bands) (b.vertical ? xr : yr).add(b.lo), (b.vertical ? xr : yr).add(b.hi);
    for (const auto& r : p.lines) (r.vertical ? xr : yr).add(r.at);
    if (xr.empty()) xr = {0, 1};
    if (yr.empty()) yr = {0, 1};
    if (xr.hi == xr.lo) xr.lo -= 1, xr.hi += 1;
    if (xr.hi == xr.lo) xr.lo -= std::fabs(xr.lo) * 0.1, xr.hi += std::fabs(xr.hi) * 0.1;  // past 2^53, 1 is below an ulp
    if (yr.hi == yr.lo) yr.lo -= std::max(1.0, std::fabs(yr.lo) * 0.1), yr.hi += std::max(1.0, std::fabs(yr.hi) * 0.1);
    const double xpad = (xr.hi - xr.lo) * 0.04, ypad = (yr.hi - yr.lo) * 0.06;
    xr.lo -= xpad, xr.hi += xpad, yr.lo -= ypad, yr.hi += ypad;
  }
  if (p.xmin) xr.lo = *p.xmin;
  if (p.xmax) xr.hi = *p.xmax;
  if (p.ymin) yr.lo = *p.ymin;
  if (p.ymax) yr.hi = *p.ymax;
  return {xr, yr};
}

// The plot area of a panel and the map from data to pixels.
struct Frame {
  double left, right, top, bottom;
  Range xr, yr;
  double X(double v) const { return left + (v - xr.lo) / (xr.hi - xr.lo) * (right - left); }
  double Y(double v) const { return bottom - (v - yr.lo) / (yr.hi - yr.lo) * (bottom - top); }
  double clipx(double v) const { return std::clamp(v, left, right); }
  double clipy(double v) const { return std::clamp(v, top, bottom); }
};

void draw_axes(List& l, const Panel& p, const Frame& f, double ox) {
  if (p.heat) {
    const auto& h = *p.heat;
    for (std::size_t i = 0; i < h.xs.size(); ++i) add_text(l, f.X(static_cast<double>(i)), f.bottom + 14, num(h.xs[i]), 11, 1);
    for (std::size_t i = 0; i < h.ys.size(); ++i) add_text(l, f.left - 6, f.Y(static_cast<double>(i)), num(h.ys[i]), 11, 2);
  } else {
    std::vector<std::pair<double, std::string>> xt = p.xticks;
    if (xt.empty())
      for (double t : ticks(f.xr.lo, f.xr.hi)) xt.emplace_back(t, num(t));
    for (const auto& [t, label] : xt) {
      if (t < f.xr.lo || t > f.xr.hi) continue;
      add_line(l, f.X(t), f.top, f.X(t), f.bottom, kGrid);
      add_line(l, f.X(t), f.bottom, f.X(t), f.bottom + 4, kBlack);
      add_text(l, f.X(t), f.bottom + 14, label, 11, 1);
    }
    for (double t : ticks(f.yr.lo, f.yr.hi, 5)) {
      if (t < f.yr.lo || t > f.yr.hi) continue;
      add_line(l, f.left, f.Y(t), f.right, f.Y(t), kGrid);
      add_line(l, f.left - 4, f.Y(t), f.left, f.Y(t), kBlack);
      add_text(l, f.left - 6, f.Y(t), num(t), 11, 2);
    }
  }
  add_text(l, (f.left + f.right) / 2, f.bottom + 34, p.xlabel, 12, 1);
  add_text(l, ox + 14, (f.top + f.bottom) / 2, p.ylabel, 12, 1, true);
}

void draw_bands_and_bars(List& l, const Panel& p, const Frame& f) {
  for (const auto& b : p.bands) {
    if (b.vertical) add_rect(l, f.clipx(f.X(b.lo)), f.top, f.clipx(f.X(b.hi)), f.bottom, palette(b.color), b.alpha);
    else add_rect(l, f.left, f.clipy(f.Y(b.hi)), f.right, f.clipy(f.Y(b.lo)), palette(b.color), b.alpha);
  }
  for (const auto& b : p.bars)
    for (std::size_t i = 0; i < b.left.size(); ++i)
      if (b.h[i] > 0)
        add_rect(l, f.clipx(f.X(b.left[i]) + 0.5), f.clipy(f.Y(b.h[i])), f.clipx(f.X(b.left[i] + b.width) - 0.5),
                 f.clipy(f.Y(std::max(0.0, f.yr.lo))), palette(b.color), b.alpha);
}

void draw_colour_bar(List& l, const Heat& h, const Frame& f, const Range& vr) {
  const double cx0 = f.right + 18, cx1 = cx0 + 14;
  const int steps = 64;
  for (int i = 0; i < steps; ++i) {
    const double y0 = f.bottom - (f.bottom - f.top) * i / steps, y1 = f.bottom - (f.bottom - f.top) * (i + 1) / steps;
    add_rect(l, cx0, y1, cx1, y0 + 0.5, viridis((i + 0.5) / steps));
  }
  for (double t : ticks(vr.lo, vr.hi, 4)) {
    if (t < vr.lo || t > vr.hi) continue;
    const double y = f.bottom - (t - vr.lo) / (vr.hi - vr.lo) * (f.bottom - f.top);
    add_line(l, cx1, y, cx1 + 3, y, kBlack);
    add_text(l, cx1 + 5, y, num(t), 10, 0);
  }
  add_text(l, cx1 + 50, (f.top + f.bottom) / 2, h.value_label, 11, 1, true);
}

void draw_heat(List& l, const Heat& h, const Frame& f) {
  Range vr;
  for (const auto& row : h.v)
    for (double v : row) vr.add(v);
  if (vr.empty()) vr = {0, 1};
  if (vr.hi == vr.lo) vr.hi = vr.lo + 1;
  for (std::size_t r = 0; r < h.ys.size(); ++r)
    for (std::size_t c = 0; c < h.xs.size(); ++c) {
      const double v = r < h.v.size() && c < h.v[r].size() ? h.v[r][c] : std::nan("");
      const double x0 = f.X(c - 0.5), x1 = f.X(c + 0.5), y0 = f.Y(r - 0.5), y1 = f.Y(r + 0.5);
      if (!std::isfinite(v)) {
        add_rect(l, x0, y0, x1, y1, kNoData);
        add_line(l, x0, y0, x1, y1, kWhite, 1);
        continue;
      }
      const double t = (v - vr.lo) / (vr.hi - vr.lo);
      add_rect(l, x0, y0, x1, y1, viridis(t));
      if (h.annotate && std::fabs(x1 - x0) > 22) {
        char b[32];
        std::snprintf(b, sizeof b, "%.*f", h.decimals, v);
        add_text(l, (x0 + x1) / 2, (y0 + y1) / 2, b, std::min(11.0, std::fabs(x1 - x0) / 4), 1, false,
                 t > 0.6 ? kBlack : kWhite);
      }
    }
  draw_colour_bar(l, h, f, vr);
}

void draw_reference_lines(List& l, const Panel& p, const Frame& f) {
  for (const auto& r : p.lines) {
    if (r.vertical) {
      if (r.at >= f.xr.lo && r.at <= f.xr.hi) add_line(l, f.X(r.at), f.top, f.X(r.at), f.bottom, palette(r.color), 1.5, r.dashed);
    } else if (r.at >= f.yr.lo && r.at <= f.yr.hi) {
      add_line(l, f.left, f.Y(r.at), f.right, f.Y(r.at), palette(r.color), 1.5, r.dashed);
    }
  }
}

void draw_series(List& l, const Series& s, RGB c, const Frame& f) {
  const std::size_t n = std::min(s.x.size(), s.y.size());
  auto inside = [&](double x, double y) {
    return std::isfinite(x) && std::isfinite(y) && x >= f.xr.lo && x <= f.xr.hi && y >= f.yr.lo && y <= f.yr.hi;
  };
  if (s.line)
    for (std::size_t i = 1; i < n; ++i)
      if (inside(s.x[i - 1], s.y[i - 1]) && inside(s.x[i], s.y[i]))
        add_line(l, f.X(s.x[i - 1]), f.Y(s.y[i - 1]), f.X(s.x[i]), f.Y(s.y[i]), c, 2, s.dashed);
  for (std::size_t i = 0; i < n; ++i) {
    if (!inside(s.x[i], s.y[i])) continue;
    if (i < s.err.size() && std::isfinite(s.err[i]) && s.err[i] > 0) {
      const double y0 = f.clipy(f.Y(s.y[i] - s.err[i])), y1 = f.clipy(f.Y(s.y[i] + s.err[i]));
      add_line(l, f.X(s.x[i]), y0, f.X(s.x[i]), y1, c, 1.5);
      add_line(l, f.X(s.x[i]) - 4, y0, f.X(s.x[i]) + 4, y0, c, 1.5);
      add_line(l, f.X(s.x[i]) - 4, y1, f.X(s.x[i]) + 4, y1, c, 1.5);
    }
    if (s.markers) add_circle(l, f.X(s.x[i]), f.Y(s.y[i]), 3.2, c);
  }
}

void draw_frame(List& l, const Frame& f) {
  add_line(l, f.left, f.top, f.right, f.top, kBlack);
  add_line(l, f.left, f.bottom, f.right, f.bottom, kBlack);
  add_line(l, f.left, f.top, f.left, f.bottom, kBlack);
  add_line(l, f.right, f.top, f.right, f.bottom, kBlack);
}

// The legend, right of the plot area, from its top down to the plot's bottom.
void draw_legend(List& l, const std::vector<LegendEntry>& legend, double lx, double legend_w, const Frame& f) {
  double ly = f.top + 8;
  for (const auto& e : legend) {
    if (ly > f.bottom) break;
    if (e.kind == 1) add_rect(l, lx, ly - 5, lx + 22, ly + 5, e.c, e.alpha);
    else if (e.kind == 3) add_circle(l, lx + 11, ly, 3.2, e.c);
    else add_line(l, lx, ly, lx + 22, ly, e.c, 2, e.kind == 2);
    add_text(l, lx + 28, ly, fitted_label(e.label, legend_w - 30), 11, 0);
    ly += 17;
  }
}

// One panel in the box (ox, oy, pw, ph). Content back to front: axes and grid, bands, bars,
// heat cells, reference lines, series, the frame, the legend.
void layout_panel(List& l, const Panel& p, double ox, double oy, double pw, double ph) {
  std::vector<int> colors;
  const std::vector<LegendEntry> legend = legend_of(p, colors);
  double legend_w = 0;
  for (const auto& e : legend) legend_w = std::max(legend_w, text_width(e.label, 11) + 34);
  legend_w = std::min(legend_w, pw * 0.42);
  Frame f;
  f.left = ox + 66, f.top = oy + (p.title.empty() ? 12 : 32);
  f.right = ox + pw - 14 - (legend.empty() ? 0 : legend_w + 8) - (p.heat ? 74 : 0);
  f.bottom = oy + ph - 48;
  add_text(l, ox + pw / 2, oy + 14, p.title, fitting_size(p.title, 13, pw - 20), 1, false, kText, true);
  std::tie(f.xr, f.yr) = ranges_of(p);
  draw_axes(l, p, f, ox);
  draw_bands_and_bars(l, p, f);
  if (p.heat) draw_heat(l, *p.heat, f);
  draw_reference_lines(l, p, f);
  for (std::size_t si = 0; si < p.series.size(); ++si) draw_series(l, p.series[si], palette(colors[si]), f);
  draw_frame(l, f);
  draw_legend(l, legend, ox + pw - 10 - legend_w, legend_w, f);
}

List layout(const Figure& f, int& width, int& height) {
  const int cols = std::max(1, std::min<int>(f.cols, static_cast<int>(std::max<std::size_t>(1, f.panels.size()))));
  const int rows = static_cast<int>((f.panels.size() + static_cast<std::size_t>(cols) - 1) / static_cast<std::size_t>(cols));
  const double title_h = f.title.empty() ? 0 : 34;
  width = cols * f.panel_width;
  height = static_cast<int>(title_h) + std::max(1, rows) * f.panel_height;
  List l;
  add_rect(l, 0, 0, width, height, kWhite);
  add_text(l, width / 2.0, 18, f.title, fitting_size(f.title, 15, width - 20), 1, false, kText, true);
  for (std::size_t i = 0; i < f.panels.size(); ++i) {
    const double ox = static_cast<double>(i % static_cast<std::size_t>(cols)) * f.panel_width;
    const double oy = title_h + static_cast<double>(i / static_cast<std::size_t>(cols)) * f.panel_height;
    layout_panel(l, f.panels[i], ox, oy, f.panel_width, f.panel_height);
  }
  return l;
}

std::string hex(RGB c) {
  char b[8];
  std::snprintf(b, sizeof b, "#%02x%02x%02x", c.r, c.g, c.b);
  return b;
}
// Text as XML character data: markup characters escaped, and what XML 1.0 may not hold (a
// control character, a byte that is not UTF-8) written as U+FFFD, so any label gives a
// well-formed SVG.
std::string esc(const std::string& s) {
  std::string o;
  for (std::size_t i = 0; i < s.size();) {
    const auto ch = utf8_at(s, i);
    const char c = s[i];
    if (!ch || (ch->size == 1 && static_cast<unsigned char>(c) < 0x20) || c == 0x7f) o += "\xEF\xBF\xBD";
    else if (c == '&') o += "&amp;";
    else if (c == '<') o += "&lt;";
    else if (c == '>') o += "&gt;";
    else if (c == '"') o += "&quot;";
    else o.append(s, i, ch->size);
    i += ch ? ch->size : 1;
  }
  return o;
}
std::string f2(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f", v);
  return b;
}

// --- raster -----------------------------------------------------------------------------

struct Font {
  std::vector<unsigned char> data;
  stbtt_fontinfo info{};
  int ascent = 0, descent = 0, gap = 0;
};

const Font& font(bool bold) {
  static std::once_flag once[2];
  static Font fonts[2];
  std::call_once(once[bold], [&] {
    std::string path = font_path();
    if (bold) {
      const std::string b = fs::path(path).parent_path() / "DejaVuSans-Bold.ttf";
      if (fs::exists(b)) path = b;
    }
    std::ifstream in(path, std::ios::binary);
    fonts[bold].data.assign(std::istreambuf_iterator<char>(in), {});
    if (fonts[bold].data.empty() ||
        !stbtt_InitFont(&fonts[bold].info, fonts[bold].data.data(), stbtt_GetFontOffsetForIndex(fonts[bold].data.data(), 0)))
      throw Error(path + ": not a TrueType font");
    stbtt_GetFontVMetrics(&fonts[bold].info, &fonts[bold].ascent, &fonts[bold].descent, &fonts[bold].gap);
  });
  return fonts[bold];
}

// The code points of `s`; a byte that is not UTF-8 is drawn as U+FFFD.
std::vector<int> codepoints(const std::string& s) {
  std::vector<int> out;
  for (std::size_t i = 0; i < s.size();) {
    const auto ch = utf8_at(s, i);
    out.push_back(ch ? static_cast<int>(ch->code_point) : 0xFFFD);
    i += ch ? ch->size : 1;
  }
  return out;
}

class Canvas {
 public:
  Canvas(int w, int h) : w_(w), h_(h), px_(static_cast<std::size_t>(w) * static_cast<std::size_t>(h) * 3, 1.0f) {}
  void blend(int x, int y, RGB c, double a) {
    if (x < 0 || y < 0 || x >= w_ || y >= h_ || a <= 0) return;
    a = std::min(a, 1.0);
    float* p = &px_[(static_cast<std::size_t>(y) * static_cast<std::size_t>(w_) + static_cast<std::size_t>(x)) * 3];
    p[0] = static_cast<float>(p[0] * (1 - a) + c.r / 255.0 * a);
    p[1] = static_cast<float>(p[1] * (1 - a) + c.g / 255.0 * a);
    p[2] = static_cast<float>(p[2] * (1 - a) + c.b / 255.0 * a);
  }
  void rect(const Prim& p) {
    for (int y = static_cast<int>(std::floor(p.y0)); y < static_cast<int>(std::ceil(p.y1)); ++y) {
      const double cy = std::min(p.y1, y + 1.0) - std::max(p.y0, static_cast<double>(y));
      for (int x = static_cast<int>(std::floor(p.x0)); x < static_cast<int>(std::ceil(p.x1)); ++x) {
        const double cx = std::min(p.x1, x + 1.0) - std::max(p.x0, static_cast<double>(x));
        blend(x, y, p.c, p.alpha * cx * cy);
      }
    }
  }
  void line(const Prim& p) {
    const double hw = p.w / 2;
    const double dx = p.x1 - p.x0, dy = p.y1 - p.y0, len2 = dx * dx + dy * dy, len = std::sqrt(len2);
    const int xa = static_cast<int>(std::floor(std::min(p.x0, p.x1) - hw - 1)), xb = static_cast<int>(std::ceil(std::max(p.x0, p.x1) + hw + 1));
    const int ya = static_cast<int>(std::floor(std::min(p.y0, p.y1) - hw - 1)), yb = static_cast<int>(std::ceil(std::max(p.y0, p.y1) + hw + 1));
    for (int y = std::max(ya, 0); y <= std::min(yb, h_ - 1); ++y)
      for (int x = std::max(xa, 0); x <= std::min(xb, w_ - 1); ++x) {
        const double px = x + 0.5, py = y + 0.5;
        double t = len2 > 0 ? ((px - p.x0) * dx + (py - p.y0) * dy) / len2 : 0;
        t = std::clamp(t, 0.0, 1.0);
        if (p.dashed && std::fmod(t * len, 10.0) > 6.0) continue;
        const double ex = p.x0 + t * dx - px, ey = p.y0 + t * dy - py;
        const double d = std::sqrt(ex * ex + ey * ey);
        blend(x, y, p.c, p.alpha * std::clamp(hw + 0.5 - d, 0.0, 1.0));
      }
  }
  void circle(const Prim& p) {
    const double r = p.w;
    for (int y = static_cast<int>(p.y0 - r - 1); y <= static_cast<int>(p.y0 + r + 1); ++y)
      for (int x = static_cast<int>(p.x0 - r - 1); x <= static_cast<int>(p.x0 + r + 1); ++x) {
        const double d = std::hypot(x + 0.5 - p.x0, y + 0.5 - p.y0);
        blend(x, y, p.c, std::clamp(r + 0.5 - d, 0.0, 1.0));
      }
  }
  void text(const Prim& p) {
    const Font& f = font(p.bold);
    const float scale = stbtt_ScaleForPixelHeight(&f.info, static_cast<float>(p.size));
    const auto cps = codepoints(p.s);
    // Lay the glyphs out on a horizontal strip, then place it (rotated if vertical).
    double width = 0;
    for (std::size_t i = 0; i < cps.size(); ++i) {
      int adv, lsb;
      stbtt_GetCodepointHMetrics(&f.info, cps[i], &adv, &lsb);
      width += adv * scale;
      if (i + 1 < cps.size()) width += scale * stbtt_GetCodepointKernAdvance(&f.info, cps[i], cps[i + 1]);
    }
    const int sw = static_cast<int>(std::ceil(width)) + 2;
    const int sh = static_cast<int>(std::ceil((f.ascent - f.descent) * scale)) + 2;
    std::vector<unsigned char> strip(static_cast<std::size_t>(sw) * static_cast<std::size_t>(sh), 0);
    const double baseline = f.ascent * scale;
    double pen = 0;
    for (std::size_t i = 0; i < cps.size(); ++i) {
      int x0, y0, x1, y1;
      const float sx = static_cast<float>(pen - std::floor(pen));
      stbtt_GetCodepointBitmapBoxSubpixel(&f.info, cps[i], scale, scale, sx, 0, &x0, &y0, &x1, &y1);
      const int gw = x1 - x0, gh = y1 - y0;
      if (gw > 0 && gh > 0) {
        std::vector<unsigned char> g(static_cast<std::size_t>(gw) * static_cast<std::size_t>(gh));
        stbtt_MakeCodepointBitmapSubpixel(&f.info, g.data(), gw, gh, gw, scale, scale, sx, 0, cps[i]);
        const int ox = static_cast<int>(std::floor(pen)) + x0, oy = static_cast<int>(std::lround(baseline)) + y0;
        for (int y = 0; y < gh; ++y)
          for (int x = 0; x < gw; ++x) {
            const int tx = ox + x, ty = oy + y;
            if (tx < 0 || ty < 0 || tx >= sw || ty >= sh) continue;
            auto& d = strip[static_cast<std::size_t>(ty) * static_cast<std::size_t>(sw) + static_cast<std::size_t>(tx)];
            d = static_cast<unsigned char>(std::min(255, d + g[static_cast<std::size_t>(y) * static_cast<std::size_t>(gw) + static_cast<std::size_t>(x)]));
          }
      }
      int adv, lsb;
      stbtt_GetCodepointHMetrics(&f.info, cps[i], &adv, &lsb);
      pen += adv * scale;
      if (i + 1 < cps.size()) pen += scale * stbtt_GetCodepointKernAdvance(&f.info, cps[i], cps[i + 1]);
    }
    // (x0, y0) is the anchor point on the text's vertical middle.
    const double along = p.anchor == 0 ? 0 : p.anchor == 1 ? width / 2 : width;
    const double mid = sh / 2.0;
    for (int y = 0; y < sh; ++y)
      for (int x = 0; x < sw; ++x) {
        const unsigned char a = strip[static_cast<std::size_t>(y) * static_cast<std::size_t>(sw) + static_cast<std::size_t>(x)];
        if (!a) continue;
        int tx, ty;
        if (!p.vertical) {
          tx = static_cast<int>(std::lround(p.x0 - along)) + x;
          ty = static_cast<int>(std::lround(p.y0 - mid)) + y;
        } else {  // rotated 90 degrees counter-clockwise: reads bottom to top
          tx = static_cast<int>(std::lround(p.x0 - mid)) + y;
          ty = static_cast<int>(std::lround(p.y0 + along)) - x;
        }
        blend(tx, ty, p.c, a / 255.0);
      }
  }
  std::vector<std::uint8_t> bytes() const {
    std::vector<std::uint8_t> out(px_.size());
    for (std::size_t i = 0; i < px_.size(); ++i)
      out[i] = static_cast<std::uint8_t>(std::lround(std::clamp(px_[i], 0.0f, 1.0f) * 255));
    return out;
  }

 private:
  int w_, h_;
  std::vector<float> px_;
};

}  // namespace

const std::string& font_path() {
  static const std::string p = [] {
    if (const char* env = std::getenv("FP8LAB_FONT")) return std::string(env);
    for (const char* c : {"/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf", "/usr/share/fonts/TTF/DejaVuSans.ttf",
                          "/usr/share/fonts/dejavu/DejaVuSans.ttf"})
      if (fs::exists(c)) return std::string(c);
    return std::string();
  }();
  if (p.empty() || !fs::exists(p))
    throw Error("no font for PNG plots: /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf is missing "
                "(apt-get install fonts-dejavu-core, or set FP8LAB_FONT to a .ttf file)");
  return p;
}

void drop_flat_interior_points(Series& s) {
  if (s.markers || !s.err.empty() || s.x.size() != s.y.size()) return;
  std::vector<double> x, y;
  const std::size_t n = s.y.size();
  for (std::size_t i = 0; i < n; ++i) {
    const bool interior = i > 0 && i + 1 < n && s.y[i] == s.y[i - 1] && s.y[i] == s.y[i + 1];
    if (!interior) x.push_back(s.x[i]), y.push_back(s.y[i]);
  }
  s.x = std::move(x);
  s.y = std::move(y);
}

std::string to_svg(const Figure& f) {
  int w, h;
  const List l = layout(f, w, h);
  std::ostringstream o;
  o << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
    << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << w << "\" height=\"" << h << "\" viewBox=\"0 0 " << w
    << " " << h << "\" font-family=\"DejaVu Sans, Verdana, sans-serif\">\n";
  if (!f.title.empty()) o << "<title>" << esc(f.title) << "</title>\n";
  for (const auto& p : l) {
    switch (p.kind) {
      case Prim::line:
        o << "<line x1=\"" << f2(p.x0) << "\" y1=\"" << f2(p.y0) << "\" x2=\"" << f2(p.x1) << "\" y2=\"" << f2(p.y1)
          << "\" stroke=\"" << hex(p.c) << "\" stroke-width=\"" << f2(p.w) << "\"";
        if (p.dashed) o << " stroke-dasharray=\"6 4\"";
        if (p.alpha < 1) o << " stroke-opacity=\"" << f2(p.alpha) << "\"";
        o << "/>\n";
        break;
      case Prim::rect:
        o << "<rect x=\"" << f2(p.x0) << "\" y=\"" << f2(p.y0) << "\" width=\"" << f2(p.x1 - p.x0) << "\" height=\""
          << f2(p.y1 - p.y0) << "\" fill=\"" << hex(p.c) << "\"";
        if (p.alpha < 1) o << " fill-opacity=\"" << f2(p.alpha) << "\"";
        o << "/>\n";
        break;
      case Prim::circle:
        o << "<circle cx=\"" << f2(p.x0) << "\" cy=\"" << f2(p.y0) << "\" r=\"" << f2(p.w) << "\" fill=\"" << hex(p.c)
          << "\"/>\n";
        break;
      case Prim::text:
        o << "<text x=\"" << f2(p.x0) << "\" y=\"" << f2(p.y0) << "\" font-size=\"" << f2(p.size)
          << "\" dominant-baseline=\"central\" text-anchor=\""
          << (p.anchor == 0 ? "start" : p.anchor == 1 ? "middle" : "end") << "\" fill=\"" << hex(p.c) << "\"";
        if (p.bold) o << " font-weight=\"bold\"";
        if (p.vertical) o << " transform=\"rotate(-90 " << f2(p.x0) << " " << f2(p.y0) << ")\"";
        o << ">" << esc(p.s) << "</text>\n";
        break;
    }
  }
  o << "</svg>\n";
  return o.str();
}

std::vector<std::uint8_t> rasterize(const Figure& f, int& width, int& height) {
  const List l = layout(f, width, height);
  Canvas c(width, height);
  for (const auto& p : l) {
    switch (p.kind) {
      case Prim::line: c.line(p); break;
      case Prim::rect: c.rect(p); break;
      case Prim::circle: c.circle(p); break;
      case Prim::text: c.text(p); break;
    }
  }
  return c.bytes();
}

void save(const Figure& f, const std::string& stem) {
  const std::string svg = to_svg(f);
  write_file_atomic(stem + ".svg", svg.data(), svg.size());
  int w, h;
  const auto px = rasterize(f, w, h);
  std::vector<std::uint8_t> png;
  stbi_write_png_to_func(
      [](void* ctx, void* data, int size) {
        auto* v = static_cast<std::vector<std::uint8_t>*>(ctx);
        v->insert(v->end(), static_cast<std::uint8_t*>(data), static_cast<std::uint8_t*>(data) + size);
      },
      &png, w, h, 3, px.data(), w * 3);
  if (png.empty()) throw Error(stem + ".png: PNG encoding failed");
  write_file_atomic(stem + ".png", png.data(), png.size());
}

}  // namespace fp8lab::results::plot
