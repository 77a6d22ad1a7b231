#include "fp8lab/kernels/threads.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "fp8lab/core/machine.hpp"
#include "fp8lab/kernels/kernels.hpp"

namespace fp8lab::kernels {

namespace {

// [0, n) in `parts` ranges aligned to `align`.
std::vector<std::pair<std::size_t, std::size_t>> split(std::size_t n, std::size_t align, int parts) {
  const std::size_t units = (n + align - 1) / align;
  std::vector<std::pair<std::size_t, std::size_t>> ranges;
  for (int i = 0; i < parts; ++i)
    ranges.emplace_back(std::min(n, units * i / parts * align), std::min(n, units * (i + 1) / parts * align));
  return ranges;
}

// Whether this thread is running a part of a pool job: a kernel called from there (a part
// that itself quantizes with the default runner) runs on this thread alone, since the pool
// is busy with the job that called it.
thread_local bool in_pool_part = false;
struct PoolPart {
  PoolPart() { in_pool_part = true; }
  ~PoolPart() { in_pool_part = false; }
};

class Pool {
 public:
  static Pool& get() {
    static Pool pool;
    return pool;
  }

  int threads() const { return threads_.load(); }
  void set_threads(int n) {
    std::lock_guard<std::mutex> run(run_mutex_);
    stop_workers();
    threads_.store(std::max(1, n));
  }

  void run(std::size_t n, std::size_t align,
           const std::function<void(std::size_t, std::size_t)>& fn) {
    std::lock_guard<std::mutex> run(run_mutex_);  // one parallel job at a time
    const int t = threads_.load();
    start_workers(t - 1);
    const auto ranges = split(n, align, t);
    {
      std::lock_guard<std::mutex> lk(m_);
      job_ = &fn;
      ranges_ = &ranges;
      pending_ = t - 1;
      error_ = nullptr;
      ++generation_;
    }
    cv_.notify_all();
    std::exception_ptr mine;
    try {
      const PoolPart part;
      if (ranges[0].first < ranges[0].second) fn(ranges[0].first, ranges[0].second);
    } catch (...) {
      mine = std::current_exception();
    }
    std::unique_lock<std::mutex> lk(m_);
    done_cv_.wait(lk, [&] { return pending_ == 0; });
    job_ = nullptr;
    if (mine) std::rethrow_exception(mine);
    if (error_) std::rethrow_exception(error_);
  }

  ~Pool() { stop_workers(); }

 private:
  Pool() : threads_(core_count()) {}

  void start_workers(int count) {
    while (static_cast<int>(workers_.size()) < count) {
      const int id = static_cast<int>(workers_.size()) + 1;
      // The worker waits for the generation after the current one: read it here, before
      // run() publishes the job, not when the thread happens to start.
      std::uint64_t gen;
      {
        std::lock_guard<std::mutex> lk(m_);
        gen = generation_;
      }
      workers_.emplace_back([this, id, gen] { work(id, gen); });
    }
  }
  void stop_workers() {
    {
      std::lock_guard<std::mutex> lk(m_);
      quit_ = true;
    }
    cv_.notify_all();
    for (auto& w : workers_) w.join();
    workers_.clear();
    quit_ = false;
  }
  void work(int id, std::uint64_t seen) {
    for (;;) {
      const std::function<void(std::size_t, std::size_t)>* job;
      std::pair<std::size_t, std::size_t> range;
      {
        std::unique_lock<std::mutex> lk(m_);
        cv_.wait(lk, [&] { return quit_ || generation_ != seen; });
        if (quit_) return;
        seen = generation_;
        job = job_;
        range = (*ranges_)[id];
      }
      std::exception_ptr err;
      try {
        const PoolPart part;
        if (range.first < range.second) (*job)(range.first, range.second);
      } catch (...) {
        err = std::current_exception();
      }
      std::lock_guard<std::mutex> lk(m_);
      if (err && !error_) error_ = err;
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }

  std::atomic<int> threads_;
  std::mutex run_mutex_;
  std::mutex m_;
  std::condition_variable cv_, done_cv_;
  std::vector<std::thread> workers_;
  const std::function<void(std::size_t, std::size_t)>* job_ = nullptr;
  const std::vector<std::pair<std::size_t, std::size_t>>* ranges_ = nullptr;
  int pending_ = 0;
  std::uint64_t generation_ = 0;
  bool quit_ = false;
  std::exception_ptr error_;
};

}  // namespace

void set_num_threads(int n) { Pool::get().set_threads(n); }
int num_threads() { return Pool::get().threads(); }

Runner Runner::serial() {
  Runner r;
  r.kind_ = Kind::serial;
  return r;
}

Runner Runner::external(int parts, Parts run) {
  Runner r;
  r.kind_ = Kind::external;
  r.parts_ = std::max(1, parts);
  r.run_ = std::move(run);
  return r;
}

void Runner::parallel_for(std::size_t n, std::size_t align, const Range& fn) const {
  if (n == 0) return;
  const int threads = kind_ == Kind::pool ? (in_pool_part ? 1 : num_threads()) : kind_ == Kind::external ? parts_ : 1;
  if (n < kParallelThreshold || threads == 1) {
    fn(0, n);
    return;
  }
  if (kind_ == Kind::pool) {
    Pool::get().run(n, align, fn);
    return;
  }
  const auto ranges = split(n, align, threads);
  run_(ranges.size(), [&](std::size_t i) {
    if (ranges[i].first < ranges[i].second) fn(ranges[i].first, ranges[i].second);
  });
}

void parallel_for(std::size_t n, std::size_t align, const Runner::Range& fn) { Runner().parallel_for(n, align, fn); }

}  // namespace fp8lab::kernels
