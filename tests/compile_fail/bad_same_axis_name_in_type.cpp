// The same rule for an array type written out: `axes<...>` itself requires distinct names, so the error is
// at the line that spells the type, naming both tags and the shared name.
#include <haliax/haliax.hpp>
inline constexpr struct Batch final : haliax::axis<"batch"> {} Batch;
inline constexpr struct Embed final : haliax::axis<"embed"> {} Embed;
inline constexpr struct OtherEmbed final : haliax::axis<"embed"> {} OtherEmbed;
int main() {
  haliax::named_array<float, haliax::axes<Batch, Embed, OtherEmbed>> x;  // expect-first-error-at-line
  // expect: template constraint failure for ‘template<auto ...A>  requires
  // expect: struct haliax::axes’
  // expect: [with NameClash = haliax::same_axis_name<{"embed"}, Embed, OtherEmbed>]
}
