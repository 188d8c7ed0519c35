// Tests for haliax/nn/functions.hpp against naive double-precision host references on random data.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "test_axes.hpp"

using namespace test_axes;
namespace hax = haliax;
namespace nn = haliax::nn;

namespace {

inline constexpr struct Missing final : haliax::axis<"missing"> {
} Missing;
inline constexpr struct Label final : haliax::axis<"label"> {
} Label;

constexpr double inf = std::numeric_limits<double>::infinity();

/// A row-major array of `sizes` viewed as outer x n x inner around axis `k`.
struct split3 {
  std::size_t outer = 1, n = 1, inner = 1;
};
template <std::size_t N>
split3 split(const std::array<std::int64_t, N>& sizes, std::size_t k) {
  split3 s;
  s.n = static_cast<std::size_t>(sizes[k]);
  for (std::size_t i = 0; i < k; ++i) s.outer *= static_cast<std::size_t>(sizes[i]);
  for (std::size_t i = k + 1; i < N; ++i) s.inner *= static_cast<std::size_t>(sizes[i]);
  return s;
}

enum class ref_op { softmax, log_softmax, standardize };

/// Naive double reference of an axis-wise op along axis k; keeps the shape.
template <class T, std::size_t N>
std::vector<double> ref_axis(const std::vector<T>& x, const std::array<std::int64_t, N>& sizes, std::size_t k,
                             ref_op op, double eps = 1e-5) {
  auto s = split(sizes, k);
  std::vector<double> out(x.size());
  for (std::size_t o = 0; o < s.outer; ++o)
    for (std::size_t i = 0; i < s.inner; ++i) {
      auto at = [&](std::size_t j) { return (o * s.n + j) * s.inner + i; };
      if (op == ref_op::standardize) {
        double mean = 0, var = 0;
        for (std::size_t j = 0; j < s.n; ++j) mean += static_cast<double>(x[at(j)]);
        mean /= static_cast<double>(s.n);
        for (std::size_t j = 0; j < s.n; ++j) var += std::pow(static_cast<double>(x[at(j)]) - mean, 2);
        var /= static_cast<double>(s.n);
        for (std::size_t j = 0; j < s.n; ++j)
          out[at(j)] = (static_cast<double>(x[at(j)]) - mean) / std::sqrt(var + eps);
        continue;
      }
      double m = -inf;
      for (std::size_t j = 0; j < s.n; ++j) m = std::max(m, static_cast<double>(x[at(j)]));
      double sum = 0;
      for (std::size_t j = 0; j < s.n; ++j) sum += std::exp(static_cast<double>(x[at(j)]) - m);
      for (std::size_t j = 0; j < s.n; ++j) {
        const double v = static_cast<double>(x[at(j)]) - m;
        out[at(j)] = op == ref_op::softmax ? std::exp(v) / sum : v - std::log(sum);
      }
    }
  return out;
}

/// Naive double logsumexp along axis k (the axis dropped, other axes in order).
template <class T, std::size_t N>
std::vector<double> ref_logsumexp(const std::vector<T>& x, const std::array<std::int64_t, N>& sizes, std::size_t k) {
  auto s = split(sizes, k);
  std::vector<double> out(s.outer * s.inner);
  for (std::size_t o = 0; o < s.outer; ++o)
    for (std::size_t i = 0; i < s.inner; ++i) {
      double m = -inf;
      for (std::size_t j = 0; j < s.n; ++j) m = std::max(m, static_cast<double>(x[(o * s.n + j) * s.inner + i]));
      double sum = 0;
      for (std::size_t j = 0; j < s.n; ++j) sum += std::exp(static_cast<double>(x[(o * s.n + j) * s.inner + i]) - m);
      out[o * s.inner + i] = m + std::log(sum);
    }
  return out;
}

/// Random values in [-scale, scale).
std::vector<float> scaled_values(std::size_t n, unsigned seed, double scale) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(-scale, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(dist(gen));
  return v;
}

/// check_close that also accepts equal infinities.
template <class T>
void check_close_inf(const std::vector<T>& got, std::vector<double> want, double rtol, double atol) {
  REQUIRE(got.size() == want.size());
  std::vector<double> g(got.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    g[i] = static_cast<double>(got[i]);
    if (std::isinf(want[i]) && g[i] == want[i]) g[i] = want[i] = 0.0;
  }
  check_close(g, want, rtol, atol);
}

/// Bitwise equality (NaNs included).
template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

/// Runs f once per host kernel variant (AVX-512, AVX2, generic), as far as the CPU has them.
template <class F>
void for_each_isa(F f) {
  namespace D = haliax::nn::detail;
  for (auto isa : {D::host_isa::avx512, D::host_isa::avx2, D::host_isa::generic}) {
    D::host_isa_limit() = isa;
    INFO("host kernel variant " << static_cast<int>(isa));
    f();
  }
  D::host_isa_limit() = D::host_isa::avx512;
}

// Compile-time checks: a wrong axis or element type is rejected at the call site.
template <class Arr, class Ax>
concept can_softmax = requires(Arr x, Ax a) {
  nn::softmax(x, a);
};
template <class Arr, class Ax>
concept can_log_softmax = requires(Arr x, Ax a) {
  nn::log_softmax(x, a);
};
template <class Arr, class Ax>
concept can_logsumexp = requires(Arr x, Ax a) {
  nn::logsumexp(x, a);
};
template <class Arr, class Ax>
concept can_glu = requires(Arr x, Ax a) {
  nn::glu(x, a);
};
template <class Arr, class Ax>
concept can_standardize = requires(Arr x, Ax a) {
  nn::standardize(x, a);
};
template <class Arr, class S>
concept can_one_hot = requires(Arr x, S s) {
  nn::one_hot(x, s);
};
template <class Arr>
concept can_relu = requires(Arr x) {
  nn::relu(x);
};

using fxy = hax::named_array<float, hax::axes<X, Y>>;
using ixy = hax::named_array<std::int32_t, hax::axes<X, Y>>;
// Tag types are named with `struct X` (the variable X hides its type): nvcc cannot compile a decltype-based alias.
static_assert(can_softmax<fxy, struct Y> && can_softmax<fxy, struct X>);
static_assert(!can_softmax<fxy, struct Missing>);
static_assert(!can_log_softmax<fxy, struct Missing>);
static_assert(!can_logsumexp<fxy, struct Missing>);
static_assert(!can_glu<fxy, struct Missing>);
static_assert(!can_standardize<fxy, struct Missing>);
static_assert(!can_softmax<ixy, struct Y>, "softmax needs a float element type");
static_assert(!can_relu<ixy>, "activations need a float element type");
static_assert(can_one_hot<ixy, hax::sized_axis<struct Label>>);
static_assert(!can_one_hot<ixy, hax::sized_axis<struct Y>>, "the class axis must be new");
static_assert(!can_one_hot<fxy, hax::sized_axis<struct Label>>, "labels are int32");
static_assert(std::is_same_v<decltype(nn::logsumexp(std::declval<fxy>(), Y)), hax::named_array<float, hax::axes<X>>>);
static_assert(std::is_same_v<decltype(nn::one_hot(std::declval<ixy>(), 10 * Label)),
                             hax::named_array<float, hax::axes<X, Y, Label>>>);

}  // namespace

// ---------------------------------------------------------------------------------------------------------
// softmax family

TEST_CASE("softmax along the last, a middle and the first axis matches a double reference") {
  for_each_isa([&] {
    // Inner sizes around the strided block width (32) and row lengths around the vector lane counts.
    auto x = random_array(1, 7 * X, 5 * Y, 45 * Z);
    auto h = x.to_host();
    const auto sizes = x.sizes();
    check_close(nn::softmax(x, Z).to_host(), ref_axis(h, sizes, 2, ref_op::softmax), 1e-5, 1e-7);
    check_close(nn::softmax(x, Y).to_host(), ref_axis(h, sizes, 1, ref_op::softmax), 1e-5, 1e-7);
    check_close(nn::softmax(x, X).to_host(), ref_axis(h, sizes, 0, ref_op::softmax), 1e-5, 1e-7);
    check_close(nn::log_softmax(x, Z).to_host(), ref_axis(h, sizes, 2, ref_op::log_softmax), 1e-5, 1e-6);
    check_close(nn::log_softmax(x, Y).to_host(), ref_axis(h, sizes, 1, ref_op::log_softmax), 1e-5, 1e-6);
    check_close(nn::log_softmax(x, X).to_host(), ref_axis(h, sizes, 0, ref_op::log_softmax), 1e-5, 1e-6);
  });
}

TEST_CASE("softmax rows sum to 1 and log_softmax is the log of softmax") {
  for_each_isa([&] {
    auto x = hax::from_host<float>(scaled_values(6 * 1000, 2, 10.0), 6 * Batch, 1000 * Vocab);
    auto p = nn::softmax(x, Vocab).to_host();
    auto lp = nn::log_softmax(x, Vocab).to_host();
    for (int b = 0; b < 6; ++b) {
      double sum = 0;
      for (int v = 0; v < 1000; ++v) sum += p[b * 1000 + v];
      CHECK(sum == doctest::Approx(1.0).epsilon(1e-6));
    }
    std::vector<double> logp(p.size());
    for (std::size_t i = 0; i < p.size(); ++i) logp[i] = std::log(static_cast<double>(p[i]));
    check_close(lp, logp, 1e-5, 1e-5);
  });
}

TEST_CASE("softmax, log_softmax and logsumexp are stable for values of +-1000") {
  for_each_isa([&] {
    auto h = scaled_values(4 * 3 * 300, 3, 1000.0);
    auto x = hax::from_host<float>(h, 4 * Batch, 3 * Pos, 300 * Vocab);
    const auto sizes = x.sizes();
    check_close(nn::softmax(x, Vocab).to_host(), ref_axis(h, sizes, 2, ref_op::softmax), 1e-5, 1e-30);
    check_close(nn::softmax(x, Batch).to_host(), ref_axis(h, sizes, 0, ref_op::softmax), 1e-5, 1e-30);
    check_close(nn::log_softmax(x, Vocab).to_host(), ref_axis(h, sizes, 2, ref_op::log_softmax), 1e-5, 1e-3);
    check_close(nn::log_softmax(x, Pos).to_host(), ref_axis(h, sizes, 1, ref_op::log_softmax), 1e-5, 1e-3);
    check_close(nn::logsumexp(x, Vocab).to_host(), ref_logsumexp(h, sizes, 2), 1e-6, 1e-3);
    check_close(nn::logsumexp(x, Batch).to_host(), ref_logsumexp(h, sizes, 0), 1e-6, 1e-3);
    for (float v : nn::softmax(x, Vocab).to_host()) CHECK(std::isfinite(v));
  });
}

TEST_CASE("logsumexp drops the axis and matches the reference on every axis") {
  for_each_isa([&] {
    auto x = random_array(4, 3 * X, 70 * Y, 33 * Z);
    auto h = x.to_host();
    const auto sizes = x.sizes();
    auto a = nn::logsumexp(x, X);
    auto b = nn::logsumexp(x, Y);
    auto c = nn::logsumexp(x, Z);
    static_assert(std::is_same_v<decltype(a), hax::named_array<float, hax::axes<Y, Z>>>);
    static_assert(std::is_same_v<decltype(b), hax::named_array<float, hax::axes<X, Z>>>);
    static_assert(std::is_same_v<decltype(c), hax::named_array<float, hax::axes<X, Y>>>);
    CHECK(b.shape_string() == "{x=3, z=33}");
    check_close(a.to_host(), ref_logsumexp(h, sizes, 0), 1e-6, 1e-6);
    check_close(b.to_host(), ref_logsumexp(h, sizes, 1), 1e-6, 1e-6);
    check_close(c.to_host(), ref_logsumexp(h, sizes, 2), 1e-6, 1e-6);
  });
}

TEST_CASE("special values: -inf entries, all -inf rows, +inf and NaN rows, empty axis") {
  for_each_isa([&] {
    const float ninf = -std::numeric_limits<float>::infinity();
    const float pinf = std::numeric_limits<float>::infinity();
    const float nan = std::numeric_limits<float>::quiet_NaN();
    // Rows: masked entries; all masked; a NaN; a +inf.
    auto x = hax::from_host<float>({1.0f, ninf, 2.0f, ninf,  //
                                    ninf, ninf, ninf, ninf,  //
                                    1.0f, nan, 2.0f, 3.0f,   //
                                    1.0f, pinf, 2.0f, 3.0f},
                                   4 * Batch, 4 * Vocab);
    auto p = nn::softmax(x, Vocab).to_host();
    const double e = std::exp(1.0);
    CHECK(p[0] == doctest::Approx(1.0 / (1.0 + e)));
    CHECK(p[1] == 0.0f);
    CHECK(p[2] == doctest::Approx(e / (1.0 + e)));
    CHECK(p[3] == 0.0f);
    for (int j = 4; j < 16; ++j) CHECK_MESSAGE(std::isnan(p[j]), "index " << j);  // as upstream: 0/0, NaN, inf/inf
    auto z = nn::logsumexp(x, Vocab).to_host();
    CHECK(z[0] == doctest::Approx(std::log(e + e * e)));
    CHECK(z[1] == ninf);
    CHECK(std::isnan(z[2]));
    CHECK(z[3] == pinf);
    auto lp = nn::log_softmax(x, Vocab).to_host();
    CHECK(lp[1] == ninf);
    for (int j = 8; j < 12; ++j) CHECK(std::isnan(lp[j]));

    auto empty = hax::zeros<float>(3 * Batch, 0 * Vocab);
    auto ze = nn::logsumexp(empty, Vocab).to_host();
    REQUIRE(ze.size() == 3);
    for (float v : ze) CHECK(v == ninf);
    CHECK(nn::softmax(empty, Vocab).element_count() == 0);
  });
}

TEST_CASE("large rows take the streamed path and agree with the reference, special rows included") {
  for_each_isa([&] {
    // 72 rows x 40000 floats = 11.5 MB: above the streaming threshold, more rows than one pipeline item.
    const int rows = 72, n = 40000;
    auto h = scaled_values(static_cast<std::size_t>(rows) * n, 5, 20.0);
    const float ninf = -std::numeric_limits<float>::infinity();
    for (int j = 0; j < n; j += 3) h[5 * n + j] = ninf;       // a masked row
    h[9 * n + 17] = std::numeric_limits<float>::quiet_NaN();  // a NaN row
    for (int j = 0; j < n; ++j) h[63 * n + j] = -1e30f;       // a very negative row
    h[64 * n] = 1e30f;                                        // one huge entry
    h[20 * n + 7] = std::numeric_limits<float>::infinity();   // a +inf row: all NaN, as upstream
    auto x = hax::from_host<float>(h, rows * Batch, n * Vocab);
    const auto sizes = x.sizes();
    auto want = ref_axis(h, sizes, 1, ref_op::softmax);
    auto got = nn::softmax(x, Vocab).to_host();
    for (int j = 0; j < n; ++j) REQUIRE(std::isnan(got[9 * n + j]));
    for (int j = 0; j < n; ++j) REQUIRE(std::isnan(got[20 * n + j]));
    for (int j = 0; j < n; ++j) want[9 * n + j] = want[20 * n + j] = std::numeric_limits<double>::quiet_NaN();
    check_close(got, want, 1e-5, 1e-30);
    for (int r = 0; r < rows; ++r) {
      if (r == 9 || r == 20) continue;
      double sum = 0;
      for (int j = 0; j < n; ++j) sum += got[static_cast<std::size_t>(r) * n + j];
      CHECK_MESSAGE(sum == doctest::Approx(1.0).epsilon(1e-5), "row " << r);
    }
    auto wl = ref_axis(h, sizes, 1, ref_op::log_softmax);
    for (int j = 0; j < n; ++j) wl[9 * n + j] = wl[20 * n + j] = std::numeric_limits<double>::quiet_NaN();
    auto wz = ref_logsumexp(h, sizes, 1);
    wz[9] = std::numeric_limits<double>::quiet_NaN();
    wz[20] = inf;  // upstream shifts by 0 when the max is not finite: log(inf) = inf
    check_close_inf(nn::logsumexp(x, Vocab).to_host(), wz, 1e-6, 1e-4);
    check_close_inf(nn::log_softmax(x, Vocab).to_host(), wl, 1e-5, 1e-4);

    auto out = hax::empty_like(x);
    nn::softmax_into(x, Vocab, out);
    CHECK(same_bits(out.to_host(), got));
    auto sd = nn::standardize(x, Vocab);  // streamed too; only finite rows are compared
    auto hs = sd.to_host();
    auto ws = ref_axis(h, sizes, 1, ref_op::standardize);
    for (int r : {0, 1, 2, 40, 71}) {
      std::vector<float> g(hs.begin() + static_cast<long>(r) * n, hs.begin() + static_cast<long>(r + 1) * n);
      std::vector<double> w(ws.begin() + static_cast<long>(r) * n, ws.begin() + static_cast<long>(r + 1) * n);
      check_close(g, w, 1e-4, 1e-4);
    }
  });
}

TEST_CASE("softmax_into checks its output") {
  auto x = random_array(6, 2 * Batch, 8 * Vocab);
  auto out = hax::empty_like(x);
  nn::softmax_into(x, Vocab, out);
  CHECK(out.to_host() == nn::softmax(x, Vocab).to_host());
  nn::log_softmax_into(x, Vocab, out);
  check_close(out.to_host(), nn::log_softmax(x, Vocab).to_host(), 0, 0);
  auto wrong = hax::empty<float>(2 * Batch, 9 * Vocab);
  CHECK_THROWS_WITH_AS(nn::softmax_into(x, Vocab, wrong), doctest::Contains("{batch=2, vocab=9}"), hax::shape_error);
  CHECK_THROWS_AS(nn::softmax_into(x, Vocab, x), std::invalid_argument);
}

TEST_CASE("softmax of bf16 and double arrays") {
  for_each_isa([&] {
    auto h = scaled_values(3 * 200, 7, 8.0);
    std::vector<hax::bf16> hb(h.size());
    for (std::size_t i = 0; i < h.size(); ++i) hb[i] = hax::bf16(h[i]);
    auto xb = hax::from_host<hax::bf16>(hb, 3 * Batch, 200 * Vocab);
    auto pb = nn::softmax(xb, Vocab);
    static_assert(std::is_same_v<decltype(pb), hax::named_array<hax::bf16, hax::axes<Batch, Vocab>>>);
    const auto sizes = xb.sizes();
    check_close(pb.to_host(), ref_axis(hb, sizes, 1, ref_op::softmax), 1e-2, 1e-6);
    check_close(nn::log_softmax(xb, Vocab).to_host(), ref_axis(hb, sizes, 1, ref_op::log_softmax), 1e-2, 2e-2);
    check_close(nn::softmax(xb, Batch).to_host(), ref_axis(hb, sizes, 0, ref_op::softmax), 1e-2, 1e-6);
    check_close(nn::logsumexp(xb, Vocab).to_host(), ref_logsumexp(hb, sizes, 1), 1e-2, 1e-2);

    std::vector<double> hd(h.begin(), h.end());
    auto xd = hax::from_host<double>(hd, 3 * Batch, 200 * Vocab);
    check_close(nn::softmax(xd, Vocab).to_host(), ref_axis(hd, sizes, 1, ref_op::softmax), 1e-12, 1e-300);
    check_close(nn::log_softmax(xd, Batch).to_host(), ref_axis(hd, sizes, 0, ref_op::log_softmax), 1e-12, 1e-12);
  });
}

TEST_CASE("standardize along the last and the first axis") {
  for_each_isa([&] {
    auto x = hax::from_host<float>(scaled_values(9 * 130, 8, 5.0), 9 * Batch, 130 * Embed);
    auto h = x.to_host();
    const auto sizes = x.sizes();
    check_close(nn::standardize(x, Embed).to_host(), ref_axis(h, sizes, 1, ref_op::standardize), 1e-4, 1e-5);
    check_close(nn::standardize(x, Batch, 1e-3).to_host(), ref_axis(h, sizes, 0, ref_op::standardize, 1e-3), 1e-4,
                1e-5);
  });
}

// ---------------------------------------------------------------------------------------------------------
// one_hot

TEST_CASE("one_hot appends the class axis, and out-of-range labels give all zeros") {
  auto labels = hax::from_host<std::int32_t>({3, 0, 9, -1, 10, 5}, 2 * Batch, 3 * Pos);
  auto y = nn::one_hot(labels, 10 * Label);
  static_assert(std::is_same_v<decltype(y), hax::named_array<float, hax::axes<Batch, Pos, Label>>>);
  CHECK(y.shape_string() == "{batch=2, position=3, label=10}");
  auto h = y.to_host();
  const int want[6] = {3, 0, 9, -1, -1, 5};
  for (int e = 0; e < 6; ++e)
    for (int c = 0; c < 10; ++c) CHECK_MESSAGE(h[e * 10 + c] == (c == want[e] ? 1.0f : 0.0f), e << "," << c);

  auto s = nn::one_hot<hax::bf16>(labels, 10 * Label, 0.9, 0.01);
  auto hs = s.to_host();
  CHECK(static_cast<float>(hs[3]) == doctest::Approx(0.9).epsilon(1e-2));
  CHECK(static_cast<float>(hs[0]) == doctest::Approx(0.01).epsilon(1e-2));

  auto v = nn::one_hot(4, 6 * Label);
  static_assert(std::is_same_v<decltype(v), hax::named_array<float, hax::axes<Label>>>);
  CHECK(v.to_host() == std::vector<float>{0, 0, 0, 0, 1, 0});
  CHECK(nn::one_hot(6, 6 * Label).to_host() == std::vector<float>(6, 0.0f));
  CHECK(nn::one_hot(std::int64_t(1) << 40, 6 * Label).to_host() == std::vector<float>(6, 0.0f));
}

// ---------------------------------------------------------------------------------------------------------
// activations

namespace {
double ref_sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
double ref_softplus(double x) { return std::max(x, 0.0) + std::log1p(std::exp(-std::abs(x))); }
double ref_gelu_tanh(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}
double ref_gelu_erf(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }

/// Random values in [-8, 8) plus the large magnitudes where naive formulas overflow.
std::vector<float> activation_inputs() {
  auto v = scaled_values(500, 9, 8.0);
  for (float x : {-100.0f, 100.0f, -30.0f, 30.0f, 0.0f, -0.0f, 1e-3f, -1e-3f, 6.0f, -3.0f, 3.0f}) v.push_back(x);
  return v;
}

template <class F, class R>
void check_activation(F f, R ref, double rtol = 1e-5, double atol = 1e-6) {
  auto h = activation_inputs();
  auto x = hax::from_host<float>(h, static_cast<std::int64_t>(h.size()) * X);
  auto got = f(x).to_host();
  std::vector<double> want(h.size());
  for (std::size_t i = 0; i < h.size(); ++i) want[i] = ref(static_cast<double>(h[i]));
  check_close(got, want, rtol, atol);
  for (float g : got) CHECK(!std::isnan(g));
}
}  // namespace

TEST_CASE("relu family and hard activations") {
  check_activation([](auto x) { return nn::relu(x); }, [](double v) { return std::max(v, 0.0); });
  check_activation([](auto x) { return nn::relu6(x); }, [](double v) { return std::min(std::max(v, 0.0), 6.0); });
  check_activation([](auto x) { return nn::relu_squared(x); }, [](double v) { return v > 0 ? v * v : 0.0; });
  check_activation([](auto x) { return nn::leaky_relu(x); }, [](double v) { return v >= 0 ? v : 0.01 * v; });
  check_activation([](auto x) { return nn::leaky_relu(x, 0.2); }, [](double v) { return v >= 0 ? v : 0.2 * v; });
  check_activation([](auto x) { return nn::hard_sigmoid(x); },
                   [](double v) { return std::min(std::max(v + 3.0, 0.0), 6.0) / 6.0; });
  check_activation([](auto x) { return nn::hard_silu(x); },
                   [](double v) { return v * std::min(std::max(v + 3.0, 0.0), 6.0) / 6.0; });
  check_activation([](auto x) { return nn::hard_swish(x); },
                   [](double v) { return v * std::min(std::max(v + 3.0, 0.0), 6.0) / 6.0; });
  check_activation([](auto x) { return nn::hard_tanh(x); }, [](double v) { return std::min(std::max(v, -1.0), 1.0); });
  check_activation([](auto x) { return nn::soft_sign(x); }, [](double v) { return v / (1.0 + std::abs(v)); });
}

TEST_CASE("sigmoid, log_sigmoid, softplus, silu are stable for large magnitudes") {
  check_activation([](auto x) { return nn::sigmoid(x); }, ref_sigmoid, 1e-5, 1e-30);
  check_activation([](auto x) { return nn::log_sigmoid(x); }, [](double v) { return -ref_softplus(-v); }, 1e-5, 1e-30);
  check_activation([](auto x) { return nn::softplus(x); }, ref_softplus, 1e-5, 1e-30);
  check_activation([](auto x) { return nn::silu(x); }, [](double v) { return v * ref_sigmoid(v); }, 1e-5, 1e-30);
  check_activation([](auto x) { return nn::swish(x); }, [](double v) { return v * ref_sigmoid(v); }, 1e-5, 1e-30);
  check_activation([](auto x) { return nn::quick_gelu(x); }, [](double v) { return v * ref_sigmoid(1.702 * v); }, 1e-5,
                   1e-30);
  auto x = hax::from_host<float>({-100.0f, 100.0f}, 2 * X);
  CHECK(nn::sigmoid(x).to_host() == std::vector<float>{static_cast<float>(ref_sigmoid(-100.0)), 1.0f});
  CHECK(nn::softplus(x).to_host()[1] == 100.0f);
  CHECK(nn::log_sigmoid(x).to_host()[0] == -100.0f);
}

TEST_CASE("gelu: tanh form by default (gelu_new), erf form when approximate is false") {
  check_activation([](auto x) { return nn::gelu(x); }, ref_gelu_tanh, 1e-5, 1e-6);
  check_activation([](auto x) { return nn::gelu(x, true); }, ref_gelu_tanh, 1e-5, 1e-6);
  check_activation([](auto x) { return nn::gelu_new(x); }, ref_gelu_tanh, 1e-5, 1e-6);
  check_activation([](auto x) { return nn::gelu(x, false); }, ref_gelu_erf, 1e-5, 1e-6);
  auto one = hax::from_host<float>({1.0f}, 1 * X);
  CHECK(nn::gelu(one).to_host()[0] != nn::gelu(one, false).to_host()[0]);
}

TEST_CASE("elu, celu, selu, tanh") {
  check_activation([](auto x) { return nn::elu(x); }, [](double v) { return v > 0 ? v : std::expm1(v); });
  check_activation([](auto x) { return nn::elu(x, 0.5); }, [](double v) { return v > 0 ? v : 0.5 * std::expm1(v); });
  check_activation([](auto x) { return nn::celu(x, 2.0); },
                   [](double v) { return std::max(v, 0.0) + 2.0 * std::expm1(std::min(v, 0.0) / 2.0); });
  check_activation([](auto x) { return nn::selu(x); },
                   [](double v) { return 1.0507009873554805 * (v > 0 ? v : 1.6732632423543772 * std::expm1(v)); });
  check_activation([](auto x) { return nn::tanh(x); }, [](double v) { return std::tanh(v); });
}

TEST_CASE("activations on bf16 compute in float and keep the element type") {
  auto h = scaled_values(64, 10, 6.0);
  std::vector<hax::bf16> hb(h.size());
  for (std::size_t i = 0; i < h.size(); ++i) hb[i] = hax::bf16(h[i]);
  auto x = hax::from_host<hax::bf16>(hb, 64 * Embed);
  auto g = nn::gelu(x);
  static_assert(std::is_same_v<decltype(g), hax::named_array<hax::bf16, hax::axes<Embed>>>);
  std::vector<double> want(h.size()), want_silu(h.size());
  for (std::size_t i = 0; i < h.size(); ++i) {
    const double v = static_cast<float>(hb[i]);
    want[i] = ref_gelu_tanh(v);
    want_silu[i] = v * ref_sigmoid(v);
  }
  check_close(g.to_host(), want, 1e-2, 1e-2);
  check_close(nn::silu(x).to_host(), want_silu, 1e-2, 1e-2);
}

TEST_CASE("glu splits the axis in halves: a * sigmoid(b)") {
  auto x = random_array(11, 3 * Batch, 8 * Mlp);
  auto h = x.to_host();
  auto g = nn::glu(x, Mlp);
  static_assert(std::is_same_v<decltype(g), hax::named_array<float, hax::axes<Batch, Mlp>>>);
  CHECK(g.shape_string() == "{batch=3, mlp=4}");
  std::vector<double> want(12);
  for (int b = 0; b < 3; ++b)
    for (int i = 0; i < 4; ++i) want[b * 4 + i] = h[b * 8 + i] * ref_sigmoid(h[b * 8 + i + 4]);
  check_close(g.to_host(), want);

  auto y = random_array(12, 4 * Batch, 3 * Mlp);  // along the leading axis
  auto hy = y.to_host();
  std::vector<double> want0(6);
  for (int b = 0; b < 2; ++b)
    for (int m = 0; m < 3; ++m) want0[b * 3 + m] = hy[b * 3 + m] * ref_sigmoid(hy[(b + 2) * 3 + m]);
  check_close(nn::glu(y, Batch).to_host(), want0);

  CHECK_THROWS_WITH_AS(nn::glu(y, Mlp), doctest::Contains("axis 'mlp' has odd size 3 in {batch=4, mlp=3}"),
                       hax::shape_error);
}

TEST_CASE("the float exp kernels against std::exp") {
  namespace D = haliax::nn::detail;
  std::mt19937 gen(13);
  std::uniform_real_distribution<float> wide(-87.0f, 88.0f), neg(-86.9f, 0.0f);
  double worst = 0, worst_np = 0;
  for (int i = 0; i < 200000; ++i) {
    const float a = wide(gen), b = neg(gen);
    worst = std::max(worst, std::abs(D::exp_f32(a) - std::exp(double(a))) / std::exp(double(a)));
    worst_np = std::max(worst_np, std::abs(D::exp_nonpos_f32(b) - std::exp(double(b))) / std::exp(double(b)));
  }
  CHECK(worst < 3e-7);
  CHECK(worst_np < 3e-7);
  const float pinf = std::numeric_limits<float>::infinity();
  CHECK(D::exp_f32(-pinf) == 0.0f);
  CHECK(D::exp_f32(pinf) == pinf);
  CHECK(D::exp_f32(89.0f) == pinf);
  CHECK(D::exp_f32(-1e9f) == 0.0f);
  CHECK(std::isnan(D::exp_f32(std::numeric_limits<float>::quiet_NaN())));
  CHECK(D::exp_f32(0.0f) == 1.0f);
  CHECK(D::exp_nonpos_f32(0.0f) == 1.0f);
  CHECK(D::exp_nonpos_f32(-0.0f) == 1.0f);
  CHECK(D::exp_nonpos_f32(-pinf) == 0.0f);
  CHECK(D::exp_nonpos_f32(-1e30f) == 0.0f);
  CHECK(D::exp_nonpos_f32(-100.0f) == 0.0f);
}
