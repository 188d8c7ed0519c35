// Tests for the kernel families' dispatch (haliax/kernels.hpp): HALIAX_VENDOR_KERNELS parsing, the portable scope
// per family, what each dispatch point records, and that a family switched to its portable kernel computes what its
// specialisation computes while the other families keep theirs. ctest runs this program three more times with
// HALIAX_VENDOR_KERNELS set (0, "gemm", and a bad value): the last case checks what the environment asked for.
#include <cstdlib>
#include <string>

#include "attention_helpers.hpp"

namespace K = haliax::kernels;

namespace {

/// Dispatches of each family and implementation while f runs.
template <class F>
K::dispatch_counts dispatches_of(F&& f) {
  const auto before = K::dispatched();
  f();
  return K::dispatched() - before;
}

/// What a host build picks for a family that may be specialised: its host kernel (unless the whole process runs
/// the portable kernels, HALIAX_PORTABLE_KERNELS=1 or the device guard).
K::impl specialised_impl() { return hax::detail::use_host_kernels() ? K::impl::host : K::impl::portable; }

std::string env_value() {
  const char* e = std::getenv("HALIAX_VENDOR_KERNELS");
  return e ? e : "";
}
bool env_is_default() {
  const char* e = std::getenv("HALIAX_VENDOR_KERNELS");
  return e == nullptr || env_value().empty() || env_value() == "1" || env_value() == "all";
}

}  // namespace

TEST_CASE("kernels: HALIAX_VENDOR_KERNELS values") {
  CHECK(K::parse_vendor_kernels(nullptr) == K::all_families);
  CHECK(K::parse_vendor_kernels("") == K::all_families);
  CHECK(K::parse_vendor_kernels("1") == K::all_families);
  CHECK(K::parse_vendor_kernels("all") == K::all_families);
  CHECK(K::parse_vendor_kernels("0") == 0);
  CHECK(K::parse_vendor_kernels("none") == 0);
  CHECK(K::parse_vendor_kernels("gemm") == K::bit(K::family::gemm));
  CHECK(K::parse_vendor_kernels("softmax,attention,optimizer") ==
        (K::bit(K::family::softmax) | K::bit(K::family::attention) | K::bit(K::family::optimizer)));
  CHECK(K::parse_vendor_kernels("cross_entropy,elementwise") ==
        (K::bit(K::family::cross_entropy) | K::bit(K::family::elementwise)));
  for (const char* bad : {"gemm,cudnn", "2", "gemm,", "GEMM", " gemm"}) {
    CAPTURE(bad);
    std::string msg;
    try {
      K::parse_vendor_kernels(bad);
    } catch (const std::invalid_argument& e) {
      msg = e.what();
    }
    CHECK(msg.find(std::string("HALIAX_VENDOR_KERNELS=") + bad) == 0);
    CHECK(msg.find("is not a kernel family") != std::string::npos);
    CHECK(msg.find("gemm, attention, softmax, cross_entropy, elementwise, optimizer") != std::string::npos);
  }
}

TEST_CASE("kernels: a portable scope switches the listed families, nests, and restores") {
  if (!env_is_default()) return;  // the environment's own cases are checked below
  for (int i = 0; i < K::family_count; ++i) CHECK(K::specialised(static_cast<K::family>(i)));
  {
    K::portable_scope off{K::family::attention, K::family::gemm};
    CHECK_FALSE(K::specialised(K::family::attention));
    CHECK_FALSE(K::specialised(K::family::gemm));
    CHECK(K::specialised(K::family::softmax));
    {
      K::portable_scope all;
      for (int i = 0; i < K::family_count; ++i) CHECK_FALSE(K::specialised(static_cast<K::family>(i)));
    }
    {
      K::portable_scope more{K::family::softmax};
      CHECK_FALSE(K::specialised(K::family::softmax));
      CHECK_FALSE(K::specialised(K::family::gemm));
      CHECK(K::specialised(K::family::cross_entropy));
    }
    CHECK(K::specialised(K::family::softmax));
    CHECK_FALSE(K::specialised(K::family::gemm));
  }
  for (int i = 0; i < K::family_count; ++i) CHECK(K::specialised(static_cast<K::family>(i)));
}

TEST_CASE("kernels: each family switched to its portable kernel alone computes what its specialisation does") {
  if (!env_is_default()) return;
  auto x = random_array<float>(1, 6 * Batch, 40 * Embed);
  auto w = random_array<float>(2, 40 * Embed, 24 * Vocab);
  auto ids = hax::from_host<std::int32_t>({3, 0, 23, 7, 7, 11}, 6 * Batch);
  auto qkv_in = random_qkv<float>(3, 1, 16, 16, 2, 8);
  auto all_ops = [&] {
    auto logits = hax::dot(x, w, Embed);                       // gemm
    auto p = nn::softmax(logits, Vocab);                       // softmax
    auto l = nn::cross_entropy_loss(logits, Vocab, ids);      // cross_entropy
    auto a = nn::flash_attention(qkv_in.q, qkv_in.k, qkv_in.v, Pos, KPos, Key, {.causal = true});  // attention
    return std::tuple{host(logits), host(p), l.item(), host(a)};
  };
  const auto spec = specialised_impl();
  const auto [l0, p0, c0, a0] = all_ops();
  const K::family families[] = {K::family::gemm, K::family::softmax, K::family::cross_entropy, K::family::attention};
  for (K::family f : families) {
    CAPTURE(K::family_name(f));
    std::tuple<std::vector<double>, std::vector<double>, double, std::vector<double>> r;
    K::dispatch_counts d;
    {
      K::portable_scope off{f};
      d = dispatches_of([&] { r = all_ops(); });
    }
    // The switched family ran its portable kernel only; the others what they may.
    CHECK(d(f, K::impl::portable) > 0);
    CHECK(d(f, K::impl::host) == 0);
    for (K::family o : families) {
      if (o == f) continue;
      CAPTURE(K::family_name(o));
      CHECK(d(o, spec) > 0);
      if (spec == K::impl::host) CHECK(d(o, K::impl::portable) == 0);
    }
    check_close(std::get<0>(r), l0, 1e-5, 1e-6);
    check_close(std::get<1>(r), p0, 1e-5, 1e-7);
    CHECK(std::get<2>(r) == doctest::Approx(c0).epsilon(1e-6));
    check_close(std::get<3>(r), a0, 1e-5, 1e-6);
  }
}

TEST_CASE("kernels: gradients dispatch as ops of their own, and the attention gradient agrees across the switch") {
  if (!env_is_default()) return;
  auto x = random_qkv<double>(5, 1, 12, 12, 2, 4);
  auto loss = [](const qkv<double>& m) {
    return hax::sum(nn::flash_attention(m.q, m.k, m.v, Pos, KPos, Key, {.causal = true}));
  };
  qkv<double> g_spec, g_port;
  const auto d_spec = dispatches_of([&] { g_spec = hax::grad(loss)(x); });
  K::dispatch_counts d_port;
  {
    K::portable_scope off{K::family::attention};
    d_port = dispatches_of([&] { g_port = hax::grad(loss)(x); });
  }
  CHECK(d_spec(K::family::attention, specialised_impl()) == 2);  // the forward and its gradient
  CHECK(d_port(K::family::attention, K::impl::portable) == 2);
  CHECK(d_port(K::family::attention, K::impl::host) == 0);
  check_close(host(g_port.q), host(g_spec.q), 1e-10, 1e-12);
  check_close(host(g_port.k), host(g_spec.k), 1e-10, 1e-12);
  check_close(host(g_port.v), host(g_spec.v), 1e-10, 1e-12);
}

TEST_CASE("kernels: what HALIAX_VENDOR_KERNELS asks for is what runs") {
  const std::string v = env_value();
  auto x = random_array<float>(1, 6 * Batch, 40 * Embed);
  auto w = random_array<float>(2, 40 * Embed, 24 * Vocab);
  auto run = [&] {
    auto logits = hax::dot(x, w, Embed);
    return host(nn::softmax(logits, Vocab));
  };
  if (v == "0") {
    const auto d = dispatches_of(run);
    CHECK(d(K::family::gemm, K::impl::portable) == 1);
    CHECK(d(K::family::softmax, K::impl::portable) == 1);
    CHECK(d(K::family::gemm, K::impl::host) + d(K::family::softmax, K::impl::host) == 0);
    for (int i = 0; i < K::family_count; ++i) CHECK_FALSE(K::specialised(static_cast<K::family>(i)));
  } else if (v == "gemm") {
    const auto d = dispatches_of(run);
    CHECK(d(K::family::gemm, specialised_impl()) == 1);
    CHECK(d(K::family::softmax, K::impl::portable) == 1);
    CHECK(K::specialised(K::family::gemm));
    CHECK_FALSE(K::specialised(K::family::softmax));
  } else if (!env_is_default()) {
    // A bad value: every dispatch throws the message naming it, and nothing is computed.
    std::string msg;
    try {
      run();
    } catch (const std::invalid_argument& e) {
      msg = e.what();
    }
    CHECK(msg.find("HALIAX_VENDOR_KERNELS=" + v) == 0);
    CHECK(msg.find("is not a kernel family") != std::string::npos);
  } else {
    const auto d = dispatches_of(run);
    CHECK(d(K::family::gemm, specialised_impl()) == 1);
    CHECK(d(K::family::softmax, specialised_impl()) == 1);
  }
}
