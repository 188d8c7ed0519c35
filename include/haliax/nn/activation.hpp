// haliax/nn/activation.hpp: the activation functions by their upstream config names: the one registry.
//
//   auto a = haliax::nn::find_activation("gelu_new");      // std::optional<activation>
//   haliax::nn::activation_names();                        // "relu, gelu, gelu_new, quick_gelu, silu, swish"
//
// Everything that accepts an activation name (Mlp, the GPT-2 config validator, HF import) asks this table, so
// the accepted names and the names listed in messages cannot drift apart.
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace haliax::nn {

/// The activations `Mlp` applies (nn/functions.hpp has the functions themselves).
enum class activation { relu, gelu, gelu_new, quick_gelu, silu };

/// One accepted name and the activation it selects.
struct activation_entry {
  std::string_view name;
  activation value;
};

/// Every accepted name, in the order messages list them. `swish` is upstream's other name for silu; the first
/// entry of an activation is its canonical name. There is deliberately no `tanh`: Mlp has no tanh activation.
inline constexpr std::array<activation_entry, 6> activation_table{{
    {"relu", activation::relu},
    {"gelu", activation::gelu},
    {"gelu_new", activation::gelu_new},
    {"quick_gelu", activation::quick_gelu},
    {"silu", activation::silu},
    {"swish", activation::silu},
}};

/// The activation called `name` (upstream `activation_function: gelu_new`), or nothing if no entry has it.
constexpr std::optional<activation> find_activation(std::string_view name) {
  for (const auto& e : activation_table)
    if (e.name == name) return e.value;
  return std::nullopt;
}

/// The canonical name of `a` (its first entry): `activation_name(activation::silu) == "silu"`.
constexpr std::string_view activation_name(activation a) {
  for (const auto& e : activation_table)
    if (e.value == a) return e.name;
  return "?";
}

/// The accepted names joined for messages: "relu, gelu, gelu_new, quick_gelu, silu, swish".
constexpr std::string activation_names() {
  std::string s;
  for (std::size_t i = 0; i < activation_table.size(); ++i) {
    if (i) s += ", ";
    s += activation_table[i].name;
  }
  return s;
}

/// Parses an upstream activation name; throws `std::invalid_argument` naming the valid ones.
inline activation activation_from_name(std::string_view name) {
  if (auto a = find_activation(name)) return *a;
  throw std::invalid_argument("haliax::nn: unknown activation '" + std::string(name) + "' (valid: " +
                              activation_names() + ")");
}

}  // namespace haliax::nn
