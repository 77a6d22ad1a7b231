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

