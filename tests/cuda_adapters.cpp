// The CUDA vendor adapters (src/cuda/, haliax/detail/vendor_cuda.hpp), built against the CUDA toolkit on any
// machine that has it. With a GPU: every GEMM kind and transpose against a host double-precision reference, and a
// rerun bitwise equal. Without one: the adapter's errors are clear exceptions, never a crash.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <cuda_runtime.h>
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "haliax/detail/vendor_cuda.hpp"

namespace vc = haliax::vendor_cuda;

namespace {

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

std::string message_of(auto&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// Row-major reference of one problem of op(A) op(B).
template <class T>
std::vector<double> reference(bool ta, bool tb, std::int64_t batch, std::int64_t m, std::int64_t n, std::int64_t k,
                              const std::vector<T>& a, const std::vector<T>& b) {
  std::vector<double> c(batch * m * n);
  for (std::int64_t p = 0; p < batch; ++p)
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (std::int64_t l = 0; l < k; ++l) {
          const double av = a[p * m * k + (ta ? l * m + i : i * k + l)];
          const double bv = b[p * k * n + (tb ? j * k + l : l * n + j)];
          s += av * bv;
        }
        c[p * m * n + i * n + j] = s;
      }
  return c;
}

template <class T>
void check_on_gpu(vc::gemm_kind kind, bool ta, bool tb, double tol) {
  const std::int64_t batch = 3, m = 37, n = 53, k = 29;
  std::vector<T> a(batch * m * k), b(batch * k * n);
  std::uint32_t s = 12345;
  auto next = [&] {
    s = s * 1664525u + 1013904223u;
    return static_cast<T>((static_cast<double>(s >> 8) / (1 << 24)) * 2 - 1);
  };
  for (auto& x : a) x = next();
  for (auto& x : b) x = next();
  T *da = nullptr, *db = nullptr, *dc = nullptr;
  REQUIRE(cudaMalloc(&da, a.size() * sizeof(T)) == cudaSuccess);
  REQUIRE(cudaMalloc(&db, b.size() * sizeof(T)) == cudaSuccess);
  REQUIRE(cudaMalloc(&dc, batch * m * n * sizeof(T)) == cudaSuccess);
  cudaMemcpy(da, a.data(), a.size() * sizeof(T), cudaMemcpyHostToDevice);
  cudaMemcpy(db, b.data(), b.size() * sizeof(T), cudaMemcpyHostToDevice);
  std::vector<T> c1(batch * m * n), c2(batch * m * n);
  vc::gemm_strided_batched(kind, ta, tb, batch, m, n, k, da, db, dc, nullptr);
  cudaMemcpy(c1.data(), dc, c1.size() * sizeof(T), cudaMemcpyDeviceToHost);
  vc::gemm_strided_batched(kind, ta, tb, batch, m, n, k, da, db, dc, nullptr);
  cudaMemcpy(c2.data(), dc, c2.size() * sizeof(T), cudaMemcpyDeviceToHost);
  cudaFree(da);
  cudaFree(db);
  cudaFree(dc);
  const auto want = reference(ta, tb, batch, m, n, k, a, b);
  double err = 0, norm = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    err += (c1[i] - want[i]) * (c1[i] - want[i]);
    norm += want[i] * want[i];
  }
  CHECK(std::sqrt(err / norm) < tol);
  CHECK(std::memcmp(c1.data(), c2.data(), c1.size() * sizeof(T)) == 0);
}

}  // namespace

TEST_CASE("cuda adapters: a dimension cuBLAS cannot take is refused with the shape, before any GPU work") {
  const auto msg = message_of([] {
    vc::gemm_strided_batched(vc::gemm_kind::f32, false, false, 1, std::int64_t{1} << 31, 4, 4, nullptr, nullptr,
                             nullptr, nullptr);
  });
  CHECK(msg.find("2147483648 x 4") != std::string::npos);
  CHECK(msg.find("2^31 - 1") != std::string::npos);
  CHECK(message_of([] {
          vc::gemm_strided_batched(vc::gemm_kind::f32, false, false, 0, 4, 4, 4, nullptr, nullptr, nullptr, nullptr);
        }).find("between 1 and") != std::string::npos);
}

TEST_CASE("cuda adapters: GEMMs against a host reference on a GPU, or a clear error without one") {
  if (!have_gpu()) {
    // No GPU (or no driver): cuBLAS cannot start, and the adapter says so in an exception.
    const auto msg = message_of([] {
      vc::gemm_strided_batched(vc::gemm_kind::f32, false, false, 1, 2, 2, 2, nullptr, nullptr, nullptr, nullptr);
    });
    INFO(msg);
    CHECK(msg.find("cublasCreate failed") != std::string::npos);
    CHECK(msg.find("no usable GPU") != std::string::npos);
    return;
  }
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      CAPTURE(ta);
      CAPTURE(tb);
      check_on_gpu<float>(vc::gemm_kind::f32, ta, tb, 1e-6);
      check_on_gpu<float>(vc::gemm_kind::f32_bf16_compute, ta, tb, 1e-2);
      check_on_gpu<double>(vc::gemm_kind::f64, ta, tb, 1e-14);
    }
}
