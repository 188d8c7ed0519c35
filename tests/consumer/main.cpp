// Uses the installed haliax: a dot and a reduction, checked against known values.
#include <cstdio>
#include <haliax/haliax.hpp>

inline constexpr struct Batch final : haliax::axis<"batch"> {
} Batch;
inline constexpr struct Embed final : haliax::axis<"embed"> {
} Embed;

int main(int argc, char** argv) {
  haliax::runtime rt(argc, argv);
  auto x = haliax::from_host<float>({1, 2, 3, 4, 5, 6}, 2 * Batch, 3 * Embed);
  auto w = haliax::from_host<float>({1, 1, 1}, 3 * Embed);
  auto y = haliax::dot(x, w, Embed);  // {batch}: 6, 15
  float total = haliax::sum(y).item();
  std::printf("consumer: sum = %g\n", total);
  return total == 21.0f ? 0 : 1;
}
