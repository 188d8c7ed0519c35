// levanter/optim/weight_decay.hpp: which parameters AdamW decays (upstream
// `OptimizerConfig.build_weight_decay_mask`, src/levanter/optim/config.py), and the leaf traversal it needs.
//
//   levanter::AdamConfig cfg;                                   // default mask: spare norms, embeddings, biases
//   auto mask = levanter::optim::weight_decay_mask(cfg, model);  // nullopt: every leaf decays
//   auto names = levanter::optim::decayed_paths(cfg, model);     // "transformer.blocks.stacked.attn.c_attn.weight", ...
//
// Every leaf is matched against two paths, as upstream: the path from the root (`transformer.h.0.mlp.c_fc.weight`)
// and the class path from its nearest enclosing module (`Linear.weight`), made from the module's
// `static constexpr std::string_view class_name` (haliax's nn modules carry upstream's class names). A module
// without `class_name` gives its own leaves no class path (only the root path is matched for them).
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <regex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <boost/hana/accessors.hpp>
#include <boost/hana/concept/struct.hpp>
#include <boost/hana/first.hpp>
#include <boost/hana/for_each.hpp>
#include <boost/hana/second.hpp>
#include <boost/hana/string.hpp>
#include <haliax/core.hpp>
#include <haliax/nn/stacked.hpp>
#include <haliax/tree.hpp>

#include "config.hpp"

namespace haliax::nn {
template <class In, class Out, class Pre, class T, bool OutFirst>
struct Linear;  // haliax/nn/linear.hpp
}  // namespace haliax::nn

namespace levanter::optim {

/// What the optimizer knows about one parameter leaf, beyond its array.
struct leaf_info {
  std::string path;                       ///< from the root, upstream field names joined by '.'
  std::optional<std::string> class_path;  ///< `<class_name>.<path inside that module>` of the nearest module
  int stacked_depth = 0;                  ///< leading axes that are `haliax::nn::Stacked` layer axes
  /// Set for the `weight` of a `haliax::nn::Linear`: how many of its axes are inputs and outputs, and whether the
  /// outputs come first (the rest, leading, are Stacked layer axes). Muon, Scion and Adam-mini group by it.
  struct linear_weight {
    int in_axes = 0, out_axes = 0;
    bool out_first = false;
  };
  std::optional<linear_weight> linear;
};

namespace detail::wd {

template <class T>
inline constexpr bool is_stacked_v = false;
template <auto L, template <class> class B>
inline constexpr bool is_stacked_v<haliax::nn::Stacked<L, B>> = true;

template <class T>
struct linear_traits {
  static constexpr bool value = false;
};
template <auto... I, auto... O, class Pre, class T, bool OutFirst>
struct linear_traits<haliax::nn::Linear<haliax::axes<I...>, haliax::axes<O...>, Pre, T, OutFirst>> {
  static constexpr bool value = true;
  static constexpr int in_axes = sizeof...(I), out_axes = sizeof...(O);
  static constexpr bool out_first = OutFirst;
};

template <class T>
concept HasClassName = requires {
  { T::class_name } -> std::convertible_to<std::string_view>;
};

inline std::optional<std::string> join(const std::optional<std::string>& p, const std::string& name) {
  if (!p) return std::nullopt;
  return p->empty() ? name : *p + "." + name;
}

// Same order as haliax::tree::for_each_leaf (declaration order; vectors by index; empty optionals skipped).
template <class M, class F>
void visit(M& m, const std::string& path, const std::optional<std::string>& cls, int depth, F& f,
           std::optional<leaf_info::linear_weight> lin = std::nullopt) {
  using T = std::remove_const_t<M>;
  if constexpr (haliax::is_named_array_v<T>) {
    f(leaf_info{path, cls, depth, lin}, m);
  } else if constexpr (haliax::tree::detail::is_optional_v<T>) {
    if (m) visit(*m, path, cls, depth, f);
  } else if constexpr (haliax::tree::detail::is_vector_v<T>) {
    for (std::size_t i = 0; i < m.size(); ++i)
      visit(m[i], haliax::tree::detail::join(path, std::to_string(i)), join(cls, std::to_string(i)), depth, f);
  } else if constexpr (boost::hana::Struct<T>::value) {
    std::optional<std::string> here;
    if constexpr (HasClassName<T>) here = std::string(T::class_name);
    const int inner = depth + (is_stacked_v<T> ? 1 : 0);
    boost::hana::for_each(boost::hana::accessors<T>(), [&](auto pair) {
      auto& field = boost::hana::second(pair)(m);
      const std::string name = boost::hana::to<const char*>(boost::hana::first(pair));
      std::optional<leaf_info::linear_weight> field_lin;
      if constexpr (linear_traits<T>::value)
        if (name == "weight")
          field_lin = leaf_info::linear_weight{linear_traits<T>::in_axes, linear_traits<T>::out_axes,
                                               linear_traits<T>::out_first};
      visit(field, haliax::tree::detail::join(path, name), join(here, name), inner, f, field_lin);
    });
  }
}

// Upstream's `reasonable_default`: false for norms, embeddings and biases, else "no opinion".
inline std::optional<bool> reasonable_default(const std::string& p) {
  for (const char* s : {"LayerNorm", "RMSNorm", "RmsNorm", "Embedding"})
    if (p.find(s) != std::string::npos) return false;
  if (p.size() >= 4 && p.compare(p.size() - 4, 4, "bias") == 0) return false;
  return std::nullopt;
}

}  // namespace detail::wd

/// Calls `f(info, leaf)` for every array leaf of `module` in haliax::tree order, with its root path, class path
/// and Stacked depth. `leaf` is mutable when `module` is.
template <class M, class F>
void for_each_leaf_info(M& module, F&& f) {
  detail::wd::visit(module, std::string(), std::nullopt, 0, f);
}

/// The `weight_decay_modules` / `default_weight_decay_mask` rule for one leaf, step by step as upstream: for the
/// root path then the class path, decay if the regex matches at the start of the path (Python `re.match`) or any
/// listed substring occurs in it; when the default mask is in use and nothing matched yet, the default
/// (no decay for `LayerNorm`, `RMSNorm`, `RmsNorm`, `Embedding`, or a path ending in `bias`) decides, the later
/// path overriding the earlier; with no verdict, decay iff the default mask is in use.
class weight_decay_rule {
 public:
  explicit weight_decay_rule(const OptimizerConfig& cfg) {
    const auto& mods = cfg.weight_decay_modules;
    has_modules_ = mods.has_value();
    use_default_ = cfg.default_weight_decay_mask.value_or(!has_modules_);
    no_mask_ = !has_modules_ && cfg.default_weight_decay_mask == false;
    if (has_modules_) {
      if (mods->is_list) {
        substrings_ = mods->items;
      } else {
        if (mods->items.size() != 1)
          throw std::invalid_argument("optimizer.weight_decay_modules: a string must be a single regex");
        try {
          regex_.emplace(mods->items.front(), std::regex::ECMAScript);
        } catch (const std::regex_error& e) {
          throw std::invalid_argument("optimizer.weight_decay_modules: invalid regex '" + mods->items.front() +
                                      "': " + e.what());
        }
      }
    }
  }

  /// Upstream builds no mask at all (every leaf decays): no modules given and default_weight_decay_mask false.
  bool is_unmasked() const { return no_mask_; }

  bool operator()(const leaf_info& leaf) const {
    if (no_mask_) return true;
    std::optional<bool> decay;
    const std::string* paths[2] = {&leaf.path, leaf.class_path ? &*leaf.class_path : nullptr};
    for (const std::string* p : paths) {
      if (!p) continue;
      if (regex_) {
        decay = decay.value_or(false) ||
                std::regex_search(*p, *regex_, std::regex_constants::match_continuous);
      } else if (has_modules_) {
        bool any = false;
        for (const auto& s : substrings_) any = any || p->find(s) != std::string::npos;
        decay = decay.value_or(false) || any;
      }
      if (use_default_ && !decay.value_or(false)) decay = detail::wd::reasonable_default(*p);
      if (decay.value_or(false)) break;
    }
    return decay.value_or(use_default_);
  }

 private:
  bool has_modules_ = false, use_default_ = true, no_mask_ = false;
  std::optional<std::regex> regex_;
  std::vector<std::string> substrings_;
};

/// One flag per leaf (haliax::tree order): whether AdamW decays it; nullopt when upstream builds no mask.
template <class M>
std::optional<std::vector<bool>> weight_decay_mask(const OptimizerConfig& cfg, const M& model) {
  weight_decay_rule rule(cfg);
  if (rule.is_unmasked()) return std::nullopt;
  std::vector<bool> mask;
  for_each_leaf_info(model, [&](const leaf_info& info, const auto&) { mask.push_back(rule(info)); });
  return mask;
}

/// The root paths of the decayed leaves, sorted (upstream logs them as the `decayed_weights` hyperparameter).
template <class M>
std::vector<std::string> decayed_paths(const OptimizerConfig& cfg, const M& model) {
  weight_decay_rule rule(cfg);
  std::vector<std::string> out;
  for_each_leaf_info(model, [&](const leaf_info& info, const auto&) {
    if (rule(info)) out.push_back(info.path);
  });
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace levanter::optim
