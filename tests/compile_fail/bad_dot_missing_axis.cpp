// Contracting an axis that only one operand has must not compile; the message names dot and the axis.
#include <haliax/haliax.hpp>
inline constexpr struct Batch final : haliax::axis<"batch"> {} Batch;
inline constexpr struct Embed final : haliax::axis<"embed"> {} Embed;
inline constexpr struct Mlp final : haliax::axis<"mlp"> {} Mlp;
int main() {
  auto x = haliax::zeros<float>(4 * Batch, 8 * Embed);
  auto w = haliax::zeros<float>(8 * Embed, 3 * Mlp);
  auto y = haliax::dot(x, w, Mlp);  // expect-first-error-at-line
  // expect: no matching function for call to ‘dot(haliax::named_array<float, haliax::axes<Batch(), Embed()> >&, haliax::named_array<float, haliax::axes<Embed(), Mlp()> >&, const Mlp&)’
  // expect: DotContractible<AxA, AxB, C ...>
  // expect: [with Missing = haliax::axis_types<Mlp>]
}
