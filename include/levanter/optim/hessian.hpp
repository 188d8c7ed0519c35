// levanter/optim/hessian.hpp: the Hessian-vector products Sophia-H's update asks for (optimizer::hessian_probe).
// Upstream computes H v by forward-over-reverse (jax.jvp of jax.grad). haliax's autodiff is a reverse-mode tape
// whose backward rules are kernels, with no tangent rules, so here H v is the central difference of the gradient
// along v, with both gradients taken through the same step (same batch, micro-batches, reduction and dropout keys)
// in f32 products:
//
//   H v ≈ (g(θ + ε v) − g(θ − ε v)) / (2 ε),   ε = cbrt(2^-23) · (1 + |θ|) / sqrt(N)
//
// the textbook step for a central difference (the cube root of float32's epsilon, scaled by the parameters' norm
// against the direction's, |v| ≈ sqrt(N) for N standard normals). The truncation error is O(ε²) times the loss's
// third derivative; both gradients are deterministic, so the estimate is as reproducible as the step. Sophia-H uses
// it only as d = v ⊙ H v in an exponential average (β2 = 0.99), clipped. The trainer side (perturb, differentiate,
// restore the parameters bit for bit) is trainer::param_layout::hessian_product.
#pragma once

#include <cstdint>
#include <vector>

#include <levanter/optim/placement.hpp>

namespace levanter::optim {

/// v over [lo, hi) of the flattened parameters (leaves of `sizes` elements, tree order): leaf l is
/// jax.random.normal(jax.random.split(key, leaves)[l], its shape), upstream's tree_gaussian_like.
void hessian_probe_direction(const hvp_probe& key, const std::vector<std::int64_t>& sizes, std::int64_t lo,
                             std::int64_t hi, float* out);

/// ε for parameters of squared norm `param_sq` over `n` elements (see the file comment).
double hessian_probe_step(double param_sq, std::int64_t n);

/// d[i] = v[i] · ((g_plus[i] − g_minus[i]) / (2 ε)), in float.
void hessian_product(const float* v, const float* g_plus, const float* g_minus, double eps, std::int64_t n, float* d);

}  // namespace levanter::optim
