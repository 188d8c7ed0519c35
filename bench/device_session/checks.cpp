// device_session --stage checks and --stage ops. checks: every kernel a training step runs on the device, against a plain double-precision
// host computation of the same function, on fresh random data (the seed is printed: --seed N repeats a run).
// The stage runs with HALIAX_POISON_BUFFERS=1 (main.cpp), so every array buffer starts as NaN/-1 and an output
// element a kernel forgot to write shows up; every op runs twice and the two results must be bitwise equal.
// Error measure: |got - want|_2 / |want|_2 over all outputs (METHOD.md): f32 arithmetic lands near 1e-7..1e-6,
// bf16 operands near 1e-3.
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numbers>

#include <boost/hana/define_struct.hpp>
#include <levanter/optim/adamw_kernel.hpp>

#include "kit.hpp"

#if defined(KOKKOS_ENABLE_CUDA)
#include <cuda_runtime.h>
#endif

namespace kit {

namespace {

namespace nn = hax::nn;
using hax::axes;
using hax::named_array;
using dvec = std::vector<double>;
using fvec = std::vector<float>;

struct checker {
  std::mt19937_64 rng;
  int failures = 0, total = 0;

  fvec normal(std::size_t n, double scale = 1.0) {
    std::normal_distribution<double> d(0.0, scale);
    fvec v(n);
    for (auto& x : v) x = float(d(rng));
    return v;
  }
  std::vector<std::int32_t> ids(std::size_t n, std::int32_t below) {
    std::uniform_int_distribution<std::int32_t> d(0, below - 1);
    std::vector<std::int32_t> v(n);
    for (auto& x : v) x = d(rng);
    return v;
  }

  /// Compares `got` (concatenated outputs) with `want`; `again` is a rerun of the same op, which must be bitwise
  /// equal to `got`. Prints a line and a summary row.
  void compare(const std::string& name, const fvec& got, const fvec& again, const dvec& want, double tol) {
    ++total;
    std::size_t bad = 0;
    double num = 0, den = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      if (!std::isfinite(got[i])) ++bad;
      const double d = double(got[i]) - want[i];
      num += d * d;
      den += want[i] * want[i];
    }
    const double err = got.size() == want.size() ? std::sqrt(num) / std::max(std::sqrt(den), 1e-300)
                                                 : std::numeric_limits<double>::infinity();
    const bool same = got.size() == again.size() && std::memcmp(got.data(), again.data(), got.size() * sizeof(float)) == 0;
    const bool ok = bad == 0 && err <= tol && same;
    if (!ok) ++failures;
    std::string note = fmt("%zu outputs", got.size());
    if (bad) note += fmt(", %zu not finite (unwritten or NaN)", bad);
    if (!same) note += ", rerun differs";
    std::printf("check %-58s %s  rel err %.2e (tol %.0e)  %s\n", name.c_str(), ok ? "ok    " : "FAILED", err, tol,
                note.c_str());
    row("checks", name, ok ? "ok" : "FAILED", fmt("rel err %.1e (tol %.0e)", err, tol),
        note + (same ? ", rerun bitwise" : ""));
  }
};

template <class... A>
fvec cat(const A&... parts) {
  fvec r;
  (r.insert(r.end(), parts.begin(), parts.end()), ...);
  return r;
}
template <class... A>
dvec dcat(const A&... parts) {
  dvec r;
  (r.insert(r.end(), parts.begin(), parts.end()), ...);
  return r;
}
dvec widen(const fvec& x) { return dvec(x.begin(), x.end()); }
double round_bf16(float x) { return double(float(hax::bf16(x))); }

// ---- references ------------------------------------------------------------------------------------------

double gelu_new(double x) {
  const double c = std::sqrt(2.0 / std::numbers::pi);
  return 0.5 * x * (1 + std::tanh(c * (x + 0.044715 * x * x * x)));
}
double gelu_new_grad(double x) {
  const double c = std::sqrt(2.0 / std::numbers::pi), t = std::tanh(c * (x + 0.044715 * x * x * x));
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * c * (1 + 3 * 0.044715 * x * x);
}
double sigmoid(double x) { return 1 / (1 + std::exp(-x)); }

/// Softmax of each row of x [rows, n].
dvec softmax_rows(const fvec& x, std::int64_t rows, std::int64_t n) {
  dvec p(x.size());
  for (std::int64_t r = 0; r < rows; ++r) {
    double m = -1e300, s = 0;
    for (std::int64_t j = 0; j < n; ++j) m = std::max(m, double(x[r * n + j]));
    for (std::int64_t j = 0; j < n; ++j) s += std::exp(double(x[r * n + j]) - m);
    for (std::int64_t j = 0; j < n; ++j) p[r * n + j] = std::exp(double(x[r * n + j]) - m) / s;
  }
  return p;
}

/// Row-major C[m, n] = A[m, k] B[k, n] (or with B given as [n, k] when bt).
dvec matmul(const dvec& a, const dvec& b, std::int64_t m, std::int64_t n, std::int64_t k, bool bt = false) {
  dvec c(static_cast<std::size_t>(m * n), 0.0);
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t l = 0; l < k; ++l) {
      const double av = a[i * k + l];
      for (std::int64_t j = 0; j < n; ++j) c[i * n + j] += av * (bt ? b[j * k + l] : b[l * n + j]);
    }
  return c;
}
dvec transpose(const dvec& a, std::int64_t rows, std::int64_t cols) {
  dvec t(a.size());
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < cols; ++j) t[j * rows + i] = a[i * cols + j];
  return t;
}

// ---- the checks --------------------------------------------------------------------------------------------

constexpr std::int64_t R = 67, C = 1003, E = 96, O = 80;

using mat = named_array<float, axes<Tok, Vocab>>;
using col_t = named_array<float, axes<Tok>>;
using row_t = named_array<float, axes<Vocab>>;

struct bcast_in {
  BOOST_HANA_DEFINE_STRUCT(bcast_in, (mat, x), (col_t, col), (row_t, row));
};

void check_elementwise(checker& k) {
  const auto xs = k.normal(static_cast<std::size_t>(R * C), 2.0), gs = k.normal(static_cast<std::size_t>(R * C));
  auto x = hax::from_host<float>(xs, R * Tok, C * Vocab);
  auto g = hax::from_host<float>(gs, R * Tok, C * Vocab);
  auto run = [&](auto f) {
    auto [v, d] = hax::value_and_grad([&](const mat& a) { return hax::sum(g * f(a)); })(x);
    return cat(f(x).to_host(), d.to_host());
  };
  dvec want_g(xs.size()), want_gd(xs.size()), want_s(xs.size()), want_sd(xs.size());
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const double v = xs[i], s = sigmoid(v);
    want_g[i] = gelu_new(v);
    want_gd[i] = gs[i] * gelu_new_grad(v);
    want_s[i] = v * s;
    want_sd[i] = gs[i] * s * (1 + v * (1 - s));
  }
  auto gelu = [](const mat& a) { return nn::gelu_new(a); };
  auto silu = [](const mat& a) { return nn::silu(a); };
  k.compare("gelu_new forward + backward", run(gelu), run(gelu), dcat(want_g, want_gd), 1e-5);
  k.compare("silu forward + backward", run(silu), run(silu), dcat(want_s, want_sd), 1e-5);
}

void check_broadcast(checker& k) {
  const auto xs = k.normal(static_cast<std::size_t>(R * C)), cs = k.normal(static_cast<std::size_t>(R)), rs = k.normal(static_cast<std::size_t>(C)),
             gs = k.normal(static_cast<std::size_t>(R * C));
  bcast_in in{hax::from_host<float>(xs, R * Tok, C * Vocab), hax::from_host<float>(cs, R * Tok),
              hax::from_host<float>(rs, C * Vocab)};
  auto g = hax::from_host<float>(gs, R * Tok, C * Vocab);
  auto run = [&] {
    auto [v, d] = hax::value_and_grad([&](const bcast_in& a) { return hax::sum(g * (a.x * a.col + a.row)); })(in);
    return cat((in.x * in.col + in.row).to_host(), d.x.to_host(), d.col.to_host(), d.row.to_host());
  };
  dvec y(xs.size()), dx(xs.size()), dcol(static_cast<std::size_t>(R), 0.0), drow(static_cast<std::size_t>(C), 0.0);
  for (std::int64_t r = 0; r < R; ++r)
    for (std::int64_t c = 0; c < C; ++c) {
      const std::size_t i = static_cast<std::size_t>(r * C + c);
      y[i] = double(xs[i]) * cs[r] + rs[c];
      dx[i] = double(gs[i]) * cs[r];
      dcol[r] += double(gs[i]) * xs[i];
      drow[c] += gs[i];
    }
  k.compare("broadcast multiply-add, gradients (column and row sums)", run(), run(), dcat(y, dx, dcol, drow), 1e-6);
}

void check_reductions(checker& k) {
  const auto xs = k.normal(static_cast<std::size_t>(R * C));
  auto x = hax::from_host<float>(xs, R * Tok, C * Vocab);
  auto run = [&] {
    return cat(hax::sum(x, Vocab).to_host(), hax::sum(x, Tok).to_host(), hax::max(x, Vocab).to_host(),
               hax::mean(x, Tok).to_host());
  };
  dvec sv(static_cast<std::size_t>(R), 0.0), st(static_cast<std::size_t>(C), 0.0), mv(static_cast<std::size_t>(R), -1e300), mt;
  for (std::int64_t r = 0; r < R; ++r)
    for (std::int64_t c = 0; c < C; ++c) {
      const double v = xs[static_cast<std::size_t>(r * C + c)];
      sv[r] += v;
      st[c] += v;
      mv[r] = std::max(mv[r], v);
    }
  for (double s : st) mt.push_back(s / double(R));
  k.compare("sum (last axis, first axis), max, mean", run(), run(), dcat(sv, st, mv, mt), 1e-6);
}

void check_softmax_family(checker& k) {
  const auto xs = k.normal(static_cast<std::size_t>(R * C), 3.0), gs = k.normal(static_cast<std::size_t>(R * C));
  auto x = hax::from_host<float>(xs, R * Tok, C * Vocab);
  auto g = hax::from_host<float>(gs, R * Tok, C * Vocab);
  const dvec p = softmax_rows(xs, R, C);
  dvec lse(static_cast<std::size_t>(R)), gsum(static_cast<std::size_t>(R), 0.0), pg(static_cast<std::size_t>(R), 0.0);
  for (std::int64_t r = 0; r < R; ++r) {
    double m = -1e300, s = 0;
    for (std::int64_t j = 0; j < C; ++j) m = std::max(m, double(xs[r * C + j]));
    for (std::int64_t j = 0; j < C; ++j) s += std::exp(double(xs[r * C + j]) - m);
    lse[r] = m + std::log(s);
    for (std::int64_t j = 0; j < C; ++j) {
      gsum[r] += gs[r * C + j];
      pg[r] += p[r * C + j] * gs[r * C + j];
    }
  }
  dvec dsm(xs.size()), lsm(xs.size()), dlsm(xs.size());
  for (std::int64_t r = 0; r < R; ++r)
    for (std::int64_t j = 0; j < C; ++j) {
      const std::size_t i = static_cast<std::size_t>(r * C + j);
      dsm[i] = p[i] * (gs[i] - pg[r]);
      lsm[i] = double(xs[i]) - lse[r];
      dlsm[i] = gs[i] - p[i] * gsum[r];
    }
  auto run_sm = [&] {
    auto [v, d] = hax::value_and_grad([&](const mat& a) { return hax::sum(g * nn::softmax(a, Vocab)); })(x);
    return cat(nn::softmax(x, Vocab).to_host(), d.to_host());
  };
  k.compare("softmax forward + backward (last axis)", run_sm(), run_sm(), dcat(p, dsm), 1e-6);
  auto run_lsm = [&] {
    auto [v, d] = hax::value_and_grad([&](const mat& a) { return hax::sum(g * nn::log_softmax(a, Vocab)); })(x);
    return cat(nn::log_softmax(x, Vocab).to_host(), d.to_host());
  };
  k.compare("log_softmax forward + backward", run_lsm(), run_lsm(), dcat(lsm, dlsm), 1e-6);
  const auto ws = k.normal(static_cast<std::size_t>(R));
  auto w = hax::from_host<float>(ws, R * Tok);
  dvec dlse(xs.size());
  for (std::int64_t r = 0; r < R; ++r)
    for (std::int64_t j = 0; j < C; ++j) dlse[static_cast<std::size_t>(r * C + j)] = ws[r] * p[static_cast<std::size_t>(r * C + j)];
  auto run_lse = [&] {
    auto [v, d] = hax::value_and_grad([&](const mat& a) { return hax::sum(w * nn::logsumexp(a, Vocab)); })(x);
    return cat(nn::logsumexp(x, Vocab).to_host(), d.to_host());
  };
  k.compare("logsumexp forward + backward", run_lse(), run_lse(), dcat(lse, dlse), 1e-6);

  // Over a middle axis: {tok, vocab, out}, softmax over vocab.
  constexpr std::int64_t A = 5, B = 257, D = 7;
  const auto ys = k.normal(static_cast<std::size_t>(A * B * D), 2.0), hs = k.normal(static_cast<std::size_t>(A * B * D));
  using cube = named_array<float, axes<Tok, Vocab, Out>>;
  auto y = hax::from_host<float>(ys, A * Tok, B * Vocab, D * Out);
  auto h = hax::from_host<float>(hs, A * Tok, B * Vocab, D * Out);
  dvec q(ys.size()), dq(ys.size());
  for (std::int64_t a = 0; a < A; ++a)
    for (std::int64_t d = 0; d < D; ++d) {
      double m = -1e300, s = 0, qh = 0;
      auto at = [&](std::int64_t b) { return std::size_t((a * B + b) * D + d); };
      for (std::int64_t b = 0; b < B; ++b) m = std::max(m, double(ys[at(b)]));
      for (std::int64_t b = 0; b < B; ++b) s += std::exp(double(ys[at(b)]) - m);
      for (std::int64_t b = 0; b < B; ++b) q[at(b)] = std::exp(double(ys[at(b)]) - m) / s;
      for (std::int64_t b = 0; b < B; ++b) qh += q[at(b)] * hs[at(b)];
      for (std::int64_t b = 0; b < B; ++b) dq[at(b)] = q[at(b)] * (hs[at(b)] - qh);
    }
  auto run_mid = [&] {
    auto [v, d] = hax::value_and_grad([&](const cube& a) { return hax::sum(h * nn::softmax(a, Vocab)); })(y);
    return cat(nn::softmax(y, Vocab).to_host(), d.to_host());
  };
  k.compare("softmax forward + backward (middle axis)", run_mid(), run_mid(), dcat(q, dq), 1e-6);
}

void check_norms(checker& k) {
  constexpr std::int64_t T = 131, D = 768;
  using act = named_array<float, axes<Tok, Embed>>;
  const auto xs = k.normal(static_cast<std::size_t>(T * D), 2.0), gs = k.normal(static_cast<std::size_t>(T * D)), ws = k.normal(static_cast<std::size_t>(D));
  auto x = hax::from_host<float>(xs, T * Tok, D * Embed);
  auto g = hax::from_host<float>(gs, T * Tok, D * Embed);
  const double eps = 1e-5;
  dvec y(xs.size()), dy(xs.size()), z(xs.size()), dz(xs.size());
  for (std::int64_t t = 0; t < T; ++t) {
    auto at = [&](std::int64_t j) { return static_cast<std::size_t>(t * D + j); };
    double mu = 0, var = 0, ms = 0;
    for (std::int64_t j = 0; j < D; ++j) mu += xs[at(j)];
    mu /= double(D);
    for (std::int64_t j = 0; j < D; ++j) var += (xs[at(j)] - mu) * (xs[at(j)] - mu);
    var /= double(D);
    for (std::int64_t j = 0; j < D; ++j) ms += double(xs[at(j)]) * xs[at(j)];
    ms /= double(D);
    const double rs = 1 / std::sqrt(var + eps), rr = 1 / std::sqrt(ms + eps);
    double gm = 0, gym = 0, gwx = 0;
    for (std::int64_t j = 0; j < D; ++j) {
      y[at(j)] = (xs[at(j)] - mu) * rs;
      z[at(j)] = xs[at(j)] * rr * ws[j];
      gm += gs[at(j)];
      gym += gs[at(j)] * y[at(j)];
      gwx += double(gs[at(j)]) * ws[j] * xs[at(j)];
    }
    gm /= double(D);
    gym /= double(D);
    for (std::int64_t j = 0; j < D; ++j) {
      dy[at(j)] = rs * (gs[at(j)] - gm - y[at(j)] * gym);
      dz[at(j)] = rr * (double(gs[at(j)]) * ws[j]) - xs[at(j)] * rr * rr * rr * gwx / double(D);
    }
  }
  auto run_ln = [&] {
    auto [v, d] = hax::value_and_grad([&](const act& a) { return hax::sum(g * nn::standardize(a, Embed, eps)); })(x);
    return cat(nn::standardize(x, Embed, eps).to_host(), d.to_host());
  };
  k.compare("standardize (LayerNorm) forward + backward", run_ln(), run_ln(), dcat(y, dy), 1e-5);
  auto rms = nn::RmsNorm<Embed>::init(D * Embed, eps);
  rms.weight = hax::from_host<float>(ws, D * Embed);
  auto run_rms = [&] {
    auto [v, d] = hax::value_and_grad([&](const act& a) { return hax::sum(g * rms(a)); })(x);
    return cat(rms(x).to_host(), d.to_host());
  };
  k.compare("RmsNorm forward + backward (input)", run_rms(), run_rms(), dcat(z, dz), 1e-5);
}

void check_cross_entropy(checker& k) {
  const auto xs = k.normal(static_cast<std::size_t>(R * C), 3.0);
  const auto ts = k.ids(static_cast<std::size_t>(R), std::int32_t(C));
  auto x = hax::from_host<float>(xs, R * Tok, C * Vocab);
  auto t = hax::from_host<std::int32_t>(ts, R * Tok);
  const dvec p = softmax_rows(xs, R, C);
  double loss = 0;
  dvec d(xs.size());
  for (std::int64_t r = 0; r < R; ++r) {
    loss -= std::log(p[static_cast<std::size_t>(r * C + ts[r])]);
    for (std::int64_t j = 0; j < C; ++j)
      d[static_cast<std::size_t>(r * C + j)] = (p[static_cast<std::size_t>(r * C + j)] - (j == ts[r] ? 1.0 : 0.0)) / double(R);
  }
  loss /= double(R);
  auto run = [&] {
    auto [v, g] = hax::value_and_grad([&](const mat& a) { return nn::cross_entropy_loss(a, Vocab, t); })(x);
    return cat(fvec{float(v.item())}, g.to_host());
  };
  k.compare("cross-entropy loss forward + backward", run(), run(), dcat(dvec{loss}, d), 1e-6);
}

using hidden_t = named_array<float, axes<Tok, Embed>>;
using head_t = named_array<float, axes<Vocab, Embed>>;
struct lm_in {
  BOOST_HANA_DEFINE_STRUCT(lm_in, (hidden_t, h), (head_t, w));
};

void check_blockwise_loss(checker& k) {
  constexpr std::int64_t T = 53, D = 64, V = 1001, block = 256;
  const auto hs = k.normal(static_cast<std::size_t>(T * D)), ws = k.normal(static_cast<std::size_t>(V * D), 0.3);
  const auto ts = k.ids(static_cast<std::size_t>(T), std::int32_t(V));
  lm_in in{hax::from_host<float>(hs, T * Tok, D * Embed), hax::from_host<float>(ws, V * Vocab, D * Embed)};
  auto t = hax::from_host<std::int32_t>(ts, T * Tok);
  const dvec logits = matmul(widen(hs), widen(ws), T, V, D, true);
  const fvec lf(logits.begin(), logits.end());
  const dvec p = softmax_rows(lf, T, V);
  double loss = 0;
  dvec dl(p.size());
  for (std::int64_t r = 0; r < T; ++r) {
    // log p from the exact logits (softmax_rows saw them rounded to float only for its max shift).
    double m = -1e300, s = 0;
    for (std::int64_t j = 0; j < V; ++j) m = std::max(m, logits[static_cast<std::size_t>(r * V + j)]);
    for (std::int64_t j = 0; j < V; ++j) s += std::exp(logits[static_cast<std::size_t>(r * V + j)] - m);
    loss += m + std::log(s) - logits[static_cast<std::size_t>(r * V + ts[r])];
    for (std::int64_t j = 0; j < V; ++j)
      dl[static_cast<std::size_t>(r * V + j)] = (std::exp(logits[static_cast<std::size_t>(r * V + j)] - m) / s - (j == ts[r] ? 1.0 : 0.0)) / double(T);
  }
  loss /= double(T);
  const dvec dh = matmul(dl, widen(ws), T, D, V);
  const dvec dw = matmul(transpose(dl, T, V), widen(hs), V, D, T);
  auto run = [&] {
    auto [v, g] = hax::value_and_grad(
        [&](const lm_in& a) { return nn::blockwise_cross_entropy_loss(a.h, a.w, Embed, Vocab, t, block); })(in);
    return cat(fvec{float(v.item())}, g.h.to_host(), g.w.to_host());
  };
  k.compare("block-wise cross-entropy forward + backward", run(), run(), dcat(dvec{loss}, dh, dw), 1e-5);
}

using a_t = named_array<float, axes<Tok, Embed>>;
using b_t = named_array<float, axes<Embed, Out>>;
struct dot_in {
  BOOST_HANA_DEFINE_STRUCT(dot_in, (a_t, a), (b_t, b));
};

void check_dot(checker& k) {
  constexpr std::int64_t M = 300, K = 257, N = 129;
  const auto as = k.normal(static_cast<std::size_t>(M * K)), bs = k.normal(static_cast<std::size_t>(K * N)), gs = k.normal(static_cast<std::size_t>(M * N));
  dot_in in{hax::from_host<float>(as, M * Tok, K * Embed), hax::from_host<float>(bs, K * Embed, N * Out)};
  auto g = hax::from_host<float>(gs, M * Tok, N * Out);
  auto bt = hax::from_host<float>(hax::rearrange<axes<Out, Embed>>(in.b).to_host(), N * Out, K * Embed);
  const dvec A = widen(as), B = widen(bs), G = widen(gs);
  const dvec c = matmul(A, B, M, N, K);
  const dvec da = matmul(G, transpose(B, K, N), M, K, N);
  const dvec db = matmul(transpose(A, M, K), G, K, N, M);
  auto run = [&] {
    auto [v, d] = hax::value_and_grad([&](const dot_in& x) { return hax::sum(g * hax::dot(x.a, x.b, Embed)); })(in);
    return cat(hax::dot(in.a, in.b, Embed).to_host(), hax::dot(in.a, bt, Embed).to_host(), d.a.to_host(),
               d.b.to_host());
  };
  k.compare("dot f32 (plain, transposed operand) + gradients", run(), run(), dcat(c, c, da, db), 1e-6);

  // Batched: {batch, pos, key} x {batch, key_position, key} -> {batch, pos, key_position}
  constexpr std::int64_t Bt = 6, P = 70, Q = 90, D = 64;
  const auto qs = k.normal(static_cast<std::size_t>(Bt * P * D)), ks = k.normal(static_cast<std::size_t>(Bt * Q * D));
  auto q = hax::from_host<float>(qs, Bt * Batch, P * Pos, D * Key);
  auto kk = hax::from_host<float>(ks, Bt * Batch, Q * KPos, D * Key);
  dvec s;
  for (std::int64_t b = 0; b < Bt; ++b) {
    const dvec qb(qs.begin() + b * P * D, qs.begin() + (b + 1) * P * D);
    const dvec kb(ks.begin() + b * Q * D, ks.begin() + (b + 1) * Q * D);
    const dvec sb = matmul(qb, kb, P, Q, D, true);
    s.insert(s.end(), sb.begin(), sb.end());
  }
  auto run_b = [&] { return hax::dot<axes<Batch, Pos, KPos>>(q, kk, Key).to_host(); };
  k.compare("dot f32, batched with a transposed operand", run_b(), run_b(), s, 1e-6);

  // Under bf16 precision: the operands rounded to bf16 by the GEMM, products summed in f32. Against the f64 product
  // of the f32 operands, within bf16's tolerance: cuBLAS's CUBLAS_COMPUTE_32F_FAST_16BF rounds the operands its own
  // way (on an H200, 2026-11-29, 2.4e-3 from a reference that rounds them to nearest even first, over 2e-3).
  // The vendor's bf16 GEMM called directly (below) gets operands rounded to nearest even: its reference.
  dvec A16(A.size()), B16(B.size());
  for (std::size_t i = 0; i < A.size(); ++i) A16[i] = round_bf16(as[i]);
  for (std::size_t i = 0; i < B.size(); ++i) B16[i] = round_bf16(bs[i]);
  const dvec c16 = matmul(A16, B16, M, N, K);
  if (!on_gpu() && !hax::detail::use_host_kernels()) {
    // The portable GEMM on host memory is Kokkos Kernels', which has no bf16 path: it computes in f32 there.
    row("checks", "dot under bf16 precision", "not run", "",
        "the portable path on host memory computes bf16-precision products in f32 (no bf16 GEMM in Kokkos Kernels)");
  } else if (hax::bf16_matmul_available()) {
    hax::matmul_precision_scope scope(hax::matmul_precision::bf16);
    auto run16 = [&] { return hax::dot(in.a, in.b, Embed).to_host(); };
    k.compare("dot under bf16 precision (vs f64, bf16 tolerance)", run16(), run16(), c, 1e-2);
  } else {
    row("checks", "dot under bf16 precision", "not run", "", "no bf16 GEMM here: " + hax::bf16_matmul_backend());
  }

  // The vendor's GEMMs called directly (the ceilings stage's rates): f32 and bf16 operands.
  for (auto kind : {gemm_kind::f32, gemm_kind::bf16}) {
    if (!gemm_available(kind)) continue;
    Kokkos::View<float*, hax::memory_space> a("kit::check a", static_cast<std::size_t>(M * K)), b("kit::check b", static_cast<std::size_t>(K * N)),
        cc("kit::check c", static_cast<std::size_t>(M * N));
    auto ah = Kokkos::create_mirror_view(a);
    auto bh = Kokkos::create_mirror_view(b);
    std::memcpy(ah.data(), as.data(), as.size() * sizeof(float));
    std::memcpy(bh.data(), bs.data(), bs.size() * sizeof(float));
    Kokkos::deep_copy(a, ah);
    Kokkos::deep_copy(b, bh);
    const void* pa = a.data();
    const void* pb = b.data();
    Kokkos::View<std::uint16_t*, hax::memory_space> a16("kit::check a16", static_cast<std::size_t>(M * K)),
        b16("kit::check b16", static_cast<std::size_t>(K * N));
    if (kind == gemm_kind::bf16 && on_gpu()) {
      to_bf16(a.data(), a16.data(), M * K);
      to_bf16(b.data(), b16.data(), K * N);
      pa = a16.data();
      pb = b16.data();
    }
    auto run_v = [&] {
      Kokkos::deep_copy(cc, std::numeric_limits<float>::quiet_NaN());
      vendor_gemm(kind, M, N, K, pa, pb, cc.data());
      Kokkos::fence();
      auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), cc);
      return fvec(h.data(), h.data() + h.extent(0));
    };
    k.compare(std::string("vendor GEMM called directly, ") + name_of(kind), run_v(), run_v(),
              kind == gemm_kind::f32 ? c : c16, kind == gemm_kind::f32 ? 1e-6 : 2e-3);
  }
}

// Grouped-query attention: q {batch, pos, kv_head, group, key}, k and v {batch, key_position, kv_head, key}.
using q_t = named_array<float, axes<Batch, Pos, KvHead, Group, Key>>;
using kv_t = named_array<float, axes<Batch, KPos, KvHead, Key>>;
struct qkv_in {
  BOOST_HANA_DEFINE_STRUCT(qkv_in, (q_t, q), (kv_t, k), (kv_t, v));
};

void check_attention(checker& k, std::int64_t window) {
  constexpr std::int64_t B = 2, P = 131, H = 2, G = 3, D = 64;
  const auto qs = k.normal(static_cast<std::size_t>(B * P * H * G * D)), ks = k.normal(static_cast<std::size_t>(B * P * H * D)),
             vs = k.normal(static_cast<std::size_t>(B * P * H * D)), gs = k.normal(static_cast<std::size_t>(B * P * H * G * D));
  qkv_in in{hax::from_host<float>(qs, B * Batch, P * Pos, H * KvHead, G * Group, D * Key),
            hax::from_host<float>(ks, B * Batch, P * KPos, H * KvHead, D * Key),
            hax::from_host<float>(vs, B * Batch, P * KPos, H * KvHead, D * Key)};
  auto g = hax::from_host<float>(gs, B * Batch, P * Pos, H * KvHead, G * Group, D * Key);
  nn::flash_attention_options opts;
  opts.sliding_window = window;
  opts.block_q = 64;
  opts.block_k = 32;
  const double scale = 1 / std::sqrt(double(D));
  auto qi = [&](std::int64_t b, std::int64_t i, std::int64_t h, std::int64_t gg) {
    return std::size_t((((b * P + i) * H + h) * G + gg) * D);
  };
  auto ki = [&](std::int64_t b, std::int64_t j, std::int64_t h) { return std::size_t(((b * P + j) * H + h) * D); };
  auto allowed = [&](std::int64_t i, std::int64_t j) { return j <= i && (window <= 0 || j > i - window); };
  dvec o(qs.size(), 0.0), dq(qs.size(), 0.0), dk(ks.size(), 0.0), dv(vs.size(), 0.0);
  std::vector<double> pr(static_cast<std::size_t>(P)), dp(static_cast<std::size_t>(P));
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t gg = 0; gg < G; ++gg)
        for (std::int64_t i = 0; i < P; ++i) {
          double m = -1e300;
          for (std::int64_t j = 0; j < P; ++j) {
            if (!allowed(i, j)) continue;
            double s = 0;
            for (std::int64_t c = 0; c < D; ++c) s += double(qs[qi(b, i, h, gg) + c]) * ks[ki(b, j, h) + c];
            pr[j] = s * scale;
            m = std::max(m, pr[j]);
          }
          double z = 0;
          for (std::int64_t j = 0; j < P; ++j) z += allowed(i, j) ? (pr[j] = std::exp(pr[j] - m)) : (pr[j] = 0);
          for (std::int64_t j = 0; j < P; ++j) pr[j] /= z;
          for (std::int64_t j = 0; j < P; ++j)
            for (std::int64_t c = 0; c < D; ++c) o[qi(b, i, h, gg) + c] += pr[j] * vs[ki(b, j, h) + c];
          // backward of sum(g * o): dP = g v^T, dS = P (dP - sum(g o)), dq = dS k scale, dk += dS^T q scale, dv += P^T g
          double go = 0;
          for (std::int64_t c = 0; c < D; ++c) go += double(gs[qi(b, i, h, gg) + c]) * o[qi(b, i, h, gg) + c];
          for (std::int64_t j = 0; j < P; ++j) {
            if (!allowed(i, j)) continue;
            double d = 0;
            for (std::int64_t c = 0; c < D; ++c) d += double(gs[qi(b, i, h, gg) + c]) * vs[ki(b, j, h) + c];
            const double ds = pr[j] * (d - go) * scale;
            for (std::int64_t c = 0; c < D; ++c) {
              dq[qi(b, i, h, gg) + c] += ds * ks[ki(b, j, h) + c];
              dk[ki(b, j, h) + c] += ds * qs[qi(b, i, h, gg) + c];
              dv[ki(b, j, h) + c] += pr[j] * gs[qi(b, i, h, gg) + c];
            }
          }
        }
  auto run = [&] {
    auto [v, d] = hax::value_and_grad([&](const qkv_in& x) {
      return hax::sum(g * nn::flash_attention(x.q, x.k, x.v, Pos, KPos, Key, opts));
    })(in);
    auto out = hax::rearrange<axes<Batch, Pos, KvHead, Group, Key>>(nn::flash_attention(in.q, in.k, in.v, Pos, KPos, Key, opts));
    return cat(out.to_host(), d.q.to_host(), d.k.to_host(), d.v.to_host());
  };
  const std::string what = window > 0 ? fmt("flash attention, GQA, sliding window %lld, fwd + bwd", (long long)window)
                                      : std::string("flash attention, GQA, causal, forward + backward");
  k.compare(what, run(), run(), dcat(o, dq, dk, dv), 1e-5);
}

void check_layout(checker& k) {
  // GPT-2's qkv split (index along a middle axis: a strided copy, its gradient a scatter into zeros) and a
  // transposing rearrange, with their gradients.
  constexpr std::int64_t T = 97, Q = 3, D = 160;
  using x_t = named_array<float, axes<Tok, Out, Embed>>;
  const auto xs = k.normal(static_cast<std::size_t>(T * Q * D));
  std::vector<fvec> gs;
  for (int i = 0; i < Q; ++i) gs.push_back(k.normal(static_cast<std::size_t>(T * D)));
  const auto hs = k.normal(static_cast<std::size_t>(T * Q * D));
  auto x = hax::from_host<float>(xs, T * Tok, Q * Out, D * Embed);
  auto h = hax::from_host<float>(hs, D * Embed, Q * Out, T * Tok);
  std::vector<named_array<float, axes<Tok, Embed>>> g;
  for (int i = 0; i < Q; ++i) g.push_back(hax::from_host<float>(gs[static_cast<std::size_t>(i)], T * Tok, D * Embed));
  auto run = [&] {
    auto [v, d] = hax::value_and_grad([&](const x_t& a) {
      auto s = hax::sum(g[0] * hax::index(a, Out, 0)) + hax::sum(g[1] * hax::index(a, Out, 1)) +
               hax::sum(g[2] * hax::index(a, Out, 2));
      return s + hax::sum(h * hax::rearrange<axes<Embed, Out, Tok>>(a));
    })(x);
    return cat(hax::index(x, Out, 1).to_host(), hax::rearrange<axes<Embed, Out, Tok>>(x).to_host(), d.to_host());
  };
  dvec mid, tr(xs.size()), dx(xs.size());
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t c = 0; c < D; ++c) mid.push_back(xs[static_cast<std::size_t>((t * Q + 1) * D + c)]);
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t q = 0; q < Q; ++q)
      for (std::int64_t c = 0; c < D; ++c) {
        const auto i = static_cast<std::size_t>((t * Q + q) * D + c), j = static_cast<std::size_t>((c * Q + q) * T + t);
        tr[j] = xs[i];
        dx[i] = double(gs[static_cast<std::size_t>(q)][static_cast<std::size_t>(t * D + c)]) + hs[j];
      }
  k.compare("index (the qkv split) and rearrange, + gradients", run(), run(), dcat(mid, tr, dx), 1e-6);
}

void check_embedding(checker& k) {
  constexpr std::int64_t V = 1000, D = 96, T = 700;  // ids repeat: the gradient sums rows
  using table_t = named_array<float, axes<Vocab, Embed>>;
  const auto ws = k.normal(static_cast<std::size_t>(V * D)), gs = k.normal(static_cast<std::size_t>(T * D));
  const auto ids = k.ids(static_cast<std::size_t>(T), std::int32_t(V / 4));
  auto w = hax::from_host<float>(ws, V * Vocab, D * Embed);
  auto id = hax::from_host<std::int32_t>(ids, T * Tok);
  auto g = hax::from_host<float>(gs, T * Tok, D * Embed);
  dvec y, dw(ws.size(), 0.0);
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t c = 0; c < D; ++c) {
      y.push_back(ws[static_cast<std::size_t>(ids[t] * D + c)]);
      dw[static_cast<std::size_t>(ids[t] * D + c)] += gs[static_cast<std::size_t>(t * D + c)];
    }
  auto run = [&] {
    auto [v, d] = hax::value_and_grad([&](const table_t& a) { return hax::sum(g * hax::take(a, Vocab, id)); })(w);
    return cat(hax::rearrange<axes<Tok, Embed>>(hax::take(w, Vocab, id)).to_host(), d.to_host());
  };
  k.compare("embedding lookup (take) + gradient (scatter-add)", run(), run(), dcat(y, dw), 1e-6);
}

void check_adamw(checker& k) {
  namespace aw = levanter::optim::detail::adamw;
  constexpr std::int64_t n = 100'003;
  const auto p0 = k.normal(static_cast<std::size_t>(n)), g0 = k.normal(static_cast<std::size_t>(n), 0.1), m0 = k.normal(static_cast<std::size_t>(n), 0.01);
  auto v0 = k.normal(static_cast<std::size_t>(n), 1e-3);
  for (auto& x : v0) x = x * x;
  aw::consts c{};
  c.clip_num = 1.0f, c.clip_den = 1.0f, c.clip = false;
  c.b1 = 0.9f, c.omb1 = 0.1f, c.b2 = 0.95f, c.omb2 = 0.05f, c.eps = 1e-8f;
  c.bc1 = 0.1f, c.bc1_next = 0.19f, c.bc2 = 0.05f, c.wd = 0.1f, c.neg_lr = -6e-4f;
  dvec want;
  double sq = 0;
  {
    dvec p(p0.begin(), p0.end()), m(n), v(n);
    for (std::int64_t i = 0; i < n; ++i) {
      const double g = g0[i];
      m[i] = double(c.omb1) * g + double(c.b1) * m0[i];
      v[i] = double(c.omb2) * g * g + double(c.b2) * v0[i];
      const double u = (m[i] / double(c.bc1)) / (std::sqrt(v[i] / double(c.bc2)) + double(c.eps)) + double(c.wd) * p0[i];
      const double step = u * double(c.neg_lr);
      p[i] = p0[i] + step;
      sq += step * step;
    }
    want = dcat(p, m, v, dvec{sq});
  }
  auto run = [&] {
    auto p = hax::from_host<float>(p0, n * Tok), g = hax::from_host<float>(g0, n * Tok);
    auto m = hax::from_host<float>(m0, n * Tok), v = hax::from_host<float>(v0, n * Tok);
    std::vector<aw::chunk_ref> refs;
    for (std::int64_t b0 = 0; b0 < n; b0 += 32768)
      refs.push_back({p.data() + b0, g.data() + b0, m.data() + b0, v.data() + b0, std::min<std::int64_t>(32768, n - b0),
                      true, 1.0f, 1.0f});
    const auto sums = aw::run_chunks_portable(c, aw::chunk_job::fused, false, refs);
    double s = 0;
    for (double x : sums) s += x;
    return cat(p.to_host(), m.to_host(), v.to_host(), fvec{float(s)});
  };
  k.compare("AdamW update (portable loop) and its step's sum of squares", run(), run(), want, 1e-5);
}

}  // namespace

int stage_ops(const options& o) {
  // The step's memory-bound kernels at GPT-2 124M's 8 x 1024 sizes (small: 512 tokens, vocabulary 4096), each
  // timed alone (median of 5 after a warm-up) on random data, as bytes moved per second against a deep_copy of
  // as many bytes measured in the same run. A kernel far under the copy rate is one of GPU.md's suspects.
  const std::int64_t T = o.small ? 512 : 8 * 1024, V = o.small ? 4096 : 50257, D = o.small ? 128 : 768;
  const std::int64_t P = o.small ? 1'000'000 : 124'439'808;  // AdamW: GPT-2 124M's parameter count
  auto x = hax::zeros<float>(T * Tok, V * Vocab);
  fill_random(x.data(), T * V, 21, 4.0f);
  auto y = hax::zeros<float>(T * Tok, V * Vocab);
  const double big = double(T) * double(V) * sizeof(float);
  const double copy_s = median_time([&] { Kokkos::deep_copy(y.view(), x.view()); });
  const double copy_rate = 2 * big / copy_s;
  row("ops vs copy", "copy (deep_copy)", fmt("%.0f GB/s", copy_rate * 1e-9), "reference",
      fmt("%lld x %lld floats", (long long)T, (long long)V));
  auto report = [&](const std::string& name, double bytes, double secs) {
    std::printf("%-44s %9.3f ms %8.1f GB/s  %.2f of copy\n", name.c_str(), secs * 1e3, bytes / secs * 1e-9,
                bytes / secs / copy_rate);
    row("ops vs copy", name, fmt("%.3f ms, %.0f GB/s", secs * 1e3, bytes / secs * 1e-9),
        fmt("%.2f of copy", bytes / secs / copy_rate));
  };
  std::vector<std::int32_t> ids(static_cast<std::size_t>(T));
  for (std::int64_t t = 0; t < T; ++t) ids[static_cast<std::size_t>(t)] = std::int32_t((t * 7919) % V);
  auto tg = hax::from_host<std::int32_t>(ids, T * Tok);
  auto row_v = hax::zeros<float>(V * Vocab);
  fill_random(row_v.data(), V, 22);
  report("softmax, last axis (vocabulary)", 2 * big, median_time([&] { auto p = nn::softmax(x, Vocab); }));
  report("logsumexp, last axis", big, median_time([&] { auto l = nn::logsumexp(x, Vocab); }));
  report("broadcast add of a row", 2 * big, median_time([&] { auto z = x + row_v; }));
  report("sum over the first axis (column sums)", big, median_time([&] { auto c = hax::sum(x, Tok); }));
  report("cross-entropy loss, forward", big, median_time([&] { (void)nn::cross_entropy_loss(x, Vocab, tg).item(); }));
  report("cross-entropy loss, forward + backward", 3 * big, median_time([&] {
           auto [l, g] = hax::value_and_grad([&](const mat& a) { return nn::cross_entropy_loss(a, Vocab, tg); })(x);
         }));
  y = {};
  auto h = hax::zeros<float>(T * Tok, D * Embed);
  fill_random(h.data(), T * D, 23);
  const double act = double(T) * double(D) * sizeof(float);
  using act_t = named_array<float, axes<Tok, Embed>>;
  report("standardize (LayerNorm), forward", 2 * act, median_time([&] { auto z = nn::standardize(h, Embed); }));
  report("standardize, forward + backward", 5 * act, median_time([&] {
           auto [l, g] = hax::value_and_grad([&](const act_t& a) { return hax::sum(nn::standardize(a, Embed)); })(h);
         }));
  auto h4 = hax::zeros<float>(T * Tok, 4 * D * Embed);
  fill_random(h4.data(), T * 4 * D, 24);
  report("gelu_new (MLP width)", 8 * act, median_time([&] { auto z = nn::gelu_new(h4); }));
  h4 = {};
  x = {};
  {
    namespace aw = levanter::optim::detail::adamw;
    auto p = hax::zeros<float>(P * Tok), g = hax::zeros<float>(P * Tok), m = hax::zeros<float>(P * Tok),
         v = hax::zeros<float>(P * Tok);
    fill_random(p.data(), P, 25);
    fill_random(g.data(), P, 26, 1e-3f);
    std::vector<aw::chunk_ref> refs;
    for (std::int64_t b0 = 0; b0 < P; b0 += 32768)
      refs.push_back({p.data() + b0, g.data() + b0, m.data() + b0, v.data() + b0, std::min<std::int64_t>(32768, P - b0),
                      true, 1, 1});
    aw::consts c{};
    c.b1 = 0.9f, c.omb1 = 0.1f, c.b2 = 0.95f, c.omb2 = 0.05f, c.eps = 1e-8f;
    c.bc1 = 0.1f, c.bc1_next = 0.19f, c.bc2 = 0.05f, c.wd = 0.1f, c.neg_lr = -6e-4f;
    // p, g, m, v read; p, m, v written
    report(fmt("AdamW fused pass, %.1fM parameters", double(P) * 1e-6), 7.0 * 4.0 * double(P),
           median_time([&] { aw::run_chunks_portable(c, aw::chunk_job::fused, false, refs); }, 3));
  }
  return 0;
}

int stage_checks(const options& o) {
  checker k;
  const std::uint64_t seed = o.seed ? o.seed : std::uint64_t(std::chrono::steady_clock::now().time_since_epoch().count());
  k.rng.seed(seed);
  std::printf("checks: seed %llu (--seed %llu repeats this data), buffers poisoned: %s, %s kernels\n",
              (unsigned long long)seed, (unsigned long long)seed, hax::detail::poison_buffers() ? "yes" : "no",
              hax::detail::use_host_kernels() ? "host" : "portable");
  {
    // The checks rely on the poison: an output element no kernel wrote must read NaN. Leave the last one unwritten.
    constexpr std::int64_t n = 1000;
    auto src = hax::from_host<float>(k.normal(n), n * Tok);
    auto dst = named_array<float, axes<Tok>>::allocate({n}, "kit::poison probe");
    copy_kernel(src.data(), dst.data(), n - 1);
    const auto h = dst.to_host();
    std::uint32_t bits;
    std::memcpy(&bits, &h[n - 1], 4);
    const bool seen = bits == 0xFFFFFFFFu && std::isnan(h[n - 1]);
    ++k.total;
    if (!seen) ++k.failures;
    row("checks", "an unwritten output element reads NaN (the poison works)", seen ? "ok" : "FAILED", "",
        seen ? "HALIAX_POISON_BUFFERS=1" : "unwritten memory did not read as the poison: these checks would miss it");
  }
  check_elementwise(k);
  check_broadcast(k);
  check_reductions(k);
  check_softmax_family(k);
  check_norms(k);
  check_cross_entropy(k);
  check_blockwise_loss(k);
  check_dot(k);
  check_attention(k, 0);
  check_attention(k, 45);
  check_layout(k);
  check_embedding(k);
  check_adamw(k);
  row("checks", "all checks", k.failures == 0 ? fmt("%d/%d ok", k.total, k.total) : fmt("%d of %d FAILED", k.failures, k.total),
      "", fmt("seed %llu", (unsigned long long)seed));
  return k.failures == 0 ? 0 : 1;
}

}  // namespace kit
