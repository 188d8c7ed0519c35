// The element work of the Hessian-vector products Sophia-H asks for (levanter/optim/hessian.hpp).
#include <levanter/optim/hessian.hpp>

#include <haliax/detail/random_dists.hpp>
#include <haliax/detail/thread_pool.hpp>
#include <haliax/detail/threefry.hpp>

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace levanter::optim {

namespace tf = haliax::detail::threefry;

void hessian_probe_direction(const hvp_probe& key, const std::vector<std::int64_t>& sizes, std::int64_t lo,
                             std::int64_t hi, float* out) {
  const auto keys = tf::split(tf::key_data{key.k0, key.k1}, sizes.size());
  std::int64_t off = 0;
  for (std::size_t l = 0; l < sizes.size(); ++l) {
    const std::int64_t n = sizes[l], b = std::max(lo, off), e = std::min(hi, off + n);
    if (b < e) {
      // element by element (each a function of its index), so the split over threads changes nothing
      constexpr std::int64_t per = std::int64_t{1} << 14;
      const std::int64_t blocks = (e - b + per - 1) / per;
      haliax::detail::thread_pool::instance().run(blocks, [&](std::int64_t blk) {
        const std::int64_t first = b + blk * per, last = std::min(e, first + per);
        for (std::int64_t i = first; i < last; ++i)
          out[i - lo] = haliax::detail::random_dists::normal_f32(
              tf::bits32_at(keys[l], static_cast<std::uint64_t>(i - off), static_cast<std::uint64_t>(n)));
      });
    }
    off += n;
  }
  if (hi > off) throw std::logic_error("hessian_probe_direction: the range runs past the parameters");
}

double hessian_probe_step(double param_sq, std::int64_t n) {
  const double cbrt_eps = std::cbrt(std::ldexp(1.0, -23));
  return cbrt_eps * (1.0 + std::sqrt(param_sq)) / std::sqrt(static_cast<double>(std::max<std::int64_t>(n, 1)));
}

void hessian_product(const float* v, const float* g_plus, const float* g_minus, double eps, std::int64_t n,
                     float* d) {
  const float inv = static_cast<float>(0.5 / eps);
  for (std::int64_t i = 0; i < n; ++i) d[i] = v[i] * ((g_plus[i] - g_minus[i]) * inv);
}

}  // namespace levanter::optim
