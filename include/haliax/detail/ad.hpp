// Reverse-mode autodiff machinery: the tape, its nodes, and the helpers ops use to record backward rules.
// Private; the user API (`value_and_grad`, `grad`, `stop_gradient`, `checkpoint`) is in haliax/autodiff.hpp.
//
// While a gradient is being taken, a thread-local tape is active. An op whose inputs include a *tracked*
// array (one carrying a node of the active tape) allocates a node for its result, with a closure that maps
// the result's gradient to its inputs' gradients. Only the op knows what the closure needs, so it captures
// exactly that (Flashlight style). Arrays without a node, or with a node of a finished tape, are constants:
// at inference nothing is recorded and an op pays one thread-local load and a null test.
//
// Backward walks the tape in reverse creation order (a topological order), runs each node's closure once with
// its accumulated gradient, then drops the closure and the gradient so memory falls while backward proceeds.
//
// Writing a rule (inside an op, after computing `r` from float inputs `a` and `b`):
//
//   if (detail::ad::any_tracked(a, b))
//     detail::ad::record(r, [a, b](const auto& g, auto needs) {
//       named_array<T, AxA> ga;  named_array<T, AxB> gb;      // left invalid when not needed
//       if (needs[0]) ga = ...;  if (needs[1]) gb = ...;
//       return std::tuple{ga, gb};
//     }, a, b);
//
// Rules run with recording paused, so they may use any haliax op.
#pragma once

#include <Kokkos_Core.hpp>
#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "../core.hpp"
#include "nd_loop.hpp"

namespace haliax::detail::ad {

/// Base of every node: the tape it belongs to and the type-erased backward step.
struct node_base {
  std::uint64_t tape_id = 0;
  static inline std::atomic<std::int64_t> live{0};  // nodes alive (tests check that backward frees them all)
  node_base() { ++live; }
  node_base(const node_base&) = delete;
  node_base& operator=(const node_base&) = delete;
  virtual ~node_base() { --live; }
  /// Propagates the accumulated gradient to the inputs, then releases the closure and the gradient.
  virtual void run_backward() = 0;
};

/// A recording in progress. Tapes nest (a checkpointed region recomputes under its own tape).
struct tape {
  std::uint64_t id;
  std::vector<std::shared_ptr<node_base>> nodes;
  tape* outer = nullptr;
};

inline std::uint64_t next_tape_id() {
  static std::atomic<std::uint64_t> counter{1};
  return counter.fetch_add(1);
}

/// The tape of this thread (null when no gradient is being taken) and a pause depth.
struct state {
  tape* current = nullptr;
  int paused = 0;
};
inline state& thread_state() {
  thread_local state s;
  return s;
}

/// Whether ops are being recorded on this thread right now.
inline bool recording() {
  const auto& s = thread_state();
  return s.current != nullptr && s.paused == 0;
}

/// Pauses recording for its lifetime (backward rules, checkpointed forwards, `stop_gradient` regions).
struct pause_guard {
  pause_guard() { ++thread_state().paused; }
  ~pause_guard() { --thread_state().paused; }
  pause_guard(const pause_guard&) = delete;
  pause_guard& operator=(const pause_guard&) = delete;
};

/// Makes `t` the active tape for its lifetime (and unpauses, for recomputation under a nested tape).
struct tape_scope {
  tape t;
  int saved_pause;
  tape_scope() : t{next_tape_id(), {}, thread_state().current}, saved_pause(thread_state().paused) {
    thread_state().current = &t;
    thread_state().paused = 0;
  }
  ~tape_scope() {
    thread_state().current = t.outer;
    thread_state().paused = saved_pause;
  }
  tape_scope(const tape_scope&) = delete;
  tape_scope& operator=(const tape_scope&) = delete;
};

/// The node of an array of element type T and axes Axes: its gradient (same type and sizes) and the rule.
template <class T, class Axes>
struct node final : node_base {
  named_array<T, Axes> grad;
  bool grad_owned = false;  // grad's buffer was allocated here (safe to add into in place)
  std::function<void(const named_array<T, Axes>&)> backward;  // empty for leaves
  // When set, gradient contributions go straight to it instead of being stored (views into a larger gradient,
  // e.g. a layer of a stacked parameter, so no per-view gradient is held until the end of backward).
  std::function<void(const named_array<T, Axes>&)> sink;

  void run_backward() override {
    if (!backward) return;  // a leaf keeps its gradient for the caller
    auto fn = std::move(backward);
    backward = nullptr;
    if (grad.valid()) {
      auto g = std::move(grad);
      grad = {};
      pause_guard pause;
      fn(g);
    }
  }
};

template <class T, class Axes>
using node_ptr = std::shared_ptr<node<T, Axes>>;

/// Whether `x` carries a node of the active tape (and recording is on). Never true for int/bool arrays.
template <class T, class Axes>
bool tracked(const named_array<T, Axes>& x) {
  if constexpr (!FloatElement<T>) {
    return false;
  } else {
    const auto& s = thread_state();
    if (s.current == nullptr || s.paused != 0) return false;
    const auto& n = x.ad_node();
    return n != nullptr && n->tape_id == s.current->id;
  }
}

/// Whether any of the arrays is tracked.
template <class... X>
bool any_tracked(const X&... x) {
  if (!recording()) return false;
  return (tracked(x) || ...);
}

/// pa[i] += pb[i] for i < n (a named function, so that callers inside generic lambdas can use it on a device).
template <class T>
void add_into_raw(const char* label, T* pa, const T* pb, std::int64_t n) {
  Kokkos::parallel_for(
      label, Kokkos::RangePolicy<execution_space, Kokkos::IndexType<std::int64_t>>(0, n),
      KOKKOS_LAMBDA(std::int64_t i) {
        HALIAX_CAPTURE(pa, pb);
        if constexpr (std::is_same_v<T, bf16>) {
          pa[i] = bf16(static_cast<float>(pa[i]) + static_cast<float>(pb[i]));
        } else {
          pa[i] = pa[i] + pb[i];
        }
      });
}

/// a += b elementwise, same sizes.
template <class T, class Axes>
void add_into(const named_array<T, Axes>& a, const named_array<T, Axes>& b) {
  add_into_raw<T>("haliax::grad_accumulate", a.data(), b.data(), a.element_count());
}

/// po[i] = pa[i] + pb[i] for i < n, as add_into_raw's sum (the same bits as copying a and adding b into it).
template <class T>
void sum_raw(const char* label, T* po, const T* pa, const T* pb, std::int64_t n) {
  Kokkos::parallel_for(
      label, Kokkos::RangePolicy<execution_space, Kokkos::IndexType<std::int64_t>>(0, n),
      KOKKOS_LAMBDA(std::int64_t i) {
        HALIAX_CAPTURE(po, pa, pb);
        if constexpr (std::is_same_v<T, bf16>) {
          po[i] = bf16(static_cast<float>(pa[i]) + static_cast<float>(pb[i]));
        } else {
          po[i] = pa[i] + pb[i];
        }
      });
}

/// Adds a gradient contribution to a node. The first contribution is stored as is (shared, never written);
/// a second one is summed with it into the node's own buffer by one kernel (no deep copy, which would fence a
/// device twice), later ones add into that buffer.
template <class T, class Axes>
void accumulate(node<T, Axes>& n, named_array<T, Axes> g) {
  if (!g.valid()) return;
  g.set_ad_node(nullptr);
  if (n.sink) {
    n.sink(g);
    return;
  }
  if (g.sizes() != n.grad.sizes() && n.grad.valid())
    throw shape_error("haliax autodiff: gradient of shape " + g.shape_string() + " for an array of shape " +
                      n.grad.shape_string());
  if (!n.grad.valid()) {
    n.grad = std::move(g);
    n.grad_owned = false;
    return;
  }
  if (!n.grad_owned) {
    auto fresh = named_array<T, Axes>::allocate(n.grad.sizes(), "haliax::grad");
    sum_raw<T>("haliax::grad_accumulate", fresh.data(), n.grad.data(), g.data(), fresh.element_count());
    n.grad = std::move(fresh);
    n.grad_owned = true;
    return;
  }
  add_into(n.grad, g);
}

template <class X>
using node_ptr_of = node_ptr<typename X::value_type, typename X::axes_type>;

/// Records the op that produced `out` from the float arrays `in...`. `bwd(g, needs)` receives the gradient of
/// `out` and which inputs need a gradient, and returns a tuple with one array per input (each of that input's
/// type; invalid handles where not needed). Call only when `any_tracked(in...)`.
template <class T, class Axes, class Bwd, class... In>
void record(named_array<T, Axes>& out, Bwd bwd, const In&... in) {
  static_assert(FloatElement<T>, "haliax autodiff: only float results can be recorded");
  auto& s = thread_state();
  auto n = std::make_shared<node<T, Axes>>();
  n->tape_id = s.current->id;
  std::tuple<node_ptr_of<In>...> inputs{(tracked(in) ? in.ad_node() : nullptr)...};
  n->backward = [inputs = std::move(inputs), bwd = std::move(bwd)](const named_array<T, Axes>& g) mutable {
    std::array<bool, sizeof...(In)> needs{};
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      ((needs[I] = std::get<I>(inputs) != nullptr), ...);
    }(std::index_sequence_for<In...>{});
    auto grads = bwd(g, needs);
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      ((needs[I] ? accumulate(*std::get<I>(inputs), std::move(std::get<I>(grads))) : void()), ...);
    }(std::index_sequence_for<In...>{});
  };
  out.set_ad_node(n);
  s.current->nodes.push_back(std::move(n));
}

/// Records `out` with a hand-written backward `fn(g)` that accumulates into whatever it captured (checkpointed
/// regions, multi-output ops). Call only while recording.
template <class T, class Axes, class Fn>
void record_custom(named_array<T, Axes>& out, Fn fn) {
  auto& s = thread_state();
  auto n = std::make_shared<node<T, Axes>>();
  n->tape_id = s.current->id;
  n->backward = std::move(fn);
  out.set_ad_node(n);
  s.current->nodes.push_back(std::move(n));
}

/// For ops with several outputs that are parts of one input (unstacking layers, split, unbind): a node placed
/// on the tape *before* the outputs' nodes, so it runs after all of them. Each output's rule adds its gradient
/// into `grad` (input-shaped, zero-filled on first use) through `ensure_grad()`; this node then passes the
/// assembled gradient to the input once.
template <class T, class AxIn>
struct gather_node final : node_base {
  node_ptr<T, AxIn> input;
  typename named_array<T, AxIn>::shape_type sizes{};
  named_array<T, AxIn> grad;

  const named_array<T, AxIn>& ensure_grad() {
    if (!grad.valid()) {
      grad = named_array<T, AxIn>::allocate(sizes, "haliax::grad");
      fill_raw<T>("haliax::grad_zero", grad.data(), grad.element_count(), T(0));
    }
    return grad;
  }
  void run_backward() override {
    if (input && grad.valid()) accumulate(*input, std::move(grad));
    input = nullptr;
    grad = {};
  }
};

/// Creates and records a gather node for tracked input `x` (call only when `tracked(x)`).
template <class T, class AxIn>
std::shared_ptr<gather_node<T, AxIn>> make_gather(const named_array<T, AxIn>& x) {
  auto& s = thread_state();
  auto n = std::make_shared<gather_node<T, AxIn>>();
  n->tape_id = s.current->id;
  n->input = x.ad_node();
  n->sizes = x.sizes();
  s.current->nodes.push_back(n);
  return n;
}

/// Tracks `x` with a node whose gradient contributions are handed to `fn(g)` as they arrive (see `node::sink`).
/// Call only while recording.
template <class T, class Axes, class Fn>
void make_sink(named_array<T, Axes>& x, Fn fn) {
  auto& s = thread_state();
  auto n = std::make_shared<node<T, Axes>>();
  n->tape_id = s.current->id;
  n->sink = std::move(fn);
  x.set_ad_node(n);
  s.current->nodes.push_back(std::move(n));
}

/// Gives `x` a fresh leaf node on the active tape (its gradient is collected after backward).
template <class T, class Axes>
node_ptr<T, Axes> make_leaf(named_array<T, Axes>& x) {
  auto n = std::make_shared<node<T, Axes>>();
  n->tape_id = thread_state().current->id;
  x.set_ad_node(n);
  return n;
}

/// Runs backward over `t` from `out`, seeded with `seed` (same type as `out`).
template <class T, class Axes>
void backward(tape& t, const named_array<T, Axes>& out, const named_array<T, Axes>& seed) {
  auto n = out.ad_node();
  if (!n || n->tape_id != t.id) return;  // the output does not depend on anything tracked
  accumulate(*n, seed);
  for (std::size_t i = t.nodes.size(); i-- > 0;) {
    if (t.nodes[i]) t.nodes[i]->run_backward();
    t.nodes[i].reset();
  }
  t.nodes.clear();
}

/// unbroadcast's index plan: the kept dims (in the input's order) and the reduced dims, with their strides in g.
struct unbroadcast_plan {
  int kr = 0, rr = 0;
  std::int64_t kext[max_rank]{}, kstr[max_rank]{}, rext[max_rank]{}, rstr[max_rank]{};
  std::int64_t out_count = 1, red_count = 1;
};

// unbroadcast's kernels (axis-free functions, for nvcc: see haliax::detail::fill_raw).

/// Rows per chunk of unbroadcast_rows' first stage: a constant of every build (never the thread or SM count), so
/// a column's sum has one order everywhere.
inline constexpr std::int64_t unbroadcast_chunk_rows = 128;

/// A sum kept in double, stored as T (bf16 through float, as its other conversions).
template <class T>
KOKKOS_INLINE_FUNCTION void store_sum(T* out, double v) {
  if constexpr (std::is_same_v<T, bf16>) {
    *out = bf16(static_cast<float>(v));
  } else {
    *out = static_cast<T>(v);
  }
}

/// acc[j] = the sum, in double and in row order, of rows [r0, r1) of column c0 + j of g [., cols], for j < n: one
/// work item of unbroadcast_rows' first stage.
template <class T>
KOKKOS_INLINE_FUNCTION void sum_row_segment(const T* pg, std::int64_t cols, std::int64_t c0, std::int64_t n,
                                            std::int64_t r0, std::int64_t r1, double* acc) {
  for (std::int64_t j = 0; j < n; ++j) acc[j] = 0.0;
  for (std::int64_t t = r0; t < r1; ++t) {
    const T* row = pg + t * cols + c0;
    for (std::int64_t j = 0; j < n; ++j) acc[j] += static_cast<double>(static_cast<compute_t<T>>(row[j]));
  }
}

/// Column sums of g [rows, cols] into po[cols], in two fixed-shape stages: each chunk of
/// `unbroadcast_chunk_rows` rows sums its rows per column in order (in double), then each column sums its
/// chunks' partial sums in order. Every (chunk, column) pair is a separate piece of work, so a GPU runs
/// rows / 128 x cols threads where one thread per column walked all the rows (768 threads over 8192 rows for a
/// GPT-2 bias); on the host a work item takes 512 columns of a chunk (a row segment vectorises). The column
/// blocking changes no sum: host and portable runs give the same bits. With one chunk (rows <= 128) the second
/// stage is skipped, which gives the same bits as running it (0 + p = p).
template <class T>
void unbroadcast_rows(const T* pg, T* po, std::int64_t cols, std::int64_t rows) {
  constexpr std::int64_t block = host_memory ? 512 : 1;
  constexpr std::int64_t chunk = unbroadcast_chunk_rows;
  const std::int64_t nblocks = (cols + block - 1) / block;
  const std::int64_t nchunks = rows > chunk ? (rows + chunk - 1) / chunk : 1;
  if (nchunks == 1) {
    Kokkos::parallel_for(
        "haliax::unbroadcast_rows", Kokkos::RangePolicy<execution_space, Kokkos::IndexType<std::int64_t>>(0, nblocks), KOKKOS_LAMBDA(std::int64_t b) {
          const std::int64_t c0 = b * block;
          const std::int64_t n = cols - c0 < block ? cols - c0 : block;
          double acc[block];
          sum_row_segment(pg, cols, c0, n, 0, rows, acc);
          for (std::int64_t j = 0; j < n; ++j) store_sum<T>(po + c0 + j, acc[j]);
        });
    return;
  }
  // the chunks' partial sums, [nchunks, cols], from the buffer cache (given back without a fence: the second
  // stage runs after the first, in order)
  buffer_lease<double> parts_lease;
  parts_lease.view =
      buffer_cache<double>::take(static_cast<std::size_t>(nchunks * cols), "haliax::unbroadcast_rows(chunks)");
  double* parts = parts_lease.view.data();
  Kokkos::parallel_for(
      "haliax::unbroadcast_rows(chunks)", Kokkos::RangePolicy<execution_space, Kokkos::IndexType<std::int64_t>>(0, nchunks * nblocks),
      KOKKOS_LAMBDA(std::int64_t w) {
        const std::int64_t ch = w / nblocks, b = w - ch * nblocks;
        const std::int64_t c0 = b * block;
        const std::int64_t n = cols - c0 < block ? cols - c0 : block;
        const std::int64_t r0 = ch * chunk, r1 = r0 + chunk < rows ? r0 + chunk : rows;
        double acc[block];  // in registers, then stored once
        sum_row_segment(pg, cols, c0, n, r0, r1, acc);
        double* out = parts + ch * cols + c0;
        for (std::int64_t j = 0; j < n; ++j) out[j] = acc[j];
      });
  Kokkos::parallel_for(
      "haliax::unbroadcast_rows", Kokkos::RangePolicy<execution_space, Kokkos::IndexType<std::int64_t>>(0, nblocks), KOKKOS_LAMBDA(std::int64_t b) {
        const std::int64_t c0 = b * block;
        const std::int64_t n = cols - c0 < block ? cols - c0 : block;
        double acc[block];
        for (std::int64_t j = 0; j < n; ++j) acc[j] = 0.0;
        for (std::int64_t ch = 0; ch < nchunks; ++ch) {
          const double* part = parts + ch * cols + c0;
          for (std::int64_t j = 0; j < n; ++j) acc[j] += part[j];
        }
        for (std::int64_t j = 0; j < n; ++j) store_sum<T>(po + c0 + j, acc[j]);
      });
}

template <class T>
void unbroadcast_general(const unbroadcast_plan& p, const T* pg, T* po) {
    const unbroadcast_plan q = p;
    Kokkos::parallel_for(
        "haliax::unbroadcast", Kokkos::RangePolicy<execution_space, Kokkos::IndexType<std::int64_t>>(0, q.out_count), KOKKOS_LAMBDA(std::int64_t o) {
          HALIAX_CAPTURE(po);
          std::int64_t base = 0, rem = o;
          for (int d = q.kr - 1; d >= 0; --d) {
            base += (rem % q.kext[d]) * q.kstr[d];
            rem /= q.kext[d];
          }
          double acc = 0;
          for (std::int64_t t = 0; t < q.red_count; ++t) {
            std::int64_t off = base, r2 = t;
            for (int d = q.rr - 1; d >= 0; --d) {
              off += (r2 % q.rext[d]) * q.rstr[d];
              r2 /= q.rext[d];
            }
            acc += static_cast<double>(static_cast<compute_t<T>>(pg[off]));
          }
          if constexpr (std::is_same_v<T, bf16>) {
            po[o] = bf16(static_cast<float>(acc));
          } else {
            po[o] = static_cast<T>(acc);
          }
        });
}

/// The gradient of an input whose axes `AxIn` (sizes `in_sizes`) broadcast to the output axes `AxOut`: sums
/// `g` over the axes the input lacks and lays it out in the input's axis order. Sums in double, each output
/// walking its inputs in order (deterministic).
template <class AxIn, class T, class AxOut>
named_array<T, AxIn> unbroadcast(const named_array<T, AxOut>& g, const std::array<std::int64_t, AxIn::rank>& in_sizes) {
  if constexpr (std::is_same_v<AxIn, AxOut>) {
    return g;
  } else {
    static_assert(subset_v<to_list<AxIn>, to_list<AxOut>>, "haliax autodiff: input axes must be a subset of output axes");
    using LO = to_list<AxOut>;
    using LI = to_list<AxIn>;
    auto r = named_array<T, AxIn>::allocate(in_sizes, "haliax::unbroadcast");
    auto gs = row_major_strides(g.sizes());
    unbroadcast_plan p;
    // kept dims: in the input's order, strides into g
    mp::mp_for_each<LI>([&]<class Tag>(Tag) {
      constexpr auto io = index_of_v<LO, Tag>;
      p.kext[p.kr] = g.sizes()[io];
      p.kstr[p.kr] = gs[io];
      ++p.kr;
      p.out_count *= g.sizes()[io];
    });
    mp::mp_for_each<difference<LO, LI>>([&]<class Tag>(Tag) {
      constexpr auto io = index_of_v<LO, Tag>;
      p.rext[p.rr] = g.sizes()[io];
      p.rstr[p.rr] = gs[io];
      ++p.rr;
      p.red_count *= g.sizes()[io];
    });
    const T* pg = g.data();
    T* po = r.data();
    // Common case (bias and norm gradients): the input's axes are the trailing axes of g in the same order, so
    // g is [red_count rows, out_count columns]; sum the rows in order, vectorised along a row.
    bool suffix = true;
    for (int d = 0; d < p.kr; ++d) {
      std::int64_t expect = 1;
      for (int e = d + 1; e < p.kr; ++e) expect *= p.kext[e];
      if (p.kstr[d] != expect) suffix = false;
    }
    if (suffix) {
      unbroadcast_rows<T>(pg, po, p.out_count, p.red_count);
      return r;
    }
    unbroadcast_general<T>(p, pg, po);
    return r;
  }
}

}  // namespace haliax::detail::ad
