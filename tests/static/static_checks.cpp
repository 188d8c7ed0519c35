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

int main() { return 0; }
