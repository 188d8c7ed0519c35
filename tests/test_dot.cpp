// Tests for haliax/ops/dot.hpp against a naive einsum on random data, covering every operand layout.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <string>

#include "host_tensor.hpp"
#include "test_axes.hpp"

using namespace test_axes;
namespace hax = haliax;

namespace {
/// out[out_names] = sum over everything else of a * b (a naive einsum). Each of a, b and out gets a stride for
/// every axis name (0 where it lacks the axis), so the loop over all index combinations is plain arithmetic.
std::vector<double> ref_dot(const host_tensor& a, const host_tensor& b, const std::vector<std::string>& out_names) {
  std::map<std::string, std::int64_t> size;
  for (std::size_t i = 0; i < a.names.size(); ++i) size[a.names[i]] = a.sizes[i];
  for (std::size_t i = 0; i < b.names.size(); ++i) size[b.names[i]] = b.sizes[i];
  std::vector<std::string> all;
  std::vector<std::int64_t> extent;
  for (auto& [k, v] : size) {
    all.push_back(k);
    extent.push_back(v);
  }
  auto strides_of = [&](const std::vector<std::string>& names) {
    std::vector<std::int64_t> stride(all.size(), 0);
    std::int64_t s = 1;
    for (auto it = names.rbegin(); it != names.rend(); ++it) {
      stride[static_cast<std::size_t>(std::find(all.begin(), all.end(), *it) - all.begin())] = s;
      s *= size[*it];
    }
    return stride;
  };
  const auto sa = strides_of(a.names), sb = strides_of(b.names), so = strides_of(out_names);
  std::int64_t out_count = 1;
  for (auto& n : out_names) out_count *= size[n];
  std::vector<double> out(static_cast<std::size_t>(out_count), 0.0);
  std::vector<std::int64_t> idx(all.size(), 0);
  std::int64_t oa = 0, ob = 0, oo = 0;  // the three offsets of the current index combination
  while (true) {
    out[static_cast<std::size_t>(oo)] += a.data[static_cast<std::size_t>(oa)] * b.data[static_cast<std::size_t>(ob)];
    std::size_t d = all.size();
    while (d > 0) {  // odometer step over the last axis first
      --d;
      ++idx[d];
      oa += sa[d], ob += sb[d], oo += so[d];
      if (idx[d] < extent[d]) break;
      oa -= sa[d] * extent[d], ob -= sb[d] * extent[d], oo -= so[d] * extent[d];
      idx[d] = 0;
      if (d == 0) return out;
    }
    if (all.empty()) return out;
  }
}

template <class R>
std::vector<std::string> names_of(const R& r) {
  std::vector<std::string> v;
  for (auto n : r.axis_names()) v.emplace_back(n);
  return v;
}

template <class A, class B, class R>
void check_dot(const A& a, const B& b, const R& r, double rtol = 1e-5) {
  check_close(r.to_host(), ref_dot(host(a), host(b), names_of(r)), rtol, 1e-5);
}
}  // namespace

TEST_CASE("matrix times matrix in all four transpose layouts") {
  auto x = random_array(1, 5 * Batch, 7 * Embed);
  auto xt = random_array(2, 7 * Embed, 5 * Batch);
  auto w = random_array(3, 7 * Embed, 3 * Mlp);
  auto wt = random_array(4, 3 * Mlp, 7 * Embed);
  auto r1 = hax::dot(x, w, Embed);
  static_assert(std::is_same_v<decltype(r1), hax::named_array<float, hax::axes<Batch, Mlp>>>);
  check_dot(x, w, r1);
  check_dot(xt, w, hax::dot(xt, w, Embed));  // contracting the first axis of a
  check_dot(x, wt, hax::dot(x, wt, Embed));  // contracting the last axis of b
  check_dot(xt, wt, hax::dot(xt, wt, Embed));
  static_assert(std::is_same_v<decltype(hax::dot(xt, wt, Embed)), hax::named_array<float, hax::axes<Batch, Mlp>>>);
}

TEST_CASE("batch axes in different positions and multi-axis contractions") {
  // q {batch, head, pos, embed}, k {kpos, batch, embed, head}: batch over {batch, head}, contract embed.
  auto q = random_array(5, 2 * Batch, 3 * Head, 4 * Pos, 5 * Embed);
  auto k = random_array(6, 6 * KPos, 2 * Batch, 5 * Embed, 3 * Head);
  auto s = hax::dot(q, k, Embed);
  static_assert(std::is_same_v<decltype(s), hax::named_array<float, hax::axes<Batch, Head, Pos, KPos>>>);
  check_dot(q, k, s);
  // contract two axes at once, in a different order in each operand
  auto a = random_array(7, 3 * X, 4 * Y, 5 * Z);
  auto b = random_array(8, 5 * Z, 6 * W, 3 * X);
  auto r = hax::dot(a, b, X, Z);
  static_assert(std::is_same_v<decltype(r), hax::named_array<float, hax::axes<Y, W>>>);
  check_dot(a, b, r);
  // batch axis last in one operand, first in the other
  auto c = random_array(9, 4 * Y, 3 * X, 2 * Batch);
  auto d = random_array(10, 2 * Batch, 3 * X, 5 * Z);
  auto cd = hax::dot(c, d, X);
  static_assert(std::is_same_v<decltype(cd), hax::named_array<float, hax::axes<Y, Batch, Z>>>);
  check_dot(c, d, cd);
}

TEST_CASE("outer products, full contractions and output orders") {
  auto a = random_array(11, 3 * X);
  auto b = random_array(12, 4 * Y);
  auto outer = hax::dot(a, b);
  static_assert(std::is_same_v<decltype(outer), hax::named_array<float, hax::axes<X, Y>>>);
  check_dot(a, b, outer);
  auto a2 = random_array(13, 3 * X);
  auto inner = hax::dot(a, a2, X);
  static_assert(decltype(inner)::rank == 0);
  check_dot(a, a2, inner);
  auto x = random_array(14, 2 * Batch, 5 * Embed);
  auto w = random_array(15, 5 * Embed, 3 * Mlp, 4 * Head);
  auto r = hax::dot<hax::axes<Head, hax::ellipsis>>(x, w, Embed);
  static_assert(std::is_same_v<decltype(r), hax::named_array<float, hax::axes<Head, Batch, Mlp>>>);
  check_dot(x, w, r);
  auto r2 = hax::dot<hax::axes<Mlp, Head, Batch>>(x, w, Embed);
  static_assert(std::is_same_v<decltype(r2), hax::named_array<float, hax::axes<Mlp, Head, Batch>>>);
  check_dot(x, w, r2);
}

TEST_CASE("dot in double, bf16 and int32") {
  auto a = random_array<double>(16, 6 * X, 7 * Y);
  auto b = random_array<double>(17, 7 * Y, 8 * Z);
  check_dot(a, b, hax::dot(a, b, Y), 1e-12);
  auto ab = hax::astype<hax::bf16>(a);
  auto bb = hax::astype<hax::bf16>(b);
  check_dot(ab, bb, hax::dot(ab, bb, Y), 2e-2);
  auto ia = hax::from_host<std::int32_t>({1, 2, 3, 4, 5, 6}, 2 * X, 3 * Y);
  auto ib = hax::from_host<std::int32_t>({1, 0, 0, 1, 1, 1}, 3 * Y, 2 * Z);
  CHECK(hax::dot(ia, ib, Y).to_host() == std::vector<std::int32_t>{4, 5, 10, 11});
}

TEST_CASE("a shared axis with different sizes throws with both shapes") {
  auto a = hax::zeros<float>(2 * Batch, 768 * Embed);
  auto b = hax::zeros<float>(1024 * Embed, 3 * Mlp);
  CHECK_THROWS_WITH_AS(hax::dot(a, b, Embed), doctest::Contains("haliax::dot: axis 'embed' has size 768"),
                       hax::shape_error);
}

namespace {
template <class A, class B, auto... C>
concept can_dot = requires(A a, B b) {
  hax::dot(a, b, C...);
};
template <class Out, class A, class B, auto... C>
concept can_dot_to = requires(A a, B b) {
  hax::dot<Out>(a, b, C...);
};
}  // namespace

TEST_CASE("contracting an axis missing from an operand does not compile") {
  using A = hax::named_array<float, hax::axes<Batch, Embed>>;
  using B = hax::named_array<float, hax::axes<Embed, Mlp>>;
  static_assert(can_dot<A, B, Embed>);
  static_assert(!can_dot<A, B, Mlp>);    // only in b
  static_assert(!can_dot<A, B, Batch>);  // only in a
  static_assert(!can_dot<A, B, Head>);   // in neither
  static_assert(!can_dot<A, B, Embed, Embed>);
  static_assert(!can_dot_to<hax::axes<Batch>, A, B, Embed>);  // not a permutation of {batch, mlp}
  static_assert(can_dot_to<hax::axes<Mlp, Batch>, A, B, Embed>);
  CHECK(A::rank == 2);
}

TEST_CASE("dot results do not depend on the thread count") {
  // Large enough to be split into row blocks over the pool, with ragged edges in every dimension.
  auto a = random_array(21, 3 * Batch, 517 * X, 300 * Y);
  auto b = random_array(22, 300 * Y, 129 * Z);
  // few rows, many columns: tiles split the columns too
  auto c = random_array(23, 40 * X, 64 * Y);
  auto d = random_array(24, 64 * Y, 2000 * Z);
  const int before = hax::num_threads();
  hax::set_num_threads(1);
  auto one = hax::dot(a, b, Y).to_host();
  auto wide1 = hax::dot(c, d, Y).to_host();
  hax::set_num_threads(2);
  auto two = hax::dot(a, b, Y).to_host();
  auto wide2 = hax::dot(c, d, Y).to_host();
  hax::set_num_threads(3);
  auto three = hax::dot(a, b, Y).to_host();
  hax::set_num_threads(before);
  CHECK(std::memcmp(wide1.data(), wide2.data(), wide1.size() * sizeof(float)) == 0);
  check_dot(c, d, hax::dot(c, d, Y), 1e-4);
  REQUIRE(one.size() == two.size());
  CHECK(std::memcmp(one.data(), two.data(), one.size() * sizeof(float)) == 0);
  CHECK(std::memcmp(one.data(), three.data(), one.size() * sizeof(float)) == 0);
  check_dot(a, b, hax::dot(a, b, Y), 1e-4);
}
