// levanter/optim/adamw_kernel.hpp: the AdamW element loop, compiled once into levanter_core
// (src/optim/adamw_kernel.cpp) so that it can be vectorised and dispatched on the CPU's instruction set
// whatever flags a user compiles the headers with. Private to levanter/optim/adamw.hpp.
//
// The loop exists in two builds in that file: baseline x86-64 (SSE2) and AVX2, picked once per process with
// __builtin_cpu_supports (LEVANTER_ISA=baseline forces the baseline, for tests and comparisons). Both compute
// the same float operations in the same order per element (no FMA: the AVX2 build does not enable it, so no
// multiply-add is contracted on one path and not the other; sqrt and division are correctly rounded on both),
// and the sum of squares is added in the same fixed order; so the results are bitwise the same on every path.
#pragma once

#include <cstdint>
#include <vector>

namespace levanter::optim::detail::adamw {

// Per-element constants of one update, all in float as optax computes them.
struct consts {
  float clip_num, clip_den;  // g * clip_num / clip_den when clipping triggers (optax: t / g_norm * max_norm)
  bool clip;
  float b1, omb1, b2, omb2, eps;
  float bc1, bc1_next, bc2;  // 1 - b^t
  float wd;
  float neg_lr;
};

// Pass kinds: fused (moments + parameters), moments (moments written, update squares summed), apply (update
// recomputed from the new moments, scaled by per-slice factors, parameters written).
enum class pass { fused, moments, apply };

/// Runs one pass over elements [0, n) of a leaf (p, g, m, v point at the first element) and returns the sum of
/// the squares of the update (moments pass) or of the parameter step (fused and apply passes): float squares
/// summed in double, per block of 256 elements with 4 interleaved accumulators, then blocks in order. `div` and
/// `mul` scale the apply pass's update ((u / div) * mul); the other passes ignore them.
double run_range(const consts& c, pass kind, bool nesterov, bool decay, float* p, const float* g, float* m, float* v,
                 int64_t n, float div, float mul);

/// The sum of the squares of g[0, n) in double, in two fixed stages: each block of 256 elements in order, then
/// the blocks in order (the gradient norm's order on every path: the portable loop sums a chunk's blocks as
/// separate work items, where one thread walked the whole chunk).
double grad_squares(const float* g, int64_t n);

/// The instruction set run_range uses in this process: "avx2" or "baseline".
const char* kernel_isa();

/// The loop built for one instruction set, whatever the process picked (tests compare the paths bit for bit).
enum class isa { baseline, avx2 };
bool isa_available(isa which);
double run_range_on(isa which, const consts& c, pass kind, bool nesterov, bool decay, float* p, const float* g,
                    float* m, float* v, int64_t n, float div, float mul);

/// One chunk for the portable loop: its elements' pointers (in the arrays' memory space) and count, whether
/// weight decay applies, and the apply pass's scale (u / div) * mul.
struct chunk_ref {
  float* p;
  const float* g;
  float* m;
  float* v;
  int64_t n;
  bool decay;
  float div, mul;
};

/// What the portable loop computes per chunk: the sum of the gradient's squares, or one of the passes.
enum class chunk_job { grad_squares, fused, moments, apply };

/// The portable loop: Kokkos kernels in the default execution space's memory space (the only AdamW loop a
/// CUDA build has; a host build runs it under HALIAX_PORTABLE_KERNELS=1). Returns each chunk's sum in chunk
/// order. Per element it does the float operations of run_range in the same order, and it sums the squares
/// in the same blocks and order (the gradient's squares: as grad_squares), so on a CPU its results are bitwise
/// those of run_range and grad_squares (tested). A chunk holds at most 2^15 elements.
std::vector<double> run_chunks_portable(const consts& c, chunk_job job, bool nesterov,
                                        const std::vector<chunk_ref>& chunks);

/// The gradient norm and the fused pass of the portable loop with the clipping decision made on the device: the
/// gradient's squares per chunk (as chunk_job::grad_squares), their sum in chunk order and its square root, then
/// the fused pass clipping when clip_on and float(norm) is not below max_grad_norm (c.clip and c.clip_den are
/// ignored). Returns the fused pass's chunk sums followed by the gradient norm, read back once: bitwise what
/// run_chunks_portable's two calls and the host's decision give, with one device synchronisation instead of two.
std::vector<double> run_clipped_fused_portable(const consts& c, bool nesterov, const std::vector<chunk_ref>& chunks,
                                               bool clip_on, float max_grad_norm);

}  // namespace levanter::optim::detail::adamw
