// levanter/config/types.hpp: the conventions every config section follows, and the small value types that
// upstream's draccus configs use (durations, mixed-precision policies, "int or list" fields, choice classes).
//
// A config section is a plain aggregate with default member initialisers (the upstream defaults), described by
// a `config::schema<T>` specialisation listing every YAML key with its member and a one-line doc (used by the
// YAML reader/writer, the CLI overrides and `--help`):
//
//   namespace levanter {
//   struct CheckpointerConfig {
//     std::string base_path = "checkpoints/";
//     config::Duration save_interval = config::Duration::minutes(15);
//   };
//   }
//   template <> struct levanter::config::schema<levanter::CheckpointerConfig> {
//     using T = levanter::CheckpointerConfig;
//     static constexpr auto fields = std::make_tuple(
//         field("base_path", &T::base_path, "where checkpoints go"),
//         field("save_interval", &T::save_interval, "time between temporary checkpoints"));
//   };
//
// A choice class (selected by `type:` in YAML) is a struct with `static constexpr std::string_view type_name`;
// a field that may hold one of several is `config::Choice<A, B, ...>` (the first alternative is the default).
// Types a YAML file may name but that we do not implement are listed in `config::unsupported_choices<Choice>`
// so the error can say what to use instead.
#pragma once

#include <array>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <variant>
#include <vector>

namespace levanter::config {

/// One field of a config struct: its YAML key, the member it fills and a one-line description.
template <class T, class M>
struct field_info {
  std::string_view name;
  M T::*member;
  std::string_view doc;
};

template <class T, class M>
constexpr field_info<T, M> field(std::string_view name, M T::*member, std::string_view doc) {
  return {name, member, doc};
}

/// Specialise with `static constexpr auto fields = std::make_tuple(field(...), ...)` for every config struct.
template <class T>
struct schema;

/// A time span written as `5m`, `15min`, `1h`, `30s`, `2d` or a bare number of seconds.
struct Duration {
  double seconds = 0;
  static constexpr Duration minutes(double m) { return Duration{m * 60}; }
  friend bool operator==(const Duration&, const Duration&) = default;
};

/// Floating-point types a mixed-precision policy can name.
enum class dtype { f32, bf16, f16, f64 };

/// A jmp-style mixed-precision policy: `f32`, `bfloat16`, or `p=f32,c=bfloat16,o=f32` (p: parameters,
/// c: compute, o: output). As jmp: a single dtype name sets all three; with keys, compute defaults to params and
/// output to compute.
struct MpPolicy {
  dtype param = dtype::f32;
  dtype compute = dtype::f32;
  dtype output = dtype::f32;
  friend bool operator==(const MpPolicy&, const MpPolicy&) = default;
};

/// One segment of a step schedule: from `start` on, the value is `value` (upstream `ScheduleStep`).
struct ScheduleStep {
  int64_t start = 0;
  int64_t value = 0;
  friend bool operator==(const ScheduleStep&, const ScheduleStep&) = default;
};

/// An integer that may also be written as a schedule `[{start: 0, value: 32}, {start: 1000, value: 64}]`
/// (upstream `train_batch_size: int | IntSchedule`). A plain integer is one segment starting at 0.
struct IntSchedule {
  std::vector<ScheduleStep> steps{ScheduleStep{0, 0}};
  IntSchedule() = default;
  IntSchedule(int64_t v) : steps{ScheduleStep{0, v}} {}  // NOLINT: implicit, as the YAML allows
  bool is_constant() const { return steps.size() == 1; }
  /// The value in force at `step`.
  int64_t at(int64_t step) const {
    int64_t v = steps.front().value;
    for (const auto& s : steps)
      if (s.start <= step) v = s.value;
    return v;
  }
  friend bool operator==(const IntSchedule&, const IntSchedule&) = default;
};

/// A field that is either one string or a list of strings (`fsdp_axis: embed`, `weight_decay_modules: [...]`).
/// `is_list` remembers the spelling so a regex (string) and a list of substrings can mean different things.
struct StringOrList {
  std::vector<std::string> items;
  bool is_list = false;
  StringOrList() = default;
  StringOrList(std::string s) : items{std::move(s)} {}  // NOLINT: implicit, as the YAML allows
  friend bool operator==(const StringOrList&, const StringOrList&) = default;
};

/// A field that is either a number or a list of integers (`cycles: 4` or `cycles: [100, 300]`).
struct NumberOrList {
  std::optional<double> number;
  std::vector<int64_t> list;
  bool is_list() const { return !number.has_value(); }
  friend bool operator==(const NumberOrList&, const NumberOrList&) = default;
};

/// A sub-tree of the YAML that is parsed but not interpreted (features we do not implement yet). It keeps the
/// text and where it came from so validation can refuse it with the file and line.
struct Opaque {
  bool set = false;
  std::string yaml;   // the node, re-emitted
  std::string where;  // "file:line"
  friend bool operator==(const Opaque&, const Opaque&) = default;
};

/// A field written either as one value or as a list of them (`tracker: {type: json_logger}` or a list).
template <class T>
struct OneOrMany {
  std::vector<T> items{T{}};
  bool is_list = false;
};

/// One of several config classes, chosen by `type:`; the first alternative is the default.
template <class... Alts>
struct Choice {
  std::variant<Alts...> value;
  std::string_view type_name() const {
    return std::visit([](const auto& a) { return std::string_view(std::decay_t<decltype(a)>::type_name); }, value);
  }
  template <class A>
  const A* get_if() const { return std::get_if<A>(&value); }
  template <class A>
  A* get_if() { return std::get_if<A>(&value); }
};

/// A `type:` name that upstream accepts but we do not implement, with what to use instead.
struct unsupported_choice {
  std::string_view type_name;
  std::string_view hint;
};

/// Specialise with `static constexpr unsupported_choice names[]` for a Choice to list upstream types we refuse.
template <class ChoiceT>
struct unsupported_choices {
  static constexpr auto names = std::to_array<unsupported_choice>({{"", ""}});
};

}  // namespace levanter::config
