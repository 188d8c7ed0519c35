// haliax/nn/moe.hpp: experts as one parameter, applied to rows grouped by expert (upstream `haliax.nn.MoELinear`
// with `group_sizes`, a grouped matmul).
//
//   using w1_t = haliax::nn::MoELinear<Experts, axes<Embed>, axes<Mlp>>;
//   auto w1 = w1_t::init(key, 8 * Experts, 768 * Embed, 3072 * Mlp);   // weight {experts, mlp, embed}
//   auto h = w1(xs, group_sizes);     // {row, embed} -> {row, mlp}: rows [0, g0) by expert 0, the next g1 by 1, ...
//
// The rows are sorted by expert beforehand (a mixture-of-experts layer's dispatch), so each expert's rows are one
// contiguous block and the product is one GEMM per expert, never a loop over rows. The weight is out-first per
// expert ({experts, out, in}: torch's [out, in] of each expert, Hugging Face's layout). Deterministic: every block
// is its own GEMM, and the weight gradient of an expert is one product over its rows.
#pragma once

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <boost/hana/define_struct.hpp>

#include "../autodiff.hpp"
#include "../core.hpp"
#include "../detail/gemm.hpp"
#include "../ops/elementwise.hpp"
#include "../random.hpp"

namespace haliax::nn {

/// `x` {Row, In} times each expert's {Out, In} matrix of `w` {Experts, Out, In}, transposed, for the consecutive
/// blocks of rows that `group_sizes` gives (block e has group_sizes[e] rows and uses expert e): {Row, Out}. The
/// sizes must sum to the rows. Gradients: for x, each block times its expert's matrix; for w, each expert's block
/// of the output gradient, transposed, times its block of x (zeros for an expert with no rows).
template <auto R, auto I, auto E, auto O>
named_array<float, axes<R, O>> grouped_matmul(const named_array<float, axes<R, I>>& x,
                                              const named_array<float, axes<E, O, I>>& w,
                                              const std::vector<std::int64_t>& group_sizes) {
  const std::int64_t rows = x.sizes()[0], in = x.sizes()[1];
  const std::int64_t experts = w.sizes()[0], out = w.sizes()[1];
  if (w.sizes()[2] != in)
    throw shape_error("haliax::grouped_matmul: the input " + x.shape_string() + " and the weight " + w.shape_string() +
                      " disagree on the input axis");
  if (static_cast<std::int64_t>(group_sizes.size()) != experts)
    throw shape_error("haliax::grouped_matmul: " + std::to_string(group_sizes.size()) + " group sizes for " +
                      std::to_string(experts) + " experts in " + w.shape_string());
  std::int64_t total = 0;
  for (auto g : group_sizes) {
    if (g < 0) throw shape_error("haliax::grouped_matmul: a negative group size");
    total += g;
  }
  if (total != rows)
    throw shape_error("haliax::grouped_matmul: the group sizes sum to " + std::to_string(total) + ", not to the " +
                      std::to_string(rows) + " rows of " + x.shape_string());
  auto r = named_array<float, axes<R, O>>::allocate({rows, out}, "haliax::grouped_matmul");
  {
    std::int64_t off = 0;
    for (std::int64_t e = 0; e < experts; ++e) {
      const std::int64_t n = group_sizes[static_cast<std::size_t>(e)];
      haliax::detail::gemm_batched<float>(false, true, 1, n, out, in, x.data() + off * in, w.data() + e * out * in,
                                  r.data() + off * out);
      off += n;
    }
  }
  if (haliax::detail::ad::any_tracked(x, w))
    haliax::detail::ad::record(
        r,
        [x, w, group_sizes, rows, in, experts, out](const named_array<float, axes<R, O>>& g, auto needs) {
          named_array<float, axes<R, I>> gx;
          named_array<float, axes<E, O, I>> gw;
          if (needs[0]) {
            gx = named_array<float, axes<R, I>>::allocate({rows, in}, "haliax::grouped_matmul_grad_x");
            std::int64_t off = 0;
            for (std::int64_t e = 0; e < experts; ++e) {
              const std::int64_t n = group_sizes[static_cast<std::size_t>(e)];
              haliax::detail::gemm_batched<float>(false, false, 1, n, in, out, g.data() + off * out, w.data() + e * out * in,
                                          gx.data() + off * in);
              off += n;
            }
          }
          if (needs[1]) {
            gw = zeros_like(w);
            std::int64_t off = 0;
            for (std::int64_t e = 0; e < experts; ++e) {
              const std::int64_t n = group_sizes[static_cast<std::size_t>(e)];
              if (n > 0)
                haliax::detail::gemm_batched<float>(true, false, 1, out, in, n, g.data() + off * out, x.data() + off * in,
                                            gw.data() + e * out * in);
              off += n;
            }
          }
          return std::tuple{gx, gw};
        },
        x, w);
  return r;
}

template <auto E, class In, class Out, class Pre = axes<>>
struct MoELinear;

/// One Linear per expert, stored together: `weight` {Pre..., Experts, Out, In} (upstream `hnn.MoELinear`, out-first
/// as torch's experts). Applied to rows sorted by expert with their group sizes (`grouped_matmul`); no bias.
template <auto E, auto I, auto O, auto... P>
struct MoELinear<E, axes<I>, axes<O>, axes<P...>> {
  using weight_type = named_array<float, axes<P..., E, O, I>>;
  static constexpr std::string_view class_name = "MoELinear";
  BOOST_HANA_DEFINE_STRUCT(MoELinear, (weight_type, weight));

  /// Each expert as a Linear's upstream init: truncated_normal(-3, 3) / sqrt(fan_in), drawn {experts, out, in}.
  static MoELinear init(random::key k, sized_axis<std::remove_cvref_t<decltype(E)>> experts,
                        sized_axis<std::remove_cvref_t<decltype(I)>> in,
                        sized_axis<std::remove_cvref_t<decltype(O)>> out) requires(sizeof...(P) == 0) {
    MoELinear m;
    m.weight = multiply(random::truncated_normal(k, experts, out, in, -3.0f, 3.0f),
                        static_cast<float>(1.0 / std::sqrt(static_cast<double>(in.size))));
    return m;
  }

  /// `x` {Row, In}, its rows grouped by expert as `group_sizes` says -> {Row, Out}.
  template <auto R>
  requires(sizeof...(P) == 0)
  named_array<float, axes<R, O>> operator()(const named_array<float, axes<R, I>>& x,
                                            const std::vector<std::int64_t>& group_sizes) const {
    return grouped_matmul(x, weight, group_sizes);
  }
};

}  // namespace haliax::nn
