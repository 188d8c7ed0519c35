// A small GPT-style transformer written only with haliax (embedding, stacked pre-norm blocks with causal
// self-attention and an MLP, final LayerNorm, tied unembedding, cross-entropy). Shared by the tests (trains a
// 2-layer model), bench/bench_transformer.cpp (time split of one block) and bench/peak_memory.cpp (memory with
// and without checkpointing).
#pragma once

#include <cmath>
#include <cstdint>
#include <haliax/haliax.hpp>
#include <vector>

namespace toy {

namespace hax = haliax;
namespace nn = haliax::nn;
using hax::axes;
using hax::named_array;

inline constexpr struct Batch final : hax::axis<"batch"> {
} Batch;
inline constexpr struct Pos final : hax::axis<"position"> {
} Pos;
inline constexpr struct KPos final : hax::axis<"key_position"> {
} KPos;
inline constexpr struct Embed final : hax::axis<"embed"> {
} Embed;
inline constexpr struct Heads final : hax::axis<"heads"> {
} Heads;
inline constexpr struct HeadSize final : hax::axis<"head_size"> {
} HeadSize;
inline constexpr struct Qkv final : hax::axis<"qkv"> {
} Qkv;
inline constexpr struct Mlp final : hax::axis<"mlp"> {
} Mlp;
inline constexpr struct Vocab final : hax::axis<"vocab"> {
} Vocab;
inline constexpr struct Layers final : hax::axis<"layers"> {
} Layers;

struct config {
  std::int64_t vocab = 64, embed = 32, heads = 4, layers = 2, mlp = 128;
  bool flash = true;
  nn::checkpoint_policy policy = nn::checkpoint_policy::none;
  std::int64_t head_size() const { return embed / heads; }
};

template <class T>
using hidden_t = named_array<T, axes<Batch, Pos, Embed>>;

/// One pre-norm transformer block (GPT-2 layout): x + attn(ln_1(x)), then + mlp(ln_2(x)).
template <class Pre = axes<>, class T = float>
struct block {
  using attn_in_t = nn::Linear<axes<Embed>, axes<Qkv, Heads, HeadSize>, Pre, T>;
  using attn_out_t = nn::Linear<axes<Heads, HeadSize>, axes<Embed>, Pre, T>;
  BOOST_HANA_DEFINE_STRUCT(block, (nn::LayerNorm<Embed, Pre, T>, ln_1), (attn_in_t, c_attn), (attn_out_t, c_proj),
                           (nn::LayerNorm<Embed, Pre, T>, ln_2), (nn::Mlp<Embed, Mlp, Pre, T>, mlp));

  static block init(hax::random::key k, const config& c) requires std::is_same_v<Pre, axes<>> {
    auto keys = hax::random::split(k, 3);
    block b;
    b.ln_1 = nn::LayerNorm<Embed, Pre, T>::init(c.embed * Embed);
    b.c_attn = attn_in_t::init(keys[0], c.embed * Embed, 3 * Qkv, c.heads * Heads, c.head_size() * HeadSize);
    b.c_proj = attn_out_t::init(keys[1], c.heads * Heads, c.head_size() * HeadSize, c.embed * Embed);
    b.ln_2 = nn::LayerNorm<Embed, Pre, T>::init(c.embed * Embed);
    b.mlp = nn::Mlp<Embed, Mlp, Pre, T>::init(keys[2], c.embed * Embed, c.mlp * Mlp);
    return b;
  }

  hidden_t<T> operator()(const hidden_t<T>& x, bool flash) const requires std::is_same_v<Pre, axes<>> {
    auto qkv = c_attn(ln_1(x));  // {batch, position, qkv, heads, head_size}
    auto q = hax::index(qkv, Qkv, 0);
    auto k = hax::rename(hax::index(qkv, Qkv, 1), Pos, KPos);
    auto v = hax::rename(hax::index(qkv, Qkv, 2), Pos, KPos);
    named_array<T, axes<Batch, Pos, Heads, HeadSize>> a;
    if (flash) {
      a = nn::flash_attention(q, k, v, Pos, KPos, HeadSize);
    } else {
      const auto n = x.size(Pos);
      a = hax::rearrange<axes<Batch, Pos, Heads, HeadSize>>(
          nn::dot_product_attention(q, k, v, KPos, HeadSize, nn::causal_mask(n * Pos, n * KPos)));
    }
    hidden_t<T> h = x + c_proj(a);
    return h + mlp(ln_2(h));
  }
};

/// `block` of floats with one template parameter, as nn::Stacked takes it (clang before 19 does not match a template
/// with a defaulted second parameter to a template template parameter of one without -frelaxed-template-template-args).
template <class Pre>
using float_block = block<Pre, float>;

/// The whole model (float): token embedding, learned positions, stacked blocks, final norm, tied output head.
struct model {
  using T = float;
  using blocks_t = nn::Stacked<Layers, float_block>;
  BOOST_HANA_DEFINE_STRUCT(model, (nn::Embedding<Vocab, Embed>, wte), (named_array<T, axes<Pos, Embed>>, wpe),
                           (blocks_t, h), (nn::LayerNorm<Embed>, ln_f));

  static model init(hax::random::key k, const config& c, std::int64_t max_pos) {
    auto keys = hax::random::split(k, 3);
    model m;
    m.wte = nn::Embedding<Vocab, Embed>::init(keys[0], c.vocab * Vocab, c.embed * Embed);
    m.wpe = hax::multiply(hax::random::normal(keys[1], max_pos * Pos, c.embed * Embed), 0.01f);
    m.h = blocks_t::init(c.layers * Layers, keys[2], [&](hax::random::key kl) { return block<>::init(kl, c); });
    m.ln_f = nn::LayerNorm<Embed>::init(c.embed * Embed);
    return m;
  }

  /// Mean next-token cross-entropy of `tokens` {batch, position} (the last position has no target).
  named_array<T, axes<>> loss(const named_array<std::int32_t, axes<Batch, Pos>>& tokens, const config& c) const {
    const auto n = tokens.size(Pos);
    hidden_t<T> x = wte.embed(tokens) + wpe;
    x = h.fold(
        x, [flash = c.flash](const block<>& b, const hidden_t<T>& hx, std::int64_t) { return b(hx, flash); },
        c.policy);
    auto logits = wte.unembed(ln_f(x));  // {batch, position, vocab}
    auto targets = hax::roll(tokens, -1, Pos);
    auto not_last = hax::broadcast_to(hax::arange(n * Pos) < (static_cast<int>(n) - 1), tokens.sized(Batch), n * Pos);
    return nn::cross_entropy_loss(logits, Vocab, targets, hax::where_mask{not_last});
  }
};

/// Token rows of a repeating pattern with a little structure (next token = (3 * token + 1) mod vocab, with a
/// random start per row), so a small model can learn it quickly.
inline named_array<std::int32_t, axes<Batch, Pos>> pattern_batch(std::int64_t batch, std::int64_t pos, std::int64_t vocab,
                                                                 std::uint32_t seed) {
  std::vector<std::int32_t> v(static_cast<std::size_t>(batch * pos));
  std::uint32_t s = seed * 2654435761u + 12345u;
  for (std::int64_t b = 0; b < batch; ++b) {
    s = s * 1664525u + 1013904223u;
    std::int32_t t = static_cast<std::int32_t>((s >> 8) % static_cast<std::uint32_t>(vocab));
    for (std::int64_t p = 0; p < pos; ++p) {
      v[static_cast<std::size_t>(b * pos + p)] = t;
      t = static_cast<std::int32_t>((3 * t + 1) % vocab);
    }
  }
  return hax::from_host<std::int32_t>(v, batch * Batch, pos * Pos);
}

}  // namespace toy
