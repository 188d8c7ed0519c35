// Host copies of arrays addressed by axis *name*, for references that share no index arithmetic with the
// kernels under test: every element is located by a map name -> index.
#pragma once

#include <doctest/doctest.h>

#include <cstdint>
#include <functional>
#include <haliax/haliax.hpp>
#include <map>
#include <string>
#include <vector>

namespace test_axes {

using index_map = std::map<std::string, std::int64_t>;

/// A host copy of an array, addressed by axis name.
struct host_tensor {
  std::vector<std::string> names;
  std::vector<std::int64_t> sizes;
  std::vector<double> data;

  std::int64_t size(const std::string& n) const {
    for (std::size_t i = 0; i < names.size(); ++i)
      if (names[i] == n) return sizes[i];
    FAIL("no axis " << n);
    return 0;
  }
  std::int64_t offset(const index_map& idx) const {
    std::int64_t off = 0;
    for (std::size_t i = 0; i < names.size(); ++i) off = off * sizes[i] + idx.at(names[i]);
    return off;
  }
  double at(const index_map& idx) const { return data[offset(idx)]; }
};

template <class T, class Axes>
host_tensor host(const haliax::named_array<T, Axes>& x) {
  host_tensor h;
  for (auto n : x.axis_names()) h.names.emplace_back(n);
  h.sizes.assign(x.sizes().begin(), x.sizes().end());
  auto v = x.to_host();
  for (std::size_t i = 0; i < v.size(); ++i) h.data.push_back(static_cast<double>(v[i]));
  return h;
}

/// Calls f(name -> index) for every index of the given named sizes, row-major.
inline void for_each_index(const std::vector<std::string>& names, const std::vector<std::int64_t>& sizes,
                           const std::function<void(const index_map&)>& f) {
  std::int64_t n = 1;
  for (auto s : sizes) n *= s;
  for (std::int64_t flat = 0; flat < n; ++flat) {
    index_map idx;
    std::int64_t r = flat;
    for (std::size_t d = names.size(); d-- > 0;) {
      idx[names[d]] = r % sizes[d];
      r /= sizes[d];
    }
    f(idx);
  }
}

/// Checks `got` element by element against want(index by name), over got's own axes.
template <class T, class Axes>
void check_against(const haliax::named_array<T, Axes>& got, const std::function<double(const index_map&)>& want) {
  auto g = host(got);
  std::int64_t i = 0;
  for_each_index(g.names, g.sizes, [&](const index_map& idx) {
    CHECK(g.data[i] == want(idx));
    ++i;
  });
}

}  // namespace test_axes
