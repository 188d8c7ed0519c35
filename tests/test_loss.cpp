// Tests for haliax/nn/loss.hpp: cross-entropy values against the formula, masks and ignored targets, mean /
// sum / none, z-loss, class ids against distributions, layouts, gradients against central differences, and
// the block-wise loss against dot + cross_entropy_loss (values and gradients, several block sizes) and
// against the allocator (it never holds [tokens, vocab] logits).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <haliax/autodiff.hpp>
#include <haliax/haliax.hpp>
#include <haliax/nn/loss.hpp>
#include <haliax/detail/tool_counters.hpp>
#include <limits>
#include <stdexcept>
#include <vector>

#include "gradcheck.hpp"
#include "test_axes.hpp"

using namespace test_axes;
namespace hax = haliax;
namespace nn = haliax::nn;
using hax::axes;
using hax::named_array;

namespace {

/// log(sum(exp(row))) in double.
double ref_lse(const std::vector<double>& row) {
  double m = -std::numeric_limits<double>::infinity();
  for (double v : row) m = std::max(m, v);
  double s = 0;
  for (double v : row) s += std::exp(v - m);
  return m + std::log(s);
}

/// Per-token cross-entropy of row-major [tokens, n] logits against class ids (0 for an id out of range),
/// plus w * lse^2.
std::vector<double> ref_ce(const std::vector<double>& x, std::size_t n, const std::vector<std::int32_t>& ids,
                           double w = 0.0) {
  std::vector<double> out;
  for (std::size_t r = 0; r < ids.size(); ++r) {
    std::vector<double> row(x.begin() + r * n, x.begin() + (r + 1) * n);
    const double z = ref_lse(row);
    const bool valid = ids[r] >= 0 && static_cast<std::size_t>(ids[r]) < n;
    out.push_back((valid ? z - row[static_cast<std::size_t>(ids[r])] : 0.0) + w * z * z);
  }
  return out;
}

template <class T>
std::vector<double> as_double(const std::vector<T>& v) {
  return std::vector<double>(v.begin(), v.end());
}

/// Random class ids in [0, n).
std::vector<std::int32_t> random_ids(std::size_t count, std::int32_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<std::int32_t> dist(0, n - 1);
  std::vector<std::int32_t> v(count);
  for (auto& e : v) e = dist(gen);
  return v;
}

struct head_params {
  BOOST_HANA_DEFINE_STRUCT(head_params, (named_array<double, axes<Batch, Pos, Embed>>, hidden),
                           (named_array<double, axes<Vocab, Embed>>, weight));
};

struct head_params_f {
  BOOST_HANA_DEFINE_STRUCT(head_params_f, (named_array<float, axes<Batch, Pos, Embed>>, h),
                           (named_array<float, axes<Vocab, Embed>>, w));
};

// Largest single allocation seen by Kokkos while a probe is alive (the buffer cache is emptied first, so
// every buffer an op uses is a fresh allocation).
std::uint64_t probe_peak_bytes = 0;
void probe_on_allocate(const Kokkos_Profiling_SpaceHandle, const char*, const void*, const std::uint64_t size) {
  probe_peak_bytes = std::max(probe_peak_bytes, size);
}
struct allocation_probe {
  allocation_probe() {
    hax::clear_buffer_cache();
    probe_peak_bytes = 0;
    Kokkos::Tools::Experimental::set_allocate_data_callback(probe_on_allocate);
  }
  ~allocation_probe() { Kokkos::Tools::Experimental::set_allocate_data_callback(nullptr); }
  allocation_probe(const allocation_probe&) = delete;
  allocation_probe& operator=(const allocation_probe&) = delete;
};

}  // namespace

// ---------------------------------------------------------------------------------------------------------
// cross_entropy_loss: values

TEST_CASE("cross_entropy_loss: values from the formula, mean / sum / none") {
  // Row 0: lse(1, 2, 3) = 3 + log(1 + e^-1 + e^-2) = 3.4076059644443806, target 2 -> 0.4076059644443806.
  // Row 1: lse(0.5, -1, 0) = 1.0981443330981213 (by the formula below), target 0 -> 0.5981443330981213.
  auto logits = hax::from_host<double>({1.0, 2.0, 3.0, 0.5, -1.0, 0.0}, 2 * Batch, 3 * Vocab);
  auto ids = hax::from_host<std::int32_t>({2, 0}, 2 * Batch);
  const double l0 = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0)) - 3.0;
  const double l1 = std::log(std::exp(0.5) + std::exp(-1.0) + std::exp(0.0)) - 0.5;
  CHECK(l0 == doctest::Approx(0.4076059644443806).epsilon(1e-14));
  CHECK(nn::cross_entropy_loss(logits, Vocab, ids).item() == doctest::Approx((l0 + l1) / 2).epsilon(1e-14));
  CHECK(nn::cross_entropy_loss(logits, Vocab, ids, nn::reduce_mean).item() == doctest::Approx((l0 + l1) / 2));
  CHECK(nn::cross_entropy_loss(logits, Vocab, ids, nn::reduce_sum).item() == doctest::Approx(l0 + l1).epsilon(1e-14));
  named_array<double, axes<Batch>> per_token = nn::cross_entropy_loss(logits, Vocab, ids, nn::reduce_none);
  check_close(per_token.to_host(), std::vector<double>{l0, l1}, 1e-14, 0);
  auto [loss, log_z] = nn::cross_entropy_loss_and_log_normalizers(logits, Vocab, ids);
  check_close(loss.to_host(), std::vector<double>{l0, l1}, 1e-14, 0);
  check_close(log_z.to_host(), std::vector<double>{l0 + 3.0, l1 + 0.5}, 1e-14, 0);
}

TEST_CASE("cross_entropy_loss: the sum's order is fixed (blocks of 4096 tokens), the same on every thread count") {
  // The reduce_sum/mean total is summed in double in blocks of 4096 tokens, each in token order, then the block
  // sums in order: the order depends on the token count alone, not on the Kokkos backend or the thread count.
  const std::int64_t tokens = 10001, n = 3;
  std::vector<double> x(std::size_t(tokens * n));
  std::vector<std::int32_t> id(static_cast<std::size_t>(tokens));
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37 * double(i)) * 4.0 + 1e-3 * double(i % 97);
  for (std::size_t t = 0; t < id.size(); ++t) id[t] = std::int32_t((t * 7) % n);
  auto logits = hax::from_host<double>(x, tokens * Batch, n * Vocab);
  auto ids = hax::from_host<std::int32_t>(id, tokens * Batch);
  const auto per_token = nn::cross_entropy_loss(logits, Vocab, ids, nn::reduce_none).to_host();
  double expected = 0, in_order = 0;
  for (std::int64_t b = 0; b < tokens; b += 4096) {
    double acc = 0;
    for (std::int64_t r = b; r < std::min(tokens, b + 4096); ++r) acc += per_token[std::size_t(r)];
    expected += acc;
  }
  for (double v : per_token) in_order += v;
  INFO("a plain in-order sum gives " << in_order);
  const int threads = hax::num_threads();
  for (int t : {1, 2, 3}) {
    hax::set_num_threads(t);
    CHECK(nn::cross_entropy_loss(logits, Vocab, ids, nn::reduce_sum).item() == expected);
    CHECK(nn::cross_entropy_loss(logits, Vocab, ids, nn::reduce_mean).item() == expected / double(tokens));
  }
  hax::set_num_threads(threads);
}

TEST_CASE("cross_entropy_loss: where_mask drops tokens from the loss and from the mean's denominator") {
  auto logits = random_array<double>(1, 2 * Batch, 3 * Pos, 5 * Vocab) * 3.0;
  auto ids = hax::from_host<std::int32_t>({0, 4, 2, 1, 3, 3}, 2 * Batch, 3 * Pos);
  std::vector<bool> keep{true, false, true, true, true, false};
  auto mask = hax::from_host(keep, 2 * Batch, 3 * Pos);
  auto ref = ref_ce(logits.to_host(), 5, ids.to_host());
  double sum = 0;
  for (std::size_t r = 0; r < 6; ++r) sum += keep[r] ? ref[r] : 0.0;
  CHECK(nn::cross_entropy_loss(logits, Vocab, ids, hax::where_mask{mask}).item() == doctest::Approx(sum / 4));
  CHECK(nn::cross_entropy_loss(logits, Vocab, ids, hax::where_mask{mask}, nn::reduce_sum).item() ==
        doctest::Approx(sum));
  auto none = nn::cross_entropy_loss(logits, Vocab, ids, hax::where_mask{mask}, nn::reduce_none).to_host();
  for (std::size_t r = 0; r < 6; ++r) CHECK(none[r] == doctest::Approx(keep[r] ? ref[r] : 0.0));

  // A mask over some of the token axes broadcasts over the others.
  auto pos_mask = hax::from_host(std::vector<bool>{true, true, false}, 3 * Pos);
  double s2 = 0;
  for (std::size_t r = 0; r < 6; ++r) s2 += r % 3 != 2 ? ref[r] : 0.0;
  CHECK(nn::cross_entropy_loss(logits, Vocab, ids, hax::where_mask{pos_mask}).item() == doctest::Approx(s2 / 4));

  // Nothing kept: the mean is NaN (as upstream's mean over an empty set), the sum 0.
  auto none_kept = hax::zeros<bool>(2 * Batch, 3 * Pos);
  CHECK(std::isnan(nn::cross_entropy_loss(logits, Vocab, ids, hax::where_mask{none_kept}).item()));
  CHECK(nn::cross_entropy_loss(logits, Vocab, ids, hax::where_mask{none_kept}, nn::reduce_sum).item() == 0.0);
}

TEST_CASE("cross_entropy_loss: the loss and its gradient stay on the device (nothing read back until item())") {
  // The masked mean's sum and kept count are finished on the device (block sums in order by one work item) and
  // the gradient's 1 / count read there: a GPU step synchronises for neither (it used to read back both sums).
  auto logits = random_array<float>(3, 4 * Batch, 3000 * Pos, 7 * Vocab) * 3.0f;  // 12000 tokens: 3 blocks
  auto ids = random_array<float>(4, 4 * Batch, 3000 * Pos);
  std::vector<std::int32_t> hid;
  std::vector<bool> keep;
  for (float v : ids.to_host()) {
    hid.push_back(static_cast<std::int32_t>(std::abs(v) * 7) % 7);
    keep.push_back(v > -0.5f);
  }
  auto tg = hax::from_host<std::int32_t>(hid, 4 * Batch, 3000 * Pos);
  auto mask = hax::from_host(keep, 4 * Batch, 3000 * Pos);
  auto f = [&](const auto& x) { return nn::cross_entropy_loss(x, Vocab, tg, hax::where_mask{mask}); };
  haliax::detail::tools::counter c;
  c.start();
  auto [loss, grad] = hax::value_and_grad(f)(logits);
  const auto n = c.stop();
  CHECK(n.deep_copies == 0);
  // the values: the mean over the kept tokens, and the gradient (softmax - onehot) / count on kept tokens
  const auto hx = logits.to_host();
  const auto hg = grad.to_host();
  double sum = 0, kept = 0, worst = 0;
  std::vector<double> dref(hx.size(), 0.0);
  for (std::size_t r = 0; r < hid.size(); ++r) {
    if (!keep[r]) continue;
    kept += 1;
    double m = -1e300, z = 0;
    for (int k = 0; k < 7; ++k) m = std::max(m, double(hx[r * 7 + k]));
    for (int k = 0; k < 7; ++k) z += std::exp(double(hx[r * 7 + k]) - m);
    sum += m + std::log(z) - double(hx[r * 7 + static_cast<std::size_t>(hid[r])]);
    for (int k = 0; k < 7; ++k) dref[r * 7 + k] = std::exp(double(hx[r * 7 + k]) - m) / z - (k == hid[r] ? 1.0 : 0.0);
  }
  CHECK(loss.item() == doctest::Approx(sum / kept).epsilon(1e-6));
  for (std::size_t i = 0; i < hg.size(); ++i) worst = std::max(worst, std::abs(double(hg[i]) - dref[i] / kept));
  CHECK(worst < 1e-8);
}

TEST_CASE("cross_entropy_loss: an out-of-range target (ignore id) has a zero term but counts in the mean") {
  auto logits = random_array<double>(2, 3 * Batch, 4 * Vocab);
  auto ids = hax::from_host<std::int32_t>({1, -100, 4}, 3 * Batch);
  auto ref = ref_ce(logits.to_host(), 4, ids.to_host());
  CHECK(ref[1] == 0.0);
  CHECK(ref[2] == 0.0);
  CHECK(nn::cross_entropy_loss(logits, Vocab, ids).item() == doctest::Approx(ref[0] / 3));
  // the usual way to ignore them: a mask built from the ids
  CHECK(nn::cross_entropy_loss(logits, Vocab, ids, hax::where_mask{hax::equal(ids, 1)}).item() ==
        doctest::Approx(ref[0]));
}

TEST_CASE("cross_entropy_loss: z-loss adds z_loss_weight * logsumexp^2 per token") {
  auto logits = random_array<double>(3, 2 * Batch, 3 * Pos, 7 * Vocab) * 4.0 + 2.0;
  auto ids = hax::from_host<std::int32_t>({0, 6, 2, 1, 3, 5}, 2 * Batch, 3 * Pos);
  const double w = 1e-2;
  auto ref = ref_ce(logits.to_host(), 7, ids.to_host(), w);
  double mean = 0;
  for (double v : ref) mean += v / 6;
  CHECK(nn::cross_entropy_loss(logits, Vocab, ids, nn::reduce_mean, w).item() == doctest::Approx(mean));
  check_close(nn::cross_entropy_loss(logits, Vocab, ids, nn::reduce_none, w).to_host(), ref, 1e-12, 0);
  auto lse = nn::logsumexp(logits, Vocab);
  auto plain = nn::cross_entropy_loss(logits, Vocab, ids, nn::reduce_none);
  check_close(nn::cross_entropy_loss(logits, Vocab, ids, nn::reduce_none, w).to_host(),
              (plain + lse * lse * w).to_host(), 1e-12, 0);
}

TEST_CASE("cross_entropy_loss: a one-hot distribution equals class ids, and a soft one follows the formula") {
  auto logits = random_array<double>(4, 2 * Batch, 3 * Pos, 6 * Vocab) * 3.0;
  auto ids = hax::from_host<std::int32_t>({0, 5, 2, 1, 3, 5}, 2 * Batch, 3 * Pos);
  auto onehot = nn::one_hot<double>(ids, 6 * Vocab);
  CHECK(nn::cross_entropy_loss(logits, Vocab, onehot).item() ==
        doctest::Approx(nn::cross_entropy_loss(logits, Vocab, ids).item()).epsilon(1e-13));
  CHECK(nn::cross_entropy_loss(logits, Vocab, onehot, nn::reduce_sum, 0.1).item() ==
        doctest::Approx(nn::cross_entropy_loss(logits, Vocab, ids, nn::reduce_sum, 0.1).item()).epsilon(1e-13));
  // soft targets t: sum_j t_j (lse - x_j)
  auto t = nn::softmax(random_array<double>(5, 2 * Batch, 3 * Pos, 6 * Vocab), Vocab) * 0.7;
  auto x = logits.to_host();
  auto th = t.to_host();
  std::vector<double> want;
  for (std::size_t r = 0; r < 6; ++r) {
    std::vector<double> row(x.begin() + r * 6, x.begin() + r * 6 + 6);
    const double z = ref_lse(row);
    double l = 0;
    for (std::size_t j = 0; j < 6; ++j) l += th[r * 6 + j] * (z - row[j]);
    want.push_back(l);
  }
  check_close(nn::cross_entropy_loss(logits, Vocab, t, nn::reduce_none).to_host(), want, 1e-12, 1e-15);
  // targets with their axes in another order
  auto t_perm = hax::rearrange(t, axes<Vocab, Pos, Batch>{});
  check_close(nn::cross_entropy_loss(logits, Vocab, t_perm, nn::reduce_none).to_host(), want, 1e-12, 1e-15);
}

TEST_CASE("cross_entropy_loss: the label axis anywhere, targets and masks in any order") {
  auto logits = random_array<double>(6, 3 * Batch, 4 * Pos, 9 * Vocab) * 3.0;
  auto ids = hax::from_host<std::int32_t>(random_ids(12, 9, 7), 3 * Batch, 4 * Pos);
  auto mask = random_array<double>(8, 4 * Pos, 3 * Batch) > -0.5;
  const double base = nn::cross_entropy_loss(logits, Vocab, ids, hax::where_mask{mask}, nn::reduce_mean, 0.01).item();
  auto first = hax::rearrange(logits, axes<Vocab, Batch, Pos>{});
  auto middle = hax::rearrange(logits, axes<Batch, Vocab, Pos>{});
  auto ids_t = hax::rearrange(ids, axes<Pos, Batch>{});
  CHECK(nn::cross_entropy_loss(first, Vocab, ids, hax::where_mask{mask}, nn::reduce_mean, 0.01).item() ==
        doctest::Approx(base).epsilon(1e-13));
  CHECK(nn::cross_entropy_loss(middle, Vocab, ids_t, hax::where_mask{mask}, nn::reduce_mean, 0.01).item() ==
        doctest::Approx(base).epsilon(1e-13));
  auto a = nn::cross_entropy_loss(logits, Vocab, ids, nn::reduce_none);
  auto b = nn::cross_entropy_loss(middle, Vocab, ids_t, nn::reduce_none);
  check_close(b.to_host(), a.to_host(), 1e-13, 0);
  // a 1-d logits vector is a single token
  auto row = random_array<double>(9, 5 * Vocab);
  auto id = hax::scalar<std::int32_t>(3);
  CHECK(nn::cross_entropy_loss(row, Vocab, id).item() == doctest::Approx(ref_ce(row.to_host(), 5, {3})[0]));
}

TEST_CASE("cross_entropy_loss: float rows longer than the online chunks, on every ISA variant") {
  // 2 rows of 5000 logits; the max sits in the last chunk of one row and the first of the other.
  std::vector<double> x = random_values<double>(10000, 11);
  for (auto& v : x) v *= 6.0;
  x[4990] = 30.0;
  x[5003] = 25.0;
  std::vector<std::int32_t> ids{4990, 17};
  auto want = ref_ce(x, 5000, ids, 1e-3);
  std::vector<float> xf(x.begin(), x.end());
  auto logits = hax::from_host<float>(xf, 2 * Batch, 5000 * Vocab);
  auto tid = hax::from_host<std::int32_t>(ids, 2 * Batch);
  auto& limit = nn::detail::host_isa_limit();
  const auto saved = limit;
  for (auto isa : {nn::detail::host_isa::generic, nn::detail::host_isa::avx2, nn::detail::host_isa::avx512}) {
    limit = isa;
    check_close(nn::cross_entropy_loss(logits, Vocab, tid, nn::reduce_none, 1e-3).to_host(), want, 2e-5, 1e-5);
  }
  limit = saved;
}

TEST_CASE("cross_entropy_loss: non-finite logits") {
  const double inf = std::numeric_limits<double>::infinity();
  // -inf logits (masked vocabulary entries) are fine; a NaN makes its token's loss NaN.
  auto logits = hax::from_host<double>({-inf, 1.0, 2.0, 0.0, std::nan(""), 1.0}, 2 * Batch, 3 * Vocab);
  auto ids = hax::from_host<std::int32_t>({2, 0}, 2 * Batch);
  auto l = nn::cross_entropy_loss(logits, Vocab, ids, nn::reduce_none).to_host();
  CHECK(l[0] == doctest::Approx(std::log(std::exp(1.0) + std::exp(2.0)) - 2.0));
  CHECK(std::isnan(l[1]));
}

// ---------------------------------------------------------------------------------------------------------
// cross_entropy_loss: gradients

TEST_CASE("cross_entropy_loss gradient: (softmax - onehot) / tokens for the mean") {
  auto logits = random_array<double>(12, 2 * Batch, 4 * Vocab);
  auto ids = hax::from_host<std::int32_t>({3, 1}, 2 * Batch);
  auto g = hax::grad([&](const auto& x) { return nn::cross_entropy_loss(x, Vocab, ids); })(logits).to_host();
  auto p = nn::softmax(logits, Vocab).to_host();
  for (std::size_t r = 0; r < 2; ++r)
    for (std::size_t j = 0; j < 4; ++j) {
      const double onehot = static_cast<std::int32_t>(j) == (r == 0 ? 3 : 1) ? 1.0 : 0.0;
      CHECK(g[r * 4 + j] == doctest::Approx((p[r * 4 + j] - onehot) / 2).epsilon(1e-13));
    }
}

TEST_CASE("cross_entropy_loss gradient against central differences: class ids") {
  auto logits = random_array<double>(13, 2 * Batch, 3 * Pos, 7 * Vocab) * 3.0;
  auto ids = hax::from_host<std::int32_t>({0, 6, -100, 1, 3, 5}, 2 * Batch, 3 * Pos);
  auto mask = hax::from_host(std::vector<bool>{true, true, true, false, true, true}, 2 * Batch, 3 * Pos);
  gradcheck::check_gradient([&](const auto& x) { return nn::cross_entropy_loss(x, Vocab, ids); }, logits);
  gradcheck::check_gradient([&](const auto& x) { return nn::cross_entropy_loss(x, Vocab, ids, nn::reduce_sum, 0.05); },
                            logits);
  gradcheck::check_gradient(
      [&](const auto& x) { return nn::cross_entropy_loss(x, Vocab, ids, hax::where_mask{mask}, nn::reduce_mean, 0.1); },
      logits);
  gradcheck::check_output_gradient(
      [&](const auto& x) { return nn::cross_entropy_loss(x, Vocab, ids, hax::where_mask{mask}, nn::reduce_none, 0.1); },
      logits);
  // strided layouts: the label axis first and in the middle
  auto first = hax::rearrange(logits, axes<Vocab, Batch, Pos>{});
  auto middle = hax::rearrange(logits, axes<Batch, Vocab, Pos>{});
  gradcheck::check_gradient(
      [&](const auto& x) { return nn::cross_entropy_loss(x, Vocab, ids, hax::where_mask{mask}, nn::reduce_sum, 0.1); },
      first);
  gradcheck::check_output_gradient(
      [&](const auto& x) { return nn::cross_entropy_loss(x, Vocab, ids, nn::reduce_none, 0.1); }, middle);
}

TEST_CASE("cross_entropy_loss gradient against central differences: distributions, in logits and targets") {
  auto logits = random_array<double>(14, 2 * Batch, 3 * Pos, 5 * Vocab) * 3.0;
  auto t = nn::softmax(random_array<double>(15, 2 * Batch, 3 * Pos, 5 * Vocab), Vocab);
  auto mask = hax::from_host(std::vector<bool>{true, false, true, true, true, true}, 2 * Batch, 3 * Pos);
  gradcheck::check_gradient([&](const auto& x) { return nn::cross_entropy_loss(x, Vocab, t, nn::reduce_mean, 0.1); },
                            logits);
  gradcheck::check_gradient(
      [&](const auto& tt) {
        return nn::cross_entropy_loss(logits, Vocab, tt, hax::where_mask{mask}, nn::reduce_sum, 0.1);
      },
      t);
  auto t_perm = hax::rearrange(t, axes<Vocab, Pos, Batch>{});
  gradcheck::check_gradient([&](const auto& tt) { return nn::cross_entropy_loss(logits, Vocab, tt); }, t_perm);
  auto middle = hax::rearrange(logits, axes<Batch, Vocab, Pos>{});
  gradcheck::check_output_gradient([&](const auto& x) { return nn::cross_entropy_loss(x, Vocab, t, nn::reduce_none); },
                                   middle);
  // both at once, through a module-free composition: the loss of softmax targets made from the logits
  gradcheck::check_gradient(
      [&](const auto& x) { return nn::cross_entropy_loss(x, Vocab, nn::softmax(x * 0.5, Vocab), nn::reduce_sum); },
      logits);
}

TEST_CASE("cross_entropy_loss gradient: masked tokens and an empty mask get zero gradient") {
  auto logits = random_array<double>(16, 2 * Batch, 3 * Vocab);
  auto ids = hax::from_host<std::int32_t>({0, 2}, 2 * Batch);
  auto mask = hax::from_host(std::vector<bool>{false, true}, 2 * Batch);
  auto g =
      hax::grad([&](const auto& x) { return nn::cross_entropy_loss(x, Vocab, ids, hax::where_mask{mask}); })(logits)
          .to_host();
  for (std::size_t j = 0; j < 3; ++j) CHECK(g[j] == 0.0);
  auto none = hax::zeros<bool>(2 * Batch);
  auto g0 =
      hax::grad([&](const auto& x) { return nn::cross_entropy_loss(x, Vocab, ids, hax::where_mask{none}); })(logits)
          .to_host();
  for (double v : g0) CHECK(v == 0.0);
}

TEST_CASE("cross_entropy_loss gradient in float and bf16 follows double") {
  auto xd = random_array<double>(17, 4 * Batch, 3000 * Vocab) * 5.0;
  auto ids = hax::from_host<std::int32_t>({5, 2999, 1500, 0}, 4 * Batch);
  auto f = [&](const auto& x) { return nn::cross_entropy_loss(x, Vocab, ids, nn::reduce_mean, 1e-3); };
  auto gd = hax::grad(f)(xd);
  auto gf = hax::grad(f)(hax::astype<float>(xd));
  check_close(gf.to_host(), gd.to_host(), 1e-4, 1e-9);
  auto xb = hax::astype<hax::bf16>(xd);
  auto gb = hax::grad(f)(xb);
  check_close(gb.to_host(), hax::grad(f)(hax::astype<double>(xb)).to_host(), 2e-2, 1e-6);
}

// ---------------------------------------------------------------------------------------------------------
// blockwise_cross_entropy_loss

TEST_CASE("blockwise_cross_entropy_loss equals dot + cross_entropy_loss for every block size") {
  auto h = random_array<float>(20, 3 * Batch, 4 * Pos, 8 * Embed);
  auto w = random_array<float>(21, 50 * Vocab, 8 * Embed) * 2.0f;
  auto ids = hax::from_host<std::int32_t>(random_ids(12, 50, 22), 3 * Batch, 4 * Pos);
  auto mask = random_array<float>(23, 3 * Batch, 4 * Pos) > -0.6f;
  auto logits = hax::dot(h, w, Embed);
  for (std::int64_t bs : {1, 7, 16, 49, 50, 64, 1000}) {
    INFO("block size " << bs);
    CHECK(nn::blockwise_cross_entropy_loss(h, w, Embed, Vocab, ids, bs).item() ==
          doctest::Approx(nn::cross_entropy_loss(logits, Vocab, ids).item()).epsilon(1e-5));
    CHECK(nn::blockwise_cross_entropy_loss(h, w, Embed, Vocab, ids, bs, nn::reduce_sum, 1e-3).item() ==
          doctest::Approx(nn::cross_entropy_loss(logits, Vocab, ids, nn::reduce_sum, 1e-3).item()).epsilon(1e-5));
    CHECK(
        nn::blockwise_cross_entropy_loss(h, w, Embed, Vocab, ids, hax::where_mask{mask}, bs, nn::reduce_mean, 1e-2)
            .item() ==
        doctest::Approx(nn::cross_entropy_loss(logits, Vocab, ids, hax::where_mask{mask}, nn::reduce_mean, 1e-2).item())
            .epsilon(1e-5));
    named_array<float, axes<Batch, Pos>> none =
        nn::blockwise_cross_entropy_loss(h, w, Embed, Vocab, ids, hax::where_mask{mask}, bs, nn::reduce_none, 1e-2);
    check_close(none.to_host(),
                nn::cross_entropy_loss(logits, Vocab, ids, hax::where_mask{mask}, nn::reduce_none, 1e-2).to_host(),
                1e-5, 1e-6);
  }
}

TEST_CASE("blockwise_cross_entropy_loss gradients equal those of dot + cross_entropy_loss") {
  auto h = random_array<float>(24, 3 * Batch, 4 * Pos, 8 * Embed);
  auto w = random_array<float>(25, 50 * Vocab, 8 * Embed) * 2.0f;
  auto ids = hax::from_host<std::int32_t>(random_ids(12, 50, 26), 3 * Batch, 4 * Pos);
  auto mask = random_array<float>(27, 3 * Batch, 4 * Pos) > -0.6f;
  // Plain: d(logits) from cross_entropy_loss's rule, then the two products of the dot's backward by hand.
  auto logits = hax::dot(h, w, Embed);
  auto dlogits = hax::grad([&](const auto& x) {
    return nn::cross_entropy_loss(x, Vocab, ids, hax::where_mask{mask}, nn::reduce_mean, 1e-2);
  })(logits);
  auto dh_plain = hax::dot(dlogits, w, Vocab);
  auto dw_plain = hax::dot<axes<Vocab, Embed>>(dlogits, h, Batch, Pos);
  for (std::int64_t bs : {1, 7, 16, 50, 64}) {
    INFO("block size " << bs);
    auto dh = hax::grad([&](const auto& x) {
      return nn::blockwise_cross_entropy_loss(x, w, Embed, Vocab, ids, hax::where_mask{mask}, bs, nn::reduce_mean,
                                              1e-2);
    })(h);
    auto dw = hax::grad([&](const auto& x) {
      return nn::blockwise_cross_entropy_loss(h, x, Embed, Vocab, ids, hax::where_mask{mask}, bs, nn::reduce_mean,
                                              1e-2);
    })(w);
    check_close(dh.to_host(), dh_plain.to_host(), 1e-4, 1e-7);
    check_close(dw.to_host(), dw_plain.to_host(), 1e-4, 1e-7);
  }
  // Both inputs in one gradient (one node, two inputs), with reduce_none and a cotangent.
  auto cot = random_array<float>(28, 3 * Batch, 4 * Pos);
  auto dl2 = hax::grad(
      [&](const auto& x) { return hax::sum(nn::cross_entropy_loss(x, Vocab, ids, nn::reduce_none) * cot); })(logits);
  auto g = hax::grad([&](const head_params_f& p) {
    return hax::sum(nn::blockwise_cross_entropy_loss(p.h, p.w, Embed, Vocab, ids, 16, nn::reduce_none) * cot);
  })(head_params_f{h, w});
  check_close(g.h.to_host(), hax::dot(dl2, w, Vocab).to_host(), 1e-4, 1e-7);
  check_close(g.w.to_host(), hax::dot<axes<Vocab, Embed>>(dl2, h, Batch, Pos).to_host(), 1e-4, 1e-7);
}

TEST_CASE("blockwise_cross_entropy_loss gradient against central differences (double)") {
  head_params p{random_array<double>(30, 2 * Batch, 3 * Pos, 4 * Embed),
                random_array<double>(31, 11 * Vocab, 4 * Embed) * 2.0};
  auto ids = hax::from_host<std::int32_t>({0, 10, 3, -100, 7, 5}, 2 * Batch, 3 * Pos);
  auto mask = hax::from_host(std::vector<bool>{true, true, false, true, true, true}, 2 * Batch, 3 * Pos);
  for (std::int64_t bs : {3, 4, 11}) {
    INFO("block size " << bs);
    gradcheck::check_gradient(
        [&](const head_params& q) {
          return nn::blockwise_cross_entropy_loss(q.hidden, q.weight, Embed, Vocab, ids, hax::where_mask{mask}, bs,
                                                  nn::reduce_mean, 0.05);
        },
        p);
  }
  gradcheck::check_gradient(
      [&](const head_params& q) {
        return nn::blockwise_cross_entropy_loss(q.hidden, q.weight, Embed, Vocab, ids, 5, nn::reduce_sum);
      },
      p);
}

TEST_CASE("blockwise_cross_entropy_loss takes hidden, weight and targets in any axis order") {
  auto h = random_array<double>(32, 2 * Batch, 3 * Pos, 4 * Embed);
  auto w = random_array<double>(33, 9 * Vocab, 4 * Embed);
  auto ids = hax::from_host<std::int32_t>(random_ids(6, 9, 34), 2 * Batch, 3 * Pos);
  auto h_t = hax::rearrange(h, axes<Embed, Pos, Batch>{});
  auto w_t = hax::rearrange(w, axes<Embed, Vocab>{});
  auto ids_t = hax::rearrange(ids, axes<Pos, Batch>{});
  const double want = nn::cross_entropy_loss(hax::dot(h, w, Embed), Vocab, ids, nn::reduce_sum, 0.1).item();
  CHECK(nn::blockwise_cross_entropy_loss(h_t, w_t, Embed, Vocab, ids_t, 4, nn::reduce_sum, 0.1).item() ==
        doctest::Approx(want).epsilon(1e-12));
  named_array<double, axes<Pos, Batch>> none =
      nn::blockwise_cross_entropy_loss(h_t, w_t, Embed, Vocab, ids, 4, nn::reduce_none);
  CHECK(none.size(Pos) == 3);
  // gradients come back in the caller's layouts
  auto gh = hax::grad([&](const auto& x) {
    return nn::blockwise_cross_entropy_loss(x, w_t, Embed, Vocab, ids, 4, nn::reduce_sum, 0.1);
  })(h_t);
  auto gh_ref = hax::grad([&](const auto& x) {
    return nn::blockwise_cross_entropy_loss(x, w, Embed, Vocab, ids, 9, nn::reduce_sum, 0.1);
  })(h);
  check_close(gh.to_host(), hax::rearrange(gh_ref, axes<Embed, Pos, Batch>{}).to_host(), 1e-12, 1e-14);
  auto gw = hax::grad([&](const auto& x) {
    return nn::blockwise_cross_entropy_loss(h_t, x, Embed, Vocab, ids, 4, nn::reduce_sum, 0.1);
  })(w_t);
  auto gw_ref = hax::grad([&](const auto& x) {
    return nn::blockwise_cross_entropy_loss(h, x, Embed, Vocab, ids, 9, nn::reduce_sum, 0.1);
  })(w);
  check_close(gw.to_host(), hax::rearrange(gw_ref, axes<Embed, Vocab>{}).to_host(), 1e-12, 1e-14);
  gradcheck::check_gradient(
      [&](const auto& x) { return nn::blockwise_cross_entropy_loss(x, w_t, Embed, Vocab, ids_t, 2); }, h_t);
}

TEST_CASE("blockwise_cross_entropy_loss checks its arguments") {
  auto h = random_array<float>(35, 2 * Batch, 4 * Embed);
  auto w = random_array<float>(36, 9 * Vocab, 4 * Embed);
  auto ids = hax::from_host<std::int32_t>({1, 2}, 2 * Batch);
  CHECK_THROWS_AS(nn::blockwise_cross_entropy_loss(h, w, Embed, Vocab, ids, 0), std::invalid_argument);
  auto w5 = random_array<float>(37, 9 * Vocab, 5 * Embed);
  CHECK_THROWS_AS(nn::blockwise_cross_entropy_loss(h, w5, Embed, Vocab, ids, 4), hax::shape_error);
  auto ids3 = hax::from_host<std::int32_t>({1, 2, 3}, 3 * Batch);
  CHECK_THROWS_AS(nn::blockwise_cross_entropy_loss(h, w, Embed, Vocab, ids3, 4), hax::shape_error);
}

TEST_CASE("blockwise_cross_entropy_loss: a NaN or +inf logit makes its token's loss NaN, -inf logits are fine") {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  // Embed of size 1 and hidden states of 1, so the logits are the weight column: token 0 sees a NaN (vocab 3),
  // token 1 a +inf (vocab 5), token 2 only finite and -inf logits, token 3 only finite ones.
  auto h = hax::from_host<float>({1, 1, 1, 1}, 4 * Batch, 1 * Embed);
  auto ids = hax::from_host<std::int32_t>({0, 1, 0, 7}, 4 * Batch);
  std::vector<float> cols{0.5f, -1.0f, -inf, 2.0f, 0.25f, 1.5f, -inf, 3.0f};
  for (int t = 0; t < 4; ++t) {
    INFO("token " << t);
    std::vector<float> wv = cols;
    if (t == 0) wv[3] = nan;
    if (t == 1) wv[5] = inf;
    if (t == 3) wv[2] = wv[6] = -1.0f;
    auto w = hax::from_host<float>(wv, 8 * Vocab, 1 * Embed);
    auto ht = hax::slice(h, Batch, t, 1);
    auto idt = hax::slice(ids, Batch, t, 1);
    auto plain = nn::cross_entropy_loss(hax::dot(ht, w, Embed), Vocab, idt, nn::reduce_none).to_host();
    for (std::int64_t bs : {1, 3, 8}) {
      INFO("block size " << bs);
      auto l = nn::blockwise_cross_entropy_loss(ht, w, Embed, Vocab, idt, bs, nn::reduce_none).to_host();
      if (t < 2) {
        CHECK(std::isnan(l[0]));
      } else {
        CHECK(std::isfinite(l[0]));
        CHECK(l[0] == doctest::Approx(plain[0]).epsilon(1e-6));
      }
    }
  }
}

TEST_CASE("blockwise_cross_entropy_loss never allocates a tokens x vocab buffer") {
  // 64 tokens x 1000 vocabulary: full float logits are 256000 bytes; every other buffer here (hidden 4 KB,
  // weight and its gradient 64 KB, one logits block of 128 columns 32 KB) is far smaller.
  auto h = random_array<float>(40, 4 * Batch, 16 * Pos, 16 * Embed);
  auto w = random_array<float>(41, 1000 * Vocab, 16 * Embed);
  auto ids = hax::from_host<std::int32_t>(random_ids(64, 1000, 42), 4 * Batch, 16 * Pos);
  const std::uint64_t full = 64 * 1000 * sizeof(float);
  float blocked_loss = 0, plain_loss = 0;
  {
    allocation_probe probe;
    auto [loss, g] = hax::value_and_grad([&](const head_params_f& p) {
      return nn::blockwise_cross_entropy_loss(p.h, p.w, Embed, Vocab, ids, 128, nn::reduce_mean, 1e-4);
    })(head_params_f{h, w});
    blocked_loss = loss.item();
    CHECK(g.w.size(Vocab) == 1000);
  }
  CHECK(probe_peak_bytes > 0);  // the probe sees allocations
  CHECK(probe_peak_bytes < full / 2);
  CHECK(nn::detail::blockwise_peak_logits() == 64 * 128);
  {
    // The probe does see the full logits of the plain version.
    allocation_probe probe;
    auto logits = hax::dot(h, w, Embed);
    auto dl =
        hax::grad([&](const auto& x) { return nn::cross_entropy_loss(x, Vocab, ids, nn::reduce_mean, 1e-4); })(logits);
    plain_loss = nn::cross_entropy_loss(logits, Vocab, ids, nn::reduce_mean, 1e-4).item();
  }
  CHECK(probe_peak_bytes >= full);
  CHECK(blocked_loss == doctest::Approx(plain_loss).epsilon(1e-5));
}

TEST_CASE("blockwise_cross_entropy_loss: a repeated step allocates nothing (scratch from the buffer cache)") {
  // The logits block, the running log-sum-exp and the hidden-gradient accumulator are leased from haliax's buffer
  // cache: once a step has run, the next one with the same shapes allocates nothing (on a GPU every allocation is
  // a device-wide synchronisation).
  auto h = random_array<float>(50, 4 * Batch, 16 * Pos, 16 * Embed);
  auto w = random_array<float>(51, 300 * Vocab, 16 * Embed);
  auto ids = hax::from_host<std::int32_t>(random_ids(64, 300, 52), 4 * Batch, 16 * Pos);
  auto step = [&] {
    auto [loss, g] = hax::value_and_grad([&](const head_params_f& p) {
      return nn::blockwise_cross_entropy_loss(p.h, p.w, Embed, Vocab, ids, 128, nn::reduce_mean, 1e-4);
    })(head_params_f{h, w});
    return std::make_tuple(loss.item(), g.h.to_host(), g.w.to_host());
  };
  haliax::detail::tools::counter c;
  hax::clear_buffer_cache();
  c.start();
  const auto first = step();
  // the counter sees the first step's misses (the backward's logits block reuses the forward's)
  CHECK(c.stop().allocation_labels["haliax::nn::blockwise_cross_entropy(logits)"] == 1);
  c.start();
  const auto second = step();
  const auto n = c.stop();
  CHECK(n.allocations == 0);
  for (const auto& lc : n.allocation_labels) CHECK_MESSAGE(lc.second == 0, lc.first);  // not a binding: clang < 16
  CHECK(std::get<0>(first) == std::get<0>(second));  // and bitwise the same results
  CHECK(std::get<1>(first) == std::get<1>(second));
  CHECK(std::get<2>(first) == std::get<2>(second));
}

TEST_CASE("cross_entropy_loss: large float logits take the streamed backward and agree with double") {
  // 2035 rows of 1031 (above the 8 MiB streaming threshold, rows at every alignment), class ids and a
  // distribution.
  auto xf = hax::astype<float>(random_array<double>(50, 2035 * Batch, 1031 * Vocab) * 6.0);
  auto xd = hax::astype<double>(xf);
  auto ids = hax::from_host<std::int32_t>(random_ids(2035, 1031, 51), 2035 * Batch);
  auto tf = nn::softmax(random_array<float>(52, 2035 * Batch, 1031 * Vocab) * 3.0f, Vocab);
  auto td = hax::astype<double>(tf);
  auto compare = [](const auto& got, const auto& want, double rtol, double atol) {
    auto g = got.to_host();
    auto w = want.to_host();
    REQUIRE(g.size() == w.size());
    std::size_t bad = 0, first = 0;
    for (std::size_t i = 0; i < g.size(); ++i)
      if (!(std::abs(static_cast<double>(g[i]) - w[i]) <= atol + rtol * std::abs(w[i])) && bad++ == 0) first = i;
    CHECK_MESSAGE(bad == 0, bad << " elements off, first " << first << ": " << g[first] << " vs " << w[first]);
  };
  auto by_ids = [&](const auto& x) { return nn::cross_entropy_loss(x, Vocab, ids, nn::reduce_sum, 1e-3); };
  compare(hax::grad(by_ids)(xf), hax::grad(by_ids)(xd), 1e-4, 1e-9);
  compare(hax::grad([&](const auto& x) { return nn::cross_entropy_loss(x, Vocab, tf, nn::reduce_sum); })(xf),
          hax::grad([&](const auto& x) { return nn::cross_entropy_loss(x, Vocab, td, nn::reduce_sum); })(xd), 1e-4,
          1e-8);  // sum(t) p_j - t_j cancels: float rounding of terms ~1e-3
  CHECK(nn::cross_entropy_loss(xf, Vocab, ids).item() ==
        doctest::Approx(nn::cross_entropy_loss(xd, Vocab, ids).item()).epsilon(1e-6));
}

TEST_CASE("blockwise_cross_entropy_loss: value_and_grad matches differentiating dot + cross_entropy_loss") {
  // The plain path here goes through dot's own gradient rule.
  auto h = random_array<float>(60, 3 * Batch, 4 * Pos, 8 * Embed);
  auto w = random_array<float>(61, 37 * Vocab, 8 * Embed) * 2.0f;
  auto ids = hax::from_host<std::int32_t>(random_ids(12, 37, 62), 3 * Batch, 4 * Pos);
  auto mask = random_array<float>(63, 3 * Batch, 4 * Pos) > -0.5f;
  auto [v_plain, g_plain] = hax::value_and_grad([&](const head_params_f& p) {
    return nn::cross_entropy_loss(hax::dot(p.h, p.w, Embed), Vocab, ids, hax::where_mask{mask}, nn::reduce_mean, 1e-3);
  })(head_params_f{h, w});
  for (std::int64_t bs : {5, 10, 37}) {
    INFO("block size " << bs);
    auto [v, g] = hax::value_and_grad([&](const head_params_f& p) {
      return nn::blockwise_cross_entropy_loss(p.h, p.w, Embed, Vocab, ids, hax::where_mask{mask}, bs, nn::reduce_mean,
                                              1e-3);
    })(head_params_f{h, w});
    CHECK(v.item() == doctest::Approx(v_plain.item()).epsilon(1e-5));
    check_close(g.h.to_host(), g_plain.h.to_host(), 1e-4, 1e-7);
    check_close(g.w.to_host(), g_plain.w.to_host(), 1e-4, 1e-7);
  }
}

TEST_CASE("bf16: cross_entropy_loss in both layouts and blockwise_cross_entropy_loss compute in float") {
  auto xd = random_array<double>(70, 3 * Batch, 4 * Pos, 11 * Vocab) * 3.0;
  auto xb = hax::astype<hax::bf16>(xd);
  auto xr = hax::astype<double>(xb);  // the bf16 values, exactly
  auto ids = hax::from_host<std::int32_t>(random_ids(12, 11, 71), 3 * Batch, 4 * Pos);
  auto middle = hax::rearrange(xb, axes<Batch, Vocab, Pos>{});
  const double want = nn::cross_entropy_loss(xr, Vocab, ids, nn::reduce_mean, 1e-2).item();
  CHECK(static_cast<float>(nn::cross_entropy_loss(xb, Vocab, ids, nn::reduce_mean, 1e-2).item()) ==
        doctest::Approx(want).epsilon(1e-2));
  CHECK(static_cast<float>(nn::cross_entropy_loss(middle, Vocab, ids, nn::reduce_mean, 1e-2).item()) ==
        doctest::Approx(want).epsilon(1e-2));
  auto gb = hax::grad([&](const auto& x) { return nn::cross_entropy_loss(x, Vocab, ids, nn::reduce_sum); })(middle);
  auto gr = hax::grad([&](const auto& x) { return nn::cross_entropy_loss(x, Vocab, ids, nn::reduce_sum); })(
      hax::rearrange(xr, axes<Batch, Vocab, Pos>{}));
  check_close(gb.to_host(), gr.to_host(), 2e-2, 2e-3);

  auto h = hax::astype<hax::bf16>(random_array<float>(72, 3 * Batch, 4 * Pos, 8 * Embed));
  auto w = hax::astype<hax::bf16>(random_array<float>(73, 11 * Vocab, 8 * Embed));
  const double plain =
      nn::cross_entropy_loss(hax::dot(hax::astype<float>(h), hax::astype<float>(w), Embed), Vocab, ids).item();
  CHECK(static_cast<float>(nn::blockwise_cross_entropy_loss(h, w, Embed, Vocab, ids, 4).item()) ==
        doctest::Approx(plain).epsilon(2e-2));
  auto gh = hax::grad([&](const auto& x) { return nn::blockwise_cross_entropy_loss(x, w, Embed, Vocab, ids, 4); })(h);
  auto ghf = hax::grad([&](const auto& x) {
    return nn::blockwise_cross_entropy_loss(x, hax::astype<float>(w), Embed, Vocab, ids, 4);
  })(hax::astype<float>(h));
  check_close(gh.to_host(), ghf.to_host(), 5e-2, 2e-3);
}
