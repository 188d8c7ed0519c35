// Tests for haliax/nn/attention.hpp: masks (exact values) and plain attention (with soft caps and learned sinks)
// against a double-precision loop.
// Flash attention is tested in test_flash_attention.cpp.
#include "attention_helpers.hpp"

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

TEST_CASE("dot_product_attention: logit soft-capping (Gemma 2), values against a loop and finite differences") {
  const std::int64_t B = 2, P = 5, N = 5, H = 2, D = 4;
  // Large scores, so that the cap (tanh saturating near +-cap) changes the result.
  auto x = random_qkv<double>(21, B, P, N, H, D, 4.0);
  auto q = host(x.q), k = host(x.k), v = host(x.v);
  const nn::attention_options capped{.scale = 0.4, .logits_soft_cap = 2.0};
  auto causal = [](auto, auto i, auto j) { return j <= i; };
  auto y = nn::dot_product_attention(x.q, x.k, x.v, KPos, Key, nn::causal_mask(P * Pos, N * KPos), capped);
  check_close(host(y), reference(q, k, v, B, P, N, H, D, 0.4, causal, 2.0), 1e-12, 1e-12);
  // The cap matters here: without it the result is different.
  const auto uncapped = reference(q, k, v, B, P, N, H, D, 0.4, causal);
  double diff = 0;
  for (std::size_t i = 0; i < uncapped.size(); ++i) diff = std::max(diff, std::abs(uncapped[i] - host(y)[i]));
  CHECK(diff > 1e-2);
  auto yn = nn::dot_product_attention(x.q, x.k, x.v, KPos, Key, capped);
  check_close(host(yn), reference(q, k, v, B, P, N, H, D, 0.4, [](auto, auto, auto) { return true; }, 2.0), 1e-12,
              1e-12);
  gradcheck::check_output_gradient(
      [&](const qkv<double>& m) {
        return nn::dot_product_attention(m.q, m.k, m.v, KPos, Key, nn::causal_mask(P * Pos, N * KPos), capped);
      },
      x);
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

namespace {
using sink_array = named_array<double, axes<Head>>;
/// q, k, v and one sink per head, differentiated together.
struct qkv_sinks {
  BOOST_HANA_DEFINE_STRUCT(qkv_sinks, (q_array<double>, q), (kv_array<double>, k), (kv_array<double>, v),
                           (sink_array, sinks));
};
}  // namespace

TEST_CASE("dot_product_attention_with_sink: upstream's case, a double loop, limits and finite differences") {
  // upstream's test_attention_sink: zero q and k, v of ones, a zero sink: two keys and the sink share the weight
  {
    const auto q = hax::zeros<double>(1 * Batch, 2 * Pos, 1 * Head, 1 * Key);
    const auto k = hax::zeros<double>(1 * Batch, 2 * KPos, 1 * Head, 1 * Key);
    const auto v = hax::ones<double>(1 * Batch, 2 * KPos, 1 * Head, 1 * Key);
    const auto every = nn::causal_mask(2 * Pos, 2 * KPos, 2);  // offset 2: every key visible
    const auto y = nn::dot_product_attention_with_sink(q, k, v, hax::zeros<double>(1 * Head), KPos, Key, every);
    for (double x : host(y)) CHECK(x == doctest::Approx(2.0 / 3).epsilon(1e-14));
  }
  const std::int64_t B = 2, P = 5, N = 5, H = 3, D = 4;
  auto x = random_qkv<double>(31, B, P, N, H, D, 2.0);
  auto q = host(x.q), k = host(x.k), v = host(x.v);
  const std::vector<double> s = {-1.5, 0.3, 2.5};
  const auto sinks = hax::from_host(s, H * Head);
  auto causal = [](auto, auto i, auto j) { return j <= i; };
  const auto mask = nn::causal_mask(P * Pos, N * KPos);
  for (double cap : {0.0, 1.5}) {
    CAPTURE(cap);
    nn::attention_options o{.scale = 0.4};
    if (cap > 0) o.logits_soft_cap = cap;
    const auto y = nn::dot_product_attention_with_sink(x.q, x.k, x.v, sinks, KPos, Key, mask, o);
    static_assert(std::is_same_v<decltype(y), const q_array<double>>);
    check_close(host(y), reference(q, k, v, B, P, N, H, D, 0.4, causal, cap, &s), 1e-12, 1e-12);
    // the weights of a row sum to 1 minus the sink's share
    const auto w = nn::dot_product_attention_weights_with_sink(x.q, x.k, sinks, KPos, Key, mask, o);
    const auto sums = hax::sum(w, KPos).to_host();
    for (double t : sums) CHECK((t > 0 && t < 1));
  }
  // a sink far below every score changes nothing; one far above takes all the weight
  const auto plain = nn::dot_product_attention(x.q, x.k, x.v, KPos, Key, mask);
  check_close(host(nn::dot_product_attention_with_sink(x.q, x.k, x.v, hax::full<double>(-1e4, H * Head), KPos, Key,
                                                       mask)),
              host(plain), 1e-12, 1e-12);
  for (double y : host(nn::dot_product_attention_with_sink(x.q, x.k, x.v, hax::full<double>(1e3, H * Head), KPos, Key,
                                                           mask)))
    CHECK(std::abs(y) < 1e-12);
  // gradients of q, k, v and the sinks, with the soft cap
  const qkv_sinks m{x.q, x.k, x.v, sinks};
  gradcheck::check_output_gradient(
      [&](const qkv_sinks& a) {
        return nn::dot_product_attention_with_sink(a.q, a.k, a.v, a.sinks, KPos, Key, mask,
                                                   {.scale = 0.4, .logits_soft_cap = 1.5});
      },
      m);
}
