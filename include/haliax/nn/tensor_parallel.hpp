// haliax/nn/tensor_parallel.hpp: what a Linear does when some named axes are split over a group of ranks (tensor
// parallelism, upstream's `tensor_parallel_axes` mapped to the `model` mesh axis).
//
//   haliax::nn::tensor_parallel tp{{"heads", "mlp"}, [&](float* x, std::int64_t n) { allreduce(group, x, n); }};
//   haliax::nn::tensor_parallel_scope scope(tp);   // while this step's forward and backward run
//
// Each rank of the group holds its slice of every parameter that has a split axis, with local sizes, and runs the
// same model code. A Linear whose output axes include a split axis (column-parallel: c_attn, c_fc, q/k/v, gate/up)
// takes its input as is and, in backward, sums the input's gradient over the group; one whose input axes include
// a split axis (row-parallel: c_proj, o_proj, down_proj) sums its output over the group before adding the bias,
// and passes the gradient through. Everything between (attention per head, activations) is local. The sums must
// give every rank the same bits, so that the replicated parts of the model stay identical.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "../core.hpp"
#include "../detail/ad.hpp"

namespace haliax::nn {

struct tensor_parallel {
  std::vector<std::string> split_axes;                   ///< axis names split over the group
  /// In-place sum over the group, the same bits everywhere, on host memory (a collective over MPI): haliax hands
  /// it a host copy where arrays are device memory.
  std::function<void(float*, std::int64_t)> allreduce;

  bool splits(std::string_view axis) const {
    return std::find(split_axes.begin(), split_axes.end(), axis) != split_axes.end();
  }
};

namespace detail::tp {
inline const tensor_parallel*& current() {
  thread_local const tensor_parallel* tp = nullptr;
  return tp;
}

template <class T, class Axes>
named_array<T, Axes> copy_of(const named_array<T, Axes>& x) {
  auto y = named_array<T, Axes>::allocate(x.sizes(), "haliax::tensor_parallel");
  const std::pair<std::size_t, std::size_t> all(0, static_cast<std::size_t>(x.element_count()));
  Kokkos::deep_copy(Kokkos::subview(y.view(), all), Kokkos::subview(x.view(), all));  // host or device memory
  return y;
}

/// Forward: x. Backward: the gradient summed over the group (the input of a column-parallel Linear).
template <class T, class Axes>
named_array<T, Axes> enter(const named_array<T, Axes>& x, const tensor_parallel& tp) {
  if (!haliax::detail::ad::any_tracked(x)) return x;
  auto y = copy_of(x);
  haliax::detail::ad::record(
      y,
      [&tp](const named_array<T, Axes>& g, auto) {
        auto s = copy_of(g);
        const std::int64_t n = s.element_count();
        with_host_elements(s, 0, n, host_access::read_write, [&](T* p) { tp.allreduce(p, n); });
        return std::tuple{s};
      },
      x);
  return y;
}

/// Forward: y summed over the group. Backward: the gradient as is (the output of a row-parallel Linear).
template <class T, class Axes>
named_array<T, Axes> leave(const named_array<T, Axes>& y, const tensor_parallel& tp) {
  auto s = copy_of(y);
  const std::int64_t n = s.element_count();
  with_host_elements(s, 0, n, host_access::read_write, [&](T* p) { tp.allreduce(p, n); });
  if (haliax::detail::ad::any_tracked(y))
    haliax::detail::ad::record(
        s, [](const named_array<T, Axes>& g, auto) { return std::tuple{g}; }, y);
  return s;
}
}  // namespace detail::tp

/// The split in force on this thread (null: none).
inline const tensor_parallel* current_tensor_parallel() { return detail::tp::current(); }

/// Puts `tp` in force on this thread until the scope ends (the previous one is restored).
class tensor_parallel_scope {
 public:
  explicit tensor_parallel_scope(const tensor_parallel& tp) : prev_(detail::tp::current()) {
    detail::tp::current() = &tp;
  }
  ~tensor_parallel_scope() { detail::tp::current() = prev_; }
  tensor_parallel_scope(const tensor_parallel_scope&) = delete;
  tensor_parallel_scope& operator=(const tensor_parallel_scope&) = delete;

 private:
  const tensor_parallel* prev_;
};

}  // namespace haliax::nn
