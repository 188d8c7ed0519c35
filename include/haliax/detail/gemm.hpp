// Row-major GEMM on contiguous buffers: C[m,n] = op(A) op(B). The dispatch point of the gemm kernel family
// (haliax/kernels.hpp): OpenBLAS tiles on the host, with float products under matmul_precision::bf16 in oneDNN's
// bfloat16 matmul (gemm_bf16.hpp); cuBLAS with a CUDA Kokkos, through the compiled adapter (src/cuda/,
// vendor_cuda.hpp); Kokkos Kernels BLAS on other devices. The portable kernels: Kokkos Kernels' GEMM per problem
// on the host, one work item per element of C (k summed in order) on a CUDA device. Private.
//
// HALIAX_HAVE_HOST_BLAS (set by the build when Kokkos Kernels and its host BLAS are there): a CUDA build made
// without them (the device kit's, docs/portability.md) has cuBLAS for every array product and no cblas.h.
#pragma once

#if defined(HALIAX_HAVE_HOST_BLAS)
#include <cblas.h>

#include <KokkosBlas3_gemm.hpp>
#endif
#include <Kokkos_Core.hpp>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <type_traits>
#include <vector>

#include "../bf16.hpp"
#include "../precision.hpp"
#include "device_guard.hpp"
#include "gemm_bf16.hpp"
#include "portable.hpp"
#include "thread_pool.hpp"

#include "../kernels.hpp"
#include "vendor_cuda.hpp"

namespace haliax::detail {

template <class T>
using unmanaged_matrix = Kokkos::View<T**, Kokkos::LayoutRight, Kokkos::DefaultExecutionSpace::memory_space,
                                      Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

/// How C is cut into tiles, each computed by one single-threaded BLAS call on the host. The tiling is a
/// function of the problem shape only, never of the thread count, so every element's arithmetic is the same
/// however many threads run the tiles (OpenBLAS's own threading splits columns by the thread count, and its
/// AVX2 kernels then round some elements differently). Tiles are 256 rows by all columns, with columns
/// halved (to multiples of 64) while a problem has fewer than 6 tiles, so small-M products still spread.
struct gemm_tiling {
  std::int64_t row_block, col_block, row_blocks, col_blocks;
};

inline gemm_tiling make_gemm_tiling(std::int64_t batch, std::int64_t m, std::int64_t n) {
  gemm_tiling t{256, n, 0, 0};
  auto count = [&] {
    t.row_blocks = (m + t.row_block - 1) / t.row_block;
    t.col_blocks = (n + t.col_block - 1) / t.col_block;
    return batch * t.row_blocks * t.col_blocks;
  };
  while (count() < 6 && t.col_block > 256) t.col_block = ((t.col_block / 2 + 63) / 64) * 64;
  count();
  return t;
}

/// Rows per BLAS call under independent_rows_scope (haliax/precision.hpp). Four rows cost a decode step about what
/// one does (the weights' reading dominates), and a batch of them reuses each block of weights from cache.
inline constexpr std::int64_t independent_row_tile = 4;

#if defined(HALIAX_HAVE_HOST_BLAS)
template <class T>
void blas_gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, const T* a, std::int64_t lda,
               const T* b, std::int64_t ldb, T* c, std::int64_t ldc) {
  const auto ta = trans_a ? CblasTrans : CblasNoTrans;
  const auto tb = trans_b ? CblasTrans : CblasNoTrans;
  if constexpr (std::is_same_v<T, float>)
    cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
  else
    cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, 1.0, a, lda, b, ldb, 0.0, c, ldc);
}

/// host_gemm_batched under independent_rows_scope: every call has independent_row_tile rows of A (row-major, a
/// zero-padded copy for the last tile of a problem and wherever A is transposed) and a block of columns whose width
/// depends on n and k only: at most 512 KiB of B (a multiple of 64 columns, at least 64), so that the row tiles after
/// the first read it from cache. One task per (problem, column block) runs its row tiles in order.
template <class T>
void host_gemm_batched_row_tiles(bool trans_a, bool trans_b, std::int64_t batch, std::int64_t m, std::int64_t n,
                                 std::int64_t k, const T* A, const T* B, T* C) {
  constexpr std::int64_t R = independent_row_tile;
  const std::int64_t fit = (std::int64_t{1} << 19) / (static_cast<std::int64_t>(sizeof(T)) * k) / 64 * 64;
  gemm_tiling tl{R, n < fit ? n : (fit < 64 ? 64 : fit), 0, 0};
  tl.col_blocks = (n + tl.col_block - 1) / tl.col_block;
  const std::int64_t ldb = trans_b ? k : n;
  auto task = [=](std::int64_t t) {
    const std::int64_t b = t / tl.col_blocks, c0 = (t % tl.col_blocks) * tl.col_block;
    const std::int64_t cols = n - c0 < tl.col_block ? n - c0 : tl.col_block;
    const T* a_all = A + b * m * k;
    const T* bb = B + b * k * n + (trans_b ? c0 * k : c0);
    T* c_all = C + b * m * n + c0;
    std::vector<T> a_pad, c_pad;
    for (std::int64_t r0 = 0; r0 < m; r0 += R) {
      const std::int64_t rows = m - r0 < R ? m - r0 : R;
      if (rows == R && !trans_a) {
        blas_gemm<T>(false, trans_b, R, cols, k, a_all + r0 * k, k, bb, ldb, c_all + r0 * n, n);
        continue;
      }
      a_pad.assign(static_cast<std::size_t>(R * k), T(0));
      for (std::int64_t i = 0; i < rows; ++i)
        for (std::int64_t j = 0; j < k; ++j)
          a_pad[static_cast<std::size_t>(i * k + j)] = trans_a ? a_all[j * m + r0 + i] : a_all[(r0 + i) * k + j];
      c_pad.resize(static_cast<std::size_t>(R * cols));
      blas_gemm<T>(false, trans_b, R, cols, k, a_pad.data(), k, bb, ldb, c_pad.data(), cols);
      for (std::int64_t i = 0; i < rows; ++i)
        std::copy_n(c_pad.data() + i * cols, cols, c_all + (r0 + i) * n);
    }
  };
  const std::int64_t tasks = batch * tl.col_blocks;
  if (static_cast<double>(batch) * m * n * k < 4.0e6) {
    for (std::int64_t t = 0; t < tasks; ++t) task(t);
  } else {
    thread_pool::instance().run(tasks, task);
  }
}

/// Host GEMM for float/double over `batch` independent problems, parallel over tiles on the haliax thread
/// pool, each a single-threaded cblas call.
template <class T>
void host_gemm_batched(bool trans_a, bool trans_b, std::int64_t batch, std::int64_t m, std::int64_t n, std::int64_t k,
                       const T* A, const T* B, T* C) {
  if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);
  if (independent_rows()) {
    host_gemm_batched_row_tiles(trans_a, trans_b, batch, m, n, k, A, B, C);
    return;
  }
  const gemm_tiling tl = make_gemm_tiling(batch, m, n);
  const auto ta = trans_a ? CblasTrans : CblasNoTrans;
  const auto tb = trans_b ? CblasTrans : CblasNoTrans;
  const std::int64_t lda = trans_a ? m : k, ldb = trans_b ? k : n;
  auto task = [=](std::int64_t t) {
    const std::int64_t per_batch = tl.row_blocks * tl.col_blocks;
    const std::int64_t b = t / per_batch, r = t % per_batch;
    const std::int64_t r0 = (r / tl.col_blocks) * tl.row_block, c0 = (r % tl.col_blocks) * tl.col_block;
    const std::int64_t rows = m - r0 < tl.row_block ? m - r0 : tl.row_block;
    const std::int64_t cols = n - c0 < tl.col_block ? n - c0 : tl.col_block;
    const T* a = A + b * m * k + (trans_a ? r0 : r0 * k);
    const T* bb = B + b * k * n + (trans_b ? c0 * k : c0);
    T* c = C + b * m * n + r0 * n + c0;
    if constexpr (std::is_same_v<T, float>) {
      cblas_sgemm(CblasRowMajor, ta, tb, rows, cols, k, 1.0f, a, lda, bb, ldb, 0.0f, c, n);
    } else {
      cblas_dgemm(CblasRowMajor, ta, tb, rows, cols, k, 1.0, a, lda, bb, ldb, 0.0, c, n);
    }
  };
  const std::int64_t tasks = batch * tl.row_blocks * tl.col_blocks;
  // Small problems are not worth waking the pool; the tiles (and so the results) are the same either way.
  if (static_cast<double>(batch) * m * n * k < 4.0e6) {
    for (std::int64_t t = 0; t < tasks; ++t) task(t);
  } else {
    thread_pool::instance().run(tasks, task);
  }
}

#if defined(HALIAX_HAVE_ONEDNN)
/// C = op(A) op(B) for `batch` problems with bfloat16 operands (raw bits) and f32 results, laid out as
/// host_gemm_batched's and cut into the same tiles, each one single-threaded oneDNN matmul. Returns false (having
/// written nothing) if oneDNN cannot run one of the tiles' shapes.
inline bool host_gemm_batched_bf16(bool trans_a, bool trans_b, std::int64_t batch, std::int64_t m, std::int64_t n,
                                   std::int64_t k, const std::uint16_t* A, const std::uint16_t* B, float* C) {
  auto& ctx = onednn::context::get();
  if (!ctx.available) return false;
  const gemm_tiling tl = make_gemm_tiling(batch, m, n);
  const std::int64_t lda = trans_a ? m : k, ldb = trans_b ? k : n;
  // The (at most four) tile shapes, made up front so that a refusal leaves C untouched.
  const std::int64_t last_rows = m - (tl.row_blocks - 1) * tl.row_block;
  const std::int64_t last_cols = n - (tl.col_blocks - 1) * tl.col_block;
  std::shared_ptr<const onednn::context::tile_kernel> prims[2][2];
  {
    onednn::context::single_thread one;
    for (int r = 0; r < 2; ++r)
      for (int c = 0; c < 2; ++c) {
        const std::int64_t rows = r ? last_rows : (m < tl.row_block ? m : tl.row_block);
        const std::int64_t cols = c ? last_cols : (n < tl.col_block ? n : tl.col_block);
        prims[r][c] = ctx.primitive({trans_a, trans_b, rows, cols, k, lda, ldb, n});
        if (!prims[r][c]) return false;
      }
  }
  auto task = [&](std::int64_t t) {
    const std::int64_t per_batch = tl.row_blocks * tl.col_blocks;
    const std::int64_t b = t / per_batch, r = t % per_batch;
    const std::int64_t ri = r / tl.col_blocks, ci = r % tl.col_blocks;
    const std::int64_t r0 = ri * tl.row_block, c0 = ci * tl.col_block;
    const std::int64_t rows = m - r0 < tl.row_block ? m - r0 : tl.row_block;
    const std::int64_t cols = n - c0 < tl.col_block ? n - c0 : tl.col_block;
    const std::uint16_t* a = A + b * m * k + (trans_a ? r0 : r0 * k);
    const std::uint16_t* bb = B + b * k * n + (trans_b ? c0 * k : c0);
    float* c = C + b * m * n + r0 * n + c0;
    const auto& kernel = *prims[ri == tl.row_blocks - 1][ci == tl.col_blocks - 1];
    dnnl_memory_desc_t a_md, b_md, c_md;
    const dnnl_dims_t a_dims{rows, k}, b_dims{k, cols}, c_dims{rows, cols};
    const dnnl_dims_t a_str{trans_a ? 1 : lda, trans_a ? lda : 1}, b_str{trans_b ? 1 : ldb, trans_b ? ldb : 1};
    const dnnl_dims_t c_str{n, 1};
    dnnl_memory_desc_init_by_strides(&a_md, 2, a_dims, dnnl_bf16, a_str);
    dnnl_memory_desc_init_by_strides(&b_md, 2, b_dims, dnnl_bf16, b_str);
    dnnl_memory_desc_init_by_strides(&c_md, 2, c_dims, dnnl_f32, c_str);
    dnnl_memory_t ma = nullptr, mb = nullptr, mc = nullptr, ms = nullptr;
    dnnl_memory_create(&ma, &a_md, ctx.engine, const_cast<std::uint16_t*>(a));
    dnnl_memory_create(&mb, &b_md, ctx.engine, const_cast<std::uint16_t*>(bb));
    dnnl_memory_create(&mc, &c_md, ctx.engine, c);
    dnnl_memory_create(&ms, &kernel.scratchpad_md, ctx.engine, onednn::thread_scratchpad(kernel.scratchpad_bytes));
    const dnnl_exec_arg_t args[4] = {
        {DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}, {DNNL_ARG_SCRATCHPAD, ms}};
    dnnl_stream_t s = onednn::thread_stream();
    onednn::context::single_thread one;
    const bool ok = ma && mb && mc && ms && s &&
                    dnnl_primitive_execute(kernel.primitive.get(), s, 4, args) == dnnl_success &&
                    dnnl_stream_wait(s) == dnnl_success;
    dnnl_memory_destroy(ma);
    dnnl_memory_destroy(mb);
    dnnl_memory_destroy(mc);
    dnnl_memory_destroy(ms);
    if (!ok) {
      // Only reachable when oneDNN runs out of memory for its scratchpad: nothing sensible to compute instead.
      std::fprintf(stderr, "haliax: a bfloat16 oneDNN matmul failed (%lld x %lld x %lld); aborting\n",
                   static_cast<long long>(rows), static_cast<long long>(cols), static_cast<long long>(k));
      std::abort();
    }
  };
  const std::int64_t tasks = batch * tl.row_blocks * tl.col_blocks;
  if (static_cast<double>(batch) * m * n * k < 4.0e6) {
    for (std::int64_t t = 0; t < tasks; ++t) task(t);
  } else {
    thread_pool::instance().run(tasks, task);
  }
  return true;
}

/// The calling thread's scratch for bfloat16 copies of GEMM operands (grown as needed, kept for reuse).
inline std::uint16_t* bf16_scratch(int slot, std::int64_t n) {
  static thread_local std::vector<std::uint16_t> buf[2];
  if (static_cast<std::int64_t>(buf[slot].size()) < n) {
    buf[slot].clear();
    buf[slot].shrink_to_fit();
    buf[slot].resize(static_cast<std::size_t>(n));
  }
  return buf[slot].data();
}

/// host_gemm_batched for float operands under matmul_precision::bf16: both operands rounded to bfloat16 (nearest
/// even), products summed in f32. False if no bfloat16 GEMM can run here (the caller then computes in f32).
inline bool host_gemm_batched_as_bf16(bool trans_a, bool trans_b, std::int64_t batch, std::int64_t m,
                                      std::int64_t n, std::int64_t k, const float* A, const float* B, float* C) {
  if (!onednn::context::get().available) return false;
  std::uint16_t* a = bf16_scratch(0, batch * m * k);
  std::uint16_t* b = bf16_scratch(1, batch * k * n);
  round_to_bf16(A, a, batch * m * k);
  round_to_bf16(B, b, batch * k * n);
  return host_gemm_batched_bf16(trans_a, trans_b, batch, m, n, k, a, b, C);
}
#endif

/// One Kokkos Kernels GEMM per problem, in the arrays' memory space.
template <class T>
void kokkos_gemm_batched(bool trans_a, bool trans_b, std::int64_t batch, std::int64_t m, std::int64_t n,
                         std::int64_t k, const T* A, const T* B, T* C) {
  const device_guard::device_work work;  // BLAS on the arrays' memory: device work, invisible to Kokkos Tools
  for (std::int64_t i = 0; i < batch; ++i) {
    unmanaged_matrix<const T> a(A + i * m * k, trans_a ? k : m, trans_a ? m : k);
    unmanaged_matrix<const T> b(B + i * k * n, trans_b ? n : k, trans_b ? k : n);
    unmanaged_matrix<T> c(C + i * m * n, m, n);
    KokkosBlas::gemm(trans_a ? "T" : "N", trans_b ? "T" : "N", T(1), a, b, T(0), c);
  }
}
#endif  // HALIAX_HAVE_HOST_BLAS

/// Time spent in GEMM, for benchmarks that report how much of a step is matrix multiplication. Off unless
/// `enabled` is set (then each call pays two clock reads).
struct gemm_profile {
  static inline std::atomic<bool> enabled{false};
  static inline std::atomic<std::int64_t> nanoseconds{0};
  static inline std::atomic<std::int64_t> flops{0};
  static inline std::atomic<std::int64_t> calls{0};
  /// Every GEMM `gemm_batched` ran (each one BLAS call, or one per problem), enabled or not: the device kit
  /// counts vendor launches per step with it.
  static inline std::atomic<std::int64_t> launches{0};
  static void reset() {
    nanoseconds = 0;
    flops = 0;
    calls = 0;
  }
};

/// The portable GEMM with no library: one work item per element of C, k summed in order (exact for integers;
/// for floats the order is fixed by the shape). The portable kernel of a CUDA build, and the integer product.
template <class T>
void plain_gemm_batched(bool trans_a, bool trans_b, std::int64_t batch, std::int64_t m, std::int64_t n, std::int64_t k,
                        const T* A, const T* B, T* C) {
  Kokkos::parallel_for(
      "haliax::dot(plain)", Kokkos::RangePolicy<Kokkos::DefaultExecutionSpace, Kokkos::IndexType<std::int64_t>>(0, batch * m * n),
      KOKKOS_LAMBDA(std::int64_t idx) {
        const std::int64_t b = idx / (m * n), r = idx - b * (m * n);
        const std::int64_t i = r / n, j = r - i * n;
        const T* a = A + b * m * k;
        const T* bb = B + b * k * n;
        T acc = T(0);
        for (std::int64_t l = 0; l < k; ++l) {
          T av = trans_a ? a[l * m + i] : a[i * k + l];
          T bv = trans_b ? bb[j * k + l] : bb[l * n + j];
          acc += av * bv;
        }
        C[idx] = acc;
      });
}

/// C = op(A) * op(B) with beta = 0 for `batch` problems stored one after another. A is m x k (k x m when
/// trans_a), B is k x n (n x k when trans_b), all row-major and densely packed.
template <class T>
void gemm_batched(bool trans_a, bool trans_b, std::int64_t batch, std::int64_t m, std::int64_t n, std::int64_t k,
                  const T* A, const T* B, T* C) {
  if (batch == 0 || m == 0 || n == 0) return;
  if (k == 0) {
    Kokkos::parallel_for(
        "haliax::dot(zero)", Kokkos::RangePolicy<Kokkos::DefaultExecutionSpace, Kokkos::IndexType<std::int64_t>>(0, batch * m * n),
        KOKKOS_LAMBDA(std::int64_t i) { C[i] = T(0); });
    return;
  }
  constexpr bool host = std::is_same_v<Kokkos::DefaultExecutionSpace::memory_space, Kokkos::HostSpace>;
  constexpr bool real = std::is_same_v<T, float> || std::is_same_v<T, double>;
  if constexpr (real) gemm_profile::launches.fetch_add(1, std::memory_order_relaxed);
#if defined(HALIAX_HAVE_HOST_BLAS)
  if constexpr (real && host) {
    if (!use_host_kernels(kernels::family::gemm)) {
      // The portable path on host memory (HALIAX_PORTABLE_KERNELS=1, HALIAX_VENDOR_KERNELS without gemm): Kokkos
      // Kernels' GEMM per problem; BLAS single-threaded so the result does not depend on the thread count.
      if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);
      kokkos_gemm_batched(trans_a, trans_b, batch, m, n, k, A, B, C);
      return;
    }
  }
#else
  static_assert(!host, "haliax: a build for host memory needs the host BLAS (Kokkos Kernels and OpenBLAS)");
#endif
  if constexpr (real && host) {
    auto run = [&] {
#if defined(HALIAX_HAVE_ONEDNN)
      if constexpr (std::is_same_v<T, float>) {
        if (current_matmul_precision() == matmul_precision::bf16 &&
            host_gemm_batched_as_bf16(trans_a, trans_b, batch, m, n, k, A, B, C))
          return;
      }
#endif
      host_gemm_batched(trans_a, trans_b, batch, m, n, k, A, B, C);
    };
    if (gemm_profile::enabled.load(std::memory_order_relaxed)) {
      const auto t0 = std::chrono::steady_clock::now();
      run();
      const auto t1 = std::chrono::steady_clock::now();
      gemm_profile::nanoseconds += std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count();
      gemm_profile::flops += 2 * batch * m * n * k;
      gemm_profile::calls += 1;
      return;
    }
    run();
  } else if constexpr (real) {
#if defined(KOKKOS_ENABLE_CUDA)
    if constexpr (vendor_cuda::available) {
      if (kernels::specialised(kernels::family::gemm)) {
        // Device memory on CUDA: one strided-batched cuBLAS call, through the compiled adapter.
        kernels::note(kernels::family::gemm, kernels::impl::vendor);
        const bool bf = std::is_same_v<T, float> && current_matmul_precision() == matmul_precision::bf16;
        const auto kind = std::is_same_v<T, double> ? vendor_cuda::gemm_kind::f64
                          : bf                      ? vendor_cuda::gemm_kind::f32_bf16_compute
                                                    : vendor_cuda::gemm_kind::f32;
        const device_guard::device_work work;
        vendor_cuda::gemm_strided_batched(kind, trans_a, trans_b, batch, m, n, k, A, B, C,
                                          static_cast<void*>(Kokkos::DefaultExecutionSpace().cuda_stream()));
        return;
      }
    }
    // The portable kernel (HALIAX_VENDOR_KERNELS without gemm, or a build without the adapters).
    kernels::note(kernels::family::gemm, kernels::impl::portable);
    plain_gemm_batched(trans_a, trans_b, batch, m, n, k, A, B, C);
#else
    // Other device memory: one Kokkos Kernels GEMM per problem.
    kernels::note(kernels::family::gemm, kernels::impl::portable);
    kokkos_gemm_batched(trans_a, trans_b, batch, m, n, k, A, B, C);
#endif
  } else if constexpr (std::is_same_v<T, bf16>) {
    // No bf16 GEMM in Kokkos Kernels: widen every problem to float (exact), multiply, round to nearest even.
    using fview = Kokkos::View<float*, Kokkos::DefaultExecutionSpace::memory_space>;
    const std::int64_t na = batch * m * k, nb = batch * k * n, nc = batch * m * n;
    fview fa(Kokkos::view_alloc(Kokkos::WithoutInitializing, "haliax::dot(bf16 a)"), na);
    fview fb(Kokkos::view_alloc(Kokkos::WithoutInitializing, "haliax::dot(bf16 b)"), nb);
    fview fc(Kokkos::view_alloc(Kokkos::WithoutInitializing, "haliax::dot(bf16 c)"), nc);
    float* pa = fa.data();
    float* pb = fb.data();
    float* pc = fc.data();
    Kokkos::parallel_for(
        "haliax::dot(widen a)", Kokkos::RangePolicy<Kokkos::DefaultExecutionSpace, Kokkos::IndexType<std::int64_t>>(0, na),
        KOKKOS_LAMBDA(std::int64_t i) { pa[i] = float(A[i]); });
    Kokkos::parallel_for(
        "haliax::dot(widen b)", Kokkos::RangePolicy<Kokkos::DefaultExecutionSpace, Kokkos::IndexType<std::int64_t>>(0, nb),
        KOKKOS_LAMBDA(std::int64_t i) { pb[i] = float(B[i]); });
    gemm_batched<float>(trans_a, trans_b, batch, m, n, k, pa, pb, pc);
    Kokkos::parallel_for(
        "haliax::dot(round c)", Kokkos::RangePolicy<Kokkos::DefaultExecutionSpace, Kokkos::IndexType<std::int64_t>>(0, nc),
        KOKKOS_LAMBDA(std::int64_t i) { C[i] = bf16(pc[i]); });
  } else {
    // Integers: the plain kernel (exact; no BLAS has an int32 GEMM).
    plain_gemm_batched(trans_a, trans_b, batch, m, n, k, A, B, C);
  }
}

}  // namespace haliax::detail
