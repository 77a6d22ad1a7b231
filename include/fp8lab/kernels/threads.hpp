// Who runs the kernels' parallel work, one rule for every kernel: each takes a Runner, by
// default the kernels' small persistent thread pool (contiguous ranges, one per thread, so
// that each thread streams its own part of the array; its size is kernels::set_num_threads,
// kernels.hpp). A caller that already splits its work over threads of its own passes
// Runner::serial(); one whose pool would spin beside the kernels' pool passes
// Runner::external(). Results never depend on the runner. Public so that code timed beside
// the kernels (the benchmarks' streaming references) runs on the same threads.
#pragma once

#include <cstddef>
#include <functional>

namespace fp8lab::kernels {

class Runner {
 public:
  using Range = std::function<void(std::size_t begin, std::size_t end)>;
  // Runs part(i) once for every i in [0, parts), on any threads (libtorch's at::parallel_for, say).
  using Parts = std::function<void(std::size_t parts, const std::function<void(std::size_t)>& part)>;

  Runner() = default;  // the kernels' pool
  static Runner serial();  // the calling thread alone
  // The caller's pool: the work cut into `parts` ranges as the kernels' pool would cut it
  // for that many threads, each range run by `run`.
  static Runner external(int parts, Parts run);

  // Calls fn(begin, end) on disjoint ranges covering [0, n). Range boundaries are multiples
  // of `align` (except the end). On the calling thread alone when n is below
  // kParallelThreshold, the runner has one thread, or (the pool) the call comes from inside
  // a part of the pool's own job, which the busy pool could not take. Exceptions from fn
  // propagate.
  void parallel_for(std::size_t n, std::size_t align, const Range& fn) const;

 private:
  enum class Kind { pool, serial, external };
  Kind kind_ = Kind::pool;
  int parts_ = 1;
  Parts run_;
};

// Runner().parallel_for: on the kernels' pool.
void parallel_for(std::size_t n, std::size_t align, const Runner::Range& fn);

}  // namespace fp8lab::kernels
