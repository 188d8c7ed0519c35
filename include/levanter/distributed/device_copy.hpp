// levanter/distributed/device_copy.hpp: the sharded optimizer state (ZeRO-1's moments, FSDP's parameter and
// gradient shards) lives in the arrays' memory space, device memory in a GPU build, while the MPI collectives
// work on host buffers. These move elements between the two and do the shards' two element-wise updates; on a
// host build they are plain copies and loops.
//
//   device_copy::flat shard("levanter::fsdp::params", n);                 // zeroed
//   device_copy::to_host(shard.data() + b, host.data(), m);             // then a collective on `host`
//   device_copy::add_from_host(grads.data() + b, summed.data(), m);     // grads[b, b + m) += summed
#pragma once

#include <Kokkos_Core.hpp>
#include <cstdint>
#include <haliax/core.hpp>
#include <string>

namespace levanter::distributed::device_copy {

/// A flat float buffer in the arrays' memory space.
using flat = Kokkos::View<float*, haliax::memory_space>;

namespace detail {
using host_view = Kokkos::View<float*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
using host_cview = Kokkos::View<const float*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
using dev_view = Kokkos::View<float*, haliax::memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
using dev_cview = Kokkos::View<const float*, haliax::memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
}  // namespace detail

/// dst[0, n) (host memory) = src[0, n) (the arrays' memory space).
inline void to_host(const float* src, float* dst, std::int64_t n) {
  if (n <= 0) return;
  const auto m = static_cast<std::size_t>(n);
  Kokkos::deep_copy(detail::host_view(dst, m), detail::dev_cview(src, m));
}

/// dst[0, n) (the arrays' memory space) = src[0, n) (host memory).
inline void from_host(const float* src, float* dst, std::int64_t n) {
  if (n <= 0) return;
  const auto m = static_cast<std::size_t>(n);
  Kokkos::deep_copy(detail::dev_view(dst, m), detail::host_cview(src, m));
}

/// dst[i] += src[i] for i in [0, n): dst in the arrays' memory space, src in host memory.
inline void add_from_host(float* dst, const float* src, std::int64_t n) {
  if (n <= 0) return;
  if (haliax::detail::host_reads_arrays()) {
    for (std::int64_t i = 0; i < n; ++i) dst[i] += src[i];
    return;
  }
  flat tmp(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("levanter::distributed::add_from_host")),
           static_cast<std::size_t>(n));
  from_host(src, tmp.data(), n);
  const float* t = tmp.data();
  Kokkos::parallel_for(
      "levanter::distributed::add_from_host", Kokkos::RangePolicy<Kokkos::DefaultExecutionSpace, Kokkos::IndexType<std::int64_t>>(0, n),
      KOKKOS_LAMBDA(std::int64_t i) { dst[i] += t[i]; });
}

/// x[i] = x[i] * s for i in [0, n), in the arrays' memory space.
inline void scale(float* x, std::int64_t n, float s) {
  if (n <= 0) return;
  Kokkos::parallel_for(
      "levanter::distributed::scale", Kokkos::RangePolicy<Kokkos::DefaultExecutionSpace, Kokkos::IndexType<std::int64_t>>(0, n),
      KOKKOS_LAMBDA(std::int64_t i) { x[i] = x[i] * s; });
}

/// dst[0, n) = src[0, n), both in the arrays' memory space.
inline void copy(const float* src, float* dst, std::int64_t n) {
  if (n <= 0) return;
  const auto m = static_cast<std::size_t>(n);
  Kokkos::deep_copy(detail::dev_view(dst, m), detail::dev_cview(src, m));
}

}  // namespace levanter::distributed::device_copy
