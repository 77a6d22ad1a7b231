// The progress bar's rate: in the largest unit of time that gives at least one item.
#include <gtest/gtest.h>

#include "fp8lab/core/progress.hpp"

using namespace fp8lab;

TEST(Progress, RateIsPrintedInAUnitThatShowsIt) {
  EXPECT_EQ(rate_text(12.34, "steps"), "12.3 steps/s");
  EXPECT_EQ(rate_text(1.0, "steps"), "1.0 steps/s");
  EXPECT_EQ(rate_text(0.04, "runs"), "2.4 runs/min");     // a run every 25 s
  EXPECT_EQ(rate_text(1.0 / 60, "runs"), "1.0 runs/min");
  EXPECT_EQ(rate_text(1.5 / 3600, "runs"), "1.5 runs/h");  // a run every 40 minutes
  EXPECT_EQ(rate_text(0, "runs"), "0.0 runs/s");           // nothing done yet
}
