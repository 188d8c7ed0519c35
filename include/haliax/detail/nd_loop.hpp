// Strided n-dimensional loops over named arrays: the engine under elementwise ops, broadcasting and
// copy-permutes. Private.
//
// A plan describes an output of some extents and, for each operand, the stride (in elements) it advances per
// step of each output dimension (0 for a broadcast dimension). Dimensions of size 1 are dropped and adjacent
// dimensions that are contiguous for every operand are merged, so the common cases become one flat loop.
#pragma once

#include <Kokkos_Core.hpp>
#include <array>
#include <cstdint>

#include "portable.hpp"
#include "thread_pool.hpp"

namespace haliax::detail {

inline constexpr int max_rank = 10;

template <int NOps>
struct nd_plan {
  int rank = 0;
  std::int64_t extent[max_rank]{};
  std::int64_t stride[NOps][max_rank]{};
  std::int64_t count() const {
    std::int64_t n = 1;
    for (int d = 0; d < rank; ++d) n *= extent[d];
    return n;
  }
};

/// Row-major strides for the given sizes.
template <std::size_t N>
std::array<std::int64_t, N> row_major_strides(const std::array<std::int64_t, N>& sizes) {
  std::array<std::int64_t, N> s{};
  std::int64_t acc = 1;
  for (std::size_t i = N; i-- > 0;) {
    s[i] = acc;
    acc *= sizes[i];
  }
  return s;
}

/// Builds a plan from output extents and per-operand strides (all indexed by output dimension), then drops
/// size-1 dimensions and merges contiguous neighbours.
template <int NOps>
nd_plan<NOps> make_plan(int rank, const std::int64_t* extent, const std::int64_t* const* strides) {
  nd_plan<NOps> p;
  for (int d = 0; d < rank; ++d) {
    if (extent[d] == 1) continue;
    int k = p.rank;
    if (k > 0) {
      bool mergeable = true;
      for (int o = 0; o < NOps; ++o)
        if (p.stride[o][k - 1] != strides[o][d] * extent[d]) mergeable = false;
      if (mergeable) {
        p.extent[k - 1] *= extent[d];
        for (int o = 0; o < NOps; ++o) p.stride[o][k - 1] = strides[o][d];
        continue;
      }
    }
    p.extent[k] = extent[d];
    for (int o = 0; o < NOps; ++o) p.stride[o][k] = strides[o][d];
    p.rank = k + 1;
  }
  for (int d = 0; d < rank; ++d)
    if (extent[d] == 0) p.rank = -1;  // empty output: nothing to do
  return p;
}

/// Innermost elements per work item: runs of 4096 on the host (one item streams through its run), one on a
/// device (consecutive threads take consecutive elements, so their accesses coalesce). Elementwise results do
/// not depend on it.
inline constexpr std::int64_t chunk = host_memory ? 4096 : 1;

/// Calls `f(off_0, ..., off_{NOps-1}, n, inner_strides)` style work: for every element of the plan's index
/// space, `body(offsets)` where offsets[o] is operand o's element offset. Work is split into the outer
/// dimensions and chunks of the innermost one, so a device gets parallelism even for flat loops.
/// `inner(offsets, strides, n)` processes `n` consecutive innermost elements starting at `offsets`.
template <int NOps, class Inner>
void nd_for_each(const char* label, const nd_plan<NOps>& plan, Inner inner) {
  if (plan.rank < 0) return;
  if (plan.rank == 0) {
    // A single element: still a kernel, so that device pointers are only touched on the device.
    Kokkos::parallel_for(
        label, Kokkos::RangePolicy<Kokkos::DefaultExecutionSpace, Kokkos::IndexType<std::int64_t>>(0, 1), KOKKOS_LAMBDA(std::int64_t) {
          std::int64_t zero[NOps]{};
          std::int64_t unit[NOps]{};
          inner(zero, unit, std::int64_t(1));
        });
    return;
  }
  const nd_plan<NOps> p = plan;
  const int last = p.rank - 1;
  const std::int64_t n_inner = p.extent[last];
  const std::int64_t n_chunks = (n_inner + chunk - 1) / chunk;
  std::int64_t n_outer = 1;
  for (int d = 0; d < last; ++d) n_outer *= p.extent[d];
  host_loop(
      label, n_outer * n_chunks, n_outer * n_inner, KOKKOS_LAMBDA(std::int64_t w) {
        std::int64_t outer = w / n_chunks;
        std::int64_t c = w - outer * n_chunks;
        std::int64_t off[NOps];
        std::int64_t istride[NOps];
        for (int o = 0; o < NOps; ++o) {
          off[o] = 0;
          istride[o] = p.stride[o][last];
        }
        for (int d = last - 1; d >= 0; --d) {
          std::int64_t i = outer % p.extent[d];
          outer /= p.extent[d];
          for (int o = 0; o < NOps; ++o) off[o] += i * p.stride[o][d];
        }
        std::int64_t begin = c * chunk;
        std::int64_t n = n_inner - begin < chunk ? n_inner - begin : chunk;
        for (int o = 0; o < NOps; ++o) off[o] += begin * istride[o];
        inner(off, istride, n);
      });
}

/// Whether every operand's innermost stride is 1 (or the plan is rank 0).
template <int NOps>
bool inner_contiguous(const nd_plan<NOps>& p) {
  if (p.rank <= 0) return true;
  for (int o = 0; o < NOps; ++o)
    if (p.stride[o][p.rank - 1] != 1) return false;
  return true;
}

}  // namespace haliax::detail
