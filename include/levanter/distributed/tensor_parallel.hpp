// levanter/distributed/tensor_parallel.hpp: a model's parameters split over a model group (tensor parallelism).
// A leaf with a split axis (one of trainer.tensor_parallel_axes) keeps the contiguous 1/T of that axis that
// belongs to its rank's index t in the group; the other leaves are whole on every rank. Model code runs
// unchanged on the local sizes; haliax::nn::Linear adds the two group sums (haliax/nn/tensor_parallel.hpp).
//
//   const auto dims = distributed::split_dims(model, {"heads", "mlp"});     // per leaf: the split axis, or -1
//   M local = distributed::slice_model(model, dims, t, T);                   // this rank's slices
//   M whole = distributed::assemble_model(local, dims, model_group);         // collective: every slice, joined
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <haliax/tree.hpp>
#include <levanter/distributed/comm.hpp>

namespace levanter::distributed {

/// A leaf cannot be split as asked (two split axes in one array, or a size that does not divide).
struct split_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// For every leaf of `m` in tree order, the position of its axis named in `split` (-1 when it has none).
template <class M>
std::vector<int> split_dims(const M& m, const std::vector<std::string>& split) {
  std::vector<int> dims;
  haliax::tree::for_each_leaf(m, [&](const std::string& path, const auto& a) {
    int d = -1;
    const auto names = a.axis_names();
    for (std::size_t k = 0; k < names.size(); ++k)
      if (std::find(split.begin(), split.end(), std::string(names[k])) != split.end()) {
        if (d >= 0)
          throw split_error("tensor parallelism: '" + path + "' has two split axes (" + std::string(names[d]) +
                            " and " + std::string(names[k]) + "); split only one of them");
        d = static_cast<int>(k);
      }
    dims.push_back(d);
  });
  return dims;
}

namespace detail::tp {
// outer x n x inner: the element layout around axis `d` of `sizes`.
template <class S>
void around(const S& sizes, int d, std::int64_t& outer, std::int64_t& n, std::int64_t& inner) {
  outer = 1, inner = 1, n = sizes[static_cast<std::size_t>(d)];
  for (int k = 0; k < d; ++k) outer *= sizes[static_cast<std::size_t>(k)];
  for (std::size_t k = static_cast<std::size_t>(d) + 1; k < sizes.size(); ++k) inner *= sizes[k];
}
}  // namespace detail::tp

/// This rank's part of `full` (whole on every rank): slice t of T along each leaf's split axis; leaves without
/// one are shared with `full`. Throws split_error naming the leaf when a split axis does not divide by T.
template <class M>
M slice_model(const M& full, const std::vector<int>& dims, int t, int T) {
  M out = full;
  std::size_t k = 0;
  haliax::tree::for_each_leaf(out, [&](const std::string& path, auto& a) {
    const int d = dims.at(k++);
    if (d < 0 || T == 1) return;
    using A = std::remove_cvref_t<decltype(a)>;
    std::int64_t outer, n, inner;
    detail::tp::around(a.sizes(), d, outer, n, inner);
    if (n % T != 0)
      throw split_error("tensor parallelism: axis '" + std::string(a.axis_names()[static_cast<std::size_t>(d)]) +
                        "' of '" + path + "' has size " + std::to_string(n) + ", which does not divide over " +
                        std::to_string(T) + " ranks (trainer.model_axis_size)");
    auto sizes = a.sizes();
    const std::int64_t nl = n / T;
    sizes[static_cast<std::size_t>(d)] = nl;
    A local = A::allocate(sizes, "levanter::tensor_parallel::slice");
    haliax::with_host_elements(a, 0, a.element_count(), haliax::host_access::read, [&](const float* src) {
      haliax::with_host_elements(local, 0, local.element_count(), haliax::host_access::write, [&](float* dst) {
        for (std::int64_t o = 0; o < outer; ++o)
          std::copy(src + (o * n + t * nl) * inner, src + (o * n + (t + 1) * nl) * inner, dst + o * nl * inner);
      });
    });
    a = local;
  });
  return out;
}

/// The whole model from every rank's part (collective over `group`, the T ranks of one model group, in the order
/// of their slices); leaves without a split axis are taken from this rank.
template <class M>
M assemble_model(const M& local, const std::vector<int>& dims, communicator& group) {
  M out = local;
  const int T = group.size();
  if (T == 1) return out;
  std::size_t k = 0;
  haliax::tree::for_each_leaf(out, [&](const std::string&, auto& a) {
    const int d = dims.at(k++);
    if (d < 0) return;
    using A = std::remove_cvref_t<decltype(a)>;
    std::int64_t outer, nl, inner;
    detail::tp::around(a.sizes(), d, outer, nl, inner);
    const std::int64_t count = a.element_count();
    std::vector<float> all(static_cast<std::size_t>(count * T));
    std::vector<std::size_t> counts(static_cast<std::size_t>(T), static_cast<std::size_t>(count) * 4), displs(counts.size());
    for (int q = 0; q < T; ++q) displs[static_cast<std::size_t>(q)] = static_cast<std::size_t>(q) * static_cast<std::size_t>(count) * 4;
    haliax::with_host_elements(a, 0, count, haliax::host_access::read,
                               [&](const float* mine) { group.allgatherv(mine, all.data(), counts, displs); });
    auto sizes = a.sizes();
    const std::int64_t n = nl * T;
    sizes[static_cast<std::size_t>(d)] = n;
    A whole = A::allocate(sizes, "levanter::tensor_parallel::assemble");
    haliax::with_host_elements(whole, 0, whole.element_count(), haliax::host_access::write, [&](float* dst) {
      for (int q = 0; q < T; ++q)
        for (std::int64_t o = 0; o < outer; ++o) {
          const float* src = all.data() + q * count + o * nl * inner;
          std::copy(src, src + nl * inner, dst + (o * n + q * nl) * inner);
        }
    });
    a = whole;
  });
  return out;
}

/// Zeros shaped like this rank's part of `full` (only `full`'s sizes are read).
template <class M>
M local_zeros(const M& full, const std::vector<int>& dims, int T) {
  M out = full;
  std::size_t k = 0;
  haliax::tree::for_each_leaf(out, [&](const std::string&, auto& a) {
    const int d = dims.at(k++);
    using A = std::remove_cvref_t<decltype(a)>;
    auto sizes = a.sizes();
    if (d >= 0) sizes[static_cast<std::size_t>(d)] /= T;
    A z = A::allocate(sizes, "levanter::tensor_parallel::zeros");
    if (z.element_count() > 0) Kokkos::deep_copy(z.view(), 0.0f);
    a = z;
  });
  return out;
}

}  // namespace levanter::distributed
