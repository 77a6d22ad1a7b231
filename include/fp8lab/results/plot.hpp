// Plots for reports: a figure of one or more panels (lines with error bars, shaded ranges,
// reference lines, histogram bars, heat maps), laid out once and drawn twice: as SVG
// (text) and as PNG (our own anti-aliased rasterizer, text through stb_truetype with
// DejaVu Sans from Debian's fonts-dejavu-core). Files are written atomically.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace fp8lab::results::plot {

struct Series {
  std::string label;                 // legend entry ("" : none)
  std::vector<double> x, y, err;     // err: +- error bar half-heights (empty: none); NaN y: gap
  int color = -1;                    // palette index (-1: next)
  bool line = true, markers = true, dashed = false;
};

// A shaded range: of x (vertical = true: e.g. a format's representable exponents) or of y
// (e.g. the baseline's mean +- sd).
struct Band {
  double lo = 0, hi = 0;
  std::string label;
  int color = 7;
  bool vertical = true;
  double alpha = 0.15;
};

struct RefLine {  // a horizontal (or vertical) reference line, e.g. the baseline mean
  double at = 0;
  std::string label;
  int color = 7;
  bool vertical = false, dashed = true;
};

struct Bars {  // histogram bars: [left[i], left[i] + width) with height h[i]
  std::vector<double> left, h;
  double width = 1;
  std::string label;
  int color = 0;
  double alpha = 0.75;
};

struct Heat {  // cells v[row][col] at (xs[col], ys[row]); NaN: no data (hatched grey)
  std::vector<double> xs, ys;
  std::vector<std::vector<double>> v;
  std::string value_label;  // colour bar label
  bool annotate = true;     // the value in each cell
  int decimals = 1;
};

struct Panel {
  std::string title, xlabel, ylabel;
  std::vector<Series> series;
  std::vector<Band> bands;
  std::vector<RefLine> lines;
  std::vector<Bars> bars;
  std::optional<Heat> heat;
  std::optional<double> xmin, xmax, ymin, ymax;  // fixed axis limits (default: the data)
  std::vector<std::pair<double, std::string>> xticks;  // given x ticks and labels (default: nice numbers)
};

struct Figure {
  std::string title;
  std::vector<Panel> panels;
  int cols = 1;
  int panel_width = 560, panel_height = 340;  // pixels (SVG user units) per panel
};

// Drops the points inside each run of equal y, keeping its first and last, from a line drawn
// without markers or error bars: the line looks the same with far fewer points (a loss-scale
// trace of 4,720 steps that changes a few dozen times). Other series are left as they are.
void drop_flat_interior_points(Series& s);

std::string to_svg(const Figure& f);
// RGB pixels, row-major, 3 bytes each; width/height out.
std::vector<std::uint8_t> rasterize(const Figure& f, int& width, int& height);
// Writes <stem>.svg and <stem>.png (each via a temporary file and rename).
void save(const Figure& f, const std::string& stem);

// The font the PNGs use; throws Error naming the file and the package when it is missing.
const std::string& font_path();

}  // namespace fp8lab::results::plot
