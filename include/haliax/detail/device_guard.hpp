// haliax/detail/device_guard.hpp: HALIAX_DEVICE_GUARD=1 makes a CPU build fail where a GPU build would read or
// write device memory from the host. Private; scripts/check-device-access.sh is how it is used.
//
// On a GPU, arrays live in device memory, and host code that touches their elements (through `data()`, a host
// loop, a `memcpy`) crashes or reads garbage; on a CPU build the same code works, so such bugs hide until
// someone runs on a GPU. Under this guard a CPU build behaves like a GPU's for host accesses: every Kokkos
// allocation in the arrays' memory space is poisoned with AddressSanitizer's manual poisoning while no Kokkos
// kernel or deep copy runs, and unpoisoned while one does (Kokkos Tools callbacks tell when). Host code that
// touches an array's elements outside a kernel then stops with ASan's report: the access, its stack, and where
// the array was allocated. The guard also switches on the portable kernels (HALIAX_PORTABLE_KERNELS=1), the
// only ones a GPU runs.
//
// It needs a build compiled with -fsanitize=address (the compiler then defines __SANITIZE_ADDRESS__); asking for
// it in another build ends the program at start-up with a message, never a silent no-op. Host memory meant to
// be read on the host (vectors, `to_host()` copies, host mirrors) is never poisoned: Kokkos labels a mirror
// "<label>_mirror", and mirrors of this guard's memory are made by copying (`host_copy`), as on a GPU. Tests
// that compare the host kernels with the portable ones run the portable ones twice under the guard.
//
// Limits: the poison is global, so while one thread runs a kernel another thread's host access goes unseen; a
// buffer is guarded from the first kernel or deep copy after its allocation (Kokkos writes its header between
// the two); code compiled without ASan (OpenBLAS, libkokkoscore) is not checked.
#pragma once

#include <Kokkos_Core.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>

#if defined(__SANITIZE_ADDRESS__)
#define HALIAX_DEVICE_GUARD_AVAILABLE 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HALIAX_DEVICE_GUARD_AVAILABLE 1
#endif
#endif

#if defined(HALIAX_DEVICE_GUARD_AVAILABLE)
#include <sanitizer/asan_interface.h>
#endif

namespace haliax::detail::device_guard {

/// Whether HALIAX_DEVICE_GUARD asks for the guard (read once per process).
inline bool requested() {
  static const bool on = [] {
    const char* e = std::getenv("HALIAX_DEVICE_GUARD");
    return e != nullptr && e[0] != '\0' && !(e[0] == '0' && e[1] == '\0');
  }();
  return on;
}

#if defined(HALIAX_DEVICE_GUARD_AVAILABLE)

struct state {
  struct pending_allocation {
    std::size_t bytes;
    std::string label;
  };
  std::mutex m;
  bool active = false;
  int depth = 0;                                                     // kernels and deep copies now running
  std::unordered_map<const void*, pending_allocation> pending;      // header not yet written
  std::unordered_map<const void*, std::pair<char*, std::size_t>> guarded;  // allocation -> its elements
  static state& get() {
    static state* s = new state();  // never destroyed: Kokkos may deallocate during static destruction
    return *s;
  }
};

/// Moves allocations whose Kokkos header is now written (label matches) into `guarded`; others (allocations
/// without a header, which Kokkos uses internally) are dropped. Called with the lock held.
inline void settle(state& s) {
  using header = Kokkos::Impl::SharedAllocationHeader;
  for (auto& [raw, p] : s.pending) {
    // An allocation too small for a header, or one not yet written, is not an array.
    if (p.bytes == 0 || __asan_region_is_poisoned(const_cast<void*>(raw), sizeof(header) + p.bytes) != nullptr)
      continue;
    const auto* h = static_cast<const header*>(raw);
    const std::size_t n = sizeof(header) - sizeof(void*) - 1;  // the header: a record pointer, then the label
    if (std::strncmp(h->label(), p.label.c_str(), n) != 0) continue;
    s.guarded[raw] = {static_cast<char*>(const_cast<void*>(raw)) + sizeof(header), p.bytes};
  }
  s.pending.clear();
}

inline void poison_all(state& s, bool poison) {
  for (auto& [raw, region] : s.guarded) {
    if (poison)
      ASAN_POISON_MEMORY_REGION(region.first, region.second);
    else
      ASAN_UNPOISON_MEMORY_REGION(region.first, region.second);
  }
}

inline void enter() {
  auto& s = state::get();
  std::lock_guard lk(s.m);
  if (!s.active) return;
  if (s.depth++ == 0) {
    settle(s);
    poison_all(s, false);
  }
}

inline void leave() {
  auto& s = state::get();
  std::lock_guard lk(s.m);
  if (!s.active || s.depth == 0) return;
  if (--s.depth == 0) {
    settle(s);
    poison_all(s, true);
  }
}

extern "C" inline void guard_allocate(Kokkos::Profiling::SpaceHandle space, const char* label, const void* ptr,
                                      std::uint64_t bytes) {
  if (std::strcmp(space.name, Kokkos::DefaultExecutionSpace::memory_space::name()) != 0) return;
  const std::string l = label ? label : "";
  constexpr std::string_view mirror = "_mirror";
  if (l.size() >= mirror.size() && l.compare(l.size() - mirror.size(), mirror.size(), mirror) == 0) return;
  auto& s = state::get();
  std::lock_guard lk(s.m);
  s.pending[ptr] = {static_cast<std::size_t>(bytes), l};
}

extern "C" inline void guard_deallocate(Kokkos::Profiling::SpaceHandle, const char*, const void* ptr, std::uint64_t) {
  auto& s = state::get();
  std::lock_guard lk(s.m);
  s.pending.erase(ptr);
  auto it = s.guarded.find(ptr);
  if (it != s.guarded.end()) {
    ASAN_UNPOISON_MEMORY_REGION(it->second.first, it->second.second);
    s.guarded.erase(it);
  }
}

extern "C" inline void guard_begin_kernel(const char*, std::uint32_t, std::uint64_t*) { enter(); }
extern "C" inline void guard_end_kernel(std::uint64_t) { leave(); }
extern "C" inline void guard_begin_copy(Kokkos::Profiling::SpaceHandle, const char*, const void*,
                                        Kokkos::Profiling::SpaceHandle, const char*, const void*, std::uint64_t) {
  enter();
}
extern "C" inline void guard_end_copy() { leave(); }

/// Whether the guard is on in this process.
inline bool active() { return state::get().active; }

/// (Re)installs the kernel callbacks; a profiler that replaced them calls this when it stops.
inline void install_kernel_callbacks() {
  namespace E = Kokkos::Tools::Experimental;
  E::set_begin_parallel_for_callback(&guard_begin_kernel);
  E::set_end_parallel_for_callback(&guard_end_kernel);
  E::set_begin_parallel_reduce_callback(&guard_begin_kernel);
  E::set_end_parallel_reduce_callback(&guard_end_kernel);
  E::set_begin_parallel_scan_callback(&guard_begin_kernel);
  E::set_end_parallel_scan_callback(&guard_end_kernel);
}

/// Turns the guard on when HALIAX_DEVICE_GUARD asks for it; call once Kokkos is initialised.
inline void install() {
  if (!requested()) return;
  auto& s = state::get();
  {
    std::lock_guard lk(s.m);
    if (s.active) return;
    s.active = true;
  }
  namespace E = Kokkos::Tools::Experimental;
  E::set_allocate_data_callback(&guard_allocate);
  E::set_deallocate_data_callback(&guard_deallocate);
  E::set_begin_deep_copy_callback(&guard_begin_copy);
  E::set_end_deep_copy_callback(&guard_end_copy);
  install_kernel_callbacks();
  std::fprintf(stderr,
               "haliax: HALIAX_DEVICE_GUARD=1: arrays are unreadable from host code outside Kokkos kernels and deep "
               "copies (as device memory is); portable kernels on\n");
}

#else

inline bool active() { return false; }
inline void enter() {}
inline void leave() {}
inline void install_kernel_callbacks() {}
inline void install() {
  if (!requested()) return;
  // At start-up, before any data exists: the program ends here rather than run without the check it asked for.
  std::fprintf(stderr,
               "haliax: HALIAX_DEVICE_GUARD=1 needs a build compiled with -fsanitize=address "
               "(scripts/check-device-access.sh makes one); unset HALIAX_DEVICE_GUARD to run this build\n");
  std::exit(2);
}

#endif

/// Marks device work that Kokkos Tools does not see (a BLAS call on the arrays' memory) for the guard's lifetime.
struct device_work {
  device_work() { enter(); }
  ~device_work() { leave(); }
  device_work(const device_work&) = delete;
  device_work& operator=(const device_work&) = delete;
};

}  // namespace haliax::detail::device_guard
