// Renaming an axis to one the array already has must not compile.
#include <haliax/haliax.hpp>
inline constexpr struct Pos final : haliax::axis<"position"> {} Pos;
inline constexpr struct KPos final : haliax::axis<"key_position"> {} KPos;
int main() {
  auto x = haliax::zeros<float>(4 * Pos, 4 * KPos);
  auto y = haliax::rename(x, Pos, KPos);
  // expect: no matching function for call to ‘rename(
  // expect: const KPos&)
}
