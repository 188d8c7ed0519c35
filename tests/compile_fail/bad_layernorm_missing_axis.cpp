// A LayerNorm over an axis the input does not have must not compile, and must fail at the call, naming the
// module and the missing axis (not a page of errors from inside standardize).
#include <haliax/haliax.hpp>
inline constexpr struct Batch final : haliax::axis<"batch"> {} Batch;
inline constexpr struct Embed final : haliax::axis<"embed"> {} Embed;
inline constexpr struct Hidden final : haliax::axis<"hidden"> {} Hidden;
int main() {
  auto ln = haliax::nn::LayerNorm<Embed>::init(4 * Embed);
  auto x = haliax::zeros<float>(2 * Batch, 4 * Hidden);
  auto y = ln(x);  // expect-first-error-at-line
  // expect: no match for call to ‘(haliax::nn::LayerNorm<Embed()>) (haliax::named_array<float, haliax::axes<Batch(), Hidden()> >&)’
  // expect: HasAxes<
  // expect: [with Missing = haliax::axis_types<Embed>]
}
