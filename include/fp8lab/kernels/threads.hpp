// The kernels' small persistent thread pool: contiguous ranges, one per thread, so that
// each thread streams its own part of the array. Public so that code timed beside the
// kernels (the benchmarks' streaming references) runs on the same threads; the thread
// count is kernels::set_num_threads (kernels.hpp).
#pragma once

#include <cstddef>
#include <functional>

namespace fp8lab::kernels {

// Calls fn(begin, end) on disjoint ranges covering [0, n). Range boundaries are multiples
// of `align` (except the end). Runs on the calling thread alone when n is below
// kParallelThreshold or one thread is configured. Exceptions from fn propagate.
void parallel_for(std::size_t n, std::size_t align,
                  const std::function<void(std::size_t, std::size_t)>& fn);

}  // namespace fp8lab::kernels
