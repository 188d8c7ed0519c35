// Shared by the attention tests (test_attention.cpp: masks and plain attention; test_flash_attention.cpp):
// axes, the q/k/v operand struct and host helpers. Two files so that neither takes minutes to compile at -O3.
#pragma once
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

/// Attention in double by loops: q [B, P, H, D], k and v [B, N, H, D] -> [B, P, H, D]; masked scores -1e9;
/// scaled scores soft-capped to cap * tanh(s / cap) when cap > 0. With `sinks` [H], each row's softmax has one more
/// logit, the head's sink (capped too), whose value is zero.
inline std::vector<double> reference(const std::vector<double>& q, const std::vector<double>& k,
                                     const std::vector<double>& v, std::int64_t B, std::int64_t P, std::int64_t N,
                                     std::int64_t H, std::int64_t D, double scale, const allowed_fn& allowed,
                                     double cap = 0, const std::vector<double>* sinks = nullptr) {
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
          const double sc = cap > 0 ? cap * std::tanh(scale * dotp / cap) : scale * dotp;
          s[static_cast<std::size_t>(j)] = allowed(b, i, j) ? sc : -1e9;
          mx = std::max(mx, s[static_cast<std::size_t>(j)]);
        }
        double sink = 0;
        if (sinks) {
          sink = (*sinks)[static_cast<std::size_t>(h)];
          if (cap > 0) sink = cap * std::tanh(sink / cap);
          mx = std::max(mx, sink);
        }
        double z = sinks ? std::exp(sink - mx) : 0.0;
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
