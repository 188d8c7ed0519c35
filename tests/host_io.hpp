// Test helpers that write host values into arrays wherever the arrays live (host memory, or device memory in a
// CUDA build). Tests must not write through `data()`: on a GPU that pointer is device memory.
#pragma once

#include <Kokkos_Core.hpp>
#include <cstddef>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace host_io {

/// Overwrites the elements of `a` (row-major in axis order) with `values`; the counts must match.
template <class A, class T>
void write_elements(const A& a, std::span<const T> values) {
  using E = typename A::value_type;
  static_assert(std::is_same_v<E, T>, "host_io::write_elements: element types differ");
  if (static_cast<std::int64_t>(values.size()) != a.element_count())
    throw std::invalid_argument("host_io::write_elements: " + std::to_string(values.size()) + " values for " +
                                std::to_string(a.element_count()) + " elements");
  if (values.empty()) return;
  Kokkos::View<const E*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> host(values.data(),
                                                                                          values.size());
  Kokkos::deep_copy(Kokkos::subview(a.view(), std::pair<std::size_t, std::size_t>(0, values.size())), host);
}

template <class A, class T>
void write_elements(const A& a, const std::vector<T>& values) {
  write_elements(a, std::span<const T>(values.data(), values.size()));
}

}  // namespace host_io
