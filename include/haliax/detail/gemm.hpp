// Row-major GEMM on contiguous buffers: C[m,n] = op(A) op(B), through Kokkos Kernels BLAS (OpenBLAS on the
// host, cuBLAS with a CUDA Kokkos). Private.
#pragma once

#include <KokkosBlas3_gemm.hpp>
#include <Kokkos_Core.hpp>
#include <cstdint>
#include <type_traits>

#include "../bf16.hpp"

namespace haliax::detail {

template <class T>
using unmanaged_matrix = Kokkos::View<T**, Kokkos::LayoutRight, Kokkos::DefaultExecutionSpace::memory_space,
                                      Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

/// C = op(A) * op(B) with beta = 0. A is m x k (k x m when trans_a), B is k x n (n x k when trans_b), all
/// row-major and densely packed.
template <class T>
void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, const T* A, const T* B, T* C) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    Kokkos::parallel_for(
        "haliax::dot(zero)", Kokkos::RangePolicy<Kokkos::DefaultExecutionSpace>(0, m * n),
        KOKKOS_LAMBDA(std::int64_t i) { C[i] = T(0); });
    return;
  }
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    unmanaged_matrix<const T> a(A, trans_a ? k : m, trans_a ? m : k);
    unmanaged_matrix<const T> b(B, trans_b ? n : k, trans_b ? k : n);
    unmanaged_matrix<T> c(C, m, n);
    KokkosBlas::gemm(trans_a ? "T" : "N", trans_b ? "T" : "N", T(1), a, b, T(0), c);
  } else if constexpr (std::is_same_v<T, bf16>) {
    // No bf16 GEMM in Kokkos Kernels: widen to float (exact), multiply, round to nearest even once.
    Kokkos::View<float*, Kokkos::DefaultExecutionSpace::memory_space> fa("haliax::dot(bf16 a)", m * k),
        fb("haliax::dot(bf16 b)", k * n), fc("haliax::dot(bf16 c)", m * n);
    float* pa = fa.data();
    float* pb = fb.data();
    float* pc = fc.data();
    Kokkos::parallel_for(
        "haliax::dot(widen a)", Kokkos::RangePolicy<Kokkos::DefaultExecutionSpace>(0, m * k),
        KOKKOS_LAMBDA(std::int64_t i) { pa[i] = float(A[i]); });
    Kokkos::parallel_for(
        "haliax::dot(widen b)", Kokkos::RangePolicy<Kokkos::DefaultExecutionSpace>(0, k * n),
        KOKKOS_LAMBDA(std::int64_t i) { pb[i] = float(B[i]); });
    gemm<float>(trans_a, trans_b, m, n, k, pa, pb, pc);
    Kokkos::parallel_for(
        "haliax::dot(round c)", Kokkos::RangePolicy<Kokkos::DefaultExecutionSpace>(0, m * n),
        KOKKOS_LAMBDA(std::int64_t i) { C[i] = bf16(pc[i]); });
  } else {
    // Integers: a plain triple loop (exact; no BLAS has an int32 GEMM).
    Kokkos::parallel_for(
        "haliax::dot(int)", Kokkos::RangePolicy<Kokkos::DefaultExecutionSpace>(0, m * n),
        KOKKOS_LAMBDA(std::int64_t idx) {
          std::int64_t i = idx / n, j = idx - (idx / n) * n;
          T acc = T(0);
          for (std::int64_t l = 0; l < k; ++l) {
            T av = trans_a ? A[l * m + i] : A[i * k + l];
            T bv = trans_b ? B[j * k + l] : B[l * n + j];
            acc += av * bv;
          }
          C[idx] = acc;
        });
  }
}

}  // namespace haliax::detail
