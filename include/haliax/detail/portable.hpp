// Which kernels run: the host-tuned ones (the thread pool, OpenBLAS tiles, AVX loops) or the portable ones
// (Kokkos kernels in the arrays' memory space, the only ones a CUDA build can run). Private.
//
// Arrays live in Kokkos::DefaultExecutionSpace's memory space. Where that is host memory, every op has a
// host-tuned path and a portable path; the host path runs unless HALIAX_PORTABLE_KERNELS=1 is set, which makes
// a CPU build run exactly the kernels a GPU build runs (the test suite does this, so the portable kernels are
// checked on every CI run, not only on a machine with a GPU). In device memory only the portable path exists.
#pragma once

#include <Kokkos_Core.hpp>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <vector>

#include "../kernels.hpp"
#include "device_guard.hpp"

namespace haliax::detail {

/// Whether the arrays' memory is host memory (a Serial or OpenMP default execution space).
inline constexpr bool host_memory =
    Kokkos::SpaceAccessibility<Kokkos::HostSpace, Kokkos::DefaultExecutionSpace::memory_space>::accessible;

/// Whether HALIAX_PORTABLE_KERNELS asks a host build to run the portable kernels (read once per process).
inline bool portable_kernels_forced() {
  static const bool forced = [] {
    const char* e = std::getenv("HALIAX_PORTABLE_KERNELS");
    return e != nullptr && e[0] != '\0' && !(e[0] == '0' && e[1] == '\0');
  }();
  return forced;
}

/// A test's override of the choice in this process: -1 none (the environment decides), 0 host kernels, 1 portable.
inline int& portable_kernels_override() {
  static int value = -1;
  return value;
}

/// Whether the host-tuned kernels run: host memory and not forced onto the portable ones. Under the device guard
/// never (not even in a test's portable_kernels_scope(false)): the host kernels read array memory on the host.
inline bool use_host_kernels() {
  if constexpr (!host_memory) {
    return false;
  } else {
    if (device_guard::requested()) return false;
    const int o = portable_kernels_override();
    return o < 0 ? !portable_kernels_forced() : o == 0;
  }
}

/// The dispatch of kernel family `f` (haliax/kernels.hpp) between its host-tuned and portable kernels: the host one
/// where the host kernels run at all and the family may use a specialisation (HALIAX_VENDOR_KERNELS, a
/// kernels::portable_scope). Records the choice; a dispatch point calls it once per op (a gradient is an op of
/// its own and dispatches again).
inline bool use_host_kernels(kernels::family f) {
  const bool h = use_host_kernels() && kernels::specialised(f);
  kernels::note(f, h ? kernels::impl::host : kernels::impl::portable);
  return h;
}

/// Runs the portable kernels (or, with `portable` false, the host ones) until the scope ends; for tests that
/// compare the two paths in one process. Not thread-safe: set it between ops, not while they run.
class portable_kernels_scope {
 public:
  explicit portable_kernels_scope(bool portable = true) : saved_(portable_kernels_override()) {
    portable_kernels_override() = portable ? 1 : 0;
  }
  ~portable_kernels_scope() { portable_kernels_override() = saved_; }
  portable_kernels_scope(const portable_kernels_scope&) = delete;
  portable_kernels_scope& operator=(const portable_kernels_scope&) = delete;

 private:
  int saved_;
};

/// Whether host code may touch the arrays' elements directly (through `data()`): host memory, and neither the
/// portable kernels nor the device guard asked for. Elsewhere host code goes through copies, as on a GPU.
inline bool host_reads_arrays() { return use_host_kernels(); }

/// The elements of a 1-d view in host memory: the view itself where `host_reads_arrays()`, else a copy (a
/// HostSpace view labelled "<label>_mirror", which the device guard leaves readable).
template <class T, class... P>
Kokkos::View<std::remove_const_t<T>*, Kokkos::HostSpace> host_copy(const Kokkos::View<T*, P...>& v) {
  using U = std::remove_const_t<T>;
  if constexpr (host_memory && !std::is_const_v<T>) {
    if (host_reads_arrays()) return Kokkos::View<U*, Kokkos::HostSpace>(v);
  }
  Kokkos::View<U*, Kokkos::HostSpace> h(Kokkos::view_alloc(Kokkos::WithoutInitializing, v.label() + "_mirror"),
                                        v.extent(0));
  Kokkos::deep_copy(h, v);
  return h;
}

/// The elements of a 1-d view as a host vector, copied without a Kokkos allocation (for a few scalars read back
/// per step: no mirror is allocated and freed, which on a GPU would synchronise the device twice more).
template <class T, class... P>
std::vector<std::remove_const_t<T>> read_back(const Kokkos::View<T*, P...>& v) {
  using U = std::remove_const_t<T>;
  std::vector<U> out(v.extent(0));
  if (out.empty()) return out;
  Kokkos::View<U*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged> h(out.data(), out.size());
  Kokkos::deep_copy(h, v);
  return out;
}

/// Names variables so that a KOKKOS_LAMBDA captures them where this stands (see HALIAX_CAPTURE).
template <class... X>
KOKKOS_INLINE_FUNCTION void capture(const X&...) {}

}  // namespace haliax::detail

/// nvcc refuses an extended (__host__ __device__) lambda whose first capture of a variable is inside an
/// `if constexpr` branch. HALIAX_CAPTURE(a, b) at the top of such a lambda's body captures them there instead;
/// it compiles to nothing.
#define HALIAX_CAPTURE(...) ::haliax::detail::capture(__VA_ARGS__)
