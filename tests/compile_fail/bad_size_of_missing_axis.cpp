// Asking an array for the size of an axis it does not have must not compile.
#include <haliax/haliax.hpp>
inline constexpr struct Batch final : haliax::axis<"batch"> {} Batch;
inline constexpr struct Embed final : haliax::axis<"embed"> {} Embed;
int main() {
  auto a = haliax::zeros<float>(4 * Batch);
  return static_cast<int>(a.size(Embed));
  // expect: no matching function for call to ‘haliax::named_array<float, haliax::axes<Batch()> >::size(const Embed&)
}
