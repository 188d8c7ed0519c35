// haliax/kernels.hpp: which implementation of each kernel family runs, and the switch that picks the portable one.
//
// Every op family with more than one implementation has one dispatch point. Its primary implementation is the
// portable Kokkos kernel (the one every backend runs); specialisations are chosen where they are available:
//
//   family          host build (arrays in host memory)                 CUDA build (arrays in device memory)
//   gemm            OpenBLAS tiles, oneDNN bf16 (portable: Kokkos      cuBLAS through the compiled adapter
//                   Kernels' GEMM per problem)                         (src/cuda/; portable: one work item per
//                                                                      element, k summed in order)
//   attention       the host flash-attention tiles                     none yet (cuDNN's SDPA: issue 35)
//   softmax         AVX loops per row (softmax, log-softmax,           none yet
//                   logsumexp, their gradients)
//   cross_entropy   AVX loops per row (dense and block-wise)           none yet
//   elementwise     large activations over haliax's thread pool        none
//   optimizer       AdamW's loops over the thread pool                 none yet
//
// Norms have no kernel of their own yet: LayerNorm and RmsNorm are composed of the reduction and elementwise
// kernels. Vendor calls never appear in haliax's headers: they live in compiled adapters with a raw-pointer,
// strides and stream interface (src/cuda/, haliax/detail/vendor_cuda.hpp).
//
// The switch, for A/B checks in one process:
//   HALIAX_VENDOR_KERNELS=0          every family runs its portable kernel ("none" also works)
//   HALIAX_VENDOR_KERNELS=gemm,softmax  only these families may use a specialisation (unset, "1" or "all": every
//                                    family may)
//   haliax::kernels::portable_scope off{haliax::kernels::family::attention};   // until the scope ends
// A family switched off runs its portable kernel; host code still reads host arrays in place (unlike
// HALIAX_PORTABLE_KERNELS=1, which makes a host build behave as a device build throughout). Results of the two
// implementations agree within each family's tolerance (bitwise for the elementwise, optimizer and reduction
// orders that are fixed by shape; see docs/haliax.md, "Kernels and the vendor seam").
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <string_view>

namespace haliax::kernels {

/// The op families that have a dispatch point.
enum class family : int { gemm = 0, attention, softmax, cross_entropy, elementwise, optimizer };
inline constexpr int family_count = 6;

/// Which implementation a dispatch chose: the portable Kokkos kernel, a host-tuned one (ISA loops, OpenBLAS,
/// oneDNN, the thread pool) or a device vendor library (cuBLAS; cuDNN later).
enum class impl : int { portable = 0, host = 1, vendor = 2 };
inline constexpr int impl_count = 3;

inline constexpr const char* family_name(family f) {
  constexpr const char* names[family_count] = {"gemm",          "attention",   "softmax",
                                               "cross_entropy", "elementwise", "optimizer"};
  return names[static_cast<int>(f)];
}
inline constexpr const char* impl_name(impl i) {
  constexpr const char* names[impl_count] = {"portable", "host", "vendor"};
  return names[static_cast<int>(i)];
}

/// A set of families, one bit each.
using family_mask = std::uint32_t;
inline constexpr family_mask all_families = (family_mask{1} << family_count) - 1;
inline constexpr family_mask bit(family f) { return family_mask{1} << static_cast<int>(f); }

/// The families a value of HALIAX_VENDOR_KERNELS lets use a specialisation: null, "", "1" or "all" give every
/// family, "0" or "none" none, and a comma-separated list of family names those. Anything else throws
/// std::invalid_argument naming the word and the family names.
inline family_mask parse_vendor_kernels(const char* value) {
  if (value == nullptr) return all_families;
  const std::string_view v(value);
  if (v.empty() || v == "1" || v == "all") return all_families;
  if (v == "0" || v == "none") return 0;
  family_mask mask = 0;
  std::size_t start = 0;
  while (start <= v.size()) {
    const std::size_t comma = std::min(v.find(',', start), v.size());
    const std::string_view word = v.substr(start, comma - start);
    bool found = false;
    for (int i = 0; i < family_count; ++i) {
      if (word == family_name(static_cast<family>(i))) {
        mask |= family_mask{1} << i;
        found = true;
      }
    }
    if (!found) {
      std::string names;
      for (int i = 0; i < family_count; ++i) names += std::string(i ? ", " : "") + family_name(static_cast<family>(i));
      throw std::invalid_argument("HALIAX_VENDOR_KERNELS=" + std::string(v) + ": '" + std::string(word) +
                                  "' is not a kernel family; use 1 (every family may use its host or vendor "
                                  "kernels), 0 (only portable kernels) or a comma-separated list of: " +
                                  names);
    }
    start = comma + 1;
  }
  return mask;
}

namespace detail_ {
/// The environment's mask, parsed once per process. A bad value throws at every dispatch (so the first kernel
/// reports it, and a caller that catches it cannot go on with a half-read setting).
inline family_mask environment_mask() {
  static const char* const raw = std::getenv("HALIAX_VENDOR_KERNELS");
  static const std::string value = raw ? raw : "";
  static const std::int64_t parsed = [] {
    try {
      return static_cast<std::int64_t>(parse_vendor_kernels(raw ? value.c_str() : nullptr));
    } catch (const std::invalid_argument&) {
      return std::int64_t{-1};
    }
  }();
  if (parsed < 0) return parse_vendor_kernels(value.c_str());  // throws the message
  return static_cast<family_mask>(parsed);
}
/// The innermost scope's mask, or -1 for none (the environment decides).
inline std::int64_t& scope_mask() {
  static std::int64_t value = -1;
  return value;
}
/// How many times each (family, implementation) was dispatched in this process.
inline std::array<std::atomic<std::int64_t>, family_count * impl_count>& dispatch_table() {
  static std::array<std::atomic<std::int64_t>, family_count * impl_count> table{};
  return table;
}
}  // namespace detail_

/// Whether family `f` may run a specialisation (host-tuned or vendor) rather than its portable kernel.
inline bool specialised(family f) {
  const std::int64_t s = detail_::scope_mask();
  const family_mask m = s >= 0 ? static_cast<family_mask>(s) : detail_::environment_mask();
  return (m & bit(f)) != 0;
}

/// Runs the listed families (or, with no list, every family) on their portable kernels until the scope ends; the
/// other families keep what the enclosing scope or the environment allows. Not thread-safe: set it between ops,
/// not while they run.
class portable_scope {
 public:
  /// Every family portable.
  portable_scope() : saved_(detail_::scope_mask()) { detail_::scope_mask() = 0; }
  /// The listed families portable; the others as they were.
  portable_scope(std::initializer_list<family> families) : saved_(detail_::scope_mask()) {
    family_mask m = current();
    for (family f : families) m &= ~bit(f);
    detail_::scope_mask() = m;
  }
  ~portable_scope() { detail_::scope_mask() = saved_; }
  portable_scope(const portable_scope&) = delete;
  portable_scope& operator=(const portable_scope&) = delete;

 private:
  static family_mask current() {
    const std::int64_t s = detail_::scope_mask();
    return s >= 0 ? static_cast<family_mask>(s) : detail_::environment_mask();
  }
  std::int64_t saved_;
};

/// Records that a dispatch point chose `i` for `f` (a relaxed atomic add; the device kit and tests read it).
inline void note(family f, impl i) {
  detail_::dispatch_table()[static_cast<int>(f) * impl_count + static_cast<int>(i)].fetch_add(
      1, std::memory_order_relaxed);
}

/// Dispatches so far in this process, per family and implementation.
struct dispatch_counts {
  std::array<std::int64_t, family_count * impl_count> n{};
  std::int64_t operator()(family f, impl i) const { return n[static_cast<int>(f) * impl_count + static_cast<int>(i)]; }
  dispatch_counts operator-(const dispatch_counts& o) const {
    dispatch_counts d;
    for (std::size_t i = 0; i < n.size(); ++i) d.n[i] = n[i] - o.n[i];
    return d;
  }
};
inline dispatch_counts dispatched() {
  dispatch_counts c;
  for (std::size_t i = 0; i < c.n.size(); ++i) c.n[i] = detail_::dispatch_table()[i].load(std::memory_order_relaxed);
  return c;
}

}  // namespace haliax::kernels
