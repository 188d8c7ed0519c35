// softmax over an axis the array does not have must not compile.
#include <haliax/haliax.hpp>
#include <haliax/nn/functions.hpp>
inline constexpr struct Batch final : haliax::axis<"batch"> {} Batch;
inline constexpr struct Vocab final : haliax::axis<"vocab"> {} Vocab;
int main() {
  auto x = haliax::zeros<float>(4 * Batch);
  auto p = haliax::nn::softmax(x, Vocab);
  // expect: no matching function for call to ‘softmax(
  // expect: const Vocab&)
}
