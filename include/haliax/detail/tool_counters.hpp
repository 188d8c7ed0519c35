// haliax/detail/tool_counters.hpp: what a stretch of work costs the device, read through Kokkos' profiling
// callbacks. Private; the device kit (bench/device_session) and the tests use it.
//
//   tools::counter c;  c.start();  ...one training step...;  auto n = c.stop();   // kernels, fences, allocations
//   tools::kernel_timer t;  t.start();  ...;  auto rows = t.stop();                // device time per kernel name
//
// Both install process-wide callbacks (Kokkos has one set), so one of them runs at a time, and neither while
// levanter's op profiler or the device guard holds the callbacks (`start` throws then). While either is on,
// Kokkos fences the device after every kernel (a loaded tool asks for global fencing): counting and timing
// runs are not speed runs. The fences the tool interface itself adds are not counted.
#pragma once

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "device_guard.hpp"
#include "gemm.hpp"
#include "profile.hpp"

#if defined(KOKKOS_ENABLE_CUDA)
#include <cuda_runtime.h>
#endif

namespace haliax::detail::tools {

/// Events in the arrays' execution space during a stretch of work.
struct counts {
  std::int64_t kernels = 0;          ///< Kokkos kernel launches (parallel_for/reduce/scan)
  std::int64_t gemms = 0;            ///< vendor GEMM calls (cuBLAS on a GPU, the BLAS on the host)
  std::int64_t fences = 0;           ///< device synchronisations through Kokkos (fences; deep copies fence too)
  std::int64_t deep_copies = 0;      ///< Kokkos deep copies (host <-> device and device <-> device)
  std::int64_t allocations = 0;      ///< allocations in the arrays' memory space
  std::int64_t allocated_bytes = 0;  ///< their bytes
  std::int64_t deallocations = 0;    ///< frees in the arrays' memory space
  /// The allocations by Kokkos label (a buffer-cache miss is labelled by the array's op): where they come from
  std::map<std::string, std::int64_t> allocation_labels;
  /// The deep copies by "destination <- source" labels (an unlabelled host buffer shows as "host"): where they come from
  std::map<std::string, std::int64_t> copy_labels;
};

namespace detail_ {

inline bool tool_fence(const char* name) {
  // Kokkos names the fences its tool interface adds around kernels when a tool is loaded.
  return name != nullptr && (std::strstr(name, "Kokkos Profile Tool Fence") != nullptr ||
                             std::strstr(name, "Tool Requested Fence") != nullptr);
}
inline bool arrays_space(const Kokkos::Profiling::SpaceHandle& s) {
  return std::strcmp(s.name, Kokkos::DefaultExecutionSpace::memory_space::name()) == 0;
}
inline std::atomic<bool>& busy() {
  static std::atomic<bool> b{false};
  return b;
}
inline void claim(const char* who) {
  if (device_guard::active())
    throw std::runtime_error(std::string(who) + ": not available under HALIAX_DEVICE_GUARD (it holds the callbacks)");
  if (Kokkos::Tools::profileLibraryLoaded())
    throw std::runtime_error(std::string(who) + ": another Kokkos tool or profiler is listening; stop it first");
  bool expected = false;
  if (!busy().compare_exchange_strong(expected, true))
    throw std::runtime_error(std::string(who) + ": a counter or timer is already running");
}
inline void release_all() {
  namespace E = Kokkos::Tools::Experimental;
  profile::remove_kernel_callbacks();
  E::set_begin_fence_callback(nullptr);
  E::set_allocate_data_callback(nullptr);
  E::set_deallocate_data_callback(nullptr);
  E::set_begin_deep_copy_callback(nullptr);
  busy() = false;
}

// Kernels may start on several threads at once (haliax's pool on a host build): the tallies are atomic.
struct live_counts {
  std::atomic<std::int64_t> kernels{0}, fences{0}, deep_copies{0}, allocations{0}, allocated_bytes{0},
      deallocations{0};
  void clear() {
    for (auto* a : {&kernels, &fences, &deep_copies, &allocations, &allocated_bytes, &deallocations}) *a = 0;
  }
};
inline live_counts& live() {
  static live_counts c;
  return c;
}
inline std::mutex& labels_mutex() {
  static std::mutex m;
  return m;
}
inline std::map<std::string, std::int64_t>& live_copy_labels() {
  static std::map<std::string, std::int64_t> m;
  return m;
}
inline std::map<std::string, std::int64_t>& live_labels() {
  static std::map<std::string, std::int64_t> m;
  return m;
}
extern "C" inline void count_kernel(const char*, std::uint32_t, std::uint64_t* id) {
  *id = 0;
  ++live().kernels;
}
extern "C" inline void count_end(std::uint64_t) {}
extern "C" inline void count_fence(const char* name, std::uint32_t, std::uint64_t* id) {
  *id = 0;
  if (!tool_fence(name)) ++live().fences;
}
extern "C" inline void count_alloc(Kokkos::Profiling::SpaceHandle s, const char* label, const void*,
                                   std::uint64_t bytes) {
  if (!arrays_space(s)) return;
  ++live().allocations;
  live().allocated_bytes += static_cast<std::int64_t>(bytes);
  try {
    std::lock_guard<std::mutex> lk(labels_mutex());
    ++live_labels()[label ? label : "(unlabelled)"];
  } catch (...) {  // a Kokkos callback must not throw; the label is then not tallied
  }
}
extern "C" inline void count_free(Kokkos::Profiling::SpaceHandle s, const char*, const void*, std::uint64_t) {
  if (arrays_space(s)) ++live().deallocations;
}
extern "C" inline void count_copy(Kokkos::Profiling::SpaceHandle ds, const char* dst, const void*,
                                  Kokkos::Profiling::SpaceHandle ss, const char* src, const void*, std::uint64_t) {
  ++live().deep_copies;
  try {
    auto name = [](const Kokkos::Profiling::SpaceHandle& s, const char* l) {
      return std::string(l != nullptr && *l != 0 ? l : arrays_space(s) ? "(unlabelled)" : "host");
    };
    std::lock_guard<std::mutex> lk(labels_mutex());
    ++live_copy_labels()[name(ds, dst) + " <- " + name(ss, src)];
  } catch (...) {  // a Kokkos callback must not throw; the copy is then not tallied by label
  }
}

}  // namespace detail_

/// Counts kernels, vendor GEMMs, fences, deep copies and allocations between start() and stop(), on every thread.
class counter {
 public:
  void start() {
    detail_::claim("haliax tools::counter");
    namespace E = Kokkos::Tools::Experimental;
    Kokkos::fence();
    detail_::live().clear();
    {
      std::lock_guard<std::mutex> lk(detail_::labels_mutex());
      detail_::live_labels().clear();
      detail_::live_copy_labels().clear();
    }
    gemms0_ = gemm_profile::launches.load();
    E::set_begin_parallel_for_callback(&detail_::count_kernel);
    E::set_end_parallel_for_callback(&detail_::count_end);
    E::set_begin_parallel_reduce_callback(&detail_::count_kernel);
    E::set_end_parallel_reduce_callback(&detail_::count_end);
    E::set_begin_parallel_scan_callback(&detail_::count_kernel);
    E::set_end_parallel_scan_callback(&detail_::count_end);
    E::set_begin_fence_callback(&detail_::count_fence);
    E::set_allocate_data_callback(&detail_::count_alloc);
    E::set_deallocate_data_callback(&detail_::count_free);
    E::set_begin_deep_copy_callback(&detail_::count_copy);
    on_ = true;
  }
  /// Removes the callbacks and returns what they counted (the closing fence is not counted).
  counts stop() {
    if (!on_) return {};
    detail_::release_all();
    on_ = false;
    Kokkos::fence();
    const auto& l = detail_::live();
    counts c;
    c.kernels = l.kernels;
    c.fences = l.fences;
    c.deep_copies = l.deep_copies;
    c.allocations = l.allocations;
    c.allocated_bytes = l.allocated_bytes;
    c.deallocations = l.deallocations;
    {
      std::lock_guard<std::mutex> lk(detail_::labels_mutex());
      c.allocation_labels = detail_::live_labels();
      c.copy_labels = detail_::live_copy_labels();
    }
    c.gemms = gemm_profile::launches.load() - gemms0_;
    return c;
  }
  ~counter() {
    if (on_) detail_::release_all();
  }

 private:
  bool on_ = false;
  std::int64_t gemms0_ = 0;
};

/// Device time per kernel label and per named region (GEMMs run inside "dot ..." regions, flash attention in
/// its own; "forward"/"backward" enclose whole passes). Timed with CUDA events on Kokkos' stream on a GPU, with
/// the host clock elsewhere (Kokkos fences after each kernel while the timer listens, so the clock sees the
/// kernel's end). `self_seconds` excludes nested entries.
struct kernel_time {
  std::string name;
  std::int64_t calls = 0;
  double seconds = 0;       ///< inclusive
  double self_seconds = 0;  ///< minus nested kernels and regions
};

namespace detail_ {

struct timing_record {
  std::string name;
  int parent = -1;
#if defined(KOKKOS_ENABLE_CUDA)
  cudaEvent_t begin = nullptr, end = nullptr;
#else
  std::chrono::steady_clock::time_point begin, end;
#endif
};
struct timer_state {
  std::vector<timing_record> records;
  std::vector<int> open;
  std::thread::id owner;
#if defined(KOKKOS_ENABLE_CUDA)
  std::vector<cudaEvent_t> pool;
  std::size_t used = 0;
  // Called from Kokkos' callbacks, which must not throw: null when no event can be made (the record is then not
  // timed).
  cudaEvent_t event() {
    if (used == pool.size()) {
      cudaEvent_t e = nullptr;
      if (cudaEventCreate(&e) != cudaSuccess) return nullptr;
      pool.push_back(e);
    }
    return pool[used++];
  }
#endif
  static timer_state& get() {
    static timer_state s;
    return s;
  }
};
inline void open_record(const char* name) {
  auto& s = timer_state::get();
  if (std::this_thread::get_id() != s.owner) return;
  timing_record r;
  r.name = name ? name : "?";
  r.parent = s.open.empty() ? -1 : s.open.back();
#if defined(KOKKOS_ENABLE_CUDA)
  r.begin = s.event();
  r.end = s.event();
  if (r.begin) cudaEventRecord(r.begin, Kokkos::DefaultExecutionSpace().cuda_stream());
#else
  r.begin = std::chrono::steady_clock::now();
#endif
  s.open.push_back(static_cast<int>(s.records.size()));
  s.records.push_back(std::move(r));
}
inline void close_record() {
  auto& s = timer_state::get();
  if (std::this_thread::get_id() != s.owner || s.open.empty()) return;
  auto& r = s.records[static_cast<std::size_t>(s.open.back())];
  s.open.pop_back();
#if defined(KOKKOS_ENABLE_CUDA)
  if (r.end) cudaEventRecord(r.end, Kokkos::DefaultExecutionSpace().cuda_stream());
#else
  r.end = std::chrono::steady_clock::now();
#endif
}
extern "C" inline void time_kernel(const char* name, std::uint32_t, std::uint64_t* id) {
  *id = 0;
  open_record(name);
}
extern "C" inline void time_end(std::uint64_t) { close_record(); }
extern "C" inline void time_push(const char* name) { open_record(name); }
extern "C" inline void time_pop() { close_record(); }

}  // namespace detail_

/// Per-name device time of the work between start() and stop() on the calling thread.
class kernel_timer {
 public:
  void start() {
    detail_::claim("haliax tools::kernel_timer");
    Kokkos::fence();
    auto& s = detail_::timer_state::get();
    s.records.clear();
    s.open.clear();
    s.owner = std::this_thread::get_id();
#if defined(KOKKOS_ENABLE_CUDA)
    s.used = 0;
#endif
    namespace E = Kokkos::Tools::Experimental;
    E::set_begin_parallel_for_callback(&detail_::time_kernel);
    E::set_end_parallel_for_callback(&detail_::time_end);
    E::set_begin_parallel_reduce_callback(&detail_::time_kernel);
    E::set_end_parallel_reduce_callback(&detail_::time_end);
    E::set_begin_parallel_scan_callback(&detail_::time_kernel);
    E::set_end_parallel_scan_callback(&detail_::time_end);
    E::set_push_region_callback(&detail_::time_push);
    E::set_pop_region_callback(&detail_::time_pop);
    on_ = true;
  }

  /// Removes the callbacks, waits for the device and returns one row per name, largest self time first.
  std::vector<kernel_time> stop() {
    if (!on_) return {};
    detail_::release_all();
    on_ = false;
    Kokkos::fence();
    auto& s = detail_::timer_state::get();
    std::vector<double> incl(s.records.size(), 0.0), child(s.records.size(), 0.0);
    for (std::size_t i = 0; i < s.records.size(); ++i) {
      const auto& r = s.records[i];
#if defined(KOKKOS_ENABLE_CUDA)
      float ms = 0;
      if (r.begin && r.end && cudaEventElapsedTime(&ms, r.begin, r.end) == cudaSuccess) incl[i] = 1e-3 * ms;
#else
      incl[i] = std::chrono::duration<double>(r.end - r.begin).count();
#endif
      if (r.parent >= 0) child[static_cast<std::size_t>(r.parent)] += incl[i];
    }
    std::map<std::string, kernel_time> by_name;
    for (std::size_t i = 0; i < s.records.size(); ++i) {
      auto& e = by_name[s.records[i].name];
      e.name = s.records[i].name;
      e.calls += 1;
      e.seconds += incl[i];
      e.self_seconds += std::max(0.0, incl[i] - child[i]);
    }
    std::vector<kernel_time> rows;
    for (auto& [n, e] : by_name) rows.push_back(e);
    std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.self_seconds > b.self_seconds; });
    return rows;
  }
  ~kernel_timer() {
    if (on_) detail_::release_all();
  }

 private:
  bool on_ = false;
};

}  // namespace haliax::detail::tools
