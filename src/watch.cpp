// watch.hpp: the non-template helpers of trainer.watch.
#include <levanter/watch.hpp>

namespace levanter::watch {

std::pair<std::string, std::string> split_stacked(const std::string& path) {
  auto dots = [](std::string s) {
    for (auto& c : s)
      if (c == '/') c = '.';
    return s;
  };
  const std::string p = dots(path);
  const auto at = p.find(".stacked.");
  if (at == std::string::npos) return {p, ""};
  return {p.substr(0, at), p.substr(at + 9)};
}

double sum_squares(std::span<const float> v) {
  double s = 0;
  for (float f : v) s += double(f) * double(f);
  return s;
}

}  // namespace levanter::watch
