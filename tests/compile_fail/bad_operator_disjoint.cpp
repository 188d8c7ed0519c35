// The positional bug of the Haliax announcement: a {batch} prediction minus a target on another axis. With
// names this does not compile, and the message shows the operator and both axis lists.
#include <haliax/haliax.hpp>
inline constexpr struct Batch final : haliax::axis<"batch"> {} Batch;
inline constexpr struct Target final : haliax::axis<"target"> {} Target;
int main() {
  auto pred = haliax::zeros<float>(128 * Batch);
  auto target = haliax::zeros<float>(128 * Target);
  auto diff = pred - target;
  // expect: no match for ‘operator-’
  // expect: haliax::named_array<float, haliax::axes<Batch()> >
  // expect: haliax::named_array<float, haliax::axes<Target()> >
}
