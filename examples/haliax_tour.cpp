// haliax_tour: the examples of the Haliax announcement, in C++, with their checks.
//
// 1. A linear model's mean squared error: `dot` over Feature, `mean` over Batch. The positional version's
//    classic bug — a (128, 1) target minus a (128,) prediction silently broadcasting to (128, 128) — cannot
//    be written: arrays combine only when one's axes contain the other's.
// 2. Attention written once, with no Batch or Head axis in sight, then called with batched multi-head
//    inputs, with multi-query inputs (keys and values without Head), and with keys laid out on a 2-D grid
//    (Height, Width as the key-position axes). The result axes are checked by the compiler.
//
// Run: build/examples/haliax_tour   (exit status 0 when every check holds)
#include <cmath>
#include <cstdio>
#include <haliax/haliax.hpp>
#include <string>
#include <type_traits>

namespace hax = haliax;
using hax::axes;
using hax::named_array;

// ---- axes ------------------------------------------------------------------------------------------------
inline constexpr struct Batch final : hax::axis<"batch"> {
} Batch;
inline constexpr struct Feature final : hax::axis<"feature"> {
} Feature;
inline constexpr struct Target final : hax::axis<"target"> {
} Target;
inline constexpr struct Head final : hax::axis<"head"> {
} Head;
inline constexpr struct Pos final : hax::axis<"position"> {
} Pos;
inline constexpr struct KPos final : hax::axis<"key_position"> {
} KPos;
inline constexpr struct Key final : hax::axis<"key"> {
} Key;
inline constexpr struct Height final : hax::axis<"height"> {
} Height;
inline constexpr struct Width final : hax::axis<"width"> {
} Width;

// ---- a small check harness ---------------------------------------------------------------------------------
static int failures = 0;
static void check(bool ok, const std::string& what) {
  std::printf("  [%s] %s\n", ok ? "ok" : "FAILED", what.c_str());
  if (!ok) ++failures;
}

/// Standard normal data from a JAX-compatible key (the same values `jax.random.normal` gives for this
/// seed and shape).
template <class... S>
auto normal_data(unsigned seed, S... s) {
  return hax::random::normal(hax::random::make_key(seed), s...);
}

// ---- 1. linear model --------------------------------------------------------------------------------------
template <class Pred, class Tgt>
auto mse(const Pred& pred, const Tgt& target) {
  return hax::mean(hax::square(pred - target), Batch);
}

// `a - b` compiles only when one array's axes contain the other's.
template <class A, class B>
concept subtractable = requires(A a, B b) {
  a - b;
};

// ---- 2. attention, written once ---------------------------------------------------------------------------
/// Scaled dot-product attention over a key axis `KeyAx` and key-position axes `KP...`. Any other axis of the
/// inputs (batch, heads, query positions) is carried along: shared ones are batched, the rest are kept.
template <class KeyAx, auto... KP, class Q, class K, class V>
auto attention(KeyAx key_axis, axes<KP...>, const Q& query, const K& key, const V& value) {
  auto scores = hax::dot(query, key, key_axis) / std::sqrt(static_cast<float>(query.size(key_axis)));
  auto weights = hax::exp(scores - hax::logsumexp(scores, KP...));  // softmax over all key positions
  return hax::dot(weights, value, KP...);
}

/// Naive reference for one output element: query row `q` (length d), keys/values as [n][d].
static float naive_attention_elem(const std::vector<float>& q, const std::vector<std::vector<float>>& k,
                                  const std::vector<std::vector<float>>& v, std::size_t out_index) {
  std::vector<double> s(k.size());
  double mx = -1e300;
  for (std::size_t j = 0; j < k.size(); ++j) {
    double acc = 0;
    for (std::size_t e = 0; e < q.size(); ++e) acc += double(q[e]) * k[j][e];
    s[j] = acc / std::sqrt(double(q.size()));
    mx = std::max(mx, s[j]);
  }
  double z = 0, out = 0;
  for (double& x : s) z += (x = std::exp(x - mx));
  for (std::size_t j = 0; j < k.size(); ++j) out += s[j] / z * v[j][out_index];
  return static_cast<float>(out);
}

int main(int argc, char** argv) {
  hax::runtime rt(argc, argv);

  std::printf("1. Linear model, mean squared error\n");
  {
    auto x = normal_data(1, 128 * Batch, 16 * Feature);
    auto w = normal_data(2, 16 * Feature);
    auto y = normal_data(3, 128 * Batch);
    auto pred = hax::dot(x, w, Feature);  // {batch}
    static_assert(std::is_same_v<decltype(pred), named_array<float, axes<Batch>>>);
    auto loss = mse(pred, y);  // rank 0
    static_assert(decltype(loss)::rank == 0);
    // reference
    auto hx = x.to_host(), hw = w.to_host(), hy = y.to_host();
    double ref = 0;
    for (int b = 0; b < 128; ++b) {
      double p = 0;
      for (int f = 0; f < 16; ++f) p += double(hx[b * 16 + f]) * hw[f];
      ref += (p - hy[b]) * (p - hy[b]) / 128;
    }
    std::printf("  loss = %.6f (reference %.6f)\n", loss.item(), ref);
    check(std::abs(loss.item() - ref) <= 1e-4 * std::abs(ref), "mse matches a naive loop");
    // The positional bug: a target with an extra axis, (batch, target=1) - (batch,) would broadcast to
    // (128, 128) with positions. By name, {batch, target} - {batch} is {batch, target}: no silent outer
    // product. And a target on an unrelated axis cannot be subtracted at all.
    using wrong_target = named_array<float, axes<Target>>;
    static_assert(!subtractable<decltype(pred), wrong_target>);
    auto y2 = normal_data(3, 128 * Batch, 1 * Target);
    auto diff = pred - y2;
    static_assert(std::is_same_v<decltype(diff), named_array<float, axes<Batch, Target>>>);
    check(diff.shape_string() == "{batch=128, target=1}", "{batch} - {batch, target=1} is " + diff.shape_string());
    std::printf("  [ok] {batch} - {target} does not compile (proved by the static_assert above)\n");
  }

  std::printf("2. Attention, written once\n");
  const int B = 2, H = 3, P = 5, KP = 7, D = 4;
  {
    auto q = normal_data(10, B * Batch, H * Head, P * Pos, D * Key);
    auto k = normal_data(11, B * Batch, H * Head, KP * KPos, D * Key);
    auto v = normal_data(12, B * Batch, H * Head, KP * KPos, D * Key);
    auto out = attention(Key, axes<KPos>{}, q, k, v);
    static_assert(std::is_same_v<decltype(out), named_array<float, axes<Batch, Head, Pos, Key>>>);
    std::printf("  batched multi-head: %s\n", out.shape_string().c_str());
    // check one element: batch 1, head 2, position 3, key 1
    auto hq = q.to_host(), hk = k.to_host(), hv = v.to_host(), ho = out.to_host();
    auto at = [](int b, int h, int p, int e, int np) { return ((b * H + h) * np + p) * D + e; };
    std::vector<float> qrow(D);
    std::vector<std::vector<float>> krows(KP, std::vector<float>(D)), vrows(KP, std::vector<float>(D));
    for (int e = 0; e < D; ++e) qrow[e] = hq[at(1, 2, 3, e, P)];
    for (int j = 0; j < KP; ++j)
      for (int e = 0; e < D; ++e) {
        krows[j][e] = hk[at(1, 2, j, e, KP)];
        vrows[j][e] = hv[at(1, 2, j, e, KP)];
      }
    float want = naive_attention_elem(qrow, krows, vrows, 1);
    check(std::abs(ho[at(1, 2, 3, 1, P)] - want) < 1e-5f, "batched multi-head output matches a naive loop");
  }
  {
    auto q = normal_data(20, B * Batch, H * Head, P * Pos, D * Key);
    auto k = normal_data(21, B * Batch, KP * KPos, D * Key);  // multi-query: no Head
    auto v = normal_data(22, B * Batch, KP * KPos, D * Key);
    auto out = attention(Key, axes<KPos>{}, q, k, v);
    static_assert(std::is_same_v<decltype(out), named_array<float, axes<Batch, Head, Pos, Key>>>);
    std::printf("  multi-query: %s\n", out.shape_string().c_str());
    auto hq = q.to_host(), hk = k.to_host(), hv = v.to_host(), ho = out.to_host();
    std::vector<float> qrow(D);
    std::vector<std::vector<float>> krows(KP, std::vector<float>(D)), vrows(KP, std::vector<float>(D));
    for (int e = 0; e < D; ++e) qrow[e] = hq[((0 * H + 1) * P + 4) * D + e];
    for (int j = 0; j < KP; ++j)
      for (int e = 0; e < D; ++e) {
        krows[j][e] = hk[(0 * KP + j) * D + e];
        vrows[j][e] = hv[(0 * KP + j) * D + e];
      }
    float want = naive_attention_elem(qrow, krows, vrows, 2);
    check(std::abs(ho[((0 * H + 1) * P + 4) * D + 2] - want) < 1e-5f, "multi-query output matches a naive loop");
  }
  {
    const int Hh = 3, Ww = 4;
    auto q = normal_data(30, B * Batch, P * Pos, D * Key);
    auto k = normal_data(31, B * Batch, Hh * Height, Ww * Width, D * Key);  // keys on a 2-D grid
    auto v = normal_data(32, B * Batch, Hh * Height, Ww * Width, D * Key);
    auto out = attention(Key, axes<Height, Width>{}, q, k, v);
    static_assert(std::is_same_v<decltype(out), named_array<float, axes<Batch, Pos, Key>>>);
    std::printf("  2-D key positions: %s\n", out.shape_string().c_str());
    auto hq = q.to_host(), hk = k.to_host(), hv = v.to_host(), ho = out.to_host();
    std::vector<float> qrow(D);
    std::vector<std::vector<float>> krows(Hh * Ww, std::vector<float>(D)), vrows(Hh * Ww, std::vector<float>(D));
    for (int e = 0; e < D; ++e) qrow[e] = hq[(1 * P + 2) * D + e];
    for (int j = 0; j < Hh * Ww; ++j)
      for (int e = 0; e < D; ++e) {
        krows[j][e] = hk[(1 * Hh * Ww + j) * D + e];
        vrows[j][e] = hv[(1 * Hh * Ww + j) * D + e];
      }
    float want = naive_attention_elem(qrow, krows, vrows, 3);
    check(std::abs(ho[(1 * P + 2) * D + 3] - want) < 1e-5f, "2-D grid output matches a naive loop");
  }

  std::printf("%s\n", failures == 0 ? "all checks passed" : "SOME CHECKS FAILED");
  return failures == 0 ? 0 : 1;
}
