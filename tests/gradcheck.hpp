// Finite-difference gradient checker for the tests (the Flashlight pattern): compares the gradient from
// `haliax::grad` with central differences, element by element, in double precision.
//
//   check_gradient([](const auto& x) { return haliax::sum(haliax::tanh(x)); }, x);   // x: double array
//   check_output_gradient([](const auto& x) { return haliax::nn::softmax(x, Vocab); }, x);
//
// `x` may be an array or a module (every double leaf is perturbed), in host or device memory.
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <haliax/autodiff.hpp>
#include <haliax/haliax.hpp>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "host_io.hpp"

namespace gradcheck {

struct tolerance {
  double eps = 1e-6;   // finite-difference step
  double rtol = 1e-5;  // relative tolerance on each gradient element
  double atol = 1e-7;  // absolute tolerance
};

/// Deep copy of every leaf (perturbations must not leak into the caller's module).
template <class M>
M deep_copy(const M& m) {
  return haliax::tree::map(m, [](const std::string&, const auto& leaf) { return haliax::copy(leaf); });
}

template <class F, class M>
double eval(const F& f, const M& m) {
  haliax::no_grad_guard ng;
  return static_cast<double>(f(m).item());
}

/// Checks d f(x) / d x against central differences for every element of every double leaf of `x`.
/// `f` returns a rank-0 double array.
template <class F, class M>
void check_gradient(const F& f, const M& x, tolerance tol = {}) {
  auto g = haliax::grad(f)(x);
  M probe = deep_copy(x);
  std::vector<std::string> names;
  std::vector<std::pair<std::string, std::vector<double>>> grads;
  haliax::tree::for_each_leaf(g, [&](const std::string& name, const auto& leaf) {
    using L = std::remove_cvref_t<decltype(leaf)>;
    if constexpr (std::is_same_v<typename L::value_type, double>) grads.emplace_back(name, leaf.to_host());
  });
  std::size_t k = 0;
  haliax::tree::for_each_leaf(probe, [&](const std::string& name, auto& leaf) {
    using L = std::remove_cvref_t<decltype(leaf)>;
    if constexpr (std::is_same_v<typename L::value_type, double>) {
      const auto& analytic = grads[k++].second;
      REQUIRE(static_cast<std::int64_t>(analytic.size()) == leaf.element_count());
      // Host memory is perturbed in place; device memory (a CUDA build, the device guard) through a host copy.
      std::vector<double> host;
      const bool in_place = haliax::detail::host_reads_arrays();
      if (!in_place) host = leaf.to_host();
      double* p = in_place ? leaf.data() : host.data();
      auto sync = [&] {
        if (!in_place) host_io::write_elements(leaf, host);
      };
      for (std::int64_t i = 0; i < leaf.element_count(); ++i) {
        const double saved = p[i];
        const double h = tol.eps * std::max(1.0, std::abs(saved));
        p[i] = saved + h;
        sync();
        const double up = eval(f, probe);
        p[i] = saved - h;
        sync();
        const double down = eval(f, probe);
        p[i] = saved;
        sync();
        const double numeric = (up - down) / (2 * h);
        const double a = analytic[static_cast<std::size_t>(i)];
        const bool ok = std::abs(a - numeric) <= tol.atol + tol.rtol * std::max(std::abs(a), std::abs(numeric)) +
                                                     1e-9 * (std::abs(up) + std::abs(down)) / h;
        CHECK_MESSAGE(ok, "leaf '" << name << "' element " << i << ": analytic " << a << " vs numeric " << numeric);
      }
    }
  });
}

/// A fixed random cotangent shaped like `y`, so a non-scalar output is checked as sum(f(x) * w).
template <class T, class Axes>
haliax::named_array<T, Axes> cotangent_like(const haliax::named_array<T, Axes>& y, unsigned seed = 7) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  std::vector<T> v(static_cast<std::size_t>(y.element_count()));
  for (auto& e : v) e = static_cast<T>(dist(gen));
  auto w = haliax::empty_like(y);
  host_io::write_elements(w, v);
  return w;
}

/// Checks the gradient of an op with an array result through a random projection sum(f(x) * w).
template <class F, class M>
void check_output_gradient(const F& f, const M& x, tolerance tol = {}) {
  decltype(f(x)) y0;
  {
    haliax::no_grad_guard ng;
    y0 = f(x);
  }
  auto w = cotangent_like(y0);
  check_gradient([&](const M& m) { return haliax::sum(f(m) * w); }, x, tol);
}

}  // namespace gradcheck
