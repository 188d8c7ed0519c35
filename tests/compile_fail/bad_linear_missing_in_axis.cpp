// A Linear applied to an input without its In axis must not compile, and must fail at the call: the first
// error names the module (with its In and Out axes) and the input, the notes name the missing axis.
#include <haliax/haliax.hpp>
inline constexpr struct Batch final : haliax::axis<"batch"> {} Batch;
inline constexpr struct Pos final : haliax::axis<"position"> {} Pos;
inline constexpr struct Embed final : haliax::axis<"embed"> {} Embed;
inline constexpr struct Hidden final : haliax::axis<"hidden"> {} Hidden;
int main() {
  auto proj = haliax::nn::Linear<haliax::axes<Hidden>, haliax::axes<Embed>>::init(haliax::random::make_key(0),
                                                                                  8 * Hidden, 4 * Embed);
  auto x = haliax::zeros<float>(2 * Batch, 3 * Pos, 4 * Embed);
  auto y = proj(x);  // expect-first-error-at-line
  // expect: no match for call to ‘(haliax::nn::Linear<haliax::axes<Hidden()>, haliax::axes<Embed()> >) (haliax::named_array<float, haliax::axes<Batch(), Pos(), Embed()> >&)’
  // expect: LinearInput<
  // expect: [with Missing = haliax::axis_types<Hidden>]
}
