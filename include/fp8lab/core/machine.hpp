// What the machine gives this process: how many cores it may run on.
#pragma once

namespace fp8lab {

// The cores the calling thread may run on: the CPUs of its affinity mask (which taskset,
// cgroup cpusets and Slurm's task binding narrow), or the machine's hardware threads where
// the mask cannot be read. At least 1.
int core_count();

// A configured thread count, where 0 means "all cores": `threads` if positive, otherwise
// core_count().
int threads_or_all_cores(int threads);

}  // namespace fp8lab
