// device_session: what one short lease of a GPU machine should measure, one stage per run, each printing its
// figures as it goes and its summary rows as `@row` lines (kit::row) for scripts/device-session.sh, which runs the
// stages under their own time limits and writes summary.md. It needs only haliax, levanter_models (the models, the
// loss and AdamW's loop) and, in a CUDA build, the CUDA runtime and cuBLAS: no yaml-cpp, HDF5, MPI or host BLAS.
// A CPU build runs every stage too (on the portable kernels under HALIAX_PORTABLE_KERNELS=1, as the script sets),
// at small sizes with --small; that is how CI tests the kit.
//
//   device_session --stage env                  the card (or CPU), driver, CUDA runtime, cuBLAS, cuDNN, NCCL
//   device_session --stage checks               every portable and vendor kernel against a host f64 reference,
//                                               fresh random data, poisoned outputs, each run twice (bitwise)
//   device_session --stage ceilings             copy bandwidth, vendor GEMM rates (f32, bf16) on the step's shapes
//   device_session --stage ops                  the step's memory-bound kernels (softmax, cross-entropy, LayerNorm,
//                                               broadcasts, column sums, GELU, AdamW) against the copy bandwidth
//   device_session --stage step --model gpt2 --precision bf16 --batch 8 --seq 1024 [--kernels]
//                                               a training step: s/step, tokens/s, MFU, forward/backward/update,
//                                               kernels, fences, allocations and cache misses per step,
//                                               optionally the device time of every kernel (kernels-<tag>.tsv)
//   device_session --stage step --batch max     the same at the largest batch that fits
//   device_session --stage repro                losses and a parameter hash, to compare between two processes
// Common flags: --small (CPU-sized problems), --out DIR (detail files), --tag NAME, --seed N, --steps N.
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <string>

#include <dlfcn.h>
#include <unistd.h>

#include "kit.hpp"

#if defined(KOKKOS_ENABLE_CUDA)
#include <cublas_v2.h>
#include <cuda_runtime.h>
#elif defined(HALIAX_HAVE_HOST_BLAS)
#include <cblas.h>
#endif

namespace kit {

namespace {

#if defined(KOKKOS_ENABLE_CUDA)
void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}
cublasHandle_t handle() {
  static cublasHandle_t h = [] {
    cublasHandle_t x = nullptr;
    if (cublasCreate(&x) != CUBLAS_STATUS_SUCCESS) throw std::runtime_error("cublasCreate failed");
    cublasSetStream(x, Kokkos::DefaultExecutionSpace().cuda_stream());
    return x;
  }();
  return h;
}
#endif

std::string read_first(const char* path, const char* key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key, 0) == 0) {
      auto c = line.find(':');
      return c == std::string::npos ? line : line.substr(c + 2);
    }
  return "";
}

/// A library's version through its own C entry point, found at run time (cuDNN and NCCL live in PyTorch's
/// environment on the GPU machine; the session script puts them on LD_LIBRARY_PATH). Empty when not found.
std::string dl_version(const char* lib, const char* symbol, bool out_param) {
  void* h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  if (!h) return "";
  void* f = dlsym(h, symbol);
  if (!f) return "";
  long v = 0;
  if (out_param) {
    int x = 0;
    reinterpret_cast<int (*)(int*)>(f)(&x);
    v = x;
  } else {
    v = static_cast<long>(reinterpret_cast<std::size_t (*)()>(f)());
  }
  return std::to_string(v);
}

}  // namespace

bool on_gpu() {
#if defined(KOKKOS_ENABLE_CUDA)
  return true;
#else
  return false;
#endif
}

std::string device_name() {
#if defined(KOKKOS_ENABLE_CUDA)
  cudaDeviceProp p{};
  int dev = 0;
  cudaGetDevice(&dev);
  cudaGetDeviceProperties(&p, dev);
  return fmt("%s, %d SMs, %.0f GiB", p.name, p.multiProcessorCount, double(p.totalGlobalMem) / (1 << 30));
#else
  return read_first("/proc/cpuinfo", "model name") + ", " + std::to_string(hax::num_threads()) + " threads";
#endif
}

std::array<std::int64_t, 2> device_memory() {
#if defined(KOKKOS_ENABLE_CUDA)
  std::size_t free_b = 0, total_b = 0;
  cuda_check(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
  return {std::int64_t(total_b), std::int64_t(free_b)};
#else
  auto kb = [](const char* key) {
    const std::string v = read_first("/proc/meminfo", key);
    return std::int64_t(std::atoll(v.c_str())) * 1024;
  };
  return {kb("MemTotal"), kb("MemAvailable")};
#endif
}

void fill_random(float* p, std::int64_t n, std::uint64_t seed, float scale) {
  Kokkos::parallel_for(
      "kit::fill_random", Kokkos::RangePolicy<Kokkos::DefaultExecutionSpace, Kokkos::IndexType<std::int64_t>>(0, n), KOKKOS_LAMBDA(std::int64_t i) {
        std::uint64_t z = seed + 0x9E3779B97F4A7C15ull * std::uint64_t(i + 1);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        p[i] = scale * (float(z >> 40) * (2.0f / 16777216.0f) - 1.0f);
      });
}

void to_bf16(const float* x, std::uint16_t* y, std::int64_t n) {
  Kokkos::parallel_for(
      "kit::to_bf16", Kokkos::RangePolicy<Kokkos::DefaultExecutionSpace, Kokkos::IndexType<std::int64_t>>(0, n),
      KOKKOS_LAMBDA(std::int64_t i) { y[i] = hax::bf16(x[i]).bits; });
}

void copy_kernel(const float* x, float* y, std::int64_t n) {
  Kokkos::parallel_for(
      "kit::copy", Kokkos::RangePolicy<Kokkos::DefaultExecutionSpace, Kokkos::IndexType<std::int64_t>>(0, n), KOKKOS_LAMBDA(std::int64_t i) { y[i] = x[i]; });
}

const char* name_of(gemm_kind k) {
  switch (k) {
    case gemm_kind::f32: return "f32";
    case gemm_kind::f32_bf16: return "f32 operands, bf16 compute";
    case gemm_kind::bf16: return "bf16";
  }
  return "?";
}

bool gemm_available(gemm_kind k) {
  if (on_gpu()) return true;
  if (k == gemm_kind::f32) {
#if defined(HALIAX_HAVE_HOST_BLAS)
    return true;
#else
    return false;
#endif
  }
  return hax::bf16_matmul_available();
}

void vendor_gemm(gemm_kind k, std::int64_t m, std::int64_t n, std::int64_t kk, const void* a, const void* b, float* c) {
#if defined(KOKKOS_ENABLE_CUDA)
  // Row-major C = A B is column-major C^T = B^T A^T: the operands go in swapped.
  const float one = 1, zero = 0;
  const auto in = k == gemm_kind::bf16 ? CUDA_R_16BF : CUDA_R_32F;
  const auto compute = k == gemm_kind::f32 ? CUBLAS_COMPUTE_32F
                       : k == gemm_kind::f32_bf16 ? CUBLAS_COMPUTE_32F_FAST_16BF
                                                  : CUBLAS_COMPUTE_32F;
  const auto st = cublasGemmEx(handle(), CUBLAS_OP_N, CUBLAS_OP_N, int(n), int(m), int(kk), &one, b, in, int(n), a, in,
                               int(kk), &zero, c, CUDA_R_32F, int(n), compute, CUBLAS_GEMM_DEFAULT);
  if (st != CUBLAS_STATUS_SUCCESS) throw std::runtime_error(fmt("cublasGemmEx failed (status %d)", int(st)));
#else
  if (k == gemm_kind::f32) {
#if defined(HALIAX_HAVE_HOST_BLAS)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(m), int(n), int(kk), 1.0f, static_cast<const float*>(a),
                int(kk), static_cast<const float*>(b), int(n), 0.0f, c, int(n));
#endif
    return;
  }
  // On a CPU the bfloat16 GEMM is haliax's oneDNN path (operands rounded to bf16, f32 sums): the fastest there is.
  hax::matmul_precision_scope scope(hax::matmul_precision::bf16);
  hax::detail::portable_kernels_scope host(false);
  hax::detail::gemm_batched<float>(false, false, 1, m, n, kk, static_cast<const float*>(a),
                                   static_cast<const float*>(b), c);
#endif
}

double vendor_gemm_rate(const std::vector<std::array<std::int64_t, 3>>& shapes, gemm_kind kind) {
  double flops = 0, secs = 0;
#if defined(HALIAX_HAVE_HOST_BLAS) && !defined(KOKKOS_ENABLE_CUDA)
  // All of the machine's threads for the host BLAS (haliax's own GEMMs use them through its pool).
  openblas_set_num_threads(hax::num_threads());
#endif
  for (const auto& s : shapes) {
    const auto m = s[0], n = s[1], k = s[2];
    using fview = Kokkos::View<float*, hax::memory_space>;
    fview a(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kit::gemm a"), std::size_t(m * k));
    fview b(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kit::gemm b"), std::size_t(k * n));
    fview c(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kit::gemm c"), std::size_t(m * n));
    fill_random(a.data(), m * k, 11, 1.0f);
    fill_random(b.data(), k * n, 12, 1.0f);
    const void* pa = a.data();
    const void* pb = b.data();
    Kokkos::View<std::uint16_t*, hax::memory_space> a16, b16;
    if (kind == gemm_kind::bf16 && on_gpu()) {
      a16 = decltype(a16)(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kit::gemm a16"), std::size_t(m * k));
      b16 = decltype(b16)(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kit::gemm b16"), std::size_t(k * n));
      to_bf16(a.data(), a16.data(), m * k);
      to_bf16(b.data(), b16.data(), k * n);
      pa = a16.data();
      pb = b16.data();
    }
    secs += median_time([&] { vendor_gemm(kind, m, n, k, pa, pb, c.data()); });
    flops += 2.0 * double(m) * double(n) * double(k);
  }
#if defined(HALIAX_HAVE_HOST_BLAS) && !defined(KOKKOS_ENABLE_CUDA)
  openblas_set_num_threads(1);
#endif
  return flops / secs;
}

int stage_env(const options& o) {
  (void)o;
  row("environment", "device", device_name());
  const auto mem = device_memory();
  row("environment", "memory", fmt("%.1f GiB total, %.1f GiB free", double(mem[0]) / (1 << 30), double(mem[1]) / (1 << 30)));
  const int kv = KOKKOS_VERSION;
  row("environment", "kokkos", fmt("%d.%d.%d, %s", kv / 10000, kv / 100 % 100, kv % 100, hax::execution_space::name()),
      "", hax::detail::use_host_kernels() ? "host kernels" : "portable kernels");
#if defined(KOKKOS_ENABLE_CUDA)
  cudaDeviceProp p{};
  int dev = 0;
  cudaGetDevice(&dev);
  cudaGetDeviceProperties(&p, dev);
  int drv = 0, rt = 0;
  cudaDriverGetVersion(&drv);
  cudaRuntimeGetVersion(&rt);
  int sm_khz = 0, mem_khz = 0;
  cudaDeviceGetAttribute(&sm_khz, cudaDevAttrClockRate, dev);
  cudaDeviceGetAttribute(&mem_khz, cudaDevAttrMemoryClockRate, dev);
  row("environment", "compute capability", fmt("%d.%d", p.major, p.minor), "",
      fmt("L2 %.0f MB, %d-bit memory bus, clocks (max) SM %d MHz, memory %d MHz", double(p.l2CacheSize) / 1e6,
          p.memoryBusWidth, sm_khz / 1000, mem_khz / 1000));
  row("environment", "CUDA driver / runtime", fmt("%d.%d / %d.%d", drv / 1000, drv % 1000 / 10, rt / 1000, rt % 1000 / 10),
      "", fmt("built with nvcc %d.%d", __CUDACC_VER_MAJOR__, __CUDACC_VER_MINOR__));
  int cb = 0;
  cublasGetVersion(handle(), &cb);
  row("environment", "cuBLAS", fmt("%d.%d.%d", cb / 10000, cb / 100 % 100, cb % 100));
#else
  const std::string flags = read_first("/proc/cpuinfo", "flags");
  std::string isa;
  for (const char* f : {"avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16"})
    if ((" " + flags + " ").find(std::string(" ") + f + " ") != std::string::npos) isa += std::string(isa.empty() ? "" : " ") + f;
  row("environment", "ISA", isa.empty() ? "baseline x86-64" : isa, "", "bf16 GEMM: " + hax::bf16_matmul_backend());
#if defined(HALIAX_HAVE_HOST_BLAS)
  row("environment", "OpenBLAS", openblas_get_corename(), "", fmt("%d haliax threads", hax::num_threads()));
#endif
#endif
  const std::string cudnn = dl_version("libcudnn.so.9", "cudnnGetVersion", false);
  row("environment", "cuDNN (runtime)", cudnn.empty() ? "not found" : cudnn, "", "looked up at run time, not linked");
  const std::string nccl = dl_version("libnccl.so.2", "ncclGetVersion", true);
  row("environment", "NCCL (runtime)", nccl.empty() ? "not found" : nccl, "", "looked up at run time, not linked");
  return 0;
}

int stage_ceilings(const options& o) {
  // Device copy bandwidth: bytes read plus bytes written per second, by Kokkos::deep_copy and by a plain kernel.
  const std::int64_t n = o.small ? (std::int64_t(1) << 23) : (std::int64_t(1) << 28);
  Kokkos::View<float*, hax::memory_space> x(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kit::copy x"), n);
  Kokkos::View<float*, hax::memory_space> y(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kit::copy y"), n);
  fill_random(x.data(), n, 3);
  const double bytes = 2.0 * double(n) * sizeof(float);
  const double t_copy = median_time([&] { Kokkos::deep_copy(y, x); });
  const double t_kernel = median_time([&] { copy_kernel(x.data(), y.data(), n); });
  row("ceilings", "copy bandwidth (deep_copy)", fmt("%.0f GB/s", bytes / t_copy * 1e-9), "reference",
      fmt("%.0f MB read + written", bytes * 1e-6));
  row("ceilings", "copy bandwidth (Kokkos kernel)", fmt("%.0f GB/s", bytes / t_kernel * 1e-9),
      fmt("%.2f of deep_copy", t_copy / t_kernel));
  x = {};
  y = {};

  // The vendor's GEMM on the GPT-2 124M step's shapes (tokens x {2304, 768, 3072, 768, 50257} x ...), and on a
  // 1B Llama's.
  const std::int64_t T = o.small ? 512 : 8 * 1024;
  const std::int64_t E = o.small ? 128 : 768, V = o.small ? 4096 : 50257;
  const std::vector<std::array<std::int64_t, 3>> gpt2 = {{T, 3 * E, E}, {T, E, E}, {T, 4 * E, E}, {T, E, 4 * E}, {T, V, E}};
  const std::int64_t LT = o.small ? 512 : 4 * 2048, LE = o.small ? 256 : 2048, LI = o.small ? 1024 : 8192,
                     LK = o.small ? 64 : 512, LV = o.small ? 4096 : 32000;
  const std::vector<std::array<std::int64_t, 3>> llama = {
      {LT, LE, LE}, {LT, LK, LE}, {LT, LI, LE}, {LT, LE, LI}, {LT, LV, LE}};
  double bf16_rate = 0;
  for (auto kind : {gemm_kind::f32, gemm_kind::f32_bf16, gemm_kind::bf16}) {
    if (!gemm_available(kind)) {
      row("ceilings", std::string("GEMM ") + name_of(kind), "not available here");
      continue;
    }
    const double r = vendor_gemm_rate(gpt2, kind);
    if (kind == gemm_kind::bf16) bf16_rate = r;
    row("ceilings", std::string("GEMM ") + name_of(kind) + (o.small ? ", small GPT-2 step shapes" : ", GPT-2 124M step shapes"), rate_str(r),
        on_gpu() ? fmt("%.3f of 989 TFLOP/s", r / 989e12) : "", fmt("%lld tokens", (long long)T));
  }
  if (gemm_available(gemm_kind::bf16)) {
    const double r = vendor_gemm_rate(llama, gemm_kind::bf16);
    row("ceilings", o.small ? "GEMM bf16, small Llama step shapes" : "GEMM bf16, Llama 1B step shapes", rate_str(r),
        on_gpu() ? fmt("%.3f of 989 TFLOP/s", r / 989e12) : "", fmt("%lld tokens", (long long)LT));
    const std::int64_t big = o.small ? 1024 : 8192;
    const double rb = vendor_gemm_rate({{big, big, big}}, gemm_kind::bf16);
    row("ceilings", fmt("GEMM bf16, %lld^3", (long long)big), rate_str(rb),
        on_gpu() ? fmt("%.3f of 989 TFLOP/s", rb / 989e12) : "", "the chip's dense bf16 rate as measured");
  }
  (void)bf16_rate;
  return 0;
}

}  // namespace kit

namespace {

void usage() {
  std::cerr << "usage: device_session --stage env|checks|ceilings|ops|step|repro [--small] [--model gpt2|llama1b]\n"
               "       [--precision f32|bf16] [--batch N|max] [--seq N] [--steps N] [--kernels] [--out DIR]\n"
               "       [--tag NAME] [--seed N]\n";
}

}  // namespace

int main(int argc, char** argv) {
  kit::options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << "device_session: " << a << " needs a value\n";
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--stage") o.stage = next();
    else if (a == "--small") o.small = true;
    else if (a == "--model") o.model = next();
    else if (a == "--precision") o.precision = next();
    else if (a == "--batch") {
      const std::string b = next();
      o.batch = b == "max" ? 0 : std::atoll(b.c_str());
    } else if (a == "--seq") o.seq = std::atoll(next().c_str());
    else if (a == "--steps") o.steps = std::atoi(next().c_str());
    else if (a == "--kernels") o.kernels = true;
    else if (a == "--out") o.out = next();
    else if (a == "--tag") o.tag = next();
    else if (a == "--seed") o.seed = std::strtoull(next().c_str(), nullptr, 10);
    else if (a.rfind("--kokkos", 0) == 0) continue;
    else {
      std::cerr << "device_session: unknown argument '" << a << "'\n";
      usage();
      return 2;
    }
  }
  if (o.model != "gpt2" && o.model != "llama1b") {
    std::cerr << "device_session: --model must be gpt2 or llama1b (got '" << o.model << "')\n";
    return 2;
  }
  if (o.precision != "f32" && o.precision != "bf16") {
    std::cerr << "device_session: --precision must be f32 or bf16 (got '" << o.precision << "')\n";
    return 2;
  }
  if (o.batch < 0 || o.seq <= 0 || o.steps <= 0) {
    std::cerr << "device_session: --batch, --seq and --steps must be positive\n";
    return 2;
  }
  // The checks poison every buffer the cache hands out, so that an unwritten output element reads NaN (or -1).
  if (o.stage == "checks") ::setenv("HALIAX_POISON_BUFFERS", "1", 1);
  haliax::runtime rt(argc, argv);
  try {
    if (o.stage == "env") return kit::stage_env(o);
    if (o.stage == "checks") return kit::stage_checks(o);
    if (o.stage == "ops") return kit::stage_ops(o);
    if (o.stage == "ceilings") return kit::stage_ceilings(o);
    if (o.stage == "step") return kit::stage_step(o);
    if (o.stage == "repro") return kit::stage_repro(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "device_session: stage %s failed: %s\n", o.stage.c_str(), e.what());
    kit::row("failures", "stage " + o.stage, "FAILED", "", e.what());
    return 1;
  }
  usage();
  return 2;
}
