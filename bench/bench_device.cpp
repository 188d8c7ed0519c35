// bench_device: the portable kernels on the default execution space (a GPU under a CUDA Kokkos; the host
// otherwise, where HALIAX_PORTABLE_KERNELS=1 selects the same kernels). Every op is first checked against a
// plain host computation on small inputs, then timed on GPT-2-sized ones, and reported as a ratio to a
// reference measured in the same run:
//   * memory-bound ops (softmax, a broadcast add, the cross-entropy loss, AdamW): bytes moved per second
//     against a Kokkos::deep_copy of the same bytes;
//   * GEMMs (haliax::dot on GPT-2 124M's shapes at 8 x 1024 tokens): FLOP/s against the BLAS called directly on
//     the same shapes (cublasSgemm / cublasGemmEx on a GPU, cblas_sgemm on the host), in f32 and, under
//     matmul_precision::bf16, against cuBLAS's bfloat16 tensor-core path.
// Prints one line per figure and exits non-zero when a check fails.
//
//   build/bench/bench_device            # or a CUDA build's bench_device on a GPU machine
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <vector>

#include <haliax/haliax.hpp>
#include <levanter/optim/adamw_kernel.hpp>

#if defined(KOKKOS_ENABLE_CUDA)
#include <cublas_v2.h>
#endif

namespace hax = haliax;
inline constexpr struct Tok final : hax::axis<"token"> {
} Tok;
inline constexpr struct Vocab final : hax::axis<"vocab"> {
} Vocab;
inline constexpr struct Embed final : hax::axis<"embed"> {
} Embed;
inline constexpr struct Out final : hax::axis<"out"> {
} Out;

namespace {

int failures = 0;

void check(bool ok, const char* what, double err) {
  std::printf("check %-52s %s (max error %.3g)\n", what, ok ? "ok" : "FAILED", err);
  if (!ok) ++failures;
}

// Best of `reps` timings of f (fenced), in seconds.
double time_best(const std::function<void()>& f, int reps = 5) {
  f();
  Kokkos::fence();
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    Kokkos::fence();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

std::vector<float> random_values(std::size_t n, unsigned seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

double max_rel(const std::vector<float>& got, const std::vector<double>& want) {
  double e = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    e = std::max(e, std::abs(got[i] - want[i]) / (1e-6 + std::abs(want[i])));
  return e;
}

// The BLAS called directly: row-major C[m, n] = A[m, k] B[k, n], on the arrays' memory.
void reference_gemm(bool bf16, std::int64_t m, std::int64_t n, std::int64_t k, const float* a, const float* b,
                    float* c) {
#if defined(KOKKOS_ENABLE_CUDA)
  static cublasHandle_t h = [] {
    cublasHandle_t x;
    cublasCreate(&x);
    return x;
  }();
  const float one = 1, zero = 0;
  cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, int(n), int(m), int(k), &one, b, CUDA_R_32F, int(n), a, CUDA_R_32F, int(k),
               &zero, c, CUDA_R_32F, int(n), bf16 ? CUBLAS_COMPUTE_32F_FAST_16BF : CUBLAS_COMPUTE_32F,
               CUBLAS_GEMM_DEFAULT);
#else
  (void)bf16;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(m), int(n), int(k), 1.0f, a, int(k), b, int(n), 0.0f, c,
              int(n));
#endif
}

}  // namespace

int main(int argc, char** argv) {
  hax::runtime rt(argc, argv);
  std::printf("execution space %s, portable kernels %s\n", hax::execution_space::name(),
              hax::detail::use_host_kernels() ? "off (host kernels)" : "on");

  // ---- checks on small inputs ---------------------------------------------------------------------------
  {
    const std::int64_t t = 37, v = 1001, e = 64, o = 96;
    const auto xs = random_values(std::size_t(t * v), 1, 3.0f);
    auto x = hax::from_host<float>(xs, t * Tok, v * Vocab);
    const auto p = hax::nn::softmax(x, Vocab).to_host();
    std::vector<double> want(p.size());
    for (std::int64_t r = 0; r < t; ++r) {
      double m = -1e300, s = 0;
      for (std::int64_t j = 0; j < v; ++j) m = std::max(m, double(xs[r * v + j]));
      for (std::int64_t j = 0; j < v; ++j) s += std::exp(double(xs[r * v + j]) - m);
      for (std::int64_t j = 0; j < v; ++j) want[r * v + j] = std::exp(double(xs[r * v + j]) - m) / s;
    }
    const double es = max_rel(p, want);
    check(es < 1e-4, "softmax against a double-precision host loop", es);

    std::vector<std::int32_t> ids(static_cast<std::size_t>(t));
    for (std::int64_t r = 0; r < t; ++r) ids[r] = std::int32_t((r * 131) % v);
    auto tg = hax::from_host<std::int32_t>(ids, t * Tok);
    const double loss = hax::nn::cross_entropy_loss(x, Vocab, tg).item();
    double ref = 0;
    for (std::int64_t r = 0; r < t; ++r) ref += -std::log(want[r * v + ids[r]]);
    ref /= double(t);
    check(std::abs(loss - ref) < 1e-4 * std::abs(ref), "cross-entropy loss against the host loop", std::abs(loss - ref));

    const auto as = random_values(std::size_t(t * e), 2), bs = random_values(std::size_t(e * o), 3);
    auto a = hax::from_host<float>(as, t * Tok, e * Embed);
    auto b = hax::from_host<float>(bs, e * Embed, o * Out);
    for (bool bf : {false, true}) {
      hax::matmul_precision_scope scope(bf ? hax::matmul_precision::bf16 : hax::matmul_precision::f32);
      const auto c = hax::dot(a, b, Embed).to_host();
      std::vector<double> cw(c.size());
      double worst = 0;
      for (std::int64_t i = 0; i < t; ++i)
        for (std::int64_t j = 0; j < o; ++j) {
          double s = 0, mag = 0;
          for (std::int64_t l = 0; l < e; ++l) {
            s += double(as[i * e + l]) * bs[l * o + j];
            mag += std::abs(double(as[i * e + l]) * bs[l * o + j]);
          }
          worst = std::max(worst, std::abs(c[i * o + j] - s) / mag);
        }
      check(worst < (bf ? 1e-2 : 1e-5), bf ? "dot under bf16 precision against the host loop" : "dot (f32) against the host loop",
            worst);
    }

    // AdamW's portable loop against the host loop (run_range): same operations, so equal up to the device's
    // contraction of multiply-adds.
    namespace k = levanter::optim::detail::adamw;
    const std::int64_t n = 70000;
    const auto p0 = random_values(std::size_t(n), 4), g0 = random_values(std::size_t(n), 5, 0.1f),
               m0 = random_values(std::size_t(n), 6, 0.01f);
    auto v0 = random_values(std::size_t(n), 7, 1e-3f);
    for (auto& q : v0) q = q * q;
    k::consts c{};
    c.clip_num = 1.0f, c.clip_den = 1.0f, c.clip = false;
    c.b1 = 0.9f, c.omb1 = 0.1f, c.b2 = 0.95f, c.omb2 = 0.05f, c.eps = 1e-8f;
    c.bc1 = 0.1f, c.bc1_next = 0.19f, c.bc2 = 0.05f, c.wd = 0.1f, c.neg_lr = -6e-4f;
    auto hp = p0, hm = m0, hv = v0;
    const double host_sq = k::run_range(c, k::pass::fused, false, true, hp.data(), g0.data(), hm.data(), hv.data(),
                                        32768, 1, 1) +
                           k::run_range(c, k::pass::fused, false, true, hp.data() + 32768, g0.data() + 32768,
                                        hm.data() + 32768, hv.data() + 32768, 32768, 1, 1) +
                           k::run_range(c, k::pass::fused, false, true, hp.data() + 65536, g0.data() + 65536,
                                        hm.data() + 65536, hv.data() + 65536, n - 65536, 1, 1);
    auto dp = hax::from_host<float>(p0, n * Tok), dg = hax::from_host<float>(g0, n * Tok);
    auto dm = hax::from_host<float>(m0, n * Tok), dv = hax::from_host<float>(v0, n * Tok);
    std::vector<k::chunk_ref> refs;
    for (std::int64_t b0 = 0; b0 < n; b0 += 32768)
      refs.push_back({dp.data() + b0, dg.data() + b0, dm.data() + b0, dv.data() + b0, std::min<std::int64_t>(32768, n - b0),
                      true, 1.0f, 1.0f});
    const auto sums = k::run_chunks_portable(c, k::chunk_job::fused, false, refs);
    double dev_sq = 0;
    for (double s : sums) dev_sq += s;
    const auto gp = dp.to_host();
    double ep = 0;
    for (std::int64_t i = 0; i < n; ++i) ep = std::max(ep, double(std::abs(gp[i] - hp[i])) / (1e-6 + std::abs(hp[i])));
    check(ep < 1e-5 && std::abs(dev_sq - host_sq) < 1e-4 * host_sq, "AdamW portable loop against the host loop", ep);
  }

  // ---- timings at GPT-2 124M, 8 x 1024 tokens ------------------------------------------------------------
  const std::int64_t T = 8 * 1024, V = 50257, E = 768;
  {
    auto x = hax::full<float>(0.5f, T * Tok, V * Vocab);
    auto y = hax::zeros<float>(T * Tok, V * Vocab);
    const double bytes = 2.0 * double(T) * double(V) * sizeof(float);
    const double copy_s = time_best([&] { Kokkos::deep_copy(y.view(), x.view()); });
    std::printf("copy            %8.3f ms  %7.1f GB/s (reference)\n", copy_s * 1e3, bytes / copy_s * 1e-9);
    auto logits = hax::full<float>(0.25f, T * Tok, V * Vocab);
    const double sm_s = time_best([&] { auto p = hax::nn::softmax(logits, Vocab); });
    std::printf("softmax         %8.3f ms  %7.1f GB/s  %.2f of copy  [%lld x %lld]\n", sm_s * 1e3, bytes / sm_s * 1e-9,
                copy_s / sm_s, (long long)T, (long long)V);
    auto row = hax::full<float>(1e-4f, V * Vocab);
    const double add_s = time_best([&] { auto z = x + row; });
    std::printf("broadcast add   %8.3f ms  %7.1f GB/s  %.2f of copy\n", add_s * 1e3, bytes / add_s * 1e-9,
                copy_s / add_s);
    std::vector<std::int32_t> ids(static_cast<std::size_t>(T));
    for (std::int64_t r = 0; r < T; ++r) ids[r] = std::int32_t((r * 7919) % V);
    auto tg = hax::from_host<std::int32_t>(ids, T * Tok);
    const double ce_s = time_best([&] { auto l = hax::nn::cross_entropy_loss(logits, Vocab, tg); });
    std::printf("cross-entropy   %8.3f ms  %7.1f GB/s read  %.2f of copy's read rate\n", ce_s * 1e3,
                0.5 * bytes / ce_s * 1e-9, copy_s / (2 * ce_s));
  }
  {
    namespace k = levanter::optim::detail::adamw;
    const std::int64_t n = 124'439'808;  // GPT-2 124M's parameter count
    auto p = hax::zeros<float>(n * Tok), g = hax::full<float>(1e-3f, n * Tok);
    auto m = hax::zeros<float>(n * Tok), v = hax::zeros<float>(n * Tok);
    std::vector<k::chunk_ref> refs;
    for (std::int64_t b0 = 0; b0 < n; b0 += 32768)
      refs.push_back(
          {p.data() + b0, g.data() + b0, m.data() + b0, v.data() + b0, std::min<std::int64_t>(32768, n - b0), true, 1, 1});
    k::consts c{};
    c.b1 = 0.9f, c.omb1 = 0.1f, c.b2 = 0.95f, c.omb2 = 0.05f, c.eps = 1e-8f;
    c.bc1 = 0.1f, c.bc1_next = 0.19f, c.bc2 = 0.05f, c.wd = 0.1f, c.neg_lr = -6e-4f;
    const double s = time_best([&] { k::run_chunks_portable(c, k::chunk_job::fused, false, refs); }, 3);
    auto y = hax::zeros<float>(n * Tok);
    const double copy_s = time_best([&] { Kokkos::deep_copy(y.view(), p.view()); }, 3);
    const double bytes = 7.0 * 4.0 * double(n);  // p, g, m, v read; p, m, v written
    std::printf("adamw (fused)   %8.3f ms  %7.1f GB/s  %.2f of copy's rate  [124.4M parameters]\n", s * 1e3,
                bytes / s * 1e-9, (bytes / s) / (8.0 * double(n) / copy_s));
  }
  {
    const std::vector<std::array<std::int64_t, 3>> shapes = {{T, 3 * E, E}, {T, E, E}, {T, 4 * E, E}, {T, E, 4 * E},
                                                            {T, V, E}};
    for (bool bf : {false, true}) {
      hax::matmul_precision_scope scope(bf ? hax::matmul_precision::bf16 : hax::matmul_precision::f32);
      double ours = 0, ref = 0, flops = 0;
      for (const auto& s : shapes) {
        const auto mm = s[0], nn = s[1], kk = s[2];
        auto a = hax::full<float>(0.01f, mm * Tok, kk * Embed);
        auto b = hax::full<float>(0.02f, kk * Embed, nn * Out);
        auto c = hax::zeros<float>(mm * Tok, nn * Out);
        ours += time_best([&] { auto r = hax::dot(a, b, Embed); });
        ref += time_best([&] { reference_gemm(bf, mm, nn, kk, a.data(), b.data(), c.data()); });
        flops += 2.0 * double(mm) * double(nn) * double(kk);
      }
      std::printf("dot %-5s       %8.3f ms  %7.1f TFLOP/s  reference %7.1f TFLOP/s  ratio %.2f  [GPT-2 shapes, %lld tokens]\n",
                  bf ? "bf16" : "f32", ours * 1e3, flops / ours * 1e-12, flops / ref * 1e-12, ref / ours,
                  (long long)T);
    }
  }
  std::printf("%s\n", failures == 0 ? "all checks passed" : "SOME CHECKS FAILED");
  return failures == 0 ? 0 : 1;
}
