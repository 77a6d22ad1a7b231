// What the machine gives this process: how many cores it may run on, and which processor
// they are.
#pragma once

#include <string>
#include <string_view>

namespace fp8lab {

// The cores the calling thread may run on: the CPUs of its affinity mask (which taskset,
// cgroup cpusets and Slurm's task binding narrow), or the machine's hardware threads where
// the mask cannot be read. At least 1.
int core_count();

// A configured thread count, where 0 means "all cores": `threads` if positive, otherwise
// core_count().
int threads_or_all_cores(int threads);

// The most threads a command or config may ask for (`--threads`, `threads`): more than any
// machine fp8lab runs on has, few enough that thread pools stay small.
inline constexpr int kMaxThreads = 1024;

// The processor, as a run's record names it: its model name, family and model numbers, and
// which of the extensions that choose between kernels it has (kMachineFlags), e.g.
// "AMD EPYC (family 25, model 1; avx2 fma)". oneDNN, OpenBLAS and Highway each pick their
// kernels by the processor, and bfloat16 products need avx512_bf16 or amx_bf16, so two runs
// of one config on processors described differently may differ in the last bits of their
// products and, through training, in their results; on the same description they repeat.
// Read from /proc/cpuinfo once; "unknown CPU" where it cannot be read.
const std::string& machine_description();

// The description of the first processor in the text of a /proc/cpuinfo (Linux's format:
// "key<tabs>: value" lines); "unknown CPU" where the text names no model.
std::string describe_cpuinfo(std::string_view cpuinfo);

// The flags of /proc/cpuinfo that describe_cpuinfo names, in this order, where present.
inline constexpr std::string_view kMachineFlags[] = {"avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16",
                                                     "amx_bf16"};

}  // namespace fp8lab
