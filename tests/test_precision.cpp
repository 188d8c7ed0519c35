// matmul_precision::bf16 (haliax/precision.hpp): bfloat16 GEMMs against a reference on bfloat16-rounded operands,
// every transpose and the tiling, thread-count independence, gradients of dot, the scope, and GPT-2 under upstream
// Levanter's p=f32,c=bfloat16 policy (tests/golden/gpt2_bf16_golden.h5 from tests/oracle/gen_gpt2_bf16_golden.py).
//
// On a machine where no bfloat16 GEMM runs (no oneDNN, or a CPU without AVX512_BF16/AMX-BF16) the same tests check
// the other half of the promise: the precision has no effect, results are bitwise f32's.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include <haliax/haliax.hpp>
#include <levanter/models/gpt2.hpp>

#include "h5_golden.hpp"
#include "host_io.hpp"

namespace {

namespace hax = haliax;
using hax::matmul_precision;

inline constexpr struct Row final : hax::axis<"row"> {} Row;
inline constexpr struct Col final : hax::axis<"col"> {} Col;
inline constexpr struct Inner final : hax::axis<"inner"> {} Inner;

float bf16_round(float x) { return float(hax::bf16(x)); }

std::vector<float> filled(std::int64_t n, float a, float b) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) v[i] = std::sin(a * float(i) + b) * (1.0f + 0.001f * float(i % 17));
  return v;
}

/// C = op(A) op(B) in double from bfloat16-rounded operands (what a bfloat16 GEMM with f32 sums approximates to
/// the f32 rounding of its sums).
std::vector<double> reference(bool ta, bool tb, std::int64_t batch, std::int64_t m, std::int64_t n, std::int64_t k,
                              const std::vector<float>& A, const std::vector<float>& B, bool round) {
  std::vector<double> C(static_cast<std::size_t>(batch * m * n));
  auto r = [&](float x) { return round ? double(bf16_round(x)) : double(x); };
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        double acc = 0;
        for (std::int64_t l = 0; l < k; ++l) {
          const float a = ta ? A[b * m * k + l * m + i] : A[b * m * k + i * k + l];
          const float bb = tb ? B[b * k * n + j * k + l] : B[b * k * n + l * n + j];
          acc += r(a) * r(bb);
        }
        C[b * m * n + i * n + j] = acc;
      }
  return C;
}

std::vector<float> gemm(matmul_precision p, bool ta, bool tb, std::int64_t batch, std::int64_t m, std::int64_t n,
                        std::int64_t k, const std::vector<float>& A, const std::vector<float>& B) {
  std::vector<float> C(static_cast<std::size_t>(batch * m * n), -1.0f);
  hax::matmul_precision_scope s(p);
  hax::detail::gemm_batched<float>(ta, tb, batch, m, n, k, A.data(), B.data(), C.data());
  return C;
}

/// max |got - want| / (sum over k of |a||b|, the largest such bound): f32 sums of k products are within a few k *
/// 2^-24 of it.
double scaled_error(const std::vector<float>& got, const std::vector<double>& want, double bound) {
  double e = 0;
  for (std::size_t i = 0; i < got.size(); ++i) e = std::max(e, std::fabs(double(got[i]) - want[i]));
  return e / bound;
}

std::string h5_name(const std::string& dotted) {
  std::string s = dotted;
  std::replace(s.begin(), s.end(), '.', '/');
  return s;
}

}  // namespace

TEST_CASE("bf16 matmul: the scope sets the precision and restores the previous one") {
  CHECK(hax::current_matmul_precision() == matmul_precision::f32);
  {
    hax::matmul_precision_scope a(matmul_precision::bf16);
    CHECK(hax::current_matmul_precision() == matmul_precision::bf16);
    {
      hax::matmul_precision_scope b(matmul_precision::f32);
      CHECK(hax::current_matmul_precision() == matmul_precision::f32);
    }
    CHECK(hax::current_matmul_precision() == matmul_precision::bf16);
  }
  CHECK(hax::current_matmul_precision() == matmul_precision::f32);
  MESSAGE("bf16 matmul here: " << std::string(hax::bf16_matmul_available() ? "yes, " : "no, ")
                                << hax::bf16_matmul_backend());
  CHECK(!hax::bf16_matmul_backend().empty());
}

TEST_CASE("bf16 matmul: every transpose, batches and tiled shapes equal the product of rounded operands") {
  struct shape {
    std::int64_t batch, m, n, k;
  };
  // 600 rows: three 256-row tiles, the last partial; 9 x 1100 with few tiles: columns split; k = 1 and odd sizes.
  const shape shapes[] = {{1, 600, 70, 129}, {3, 17, 33, 65}, {1, 9, 1100, 40}, {2, 5, 7, 1}};
  for (const auto& s : shapes)
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb) {
        CAPTURE(s.batch);
        CAPTURE(s.m);
        CAPTURE(s.n);
        CAPTURE(s.k);
        CAPTURE(ta);
        CAPTURE(tb);
        const auto A = filled(s.batch * s.m * s.k, 0.37f, 0.1f);
        const auto B = filled(s.batch * s.k * s.n, 0.11f, 0.7f);
        const auto c16 = gemm(matmul_precision::bf16, ta, tb, s.batch, s.m, s.n, s.k, A, B);
        const auto c32 = gemm(matmul_precision::f32, ta, tb, s.batch, s.m, s.n, s.k, A, B);
        const double bound = 1.1 * double(s.k);  // |a|, |b| < 1.02
        if (hax::bf16_matmul_available()) {
          const auto rounded = reference(ta, tb, s.batch, s.m, s.n, s.k, A, B, true);
          const auto exact = reference(ta, tb, s.batch, s.m, s.n, s.k, A, B, false);
          // Close to the product of the rounded operands (f32 sums) ...
          CHECK(scaled_error(c16, rounded, bound) < 1e-6);
          // ... and measurably not the f32 product: operand rounding (2^-9 relative) shows.
          CHECK(scaled_error(c16, exact, bound) > 1e-5);
          CHECK(scaled_error(c32, exact, bound) < 1e-6);
        } else {
          CHECK(c16 == c32);  // no bfloat16 GEMM here: the precision changes nothing
        }
      }
}

TEST_CASE("bf16 matmul: results do not depend on the thread count") {
  auto& pool = hax::detail::thread_pool::instance();
  const int before = pool.size();
  const std::int64_t m = 700, n = 300, k = 200;  // 3 row tiles x split columns, above the pool's threshold
  const auto A = filled(m * k, 0.013f, 0.2f);
  const auto B = filled(k * n, 0.029f, 0.5f);
  std::vector<std::vector<float>> runs;
  for (int t : {1, 2, 3}) {
    pool.resize(t);
    runs.push_back(gemm(matmul_precision::bf16, false, true, 1, m, n, k, A, B));
    runs.push_back(gemm(matmul_precision::bf16, true, false, 1, m, n, k, A, B));
  }
  pool.resize(before);
  for (std::size_t i = 2; i < runs.size(); ++i) CHECK(runs[i] == runs[i % 2]);
}

TEST_CASE("bf16 matmul: dot and its gradients run in bfloat16 under the scope") {
  const std::int64_t R = 40, C = 24, K = 56;
  auto x = hax::from_host<float>(filled(R * K, 0.21f, 0.3f), R * Row, K * Inner);
  auto w = hax::from_host<float>(filled(K * C, 0.17f, 0.9f), K * Inner, C * Col);
  auto g = hax::from_host<float>(filled(R * C, 0.05f, 0.4f), R * Row, C * Col);
  auto run = [&](matmul_precision p) {
    hax::matmul_precision_scope s(p);
    auto gx = hax::grad([&](const auto& a) { return hax::sum(hax::dot(a, w, Inner) * g); })(x);
    auto gw = hax::grad([&](const auto& b) { return hax::sum(hax::dot(x, b, Inner) * g); })(w);
    return std::tuple{hax::dot(x, w, Inner).to_host(), gx.to_host(), gw.to_host()};
  };
  auto [y16, gx16, gw16] = run(matmul_precision::bf16);
  auto [y32, gx32, gw32] = run(matmul_precision::f32);
  if (!hax::bf16_matmul_available()) {
    CHECK(y16 == y32);
    CHECK(gx16 == gx32);
    CHECK(gw16 == gw32);
    return;
  }
  const auto xs = x.to_host(), ws = w.to_host(), gs = g.to_host();
  // y = x w; dx = g w^T; dw = x^T g, each from rounded operands.
  CHECK(scaled_error(y16, reference(false, false, 1, R, C, K, xs, ws, true), 1.1 * K) < 1e-6);
  CHECK(scaled_error(gx16, reference(false, true, 1, R, K, C, gs, ws, true), 1.1 * C) < 1e-6);
  CHECK(scaled_error(gw16, reference(true, false, 1, K, C, R, xs, gs, true), 1.1 * R) < 1e-6);
  CHECK(scaled_error(gw16, reference(true, false, 1, K, C, R, xs, gs, false), 1.1 * R) > 1e-5);
  CHECK(gx16 != gx32);
}

TEST_CASE("bf16 matmul: GPT-2 under p=f32,c=bfloat16 matches upstream Levanter's policy") {
  h5golden::file base(std::string(HALIAX_GOLDEN_DIR) + "/gpt2_golden.h5");
  h5golden::file f(std::string(HALIAX_GOLDEN_DIR) + "/gpt2_bf16_golden.h5");
  levanter::Gpt2Config cfg;
  cfg.seq_len = int(base.attr("seq_len"));
  cfg.hidden_dim = int(base.attr("hidden_dim"));
  cfg.num_layers = int(base.attr("num_layers"));
  cfg.num_heads = int(base.attr("num_heads"));
  cfg.mlp_scale = int(base.attr("mlp_scale"));
  cfg.layer_norm_epsilon = base.attr("layer_norm_epsilon");
  cfg.gradient_checkpointing = false;
  auto m = levanter::gpt2::LMHeadModel::init(cfg, std::int64_t(base.attr("vocab_size")), hax::random::make_key(0));
  hax::tree::for_each_leaf(m, [&](const std::string& name, auto& leaf) {
    std::vector<std::int64_t> dims;
    auto v = f.floats("params/" + h5_name(name), &dims);
    REQUIRE(std::vector<std::int64_t>(leaf.sizes().begin(), leaf.sizes().end()) == dims);
    host_io::write_elements(leaf, v);
  });
  std::vector<std::int64_t> dims;
  auto t = base.ints("batch/tokens", &dims);
  auto ex = levanter::lm_example::causal(hax::from_host<std::int32_t>(t, dims[0] * levanter::Batch,
                                                                      dims[1] * levanter::Pos),
                                         std::int64_t(base.attr("eos_id")));

  auto run = [&](matmul_precision p) {
    hax::matmul_precision_scope s(p);
    auto logits = m.logits(cfg, ex.tokens, ex.segment_ids).to_host();
    auto [loss, grads] = hax::value_and_grad(
        [&](const levanter::gpt2::LMHeadModel& q) { return levanter::gpt2::next_token_loss(q, cfg, ex); })(m);
    return std::tuple{logits, loss.item(), grads};
  };
  auto [logits16, loss16, grads16] = run(matmul_precision::bf16);
  auto [logits32, loss32, grads32] = run(matmul_precision::f32);
  const auto up16 = f.floats("logits"), up32 = f.floats("logits_f32");
  const double up_loss16 = f.floats("loss")[0], up_loss32 = f.floats("loss_f32")[0];
  auto max_diff = [](const std::vector<float>& a, const std::vector<float>& b) {
    double e = 0;
    for (std::size_t i = 0; i < a.size(); ++i) e = std::max(e, std::fabs(double(a[i]) - double(b[i])));
    return e;
  };
  double scale = 0;
  for (float v : up16) scale = std::max(scale, double(std::fabs(v)));
  const double policy_shift = max_diff(up16, up32);  // how far upstream's policy moves the logits
  MESSAGE("logits: max |upstream bf16 - upstream f32| " << policy_shift << ", |ours bf16 - upstream bf16| "
                                                        << max_diff(logits16, up16) << ", |ours f32 - upstream f32| "
                                                        << max_diff(logits32, up32) << " (max |logit| " << scale
                                                        << "); loss ours " << loss16 << " / " << loss32
                                                        << ", upstream " << up_loss16 << " / " << up_loss32);
  CHECK(policy_shift > 0.02);  // the golden is sensitive to bfloat16 rounding
  CHECK(max_diff(logits32, up32) < 1e-4 * scale);
  CHECK(std::fabs(loss32 - up_loss32) < 1e-5 * up_loss32);
  // bfloat16 tolerance. Upstream rounds every activation to bfloat16, we round only the products' operands, so the
  // two differ by rounding noise of the size the policy itself causes: within twice upstream's own bf16-f32 shift,
  // and within a few bfloat16 ulps of the logits' scale.
  CHECK(max_diff(logits16, up16) < 2 * policy_shift);
  CHECK(max_diff(logits16, up16) < scale / 64);
  CHECK(std::fabs(loss16 - up_loss16) < 2 * std::fabs(up_loss16 - up_loss32));
  CHECK(std::fabs(loss16 - up_loss16) < up_loss16 / 512);
  // Gradients (f32, summed in f32 from bfloat16 products): likewise within twice the policy's shift of each
  // gradient, and within 2^-4 of the largest upstream gradient.
  std::map<std::string, std::vector<float>> grads32_host;
  hax::tree::for_each_leaf(grads32, [&](const std::string& name, const auto& g) { grads32_host[name] = g.to_host(); });
  hax::tree::for_each_leaf(grads16, [&](const std::string& name, const auto& g) {
    const auto want = f.floats("grads/" + h5_name(name));
    double gs = 0;
    for (float v : want) gs = std::max(gs, double(std::fabs(v)));
    const double e = max_diff(g.to_host(), want);
    const double shift = max_diff(grads32_host.at(name), want);
    CHECK_MESSAGE(e < 2 * shift, name << ": max error " << e << " against upstream's bf16-f32 shift " << shift);
    CHECK_MESSAGE(e < gs / 16, name << ": max error " << e << " against largest gradient " << gs);
  });
  if (hax::bf16_matmul_available()) {
    CHECK(logits16 != logits32);
    CHECK(loss16 != loss32);
  } else {
    CHECK(logits16 == logits32);
    CHECK(loss16 == loss32);
  }
}
