// Two distinct tags with the same name cannot sit in one array: checkpoints, exports and sharding key on
// names, so {embed=4, embed=3} would be ambiguous. The creation fails at the call, naming both tags and the
// shared name.
#include <haliax/haliax.hpp>
inline constexpr struct Embed final : haliax::axis<"embed"> {} Embed;
inline constexpr struct OtherEmbed final : haliax::axis<"embed"> {} OtherEmbed;
int main() {
  auto x = haliax::zeros<float>(4 * Embed, 3 * OtherEmbed);  // expect-first-error-at-line
  // expect: no matching function for call to ‘zeros<float>(haliax::sized_axis<Embed>, haliax::sized_axis<OtherEmbed>)’
  // expect: DistinctAxisNames<
  // expect: [with NameClash = haliax::same_axis_name<{"embed"}, Embed, OtherEmbed>]
}
