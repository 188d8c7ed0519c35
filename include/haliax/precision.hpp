// haliax/precision.hpp: the precision float matrix products run in (upstream's mixed-precision compute dtype, seen
// from the GEMM).
//
//   {
//     haliax::matmul_precision_scope bf16(haliax::matmul_precision::bf16);
//     auto y = haliax::dot(x, w, Embed);   // operands rounded to bfloat16, products summed in f32, f32 result
//   }                                      // back to the previous precision
//
// Under `matmul_precision::bf16`, every float `dot` (forward and the dots of its gradient), the blockwise
// cross-entropy's vocabulary products and anything else that goes through the GEMM layer rounds both operands to
// bfloat16 (nearest, ties to even), multiplies them with a bfloat16 GEMM that accumulates in f32 (oneDNN's, on a CPU
// with AVX512_BF16 or AMX-BF16), and returns f32. Everything else (elementwise ops, norms, softmax, attention
// scores, the loss, the optimizer) is unchanged f32. Where no bfloat16 GEMM can run (a build without oneDNN, a CPU
// without the instructions, or ONEDNN_MAX_CPU_ISA below AVX512_CORE_BF16) the setting has no effect: products stay
// f32 and results are bitwise those of `matmul_precision::f32`; `bf16_matmul_available()` says which.
//
// The setting is process-wide (like JAX's default matmul precision), so products run by the thread pool follow
// the thread that set it. Results never depend on the thread count: a bfloat16 GEMM is cut into the same tiles as
// an f32 one (a function of the shape), each computed by one single-threaded oneDNN call.
#pragma once

#include <atomic>

namespace haliax {

enum class matmul_precision { f32, bf16 };

namespace detail {
inline std::atomic<matmul_precision>& matmul_precision_setting() {
  static std::atomic<matmul_precision> p{matmul_precision::f32};
  return p;
}
}  // namespace detail

/// The precision float products run in now (f32 unless a matmul_precision_scope says otherwise).
inline matmul_precision current_matmul_precision() {
  return detail::matmul_precision_setting().load(std::memory_order_relaxed);
}

/// Sets the process-wide matmul precision for its lifetime, then restores the previous one.
class matmul_precision_scope {
 public:
  explicit matmul_precision_scope(matmul_precision p)
      : previous_(detail::matmul_precision_setting().exchange(p, std::memory_order_relaxed)) {}
  ~matmul_precision_scope() { detail::matmul_precision_setting().store(previous_, std::memory_order_relaxed); }
  matmul_precision_scope(const matmul_precision_scope&) = delete;
  matmul_precision_scope& operator=(const matmul_precision_scope&) = delete;

 private:
  matmul_precision previous_;
};

// ---- rows computed alone ------------------------------------------------------------------------------------------
//
//   {
//     haliax::independent_rows_scope rows;   // each row of a product is what it would be in a product of one row
//     auto logits = decode_step(batch_of_sequences);
//   }
//
// A BLAS rounds a row of C = A.B differently depending on the shape of the call it is in (OpenBLAS's small-matrix
// kernels take products under about 10^6 multiply-adds), so a sequence decoded beside others can get other bits
// than the same sequence alone. Under this scope the host's float GEMMs (f32 and f64 through OpenBLAS) call the BLAS
// only with tiles of exactly `detail::independent_row_tile` rows (the last one padded with zero rows in a copy) and
// columns cut as for that many rows, so every row of C comes out of a call of the same shape whatever the number of
// rows and the other rows' values: a row is a function of its own row of A (tests/test_generate.cpp checks batched
// decoding against each sequence alone). Products under matmul_precision::bf16, and device memory, are unchanged.
// Process-wide, as the precision is; generation sets it (levanter/inference/generate.hpp).
namespace detail {
inline std::atomic<int>& independent_rows_setting() {
  static std::atomic<int> depth{0};
  return depth;
}
}  // namespace detail

/// Whether an independent_rows_scope is alive.
inline bool independent_rows() { return detail::independent_rows_setting().load(std::memory_order_relaxed) > 0; }

/// Host float GEMMs compute each row of their result as they would alone, for this scope's lifetime (nests).
class independent_rows_scope {
 public:
  independent_rows_scope() { detail::independent_rows_setting().fetch_add(1, std::memory_order_relaxed); }
  ~independent_rows_scope() { detail::independent_rows_setting().fetch_sub(1, std::memory_order_relaxed); }
  independent_rows_scope(const independent_rows_scope&) = delete;
  independent_rows_scope& operator=(const independent_rows_scope&) = delete;
};

// Whether `matmul_precision::bf16` runs bfloat16 GEMMs here, and what runs them: `bf16_matmul_available()` and
// `bf16_matmul_backend()` in detail/gemm_bf16.hpp (included by haliax.hpp), which need oneDNN's header.

}  // namespace haliax
