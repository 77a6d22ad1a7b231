#include "fp8lab/core/machine.hpp"

#include <gtest/gtest.h>

#include <thread>

#if defined(__linux__)
#include <sched.h>
#endif

namespace fp8lab {
namespace {

TEST(Machine, CoreCountIsTheAffinityMasksSize) {
  const int n = core_count();
  EXPECT_GE(n, 1);
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  EXPECT_EQ(n, CPU_COUNT(&set));
#endif
}

#if defined(__linux__)
// A thread bound to one CPU (as taskset -c or a Slurm task binding would) sees one core,
// whatever the machine has.
TEST(Machine, CoreCountFollowsANarrowedMask) {
  cpu_set_t all;
  CPU_ZERO(&all);
  ASSERT_EQ(sched_getaffinity(0, sizeof(all), &all), 0);
  int first = 0;
  while (!CPU_ISSET(first, &all)) ++first;
  int seen = 0;
  std::thread t([&] {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    if (sched_setaffinity(0, sizeof(one), &one) != 0) return;
    seen = core_count();
  });
  t.join();
  EXPECT_EQ(seen, 1);
}
#endif

TEST(Machine, ZeroThreadsMeansAllCores) {
  EXPECT_EQ(threads_or_all_cores(0), core_count());
  EXPECT_EQ(threads_or_all_cores(-1), core_count());
  EXPECT_EQ(threads_or_all_cores(1), 1);
  EXPECT_EQ(threads_or_all_cores(7), 7);
}

}  // namespace
}  // namespace fp8lab
