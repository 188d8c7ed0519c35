// Row kernels for the portable path: one team member per row, the row's elements spread over the member's
// vector lanes (a warp on a GPU, one lane on the host), so that a GPU reads each row coalesced instead of one
// thread walking a whole row. Private.
//
//   Kokkos::parallel_for("op", row_policy(rows), KOKKOS_LAMBDA(const row_member& t) {
//     const std::int64_t r = row_of(t);
//     if (r >= rows) return;
//     const float s = lane_sum<float>(t, n, [&](std::int64_t j) { return x[r * n + j]; });
//     ...
//   });
//
// The lane and row counts are constants of the build, never the thread count, so a row's summation order is
// fixed: each lane sums its elements in index order (in double), then the lanes are combined in the backend's
// fixed pattern. On the host (one lane) a row is summed in index order.
#pragma once

#include <Kokkos_Core.hpp>
#include <cstdint>

#include "portable.hpp"

namespace haliax::detail {

using row_team_policy = Kokkos::TeamPolicy<Kokkos::DefaultExecutionSpace>;
using row_member = row_team_policy::member_type;

/// Vector lanes per row and rows per team.
inline constexpr int row_lanes = host_memory ? 1 : 32;
inline constexpr int rows_per_team = host_memory ? 1 : 4;

/// One team member (of `row_lanes` lanes) per row, for `rows` rows.
inline row_team_policy row_policy(std::int64_t rows) {
  const std::int64_t teams = (rows + rows_per_team - 1) / rows_per_team;
  return row_team_policy(static_cast<int>(teams), rows_per_team, row_lanes);
}

/// The row a team member owns under `row_policy` (may be past the last row: check it).
KOKKOS_INLINE_FUNCTION std::int64_t row_of(const row_member& t) {
  return static_cast<std::int64_t>(t.league_rank()) * rows_per_team + t.team_rank();
}

/// sum_j f(j) for j in [0, n) over the member's lanes, accumulated in double (a lane may sum tens of thousands
/// of terms in order: on the host one lane takes the whole row); every lane gets the sum.
template <class V, class F>
KOKKOS_INLINE_FUNCTION V lane_sum(const row_member& t, std::int64_t n, const F& f) {
  double r = 0.0;
  Kokkos::parallel_reduce(
      Kokkos::ThreadVectorRange(t, n), [&](const std::int64_t j, double& acc) { acc += static_cast<double>(f(j)); },
      r);
  return static_cast<V>(r);
}

/// max_j f(j) for j in [0, n) over the member's lanes, NaN ignored; every lane gets it. An empty or all -inf
/// row gives the lowest finite value (Kokkos's identity for max), which the callers' formulas treat as -inf.
template <class V, class F>
KOKKOS_INLINE_FUNCTION V lane_max(const row_member& t, std::int64_t n, const F& f) {
  V r;
  Kokkos::parallel_reduce(
      Kokkos::ThreadVectorRange(t, n),
      [&](const std::int64_t j, V& acc) {
        const V v = f(j);
        acc = v > acc ? v : acc;
      },
      Kokkos::Max<V>(r));
  return r;
}

}  // namespace haliax::detail
