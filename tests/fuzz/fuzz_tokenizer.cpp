// fuzz-sources: src/data/tokenizer.cpp src/data/unicode_tables.cpp
// fuzz-flags: -max_len=8192
// libFuzzer target for levanter::data::tokenizer::from_json (a tokenizer.json from bytes) and encoding with it.
// An input is a tokenizer.json, optionally followed by a NUL byte and a text to encode (else a fixed text). A file
// the loader refuses must throw data_error; one it loads must encode the text, decode the ids and show each token.
#include <cstdint>
#include <levanter/data/tokenizer.hpp>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  const auto nul = bytes.find('\0');
  const auto json = bytes.substr(0, nul);
  const auto text = nul == std::string_view::npos ? std::string_view("Hello <s> world \xC3\xA9\xF0\x9F\x98\x80 a  b\n")
                                                  : bytes.substr(nul + 1, 256);
  try {
    const auto tok = levanter::data::tokenizer::from_json(json, "fuzz input");
    for (bool special : {true, false}) {
      const auto ids = tok.encode(text, special);
      (void)tok.decode(ids, special);
      for (auto id : ids) {
        (void)tok.token_text(id);
        (void)tok.token_byte_length(id);
      }
    }
  } catch (const levanter::data::data_error&) {
  }
  return 0;
}
