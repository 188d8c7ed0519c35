// An array with the same axis twice must not compile; the creation fails at the call, naming the axis.
#include <haliax/haliax.hpp>
inline constexpr struct Embed final : haliax::axis<"embed"> {} Embed;
int main() {
  auto a = haliax::zeros<float>(4 * Embed, 4 * Embed);  // expect-first-error-at-line
  // expect: no matching function for call to ‘zeros<float>(haliax::sized_axis<Embed>, haliax::sized_axis<Embed>)’
  // expect: DistinctAxisNames<
  // expect: [with NameClash = haliax::same_axis_name<{"embed"}, Embed, Embed>]
}
