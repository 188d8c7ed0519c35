// levanter/models/registry.hpp: the `model:` section, one choice class per model type (`type: gpt2`), and the one
// place a program turns the config's choice into a model type. Everything below that point is generic over
// `LmModel` (models/lm.hpp).
//
//   return levanter::with_model(cfg.model, [&]<class M>(std::type_identity<M>, const typename M::config_type& mc) {
//     return run_something<M>(mc);
//   });
//
// Adding a model type: its config to `ModelChoice`, `model_of<Config>` beside the model, and its name removed from
// the refused ones below (docs/architecture.md, "Adding a model").
#pragma once

#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

#include <levanter/config/types.hpp>
#include <levanter/models/gpt2_config.hpp>

namespace levanter {

/// `model:`; other upstream model types are refused by name (see unsupported_choices below).
using ModelChoice = config::Choice<Gpt2Config>;

template <class C>
struct model_of;

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
  static constexpr unsupported_choice names[] = {
      {"llama", "use type: gpt2"},      {"mistral", "use type: gpt2"},  {"mixtral", "use type: gpt2"},
      {"qwen", "use type: gpt2"},       {"qwen3", "use type: gpt2"},    {"olmo2", "use type: gpt2"},
      {"gemma", "use type: gpt2"},      {"gemma2", "use type: gpt2"},   {"gemma3", "use type: gpt2"},
      {"whisper", "use type: gpt2"},    {"gpt2_hyena", "use type: gpt2"}, {"backpack", "use type: gpt2"},
      {"mpt", "use type: gpt2"},
  };
};
