// Tests for haliax/core.hpp: creation, shapes, host copies, bf16, errors.
#include <doctest/doctest.h>
#include <memory>

#include "test_axes.hpp"

using namespace test_axes;
namespace hax = haliax;

TEST_CASE("zeros, ones, full and sizes by name") {
  auto x = hax::zeros<float>(3 * Batch, 4 * Embed);
  static_assert(std::is_same_v<decltype(x), hax::named_array<float, hax::axes<Batch, Embed>>>);
  CHECK(x.size(Batch) == 3);
  CHECK(x.size(Embed) == 4);
  CHECK(x.element_count() == 12);
  CHECK(x.shape_string() == "{batch=3, embed=4}");
  for (float v : x.to_host()) CHECK(v == 0.0f);
  for (float v : hax::ones<float>(2 * X).to_host()) CHECK(v == 1.0f);
  for (int v : hax::full<std::int32_t>(7, 5 * Y).to_host()) CHECK(v == 7);
  auto s = hax::scalar(2.5);
  static_assert(decltype(s)::rank == 0);
  CHECK(s.item() == 2.5);
}

TEST_CASE("*_like keep axes and sizes") {
  auto x = hax::full<float>(3.0f, 2 * X, 5 * Y);
  auto z = hax::zeros_like(x);
  auto o = hax::ones_like<std::int32_t>(x);
  auto f = hax::full_like(x, -1.0f);
  CHECK(z.sizes() == x.sizes());
  static_assert(std::is_same_v<decltype(o), hax::named_array<std::int32_t, hax::axes<X, Y>>>);
  for (auto v : o.to_host()) CHECK(v == 1);
  for (auto v : f.to_host()) CHECK(v == -1.0f);
  for (auto v : z.to_host()) CHECK(v == 0.0f);
}

TEST_CASE("arange and from_host round trip") {
  auto a = hax::arange(5 * Pos);
  CHECK(a.to_host() == std::vector<std::int32_t>{0, 1, 2, 3, 4});
  auto b = hax::arange<float>(4 * X, 1.0f, 0.5f);
  CHECK(b.to_host() == std::vector<float>{1.0f, 1.5f, 2.0f, 2.5f});
  std::vector<double> data{1, 2, 3, 4, 5, 6};
  auto c = hax::from_host(data, 2 * X, 3 * Y);
  CHECK(c.to_host() == data);
  CHECK_THROWS_AS(hax::from_host(data, 4 * X), hax::shape_error);
}

TEST_CASE("handles share buffers, and copy makes a new one") {
  auto x = hax::zeros<float>(3 * X);
  auto y = x;
  auto z = hax::copy(x);
  CHECK(y.data() == x.data());
  CHECK(z.data() != x.data());
  CHECK(z.to_host() == x.to_host());
}

TEST_CASE("bf16 rounds to nearest even") {
  CHECK(hax::bf16(1.0f).bits == 0x3f80);
  // 1 + 2^-8 is halfway between bf16 1.0 and the next value: ties to even (1.0).
  CHECK(hax::bf16(1.0f + 1.0f / 256).bits == 0x3f80);
  // 1 + 3 * 2^-8 is halfway between 1+2^-7 (odd mantissa) and 1+2^-6: ties to even (up).
  CHECK(hax::bf16(1.0f + 3.0f / 256).bits == 0x3f82);
  CHECK(hax::bf16(1.0f + 1.0f / 256 + 1.0f / 65536).bits == 0x3f81);
  CHECK(std::isnan(float(hax::bf16(std::nanf("")))));
  CHECK(float(hax::bf16(-2.5f)) == -2.5f);
  auto x = hax::astype<hax::bf16>(hax::from_host<float>({1.0f, 3.14159f}, 2 * X));
  auto back = hax::astype<float>(x).to_host();
  CHECK(back[0] == 1.0f);
  CHECK(back[1] == doctest::Approx(3.140625f));
}

TEST_CASE("a negative size is rejected with the shape") {
  CHECK_THROWS_WITH_AS(hax::zeros<float>(-1 * X), doctest::Contains("{x=-1}"), hax::shape_error);
}

// haliax's buffer cache (core.hpp) takes a buffer back only when no array is left over it. Arrays that view
// another's buffer under other axes (rename, reshape, slices, unbind) share its lease, so the buffer returns to
// the cache when the last of them goes; before, the lease died with the first array and the buffer was freed
// (a page fault per 4 KiB on the next allocation of that size, every training step).
TEST_CASE("a buffer viewed under other axes returns to the cache when the last array over it is gone") {
  hax::clear_buffer_cache();
  constexpr std::int64_t n = 12347;  // a size nothing else here allocates
  const float* first = nullptr;
  {
    hax::named_array<float, hax::axes<Z>> renamed;
    std::vector<hax::named_array<float, hax::axes<Y>>> rows;
    {
      auto x = hax::zeros<float>(n * X);
      first = x.data();
      renamed = hax::rename(x, X, Z);
      CHECK(renamed.data() == first);
    }
    // The renamed view keeps the buffer leased: a new array of the same size must not get it.
    {
      auto other = hax::zeros<float>(n * X);
      CHECK(other.data() != first);
    }
    auto m = hax::zeros<float>(7 * X, (n / 7 + 1) * Y);
    const float* mfirst = m.data();
    rows = hax::unbind(m, X);
    m = {};
    CHECK(rows[3].data() == mfirst + 3 * (n / 7 + 1));
    rows.clear();
    auto again = hax::zeros<float>(7 * X, (n / 7 + 1) * Y);
    CHECK(again.data() == mfirst);  // back in the cache once the last row was gone
  }
  auto x2 = hax::zeros<float>(n * X);
  CHECK(x2.data() == first);  // back in the cache once the renamed view was gone
}

// Moving or assigning an array hands its buffer on without a stray view: a Kokkos 3 View copies on move, so a
// member-wise move left the source viewing the buffer without its lease, and member-wise assignment dropped the
// old lease while the array still viewed the old buffer. Either way the buffer was freed instead of cached (in a
// GPT-2 training step: every per-layer weight gradient, mapped afresh each step).
TEST_CASE("moves and assignments return buffers to the cache") {
  hax::clear_buffer_cache();
  auto misses = [] { return hax::buffer_cache_statistics().misses; };
  constexpr std::int64_t n = 23459, m = 23473, k = 23497;  // sizes nothing else here allocates
  const float* first = nullptr;
  {
    auto a = hax::zeros<float>(n * X);
    first = a.data();
    auto b = std::move(a);  // b goes before a: a must not hold the buffer past b
    CHECK_FALSE(a.valid());
    CHECK(a.data() == nullptr);
    CHECK(b.data() == first);
  }
  auto before = misses();
  auto again = hax::zeros<float>(n * X);
  CHECK(misses() == before);
  CHECK(again.data() == first);

  auto x = hax::zeros<float>(m * X);
  const float* xfirst = x.data();
  x = hax::zeros<float>(k * X);  // move assignment over x's buffer
  before = misses();
  auto y = hax::zeros<float>(m * X);
  CHECK(misses() == before);
  CHECK(y.data() == xfirst);

  const float* yfirst = y.data();
  y = x;  // copy assignment over y's buffer: both now share x's
  CHECK(y.data() == x.data());
  before = misses();
  auto z = hax::zeros<float>(m * X);
  CHECK(misses() == before);
  CHECK(z.data() == yfirst);
}

// Once a program marks its steps (the Trainer does after each), a step that repeats the previous one's shapes
// allocates nothing, and what a whole step left idle is given back. Before, a miss gave back idle buffers whenever the
// cache held more than half of what arrays held: a step whose phases need different sizes (forward, backward) evicted
// one phase's buffers for the other's, every step (a small GPT-2 step: 57 misses, 120 MB). Last in this file: the
// marks change the cache's policy for the rest of the process.
TEST_CASE("with steps marked, a repeating step allocates nothing and what a step left idle is given back") {
  hax::clear_buffer_cache();
  const auto stats = [] { return hax::buffer_cache_statistics(); };
  // 2 MiB of floats and more each (large enough for the ratio rule), sizes nothing else here allocates
  constexpr std::int64_t a = (1 << 19) + 3, b = (1 << 19) + 7, once = (1 << 19) + 13;
  const auto step = [&](bool with_temporary) {
    {  // a phase holding two buffers of one size, then a phase needing another size while they are idle
      auto x1 = hax::zeros<float>(a * X);
      auto x2 = hax::zeros<float>(a * X);
    }
    {
      auto y = hax::zeros<float>(b * X);
    }
    if (with_temporary) auto t = hax::zeros<float>(once * X);
    hax::buffer_cache_step_boundary();
  };
  // The first step runs under the ratio rule (no mark yet), which on its own would evict the a's for b and b for
  // the a's in every step from here on: 3 misses a step.
  step(false);
  step(false);
  const auto before = stats();
  for (int i = 0; i < 3; ++i) step(false);
  const auto steady = stats();
  CHECK(steady.misses == before.misses);
  CHECK(steady.hits - before.hits == 9);
  CHECK(steady.idle_bytes == std::size_t(2 * a + b) * sizeof(float));
  // a temporary of one step: kept through the next step's end only if that step uses it; it does not
  step(true);
  CHECK(stats().misses == steady.misses + 1);
  CHECK(stats().idle_bytes == std::size_t(2 * a + b + once) * sizeof(float));
  step(false);
  const auto after = stats();
  CHECK(after.evicted == steady.evicted + 1);
  CHECK(after.idle_bytes == steady.idle_bytes);
  CHECK(after.misses == steady.misses + 1);
}

namespace {
struct memo_test_tag;
using memo_test = hax::detail::content_memo<memo_test_tag, std::vector<int>, std::shared_ptr<int>, 3>;
}  // namespace

TEST_CASE("content memo: one value per key, made once, bounded, emptied with the buffer cache") {
  hax::clear_buffer_cache();
  int made = 0;
  auto make_for = [&](int v) {
    return [&made, v] {
      ++made;
      return std::make_shared<int>(v);
    };
  };
  const auto a = memo_test::get({1, 2}, make_for(12));
  const auto b = memo_test::get({1, 2}, make_for(99));  // the same key: kept, not made again
  CHECK(made == 1);
  CHECK(a == b);
  CHECK(*b == 12);
  const auto c = memo_test::get({1, 3}, make_for(13));
  CHECK(made == 2);
  CHECK(*c == 13);
  CHECK(memo_test::size() == 2);
  memo_test::get({4}, make_for(4));
  memo_test::get({5}, make_for(5));  // past 3 keys the memo starts again
  CHECK(memo_test::size() == 1);
  CHECK(*a == 12);  // a value handed out stays alive
  hax::clear_buffer_cache();
  CHECK(memo_test::size() == 0);
  CHECK(*memo_test::get({1, 2}, make_for(21)) == 21);  // made again after the cache was emptied
  CHECK(made == 5);
}
