// haliax/nn/embedding.hpp: token embeddings, usable as a tied output head.
//
//   auto wte = haliax::nn::Embedding<Vocab, Embed>::init(key, 50257 * Vocab, 768 * Embed);
//   auto h = wte.embed(ids);          // int32 {batch, pos} -> {batch, pos, embed}
//   auto logits = wte.unembed(h);     // {batch, pos, embed} -> {batch, pos, vocab}
#pragma once

#include <string_view>

#include <boost/hana/define_struct.hpp>
#include <cstdint>

#include "../core.hpp"
#include "../ops/dot.hpp"
#include "../ops/elementwise.hpp"
#include "../ops/indexing.hpp"
#include "../random.hpp"
#include "linear.hpp"

namespace haliax::nn {

template <auto VocabAx, auto EmbedAx, class Pre = axes<>, class T = float>
struct Embedding;

/// A table {Pre..., Vocab, Embed} (upstream `haliax.nn.Embedding`). `embed` gathers rows by token id (its
/// gradient scatters back into the table); `unembed` contracts Embed for tied output logits.
template <auto VocabAx, auto EmbedAx, auto... P, class T>
struct Embedding<VocabAx, EmbedAx, axes<P...>, T> {
  using weight_type = named_array<T, axes<P..., VocabAx, EmbedAx>>;
  /// Upstream class name (`haliax.nn.Embedding`): weight-decay masks also match the class path `<class_name>.<field>`.
  static constexpr std::string_view class_name = "Embedding";
  BOOST_HANA_DEFINE_STRUCT(Embedding, (weight_type, weight));

  /// Upstream initialisation (haliax 1.4 `Embedding.init`, standard parameterisation): truncated_normal(-3, 3)
  /// * init_scale / embed_size. GPT-2 passes its initializer_range as init_scale.
  static Embedding init(random::key k, sized_axis<std::remove_cvref_t<decltype(VocabAx)>> vocab,
                        sized_axis<std::remove_cvref_t<decltype(EmbedAx)>> embed,
                        double init_scale = 1.0) requires(sizeof...(P) == 0 && std::is_same_v<T, float>) {
    Embedding m;
    m.weight = multiply(random::truncated_normal(k, vocab, embed, -3.0f, 3.0f),
                        static_cast<float>(init_scale / static_cast<double>(embed.size)));
    return m;
  }

  using vocab_tag = std::remove_cvref_t<decltype(VocabAx)>;
  using embed_tag = std::remove_cvref_t<decltype(EmbedAx)>;

  /// Rows of the table for int32 ids of any axes but Embed: {ids..., Embed}. Ids that already have the Embed
  /// axis fail at the call: `[with Present = haliax::axis_types<Embed>]`.
  template <class AxI>
  requires(sizeof...(P) == 0) && LacksAxes<axis_types_of<AxI>, axis_types<embed_tag>>
  auto embed(const named_array<std::int32_t, AxI>& ids) const {
    return take(weight, VocabAx, ids);
  }

  /// Logits against every row: contracts Embed, giving x's other axes then Vocab. `x` (element type T) must
  /// have Embed and not Vocab (`LinearInput`), else it fails at the call naming the axis.
  template <class AxX>
  requires(sizeof...(P) == 0) && LinearInput<axis_types_of<AxX>, axis_types<embed_tag>, axis_types<vocab_tag>>
  auto unembed(const named_array<T, AxX>& x) const { return dot(x, weight, EmbedAx); }
};

}  // namespace haliax::nn
