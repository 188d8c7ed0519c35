// Tests for haliax/nn/attention.hpp: masks (exact values), plain attention against a double-precision loop,
// flash attention against the plain one (values and gradients; causal, sliding window, segment ids, offsets,
// sizes that are not multiples of the block), finite-difference gradients, and thread-count independence.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <haliax/autodiff.hpp>
#include <haliax/haliax.hpp>
#include <vector>

#include "gradcheck.hpp"
#include "test_axes.hpp"

using namespace test_axes;
namespace hax = haliax;
namespace nn = haliax::nn;
using hax::axes;
using hax::named_array;

namespace {

inline constexpr struct Key final : haliax::axis<"key"> {
} Key;

template <class T>
using q_array = named_array<T, axes<Batch, Pos, Head, Key>>;
template <class T>
using kv_array = named_array<T, axes<Batch, KPos, Head, Key>>;

/// q, k and v as one module, so that one gradient call differentiates all three.
template <class T>
struct qkv {
  BOOST_HANA_DEFINE_STRUCT(qkv, (q_array<T>, q), (kv_array<T>, k), (kv_array<T>, v));
};

template <class T>
qkv<T> random_qkv(unsigned seed, std::int64_t b, std::int64_t p, std::int64_t n, std::int64_t h, std::int64_t d,
                  double amplitude = 1.0) {
  auto q = random_array<T>(seed, b * Batch, p * Pos, h * Head, d * Key) * amplitude;
  auto k = random_array<T>(seed + 1, b * Batch, n * KPos, h * Head, d * Key) * amplitude;
  auto v = random_array<T>(seed + 2, b * Batch, n * KPos, h * Head, d * Key);
  return {q, k, v};
}

using allowed_fn = std::function<bool(std::int64_t b, std::int64_t i, std::int64_t j)>;

/// Attention in double by loops: q [B, P, H, D], k and v [B, N, H, D] -> [B, P, H, D]; masked scores -1e9.
std::vector<double> reference(const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v,
                              std::int64_t B, std::int64_t P, std::int64_t N, std::int64_t H, std::int64_t D,
                              double scale, const allowed_fn& allowed) {
  std::vector<double> out(static_cast<std::size_t>(B * P * H * D), 0.0);
  std::vector<double> s(static_cast<std::size_t>(N));
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t i = 0; i < P; ++i)
      for (std::int64_t h = 0; h < H; ++h) {
        double mx = -1e300;
        for (std::int64_t j = 0; j < N; ++j) {
          double dotp = 0;
          for (std::int64_t c = 0; c < D; ++c)
            dotp += q[static_cast<std::size_t>(((b * P + i) * H + h) * D + c)] *
                    k[static_cast<std::size_t>(((b * N + j) * H + h) * D + c)];
          s[static_cast<std::size_t>(j)] = allowed(b, i, j) ? scale * dotp : -1e9;
          mx = std::max(mx, s[static_cast<std::size_t>(j)]);
        }
        double z = 0;
        for (auto& x : s) z += (x = std::exp(x - mx));
        for (std::int64_t j = 0; j < N; ++j)
          for (std::int64_t c = 0; c < D; ++c)
            out[static_cast<std::size_t>(((b * P + i) * H + h) * D + c)] +=
                s[static_cast<std::size_t>(j)] / z * v[static_cast<std::size_t>(((b * N + j) * H + h) * D + c)];
      }
  return out;
}

std::vector<double> as_double(const std::vector<float>& x) { return {x.begin(), x.end()}; }
std::vector<double> as_double(const std::vector<double>& x) { return x; }

template <class T, class Ax>
std::vector<double> host(const named_array<T, Ax>& x) {
  return as_double(x.to_host());
}

/// Gradients of sum(f(q, k, v) * w) for a fixed random cotangent w, with respect to q, k and v.
template <class T, class F>
qkv<T> grads_of(const F& f, const qkv<T>& x) {
  decltype(f(x)) y0;
  {
    hax::no_grad_guard ng;
    y0 = f(x);
  }
  auto w = gradcheck::cotangent_like(y0, 11);
  return hax::grad([&](const qkv<T>& m) { return hax::sum(f(m) * w); })(x);
}

template <class T>
void check_grads_close(const qkv<T>& a, const qkv<T>& b, double rtol, double atol) {
  check_close(host(a.q), host(b.q), rtol, atol);
  check_close(host(a.k), host(b.k), rtol, atol);
  check_close(host(a.v), host(b.v), rtol, atol);
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------
// Masks

TEST_CASE("causal_mask: lower triangle, with start offsets") {
  auto m = nn::causal_mask(3 * Pos, 4 * KPos);
  static_assert(std::is_same_v<decltype(m), named_array<bool, axes<Pos, KPos>>>);
  CHECK(m.to_host() == std::vector<bool>{1, 0, 0, 0,  //
                                         1, 1, 0, 0,  //
                                         1, 1, 1, 0});
  // Queries at absolute positions 2..3 against keys 0..3 (a second chunk of a prefill).
  auto off = nn::causal_mask(2 * Pos, 4 * KPos, 2);
  CHECK(off.to_host() == std::vector<bool>{1, 1, 1, 0,  //
                                           1, 1, 1, 1});
  // Keys starting at absolute position 1.
  auto koff = nn::causal_mask(2 * Pos, 2 * KPos, 0, 1);
  CHECK(koff.to_host() == std::vector<bool>{0, 0,  //
                                            1, 0});
}

TEST_CASE("sliding_window_mask: each query sees itself and the window - 1 keys before it") {
  auto m = nn::sliding_window_mask(5 * Pos, 5 * KPos, 2);
  CHECK(m.to_host() == std::vector<bool>{1, 0, 0, 0, 0,  //
                                         1, 1, 0, 0, 0,  //
                                         0, 1, 1, 0, 0,  //
                                         0, 0, 1, 1, 0,  //
                                         0, 0, 0, 1, 1});
  auto one = nn::sliding_window_mask(3 * Pos, 3 * KPos, 1);
  CHECK(one.to_host() == std::vector<bool>{1, 0, 0, 0, 1, 0, 0, 0, 1});
  auto wide = nn::sliding_window_mask(4 * Pos, 4 * KPos, 10);
  CHECK(wide.to_host() == nn::causal_mask(4 * Pos, 4 * KPos).to_host());
  auto off = nn::sliding_window_mask(2 * Pos, 5 * KPos, 3, 3);  // queries at 3, 4
  CHECK(off.to_host() == std::vector<bool>{0, 1, 1, 1, 0,       //
                                           0, 0, 1, 1, 1});
  CHECK_THROWS_AS(nn::sliding_window_mask(2 * Pos, 2 * KPos, 0), std::invalid_argument);
}

TEST_CASE("segment_mask: packed documents do not see each other, and it combines with causal by &&") {
  auto ids = hax::from_host<std::int32_t>({0, 0, 1, 1, 1,  //
                                           3, 3, 3, 3, 4},
                                          2 * Batch, 5 * Pos);
  auto seg = nn::segment_mask(ids, Pos, KPos);
  static_assert(std::is_same_v<decltype(seg), named_array<bool, axes<Batch, Pos, KPos>>>);
  CHECK(seg.to_host() == std::vector<bool>{1, 1, 0, 0, 0,  //
                                           1, 1, 0, 0, 0,  //
                                           0, 0, 1, 1, 1,  //
                                           0, 0, 1, 1, 1,  //
                                           0, 0, 1, 1, 1,  //
                                           1, 1, 1, 1, 0,  //
                                           1, 1, 1, 1, 0,  //
                                           1, 1, 1, 1, 0,  //
                                           1, 1, 1, 1, 0,  //
                                           0, 0, 0, 0, 1});
  CHECK(nn::segment_mask(ids, hax::rename(ids, Pos, KPos)).to_host() == seg.to_host());

  auto both = nn::causal_mask(5 * Pos, 5 * KPos) && seg;
  static_assert(std::is_same_v<decltype(both), named_array<bool, axes<Batch, Pos, KPos>>>);
  CHECK(both.to_host() == std::vector<bool>{1, 0, 0, 0, 0,  //
                                            1, 1, 0, 0, 0,  //
                                            0, 0, 1, 0, 0,  //
                                            0, 0, 1, 1, 0,  //
                                            0, 0, 1, 1, 1,  //
                                            1, 0, 0, 0, 0,  //
                                            1, 1, 0, 0, 0,  //
                                            1, 1, 1, 0, 0,  //
                                            1, 1, 1, 1, 0,  //
                                            0, 0, 0, 0, 1});
  CHECK(nn::combine_masks_and(nn::causal_mask(5 * Pos, 5 * KPos), seg).to_host() == both.to_host());

  // Key ids without the batch axis broadcast over the query's batch.
  auto kid = hax::from_host<std::int32_t>({0, 1, 3}, 3 * KPos);
  auto m = nn::segment_mask(ids, kid);
  static_assert(std::is_same_v<decltype(m), named_array<bool, axes<Batch, Pos, KPos>>>);
  CHECK(m.to_host() == std::vector<bool>{1, 0, 0, 1, 0, 0, 0, 1, 0, 0, 1, 0, 0, 1, 0,  //
                                         0, 0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 0});
  CHECK_THROWS_AS(nn::segment_mask(ids, hax::from_host<std::int32_t>({0, 1, 2, 3, 4, 5}, 3 * Batch, 2 * KPos)),
                  hax::shape_error);
}

TEST_CASE("mask_to_bias and combine_masks_or") {
  auto m = nn::causal_mask(2 * Pos, 2 * KPos);
  check_close(nn::mask_to_bias(m).to_host(), std::vector<double>{0, -1e9, 0, 0}, 0, 0);
  auto either = nn::combine_masks_or(m, nn::sliding_window_mask(2 * Pos, 2 * KPos, 1));
  CHECK(either.to_host() == m.to_host());
}

// ---------------------------------------------------------------------------------------------------------
// Plain attention

TEST_CASE("dot_product_attention matches a double loop: no mask, causal, explicit mask, custom scale") {
  const std::int64_t B = 2, P = 5, N = 7, H = 3, D = 4;
  auto x = random_qkv<double>(1, B, P, N, H, D, 2.0);
  auto q = host(x.q), k = host(x.k), v = host(x.v);
  const double scale = 1.0 / std::sqrt(double(D));

  auto y = nn::dot_product_attention(x.q, x.k, x.v, KPos, Key);
  static_assert(std::is_same_v<decltype(y), q_array<double>>);
  check_close(host(y), reference(q, k, v, B, P, N, H, D, scale, [](auto, auto, auto) { return true; }), 1e-12, 1e-12);

  auto yc = nn::dot_product_attention(x.q, x.k, x.v, KPos, Key, nn::causal_mask(P * Pos, N * KPos, 2));
  check_close(host(yc), reference(q, k, v, B, P, N, H, D, scale, [](auto, auto i, auto j) { return j <= i + 2; }),
              1e-12, 1e-12);

  // An explicit {batch, pos, key_pos} mask, random, with one row fully masked (it averages the values).
  std::vector<bool> bits;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t i = 0; i < P; ++i)
      for (std::int64_t j = 0; j < N; ++j) bits.push_back(!(b == 1 && i == 3) && ((b * 7 + i * 3 + j * 5) % 4 != 0));
  auto m = hax::from_host(bits, B * Batch, P * Pos, N * KPos);
  auto ym = nn::dot_product_attention(x.q, x.k, x.v, KPos, Key, m, {.scale = 0.3});
  check_close(
      host(ym),
      reference(q, k, v, B, P, N, H, D, 0.3,
                [&](auto b, auto i, auto j) { return bool(bits[static_cast<std::size_t>((b * P + i) * N + j)]); }),
      1e-12, 1e-12);

  auto w = nn::dot_product_attention_weights(x.q, x.k, KPos, Key, nn::causal_mask(P * Pos, N * KPos));
  static_assert(std::is_same_v<decltype(w), named_array<double, axes<Batch, Head, Pos, KPos>>>);
  check_close(hax::sum(w, KPos).to_host(), std::vector<double>(B * H * P, 1.0), 1e-12, 1e-12);
}

TEST_CASE("dot_product_attention: value head axis differs from Key, and float matches double") {
  const std::int64_t B = 1, P = 4, N = 4, H = 2, D = 3, E = 5;
  auto q = random_array<double>(3, B * Batch, P * Pos, H * Head, D * Key);
  auto k = random_array<double>(4, B * Batch, N * KPos, H * Head, D * Key);
  auto v = random_array<double>(5, B * Batch, N * KPos, H * Head, E * Embed);
  auto y = nn::dot_product_attention(q, k, v, KPos, Key, nn::causal_mask(P * Pos, N * KPos));
  static_assert(std::is_same_v<decltype(y), named_array<double, axes<Batch, Pos, Head, Embed>>>);
  auto yf = nn::dot_product_attention(hax::astype<float>(q), hax::astype<float>(k), hax::astype<float>(v), KPos, Key,
                                      nn::causal_mask(P * Pos, N * KPos));
  check_close(host(yf), host(y), 1e-5, 1e-6);
  // Row 0 sees key 0 only: its output is v at key 0.
  auto vh = host(v), yh = host(y);
  for (std::int64_t h = 0; h < H; ++h)
    for (std::int64_t e = 0; e < E; ++e) CHECK(yh[h * E + e] == doctest::Approx(vh[h * E + e]).epsilon(1e-12));
}

// ---------------------------------------------------------------------------------------------------------
// Flash attention against the plain one

namespace {

/// Plain attention with the mask flash_attention builds from its options (and segment ids when given).
template <class T>
auto plain_like_flash(const qkv<T>& x, const nn::flash_attention_options& o,
                      const named_array<std::int32_t, axes<Batch, Pos>>* seg = nullptr) {
  const auto P = x.q.sized(Pos);
  const auto N = x.k.sized(KPos);
  auto base = o.sliding_window > 0 ? nn::sliding_window_mask(P, N, o.sliding_window, o.q_start, o.k_start)
              : o.causal           ? nn::causal_mask(P, N, o.q_start, o.k_start)
                                   : hax::full<bool>(true, P, N);
  nn::attention_options po{o.scale};
  if (seg) return nn::dot_product_attention(x.q, x.k, x.v, KPos, Key, base && nn::segment_mask(*seg, Pos, KPos), po);
  return nn::dot_product_attention(x.q, x.k, x.v, KPos, Key, base && hax::full<bool>(true, x.q.sized(Batch), P, N), po);
}

template <class T>
auto flash_of(const qkv<T>& x, const nn::flash_attention_options& o,
              const named_array<std::int32_t, axes<Batch, Pos>>* seg = nullptr) {
  if (seg) return nn::flash_attention(x.q, x.k, x.v, Pos, KPos, Key, *seg, hax::rename(*seg, Pos, KPos), o);
  return nn::flash_attention(x.q, x.k, x.v, Pos, KPos, Key, o);
}

}  // namespace

TEST_CASE("flash_attention equals plain attention: causal, window, segments, offsets, ragged blocks") {
  struct config {
    const char* name;
    std::int64_t p, n;
    nn::flash_attention_options o;
    bool segments;
  };
  const std::vector<config> configs = {
      {"causal, one block", 8, 8, {}, false},
      {"causal, ragged blocks", 37, 37, {.block_q = 8, .block_k = 16}, false},
      {"causal, block_k < block_q", 29, 29, {.block_q = 16, .block_k = 5}, false},
      {"not causal", 21, 13, {.causal = false, .block_q = 4, .block_k = 6}, false},
      {"sliding window 5", 33, 33, {.sliding_window = 5, .block_q = 8, .block_k = 8}, false},
      {"sliding window 1", 12, 12, {.sliding_window = 1, .block_q = 5, .block_k = 3}, false},
      {"segments", 40, 40, {.block_q = 8, .block_k = 8}, true},
      {"segments + window", 40, 40, {.sliding_window = 6, .block_q = 16, .block_k = 4}, true},
      {"decode chunk (q_start)", 6, 19, {.q_start = 13, .block_q = 4, .block_k = 4}, false},
      {"explicit scale", 17, 17, {.scale = 0.7, .block_q = 4, .block_k = 8}, false},
  };
  for (const auto& c : configs) {
    const std::string name = c.name;
    CAPTURE(name);
    auto x = random_qkv<double>(20, 2, c.p, c.n, 3, 4, 1.5);
    named_array<std::int32_t, axes<Batch, Pos>> seg;
    if (c.segments) {
      // Documents of lengths 3, 11, 1, 20, 5 in row 0; 25, 15 in row 1 (boundaries inside blocks).
      std::vector<std::int32_t> ids;
      for (std::int32_t d : {0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 3, 3, 3, 3, 3,
                             3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 4, 4, 4, 4, 4})
        ids.push_back(d);
      for (int i = 0; i < 40; ++i) ids.push_back(i < 25 ? 7 : 8);
      seg = hax::from_host(ids, 2 * Batch, c.p * Pos);
    }
    const auto* sp = c.segments ? &seg : nullptr;
    auto want = plain_like_flash(x, c.o, sp);
    auto got = flash_of(x, c.o, sp);
    static_assert(std::is_same_v<decltype(got), q_array<double>>);
    check_close(host(got), host(want), 1e-12, 1e-13);

    // float against the double plain version
    qkv<float> xf{hax::astype<float>(x.q), hax::astype<float>(x.k), hax::astype<float>(x.v)};
    check_close(host(flash_of(xf, c.o, sp)), host(want), 2e-5, 2e-6);
  }
}

TEST_CASE("flash_attention: other layouts (heads before positions, value head axis of its own)") {
  auto q = random_array<double>(30, 3 * Head, 19 * Pos, 4 * Key);
  auto k = random_array<double>(31, 19 * KPos, 3 * Head, 4 * Key);
  auto v = random_array<double>(32, 3 * Head, 19 * KPos, 6 * Embed);
  nn::flash_attention_options o{.block_q = 8, .block_k = 8};
  auto y = nn::flash_attention(q, k, v, Pos, KPos, Key, o);
  static_assert(std::is_same_v<decltype(y), named_array<double, axes<Head, Pos, Embed>>>);
  auto want = nn::dot_product_attention(q, k, v, KPos, Key, nn::causal_mask(19 * Pos, 19 * KPos));
  check_close(host(y), host(want), 1e-12, 1e-13);
}

namespace {
/// Operands whose head axes are not innermost (flash_attention packs them before its kernels).
struct outer_heads {
  BOOST_HANA_DEFINE_STRUCT(outer_heads, (named_array<double, axes<Key, Head, Pos>>, q),
                           (named_array<double, axes<Key, KPos, Head>>, k),
                           (named_array<double, axes<Embed, KPos, Head>>, v));
};
}  // namespace

TEST_CASE("flash_attention: operands with the head axis outermost (packed path), values and gradients") {
  auto q = random_array<double>(33, 2 * Head, 11 * Pos, 3 * Key);
  auto k = random_array<double>(34, 11 * KPos, 2 * Head, 3 * Key);
  auto v = random_array<double>(35, 2 * Head, 11 * KPos, 4 * Embed);
  outer_heads x{hax::rearrange<axes<Key, Head, Pos>>(q), hax::rearrange<axes<Key, KPos, Head>>(k),
                hax::rearrange<axes<Embed, KPos, Head>>(v)};
  nn::flash_attention_options o{.block_q = 4, .block_k = 4};
  auto f = [&](const outer_heads& m) { return nn::flash_attention(m.q, m.k, m.v, Pos, KPos, Key, o); };
  auto y = f(x);
  static_assert(std::is_same_v<decltype(y), named_array<double, axes<Head, Pos, Embed>>>);
  check_close(host(y), host(nn::flash_attention(q, k, v, Pos, KPos, Key, o)), 1e-13, 1e-14);
  gradcheck::check_output_gradient(f, x);
}

TEST_CASE("flash_attention gradients match finite differences") {
  struct config {
    const char* name;
    nn::flash_attention_options o;
    bool segments;
  };
  const std::vector<config> configs = {
      {"causal", {.block_q = 3, .block_k = 4}, false},
      {"window", {.sliding_window = 3, .block_q = 4, .block_k = 2}, false},
      {"segments", {.block_q = 4, .block_k = 3}, true},
      {"not causal, one tile", {.causal = false}, false},
  };
  auto seg = hax::from_host<std::int32_t>({0, 0, 0, 1, 1, 2, 2, 2, 2, 5, 5, 5, 5, 5, 6, 6}, 2 * Batch, 8 * Pos);
  for (const auto& c : configs) {
    const std::string name = c.name;
    CAPTURE(name);
    auto x = random_qkv<double>(40, 2, 8, 8, 2, 3, 1.5);
    const auto* sp = c.segments ? &seg : nullptr;
    gradcheck::check_output_gradient([&](const qkv<double>& m) { return flash_of(m, c.o, sp); }, x);
  }
}

TEST_CASE("flash_attention gradients equal the plain attention's") {
  struct config {
    const char* name;
    std::int64_t p;
    nn::flash_attention_options o;
    bool segments;
  };
  const std::vector<config> configs = {
      {"causal", 37, {.block_q = 8, .block_k = 16}, false},
      {"window", 33, {.sliding_window = 7, .block_q = 8, .block_k = 4}, false},
      {"segments", 40, {.block_q = 16, .block_k = 8}, true},
      {"not causal", 23, {.causal = false, .block_q = 8, .block_k = 8}, false},
  };
  std::vector<std::int32_t> ids;
  for (int i = 0; i < 80; ++i) ids.push_back(i < 40 ? (i < 9 ? 0 : i < 30 ? 1 : 2) : (i < 62 ? 3 : 4));
  auto seg = hax::from_host(ids, 2 * Batch, 40 * Pos);
  for (const auto& c : configs) {
    const std::string name = c.name;
    CAPTURE(name);
    auto x = random_qkv<double>(50, 2, c.p, c.p, 3, 5, 1.5);
    const auto* sp = c.segments ? &seg : nullptr;
    auto g_flash = grads_of<double>([&](const qkv<double>& m) { return flash_of(m, c.o, sp); }, x);
    auto g_plain = grads_of<double>([&](const qkv<double>& m) { return plain_like_flash(m, c.o, sp); }, x);
    check_grads_close(g_flash, g_plain, 1e-10, 1e-12);

    qkv<float> xf{hax::astype<float>(x.q), hax::astype<float>(x.k), hax::astype<float>(x.v)};
    auto gf = grads_of<float>([&](const qkv<float>& m) { return flash_of(m, c.o, sp); }, xf);
    check_close(host(gf.q), host(g_plain.q), 1e-4, 2e-5);
    check_close(host(gf.k), host(g_plain.k), 1e-4, 2e-5);
    check_close(host(gf.v), host(g_plain.v), 1e-4, 2e-5);
  }
}

TEST_CASE("dot_product_attention gradients match finite differences") {
  auto x = random_qkv<double>(60, 2, 5, 6, 2, 3, 1.5);
  auto mask = nn::causal_mask(5 * Pos, 6 * KPos, 1);
  gradcheck::check_output_gradient(
      [&](const qkv<double>& m) { return nn::dot_product_attention(m.q, m.k, m.v, KPos, Key, mask); }, x);
}

TEST_CASE("flash_attention results do not depend on the thread count") {
  const int saved = hax::num_threads();
  auto x = random_qkv<float>(70, 1, 300, 300, 5, 16);
  nn::flash_attention_options o{.sliding_window = 200, .block_q = 64, .block_k = 32};
  auto run = [&] {
    auto y = flash_of(x, o);
    auto g = grads_of<float>([&](const qkv<float>& m) { return flash_of(m, o); }, x);
    return std::vector<std::vector<float>>{y.to_host(), g.q.to_host(), g.k.to_host(), g.v.to_host()};
  };
  hax::set_num_threads(1);
  auto one = run();
  hax::set_num_threads(3);
  auto three = run();
  hax::set_num_threads(saved);
  for (std::size_t i = 0; i < one.size(); ++i) CHECK(one[i] == three[i]);
}

TEST_CASE("flash_attention: a query that sees no key gives zeros and zero gradients") {
  // Keys start after the first query: query 0 sees nothing.
  auto x = random_qkv<double>(80, 1, 4, 4, 1, 2);
  nn::flash_attention_options o{.k_start = 1, .block_q = 2, .block_k = 2};
  auto y = host(flash_of(x, o));
  CHECK(y[0] == 0.0);
  CHECK(y[1] == 0.0);
  gradcheck::check_output_gradient([&](const qkv<double>& m) { return flash_of(m, o); }, x);
}

TEST_CASE("flash_attention: size errors name the shapes") {
  auto q = random_array<double>(1, 4 * Pos, 2 * Key);
  auto k = random_array<double>(2, 4 * KPos, 3 * Key);
  auto v = random_array<double>(3, 4 * KPos, 3 * Key);
  CHECK_THROWS_AS(nn::flash_attention(q, k, v, Pos, KPos, Key), hax::shape_error);
  auto k2 = random_array<double>(2, 4 * KPos, 2 * Key);
  CHECK_THROWS_AS(nn::flash_attention(q, k2, v, Pos, KPos, Key, {.block_q = 0}), std::invalid_argument);
}
