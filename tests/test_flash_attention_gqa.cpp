// Tests for grouped-query attention (GQA; MQA with one key/value head) in nn/attention.hpp: k and v lack q's
// query-group axis and are shared by every query head of their group. The plain path broadcasts them by name
// (checked against k and v repeated per query head); flash_attention equals it in values and gradients across
// group sizes, masks, block shapes and both q layouts, matches finite differences, does not depend on the
// thread count, and its axis rules hold at compile time.
#include "attention_helpers.hpp"

namespace {

inline constexpr struct KvHead final : haliax::axis<"kv_head"> {
} KvHead;
inline constexpr struct QGroup final : haliax::axis<"q_heads_per_group"> {
} QGroup;

/// Llama's layout: q {batch, position, kv_head, q_heads_per_group, key}, k and v {batch, key_position, kv_head,
/// key}.
template <class T>
using gq_array = named_array<T, axes<Batch, Pos, KvHead, QGroup, Key>>;
template <class T>
using gkv_array = named_array<T, axes<Batch, KPos, KvHead, Key>>;
/// Heads before positions: q {batch, kv_head, q_heads_per_group, position, key}, k and v {batch, kv_head,
/// key_position, key}.
template <class T>
using gq_heads_first = named_array<T, axes<Batch, KvHead, QGroup, Pos, Key>>;
template <class T>
using gkv_heads_first = named_array<T, axes<Batch, KvHead, KPos, Key>>;

/// q, k and v as one module, so that one gradient call differentiates all three.
template <class Q, class KV>
struct gqa {
  BOOST_HANA_DEFINE_STRUCT(gqa, (Q, q), (KV, k), (KV, v));
};
template <class T>
using gqa_llama = gqa<gq_array<T>, gkv_array<T>>;
template <class T>
using gqa_heads_first = gqa<gq_heads_first<T>, gkv_heads_first<T>>;

using PosT = std::remove_cvref_t<decltype(Pos)>;
using KPosT = std::remove_cvref_t<decltype(KPos)>;
using KeyT = std::remove_cvref_t<decltype(Key)>;
using segment_ids = named_array<std::int32_t, axes<Batch, Pos>>;

struct dims {
  std::int64_t batch, pos, kpos, kv_heads, groups, key;
};

template <class T>
gqa_llama<T> random_gqa(unsigned seed, dims s, double amplitude = 1.5) {
  auto q = random_array<T>(seed, s.batch * Batch, s.pos * Pos, s.kv_heads * KvHead, s.groups * QGroup, s.key * Key);
  auto k = random_array<T>(seed + 1, s.batch * Batch, s.kpos * KPos, s.kv_heads * KvHead, s.key * Key);
  auto v = random_array<T>(seed + 2, s.batch * Batch, s.kpos * KPos, s.kv_heads * KvHead, s.key * Key);
  return {q * amplitude, k * amplitude, v};
}

template <class T>
gqa_heads_first<T> heads_first(const gqa_llama<T>& x) {
  return {hax::rearrange<axes<Batch, KvHead, QGroup, Pos, Key>>(x.q),
          hax::rearrange<axes<Batch, KvHead, KPos, Key>>(x.k), hax::rearrange<axes<Batch, KvHead, KPos, Key>>(x.v)};
}

template <class Q, class KV>
auto as_float(const gqa<Q, KV>& x) {
  using QF = decltype(hax::astype<float>(x.q));
  using KF = decltype(hax::astype<float>(x.k));
  return gqa<QF, KF>{hax::astype<float>(x.q), hax::astype<float>(x.k), hax::astype<float>(x.v)};
}

/// The mask flash_attention builds from its options, for the plain path: {batch, pos, key_pos}.
template <class X>
auto mask_like_flash(const X& x, const nn::flash_attention_options& o, const segment_ids* seg) {
  const auto P = x.q.sized(Pos);
  const auto N = x.k.sized(KPos);
  auto base = o.sliding_window > 0 ? nn::sliding_window_mask(P, N, o.sliding_window, o.q_start, o.k_start)
              : o.causal           ? nn::causal_mask(P, N, o.q_start, o.k_start)
                                   : hax::full<bool>(true, P, N);
  if (seg) return base && nn::segment_mask(*seg, Pos, KPos);
  return base && hax::full<bool>(true, x.q.sized(Batch), P, N);
}

/// The plain path on the GQA operands (k and v broadcast by name inside its dots).
template <class X>
auto plain_gqa(const X& x, const nn::flash_attention_options& o, const segment_ids* seg = nullptr) {
  return nn::dot_product_attention(x.q, x.k, x.v, KPos, Key, mask_like_flash(x, o, seg), {o.scale});
}

template <class X>
auto flash_gqa(const X& x, const nn::flash_attention_options& o, const segment_ids* seg = nullptr) {
  if (seg) return nn::flash_attention(x.q, x.k, x.v, Pos, KPos, Key, *seg, hax::rename(*seg, Pos, KPos), o);
  return nn::flash_attention(x.q, x.k, x.v, Pos, KPos, Key, o);
}

/// Gradients of sum(f(x) * w) for a fixed random cotangent w, with respect to q, k and v.
template <class X, class F>
X grads_gqa(const F& f, const X& x) {
  decltype(f(x)) y0;
  {
    hax::no_grad_guard ng;
    y0 = f(x);
  }
  auto w = gradcheck::cotangent_like(y0, 11);
  return hax::grad([&](const X& m) { return hax::sum(f(m) * w); })(x);
}

template <class X, class Y>
void check_grads(const X& got, const Y& want, double rtol, double atol) {
  check_close(host(got.q), host(want.q), rtol, atol);
  check_close(host(got.k), host(want.k), rtol, atol);
  check_close(host(got.v), host(want.v), rtol, atol);
}

/// Segment ids for batch 2 x 40 positions: documents of lengths 3, 11, 1, 20, 5 in row 0 and 25, 15 in row 1
/// (boundaries inside blocks).
segment_ids forty_position_segments() {
  std::vector<std::int32_t> ids;
  for (std::int32_t d : {0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 3, 3, 3, 3, 3,
                         3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 4, 4, 4, 4, 4})
    ids.push_back(d);
  for (int i = 0; i < 40; ++i) ids.push_back(i < 25 ? 7 : 8);
  return hax::from_host(ids, 2 * Batch, 40 * Pos);
}

struct config {
  const char* name;
  dims s;
  nn::flash_attention_options o;
  bool segments;
};

}  // namespace

TEST_CASE("GQA: axes flash_attention accepts and rejects, result axes") {
  using QL = axes<Batch, Pos, KvHead, QGroup, Key>;
  using KL = axes<Batch, KPos, KvHead, Key>;
  // Llama's layout, heads first, MHA, and MQA written with the group axis only.
  static_assert(nn::FlashAttentionAxes<QL, KL, KL, PosT, KPosT, KeyT>);
  static_assert(nn::FlashAttentionAxes<axes<Batch, KvHead, QGroup, Pos, Key>, axes<Batch, KvHead, KPos, Key>,
                                       axes<Batch, KvHead, KPos, Key>, PosT, KPosT, KeyT>);
  static_assert(nn::FlashAttentionAxes<axes<Batch, Pos, QGroup, Key>, axes<Batch, KPos, Key>, axes<Batch, KPos, Key>,
                                       PosT, KPosT, KeyT>);
  static_assert(nn::FlashAttentionAxes<axes<Pos, QGroup, Key>, axes<KPos, Key>, axes<KPos, Key>, PosT, KPosT, KeyT>);
  using A = nn::detail::attn::flash_axes<QL, KL, KL, PosT, KPosT, KeyT>;
  static_assert(A::k_batch_in_q && A::v_batch_is_k_batch);
  // k with an axis q lacks; v with the group axis k lacks; v lacking a batch axis k has.
  using KX = axes<Batch, KPos, KvHead, Embed, Key>;
  static_assert(!nn::FlashAttentionAxes<QL, KX, KL, PosT, KPosT, KeyT>);
  static_assert(!nn::detail::attn::flash_axes<QL, KX, KL, PosT, KPosT, KeyT>::k_batch_in_q);
  using VG = axes<Batch, KPos, KvHead, QGroup, Key>;
  static_assert(!nn::FlashAttentionAxes<QL, KL, VG, PosT, KPosT, KeyT>);
  static_assert(!nn::detail::attn::flash_axes<QL, KL, VG, PosT, KPosT, KeyT>::v_batch_is_k_batch);
  static_assert(!nn::FlashAttentionAxes<QL, KL, axes<Batch, KPos, Key>, PosT, KPosT, KeyT>);

  auto x = random_gqa<double>(1, {2, 5, 5, 2, 3, 4});
  auto y = nn::flash_attention(x.q, x.k, x.v, Pos, KPos, Key);
  static_assert(std::is_same_v<decltype(y), gq_array<double>>);
  auto xh = heads_first(x);
  auto yh = nn::flash_attention(xh.q, xh.k, xh.v, Pos, KPos, Key);
  static_assert(std::is_same_v<decltype(yh), gq_heads_first<double>>);
  static_assert(std::is_same_v<decltype(plain_gqa(x, {})), gq_array<double>>);
  check_close(host(hax::rearrange<axes<Batch, Pos, KvHead, QGroup, Key>>(yh)), host(y), 1e-14, 1e-15);
}

TEST_CASE("GQA: the plain path equals multi-head attention on k and v repeated per query head") {
  const dims s{2, 11, 11, 2, 3, 4};
  auto x = random_gqa<double>(10, s);
  const auto mask = nn::causal_mask(s.pos * Pos, s.kpos * KPos);
  auto repeat = [&](const gkv_array<double>& a) {
    return hax::broadcast_to(a, s.batch * Batch, s.kpos * KPos, s.kv_heads * KvHead, s.groups * QGroup, s.key * Key);
  };
  auto grouped = [&](const gqa_llama<double>& m) { return nn::dot_product_attention(m.q, m.k, m.v, KPos, Key, mask); };
  auto repeated = [&](const gqa_llama<double>& m) {
    return nn::dot_product_attention(m.q, repeat(m.k), repeat(m.v), KPos, Key, mask);
  };
  check_close(host(grouped(x)), host(repeated(x)), 1e-14, 1e-15);
  // dK and dV sum over the groups (the broadcast's gradient), in both.
  check_grads(grads_gqa(grouped, x), grads_gqa(repeated, x), 1e-12, 1e-14);

  // Flash attention on the shared k and v equals flash attention on the repeated ones (its MHA path).
  nn::flash_attention_options o{.block_q = 4, .block_k = 4};
  auto flash_repeated = nn::flash_attention(x.q, repeat(x.k), repeat(x.v), Pos, KPos, Key, o);
  check_close(host(nn::flash_attention(x.q, x.k, x.v, Pos, KPos, Key, o)), host(flash_repeated), 1e-14, 1e-15);
}

TEST_CASE("GQA flash_attention equals the plain path: groups 1, 2, 4, MQA, masks, ragged blocks, both layouts") {
  const std::vector<config> configs = {
      {"G=1, causal, ragged blocks", {2, 37, 37, 2, 1, 4}, {.block_q = 8, .block_k = 16}, false},
      {"G=2, causal, block_k < block_q", {2, 29, 29, 2, 2, 4}, {.block_q = 16, .block_k = 5}, false},
      {"G=4, sliding window 5", {2, 33, 33, 2, 4, 3}, {.sliding_window = 5, .block_q = 8, .block_k = 8}, false},
      {"MQA G=4, causal, ragged", {2, 21, 21, 1, 4, 4}, {.block_q = 4, .block_k = 6}, false},
      {"G=2, segments", {2, 40, 40, 2, 2, 3}, {.block_q = 8, .block_k = 8}, true},
      {"MQA G=3, segments + window", {2, 40, 40, 1, 3, 3}, {.sliding_window = 6, .block_q = 16, .block_k = 4}, true},
      {"G=2, not causal", {2, 21, 13, 2, 2, 4}, {.causal = false, .block_q = 4, .block_k = 6}, false},
      {"G=4, decode chunk (q_start)", {1, 6, 19, 2, 4, 4}, {.q_start = 13, .block_q = 4, .block_k = 4}, false},
      {"G=2, explicit scale, one tile", {2, 17, 17, 3, 2, 4}, {.scale = 0.7, .block_q = 32, .block_k = 32}, false},
  };
  const auto seg = forty_position_segments();
  for (const auto& c : configs) {
    const std::string name = c.name;
    CAPTURE(name);
    auto x = random_gqa<double>(20, c.s);
    const auto* sp = c.segments ? &seg : nullptr;
    auto want = plain_gqa(x, c.o, sp);
    check_close(host(flash_gqa(x, c.o, sp)), host(want), 1e-12, 1e-13);
    check_close(host(flash_gqa(as_float(x), c.o, sp)), host(want), 2e-5, 2e-6);

    // Heads before positions: the same values, laid out as q.
    auto xh = heads_first(x);
    auto got_h = flash_gqa(xh, c.o, sp);
    check_close(host(got_h), host(plain_gqa(xh, c.o, sp)), 1e-12, 1e-13);
    check_close(host(hax::rearrange<axes<Batch, Pos, KvHead, QGroup, Key>>(got_h)), host(want), 1e-12, 1e-13);
  }
}

TEST_CASE("GQA flash_attention: operands with the head axes outermost (packed path)") {
  auto x = random_gqa<double>(25, {2, 13, 13, 2, 3, 3});
  auto q = hax::rearrange<axes<Key, QGroup, Pos, KvHead, Batch>>(x.q);
  auto k = hax::rearrange<axes<Key, KvHead, KPos, Batch>>(x.k);
  auto v = hax::rearrange<axes<Key, KPos, Batch, KvHead>>(x.v);
  nn::flash_attention_options o{.sliding_window = 4, .block_q = 4, .block_k = 3};
  auto y = nn::flash_attention(q, k, v, Pos, KPos, Key, o);
  static_assert(std::is_same_v<decltype(y), named_array<double, axes<QGroup, Pos, KvHead, Batch, Key>>>);
  check_close(host(hax::rearrange<axes<Batch, Pos, KvHead, QGroup, Key>>(y)), host(flash_gqa(x, o)), 1e-13, 1e-14);
}

TEST_CASE("GQA flash_attention gradients equal the plain path's") {
  const std::vector<config> configs = {
      {"G=1, causal", {2, 37, 37, 2, 1, 4}, {.block_q = 8, .block_k = 16}, false},
      {"G=2, window", {2, 33, 33, 2, 2, 4}, {.sliding_window = 7, .block_q = 8, .block_k = 4}, false},
      {"G=4, segments", {2, 40, 40, 2, 4, 3}, {.block_q = 16, .block_k = 8}, true},
      {"MQA G=4, causal, ragged", {2, 23, 23, 1, 4, 4}, {.block_q = 8, .block_k = 5}, false},
      {"G=2, not causal", {2, 23, 17, 2, 2, 4}, {.causal = false, .block_q = 8, .block_k = 8}, false},
      {"MQA G=2, segments + window", {2, 40, 40, 1, 2, 3}, {.sliding_window = 9, .block_q = 8, .block_k = 16}, true},
  };
  const auto seg = forty_position_segments();
  for (const auto& c : configs) {
    const std::string name = c.name;
    CAPTURE(name);
    auto x = random_gqa<double>(50, c.s);
    const auto* sp = c.segments ? &seg : nullptr;
    auto g_plain = grads_gqa([&](const gqa_llama<double>& m) { return plain_gqa(m, c.o, sp); }, x);
    auto g_flash = grads_gqa([&](const gqa_llama<double>& m) { return flash_gqa(m, c.o, sp); }, x);
    check_grads(g_flash, g_plain, 1e-10, 1e-12);

    auto xf = as_float(x);
    auto gf = grads_gqa([&](const decltype(xf)& m) { return flash_gqa(m, c.o, sp); }, xf);
    check_grads(gf, g_plain, 1e-4, 2e-5);

    // Heads before positions.
    auto xh = heads_first(x);
    auto gh = grads_gqa([&](const gqa_heads_first<double>& m) { return flash_gqa(m, c.o, sp); }, xh);
    auto gh_plain = grads_gqa([&](const gqa_heads_first<double>& m) { return plain_gqa(m, c.o, sp); }, xh);
    check_grads(gh, gh_plain, 1e-10, 1e-12);
  }
}

TEST_CASE("GQA flash_attention gradients match finite differences") {
  const std::vector<config> configs = {
      {"G=2, causal", {2, 8, 8, 2, 2, 2}, {.block_q = 3, .block_k = 4}, false},
      {"G=4, window", {1, 8, 8, 2, 4, 2}, {.sliding_window = 3, .block_q = 4, .block_k = 2}, false},
      {"MQA G=3, segments", {2, 8, 8, 1, 3, 2}, {.block_q = 4, .block_k = 3}, true},
      {"G=2, not causal, one tile", {1, 6, 7, 2, 2, 3}, {.causal = false}, false},
  };
  auto seg = hax::from_host<std::int32_t>({0, 0, 0, 1, 1, 2, 2, 2, 2, 5, 5, 5, 5, 5, 6, 6}, 2 * Batch, 8 * Pos);
  for (const auto& c : configs) {
    const std::string name = c.name;
    CAPTURE(name);
    auto x = random_gqa<double>(40, c.s);
    const auto* sp = c.segments ? &seg : nullptr;
    gradcheck::check_output_gradient([&](const gqa_llama<double>& m) { return flash_gqa(m, c.o, sp); }, x);
  }
  // Heads before positions.
  auto xh = heads_first(random_gqa<double>(41, {1, 7, 7, 2, 2, 2}));
  nn::flash_attention_options o{.block_q = 3, .block_k = 2};
  gradcheck::check_output_gradient([&](const gqa_heads_first<double>& m) { return flash_gqa(m, o); }, xh);
}

TEST_CASE("GQA flash_attention results do not depend on the thread count") {
  const int saved = hax::num_threads();
  struct problem {
    const char* name;
    dims s;
    nn::flash_attention_options o;
  };
  // GQA with several key-block groups in backward (partial dq sums); MQA with one key/value element and two
  // query blocks, whose forward splits the query groups across tasks by the thread count.
  const std::vector<problem> problems = {
      {"GQA G=3", {1, 150, 150, 2, 3, 16}, {.sliding_window = 100, .block_q = 32, .block_k = 16}},
      {"MQA G=4", {1, 96, 96, 1, 4, 16}, {.block_q = 48, .block_k = 16}},
  };
  for (const auto& p : problems) {
    const std::string name = p.name;
    CAPTURE(name);
    auto x = as_float(random_gqa<double>(70, p.s, 1.0));
    auto run = [&] {
      auto y = flash_gqa(x, p.o);
      auto g = grads_gqa([&](const decltype(x)& m) { return flash_gqa(m, p.o); }, x);
      return std::vector<std::vector<float>>{y.to_host(), g.q.to_host(), g.k.to_host(), g.v.to_host()};
    };
    hax::set_num_threads(1);
    auto one = run();
    hax::set_num_threads(2);
    auto two = run();
    hax::set_num_threads(3);
    auto three = run();
    hax::set_num_threads(saved);
    for (std::size_t i = 0; i < one.size(); ++i) {
      CAPTURE(i);
      CHECK(one[i] == two[i]);
      CHECK(one[i] == three[i]);
    }
  }
}

namespace {

/// The values of f at x and the gradients of sum(f(x) * w) with respect to x's q, k and v, computed on the
/// portable kernels (what a device build runs) and on the host kernels, agree within rtol/atol.
template <class X, class F>
void check_portable_like_host(const F& f, const X& x, double rtol, double atol) {
  auto run = [&](bool portable) {
    hax::detail::portable_kernels_scope scope(portable);
    CHECK(hax::detail::use_host_kernels() == !portable);
    decltype(f(x)) y;
    {
      hax::no_grad_guard ng;
      y = f(x);
    }
    return std::pair{y, grads_gqa(f, x)};
  };
  const auto [y_host, g_host] = run(false);
  const auto [y_port, g_port] = run(true);
  check_close(host(y_port), host(y_host), rtol, atol);
  check_grads(g_port, g_host, rtol, atol);
}

}  // namespace

TEST_CASE("GQA flash attention: portable kernels match the host kernels (groups, MQA, masks, both layouts)") {
  const std::vector<config> configs = {
      {"G=1, causal, ragged blocks", {2, 37, 37, 2, 1, 4}, {.block_q = 8, .block_k = 16}, false},
      {"G=2, causal, block_k < block_q", {2, 29, 29, 2, 2, 4}, {.block_q = 16, .block_k = 5}, false},
      {"G=4, sliding window 5", {2, 33, 33, 2, 4, 3}, {.sliding_window = 5, .block_q = 8, .block_k = 8}, false},
      {"MQA G=4, causal, ragged", {2, 21, 21, 1, 4, 4}, {.block_q = 4, .block_k = 6}, false},
      {"G=2, segments", {2, 40, 40, 2, 2, 3}, {.block_q = 8, .block_k = 8}, true},
      {"MQA G=3, segments + window", {2, 40, 40, 1, 3, 3}, {.sliding_window = 6, .block_q = 16, .block_k = 4}, true},
      {"G=2, segments, rows that see no key", {2, 40, 40, 2, 2, 3}, {.k_start = 2, .block_q = 8, .block_k = 6}, true},
      {"G=2, not causal", {2, 21, 13, 2, 2, 4}, {.causal = false, .block_q = 4, .block_k = 6}, false},
      {"G=4, decode chunk (q_start)", {1, 6, 19, 2, 4, 4}, {.q_start = 13, .block_q = 4, .block_k = 4}, false},
      {"G=3, rows that see no key (k_start)", {1, 9, 9, 2, 3, 4}, {.k_start = 3, .block_q = 4, .block_k = 4}, false},
  };
  const auto seg = forty_position_segments();
  for (const auto& c : configs) {
    const std::string name = c.name;
    CAPTURE(name);
    auto x = random_gqa<double>(60, c.s);
    const auto* sp = c.segments ? &seg : nullptr;
    check_portable_like_host([&](const gqa_llama<double>& m) { return flash_gqa(m, c.o, sp); }, x, 1e-11, 1e-13);
    auto xf = as_float(x);
    check_portable_like_host([&](const decltype(xf)& m) { return flash_gqa(m, c.o, sp); }, xf, 1e-5, 1e-6);
    auto xh = as_float(heads_first(x));
    check_portable_like_host([&](const decltype(xh)& m) { return flash_gqa(m, c.o, sp); }, xh, 1e-5, 1e-6);
  }
}

namespace {
/// q with its axes permuted (group axis outermost, position inside the heads), k and v packed (key outermost).
struct gqa_permuted {
  BOOST_HANA_DEFINE_STRUCT(gqa_permuted, (named_array<float, axes<QGroup, Batch, KvHead, Pos, Key>>, q),
                           (named_array<float, axes<Key, KvHead, KPos, Batch>>, k),
                           (named_array<float, axes<Key, KPos, Batch, KvHead>>, v));
};
}  // namespace

TEST_CASE("GQA flash attention: portable kernels match the host kernels (permuted and packed layouts)") {
  auto x = as_float(random_gqa<double>(65, {2, 13, 13, 2, 3, 3}));
  gqa_permuted p{hax::rearrange<axes<QGroup, Batch, KvHead, Pos, Key>>(x.q),
                 hax::rearrange<axes<Key, KvHead, KPos, Batch>>(x.k), hax::rearrange<axes<Key, KPos, Batch, KvHead>>(x.v)};
  nn::flash_attention_options o{.sliding_window = 4, .block_q = 4, .block_k = 3};
  check_portable_like_host([&](const gqa_permuted& m) { return flash_gqa(m, o); }, p, 1e-5, 1e-6);
}

TEST_CASE("GQA flash attention: portable kernels against the plain path") {
  hax::detail::portable_kernels_scope portable;
  const auto seg = forty_position_segments();
  auto x = random_gqa<double>(66, {2, 40, 40, 1, 3, 3});
  nn::flash_attention_options o{.sliding_window = 9, .block_q = 8, .block_k = 16};
  check_close(host(flash_gqa(x, o, &seg)), host(plain_gqa(x, o, &seg)), 1e-12, 1e-13);
  auto g_plain = grads_gqa([&](const gqa_llama<double>& m) { return plain_gqa(m, o, &seg); }, x);
  auto g_flash = grads_gqa([&](const gqa_llama<double>& m) { return flash_gqa(m, o, &seg); }, x);
  check_grads(g_flash, g_plain, 1e-10, 1e-12);
}
