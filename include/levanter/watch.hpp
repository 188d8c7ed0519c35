// levanter/watch.hpp: `trainer.watch` (upstream WatchCallback + summary_statistics_for_tree): norms and
// histograms of a parameter-shaped tree (grads, params, updates, optimizer moments), logged every `interval`
// steps under upstream's names:
//
//   <prefix>/norm/total                              the global L2 norm of the whole tree
//   <prefix>/norm/<path>                             one per parameter (include_per_parameter_norms)
//   <prefix>/norm/transformer.blocks.<i>.<path>      stacked blocks split per layer (split_scan_layers)
//   <prefix>/hist/<path>                             histograms (include_histograms; TensorBoard shows them)
//
// with prefix `grad`, `params`, `updates`, or `opt_state/mu`, `opt_state/nu`. Paths use '.' as upstream's key
// paths do. Norms are accumulated in double, in element order, so they do not depend on the thread count.
#pragma once

#include <cmath>
#include <cstdint>
#include <haliax/tree.hpp>
#include <levanter/tracker/tracker.hpp>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace levanter::watch {

/// What to compute for one tree (the fields of WatchConfig that matter here).
struct options {
  bool include_norms = true;
  bool include_per_parameter_norms = true;
  bool include_histograms = false;
  bool split_scan_layers = true;
};

/// `transformer.blocks.stacked.attn.c_attn.weight` (or with '/') -> (`transformer.blocks`, `attn.c_attn.weight`);
/// no stacked part -> (dotted path, "").
std::pair<std::string, std::string> split_stacked(const std::string& path);

/// Σ v², accumulated in double in element order.
double sum_squares(std::span<const float> v);

/// Logs the statistics of `tree` into `metrics` (norms) and `trk` (histograms) at `step`.
template <class M>
void summarize(const std::string& prefix, const M& tree, const options& o, json& metrics, tracker* trk,
               std::int64_t step) {
  double total = 0;
  haliax::tree::for_each_leaf(tree, [&](const std::string& name, const auto& leaf) {
    using L = std::remove_cvref_t<decltype(leaf)>;
    if constexpr (std::is_same_v<typename L::value_type, float>) {
      // Device memory (a CUDA build, or the device guard) is read through a host copy; host memory in place.
      std::vector<float> copy;
      const bool in_place = haliax::detail::host_reads_arrays();
      if (!in_place) copy = leaf.to_host();
      const std::span<const float> all(in_place ? leaf.data() : copy.data(),
                                       static_cast<std::size_t>(leaf.element_count()));
      const auto [outer, inner] = split_stacked(name);
      const auto names = L::axis_names();
      const bool per_layer =
          o.split_scan_layers && !inner.empty() && L::rank > 0 && names[0] == "layers" && leaf.sizes()[0] > 0;
      auto emit = [&](const std::string& key, std::span<const float> v) {
        const double ss = sum_squares(v);
        if (o.include_norms && o.include_per_parameter_norms) metrics[prefix + "/norm/" + key] = std::sqrt(ss);
        if (o.include_histograms && trk) {
          bool finite = true;
          for (float f : v) finite = finite && std::isfinite(f);
          if (finite)
            trk->log_histogram(prefix + "/hist/" + key, v, step);
          else
            metrics[prefix + "/hist_nonfinite/" + key] = 1;  // TensorBoard refuses NaN/inf histograms
        }
        return ss;
      };
      if (per_layer) {
        const auto layers = static_cast<std::size_t>(leaf.sizes()[0]);
        const std::size_t per = all.size() / layers;
        for (std::size_t i = 0; i < layers; ++i)
          total += emit(outer + "." + std::to_string(i) + "." + inner, all.subspan(i * per, per));
      } else {
        total += emit(inner.empty() ? outer : outer + "." + inner, all);
      }
    }
  });
  if (o.include_norms) metrics[prefix + "/norm/total"] = std::sqrt(total);
}

}  // namespace levanter::watch
