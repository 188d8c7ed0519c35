// levanter/data/error.hpp: the error type of the data path, in a header light enough for every data header.
#pragma once

#include <stdexcept>
#include <string>

namespace levanter::data {

/// A failure a user can cause with their data (missing file, malformed line, empty data, unsupported tokenizer):
/// the message names the file (and line or key) and what to do.
struct data_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace levanter::data
