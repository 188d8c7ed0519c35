// levanter/lora.hpp: LoRA (upstream `levanter.lora`, https://arxiv.org/abs/2106.09685) for any model built from
// haliax::nn::Linear layers: low-rank adapters beside the Linear layers a config names, trained while the model they
// adapt stays frozen, and exported as a PEFT adapter or merged into the model.
//
//   auto spec = levanter::lora::make_spec(model, cfg.lora);      // which Linear layers, their sizes, alpha / r
//   auto p = levanter::lora::init(spec, key);                    // A drawn as a Linear's weight, B zero
//   auto loss = compute_next_token_loss(levanter::lora::merged(model, p, spec), mc, example);   // d loss / d p
//   levanter::lora::save_peft<M>(p, spec, cfg.lora, "base/dir", "out/peft");  // adapter_config.json + safetensors
//
// Every adapted Linear (weight {layers..., in..., out...}, or out before in) gets, for each of its stacked layers, A
// {LORA_R, in} and B {out, R} with the Linear's inputs and outputs flattened (PEFT's lora_A / lora_B). The model
// the forward sees is W + (alpha / r) B·A for each adapted weight: `merged` builds it with haliax ops, so the
// gradient of a loss of the merged model reaches A and B (and nothing else: the base is not tracked), and the merged
// Hugging Face export is the same function. The trainable tree, `lora::params`, is one type for every model: the
// Trainer, its optimizers and checkpoints are compiled once for it (src/main/lora_lm.cpp).
//
// Which layers (upstream LoraConfig.target_modules, matched against the module's path from the root, e.g.
// `transformer.layers.stacked.self_attn.q_proj`): none given, every Linear; a list, those whose path ends with an
// entry; a string, a regular expression matched at the start of the path (Python's re.match).
//
// With `dropout` > 0 a training forward also runs the adapters beside each Linear call, on the Linear's input with
// dropout (upstream's LoraLinear): `dropout_side`, in force as the thread's ambient value.
//
// A difference from upstream, on purpose: B starts at zero (PEFT's and the paper's initialisation, so step 0 is the
// model being adapted; upstream draws B as a Linear's weight, which moves a pretrained model by about as much as its
// own weights at step 0).
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include <boost/hana/accessors.hpp>
#include <boost/hana/define_struct.hpp>
#include <boost/hana/for_each.hpp>

#include <haliax/nn/linear.hpp>
#include <haliax/ops/dot.hpp>
#include <haliax/ops/elementwise.hpp>
#include <haliax/ops/layout.hpp>
#include <haliax/random.hpp>
#include <haliax/tree.hpp>
#include <levanter/compat/hf.hpp>
#include <levanter/config/types.hpp>
#include <levanter/config/validate.hpp>

namespace levanter {

/// upstream LoraConfig (src/levanter/lora.py).
struct LoraConfig {
  /// none: every Linear; a list: modules whose path ends with one of them; a string: a regex matched at the start
  std::optional<std::variant<std::vector<std::string>, std::string>> target_modules;
  std::int64_t r = 8;
  double alpha = 8.0;
  double dropout = 0.0;
};

void validate(config::validator& v, const LoraConfig& c, const std::string& prefix = "lora");

}  // namespace levanter

template <>
struct levanter::config::schema<levanter::LoraConfig> {
  using T = levanter::LoraConfig;
  static constexpr auto fields = std::make_tuple(
      field("target_modules", &T::target_modules,
            "Linear modules to adapt: null (every one), a list (paths ending with an entry, e.g. [q_proj, v_proj]) or "
            "a regular expression matched at the start of the path"),
      field("r", &T::r, "rank of the adapters"),
      field("alpha", &T::alpha, "scale: the adapter adds alpha / r * B.A to the weight"),
      field("dropout", &T::dropout, "dropout on the adapters' input in training"));
};

namespace levanter::lora {

namespace hax = haliax;

inline constexpr struct LoraLayers final : hax::axis<"lora_layers"> {
} LoraLayers;
inline constexpr struct R final : hax::axis<"LORA_R"> {
} R;
inline constexpr struct LoraIn final : hax::axis<"lora_in"> {
} LoraIn;
inline constexpr struct LoraOut final : hax::axis<"lora_out"> {
} LoraOut;

/// One adapted Linear: per stacked layer (one when the Linear is not stacked) A {R, in} and B {out, R}.
struct adapter {
  BOOST_HANA_DEFINE_STRUCT(adapter, (hax::named_array<float, hax::axes<LoraLayers, R, LoraIn>>, lora_A),
                           (hax::named_array<float, hax::axes<LoraLayers, LoraOut, R>>, lora_B));
};

/// What LoRA trains: the adapters, in the order of `spec::targets`.
struct params {
  BOOST_HANA_DEFINE_STRUCT(params, (std::vector<adapter>, adapters));
};

/// One adapted Linear of the model.
struct target {
  std::string module;           ///< its path from the root (`transformer.layers.stacked.self_attn.q_proj`)
  std::int64_t layers = 1;      ///< stacked layers (1 when not stacked)
  std::int64_t in = 0, out = 0;  ///< the products of its input and output sizes
  bool out_first = false;       ///< the weight is {out, in} (torch's nn.Linear) rather than {in, out} (GPT-2's Conv1D)
};

/// The adapted Linears of a model and the adapters' rank and scale.
struct spec {
  std::vector<target> targets;
  std::int64_t r = 8;
  double scale = 1.0;  ///< alpha / r
};

/// Does `module` (a Linear's path) match target_modules (upstream LoraConfig.matches_target)?
bool matches_target(const LoraConfig& c, const std::string& module);

/// The adapters' initial values (upstream draws A as a Linear from in to R: truncated normal on (-3, 3) over
/// sqrt(in)); B is zero. Target t draws from fold_in(key, t), its layers from split(that, layers).
params init(const spec& s, hax::random::key key);

/// The number of trainable values.
std::int64_t parameter_count(const spec& s);

/// PEFT's adapter_config.json for `s`: target_modules the Hugging Face module names adapted (`hf_modules`),
/// fan_in_fan_out when the weights are GPT-2's {in, out}.
std::string peft_config_json(const spec& s, const LoraConfig& c, const std::string& base_model,
                             const std::vector<std::string>& hf_modules);

/// Writes `<dir>/adapter_config.json` and `<dir>/adapter_model.safetensors` (`base_model.model.<hf module>.lora_A.weight`
/// {r, in} and `lora_B.weight` {out, r} per layer); `hf_module_patterns[t]` is target t's Hugging Face module name
/// with "{i}" for its layer.
void write_peft(const params& p, const spec& s, const LoraConfig& c, const std::string& base_model,
                const std::vector<std::string>& hf_module_patterns, const std::string& dir);

namespace detail {

template <class T>
inline constexpr bool is_linear_v = false;
template <class In, class Out, class Pre, class T, bool OutFirst>
inline constexpr bool is_linear_v<hax::nn::Linear<In, Out, Pre, T, OutFirst>> = true;

template <class T>
struct linear_shape;
template <auto... I, auto... O, class Pre, class T, bool OutFirst>
struct linear_shape<hax::nn::Linear<hax::axes<I...>, hax::axes<O...>, Pre, T, OutFirst>> {
  static constexpr std::size_t n_in = sizeof...(I), n_out = sizeof...(O), n_pre = Pre::rank;
  static constexpr bool out_first = OutFirst;
  static constexpr bool is_float = std::is_same_v<T, float>;
};

/// Calls f(path, linear) for every haliax::nn::Linear of `m`, in the order haliax::tree visits leaves.
template <class M, class F>
void visit_linears(M& m, const std::string& prefix, F& f) {
  using T = std::remove_const_t<M>;
  if constexpr (is_linear_v<T>) {
    f(prefix, m);
  } else if constexpr (hax::is_named_array_v<T>) {
  } else if constexpr (hax::tree::detail::is_optional_v<T>) {
    if (m) visit_linears(*m, prefix, f);
  } else if constexpr (hax::tree::detail::is_vector_v<T>) {
    for (std::size_t i = 0; i < m.size(); ++i) visit_linears(m[i], hax::tree::detail::join(prefix, std::to_string(i)), f);
  } else if constexpr (boost::hana::Struct<T>::value) {
    boost::hana::for_each(boost::hana::accessors<T>(), [&](auto pair) {
      auto& field = boost::hana::second(pair)(m);
      visit_linears(field, hax::tree::detail::join(prefix, boost::hana::to<const char*>(boost::hana::first(pair))), f);
    });
  }
}

}  // namespace detail

/// The Linears of `model` that `c` adapts. Throws config::config_error when none matches (listing the model's).
template <class M>
spec make_spec(const M& model, const LoraConfig& c) {
  spec s;
  s.r = c.r;
  s.scale = c.alpha / static_cast<double>(c.r);
  std::vector<std::string> all;
  auto visit = [&](const std::string& path, const auto& lin) {
    using L = std::remove_cvref_t<decltype(lin)>;
    using S = detail::linear_shape<L>;
    if constexpr (S::is_float) {
      all.push_back(path);
      if (!matches_target(c, path)) return;
      const auto sz = lin.weight.sizes();
      target t;
      t.module = path;
      t.out_first = S::out_first;
      std::size_t k = 0;
      for (; k < S::n_pre; ++k) t.layers *= sz[k];
      std::int64_t first = 1, second = 1;
      const std::size_t n_first = S::out_first ? S::n_out : S::n_in;
      for (std::size_t j = 0; j < n_first; ++j) first *= sz[k++];
      for (; k < sz.size(); ++k) second *= sz[k];
      t.in = S::out_first ? second : first;
      t.out = S::out_first ? first : second;
      s.targets.push_back(std::move(t));
    }
  };
  detail::visit_linears(model, "", visit);
  if (s.targets.empty()) {
    std::string list;
    for (const auto& a : all) list += (list.empty() ? "" : ", ") + a;
    throw config::config_error("lora.target_modules matches none of the model's Linear modules (" + list + ")");
  }
  return s;
}

/// `base` with W + scale · B·A in place of every adapted weight. Differentiable in `p` (the base is not tracked).
template <class M>
M merged(const M& base, const params& p, const spec& s) {
  if (p.adapters.size() != s.targets.size())
    throw std::invalid_argument("lora::merged: " + std::to_string(p.adapters.size()) + " adapters for " +
                                std::to_string(s.targets.size()) + " target modules");
  M out = base;
  std::size_t i = 0;
  auto visit = [&](const std::string& path, auto& lin) {
    using L = std::remove_cvref_t<decltype(lin)>;
    using S = detail::linear_shape<L>;
    if constexpr (S::is_float) {
      if (i >= s.targets.size() || s.targets[i].module != path) return;
      const adapter& a = p.adapters[i++];
      using W = typename L::weight_type;
      const float scale = static_cast<float>(s.scale);
      if constexpr (S::out_first) {
        auto d = hax::dot<hax::axes<LoraLayers, LoraOut, LoraIn>>(a.lora_B, a.lora_A, R);
        lin.weight = hax::add(lin.weight, hax::detail::layout::reinterpret<typename W::axes_type>(hax::multiply(d, scale),
                                                                                     lin.weight.sizes()));
      } else {
        auto d = hax::dot<hax::axes<LoraLayers, LoraIn, LoraOut>>(a.lora_B, a.lora_A, R);
        lin.weight = hax::add(lin.weight, hax::detail::layout::reinterpret<typename W::axes_type>(hax::multiply(d, scale),
                                                                                     lin.weight.sizes()));
      }
    }
  };
  detail::visit_linears(out, "", visit);
  if (i != s.targets.size())
    throw std::invalid_argument("lora::merged: the model has no Linear '" + s.targets[i].module + "'");
  return out;
}

/// Where an adapted Linear's weight lies in a model: a layer's view of it starts at `data + i * per_layer`.
struct weight_range {
  const float* data = nullptr;
  std::int64_t per_layer = 0, layers = 1;
};

/// The adapted weights of `model` (targets of `s`, in order): what identifies them when they are applied.
template <class M>
std::vector<weight_range> adapted_weights(const M& model, const spec& s) {
  std::vector<weight_range> out;
  std::size_t i = 0;
  auto visit = [&](const std::string& path, const auto& lin) {
    using S = detail::linear_shape<std::remove_cvref_t<decltype(lin)>>;
    if constexpr (S::is_float) {
      if (i >= s.targets.size() || s.targets[i].module != path) return;
      const std::int64_t layers = s.targets[i++].layers;
      out.push_back({lin.weight.data(), lin.weight.element_count() / layers, layers});
    }
  };
  detail::visit_linears(model, "", visit);
  if (i != s.targets.size())
    throw std::invalid_argument("lora::adapted_weights: the model has no Linear '" + s.targets[i].module + "'");
  return out;
}

/// The key of target t's dropout mask in layer `layer`, from a forward pass's dropout key.
hax::random::key dropout_key(hax::random::key k, std::size_t target, std::int64_t layer);

/// The training forward's adapters with dropout (lora.dropout > 0), as upstream's LoraLinear: every adapted Linear
/// adds scale · B·A·dropout(x) to W·x + b. In force as the thread's ambient value (haliax/ambient.hpp) over
/// `merged(model, p, s)`, whose weights `ranges` locates (adapted_weights), it adds scale · B·A·(dropout(x) - x)
/// beside each adapted Linear's merged weight, which is the same sum. Targets no Linear call applies (an LM head
/// the loss reads as a matrix) keep the merged form, without dropout. Masks come from
/// dropout_key(key, target, layer): a recomputation (gradient checkpointing) draws the same ones. `applied`, when
/// given, counts each target's applications (a layer recomputed counts again).
std::shared_ptr<const hax::nn::linear_side> dropout_side(std::vector<weight_range> ranges, const params& p,
                                                         const spec& s, double dropout, hax::random::key key,
                                                         std::shared_ptr<std::vector<std::int64_t>> applied = nullptr);

/// Each target's Hugging Face module path in the torch model, "{i}" standing for the layer (M's hf_adapter's
/// hf_name, after its `module_prefix` when it has one).
template <hf::HfConvertible M>
std::vector<std::string> hf_module_patterns(const spec& s) {
  std::vector<std::string> out;
  for (const auto& t : s.targets) {
    std::string n = hf::hf_adapter<M>::hf_name(t.module + ".weight");
    if (n.size() < 7 || n.compare(n.size() - 7, 7, ".weight") != 0)
      throw hf::error("LoRA: '" + t.module + "' has no Hugging Face Linear weight (its name is '" + n + "')");
    std::string prefix;  // the torch module path of a name its files store without it (GPT-2's `transformer.`)
    if constexpr (requires { hf::hf_adapter<M>::module_prefix; }) prefix = hf::hf_adapter<M>::module_prefix;
    out.push_back(prefix + n.substr(0, n.size() - 7));
  }
  return out;
}

/// PEFT export (upstream save_peft_pretrained): `dir`/adapter_config.json and adapter_model.safetensors.
template <hf::HfConvertible M>
void save_peft(const params& p, const spec& s, const LoraConfig& c, const std::string& base_model,
               const std::string& dir) {
  write_peft(p, s, c, base_model, hf_module_patterns<M>(s), dir);
}

}  // namespace levanter::lora
