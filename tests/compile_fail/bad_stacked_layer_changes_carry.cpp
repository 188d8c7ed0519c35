// A Stacked fold whose layer function returns a carry with other axes than it was given must not compile,
// and must fail at the fold call, printing both axis lists by name.
#include <cstdint>
#include <haliax/haliax.hpp>
inline constexpr struct Batch final : haliax::axis<"batch"> {} Batch;
inline constexpr struct Embed final : haliax::axis<"embed"> {} Embed;
inline constexpr struct Hidden final : haliax::axis<"hidden"> {} Hidden;
inline constexpr struct Layers final : haliax::axis<"layers"> {} Layers;
template <class Pre = haliax::axes<>>
struct block {
  BOOST_HANA_DEFINE_STRUCT(block, (haliax::nn::Linear<haliax::axes<Embed>, haliax::axes<Hidden>, Pre>, up));
};
int main() {
  haliax::nn::Stacked<Layers, block> stack;
  auto x = haliax::zeros<float>(2 * Batch, 4 * Embed);
  auto layer = [](const block<>& b, const haliax::named_array<float, haliax::axes<Batch, Embed>>& h, std::int64_t) {
    return b.up(h);  // {batch, hidden}: not the carry's axes
  };
  auto y = stack.fold(x, layer);  // expect-first-error-at-line
  // expect: no matching function for call to ‘haliax::nn::Stacked<Layers(), block>::fold(haliax::named_array<float, haliax::axes<Batch(), Embed()> >&,
  // expect: LayerFunction<
  // expect: [with Returned = haliax::axis_types<Batch, Hidden>; Carry = haliax::axis_types<Batch, Embed>]
}
