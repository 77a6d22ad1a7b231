// Plots: the raster renderer draws what the figure holds.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "fp8lab/results/plot.hpp"

using namespace fp8lab;

TEST(Plot, RasterDrawsWhatTheFigureHolds) {
  results::plot::Figure f;
  results::plot::Panel p;
  p.series.push_back({"line", {0, 1}, {0, 1}, {}, 3});  // red
  p.xmin = 0, p.xmax = 1, p.ymin = 0, p.ymax = 1;
  f.panels.push_back(p);
  int w = 0, h = 0;
  const auto px = results::plot::rasterize(f, w, h);
  ASSERT_EQ(px.size(), static_cast<std::size_t>(w) * static_cast<std::size_t>(h) * 3);
  std::size_t red = 0;
  for (std::size_t i = 0; i < px.size(); i += 3) red += px[i] > 200 && px[i + 1] < 80 && px[i + 2] < 80;
  EXPECT_GT(red, 300u);  // a diagonal of some 400 pixels, 2 wide
  f.panels[0].series.clear();
  const auto blank = results::plot::rasterize(f, w, h);
  red = 0;
  for (std::size_t i = 0; i < blank.size(); i += 3) red += blank[i] > 200 && blank[i + 1] < 80 && blank[i + 2] < 80;
  EXPECT_EQ(red, 0u);
}


TEST(Plot, ALongTitleIsDrawnSmallerNotCutOff) {
  results::plot::Figure f;
  results::plot::Panel p;
  p.series.push_back({"line", {0, 1}, {0, 1}, {}, 0});
  p.xmin = 0, p.xmax = 1, p.ymin = 0, p.ymax = 1;
  f.panels.push_back(p);
  f.title.clear();
  for (int i = 0; i < 3; ++i) f.title += "Transformer-micro, test BLEU (mean +- sd); ";  // 129 characters
  int w = 0, h = 0;
  const auto px = results::plot::rasterize(f, w, h);
  // The title's band (the top 34 rows): no dark pixel in the outer 6 columns on either side.
  std::size_t dark_at_edges = 0, dark = 0;
  for (int y = 0; y < 34; ++y)
    for (int x = 0; x < w; ++x) {
      const std::size_t i = (static_cast<std::size_t>(y) * static_cast<std::size_t>(w) + static_cast<std::size_t>(x)) * 3;
      const bool is_dark = px[i] < 128 && px[i + 1] < 128 && px[i + 2] < 128;
      dark += is_dark;
      dark_at_edges += is_dark && (x < 6 || x >= w - 6);
    }
  EXPECT_GT(dark, 200u);  // the title is drawn
  EXPECT_EQ(dark_at_edges, 0u);
  // A short title keeps its size.
  f.title = "short";
  EXPECT_NE(results::plot::to_svg(f).find("font-size=\"15.00\""), std::string::npos) << results::plot::to_svg(f).substr(0, 600);
}

// A step trace keeps the first and last point of each run of equal y, and nothing between.
TEST(Plot, DropFlatInteriorPointsKeepsEachRunsEnds) {
  results::plot::Series s{"scale", {0, 1, 2, 3, 4, 5, 6, 7}, {0, 0, 0, 1, 1, 1, 0, 2}, {}, 0};
  s.markers = false;
  results::plot::drop_flat_interior_points(s);
  EXPECT_EQ(s.x, (std::vector<double>{0, 2, 3, 5, 6, 7}));
  EXPECT_EQ(s.y, (std::vector<double>{0, 0, 1, 1, 0, 2}));
  // Two points, or none, stay as they are.
  results::plot::Series two{"", {0, 1}, {3, 3}, {}, 0};
  two.markers = false;
  results::plot::drop_flat_interior_points(two);
  EXPECT_EQ(two.x.size(), 2u);
  // A series with markers or error bars shows every point: untouched.
  results::plot::Series marked{"", {0, 1, 2}, {1, 1, 1}, {}, 0};
  results::plot::drop_flat_interior_points(marked);
  EXPECT_EQ(marked.x.size(), 3u);
  results::plot::Series bars{"", {0, 1, 2}, {1, 1, 1}, {0.1, 0.1, 0.1}, 0};
  bars.markers = false;
  results::plot::drop_flat_interior_points(bars);
  EXPECT_EQ(bars.x.size(), 3u);
}

namespace {
results::plot::Figure line_figure(std::vector<double> x, std::vector<double> y, std::string label = "a") {
  results::plot::Figure f;
  results::plot::Panel p;
  p.series.push_back({std::move(label), std::move(x), std::move(y), {}, 0});
  f.panels.push_back(p);
  return f;
}
}  // namespace

// Values a few ulps apart gave a tick step below their resolution: the tick loop never
// advanced and filled memory. Ranges past float limits gave NaN coordinates. Each figure
// must now draw, in bounded time, with pixels and SVG text.
TEST(Plot, NarrowHugeAndNonFiniteRangesDraw) {
  const std::vector<std::pair<std::vector<double>, std::vector<double>>> cases = {
      {{0, 1}, {1.0, std::nextafter(1.0, 2.0)}},
      {{0, 1}, {1e15, 1e15 + 0.125}},
      {{1e300, std::nextafter(1e300, 2e300)}, {0, 1}},
      {{-1.7e308, 1.7e308}, {-1.7e308, 1.7e308}},
      {{0, 1}, {5e-324, 1e-323}},
      {{0, 1}, {std::nan(""), std::numeric_limits<double>::infinity()}},
      {{}, {}},
  };
  for (const auto& [x, y] : cases) {
    const auto f = line_figure(x, y);
    int w = 0, h = 0;
    const auto px = results::plot::rasterize(f, w, h);
    EXPECT_EQ(px.size(), static_cast<std::size_t>(w) * static_cast<std::size_t>(h) * 3);
    const std::string svg = results::plot::to_svg(f);
    for (const char* bad : {"=\"nan", "=\"-nan", "=\"inf", "=\"-inf", ">nan<", ">inf<", ">-inf<"})
      EXPECT_EQ(svg.find(bad), std::string::npos) << bad << ", x0 " << (x.empty() ? 0 : x[0]);
  }
}

// Any label gives well-formed XML: markup escaped, control characters and bytes that are not
// UTF-8 written as U+FFFD; a label of a million characters is cut to the legend's width at a
// code point, at once (cutting it four bytes a step took minutes).
TEST(Plot, AnyLabelGivesWellFormedSvg) {
  const std::string hostile = std::string("<&\"x\0\x01\x1b[31m\xff", 12) + "\xc3\xa9";
  auto f = line_figure({0, 1}, {0, 1}, hostile);
  f.title = hostile;
  f.panels[0].xlabel = hostile;
  const std::string svg = results::plot::to_svg(f);
  for (unsigned char c : svg) EXPECT_TRUE(c >= 0x20 || c == '\n') << "byte " << static_cast<int>(c);
  EXPECT_EQ(svg.find("<&"), std::string::npos);
  EXPECT_NE(svg.find("&lt;&amp;&quot;x\xEF\xBF\xBD"), std::string::npos);
  EXPECT_NE(svg.find("\xc3\xa9"), std::string::npos);  // UTF-8 kept
  EXPECT_EQ(svg.find("\xff"), std::string::npos);

  std::string wide;
  for (int i = 0; i < 1000000; ++i) wide += "\xc3\xa9";
  const auto g = line_figure({0, 1}, {0, 1}, wide);
  const std::string s = results::plot::to_svg(g);
  EXPECT_LT(s.size(), 100000u);
  EXPECT_NE(s.find("\xc3\xa9..."), std::string::npos);  // cut between two characters, not inside one
  int w = 0, h = 0;
  EXPECT_FALSE(results::plot::rasterize(g, w, h).empty());
}
