// levanter/models/registry.hpp: the `model:` section, one choice class per model type (`type: gpt2`), and the one
// place a program turns the config's choice into a model type. Everything below that point is generic over
// `LmModel` (models/lm.hpp).
//
//   return levanter::with_model(cfg.model, [&]<class M>(std::type_identity<M>, const typename M::config_type& mc) {
//     return run_something<M>(mc);
//   });
//
// Adding a model type: its line in models/builtin.hpp (from which `ModelChoice` follows), `model_of<Config>` beside
// the model, and its name removed from the refused ones below (docs/architecture.md, "Adding a model").
#pragma once

#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

#include <levanter/config/types.hpp>
#include <levanter/models/builtin.hpp>

namespace levanter {

namespace detail {
template <class Void, class... C>
struct model_choice_of {
  using type = config::Choice<C...>;
};
}  // namespace detail

/// `model:`: every `type:` config of models/builtin.hpp's list, in its order; other upstream model types are refused
/// by name (see unsupported_choices below). The Llama family's types (llama, mistral, qwen, qwen3, gemma, gemma2,
/// gemma3, olmo2) share one model (llama::LMHeadModel), whose config_type is LlamaConfig.
#define LEVANTER_MODEL_CONFIG_TYPES(M, C, stem, ...) , __VA_ARGS__
using ModelChoice = detail::model_choice_of<void LEVANTER_BUILTIN_MODELS(LEVANTER_MODEL_CONFIG_TYPES)>::type;
#undef LEVANTER_MODEL_CONFIG_TYPES

namespace detail {
// A recursion, not a fold over lambdas: clang 14 crashes instantiating the latter here.
template <class V, std::size_t I, class F>
void for_each_alternative(F& f) {
  if constexpr (I < std::variant_size_v<V>) {
    f(std::type_identity<std::variant_alternative_t<I, V>>{});
    for_each_alternative<V, I + 1>(f);
  }
}
}  // namespace detail

/// Calls `f(std::type_identity<C>{})` for every `model:` config type C of the model list, in its order.
template <class F>
void for_each_model_config(F&& f) {
  detail::for_each_alternative<decltype(ModelChoice{}.value), 0>(f);
}

/// The `type:` name of a model config (a config type shared by several types says which by its family).
template <class C>
std::string_view model_type_name(const C& c) {
  if constexpr (std::is_base_of_v<LlamaConfig, C>)
    return family_type_name(c.family);
  else
    return C::type_name;
}

/// The `model:` choice holding config `c`, under its own `type:` (a LlamaConfig of the mistral family becomes a
/// MistralConfig again): the listed config type deriving from LlamaConfig whose default family is c's.
template <class C>
ModelChoice as_model_choice(const C& c) {
  ModelChoice r;
  if constexpr (std::is_base_of_v<LlamaConfig, C>) {
    bool found = false;
    for_each_model_config([&]<class T>(std::type_identity<T>) {
      if constexpr (std::is_base_of_v<LlamaConfig, T>) {
        if (!found && T{}.family == c.family) {
          T t;
          static_cast<LlamaConfig&>(t) = c;
          r.value = t;
          found = true;
        }
      }
    });
  } else {
    r.value = c;
  }
  return r;
}

template <class C>
struct model_of;

/// The chosen config as a `C`, when it is one or derives from one (a `type: mistral` section is a LlamaConfig of the
/// mistral family, which the Llama model reads); null otherwise. Use this, not `get_if<C>`, with a model's
/// config_type: `get_if<LlamaConfig>` is null for every family but llama.
template <class C>
const C* model_config_as(const ModelChoice& choice) {
  return std::visit(
      [](const auto& x) -> const C* {
        if constexpr (std::is_base_of_v<C, std::remove_cvref_t<decltype(x)>>)
          return &x;
        else
          return nullptr;
      },
      choice.value);
}

/// Calls `f(std::type_identity<M>{}, config)` with the model type `M` of the chosen config. The model types'
/// definitions must be visible where this is instantiated (include their headers).
template <class F>
decltype(auto) with_model(const ModelChoice& choice, F&& f) {
  return std::visit(
      [&](const auto& mc) -> decltype(auto) {
        using M = typename model_of<std::remove_cvref_t<decltype(mc)>>::type;
        return f(std::type_identity<M>{}, mc);
      },
      choice.value);
}

}  // namespace levanter

template <>
struct levanter::config::unsupported_choices<levanter::ModelChoice> {
  static constexpr auto names = std::to_array<unsupported_choice>({
      {"whisper", "use type: gpt2 or llama"}, {"gpt2_hyena", "use type: gpt2"}, {"backpack", "use type: gpt2"},
      {"mpt", "use type: gpt2 or llama"},
  });
};
