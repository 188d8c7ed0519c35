// haliax/ops/indexing.hpp: picking parts of arrays by position along named axes: index, slice, take,
// updated_slice.
//
//   auto row = haliax::index(x, Pos, 3);                    // {batch, position, embed} -> {batch, embed}
//   auto win = haliax::slice(x, Pos, 16, 32);               // position keeps its name, size 32
//   auto emb = haliax::take(table, Vocab, ids);             // {vocab, embed} x {batch, position} -> {batch, position,
//   embed} auto upd = haliax::updated_slice(cache, Pos, t, kv);    // a copy of cache with kv written at position t
//
// Every op is constrained so that an axis the array lacks is a compile error at the call site. Index rules
// (documented per op) follow upstream Haliax / JAX: `index` with an integer checks its range (numpy), `index`
// with a `dslice` reads zeros outside the axis (gather mode "fill"), `slice` and `updated_slice` clamp their
// start (`lax.dynamic_slice` / `dynamic_update_slice`), `take` clamps indices by default (gather mode "clip").
// Results of `index`/`slice` share x's buffer when the part is contiguous in it (see layout.hpp).
//
// Gradients (see autodiff.hpp), for float arrays: `index`/`slice` put g back at the positions read (zeros
// elsewhere); `take` scatter-adds g into zeros at the gathered positions (deterministic: every element of the
// gradient sums its contributions serially in index order); `updated_slice` gives x the gradient outside the
// written region and the update the gradient inside it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "../core.hpp"
#include "../detail/axis_algebra.hpp"
#include "../detail/nd_loop.hpp"
#include "../detail/row_team.hpp"
#include "elementwise.hpp"
#include "layout.hpp"

namespace haliax {

/// A dynamic slice of an axis: `length` positions from `start` (upstream `dslice(start, length)`, alias `ds`).
/// `index(x, Pos, dslice{8, 4})` keeps positions 8..11.
struct dslice {
  std::int64_t start = 0;
  std::int64_t length = 0;
  /// Block `idx` of consecutive blocks of `size` (upstream `dslice.block`): `dslice{idx * size, size}`.
  static constexpr dslice block(std::int64_t idx, std::int64_t size) { return {idx * size, size}; }
};
using ds = dslice;

/// Block `idx` of consecutive blocks of `size` along an axis (upstream `dblock`): `dslice{idx * size, size}`.
constexpr dslice dblock(std::int64_t idx, std::int64_t size) { return dslice::block(idx, size); }

/// What `take` does with an index outside [0, n): `clip` clamps it into range (JAX gather mode "clip"),
/// `fill` reads a fill value instead (JAX mode "fill").
enum class gather_mode { clip, fill };

/// Start positions on several axes, for the multi-axis `updated_slice`: made by `starts(Pos, 3, Head, 0)`.
template <AxisTag... A>
struct axis_starts {
  std::array<std::int64_t, sizeof...(A)> values{};
};

namespace detail::indexing {

/// take's gather (a named function: nvcc allows no device lambda in a function with a deduced return type).
template <class T>
void take_kernel(const nd_plan<3>& plan, const T* px, const std::int32_t* pi, T* po, std::int64_t n,
                 std::int64_t ax_stride, bool clip, T fill_v) {
  nd_for_each<3>(
      "haliax::take", plan, KOKKOS_LAMBDA(const std::int64_t* off, const std::int64_t* s, std::int64_t m) {
        for (std::int64_t j = 0; j < m; ++j) {
          std::int64_t t = pi[off[2] + j * s[2]];
          if (t < 0 || t >= n) {
            if (!clip) {
              po[off[0] + j * s[0]] = fill_v;
              continue;
            }
            t = t < 0 ? 0 : n - 1;
          }
          po[off[0] + j * s[0]] = px[off[1] + j * s[1] + t * ax_stride];
        }
      });
}
template <class L, class Tuple, std::size_t... I>
auto make_starts(const Tuple& t, std::index_sequence<I...>) {
  return []<class... A>(mp::mp_list<A...>, auto... v) { return axis_starts<A...>{{static_cast<std::int64_t>(v)...}}; }(
             L{}, std::get<2 * I + 1>(t)...);
}

template <class... P>
struct start_pairs;
template <>
struct start_pairs<> {
  using axes_list = mp::mp_list<>;
  static constexpr bool valid = true;
};
template <class A>
struct start_pairs<A> {
  using axes_list = mp::mp_list<>;
  static constexpr bool valid = false;
};
template <class A, class I, class... R>
struct start_pairs<A, I, R...> {
  using axes_list = mp::mp_push_front<typename start_pairs<R...>::axes_list, std::remove_cvref_t<A>>;
  static constexpr bool valid = AxisTag<A> && std::is_integral_v<I> && start_pairs<R...>::valid;
};
}  // namespace detail::indexing

/// Start positions by axis, written as pairs: `starts(Pos, t, Head, 0)` (the C++ spelling of upstream's
/// `{"position": t, "head": 0}`). Each axis at most once.
///   auto u = updated_slice(cache, starts(Layer, l, Pos, t), kv);
template <class... P>
requires(sizeof...(P) > 0) && detail::indexing::start_pairs<P...>::valid&& detail::is_unique_v<
                                  typename detail::indexing::start_pairs<P...>::axes_list> auto starts(P... p) {
  using L = typename detail::indexing::start_pairs<P...>::axes_list;
  return detail::indexing::make_starts<L>(std::tuple{p...}, std::make_index_sequence<sizeof...(P) / 2>{});
}

namespace detail::indexing {
template <class S, class Axes>
struct starts_of : std::false_type {};
template <class... A, class Axes>
struct starts_of<axis_starts<A...>, Axes> : std::bool_constant<subset_v<mp::mp_list<A...>, to_list<Axes>>> {};

/// Axes of `take(x, Ax, idx)`: x's axes with Ax replaced, in place, by the index axes that x does not have.
template <class LX, class Ax, class LI>
struct take_axes {
  static constexpr std::size_t k = mp::mp_find<LX, Ax>::value;
  using rest = mp::mp_remove<LX, Ax>;
  using shared = intersection<LI, rest>;
  using fresh = difference<LI, rest>;
  using result = mp::mp_append<mp::mp_take_c<LX, k>, fresh, mp::mp_drop_c<LX, k + 1>>;
};

template <class Ax, class Axes>
constexpr std::size_t axis_pos = index_of_v<to_list<Axes>, std::remove_cvref_t<Ax>>;

template <class Ax, class T, class Axes>
[[noreturn]] void throw_out_of_range(const char* op, const named_array<T, Axes>& x, std::int64_t i) {
  throw shape_error(std::string(op) + ": index " + std::to_string(i) + " is out of range for axis '" +
                    std::string(std::remove_cvref_t<Ax>::name) + "' of size " +
                    std::to_string(x.sizes()[axis_pos<Ax, Axes>]) + " in " + x.shape_string());
}
}  // namespace detail::indexing

/// `Starts` (an `axis_starts<...>` from `starts(...)`) names only axes of `Axes`.
template <class Starts, class Axes>
concept StartsOf = AxisList<Axes> && detail::indexing::starts_of<std::remove_cvref_t<Starts>, Axes>::value;

/// Every axis of `AxU` is an axis of `Axes` (an update that fits into an array by name).
template <class AxU, class Axes>
concept SubAxesOf = AxisList<AxU> && AxisList<Axes> &&
    detail::subset_v<detail::to_list<std::remove_cvref_t<AxU>>, detail::to_list<std::remove_cvref_t<Axes>>>;

// ---------------------------------------------------------------------------------------------------------
// index / slice

namespace detail::indexing {
/// `slice` with the result labelled R (x's axes, the sliced one maybe renamed).
template <class R, class Ax, class T, class Axes>
named_array<T, R> slice_as(const named_array<T, Axes>& x, std::int64_t start, std::int64_t length) {
  constexpr std::size_t k = axis_pos<Ax, Axes>;
  const std::int64_t n = x.sizes()[k];
  if (length < 0 || length > n)
    throw shape_error("haliax::slice: length " + std::to_string(length) + " does not fit axis '" +
                      std::string(std::remove_cvref_t<Ax>::name) + "' of size " + std::to_string(n) + " in " +
                      x.shape_string());
  const std::int64_t s = std::clamp<std::int64_t>(start, 0, n - length);
  auto rs = x.sizes();
  rs[k] = length;
  named_array<T, R> r = layout::slab_array<R>("haliax::slice", x, rs, k, s, length);
  layout::record_grad(
      r,
      [xs = x.sizes(), s, length](const named_array<T, R>& g, auto) {
        return std::tuple{layout::unslab<Axes>("haliax::slice_grad", g.data(), xs, k, s, length)};
      },
      x);
  return r;
}
}  // namespace detail::indexing

/// `x` at position `i` of axis `Ax`, which is dropped (upstream `x[{"pos": i}]`). A negative `i` counts from
/// the end (numpy); outside [-n, n) throws `shape_error` naming the axis and its size. Shares x's buffer when
/// the slice is contiguous in it (e.g. Ax is the leading axis), else copies. Gradient: g at position i, zeros
/// elsewhere.
///   auto row = index(x, Pos, 3);     // {batch, position, embed} -> {batch, embed}
///   auto last = index(x, Pos, -1);
template <class T, class Axes, AxisTag Ax>
requires AxisOf<Ax, Axes> named_array<T, detail::layout::without_axis<Axes, Ax>> index(const named_array<T, Axes>& x,
                                                                                       Ax, std::int64_t i) {
  using namespace detail;
  using R = layout::without_axis<Axes, Ax>;
  constexpr std::size_t k = indexing::axis_pos<Ax, Axes>;
  const std::int64_t n = x.sizes()[k];
  const std::int64_t j = i < 0 ? i + n : i;
  if (j < 0 || j >= n) indexing::throw_out_of_range<Ax>("haliax::index", x, i);
  std::array<std::int64_t, R::rank> rs{};
  for (std::size_t d = 0, e = 0; d < Axes::rank; ++d)
    if (d != k) rs[e++] = x.sizes()[d];
  named_array<T, R> r = layout::slab_array<R>("haliax::index", x, rs, k, j, 1);
  layout::record_grad(
      r,
      [xs = x.sizes(), j](const named_array<T, R>& g, auto) {
        return std::tuple{layout::unslab<Axes>("haliax::index_grad", g.data(), xs, k, j, 1)};
      },
      x);
  return r;
}

/// `x` at positions [start, start + length) of axis `Ax`, which keeps its name with size `length` (upstream
/// `x[{"pos": dslice(start, length)}]`). Positions outside the axis read zero (upstream gather mode "fill");
/// a negative length throws `shape_error`. Gradient: g at the positions inside the axis, zeros elsewhere.
///   auto w = index(x, Pos, dslice{8, 4});    // position: 8..11
///   auto b = index(x, Pos, dblock(2, 16));   // position: 32..47
template <class T, class Axes, AxisTag Ax>
requires AxisOf<Ax, Axes> named_array<T, Axes> index(const named_array<T, Axes>& x, Ax, dslice d) {
  using namespace detail;
  constexpr std::size_t k = indexing::axis_pos<Ax, Axes>;
  const std::int64_t n = x.sizes()[k];
  if (d.length < 0)
    throw shape_error("haliax::index: dslice length " + std::to_string(d.length) + " is negative for axis '" +
                      std::string(std::remove_cvref_t<Ax>::name) + "' of " + x.shape_string());
  auto rs = x.sizes();
  rs[k] = d.length;
  const std::int64_t lo = std::clamp<std::int64_t>(d.start, 0, n);
  const std::int64_t hi = std::clamp<std::int64_t>(d.start + d.length, 0, n);
  named_array<T, Axes> r;
  if (lo == d.start && hi == d.start + d.length) {  // entirely inside: a plain slab
    r = layout::slab_array<Axes>("haliax::index", x, rs, k, d.start, d.length);
  } else {
    r = named_array<T, Axes>::allocate(rs, "haliax::index");
    fill(r, from_double<T>(0.0));
    if (hi > lo) {
      const std::int64_t outer = layout::product(x.sizes(), 0, k);
      const std::int64_t inner = layout::product(x.sizes(), k + 1, Axes::rank);
      layout::copy_rows<T>("haliax::index", r.data() + (lo - d.start) * inner, d.length * inner,
                           x.data() + lo * inner, n * inner, outer, (hi - lo) * inner);
    }
  }
  layout::record_grad(
      r,
      [xs = x.sizes(), d](const named_array<T, Axes>& g, auto) {
        return std::tuple{layout::unslab<Axes>("haliax::index_grad", g.data(), xs, k, d.start, d.length)};
      },
      x);
  return r;
}

/// `length` consecutive positions of axis `Ax` from `start`; the axis keeps its name with size `length`
/// (upstream `slice(x, axis, start=, length=)`, i.e. `lax.dynamic_slice_in_dim`). As in JAX the start is
/// clamped into [0, n - length], so the result is always `length` real elements; a length outside [0, n]
/// throws `shape_error`. Shares x's buffer when the slice is contiguous in it, else copies. Gradient: g at the
/// positions read, zeros elsewhere.
///   auto w = slice(x, Pos, 16, 32);   // {batch, position=128} -> {batch, position=32}, positions 16..47
template <class T, class Axes, AxisTag Ax>
requires AxisOf<Ax, Axes> named_array<T, Axes> slice(const named_array<T, Axes>& x, Ax, std::int64_t start,
                                                     std::int64_t length) {
  return detail::indexing::slice_as<Axes, Ax>(x, start, length);
}

/// `slice(x, Ax, New, start, length)`: the same, with the sliced axis renamed to `New` (upstream
/// `slice(x, axis, new_axis, start, length)`), e.g. to take key positions out of positions.
///   auto k = slice(x, Pos, KPos, 0, t);   // {position=128, embed} -> {key_position=t, embed}
template <class T, class Axes, AxisTag Ax, AxisTag New>
requires AxisOf<Ax, Axes> && ReplacementFor<New, Ax, Axes> named_array<T, detail::layout::replaced_axis<Axes, Ax, New>>
slice(const named_array<T, Axes>& x, Ax, New, std::int64_t start, std::int64_t length) {
  return detail::indexing::slice_as<detail::layout::replaced_axis<Axes, Ax, New>, Ax>(x, start, length);
}

/// `slice(x, Ax, start, n * New)`: the same, with the new axis and its size given together (upstream
/// `slice(x, axis, start=, length=Axis)`).
///   auto k = slice(x, Pos, 0, 64 * KPos);   // {position=128, embed} -> {key_position=64, embed}
template <class T, class Axes, AxisTag Ax, AxisTag New>
requires AxisOf<Ax, Axes> && ReplacementFor<New, Ax, Axes> named_array<T, detail::layout::replaced_axis<Axes, Ax, New>>
slice(const named_array<T, Axes>& x, Ax a, std::int64_t start, sized_axis<New> length) {
  return slice(x, a, New{}, start, length.size);
}

// ---------------------------------------------------------------------------------------------------------
// take

namespace detail::indexing {
/// take_grad's index geometry: result extents and index strides (dims before k, fresh, after).
struct take_grad_dims {
  int nb = 0, nf = 0, na = 0;
  std::int64_t ext[max_rank]{}, str[max_rank]{};
  bool after_dep = false;  // the index varies along the dims after k
};

/// take_grad's scatter-add (an axis-free function, for nvcc: see haliax::detail::fill_raw).
template <class T, class A>
void take_grad_kernel(const take_grad_dims& p, const T* pg, A* pa, const std::int32_t* idx, std::int64_t outer,
                      std::int64_t per_row, std::int64_t block, std::int64_t inner, std::int64_t nfresh,
                      std::int64_t n, bool clip) {
    const take_grad_dims q = p;
    Kokkos::parallel_for(
        "haliax::take_grad", Kokkos::RangePolicy<execution_space, Kokkos::IndexType<std::int64_t>>(0, outer * per_row), KOKKOS_LAMBDA(std::int64_t t) {
          const std::int64_t ob = t / per_row;
          const std::int64_t a0 = (t - ob * per_row) * block;
          const std::int64_t a1 = a0 + block < inner ? a0 + block : inner;
          // the index array's offset for linear position `lin` over result dims [first, first + count)
          auto offset = [&](std::int64_t lin, int first, int count) {
            std::int64_t off = 0;
            for (int d = first + count - 1; d >= first; --d) {
              off += (lin % q.ext[d]) * q.str[d];
              lin /= q.ext[d];
            }
            return off;
          };
          const std::int64_t ib = offset(ob, 0, q.nb);
          const T* gb = pg + ob * nfresh * inner;
          A* xb = pa + ob * n * inner;
          for (std::int64_t f = 0; f < nfresh; ++f) {
            const std::int64_t ibf = ib + offset(f, q.nb, q.nf);
            const T* src = gb + f * inner;
            if (!q.after_dep) {
              std::int64_t j = idx[ibf];
              if (j < 0 || j >= n) {
                if (!clip) continue;
                j = j < 0 ? 0 : n - 1;
              }
              A* dst = xb + j * inner;
              for (std::int64_t a = a0; a < a1; ++a) dst[a] += static_cast<A>(src[a]);
            } else {
              for (std::int64_t a = a0; a < a1; ++a) {
                std::int64_t j = idx[ibf + offset(a, q.nb + q.nf, q.na)];
                if (j < 0 || j >= n) {
                  if (!clip) continue;
                  j = j < 0 ? 0 : n - 1;
                }
                xb[j * inner + a] += static_cast<A>(src[a]);
              }
            }
          }
        });
}

/// Keys per chunk of take_grad_sorted's radix passes, and bits per pass: constants of every build.
inline constexpr std::int64_t take_sort_chunk = 256;
inline constexpr int take_sort_bits = 8;
inline constexpr std::int64_t take_sort_buckets = std::int64_t{1} << take_sort_bits;

/// take_grad_sorted's sort, apart from the element type (so that its kernels are compiled once per translation
/// unit, not once per element type): the positions [0, nfresh) sorted stably by the row they name (clipped, or n
/// when dropped), in the buffers of `keys` and `positions` (each a pair, ping and pong); returns which of each pair
/// holds the result.
inline std::pair<const std::int32_t*, const std::int64_t*> sort_by_row(
    const take_grad_dims& p, const std::int32_t* idx, std::int64_t nfresh, std::int64_t n, bool clip,
    haliax::detail::buffer_lease<std::int32_t> (&keys)[2], haliax::detail::buffer_lease<std::int64_t> (&positions)[2]) {
  using haliax::detail::buffer_cache;
  using haliax::detail::buffer_lease;
  using range = Kokkos::RangePolicy<execution_space, Kokkos::IndexType<std::int64_t>>;
  const std::size_t nf = static_cast<std::size_t>(nfresh);
  const std::int64_t nchunks = (nfresh + take_sort_chunk - 1) / take_sort_chunk;
  buffer_lease<std::int64_t> counts, offsets, totals;
  for (int i = 0; i < 2; ++i) {
    keys[i].view = buffer_cache<std::int32_t>::take(nf, "haliax::take_grad(keys)");
    positions[i].view = buffer_cache<std::int64_t>::take(nf, "haliax::take_grad(positions)");
  }
  counts.view = buffer_cache<std::int64_t>::take(static_cast<std::size_t>(nchunks * take_sort_buckets),
                                                 "haliax::take_grad(digit counts)");
  offsets.view = buffer_cache<std::int64_t>::take(static_cast<std::size_t>(nchunks * take_sort_buckets),
                                                  "haliax::take_grad(digit offsets)");
  totals.view = buffer_cache<std::int64_t>::take(static_cast<std::size_t>(take_sort_buckets),
                                                 "haliax::take_grad(digit totals)");
  std::int32_t* key = keys[0].view.data();
  std::int32_t* key2 = keys[1].view.data();
  std::int64_t* val = positions[0].view.data();
  std::int64_t* val2 = positions[1].view.data();
  std::int64_t* cnt = counts.view.data();   // [digit, chunk]
  std::int64_t* offs = offsets.view.data();  // [digit, chunk]
  std::int64_t* tot = totals.view.data();    // [digit]
  const std::int64_t chunk = take_sort_chunk, buckets = take_sort_buckets;
  const take_grad_dims q = p;
  Kokkos::parallel_for(
      "haliax::take_grad(keys)", range(0, nfresh), KOKKOS_LAMBDA(const std::int64_t f) {
        std::int64_t off = 0, lin = f;
        for (int d = q.nb + q.nf - 1; d >= q.nb; --d) {
          off += (lin % q.ext[d]) * q.str[d];
          lin /= q.ext[d];
        }
        std::int64_t j = idx[off];
        if (j < 0 || j >= n) j = clip ? (j < 0 ? 0 : n - 1) : n;
        key[f] = static_cast<std::int32_t>(j);
        val[f] = f;
      });
  int bits = 0;
  while ((std::int64_t{1} << bits) <= n) ++bits;  // the largest key is n (a filled index)
  for (int shift = 0; shift < bits; shift += take_sort_bits) {
    const std::int32_t* kin = key;
    const std::int64_t* vin = val;
    std::int32_t* kout = key2;
    std::int64_t* vout = val2;
    Kokkos::parallel_for(
        "haliax::take_grad(digit counts)", range(0, nchunks), KOKKOS_LAMBDA(const std::int64_t c) {
          for (std::int64_t dg = 0; dg < buckets; ++dg) cnt[dg * nchunks + c] = 0;
          const std::int64_t i1 = (c + 1) * chunk < nfresh ? (c + 1) * chunk : nfresh;
          for (std::int64_t i = c * chunk; i < i1; ++i)
            ++cnt[((kin[i] >> shift) & (buckets - 1)) * nchunks + c];
        });
    // Exclusive offsets in (digit, chunk) order: a digit's base is the count of every smaller digit.
    Kokkos::parallel_for(
        "haliax::take_grad(digit totals)", range(0, buckets), KOKKOS_LAMBDA(const std::int64_t dg) {
          std::int64_t sum = 0;
          for (std::int64_t c = 0; c < nchunks; ++c) sum += cnt[dg * nchunks + c];
          tot[dg] = sum;
        });
    Kokkos::parallel_for(
        "haliax::take_grad(digit offsets)", range(0, buckets), KOKKOS_LAMBDA(const std::int64_t dg) {
          std::int64_t base = 0;
          for (std::int64_t e = 0; e < dg; ++e) base += tot[e];
          for (std::int64_t c = 0; c < nchunks; ++c) {
            offs[dg * nchunks + c] = base;
            base += cnt[dg * nchunks + c];
          }
        });
    Kokkos::parallel_for(
        "haliax::take_grad(scatter)", range(0, nchunks), KOKKOS_LAMBDA(const std::int64_t c) {
          const std::int64_t i1 = (c + 1) * chunk < nfresh ? (c + 1) * chunk : nfresh;
          for (std::int64_t i = c * chunk; i < i1; ++i) {
            const std::int64_t at = offs[((kin[i] >> shift) & (buckets - 1)) * nchunks + c]++;
            kout[at] = kin[i];
            vout[at] = vin[i];
          }
        });
    std::swap(key, key2);
    std::swap(val, val2);
  }
  return {key, val};
}

/// take_grad for a gather from a table (nothing before the taken dim, the index constant along the dims after
/// it: an embedding lookup), where the other kernel splits the work only over the table's columns (12 work items
/// for GPT-2's wte on a GPU). The gathered positions f are sorted by the row they name with a stable LSD radix
/// sort (8-bit digits; per pass: each 256-key chunk counts its digits in order, each digit's chunk offsets are
/// laid out in (digit, chunk) order, each chunk scatters its keys in order; integer counts only), then one
/// team member per sorted position that starts a run of equal rows adds the run's gradient rows into its table
/// row in position order, the vector lanes splitting the row. Each table element thus gets its contributions
/// in the order of f, starting from zero, exactly as the other kernel adds them: the same bits, on every build,
/// whatever the thread count. Clipped indices sort as their clamped row; filled ones as row n, after all the
/// others, and add nowhere. `pa` holds zeros on entry. Scratch comes from the buffer cache.
template <class T, class A>
void take_grad_sorted(const take_grad_dims& p, const T* pg, A* pa, const std::int32_t* idx, std::int64_t inner,
                      std::int64_t nfresh, std::int64_t n, bool clip) {
  haliax::detail::buffer_lease<std::int32_t> keys[2];
  haliax::detail::buffer_lease<std::int64_t> positions[2];
  const auto sorted = sort_by_row(p, idx, nfresh, n, clip, keys, positions);
  const std::int32_t* skey = sorted.first;
  const std::int64_t* sval = sorted.second;
  const std::int32_t dropped = static_cast<std::int32_t>(n);  // idx is int32, so n fits
  Kokkos::parallel_for(
      "haliax::take_grad(rows)", haliax::detail::row_policy(nfresh), KOKKOS_LAMBDA(const haliax::detail::row_member& t) {
        const std::int64_t s = haliax::detail::row_of(t);
        if (s >= nfresh) return;
        const std::int32_t j = skey[s];
        if (j == dropped || (s > 0 && skey[s - 1] == j)) return;  // not the start of a run
        A* dst = pa + static_cast<std::int64_t>(j) * inner;
        for (std::int64_t r = s; r < nfresh && skey[r] == j; ++r) {
          const T* src = pg + sval[r] * inner;
          Kokkos::parallel_for(Kokkos::ThreadVectorRange(t, inner),
                               [&](const std::int64_t a) { dst[a] += static_cast<A>(src[a]); });
        }
      });
}

/// The gradient of `take` for x (axes AxX, sizes xs, taken along dim k): g (the result's layout: x's dims
/// before k, then `nf` index dims, then x's dims after k) scatter-added into zeros at the gathered positions.
/// `si` holds the index array's stride along each result dim (0 where it lacks the dim). Indices out of range
/// add into the clamped position (`clip`) or nowhere (`fill`), as JAX's gather gradients do.
///
/// Deterministic: the work is split by the positions of x outside dim k (x's dims before k, and blocks of the
/// contiguous dims after it), so each gradient element has one owner, which adds its contributions serially
/// in the order of the index dims. Accumulates in float for bf16.
template <class AxX, class T, class AxR>
named_array<T, AxX> take_grad(const named_array<T, AxR>& g, const std::int32_t* idx,
                              const std::array<std::int64_t, AxX::rank>& xs, std::size_t k,
                              const std::array<std::int64_t, AxR::rank>& si, bool clip) {
  using A = compute_t<T>;
  constexpr std::size_t N = AxX::rank, NR = AxR::rank;
  constexpr std::size_t nf = NR + 1 - N;
  auto acc = named_array<A, AxX>::allocate(xs, "haliax::take_grad");
  fill(acc, A(0));
  const std::int64_t outer = layout::product(xs, 0, k);
  const std::int64_t inner = layout::product(xs, k + 1, N);
  const std::int64_t n = xs[k];
  const std::int64_t nfresh = layout::product(g.sizes(), k, k + nf);
  if (acc.element_count() > 0 && g.element_count() > 0) {
    take_grad_dims p;
    p.nb = static_cast<int>(k);
    p.nf = static_cast<int>(nf);
    p.na = static_cast<int>(NR - k - nf);
    for (std::size_t d = 0; d < NR; ++d) {
      p.ext[d] = g.sizes()[d];
      p.str[d] = si[d];
      if (d >= k + nf && si[d] != 0 && g.sizes()[d] > 1) p.after_dep = true;
    }
    // Blocks of the contiguous dims after k: enough tasks to spread, at least 64 elements each. The split
    // changes no element's arithmetic.
    std::int64_t per_row = std::min<std::int64_t>((inner + 63) / 64, (256 + outer - 1) / outer);
    per_row = per_row < 1 ? 1 : per_row;
    const std::int64_t block = (inner + per_row - 1) / per_row;
    per_row = (inner + block - 1) / block;
    if (outer == 1 && !p.after_dep) {
      take_grad_sorted<T, A>(p, g.data(), acc.data(), idx, inner, nfresh, n, clip);
    } else {
      take_grad_kernel<T, A>(p, g.data(), acc.data(), idx, outer, per_row, block, inner, nfresh, n, clip);
    }
  }
  if constexpr (std::is_same_v<A, T>) {
    return acc;
  } else {
    return astype<T>(acc);
  }
}
}  // namespace detail::indexing

/// Gathers along `Ax` by an index array (upstream `take(x, axis, idx)`): the result is x with `Ax` replaced,
/// in place, by the axes of `idx` that x does not have; out[..., i..., ...] = x[..., idx[i...], ...].
/// Axes that `idx` shares with x (other than Ax) are matched, not repeated: a batched gather (upstream
/// `take_along_axis` behaviour); their sizes must agree (else `shape_error` naming both shapes).
/// Out-of-range indices: with `gather_mode::clip` (the default) they are clamped into [0, n) (JAX gather mode
/// "clip"; negative indices do *not* count from the end); with `gather_mode::fill` they read `fill_value`.
/// Gradient (for x): g scatter-added into zeros at the gathered positions, repeated indices accumulating;
/// clipped indices add into the clamped position, filled ones add nowhere.
///   auto e = take(table, Vocab, ids);          // {vocab, embed} x {batch, position} -> {batch, position, embed}
///   auto p = take(logits, Vocab, targets);     // {batch, position, vocab} x {batch, position} -> {batch, position}
template <class T, class Axes, AxisTag Ax, class AxI>
requires AxisOf<Ax, Axes>
auto take(const named_array<T, Axes>& x, Ax, const named_array<std::int32_t, AxI>& idx,
          gather_mode mode = gather_mode::clip, std::type_identity_t<T> fill_value = T{}) {
  using namespace detail;
  using A = std::remove_cvref_t<Ax>;
  using LX = to_list<Axes>;
  using LI = to_list<AxI>;
  using TA = indexing::take_axes<LX, A, LI>;
  using LR = typename TA::result;
  using R = to_axes<LR>;
  constexpr std::size_t NR = R::rank;
  constexpr std::size_t k = TA::k;

  mp::mp_for_each<typename TA::shared>([&]<class Tag>(Tag) {
    const auto sx = x.sizes()[index_of_v<LX, Tag>];
    const auto si = idx.sizes()[index_of_v<LI, Tag>];
    if (sx != si)
      throw shape_error("haliax::take: axis '" + std::string(Tag::name) + "' has size " + std::to_string(sx) + " in " +
                        x.shape_string() + " but " + std::to_string(si) + " in the indices " + idx.shape_string());
  });

  const auto xs = row_major_strides(x.sizes());
  const auto is = row_major_strides(idx.sizes());
  std::array<std::int64_t, NR> rs{}, sx{}, si{};
  mp::mp_for_each<mp::mp_iota_c<NR>>([&](auto I) {
    constexpr std::size_t d = decltype(I)::value;
    using Tag = mp::mp_at_c<LR, d>;
    constexpr bool in_x = contains_v<typename TA::rest, Tag>;
    constexpr bool in_i = contains_v<LI, Tag>;
    if constexpr (in_x) {
      rs[d] = x.sizes()[index_of_v<LX, Tag>];
      sx[d] = xs[index_of_v<LX, Tag>];
    } else {
      rs[d] = idx.sizes()[index_of_v<LI, Tag>];
      sx[d] = 0;
    }
    if constexpr (in_i) {
      si[d] = is[index_of_v<LI, Tag>];
    } else {
      si[d] = 0;
    }
  });

  auto r = named_array<T, R>::allocate(rs, "haliax::take");
  const std::int64_t n = x.sizes()[k];
  if (r.element_count() == 0) return r;
  if (n == 0 && mode == gather_mode::clip)
    throw shape_error("haliax::take: cannot take from axis '" + std::string(A::name) + "' of size 0 in " +
                      x.shape_string() + " (use gather_mode::fill)");
  const auto so = row_major_strides(rs);
  const std::int64_t* st[3] = {so.data(), sx.data(), si.data()};
  auto plan = make_plan<3>(static_cast<int>(NR), rs.data(), st);
  const std::int64_t ax_stride = xs[k];
  const bool clip = mode == gather_mode::clip;
  const T fill_v = fill_value;
  const T* px = x.data();
  const std::int32_t* pi = idx.data();
  T* po = r.data();
  indexing::take_kernel<T>(plan, px, pi, po, n, ax_stride, clip, fill_v);
  layout::record_grad(
      r,
      [idx, xs = x.sizes(), si, clip](const named_array<T, R>& g, auto) {
        return std::tuple{indexing::take_grad<Axes>(g, idx.data(), xs, k, si, clip)};
      },
      x);
  return r;
}

/// `index(x, Ax, idx)` with an index array is `take(x, Ax, idx)` (upstream advanced indexing by a NamedArray).
///   auto e = index(table, Vocab, ids);   // {vocab, embed} x {batch, position} -> {batch, position, embed}
template <class T, class Axes, AxisTag Ax, class AxI>
requires AxisOf<Ax, Axes>
auto index(const named_array<T, Axes>& x, Ax a, const named_array<std::int32_t, AxI>& idx) { return take(x, a, idx); }

/// `take(x, Ax, i)` with an integer is `index(x, Ax, i)`: drops the axis.
///   auto row = take(x, Pos, 3);
template <class T, class Axes, AxisTag Ax>
requires AxisOf<Ax, Axes>
auto take(const named_array<T, Axes>& x, Ax a, std::int64_t i) { return index(x, a, i); }

// ---------------------------------------------------------------------------------------------------------
// updated_slice

namespace detail::indexing {
/// Zeroes the strided block p[sum_d i_d * strides[d]] for i_d in [0, ext[d]).
template <class T>
void zero_strided(T* p, int rank, const std::int64_t* strides, const std::int64_t* ext) {
  const std::int64_t* st[1] = {strides};
  auto plan = make_plan<1>(rank, ext, st);
  nd_for_each<1>(
      "haliax::zero_block", plan, KOKKOS_LAMBDA(const std::int64_t* off, const std::int64_t* s, std::int64_t n) {
        for (std::int64_t j = 0; j < n; ++j) p[off[0] + j * s[0]] = T(0);
      });
}
}  // namespace detail::indexing

/// A copy of `x` with `update` written into it from the given start positions (upstream
/// `updated_slice(x, {axis: start, ...}, update)`, i.e. `lax.dynamic_update_slice`). `update`'s axes must be
/// axes of x (any order); an axis of x that update lacks counts as size 1 there (the update is written at that
/// axis's start). Axes not named in `starts` start at 0. Each update size must be at most x's (else
/// `shape_error` naming both shapes); as in JAX each start is clamped into [0, n - update size].
/// Gradient: x gets g with the written region zeroed; the update gets the region of g, in its own axis order.
///   auto c = updated_slice(cache, starts(Layer, l, Pos, t), kv);   // kv: {head, head_dim}
///   auto d = updated_slice(x, starts(Pos, 4), y);                   // y: {position=2, embed}
template <class T, class Axes, class AxU, class... S>
requires SubAxesOf<AxU, Axes> && StartsOf<axis_starts<S...>, Axes> named_array<T, Axes> updated_slice(
    const named_array<T, Axes>& x, const axis_starts<S...>& at, const named_array<T, AxU>& update) {
  using namespace detail;
  using LX = to_list<Axes>;
  using LU = to_list<AxU>;
  using LS = mp::mp_list<S...>;
  constexpr std::size_t N = Axes::rank;
  const auto us = row_major_strides(update.sizes());
  std::array<std::int64_t, N> ext{}, src{}, start{};
  bool fits = true;
  mp::mp_for_each<mp::mp_iota_c<N>>([&](auto I) {
    constexpr std::size_t d = decltype(I)::value;
    using Tag = mp::mp_at_c<LX, d>;
    if constexpr (contains_v<LU, Tag>) {
      ext[d] = update.sizes()[index_of_v<LU, Tag>];
      src[d] = us[index_of_v<LU, Tag>];
    } else {
      ext[d] = 1;
      src[d] = 0;
    }
    if constexpr (contains_v<LS, Tag>) start[d] = at.values[index_of_v<LS, Tag>];
    fits = fits && ext[d] <= x.sizes()[d];
  });
  if (!fits)
    throw shape_error("haliax::updated_slice: update " + update.shape_string() + " does not fit into " +
                      x.shape_string());
  auto r = copy(x);
  if (r.element_count() == 0) return r;
  const auto xs = row_major_strides(x.sizes());
  std::int64_t offset = 0;
  for (std::size_t d = 0; d < N; ++d) offset += std::clamp<std::int64_t>(start[d], 0, x.sizes()[d] - ext[d]) * xs[d];
  copy_strided<T>("haliax::updated_slice", static_cast<int>(N), r.data() + offset, xs.data(), update.data(), src.data(),
                  ext.data());
  layout::record_grad(
      r,
      [offset, xs, ext, src, us = update.sizes()](const named_array<T, Axes>& g, auto needs) {
        named_array<T, Axes> gx;
        named_array<T, AxU> gu;
        if (needs[0]) {
          gx = copy(g);
          indexing::zero_strided(gx.data() + offset, static_cast<int>(N), xs.data(), ext.data());
        }
        if (needs[1]) {
          gu = named_array<T, AxU>::allocate(us, "haliax::updated_slice_grad");
          // the forward copy with source and destination swapped
          copy_strided<T>("haliax::updated_slice_grad", static_cast<int>(N), gu.data(), src.data(), g.data() + offset,
                          xs.data(), ext.data());
        }
        return std::tuple{gx, gu};
      },
      x, update);
  return r;
}

/// `updated_slice(x, Ax, start, update)`: the single-axis form, `updated_slice(x, starts(Ax, start), update)`.
///   auto c = updated_slice(cache, Pos, t, kv);   // cache {position, embed}, kv {position=1, embed} or {embed}
template <class T, class Axes, AxisTag Ax, class AxU>
requires AxisOf<Ax, Axes> && SubAxesOf<AxU, Axes> named_array<T, Axes> updated_slice(
    const named_array<T, Axes>& x, Ax a, std::int64_t start, const named_array<T, AxU>& update) {
  return updated_slice(x, starts(a, start), update);
}

}  // namespace haliax
