// A small persistent thread pool for host work that must be deterministic: tasks are independent and write
// disjoint outputs, so results never depend on how many threads run them or in which order. Used to run
// GEMM row blocks with single-threaded BLAS calls (OpenBLAS's own threading changes results with the thread
// count for some kernel types). Private.
//
// With a Kokkos whose host execution space is OpenMP, the pool owns no threads of its own: `run` hands the tasks
// to a Kokkos::OpenMP instance of the pool's size (dynamic schedule, one task per chunk), so the process has one
// set of host threads, Kokkos's, shared by the pool's tasks and the ops' Kokkos kernels. The determinism argument
// is the same either way: which thread runs a task never changes what the task computes.
#pragma once

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

#include "device_guard.hpp"

namespace haliax::detail {

class thread_pool {
 public:
  /// The process-wide pool. Its size is HALIAX_NUM_THREADS if set, else the number of hardware threads.
  static thread_pool& instance() {
    static thread_pool pool(default_size());
    return pool;
  }

  int size() const { return size_; }

  /// Resizes the pool (the calling thread counts as one). Not to be called while work is running.
  void resize(int n) {
    stop_workers();
    start_workers(n < 1 ? 1 : n);
  }

  /// Runs task(i) for i in [0, n), spread over the pool; returns when all are done. Tasks must not throw.
  /// Called from inside a task (an op run by a task, say), the tasks run in order on the calling thread.
  void run(std::int64_t n, const std::function<void(std::int64_t)>& task) {
    if (n <= 0) return;
    if (n == 1 || in_task()) {
      for (std::int64_t i = 0; i < n; ++i) task(i);
      return;
    }
#if defined(KOKKOS_ENABLE_OPENMP)
    if (size_ > 1 && Kokkos::is_initialized()) {
      run_openmp(n, task);
      return;
    }
#endif
    if (workers_.empty()) {
      for (std::int64_t i = 0; i < n; ++i) task(i);
      return;
    }
    std::unique_lock<std::mutex> run_lock(run_mutex_);  // one job at a time
    {
      std::lock_guard<std::mutex> lk(m_);
      task_ = &task;
      n_tasks_ = n;
      next_.store(0);
      done_ = 0;
      ++generation_;
    }
    cv_.notify_all();
    work();
    std::unique_lock<std::mutex> lk(m_);
    done_cv_.wait(lk, [&] { return done_ == n_tasks_.load(); });
    task_ = nullptr;
  }

  ~thread_pool() { stop_workers(); }

  /// Whether the calling thread is running one of the pool's tasks.
  static bool& in_task() {
    static thread_local bool flag = false;
    return flag;
  }

 private:
  explicit thread_pool(int n) { start_workers(n); }

  static int default_size() {
    for (const char* var : {"HALIAX_NUM_THREADS", "KOKKOS_NUM_THREADS", "OMP_NUM_THREADS"}) {
      if (!uses_openmp && var[0] != 'H') break;  // the last two size Kokkos's OpenMP threads: follow them there
      if (const char* env = std::getenv(var)) {
        int n = std::atoi(env);
        if (n > 0) return n;
      }
    }
    unsigned hw = std::thread::hardware_concurrency();
    return hw == 0 ? 1 : static_cast<int>(hw);
  }

  // The backend's own host threads when it has them (OpenMP), else ours.
  static constexpr bool uses_openmp =
#if defined(KOKKOS_ENABLE_OPENMP)
      true;
#else
      false;
#endif

  void start_workers(int n) {
    stopping_ = false;
    size_ = n;
    if (uses_openmp) return;
    for (int i = 1; i < n; ++i) workers_.emplace_back([this] { loop(); });
  }

#if defined(KOKKOS_ENABLE_OPENMP)
  void run_openmp(std::int64_t n, const std::function<void(std::int64_t)>& task) {
    std::unique_lock<std::mutex> run_lock(run_mutex_);  // one job at a time, as with our own threads
    // An instance with exactly size_ threads (Kokkos's default instance has OMP_NUM_THREADS or all cores);
    // made once per size, since each instance owns its thread-team scratch.
    if (!omp_space_ || omp_space_size_ != size_) {
      if (!finalize_hook_) {  // instances must be gone before Kokkos finalizes; the pool outlives it
        Kokkos::push_finalize_hook([this] {
          omp_space_.reset();
          finalize_hook_ = false;
        });
        finalize_hook_ = true;
      }
      omp_space_ = std::make_unique<Kokkos::OpenMP>(size_);
      omp_space_size_ = size_;
    }
    using policy = Kokkos::RangePolicy<Kokkos::OpenMP, Kokkos::Schedule<Kokkos::Dynamic>, Kokkos::IndexType<std::int64_t>>;
    Kokkos::parallel_for("haliax::thread_pool", policy(*omp_space_, 0, n, Kokkos::ChunkSize(1)),
                         [&task](std::int64_t i) {
                           bool& flag = in_task();
                           const bool outer = flag;
                           flag = true;
                           task(i);
                           flag = outer;
                         });
    omp_space_->fence("haliax::thread_pool");
  }
  std::unique_ptr<Kokkos::OpenMP> omp_space_;
  int omp_space_size_ = 0;
  bool finalize_hook_ = false;
#endif

  void stop_workers() {
    {
      std::lock_guard<std::mutex> lk(m_);
      stopping_ = true;
      ++generation_;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
    workers_.clear();
  }

  void work() {
    std::int64_t finished = 0;
    in_task() = true;
    for (;;) {
      std::int64_t i = next_.fetch_add(1);
      if (i >= n_tasks_) break;
      (*task_.load())(i);
      ++finished;
    }
    in_task() = false;
    if (finished > 0) {
      std::lock_guard<std::mutex> lk(m_);
      done_ += finished;
      if (done_ == n_tasks_) done_cv_.notify_all();
    }
  }

  void loop() {
    std::uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lk(m_);
        cv_.wait(lk, [&] { return generation_ != seen; });
        seen = generation_;
        if (stopping_) return;
        if (task_ == nullptr) continue;
      }
      work();
    }
  }

  std::vector<std::thread> workers_;
  std::mutex run_mutex_;
  std::mutex m_;
  std::condition_variable cv_, done_cv_;
  std::atomic<const std::function<void(std::int64_t)>*> task_{nullptr};
  std::atomic<std::int64_t> n_tasks_{0};
  std::atomic<std::int64_t> next_{0};
  std::int64_t done_ = 0;
  std::uint64_t generation_ = 0;
  bool stopping_ = false;
  int size_ = 1;
};

/// A host loop of `n` independent items (`work`: about how many elements they touch in all) as the ops' kernels
/// run it. With a Serial default execution space (Debian's Kokkos) a loop of at least host_loop_min_work elements
/// is cut into contiguous runs of items spread over the pool, so elementwise ops, broadcasts and copies use every
/// core as the OpenMP backend's kernels do; otherwise, and on every other backend, it is a Kokkos::parallel_for.
/// Items write disjoint outputs, so which thread runs one never changes a result.
inline constexpr std::int64_t host_loop_min_work = std::int64_t{1} << 16;

template <class F>
void host_loop(const char* label, std::int64_t n, std::int64_t work, const F& f) {
#if defined(KOKKOS_ENABLE_SERIAL)
  if constexpr (std::is_same_v<Kokkos::DefaultExecutionSpace, Kokkos::Serial>) {
    auto& pool = thread_pool::instance();
    if (n > 1 && work >= host_loop_min_work && pool.size() > 1 && !thread_pool::in_task()) {
      const std::int64_t runs = std::min<std::int64_t>(n, 4 * static_cast<std::int64_t>(pool.size()));
      const device_guard::device_work kernel;  // a kernel the pool runs instead of Kokkos: the guard must know
      pool.run(runs, [&](std::int64_t r) {
        const std::int64_t b = n * r / runs, e = n * (r + 1) / runs;
        for (std::int64_t i = b; i < e; ++i) f(i);
      });
      return;
    }
  }
#endif
  (void)work;
  Kokkos::parallel_for(label, Kokkos::RangePolicy<Kokkos::DefaultExecutionSpace, Kokkos::IndexType<std::int64_t>>(0, n), f);
}

}  // namespace haliax::detail
