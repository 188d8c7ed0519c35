// Reducing over an axis the array does not have must not compile.
#include <haliax/haliax.hpp>
inline constexpr struct Batch final : haliax::axis<"batch"> {} Batch;
inline constexpr struct Embed final : haliax::axis<"embed"> {} Embed;
int main() {
  auto a = haliax::zeros<float>(4 * Batch);
  auto s = haliax::sum(a, Embed);
  // expect: no matching function for call to ‘sum(haliax::named_array<float, haliax::axes<Batch()> >&, const Embed&)
  // expect: AxisOf<R, Axes>
}
