// haliax/detail/profile.hpp: named regions for the work that does not run as a labelled Kokkos kernel (BLAS
// GEMMs on haliax's thread pool, the flash-attention kernels), and their floating-point operation counts.
// They use Kokkos' profiling interface, like every Kokkos kernel label, so one tool (levanter's op profiler,
// or any Kokkos Tools library) sees both. When no tool listens, a region costs one load and a branch, and the
// name is never built.
#pragma once

#include <Kokkos_Core.hpp>
#include <atomic>
#include <string>

#include "device_guard.hpp"

namespace haliax::detail::profile {

/// Receives the FLOP count of the innermost open region (set by a profiler; null when none listens).
using flops_sink = void (*)(double);
inline std::atomic<flops_sink>& flops_hook() {
  static std::atomic<flops_sink> h{nullptr};
  return h;
}

/// A region named by `name()` (called only when a tool listens), with `flops` floating-point operations.
class region {
 public:
  template <class NameFn>
  region(NameFn&& name, double flops) {
    if (!Kokkos::Tools::profileLibraryLoaded()) return;
    on_ = true;
    Kokkos::Profiling::pushRegion(name());
    if (auto h = flops_hook().load(std::memory_order_relaxed)) h(flops);
  }
  ~region() {
    if (on_) Kokkos::Profiling::popRegion();
  }
  region(const region&) = delete;
  region& operator=(const region&) = delete;

 private:
  bool on_ = false;
};

/// Removes the kernel and region callbacks a listener installed (levanter's op profiler, the device kit's counters
/// and kernel timer): Kokkos has one set, so a listener that stops clears them; the device guard's kernel callbacks
/// come back when the guard is on.
inline void remove_kernel_callbacks() {
  namespace E = Kokkos::Tools::Experimental;
  E::set_begin_parallel_for_callback(nullptr);
  E::set_end_parallel_for_callback(nullptr);
  E::set_begin_parallel_reduce_callback(nullptr);
  E::set_end_parallel_reduce_callback(nullptr);
  E::set_begin_parallel_scan_callback(nullptr);
  E::set_end_parallel_scan_callback(nullptr);
  if (device_guard::active()) device_guard::install_kernel_callbacks();
  E::set_push_region_callback(nullptr);
  E::set_pop_region_callback(nullptr);
}

}  // namespace haliax::detail::profile
