// levanter/layers/moe.hpp: the routing of a mixture-of-experts layer (upstream mixtral.py's MixtralSparseMoeBlock:
// `_route`, `_permute`, `_unpermute` and its auxiliary losses), for any model whose layers pick experts per token.
//
//   auto logits = block.gate(x_flat);                                    // {token, experts}
//   auto r = levanter::layers::route(logits, 2, 0.01, 0.001);             // top-2, the two auxiliary losses
//   auto xs = haliax::take(x_flat, Token, r.token_of_row);                // rows sorted by expert
//   auto ys = experts(xs, r.group_sizes);                                 // a grouped matmul (haliax/nn/moe.hpp)
//   auto y = haliax::sum(haliax::take(ys, TokenRepeat, r.row_of) * r.weights, TopExperts);   // {token, embed}
//
// Routing as upstream and transformers: router probabilities softmax(logits) over the experts, the top k of them
// (ties to the lower expert), renormalised to sum to one. Each (token, choice) pair is a row; the rows are sorted
// by expert with a counting sort that keeps (token, choice) order within an expert, so the dispatch, the grouped
// matmul and the weighted sum back are the same arithmetic at any thread count or rank count.
//
// The auxiliary losses (upstream's formulas, over the tokens given, summed over layers by the model):
//   load balancing  lbl_coef * sum_e f_e * P_e, f_e = (E / k) * (rows routed to e) / (tokens * k) (a count: no
//                   gradient), P_e = mean over tokens of the router probability of e
//   router z-loss   rzl_coef * mean over tokens of logsumexp(logits)^2
// Their values are returned; their gradients reach the router logits through the routing weights' backward, so a
// model adds them to its loss as constants (levanter::lm_aux) and they train the router even inside a layer that
// gradient checkpointing recomputes.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include <haliax/core.hpp>

namespace levanter {

/// The experts of a mixture-of-experts layer (upstream `experts`).
inline constexpr struct Experts final : haliax::axis<"experts"> {
} Experts;
/// The experts chosen for a token (upstream `top_experts`).
inline constexpr struct TopExperts final : haliax::axis<"top_experts"> {
} TopExperts;
/// Batch and position flattened (upstream `token`).
inline constexpr struct Token final : haliax::axis<"token"> {
} Token;
/// One row per (token, chosen expert), sorted by expert (upstream `token_repeat`).
inline constexpr struct TokenRepeat final : haliax::axis<"token_repeat"> {
} TokenRepeat;

namespace layers {

/// What `route` decided for a batch of tokens.
struct routing {
  haliax::named_array<float, haliax::axes<Token, TopExperts>> weights;       ///< renormalised, differentiable
  haliax::named_array<std::int32_t, haliax::axes<Token, TopExperts>> experts;  ///< the expert of each choice
  haliax::named_array<std::int32_t, haliax::axes<TokenRepeat>> token_of_row;  ///< the token a sorted row reads
  haliax::named_array<std::int32_t, haliax::axes<Token, TopExperts>> row_of;   ///< the sorted row of a choice
  std::vector<std::int64_t> group_sizes;  ///< rows per expert, in expert order
  double load_balancing = 0;              ///< lbl_coef * the load-balancing loss (0 without lbl_coef)
  double router_z = 0;                    ///< rzl_coef * the router z-loss (0 without rzl_coef)
  std::vector<double> loads;              ///< each expert's share of the rows (upstream expert_loads)
};

/// Routes each token of `logits` {token, experts} to its top `k` experts (see the header comment). Throws
/// std::invalid_argument when k is not in [1, experts].
routing route(const haliax::named_array<float, haliax::axes<Token, Experts>>& logits, int k,
              std::optional<double> lbl_coef, std::optional<double> rzl_coef);

}  // namespace layers
}  // namespace levanter
