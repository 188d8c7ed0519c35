// An array type with the same axis twice must not compile.
#include <haliax/haliax.hpp>
inline constexpr struct Embed final : haliax::axis<"embed"> {} Embed;
int main() {
  auto a = haliax::zeros<float>(4 * Embed, 4 * Embed);
  // expect: haliax::named_array: an axis appears twice in the axis list
}
