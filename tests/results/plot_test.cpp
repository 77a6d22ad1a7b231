// Plots: the raster renderer draws what the figure holds.
#include <gtest/gtest.h>

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
