// Adding arrays neither of whose axis sets contains the other's must not compile.
#include <haliax/haliax.hpp>
inline constexpr struct Batch final : haliax::axis<"batch"> {} Batch;
inline constexpr struct Embed final : haliax::axis<"embed"> {} Embed;
int main() {
  auto a = haliax::zeros<float>(4 * Batch);
  auto b = haliax::zeros<float>(8 * Embed);
  auto c = haliax::add(a, b);
  // expect: no matching function for call to ‘add(haliax::named_array<float, haliax::axes<Batch()> >&, haliax::named_array<float, haliax::axes<Embed()> >&)
  // expect: BroadcastCompatible
}
