// Compile-only checks of what must and must not compile (negative checks with `requires`). The program
// does nothing at run time: it passes by compiling.
#include <cstdint>
#include <haliax/haliax.hpp>
#include <type_traits>

namespace hax = haliax;
using hax::axes;
using hax::named_array;

inline constexpr struct Batch final : hax::axis<"batch"> {
} Batch;
inline constexpr struct Embed final : hax::axis<"embed"> {
} Embed;
inline constexpr struct Mlp final : hax::axis<"mlp"> {
} Mlp;
inline constexpr struct Head final : hax::axis<"head"> {
} Head;
struct NotFinal : hax::axis<"not_final"> {};
struct NotAnAxis {};

// ---- axis tags ----
static_assert(hax::AxisTag<decltype(Batch)>);
static_assert(!hax::AxisTag<NotFinal>);
static_assert(!hax::AxisTag<NotAnAxis>);
static_assert(hax::axis_name(Embed) == "embed");
static_assert(std::is_same_v<decltype(768 * Embed), hax::sized_axis<struct Embed>>);
static_assert((768 * Embed).size == 768);

// ---- array types ----
using BE = named_array<float, axes<Batch, Embed>>;
using EM = named_array<float, axes<Embed, Mlp>>;
using E = named_array<float, axes<Embed>>;
using H = named_array<float, axes<Head>>;
using I = named_array<std::int32_t, axes<Batch>>;
static_assert(BE::rank == 2);
static_assert(BE::has_axis(Embed) && !BE::has_axis(Mlp));
static_assert(std::is_same_v<decltype(hax::zeros<float>(2 * Batch, 3 * Embed)), BE>);

// ---- broadcasting ----
template <class A, class B>
concept addable = requires(A a, B b) {
  a + b;
};
static_assert(addable<BE, E>);
static_assert(addable<E, BE>);
static_assert(!addable<E, H>);
static_assert(!addable<BE, EM>);  // {batch, embed} vs {embed, mlp}: neither contains the other
static_assert(!addable<BE, named_array<double, axes<Batch, Embed>>>);  // element types must agree
static_assert(std::is_same_v<decltype(std::declval<E>() + std::declval<BE>()), BE>);
static_assert(std::is_same_v<decltype(std::declval<BE>() > 0.0f), named_array<bool, axes<Batch, Embed>>>);

// ---- dot ----
template <class A, class B, auto... C>
concept dottable = requires(A a, B b) {
  hax::dot(a, b, C...);
};
static_assert(dottable<BE, EM, Embed>);
static_assert(!dottable<BE, EM, Mlp>);
static_assert(!dottable<BE, EM, Head>);
static_assert(!dottable<BE, EM, Embed, Embed>);
static_assert(std::is_same_v<decltype(hax::dot(std::declval<BE>(), std::declval<EM>(), Embed)),
                             named_array<float, axes<Batch, Mlp>>>);

// ---- reductions ----
template <class A, auto... R>
concept summable = requires(A a) {
  hax::sum(a, R...);
};
static_assert(summable<BE, Batch>);
static_assert(summable<BE, Batch, Embed>);
static_assert(!summable<BE, Mlp>);
static_assert(!summable<BE, Batch, Batch>);
static_assert(std::is_same_v<decltype(hax::sum(std::declval<BE>(), Batch)), E>);
static_assert(std::is_same_v<decltype(hax::argmax(std::declval<BE>(), Embed)), I>);

// ---- element type rules ----
template <class A>
concept has_exp = requires(A a) {
  hax::exp(a);
};
static_assert(has_exp<BE>);
static_assert(!has_exp<I>);  // transcendental functions need floating types

// ---- one name, one axis ----
inline constexpr struct OtherEmbed final : hax::axis<"embed"> {
} OtherEmbed;
inline constexpr struct Vocab final : hax::axis<"vocab"> {
} Vocab;
inline constexpr struct Layers final : hax::axis<"layers"> {
} Layers;
static_assert(hax::DistinctAxisNames<struct Batch, struct Embed>);
static_assert(!hax::DistinctAxisNames<struct Embed, struct OtherEmbed>);  // distinct types, same name
static_assert(!hax::DistinctAxisNames<struct Embed, struct Batch, struct Embed>);
static_assert(std::is_same_v<hax::detail::name_clash<struct Batch, struct Embed, struct OtherEmbed>::type,
                             hax::same_axis_name<"embed", struct Embed, struct OtherEmbed>>);
template <auto... A>
concept axes_formable = requires {
  typename hax::axes<A...>;
};
static_assert(axes_formable<Batch, Embed>);
static_assert(!axes_formable<Embed, OtherEmbed>);
static_assert(!axes_formable<Embed, Embed>);
template <class... S>
concept creatable = requires(S... s) {
  hax::zeros<float>(s...);
};
static_assert(creatable<hax::sized_axis<struct Batch>, hax::sized_axis<struct Embed>>);
static_assert(!creatable<hax::sized_axis<struct Embed>, hax::sized_axis<struct OtherEmbed>>);
static_assert(!creatable<hax::sized_axis<struct Embed>, hax::sized_axis<struct Embed>>);
// A dot whose kept axes would put two same-named axes in its result is refused at the call.
static_assert(
    !dottable<named_array<float, axes<Batch, Embed, Head>>, named_array<float, axes<Head, OtherEmbed>>, Head>);

// ---- axis concepts over type lists (notes print names, not `axes<{}, {}>`) ----
static_assert(std::is_same_v<hax::axis_types_of<axes<Batch, Embed>>, hax::axis_types<struct Batch, struct Embed>>);
static_assert(std::is_same_v<hax::axis_types_of<BE>, hax::axis_types<struct Batch, struct Embed>>);
static_assert(hax::HasAxes<hax::axis_types<struct Batch, struct Embed>, hax::axis_types<struct Embed>>);
static_assert(hax::HasAxes<BE, axes<Embed, Batch>>);
static_assert(!hax::HasAxes<BE, axes<Embed, Mlp>>);
static_assert(hax::LacksAxes<BE, axes<Mlp, Head>>);
static_assert(!hax::LacksAxes<BE, axes<Mlp, Embed>>);
static_assert(hax::AxisOf<struct Embed, axes<Batch, Embed>> && !hax::AxisOf<struct Mlp, axes<Batch, Embed>>);

// ---- modules: a wrong input is refused by the call operator itself ----
namespace nn = hax::nn;
template <class M, class X>
concept callable_with = requires(const M& m, const X& x) {
  m(x);
};
using linear_em = nn::Linear<axes<Embed>, axes<Mlp>>;
static_assert(callable_with<linear_em, BE>);
static_assert(!callable_with<linear_em, named_array<float, axes<Batch, Head>>>);        // no In axis
static_assert(!callable_with<linear_em, named_array<float, axes<Batch, Embed, Mlp>>>);  // has an Out axis
static_assert(!callable_with<linear_em, named_array<double, axes<Batch, Embed>>>);      // other element type
static_assert(!callable_with<nn::Linear<axes<Embed>, axes<Mlp>, axes<Layers>>, BE>);    // stacked: use a layer
static_assert(!callable_with<linear_em, int>);
static_assert(
    std::is_same_v<decltype(std::declval<linear_em>()(std::declval<BE>())), named_array<float, axes<Batch, Mlp>>>);
static_assert(
    !nn::LinearInput<hax::axis_types<struct Batch>, hax::axis_types<struct Embed>, hax::axis_types<struct Mlp>>);
static_assert(callable_with<nn::LayerNorm<Embed>, BE>);
static_assert(!callable_with<nn::LayerNorm<Embed>, H>);
static_assert(!callable_with<nn::LayerNorm<Mlp>, BE>);
static_assert(std::is_same_v<decltype(std::declval<nn::LayerNorm<Embed>>()(std::declval<BE>())), BE>);
static_assert(callable_with<nn::RmsNorm<Embed>, BE>);
static_assert(!callable_with<nn::RmsNorm<Mlp>, BE>);
static_assert(callable_with<nn::Mlp<Embed, Mlp>, BE>);
static_assert(!callable_with<nn::Mlp<Embed, Mlp>, H>);                                       // no Embed
static_assert(!callable_with<nn::Mlp<Embed, Mlp>, named_array<float, axes<Batch, Embed, Mlp>>>);  // has Hidden
static_assert(std::is_same_v<decltype(std::declval<nn::Mlp<Embed, Mlp>>()(std::declval<BE>())), BE>);
template <class M, class X>
concept embeddable = requires(const M& m, const X& ids) {
  m.embed(ids);
};
template <class M, class X>
concept unembeddable = requires(const M& m, const X& x) {
  m.unembed(x);
};
using embedding_t = nn::Embedding<Vocab, Embed>;
static_assert(embeddable<embedding_t, I>);
static_assert(!embeddable<embedding_t, named_array<std::int32_t, axes<Batch, Embed>>>);  // ids with Embed
static_assert(!embeddable<embedding_t, BE>);                                              // float ids
static_assert(unembeddable<embedding_t, BE>);
static_assert(!unembeddable<embedding_t, H>);                                             // no Embed
static_assert(!unembeddable<embedding_t, named_array<float, axes<Batch, Embed, Vocab>>>);  // has Vocab
static_assert(std::is_same_v<decltype(std::declval<embedding_t>().unembed(std::declval<BE>())),
                             named_array<float, axes<Batch, Vocab>>>);

// ---- Stacked::fold: the layer function returns the carry's exact type ----
template <class Pre = axes<>>
struct norm_block {
  BOOST_HANA_DEFINE_STRUCT(norm_block, (nn::LayerNorm<Embed, Pre>, ln));
};
using norm_stack = nn::Stacked<Layers, norm_block>;
inline constexpr auto keeps_carry = [](const norm_block<>& b, const BE& h, std::int64_t) { return b.ln(h); };
inline constexpr auto drops_embed = [](const norm_block<>&, const BE& h, std::int64_t) { return hax::sum(h, Embed); };
inline constexpr auto to_double = [](const norm_block<>&, const BE& h, std::int64_t) {
  return named_array<double, axes<Batch, Embed>>{};
};
inline constexpr auto no_index = [](const norm_block<>& b, const BE& h) { return b.ln(h); };
template <class S, class X, class F>
concept foldable = requires(const S& s, X x, F f) {
  s.fold(x, f);
};
static_assert(foldable<norm_stack, BE, decltype(keeps_carry)>);
static_assert(!foldable<norm_stack, BE, decltype(drops_embed)>);  // other axes
static_assert(!foldable<norm_stack, BE, decltype(to_double)>);    // other element type
static_assert(!foldable<norm_stack, BE, decltype(no_index)>);     // wrong signature
static_assert(nn::LayerFunction<decltype(keeps_carry), norm_block<>, BE>);
static_assert(!nn::ReturnsCarry<named_array<float, axes<Embed, Batch>>, BE>);  // same axes, other order

// ---- the activation registry ----
static_assert(nn::find_activation("gelu_new") == nn::activation::gelu_new);
static_assert(nn::find_activation("swish") == nn::activation::silu);
static_assert(!nn::find_activation("tanh"));  // Mlp has no tanh: the registry must not accept it
static_assert(nn::activation_name(nn::activation::silu) == "silu");

int main() { return 0; }
