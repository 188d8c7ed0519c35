// levanter/optim/layout.hpp: how an optimizer's state lies over the flattened parameters, whatever the optimizer.
// The parameters' leaves, flattened in tree order, are cut into fixed chunks (2^15 elements, never straddling a
// leaf or a Stacked layer); every optimizer runs its element loop chunk by chunk and sums norms per chunk, then in
// chunk order, so results do not depend on the thread count. ZeRO-1 and FSDP give each rank a range of the flat
// parameters that falls on chunk boundaries (`shard_bounds`), so a rank computes its chunks exactly as one process
// would, and the norms gathered in chunk order are the same whatever the rank count.
//
//   auto leaves = levanter::optim::layout::param_leaves(model);     // pointers, sizes, paths, layer slices
//   auto chunks = levanter::optim::layout::make_chunks(leaves);
//   auto bounds = levanter::optim::layout::shard_bounds(model, ranks);  // rank r: [bounds[r], bounds[r+1])
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <optional>
#include <stdexcept>
#include <variant>
#include <vector>

#include <haliax/core.hpp>
#include <haliax/detail/portable.hpp>
#include <haliax/detail/thread_pool.hpp>
#include <haliax/tree.hpp>
#include <levanter/distributed/comm.hpp>
#include <levanter/distributed/device_copy.hpp>

#include "weight_decay.hpp"

namespace levanter::optim {

/// The last `capacity` values of a statistic, as a circular buffer with a validity mask (the float32 buffers of
/// upstream's SkipStepState and ClipUpdateNormState).
struct rolling_window {
  std::vector<float> values;
  std::vector<char> valid;
  int64_t index = 0;  ///< next slot to write
  int64_t count = 0;  ///< valid entries, at most capacity

  static rolling_window with_capacity(int64_t n) {
    rolling_window w;
    w.values.assign(static_cast<std::size_t>(n), 0.0f);
    w.valid.assign(static_cast<std::size_t>(n), 0);
    return w;
  }
  int64_t capacity() const { return static_cast<int64_t>(values.size()); }
  void push(double v) {
    values[static_cast<std::size_t>(index)] = static_cast<float>(v);
    valid[static_cast<std::size_t>(index)] = 1;
    index = (index + 1) % capacity();
    count = std::min(count + 1, capacity());
  }
  /// Mean over the valid entries (NaN when none, as jnp.mean with an empty `where`).
  double mean() const {
    double s = 0;
    int64_t n = 0;
    for (std::size_t i = 0; i < values.size(); ++i)
      if (valid[i]) s += values[i], ++n;
    return n ? s / static_cast<double>(n) : std::numeric_limits<double>::quiet_NaN();
  }
  /// Population standard deviation over the valid entries (jnp.std, ddof 0).
  double stddev() const {
    const double m = mean();
    double s = 0;
    int64_t n = 0;
    for (std::size_t i = 0; i < values.size(); ++i)
      if (valid[i]) s += (values[i] - m) * (values[i] - m), ++n;
    return n ? std::sqrt(s / static_cast<double>(n)) : std::numeric_limits<double>::quiet_NaN();
  }
  /// mean + sigma * max(std, 1e-6): upstream's threshold for both skip_bad_steps and clip_update_norm.
  double threshold(double sigma) const { return mean() + sigma * std::max(stddev(), 1e-6); }
  /// Whether there is enough history to act: count >= max(2, capacity / 2).
  bool ready() const { return count >= std::max<int64_t>(2, capacity() / 2); }
};

/// optimizer.skip_bad_steps resolved: true is upstream's SkipStepConfig, a number its history length, false or 0
/// no skipping (nullopt).
inline std::optional<SkipStepConfig> skip_steps_of(const OptimizerConfig& cfg) {
  std::optional<SkipStepConfig> skip;
  std::visit(
      [&](const auto& s) {
        using S = std::decay_t<decltype(s)>;
        if constexpr (std::is_same_v<S, bool>) {
          if (s) skip = SkipStepConfig{};
        } else if constexpr (std::is_same_v<S, int64_t>) {
          if (s != 0) skip = SkipStepConfig{s, SkipStepConfig{}.sigma_factor};  // an int is the history length
        } else {
          skip = s;
        }
      },
      cfg.skip_bad_steps);
  if (skip && skip->rolling_interval_length < 1)
    throw std::invalid_argument("optimizer.skip_bad_steps.rolling_interval_length: must be at least 1");
  return skip;
}

/// skip_bad_steps' decision for one step (upstream's SkipStepState): skipped when there is enough history and the
/// loss or the gradient norm is above mean + sigma_factor * std of the recent ones; both are recorded, skipped or not.
inline bool skip_step(const SkipStepConfig& cfg, rolling_window& losses, rolling_window& grad_norms, double loss,
                      double grad_norm) {
  const bool can_skip = losses.ready();
  const bool loss_ok = loss <= losses.threshold(cfg.sigma_factor);
  const bool norm_ok = grad_norm <= grad_norms.threshold(cfg.sigma_factor);
  losses.push(loss);
  grad_norms.push(grad_norm);
  return can_skip && !(loss_ok && norm_ok);
}


/// How an optimizer's work is split over ranks (ZeRO-1, FSDP): rank r updates the parameters of its range
/// [bounds[r], bounds[r+1]) of the flattened parameters and keeps only their state; the ranges fall on
/// chunk boundaries, so every chunk is computed exactly as on one rank, and the norms are summed over all chunks in
/// chunk order: the result does not depend on the rank count.
struct shard {
  distributed::communicator* comm = nullptr;
  std::vector<int64_t> bounds;
  int64_t lo() const { return bounds[static_cast<std::size_t>(comm->rank())]; }
  int64_t hi() const { return bounds[static_cast<std::size_t>(comm->rank()) + 1]; }
};

/// Tensor parallelism: leaves split over a model group (each rank holds a slice). The norms add the squares of the
/// split leaves over the group, the whole leaves once.
struct tensor_split {
  distributed::communicator* group = nullptr;
  std::vector<char> split;  // per leaf, in tree order
};

/// What one `adamw::update` did.
struct update_stats {
  double learning_rate = 0;  ///< schedule(count) used by this update (upstream `optim/learning_rate`)
  double grad_norm = 0;      ///< global L2 norm of the gradients, before clipping
  double update_norm = 0;    ///< global L2 norm of the change applied to the parameters (0 when skipped)
  bool skipped = false;      ///< skip_bad_steps rejected this step
};


namespace layout {

inline constexpr int64_t chunk_elems = int64_t{1} << 15;

struct leaf_ref {
  float* p;
  const float* g;
  float* m;
  float* v;
  int64_t n;
  int64_t slices;  // 1, or the product of the Stacked layer axes (update_rms_clipping is per slice)
  bool decay;
  std::string path;
};

struct chunk {
  std::size_t leaf;
  std::size_t slice;  // global slice index
  int64_t begin, end;
  int64_t flat;  // offset of `begin` in the parameters flattened in tree order
};

// The parameters' leaves (pointers to p only) in tree order.
template <class M>
std::vector<leaf_ref> param_leaves(M& params);

// Fixed chunks that never straddle a slice, so per-slice sums are chunk sums in order.
inline std::vector<chunk> make_chunks(const std::vector<leaf_ref>& leaves, std::size_t* slices = nullptr) {
  std::vector<chunk> chunks;
  std::size_t gs = 0;
  int64_t off = 0;
  for (std::size_t li = 0; li < leaves.size(); ++li) {
    const auto& l = leaves[li];
    const int64_t per = l.n / l.slices;
    for (int64_t s = 0; s < l.slices; ++s, ++gs)
      for (int64_t b = s * per; b < (s + 1) * per; b += chunk_elems)
        chunks.push_back({li, gs, b, std::min(b + chunk_elems, (s + 1) * per), off + b});
    off += l.n;
  }
  if (slices) *slices = gs;
  return chunks;
}

template <class L>
void check_float_leaf() {
  static_assert(std::is_same_v<typename std::remove_cvref_t<L>::value_type, float>,
                "levanter::optim: every parameter leaf must be a float32 named_array");
}

template <class M>
std::vector<leaf_ref> param_leaves(M& params) {
  std::vector<leaf_ref> leaves;
  for_each_leaf_info(params, [&](const leaf_info& info, auto& p) {
    check_float_leaf<decltype(p)>();
    int64_t slices = 1;
    for (int k = 0; k < info.stacked_depth && k < static_cast<int>(p.sizes().size()); ++k) slices *= p.sizes()[k];
    leaves.push_back({const_cast<float*>(p.data()), nullptr, nullptr, nullptr, p.element_count(),
                      std::max<int64_t>(slices, 1), false, info.path});
  });
  return leaves;
}

// Sum of squares per chunk, computed in parallel, returned in chunk order.
template <class F>
std::vector<double> per_chunk(std::size_t n, F&& f) {
  std::vector<double> out(n, 0.0);
  haliax::detail::thread_pool::instance().run(static_cast<int64_t>(n),
                                              [&](int64_t i) { out[static_cast<std::size_t>(i)] = f(i); });
  return out;
}

/// A tree of zeros shaped like `params`.
template <class M>
M zeros_like(const M& params) {
  return haliax::tree::map(params, [](const std::string&, const auto& p) {
    check_float_leaf<decltype(p)>();
    auto z = std::remove_cvref_t<decltype(p)>::allocate(p.sizes(), "levanter::optim::state");
    if (haliax::detail::host_reads_arrays()) {
      std::fill_n(z.data(), z.element_count(), 0.0f);
    } else {
      Kokkos::deep_copy(Kokkos::View<float*, haliax::memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(
                            z.data(), static_cast<std::size_t>(z.element_count())),
                        0.0f);
    }
    return z;
  });
}

/// Rank ranges of the flattened parameters for `ranks` ranks, on chunk boundaries, each as close to an equal
/// share as the chunks allow.
template <class M>
std::vector<int64_t> shard_bounds(const M& params, int ranks) {
  const auto leaves = param_leaves(const_cast<M&>(params));
  const auto chunks = make_chunks(leaves);
  int64_t total = 0;
  for (const auto& l : leaves) total += l.n;
  std::vector<int64_t> b(static_cast<std::size_t>(ranks) + 1, total);
  b[0] = 0;
  std::size_t c = 0;
  for (int r = 1; r < ranks; ++r) {
    const int64_t target = total / ranks * r + (total % ranks) * r / ranks;
    while (c < chunks.size() && chunks[c].flat < target) ++c;
    // the chunk start nearest the target (the previous one when it is closer)
    int64_t here = c < chunks.size() ? chunks[c].flat : total;
    if (c > 0 && target - chunks[c - 1].flat < here - target) here = chunks[c - 1].flat;
    b[static_cast<std::size_t>(r)] = std::max(here, b[static_cast<std::size_t>(r) - 1]);
  }
  return b;
}

// Every rank's range of the updated parameters to every rank (through one flat buffer).
inline void gather_params(const std::vector<leaf_ref>& leaves, const shard& sh) {
  if (sh.comm->size() == 1) return;
  const int64_t total = sh.bounds.back();
  std::vector<float> flat(static_cast<std::size_t>(total));
  auto each = [&](int64_t lo, int64_t hi, auto&& copy) {
    int64_t off = 0;
    for (const auto& l : leaves) {
      const int64_t b = std::max(lo, off), e = std::min(hi, off + l.n);
      if (b < e) copy(l.p + (b - off), flat.data() + b, e - b);
      off += l.n;
    }
  };
  // The parameters are in the arrays' memory space, the collective's buffer in host memory.
  each(sh.lo(), sh.hi(), [](float* p, float* f, int64_t n) { distributed::device_copy::to_host(p, f, n); });
  distributed::allgather_ranges(*sh.comm, flat.data(), sh.bounds);
  each(0, total, [](float* p, float* f, int64_t n) { distributed::device_copy::from_host(f, p, n); });
}

}  // namespace layout
}  // namespace levanter::optim
