// The device kit's program (device_session): shared pieces of its stages. See main.cpp for what it measures and
// docs/portability.md ("Working with a GPU machine") for how the session script runs it.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <haliax/haliax.hpp>

namespace kit {

namespace hax = haliax;

inline constexpr struct Tok final : hax::axis<"token"> {} Tok;
inline constexpr struct Vocab final : hax::axis<"vocab"> {} Vocab;
inline constexpr struct Embed final : hax::axis<"embed"> {} Embed;
inline constexpr struct Out final : hax::axis<"out"> {} Out;
inline constexpr struct Batch final : hax::axis<"batch"> {} Batch;
inline constexpr struct Pos final : hax::axis<"position"> {} Pos;
inline constexpr struct KPos final : hax::axis<"key_position"> {} KPos;
inline constexpr struct KvHead final : hax::axis<"kv_head"> {} KvHead;
inline constexpr struct Group final : hax::axis<"q_heads_per_group"> {} Group;
inline constexpr struct Key final : hax::axis<"head_size"> {} Key;

/// What the command line asked for (main.cpp parses it).
struct options {
  std::string stage;
  bool small = false;            ///< CPU-sized problems (the CI mode of the session script)
  std::string model = "gpt2";    ///< gpt2 (124M; small: a 2-layer GPT-2) or llama1b (small: a 2-layer Llama)
  std::string precision = "bf16";  ///< f32 or bf16 (trainer.mp p=f32,c=bfloat16)
  std::int64_t batch = 8;        ///< sequences per step; 0 with --batch max: the largest that fits
  std::int64_t seq = 1024;
  int steps = 3;                 ///< timed steps after the warm-up
  bool kernels = false;          ///< also time one step kernel by kernel
  std::string out = ".";         ///< where detail files go
  std::string tag;               ///< names this run's rows and files
  std::uint64_t seed = 0;        ///< the checks' random data (0: from the clock)
};

/// One row of the session's summary table: printed as `@row<TAB>section<TAB>item<TAB>value<TAB>comparison<TAB>note`
/// for scripts/device-session.sh, which collects the rows of every stage into summary.md.
inline void row(const std::string& section, const std::string& item, const std::string& value,
                const std::string& comparison = "", const std::string& note = "") {
  std::printf("@row\t%s\t%s\t%s\t%s\t%s\n", section.c_str(), item.c_str(), value.c_str(), comparison.c_str(),
              note.c_str());
  std::fflush(stdout);
}

/// printf to a std::string.
template <class... A>
std::string fmt(const char* f, A... a) {
  char buf[512];
  std::snprintf(buf, sizeof buf, f, a...);
  return buf;
}

/// A FLOP rate for people: TFLOP/s, or GFLOP/s below one TFLOP/s.
inline std::string rate_str(double flops_per_s) {
  return flops_per_s >= 1e12 ? fmt("%.1f TFLOP/s", flops_per_s * 1e-12) : fmt("%.1f GFLOP/s", flops_per_s * 1e-9);
}

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// Seconds of `f()` after a fence, fenced at the end.
template <class F>
double timed(F&& f) {
  Kokkos::fence();
  const double t0 = now_s();
  f();
  Kokkos::fence();
  return now_s() - t0;
}

/// Median of the timings of `reps` runs of `f` after one warm-up run.
template <class F>
double median_time(F&& f, int reps = 5) {
  f();
  Kokkos::fence();
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) t.push_back(timed(f));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

/// Fills `n` floats of array memory with values uniform in [-scale, scale) from a counter hash of (seed, i): fresh
/// non-zero data for timings, made on the device.
void fill_random(float* p, std::int64_t n, std::uint64_t seed, float scale = 1.0f);

/// y[i] = bf16(x[i]) (round to nearest even) as raw bits, on array memory.
void to_bf16(const float* x, std::uint16_t* y, std::int64_t n);
/// y[i] = x[i] in one Kokkos kernel (what the portable kernels' memory traffic can reach).
void copy_kernel(const float* x, float* y, std::int64_t n);

/// The vendor's GEMM called directly (cuBLAS on a GPU; the host BLAS, or oneDNN for bf16, on a CPU): row-major
/// C[m, n] = A[m, k] B[k, n] on array memory.
enum class gemm_kind {
  f32,       ///< f32 operands, f32 arithmetic (CUBLAS_COMPUTE_32F: no TF32), as haliax's f32 products
  f32_bf16,  ///< f32 operands rounded to bf16 on the tensor cores, f32 sums: what haliax runs under bf16 precision
  bf16,      ///< bf16 operands and f32 results (CUDA_R_16BF): the chip's bf16 rate, the MFU denominator
};
const char* name_of(gemm_kind k);
/// Whether this build can run `k` here (bf16 operands need a GPU or oneDNN with bf16 instructions).
bool gemm_available(gemm_kind k);
/// FLOP/s of the vendor GEMM of kind `k` over shapes {m, n, k} (median of 5 after a warm-up, on random data).
double vendor_gemm_rate(const std::vector<std::array<std::int64_t, 3>>& shapes, gemm_kind k);
/// The vendor GEMM, once, on raw array memory (A, B, C f32 for f32 kinds; bf16 bits in A and B for `bf16`).
void vendor_gemm(gemm_kind k, std::int64_t m, std::int64_t n, std::int64_t kk, const void* a, const void* b, float* c);

/// Device memory in bytes (total, free); the host's MemTotal/MemAvailable on a CPU build.
std::array<std::int64_t, 2> device_memory();
/// A one-line description of the device (GPU name and SMs, or CPU model and threads).
std::string device_name();
/// Whether the arrays live in GPU memory.
bool on_gpu();

int stage_env(const options& o);
int stage_checks(const options& o);
int stage_ops(const options& o);
int stage_ceilings(const options& o);
int stage_step(const options& o);
int stage_repro(const options& o);

}  // namespace kit
