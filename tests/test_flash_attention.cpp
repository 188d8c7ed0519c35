// Tests for flash_attention (nn/attention.hpp): equal to plain attention in values and gradients across masks,
// layouts and block shapes, finite-difference gradients, thread-count independence, and its errors.
#include "attention_helpers.hpp"

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
  nn::attention_options po{o.scale, o.logits_soft_cap};
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
      {"soft cap, ragged blocks", 37, 37, {.block_q = 8, .block_k = 16, .logits_soft_cap = 1.5}, false},
      {"soft cap + segments + window", 40, 40,
       {.sliding_window = 6, .block_q = 16, .block_k = 4, .logits_soft_cap = 2.0}, true},
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
      {"soft cap", {.block_q = 3, .block_k = 4, .logits_soft_cap = 1.0}, false},
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
      {"soft cap + window", 33, {.sliding_window = 7, .block_q = 8, .block_k = 4, .logits_soft_cap = 1.5}, false},
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

// ---------------------------------------------------------------------------------------------------------
// The portable kernels (what a device build runs) against the host kernels

namespace {

/// The values of f at x and the gradients of sum(f(x) * w) (fixed random w) with respect to x's q, k and v,
/// computed on the portable kernels and on the host kernels, agree within rtol/atol.
template <class X, class F>
void check_portable_like_host(const F& f, const X& x, double rtol, double atol) {
  auto run = [&](bool portable) {
    hax::detail::portable_kernels_scope scope(portable);
    // Under the device guard both runs take the portable kernels (the host ones read arrays on the host).
    CHECK(hax::detail::use_host_kernels() == (!portable && !hax::detail::device_guard::requested()));
    decltype(f(x)) y;
    {
      hax::no_grad_guard ng;
      y = f(x);
    }
    auto w = gradcheck::cotangent_like(y, 11);
    X g = hax::grad([&](const X& m) { return hax::sum(f(m) * w); })(x);
    return std::pair{y, g};
  };
  const auto [y_host, g_host] = run(false);
  const auto [y_port, g_port] = run(true);
  check_close(host(y_port), host(y_host), rtol, atol);
  check_close(host(g_port.q), host(g_host.q), rtol, atol);
  check_close(host(g_port.k), host(g_host.k), rtol, atol);
  check_close(host(g_port.v), host(g_host.v), rtol, atol);
}

}  // namespace

TEST_CASE("flash attention: portable kernels match the host kernels (masks, offsets, segments, ragged blocks)") {
  struct config {
    const char* name;
    std::int64_t p, n;
    nn::flash_attention_options o;
    bool segments;
  };
  const std::vector<config> configs = {
      {"causal, one block", 8, 8, {}, false},
      {"causal, ragged blocks", 37, 37, {.block_q = 8, .block_k = 16}, false},
      {"not causal, fewer keys than queries", 21, 13, {.causal = false, .block_q = 4, .block_k = 6}, false},
      {"sliding window 5", 33, 33, {.sliding_window = 5, .block_q = 8, .block_k = 8}, false},
      {"sliding window 1", 12, 12, {.sliding_window = 1, .block_q = 5, .block_k = 3}, false},
      {"sliding window, not causal", 19, 19, {.causal = false, .sliding_window = 4, .block_q = 4, .block_k = 5}, false},
      {"segments", 40, 40, {.block_q = 8, .block_k = 8}, true},
      {"segments + window", 40, 40, {.sliding_window = 6, .block_q = 16, .block_k = 4}, true},
      {"segments, not causal", 40, 40, {.causal = false, .block_q = 16, .block_k = 16}, true},
      {"rows that see no key (k_start)", 9, 9, {.k_start = 2, .block_q = 4, .block_k = 3}, false},
      {"segments, a row that sees no key", 40, 40, {.k_start = 1, .block_q = 8, .block_k = 8}, true},
      {"decode chunk (q_start)", 6, 19, {.q_start = 13, .block_q = 4, .block_k = 4}, false},
      {"explicit scale", 17, 17, {.scale = 0.7, .block_q = 4, .block_k = 8}, false},
      {"soft cap + segments + window", 40, 40,
       {.sliding_window = 6, .block_q = 16, .block_k = 4, .logits_soft_cap = 2.0}, true},
  };
  std::vector<std::int32_t> ids;
  for (std::int32_t d : {0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 3, 3, 3, 3, 3,
                         3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 4, 4, 4, 4, 4})
    ids.push_back(d);
  for (int i = 0; i < 40; ++i) ids.push_back(i < 25 ? 7 : 8);
  const auto seg = hax::from_host(ids, 2 * Batch, 40 * Pos);
  for (const auto& c : configs) {
    const std::string name = c.name;
    CAPTURE(name);
    const auto* sp = c.segments ? &seg : nullptr;
    auto x = random_qkv<double>(90, 2, c.p, c.n, 3, 4, 1.5);
    check_portable_like_host([&](const qkv<double>& m) { return flash_of(m, c.o, sp); }, x, 1e-11, 1e-13);
    qkv<float> xf{hax::astype<float>(x.q), hax::astype<float>(x.k), hax::astype<float>(x.v)};
    check_portable_like_host([&](const qkv<float>& m) { return flash_of(m, c.o, sp); }, xf, 1e-5, 1e-6);
  }
}

namespace {
/// q with its axes permuted (position outermost, batch inside it), k and v as usual.
struct permuted_q {
  BOOST_HANA_DEFINE_STRUCT(permuted_q, (named_array<float, axes<Pos, Head, Batch, Key>>, q),
                           (named_array<float, axes<Batch, KPos, Head, Key>>, k),
                           (named_array<float, axes<Batch, Head, KPos, Embed>>, v));
};
}  // namespace

TEST_CASE("flash attention: portable kernels match the host kernels (permuted and packed layouts)") {
  {
    // q {pos, head, batch, key}: rows strided by head x batch x key; v {batch, head, key_pos, embed}.
    permuted_q x{random_array<float>(91, 23 * Pos, 3 * Head, 2 * Batch, 4 * Key) * 1.5,
                 random_array<float>(92, 2 * Batch, 23 * KPos, 3 * Head, 4 * Key) * 1.5,
                 random_array<float>(93, 2 * Batch, 3 * Head, 23 * KPos, 5 * Embed)};
    nn::flash_attention_options o{.sliding_window = 9, .block_q = 8, .block_k = 5};
    check_portable_like_host([&](const permuted_q& m) { return nn::flash_attention(m.q, m.k, m.v, Pos, KPos, Key, o); },
                             x, 1e-5, 1e-6);
  }
  {
    // Head axes outermost: every operand packed before the kernels.
    auto q = random_array<double>(94, 2 * Head, 11 * Pos, 3 * Key);
    auto k = random_array<double>(95, 11 * KPos, 2 * Head, 3 * Key);
    auto v = random_array<double>(96, 2 * Head, 11 * KPos, 4 * Embed);
    outer_heads x{hax::rearrange<axes<Key, Head, Pos>>(q), hax::rearrange<axes<Key, KPos, Head>>(k),
                  hax::rearrange<axes<Embed, KPos, Head>>(v)};
    nn::flash_attention_options o{.block_q = 4, .block_k = 3};
    check_portable_like_host([&](const outer_heads& m) { return nn::flash_attention(m.q, m.k, m.v, Pos, KPos, Key, o); },
                             x, 1e-11, 1e-13);
  }
}

TEST_CASE("flash attention: portable kernels against plain attention and finite differences") {
  hax::detail::portable_kernels_scope portable;
  auto x = random_qkv<double>(97, 2, 40, 40, 2, 3, 1.5);
  std::vector<std::int32_t> ids;
  for (int i = 0; i < 80; ++i) ids.push_back(i < 40 ? (i < 9 ? 0 : i < 30 ? 1 : 2) : (i < 62 ? 3 : 4));
  auto seg = hax::from_host(ids, 2 * Batch, 40 * Pos);
  nn::flash_attention_options o{.sliding_window = 7, .block_q = 16, .block_k = 8};
  check_close(host(flash_of(x, o, &seg)), host(plain_like_flash(x, o, &seg)), 1e-12, 1e-13);
  auto g_flash = grads_of<double>([&](const qkv<double>& m) { return flash_of(m, o, &seg); }, x);
  auto g_plain = grads_of<double>([&](const qkv<double>& m) { return plain_like_flash(m, o, &seg); }, x);
  check_grads_close(g_flash, g_plain, 1e-10, 1e-12);
  nn::flash_attention_options oc{.block_q = 16, .block_k = 8, .logits_soft_cap = 1.5};  // soft-capped
  check_close(host(flash_of(x, oc, &seg)), host(plain_like_flash(x, oc, &seg)), 1e-12, 1e-13);
  check_grads_close(grads_of<double>([&](const qkv<double>& m) { return flash_of(m, oc, &seg); }, x),
                    grads_of<double>([&](const qkv<double>& m) { return plain_like_flash(m, oc, &seg); }, x), 1e-10,
                    1e-12);
  auto small = random_qkv<double>(98, 1, 5, 5, 2, 2, 1.5);
  nn::flash_attention_options so{.k_start = 1, .block_q = 2, .block_k = 3};
  gradcheck::check_output_gradient([&](const qkv<double>& m) { return flash_of(m, so); }, small);
}

TEST_CASE("flash attention: the portable tiled kernels match the row kernels, and tile plans depend on the head sizes only") {
  namespace attn = nn::detail::attn;
  // The plans a GPT-2 / Llama 2 head (64) gets: shared memory under 40 KiB, key tiles reused by 32 query rows.
  const auto f = attn::plan_tiles<float>(attn::tile_kernel::forward, 64, 64);
  CHECK(f.bq == 32);
  CHECK(f.bk == 32);
  CHECK(f.bytes <= attn::tile_scratch_limit);
  const auto dq = attn::plan_tiles<float>(attn::tile_kernel::dq, 64, 64);
  CHECK(dq.bq == 32);
  CHECK(dq.bk == 16);
  const auto dkdv = attn::plan_tiles<float>(attn::tile_kernel::dkdv, 64, 64);
  CHECK(dkdv.bq == 8);
  CHECK(dkdv.bk == 32);
  CHECK(dkdv.bytes <= attn::tile_scratch_limit);
  CHECK(attn::plan_tiles<float>(attn::tile_kernel::dkdv, 128, 128).bk >= 8);  // Llama 3's heads still tile
  CHECK(attn::plan_tiles<double>(attn::tile_kernel::dkdv, 64, 64).bk < 32);  // double takes smaller tiles
  CHECK(attn::plan_tiles<float>(attn::tile_kernel::forward, 2048, 64).bytes == 0);  // too large: row kernels

  hax::detail::portable_kernels_scope portable;
  std::vector<std::int32_t> ids;
  for (int i = 0; i < 2 * 77; ++i) ids.push_back(i < 77 ? (i < 20 ? 0 : i < 60 ? 1 : 2) : (i < 120 ? 3 : 4));
  const auto seg = hax::from_host(ids, 2 * Batch, 77 * Pos);
  struct config {
    const char* name;
    std::int64_t p, n, d;
    nn::flash_attention_options o;
    bool segments;
  };
  // Past one tile in both directions (77 = 2 x 32 + 13), ragged ends, every mask.
  const std::vector<config> configs = {
      {"causal", 77, 77, 16, {}, false},
      {"not causal, more keys", 45, 77, 8, {.causal = false}, false},
      {"sliding window 40", 77, 77, 12, {.sliding_window = 40}, false},
      {"segments + window + soft cap", 77, 77, 5, {.sliding_window = 50, .logits_soft_cap = 2.0}, true},
      {"decode chunk (q_start)", 13, 77, 8, {.q_start = 64}, false},
      {"rows that see no key (k_start)", 77, 77, 8, {.k_start = 3}, false},
  };
  for (const auto& c : configs) {
    const std::string name = c.name;
    CAPTURE(name);
    const auto* sp = c.segments ? &seg : nullptr;
    auto x = random_qkv<double>(123, 2, c.p, c.n, 2, c.d, 1.5);
    auto run = [&](bool tiles) {
      attn::tiles_scope scope(tiles);
      auto y = host(flash_of(x, c.o, sp));
      auto g = grads_of<double>([&](const qkv<double>& m) { return flash_of(m, c.o, sp); }, x);
      return std::pair{y, g};
    };
    const auto [y_tiles, g_tiles] = run(true);
    const auto [y_rows, g_rows] = run(false);
    check_close(y_tiles, y_rows, 1e-12, 1e-13);
    check_grads_close(g_tiles, g_rows, 1e-10, 1e-12);
    // Against plain attention too, so that a mask both kernels got wrong the same way shows.
    if (!c.segments && c.o.k_start == 0) check_close(y_tiles, host(plain_like_flash(x, c.o, sp)), 1e-12, 1e-13);
    // Reruns are bitwise.
    const auto again = run(true);
    CHECK(again.first == y_tiles);
  }
}

TEST_CASE("flash attention: portable forward with host backward and the reverse (kernels chosen per call)") {
  // The choice is made per call: a forward recorded under one choice and differentiated under the other still
  // gives the gradients (the host backward then summarises the segment ids that the portable forward skipped).
  std::vector<std::int32_t> ids;
  for (int i = 0; i < 80; ++i) ids.push_back(i < 40 ? (i < 9 ? 0 : i < 30 ? 1 : 2) : (i < 62 ? 3 : 4));
  const auto seg = hax::from_host(ids, 2 * Batch, 40 * Pos);
  auto x = random_qkv<double>(99, 2, 40, 40, 2, 3, 1.5);
  nn::flash_attention_options o{.sliding_window = 11, .block_q = 16, .block_k = 8};
  named_array<double, axes<Batch, Pos, Head, Key>> w;
  {
    hax::no_grad_guard ng;
    w = gradcheck::cotangent_like(flash_of(x, o, &seg), 11);
  }
  auto grads_with = [&](bool forward_portable, bool backward_portable) {
    hax::detail::portable_kernels_scope outer(backward_portable);
    return hax::grad([&](const qkv<double>& m) {
      named_array<double, axes<Batch, Pos, Head, Key>> y;
      {
        hax::detail::portable_kernels_scope inner(forward_portable);
        y = flash_of(m, o, &seg);
      }
      return hax::sum(y * w);
    })(x);
  };
  const auto all_host = grads_with(false, false);
  check_grads_close(grads_with(true, false), all_host, 1e-11, 1e-13);
  check_grads_close(grads_with(false, true), all_host, 1e-11, 1e-13);
  check_grads_close(grads_with(true, true), all_host, 1e-11, 1e-13);
}
