// levanter/models/lm.hpp: what every language model shares (upstream `models/lm_model.py`): the logical axes,
// a batch of token sequences (`lm_example`), the options of a forward pass, the next-token loss, and the
// `LmModel` concept a model type satisfies so that the Trainer, evaluation, the heatmap and the Hugging Face
// programs work with it unchanged.
//
//   static_assert(levanter::LmModel<levanter::gpt2::LMHeadModel>);
//   auto model = M::init(config, vocab, key);                         // parameters, upstream's init
//   auto loss = levanter::compute_next_token_loss(model, config, example, z_loss_weight, options);
//   auto logits = levanter::lm_logits(model, config, tokens, segment_ids);   // {batch, position, vocab}
//
// A model is a Boost.Hana struct of parameters (haliax/tree.hpp names its leaves for checkpoints, the optimizer
// and exports) with a config type; see docs/architecture.md ("Adding a model") for the whole recipe.
#pragma once

#include <concepts>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <boost/hana/concept/struct.hpp>
#include <haliax/core.hpp>
#include <haliax/nn/stacked.hpp>
#include <haliax/ops/elementwise.hpp>
#include <haliax/random.hpp>
#include <levanter/models/matmul_shape.hpp>

namespace levanter {

namespace hax = haliax;

// ---- the logical axes of language models (upstream names) ------------------------------------------------
inline constexpr struct Batch final : hax::axis<"batch"> {
} Batch;
inline constexpr struct Pos final : hax::axis<"position"> {
} Pos;
inline constexpr struct KeyPos final : hax::axis<"key_position"> {
} KeyPos;
inline constexpr struct Embed final : hax::axis<"embed"> {
} Embed;
inline constexpr struct Heads final : hax::axis<"heads"> {
} Heads;
inline constexpr struct HeadSize final : hax::axis<"head_size"> {
} HeadSize;
inline constexpr struct Mlp final : hax::axis<"mlp"> {
} Mlp;
/// `axes<Mlp>` named once here: in a scope where another `Mlp` is visible (Llama's MLP struct), nvcc's host pass
/// would re-resolve a spelled `axes<Mlp>` to that one.
using mlp_axes = haliax::axes<Mlp>;
inline constexpr struct Vocab final : hax::axis<"vocab"> {
} Vocab;
inline constexpr struct Layers final : hax::axis<"layers"> {
} Layers;

/// Token ids {batch, position} and the per-token int32 arrays that go with them (segment ids).
using token_batch = hax::named_array<std::int32_t, hax::axes<Batch, Pos>>;
/// Hidden states {batch, position, embed}: what a model's `activations` returns.
using lm_hidden = hax::named_array<float, hax::axes<Batch, Pos, Embed>>;
/// Logits {batch, position, vocab}.
using lm_logits_array = hax::named_array<float, hax::axes<Batch, Pos, Vocab>>;
/// A scalar (the loss).
using scalar = hax::named_array<float, hax::axes<>>;

/// Upstream `LmExample.causal(tokens, ignore_id, eos_id)` for a batch: the tokens, the loss mask (every position
/// but the last, and not where the next token is `ignore_id`) and segment ids (a new segment starts after each
/// EOS, so packed documents never attend to each other).
struct lm_example {
  token_batch tokens;
  hax::named_array<bool, hax::axes<Batch, Pos>> loss_mask;
  token_batch segment_ids;

  static lm_example causal(const token_batch& tokens, std::int64_t eos_id, std::int64_t ignore_id = -100);
  /// Tokens with a loss mask and segment ids given per token (row-major {batch, position}; packed supervised data:
  /// levanter/data/packing.hpp).
  static lm_example labelled(const token_batch& tokens, const std::vector<std::uint8_t>& keep,
                             const std::vector<std::int32_t>& segments);
};

/// The auxiliary losses a forward pass computed besides the hidden states (Mixtral's load-balancing loss and router
/// z-loss, already weighted by their coefficients), per layer. A layer writes its own entry, so a layer that gradient
/// checkpointing recomputes writes the same values again. Their gradients flow inside the model
/// (levanter/layers/moe.hpp); the loss adds their values.
struct lm_aux {
  std::vector<double> load_balancing;             ///< per layer (upstream train/load_balancing_loss is the sum)
  std::vector<double> router_z;                   ///< per layer (upstream train/router_z_loss is the sum)
  std::vector<std::vector<double>> expert_loads;  ///< per layer, each expert's share of the routed rows

  /// Records layer `i` of `layers`.
  void set(std::int64_t i, std::int64_t layers, double lbl, double rzl, std::vector<double> loads) {
    const auto n = static_cast<std::size_t>(layers), at = static_cast<std::size_t>(i);
    if (load_balancing.size() != n) {
      load_balancing.assign(n, 0.0);
      router_z.assign(n, 0.0);
      expert_loads.assign(n, {});
    }
    load_balancing[at] = lbl;
    router_z[at] = rzl;
    expert_loads[at] = std::move(loads);
  }
  /// What the loss adds: every layer's weighted losses, summed in layer order.
  double total() const {
    double s = 0;
    for (std::size_t i = 0; i < load_balancing.size(); ++i) s += load_balancing[i] + router_z[i];
    return s;
  }
};

/// Keys and values of the positions decoded so far, per sequence (batch row) and attention layer, so that decoding a
/// token reads them instead of recomputing the prefix (levanter/inference/generate.hpp). Given one through
/// forward_options::cache, a model treats row r of its input as positions [length(r), length(r) + n) of that row's
/// sequence (no packed segments); the rows may be at different lengths (sequences of different lengths decode as
/// one batch: serve_lm's continuous batching). Each attention layer appends a row's new keys and values in place and
/// attends over that row's positions alone, and the forward pass advances every row by n (advance()). So a row's
/// results are those of its sequence decoded alone, bit for bit. Key/value heads are stored on the `Heads` axis
/// whatever the model calls them.
///
/// Each (row, layer) keeps one buffer with room to spare, whose first length(r) positions are the row's: appending
/// writes the new positions after them, without copying the earlier ones, and the arrays append() returns view the
/// buffer. A buffer starts with room for twice its first input (at least 64 positions) and doubles when full, never
/// past the model's positions (begin()'s max_positions). Copying a cache copies its buffers (two copies never share
/// one).
struct kv_cache {
  using kv_array = hax::named_array<float, hax::axes<Batch, KeyPos, Heads, HeadSize>>;
  /// One sequence: per layer, a buffer {1, capacity, heads, head_size} whose first `length` positions hold keys
  /// (values).
  struct sequence {
    std::vector<kv_array> k, v;
    std::int64_t length = 0;    ///< positions held: the next input's first position
    std::int64_t appended = 0;  ///< layers appended in the forward pass under way
    /// Most positions the buffers make room for (0: max_positions), e.g. the cache pages a server reserved for the
    /// sequence; a sequence that outgrows it still gets room.
    std::int64_t limit = 0;
  };
  std::vector<sequence> rows;
  std::int64_t max_positions = 0;  ///< the model's positions (begin()): no buffer grows past them

  kv_cache() = default;
  kv_cache(const kv_cache& o);
  kv_cache& operator=(const kv_cache& o);
  kv_cache(kv_cache&&) noexcept = default;
  kv_cache& operator=(kv_cache&&) noexcept = default;

  /// Positions row r holds.
  std::int64_t length(std::int64_t r) const { return rows.at(static_cast<std::size_t>(r)).length; }
  /// Whether no row holds anything yet.
  bool empty() const { return rows.empty() || rows.front().k.empty(); }
  /// Before a forward pass over `batch` rows of `n` positions: an empty cache gets `batch` rows; otherwise the
  /// rows must match. Throws std::invalid_argument naming both when they do not, or when a row would pass
  /// `max_positions` (the error a model gives for a sequence longer than it has positions: `what` names the model).
  void begin(std::int64_t batch, std::int64_t n, std::int64_t max_positions, const std::string& what);
  /// Writes `k_new` / `v_new` {1, n, heads, head_size} (row r's input positions) after row r's `length` positions in
  /// layer `layer` (the next layer in order when the row is new) and returns the row's keys and values, length + n
  /// positions, viewing the buffers. Throws std::logic_error when the layer or the lengths do not follow (a model
  /// that does not use the cache consistently).
  std::pair<kv_array, kv_array> append(std::int64_t r, std::int64_t layer, const kv_array& k_new,
                                       const kv_array& v_new);
  /// After the forward pass: every row holds n more positions. Throws std::logic_error unless every row appended
  /// every layer once.
  void advance(std::int64_t n);
  /// Keeps rows `keep` (ascending indices), in that order: the sequences that go on when others have finished.
  void keep_rows(std::span<const std::int64_t> keep);
  /// Moves the rows of `other` after this cache's (sequences that join a running batch); `other` is left empty.
  void splice(kv_cache&& other);
};

/// What a forward pass needs besides the parameters.
struct forward_options {
  bool inference = true;     ///< dropout off
  hax::random::key key{};    ///< dropout key (training)
  hax::nn::checkpoint_policy checkpointing = hax::nn::checkpoint_policy::none;
  /// Where a model with auxiliary losses records them (compute_next_token_loss sets it). Shared: a layer that
  /// gradient checkpointing recomputes in the backward pass, after the forward call returned, writes it again.
  std::shared_ptr<lm_aux> aux;
  /// Decoding: the keys and values of earlier positions (kv_cache). Null: a whole sequence, positions from 0.
  kv_cache* cache = nullptr;
};

/// How the next-token loss is computed (upstream `compute_next_token_loss` arguments).
struct loss_options {
  double z_loss_weight = 0.0;                    ///< weight of logsumexp^2 (upstream `logsumexp_weight`)
  std::optional<int> cross_entropy_block_size;  ///< fused, blocked LM head + cross-entropy over the vocabulary
  std::optional<double> logit_soft_cap;          ///< logits c * tanh(z / c) (Gemma 2); the loss is then unblocked
};

/// The LM head's weight: {vocab, embed} (a tied embedding table, GPT-2) or {embed, vocab} (a Linear, Llama).
template <class H>
concept LmHeadWeight = std::same_as<std::remove_cvref_t<H>, hax::named_array<float, hax::axes<Vocab, Embed>>> ||
                       std::same_as<std::remove_cvref_t<H>, hax::named_array<float, hax::axes<Embed, Vocab>>>;

/// Upstream `compute_next_token_loss` on hidden states (mean over the kept tokens): targets are the tokens rolled
/// by one, the loss mask drops the last position (and ignored ids), optional z-loss, and the fused blockwise
/// cross-entropy when `cross_entropy_block_size` is set. Compiled once (src/models/lm.cpp) for both head layouts.
template <LmHeadWeight H>
scalar next_token_loss(const lm_hidden& h, const H& lm_head, const lm_example& ex, const loss_options& o = {});
extern template scalar next_token_loss(const lm_hidden&, const hax::named_array<float, hax::axes<Vocab, Embed>>&,
                                       const lm_example&, const loss_options&);
extern template scalar next_token_loss(const lm_hidden&, const hax::named_array<float, hax::axes<Embed, Vocab>>&,
                                       const lm_example&, const loss_options&);

/// Logits {batch, position, vocab} of hidden states against the LM head, soft-capped to c * tanh(z / c) when
/// `soft_cap` is given.
lm_logits_array lm_head_logits(const lm_hidden& h, const hax::named_array<float, hax::axes<Vocab, Embed>>& lm_head,
                               std::optional<double> soft_cap = std::nullopt);
lm_logits_array lm_head_logits(const lm_hidden& h, const hax::named_array<float, hax::axes<Embed, Vocab>>& lm_head,
                               std::optional<double> soft_cap = std::nullopt);

// ---- the model interface --------------------------------------------------------------------------------------

/// A model config (a `model:` choice class): its `type:` name, the context length, and upstream's FLOP and
/// parameter counts (MFU and the start-of-run line use them).
template <class C>
concept LmConfig = requires(const C& c, std::int64_t vocab) {
  { C::type_name } -> std::convertible_to<std::string_view>;
  { c.seq_len } -> std::convertible_to<std::int64_t>;
  { c.flops_per_token(vocab) } -> std::convertible_to<double>;
  { c.parameter_count(vocab) } -> std::convertible_to<std::int64_t>;
};

/// A language model: a reflected struct of parameters with a config type, upstream's init from a PRNG key, the
/// hidden states after the last norm (`activations`), and the LM head those are projected with.
template <class M>
concept LmModel = LmConfig<typename M::config_type> && boost::hana::Struct<M>::value &&
                  requires(const M& m, const typename M::config_type& c, const token_batch& tokens,
                           const forward_options& o, hax::random::key k, std::int64_t vocab) {
  { M::init(c, vocab, k) } -> std::same_as<M>;
  { m.activations(c, tokens, tokens, o) } -> std::same_as<lm_hidden>;
  { m.get_lm_head() } -> LmHeadWeight;
  { m.vocab_size() } -> std::convertible_to<std::int64_t>;
};

/// The model type of a config type: specialise `model_of<Config>` with `using type = Model;` next to the model.
template <class C>
struct model_of;
template <class C>
using model_of_t = typename model_of<C>::type;

/// `model.cross_entropy_block_size` when the config has that key, else none.
template <class C>
std::optional<int> cross_entropy_block_size_of(const C& c) {
  if constexpr (requires { c.cross_entropy_block_size; })
    return c.cross_entropy_block_size ? std::optional<int>(static_cast<int>(*c.cross_entropy_block_size))
                                      : std::nullopt;
  else
    return std::nullopt;
}

/// `model.final_logit_softcapping` when the config has that key (Gemma 2), else none.
template <class C>
std::optional<double> final_logit_soft_cap_of(const C& c) {
  if constexpr (requires { c.final_logit_softcapping; })
    return c.final_logit_softcapping;
  else
    return std::nullopt;
}

/// What backward keeps (upstream `gradient_checkpointing: true` recomputes each layer) for configs that say.
template <class C>
hax::nn::checkpoint_policy checkpoint_policy_of(const C& c) {
  if constexpr (requires { c.gradient_checkpointing; })
    return c.gradient_checkpointing ? hax::nn::checkpoint_policy::per_layer : hax::nn::checkpoint_policy::none;
  else
    return hax::nn::checkpoint_policy::none;
}

/// The forward pass's matrix products for configs that list them (`matmul_shapes(vocab)`), else none: the trainer
/// then measures its GEMM peak on a square product.
template <class C>
std::vector<matmul_shape> matmul_shapes_of(const C& c, std::int64_t vocab) {
  if constexpr (requires { c.matmul_shapes(vocab); })
    return c.matmul_shapes(vocab);
  else
    return {};
}

/// Forward FLOPs per token that gradient checkpointing runs again in backward: every layer's (the forward less the
/// LM head's 2 x hidden_dim x vocab, for configs that have hidden_dim), nothing without checkpointing.
template <class C>
double recomputed_flops_per_token(const C& c, std::int64_t vocab) {
  if (checkpoint_policy_of(c) == hax::nn::checkpoint_policy::none) return 0.0;
  double head = 0;
  if constexpr (requires { c.hidden_dim; }) head = 2.0 * double(c.hidden_dim) * double(vocab);
  return c.flops_per_token(vocab) - head;
}

/// The next-token loss of `m` on `ex` (upstream `compute_next_token_loss(model, example)`).
/// The model's auxiliary losses (a mixture of experts') are added, as upstream adds the aux loss of `activations`;
/// pass `o.aux` to read them per layer.
template <LmModel M>
scalar compute_next_token_loss(const M& m, const typename M::config_type& c, const lm_example& ex,
                               double z_loss_weight = 0.0, const forward_options& o = {}) {
  forward_options fo = o;
  if (!fo.aux) fo.aux = std::make_shared<lm_aux>();
  scalar loss = next_token_loss(m.activations(c, ex.tokens, ex.segment_ids, fo), m.get_lm_head(), ex,
                                loss_options{z_loss_weight, cross_entropy_block_size_of(c), final_logit_soft_cap_of(c)});
  if (fo.aux->load_balancing.empty()) return loss;
  return loss + static_cast<float>(fo.aux->total());
}

/// Logits {batch, position, vocab} (upstream `LmHeadModel.__call__`).
template <LmModel M>
lm_logits_array lm_logits(const M& m, const typename M::config_type& c, const token_batch& tokens,
                          const token_batch& segment_ids, const forward_options& o = {}) {
  return lm_head_logits(m.activations(c, tokens, segment_ids, o), m.get_lm_head(), final_logit_soft_cap_of(c));
}

}  // namespace levanter
