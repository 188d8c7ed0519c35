// Tests for haliax/ops/reduction.hpp against naive references on random data.
#include <doctest/doctest.h>

#include <algorithm>
#include <limits>

#include "test_axes.hpp"

using namespace test_axes;
namespace hax = haliax;

namespace {
// Reference reduction over a rank-3 array [nx, ny, nz] along a subset of dims; out is row-major over the kept.
template <class F>
std::vector<double> ref_reduce(const std::vector<float>& v, int nx, int ny, int nz, bool rx, bool ry, bool rz,
                               double init, F f, std::vector<std::int64_t>* counts = nullptr,
                               const std::vector<bool>* mask = nullptr) {
  int ox = rx ? 1 : nx, oy = ry ? 1 : ny, oz = rz ? 1 : nz;
  std::vector<double> out(ox * oy * oz, init);
  if (counts) counts->assign(out.size(), 0);
  for (int i = 0; i < nx; ++i)
    for (int j = 0; j < ny; ++j)
      for (int k = 0; k < nz; ++k) {
        int idx = (i * ny + j) * nz + k;
        if (mask && !(*mask)[idx]) continue;
        int o = ((rx ? 0 : i) * oy + (ry ? 0 : j)) * oz + (rz ? 0 : k);
        out[o] = f(out[o], v[idx]);
        if (counts) (*counts)[o]++;
      }
  return out;
}
}  // namespace

TEST_CASE("sum over each single axis, pairs of axes and all axes") {
  auto x = random_array(11, 3 * X, 4 * Y, 5 * Z);
  auto h = x.to_host();
  auto add = [](double a, double b) { return a + b; };
  check_close(hax::sum(x, X).to_host(), ref_reduce(h, 3, 4, 5, true, false, false, 0, add));
  check_close(hax::sum(x, Y).to_host(), ref_reduce(h, 3, 4, 5, false, true, false, 0, add));
  check_close(hax::sum(x, Z).to_host(), ref_reduce(h, 3, 4, 5, false, false, true, 0, add));
  check_close(hax::sum(x, Z, X).to_host(), ref_reduce(h, 3, 4, 5, true, false, true, 0, add));
  auto all = hax::sum(x);
  static_assert(decltype(all)::rank == 0);
  CHECK(all.item() == doctest::Approx(ref_reduce(h, 3, 4, 5, true, true, true, 0, add)[0]).epsilon(1e-5));
  static_assert(std::is_same_v<decltype(hax::sum(x, Y)), hax::named_array<float, hax::axes<X, Z>>>);
}

TEST_CASE("max, min, prod, mean, var, std over axes") {
  auto x = random_array(12, 3 * X, 4 * Y, 5 * Z);
  auto h = x.to_host();
  auto mx = [](double a, double b) { return std::max(a, b); };
  auto mn = [](double a, double b) { return std::min(a, b); };
  auto mul = [](double a, double b) { return a * b; };
  auto add = [](double a, double b) { return a + b; };
  const double inf = std::numeric_limits<double>::infinity();
  check_close(hax::max(x, Y).to_host(), ref_reduce(h, 3, 4, 5, false, true, false, -inf, mx));
  check_close(hax::min(x, X, Z).to_host(), ref_reduce(h, 3, 4, 5, true, false, true, inf, mn));
  check_close(hax::prod(x, Z).to_host(), ref_reduce(h, 3, 4, 5, false, false, true, 1, mul));
  auto s = ref_reduce(h, 3, 4, 5, true, false, false, 0, add);
  std::vector<double> mean(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) mean[i] = s[i] / 3;
  check_close(hax::mean(x, X).to_host(), mean);
  // variance over X, per (y, z)
  std::vector<double> var(20, 0.0);
  for (int i = 0; i < 3; ++i)
    for (int o = 0; o < 20; ++o) var[o] += (h[i * 20 + o] - mean[o]) * (h[i * 20 + o] - mean[o]) / 3;
  check_close(hax::var(x, X).to_host(), var, 1e-4, 1e-6);
  std::vector<double> sd(20);
  for (int o = 0; o < 20; ++o) sd[o] = std::sqrt(var[o]);
  check_close(hax::std(x, X).to_host(), sd, 1e-4, 1e-6);
}

TEST_CASE("reductions with a where mask broadcast by name") {
  auto x = random_array(13, 3 * X, 4 * Y, 5 * Z);
  auto h = x.to_host();
  auto m = x > 0.0f;
  auto hm = m.to_host();
  auto add = [](double a, double b) { return a + b; };
  check_close(hax::sum(x, hax::where_mask{m}, Y).to_host(),
              ref_reduce(h, 3, 4, 5, false, true, false, 0, add, nullptr, &hm));
  std::vector<std::int64_t> counts;
  auto s = ref_reduce(h, 3, 4, 5, true, false, true, 0, add, &counts, &hm);
  std::vector<double> mean(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) mean[i] = counts[i] ? s[i] / counts[i] : std::nan("");
  check_close(hax::mean(x, hax::where_mask{m}, X, Z).to_host(), mean);
  // A mask over a subset of the axes (here only Y) broadcasts against x.
  auto my = hax::from_host(std::vector<bool>{true, false, true, false}, 4 * Y);
  std::vector<bool> full(60);
  for (int i = 0; i < 60; ++i) full[i] = ((i / 5) % 4) % 2 == 0;
  check_close(hax::sum(x, hax::where_mask{my}).to_host(),
              ref_reduce(h, 3, 4, 5, true, true, true, 0, add, nullptr, &full));
}

TEST_CASE("argmax and argmin along one axis, first occurrence wins") {
  auto x = hax::from_host<float>({1, 5, 5, 2, /**/ 7, 0, -1, 7, /**/ 3, 3, 3, 3}, 3 * X, 4 * Y);
  CHECK(hax::argmax(x, Y).to_host() == std::vector<std::int32_t>{1, 0, 0});
  CHECK(hax::argmin(x, Y).to_host() == std::vector<std::int32_t>{0, 2, 0});
  CHECK(hax::argmax(x, X).to_host() == std::vector<std::int32_t>{1, 0, 0, 1});
  static_assert(std::is_same_v<decltype(hax::argmax(x, Y)), hax::named_array<std::int32_t, hax::axes<X>>>);
}

TEST_CASE("logsumexp is stable and handles -inf") {
  const float ninf = -std::numeric_limits<float>::infinity();
  auto x = hax::from_host<float>({1000.0f, 1000.0f, ninf, ninf, 0.0f, std::log(3.0f)}, 3 * X, 2 * Y);
  auto r = hax::logsumexp(x, Y).to_host();
  CHECK(r[0] == doctest::Approx(1000.0 + std::log(2.0)));
  CHECK(std::isinf(r[1]));
  CHECK(r[1] < 0);
  CHECK(r[2] == doctest::Approx(std::log(4.0)));
}

TEST_CASE("any and all, integer sums, NaN propagation") {
  auto b = hax::from_host(std::vector<bool>{true, false, false, false, true, true}, 2 * X, 3 * Y);
  auto any = hax::any(b, Y).to_host();
  auto all = hax::all(b, Y).to_host();
  CHECK(std::vector<bool>(any.begin(), any.end()) == std::vector<bool>{true, true});
  CHECK(std::vector<bool>(all.begin(), all.end()) == std::vector<bool>{false, false});
  auto i = hax::from_host<std::int32_t>({1, 2, 3, 4, 5, 6}, 2 * X, 3 * Y);
  CHECK(hax::sum(i, X).to_host() == std::vector<std::int32_t>{5, 7, 9});
  auto n = hax::from_host<float>({1.0f, std::nanf(""), 2.0f}, 3 * X);
  CHECK(std::isnan(hax::max(n).item()));
  CHECK(std::isnan(hax::sum(n).item()));
}

namespace {
template <class A, auto... R>
concept can_sum = requires(A a) {
  hax::sum(a, R...);
};
template <class A, auto... R>
concept can_mean = requires(A a) {
  hax::mean(a, R...);
};
template <class A, auto R>
concept can_argmax = requires(A a) {
  hax::argmax(a, R);
};
}  // namespace

TEST_CASE("reductions over axes that are not there do not compile") {
  using A = hax::named_array<float, hax::axes<X, Y>>;
  static_assert(can_sum<A, X>);
  static_assert(can_sum<A>);
  static_assert(!can_sum<A, Z>);
  static_assert(!can_sum<A, X, X>);
  static_assert(!can_argmax<A, Z>);
  static_assert(!can_mean<A, Embed>);
  static_assert(!can_mean<hax::named_array<std::int32_t, hax::axes<X>>, X>);  // mean needs floats
  CHECK(A::rank == 2);
}
