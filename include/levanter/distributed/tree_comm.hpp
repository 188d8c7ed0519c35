// levanter/distributed/tree_comm.hpp: collectives over parameter trees (any reflected struct of float arrays),
// through one flat buffer holding the leaves in tree order.
//
//   std::vector<float> buf;
//   levanter::distributed::reduce_tree(world, grads, buf);             // every rank: the tree-order sum
//   levanter::distributed::reduce_tree(world, grads, buf, &bounds);    // rank r: the sum in its range only
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <haliax/tree.hpp>
#include <levanter/distributed/comm.hpp>

namespace levanter::distributed {

/// Elements of all float leaves of `tree`.
template <class M>
std::int64_t flat_size(const M& tree) {
  std::int64_t n = 0;
  haliax::tree::for_each_leaf(tree, [&](const std::string&, const auto& leaf) { n += leaf.element_count(); });
  return n;
}

/// Copies the flat range [lo, hi) of `tree` into flat[lo, hi) (to_flat) or back (from_flat).
template <class M>
void copy_flat_range(M& tree, float* flat, std::int64_t lo, std::int64_t hi, bool to_flat) {
  std::int64_t off = 0;
  haliax::tree::for_each_leaf(tree, [&](const std::string&, auto& leaf) {
    const std::int64_t n = leaf.element_count(), b = std::max(lo, off), e = std::min(hi, off + n);
    if (b < e) {
      // Through a host copy where the leaf is in device memory.
      haliax::with_host_elements(leaf, b - off, e - b, to_flat ? haliax::host_access::read : haliax::host_access::write,
                                 [&](float* x) {
                                   if (to_flat)
                                     std::copy(x, x + (e - b), flat + b);
                                   else
                                     std::copy(flat + b, flat + e, x);
                                 });
    }
    off += n;
  });
}

/// Sums `tree` over the ranks in tree_order. Without `bounds`, every rank ends with the whole sum; with them
/// (one range per rank, as an optimizer's shard_bounds), rank r's range [bounds[r], bounds[r+1]) holds the sum and
/// the rest of its tree is left as it was (half the traffic). `buf` is scratch kept between calls.
template <class M>
void reduce_tree(communicator& c, M& tree, std::vector<float>& buf, const std::vector<std::int64_t>* bounds = nullptr) {
  if (c.size() == 1) return;
  const std::int64_t n = flat_size(tree);
  buf.resize(static_cast<std::size_t>(n));
  copy_flat_range(tree, buf.data(), 0, n, true);
  if (bounds) {
    if (bounds->size() != static_cast<std::size_t>(c.size()) + 1 || bounds->back() != n)
      throw comm_error("reduce_tree: the shard bounds do not match the tree (" + std::to_string(n) + " elements)");
    reduce_scatter_sum(c, buf.data(), *bounds);
    const std::int64_t lo = (*bounds)[static_cast<std::size_t>(c.rank())];
    const std::int64_t hi = (*bounds)[static_cast<std::size_t>(c.rank()) + 1];
    copy_flat_range(tree, buf.data(), lo, hi, false);
  } else {
    allreduce_sum(c, buf.data(), n);
    copy_flat_range(tree, buf.data(), 0, n, false);
  }
}

/// Whether every rank holds the same bits in `tree` (a debugging and test aid: compares a checksum).
template <class M>
bool same_on_all_ranks(communicator& c, const M& tree) {
  std::uint64_t h = 1469598103934665603ull;
  haliax::tree::for_each_leaf(tree, [&](const std::string&, const auto& leaf) {
    haliax::with_host_elements(leaf, 0, leaf.element_count(), haliax::host_access::read, [&](const float* x) {
      const auto* p = reinterpret_cast<const unsigned char*>(x);
      for (std::int64_t i = 0; i < leaf.element_count() * 4; ++i) h = (h ^ p[i]) * 1099511628211ull;
    });
  });
  const auto all = allgather_doubles(c, {static_cast<double>(h >> 11)});
  return std::all_of(all.begin(), all.end(), [&](double x) { return x == all[0]; });
}

}  // namespace levanter::distributed
