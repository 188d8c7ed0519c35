// cuBLAS behind haliax's GEMM dispatch (haliax/detail/vendor_cuda.hpp): the only file that includes cuBLAS's
// header for the library. Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T, so the operands are
// passed swapped. One handle per process, made on first use and never destroyed (destroying it at exit can
// outlive the CUDA context); its stream is set on each call, so the caller's stream orders the work.
#include <cublas_v2.h>

#include <climits>
#include <mutex>
#include <stdexcept>
#include <string>

#include "haliax/detail/vendor_cuda.hpp"

namespace haliax::vendor_cuda {
namespace {

std::string shape(std::int64_t batch, std::int64_t m, std::int64_t n, std::int64_t k) {
  return std::to_string(batch) + " x [" + std::to_string(m) + " x " + std::to_string(k) + "] x [" +
         std::to_string(k) + " x " + std::to_string(n) + "]";
}

cublasHandle_t handle() {
  static std::mutex mu;
  static cublasHandle_t h = nullptr;
  std::lock_guard<std::mutex> lk(mu);
  if (h == nullptr) {
    const cublasStatus_t st = cublasCreate(&h);
    if (st != CUBLAS_STATUS_SUCCESS) {
      h = nullptr;
      throw std::runtime_error("haliax: cublasCreate failed (status " + std::to_string(static_cast<int>(st)) +
                               "): no usable GPU, or out of device memory; run a host build, or check "
                               "nvidia-smi and CUDA_VISIBLE_DEVICES");
    }
  }
  return h;
}

}  // namespace

void gemm_strided_batched(gemm_kind kind, bool trans_a, bool trans_b, std::int64_t batch, std::int64_t m,
                          std::int64_t n, std::int64_t k, const void* a, const void* b, void* c, void* stream) {
  if (batch <= 0 || m <= 0 || n <= 0 || k <= 0 || batch > INT_MAX || m > INT_MAX || n > INT_MAX || k > INT_MAX)
    throw std::invalid_argument("haliax: cuBLAS GEMM of " + shape(batch, m, n, k) +
                                ": every dimension must be between 1 and 2^31 - 1 (split the product)");
  cublasHandle_t h = handle();
  cublasStatus_t st = cublasSetStream(h, static_cast<cudaStream_t>(stream));
  const auto opa = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const auto opb = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int lda = static_cast<int>(trans_a ? m : k), ldb = static_cast<int>(trans_b ? k : n);
  const int im = static_cast<int>(m), in = static_cast<int>(n), ik = static_cast<int>(k), ib = static_cast<int>(batch);
  if (st == CUBLAS_STATUS_SUCCESS) {
    if (kind == gemm_kind::f64) {
      const double one = 1, zero = 0;
      st = cublasDgemmStridedBatched(h, opb, opa, in, im, ik, &one, static_cast<const double*>(b), ldb, k * n,
                                     static_cast<const double*>(a), lda, m * k, &zero, static_cast<double*>(c), in,
                                     m * n, ib);
    } else {
      const float one = 1, zero = 0;
      st = cublasGemmStridedBatchedEx(h, opb, opa, in, im, ik, &one, b, CUDA_R_32F, ldb, k * n, a, CUDA_R_32F, lda,
                                      m * k, &zero, c, CUDA_R_32F, in, m * n, ib,
                                      kind == gemm_kind::f32_bf16_compute ? CUBLAS_COMPUTE_32F_FAST_16BF
                                                                          : CUBLAS_COMPUTE_32F,
                                      CUBLAS_GEMM_DEFAULT);
    }
  }
  if (st != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error("haliax::dot: cuBLAS GEMM failed (status " + std::to_string(static_cast<int>(st)) +
                             ") for " + shape(batch, m, n, k));
}

}  // namespace haliax::vendor_cuda
