// Strided copies between contiguous buffers: copy-permutes and broadcasts. Private.
#pragma once

#include <Kokkos_Core.hpp>
#include <cstdint>

#include "nd_loop.hpp"

namespace haliax::detail {

/// A copy-permute whose source is contiguous along plan dim `d` and whose destination is contiguous along the
/// last plan dim: done in square tiles so that both sides touch whole cache lines (a plain loop along the
/// destination reads one element per source cache line; tiling made a 4096^2 float transpose about 4x faster
/// on the development machine).
template <class T>
void copy_tiled(const char* label, const nd_plan<2>& plan, int d, T* dst, const T* src) {
  constexpr std::int64_t tile = 32;
  const nd_plan<2> p = plan;
  const int last = p.rank - 1;
  const std::int64_t tiles_d = (p.extent[d] + tile - 1) / tile;
  const std::int64_t tiles_l = (p.extent[last] + tile - 1) / tile;
  std::int64_t n_outer = 1;
  for (int e = 0; e < last; ++e)
    if (e != d) n_outer *= p.extent[e];
  host_loop(
      label, n_outer * tiles_d * tiles_l, n_outer * p.extent[d] * p.extent[last], KOKKOS_LAMBDA(std::int64_t w) {
        const std::int64_t tl = w % tiles_l;
        w /= tiles_l;
        const std::int64_t td = w % tiles_d;
        std::int64_t outer = w / tiles_d;
        std::int64_t o0 = 0, o1 = 0;
        for (int e = last - 1; e >= 0; --e) {
          if (e == d) continue;
          const std::int64_t i = outer % p.extent[e];
          outer /= p.extent[e];
          o0 += i * p.stride[0][e];
          o1 += i * p.stride[1][e];
        }
        const std::int64_t i0 = td * tile, i1 = i0 + tile < p.extent[d] ? i0 + tile : p.extent[d];
        const std::int64_t j0 = tl * tile, j1 = j0 + tile < p.extent[last] ? j0 + tile : p.extent[last];
        const std::int64_t dst_i = p.stride[0][d], src_j = p.stride[1][last];
        for (std::int64_t i = i0; i < i1; ++i) {
          T* o = dst + o0 + i * dst_i;
          const T* in = src + o1 + i;
          for (std::int64_t j = j0; j < j1; ++j) o[j] = in[j * src_j];
        }
      });
}

/// dst[i] = src[i] over an n-d index space of `rank` dims with the given extents and per-dim strides (in
/// elements). Dims are given in the destination's order, so the plan's innermost loop runs along the
/// destination's contiguous dimension (writes are sequential); when the source is contiguous along another
/// dimension the copy is tiled over those two.
template <class T>
void copy_strided(const char* label, int rank, T* dst, const std::int64_t* dst_strides, const T* src,
                  const std::int64_t* src_strides, const std::int64_t* extents) {
  const std::int64_t* st[2] = {dst_strides, src_strides};
  auto plan = make_plan<2>(rank, extents, st);
  if (plan.rank >= 2 && plan.stride[0][plan.rank - 1] == 1 && plan.stride[1][plan.rank - 1] != 1) {
    const int last = plan.rank - 1;
    for (int d = 0; d < last; ++d)
      if (plan.stride[1][d] == 1 && plan.extent[d] >= 8 && plan.extent[last] >= 8) {
        copy_tiled<T>(label, plan, d, dst, src);
        return;
      }
  }
  nd_for_each<2>(
      label, plan, KOKKOS_LAMBDA(const std::int64_t* off, const std::int64_t* s, std::int64_t n) {
        T* o = dst + off[0];
        const T* in = src + off[1];
        if (s[0] == 1 && s[1] == 1) {
          for (std::int64_t j = 0; j < n; ++j) o[j] = in[j];
        } else {
          for (std::int64_t j = 0; j < n; ++j) o[j * s[0]] = in[j * s[1]];
        }
      });
}

}  // namespace haliax::detail
