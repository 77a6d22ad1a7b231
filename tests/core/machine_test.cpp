#include "fp8lab/core/machine.hpp"

#include <gtest/gtest.h>

#include <fstream>
#include <string>
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


// Two processors' entries as Linux writes them (abridged): the description is the first's.
constexpr const char* kXeon =
    "processor\t: 0\n"
    "vendor_id\t: GenuineIntel\n"
    "cpu family\t: 6\n"
    "model\t\t: 143\n"
    "model name\t: Intel(R) Xeon(R) Platinum 8488C\n"
    "flags\t\t: fpu sse2 avx fma avx2 avx512f avx512bw avx512_bf16 avx512_fp16 amx_bf16 amx_tile amx_int8\n"
    "\n"
    "processor\t: 1\n"
    "cpu family\t: 6\n"
    "model\t\t: 85\n"
    "model name\t: Another CPU\n"
    "flags\t\t: fpu sse2\n";

constexpr const char* kEpyc =
    "processor\t: 0\n"
    "vendor_id\t: AuthenticAMD\n"
    "cpu family\t: 25\n"
    "model\t\t: 1\n"
    "model name\t: AMD EPYC\n"
    "flags\t\t: fpu sse2 avx fma avx2 bmi2\n";

TEST(Machine, DescribesTheFirstProcessorAndTheFlagsThatChooseKernels) {
  EXPECT_EQ(describe_cpuinfo(kXeon),
            "Intel(R) Xeon(R) Platinum 8488C (family 6, model 143; avx2 fma avx512f avx512_bf16 avx512_fp16 amx_bf16)");
  EXPECT_EQ(describe_cpuinfo(kEpyc), "AMD EPYC (family 25, model 1; avx2 fma)");
  // A flag is matched whole: amx_bf16 is not read out of "amx_bf16x", nor avx2 out of "avx256".
  EXPECT_EQ(describe_cpuinfo("model name\t: X\nflags\t: amx_bf16x avx256\n"), "X");
  EXPECT_EQ(describe_cpuinfo("model name\t: X\ncpu family\t: 6\n"), "X (family 6)");
  EXPECT_EQ(describe_cpuinfo("model name\t: X\nflags\t: fma\n"), "X (fma)");
  // Leading blank lines are skipped; an entry without a model name (some ARM kernels) is unknown.
  EXPECT_EQ(describe_cpuinfo("\n\nmodel name\t: Y\n"), "Y");
  EXPECT_EQ(describe_cpuinfo("processor\t: 0\nBogoMIPS\t: 50.00\n"), "unknown CPU");
  EXPECT_EQ(describe_cpuinfo(""), "unknown CPU");
  EXPECT_EQ(describe_cpuinfo("garbage without colons\n\x01\x02\n"), "unknown CPU");
}

#if defined(__linux__)
// This machine's description starts with the first model name in /proc/cpuinfo (read here
// without the code under test) and names the flags it has.
TEST(Machine, ThisMachinesDescriptionComesFromProcCpuinfo) {
  std::ifstream in("/proc/cpuinfo");
  std::string line, name, flags;
  while (std::getline(in, line)) {
    if (name.empty() && line.rfind("model name", 0) == 0) name = line.substr(line.find(':') + 2);
    if (flags.empty() && line.rfind("flags", 0) == 0) flags = line.substr(line.find(':') + 1) + " ";
  }
  const std::string& d = machine_description();
  if (name.empty()) {
    EXPECT_EQ(d, "unknown CPU");
    return;
  }
  EXPECT_EQ(d.rfind(name, 0), 0u) << d;
  // The flags named are those /proc/cpuinfo lists, as words.
  const std::string named = d.substr(d.find('(') + 1);
  for (const std::string_view f : kMachineFlags) {
    const std::string word(f);
    const bool has = flags.find(std::string(1, ' ').append(word).append(" ")) != std::string::npos;
    const bool said = named.find(std::string(1, ' ').append(word)) != std::string::npos ||
                      named.find(std::string(1, '(').append(word)) != std::string::npos ||
                      named.rfind(word, 0) == 0;
    EXPECT_EQ(said, has) << f << " in " << d;
  }
  EXPECT_EQ(&machine_description(), &d);  // read once
}
#endif

}  // namespace
}  // namespace fp8lab
