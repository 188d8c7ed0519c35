// haliax/detail/vendor_cuda.hpp: the CUDA vendor adapters' interface. Private.
//
// Vendor libraries (cuBLAS now; cuBLASLt and cuDNN later) are called from compiled files in src/cuda/, built into
// the haliax_cuda library of a CUDA build, never from haliax's headers: their headers are heavy (the cuDNN
// frontend takes minutes per file) and their types stay out of every other translation unit. The interface is raw
// pointers, sizes, strides and a stream passed as `void*` (a cudaStream_t). Each call either does its work,
// enqueued on the stream, or throws std::runtime_error naming the call, the shape and the library's status.
#pragma once

#include <cstdint>

namespace haliax::vendor_cuda {

/// The element types and arithmetic of a GEMM.
enum class gemm_kind : int {
  f32 = 0,               ///< f32 operands, f32 products and sums (no TF32)
  f32_bf16_compute = 1,  ///< f32 operands rounded to bfloat16 on the tensor cores, f32 sums
  f64 = 2,               ///< f64 throughout
};

/// One strided-batched GEMM on device pointers: for each b < batch, C_b[m, n] = op(A_b) op(B_b), row-major and
/// densely packed (A_b is m x k, or k x m when trans_a; B_b is k x n, or n x k when trans_b; problem b starts
/// b*m*k, b*k*n and b*m*n elements in). Enqueued on `stream`; cuBLAS's result depends only on the shape and the
/// GPU. Throws std::invalid_argument for a dimension cuBLAS cannot take (over 2^31 - 1), std::runtime_error when
/// cuBLAS fails (no usable GPU, out of memory).
void gemm_strided_batched(gemm_kind kind, bool trans_a, bool trans_b, std::int64_t batch, std::int64_t m,
                          std::int64_t n, std::int64_t k, const void* a, const void* b, void* c, void* stream);

/// Whether this build has the adapters (the haliax_cuda library), as a constant for `if constexpr`.
#if defined(HALIAX_HAVE_CUDA_VENDOR)
inline constexpr bool available = true;
#else
inline constexpr bool available = false;
#endif

}  // namespace haliax::vendor_cuda
