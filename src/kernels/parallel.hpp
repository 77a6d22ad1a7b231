// A small persistent thread pool for the kernels: contiguous ranges, one per thread, so
// that each thread streams its own part of the array.
#pragma once

#include <cstddef>
#include <functional>

namespace fp8lab::kernels::detail {

// Calls fn(begin, end) on disjoint ranges covering [0, n). Range boundaries are multiples
// of `align` (except the end). Runs on the calling thread alone when n is below
// kParallelThreshold or one thread is configured. Exceptions from fn propagate.
void parallel_for(std::size_t n, std::size_t align,
                  const std::function<void(std::size_t, std::size_t)>& fn);

}  // namespace fp8lab::kernels::detail
