// The routing of a mixture-of-experts layer (levanter/layers/moe.hpp). The router logits are small ({token,
// experts}); the decisions are made on a host copy, in float as transformers makes them, and the backward of the
// routing weights is written out here: the weights are the softmax of the chosen logits, and the auxiliary losses'
// gradients are added to the logits' gradient.
#include <levanter/layers/moe.hpp>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <tuple>

#include <haliax/haliax.hpp>

namespace levanter::layers {

namespace hax = haliax;

routing route(const hax::named_array<float, hax::axes<Token, Experts>>& logits, int k,
              std::optional<double> lbl_coef, std::optional<double> rzl_coef) {
  const std::int64_t T = logits.size(Token), E = logits.size(Experts), K = k;
  if (K < 1 || K > E)
    throw std::invalid_argument("mixture of experts: num_experts_per_tok " + std::to_string(k) +
                                " must be between 1 and the " + std::to_string(E) + " experts");
  const std::vector<float> l = logits.to_host();
  std::vector<float> p(static_cast<std::size_t>(T * E));
  std::vector<double> lse(static_cast<std::size_t>(T));
  std::vector<std::int32_t> chosen(static_cast<std::size_t>(T * K));
  std::vector<float> w(static_cast<std::size_t>(T * K));
  std::vector<std::int64_t> counts(static_cast<std::size_t>(E), 0);
  for (std::int64_t t = 0; t < T; ++t) {
    const float* lt = l.data() + t * E;
    float* pt = p.data() + t * E;
    const float m = *std::max_element(lt, lt + E);
    float s = 0;
    for (std::int64_t e = 0; e < E; ++e) s += (pt[e] = std::exp(lt[e] - m));
    for (std::int64_t e = 0; e < E; ++e) pt[e] /= s;
    lse[static_cast<std::size_t>(t)] = double(m) + std::log(double(s));
    // top k by probability, ties to the lower expert
    float sel = 0;
    for (std::int64_t j = 0; j < K; ++j) {
      std::int64_t best = -1;
      for (std::int64_t e = 0; e < E; ++e) {
        bool taken = false;
        for (std::int64_t i = 0; i < j; ++i) taken = taken || chosen[static_cast<std::size_t>(t * K + i)] == e;
        if (!taken && (best < 0 || pt[e] > pt[best])) best = e;
      }
      chosen[static_cast<std::size_t>(t * K + j)] = static_cast<std::int32_t>(best);
      sel += pt[best];
      ++counts[static_cast<std::size_t>(best)];
    }
    for (std::int64_t j = 0; j < K; ++j)
      w[static_cast<std::size_t>(t * K + j)] = pt[chosen[static_cast<std::size_t>(t * K + j)]] / sel;
  }
  // the counting sort: rows of expert 0 first, (token, choice) order within an expert
  std::vector<std::int64_t> next(static_cast<std::size_t>(E), 0);
  for (std::int64_t e = 1; e < E; ++e)
    next[static_cast<std::size_t>(e)] = next[static_cast<std::size_t>(e - 1)] + counts[static_cast<std::size_t>(e - 1)];
  std::vector<std::int32_t> token_of_row(static_cast<std::size_t>(T * K)), row_of(static_cast<std::size_t>(T * K));
  for (std::int64_t a = 0; a < T * K; ++a) {
    const auto row = next[static_cast<std::size_t>(chosen[static_cast<std::size_t>(a)])]++;
    row_of[static_cast<std::size_t>(a)] = static_cast<std::int32_t>(row);
    token_of_row[static_cast<std::size_t>(row)] = static_cast<std::int32_t>(a / K);
  }

  routing r;
  r.group_sizes = counts;
  r.loads.resize(static_cast<std::size_t>(E));
  // f_e (upstream: expert_loads * E / k); the gradient of the load-balancing loss by P_e is lbl_coef * f_e
  std::vector<double> f(static_cast<std::size_t>(E));
  for (std::int64_t e = 0; e < E; ++e) {
    const double load = T > 0 ? double(counts[static_cast<std::size_t>(e)]) / double(T * K) : 0.0;
    r.loads[static_cast<std::size_t>(e)] = load;
    f[static_cast<std::size_t>(e)] = load * double(E) / double(K);
  }
  if (lbl_coef && T > 0) {
    double s = 0;
    for (std::int64_t e = 0; e < E; ++e) {
      double pe = 0;
      for (std::int64_t t = 0; t < T; ++t) pe += p[static_cast<std::size_t>(t * E + e)];
      s += f[static_cast<std::size_t>(e)] * (pe / double(T));
    }
    r.load_balancing = *lbl_coef * s;
  }
  if (rzl_coef && T > 0) {
    double s = 0;
    for (double z : lse) s += z * z;
    r.router_z = *rzl_coef * s / double(T);
  }

  const auto Tk = T * Token;
  r.experts = hax::from_host<std::int32_t>(chosen, Tk, K * TopExperts);
  r.row_of = hax::from_host<std::int32_t>(row_of, Tk, K * TopExperts);
  r.token_of_row = hax::from_host<std::int32_t>(token_of_row, (T * K) * TokenRepeat);
  r.weights = hax::from_host<float>(w, Tk, K * TopExperts);
  if (hax::detail::ad::any_tracked(logits)) {
    const double cl = lbl_coef ? *lbl_coef : 0.0, cz = rzl_coef ? *rzl_coef : 0.0;
    hax::detail::ad::record(
        r.weights,
        [p = std::move(p), lse = std::move(lse), chosen, w, f = std::move(f), cl, cz, T, E, K](
            const hax::named_array<float, hax::axes<Token, TopExperts>>& g, auto) {
          const std::vector<float> gw = g.to_host();
          std::vector<float> gl(static_cast<std::size_t>(T * E));
          for (std::int64_t t = 0; t < T; ++t) {
            const float* pt = p.data() + t * E;
            double* acc = nullptr;
            std::vector<double> d(static_cast<std::size_t>(E), 0.0);
            acc = d.data();
            // weights = softmax of the chosen logits: d l_i = w_i (g_i - sum_j w_j g_j)
            double wg = 0;
            for (std::int64_t j = 0; j < K; ++j)
              wg += double(w[static_cast<std::size_t>(t * K + j)]) * gw[static_cast<std::size_t>(t * K + j)];
            for (std::int64_t j = 0; j < K; ++j) {
              const auto a = static_cast<std::size_t>(t * K + j);
              acc[chosen[a]] += double(w[a]) * (double(gw[a]) - wg);
            }
            // the auxiliary losses, through the router probabilities: with a_e = d loss / d p_e,
            // d l_i = p_i (a_i - sum_e p_e a_e)
            if (cl != 0 || cz != 0) {
              double pa = 0;
              for (std::int64_t e = 0; e < E; ++e)
                pa += double(pt[e]) * cl * f[static_cast<std::size_t>(e)] / double(T);
              const double z = cz * 2.0 * lse[static_cast<std::size_t>(t)] / double(T);
              for (std::int64_t e = 0; e < E; ++e)
                acc[e] += double(pt[e]) * (cl * f[static_cast<std::size_t>(e)] / double(T) - pa) + z * double(pt[e]);
            }
            for (std::int64_t e = 0; e < E; ++e) gl[static_cast<std::size_t>(t * E + e)] = static_cast<float>(acc[e]);
          }
          return std::tuple{hax::from_host<float>(gl, T * Token, E * Experts)};
        },
        logits);
  }
  return r;
}

}  // namespace levanter::layers
