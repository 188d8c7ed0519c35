// levanter/io/json_limits.hpp: checks on JSON text from files (checkpoint metadata, cache ledgers) before and after
// nlohmann::json parses it. Its parser and destructor recurse once per nesting level, so a file of 100,000 '['
// overflows the stack; and its get<std::int64_t>() of a float such as 1e300 is undefined behaviour. Files are
// checked with these first.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>

namespace levanter::io {

/// The deepest nesting of arrays and objects in `text` (brackets inside strings do not count); counting stops
/// past `limit`, so the answer is at most limit + 1.
std::size_t json_depth(std::string_view text, std::size_t limit);

/// `j` as a 64-bit signed integer, or nullopt when it is not an integer that fits (a float, 2^63 or more, a string).
std::optional<std::int64_t> json_int(const nlohmann::json& j);

}  // namespace levanter::io
