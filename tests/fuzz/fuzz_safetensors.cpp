// libFuzzer target for levanter::safetensors::parse (built and run by scripts/fuzz.sh safetensors SECONDS).
// fuzz-sources: src/compat/safetensors.cpp src/io/atomic_file.cpp
// fuzz-flags: -max_len=4096 -dict=tests/fuzz/safetensors.dict
// Each input is parsed twice: as it is, and with the length field rewritten so the header ends at the input's
// last '}', which spends the fuzzer's time on the JSON rather than on guessing lengths. A header that parses must
// describe tensors that lie inside the input and tile the data buffer; anything else aborts.
#include <cstdint>
#include <cstring>
#include <levanter/compat/safetensors.hpp>
#include <vector>

namespace st = levanter::safetensors;

static void check(std::span<const unsigned char> bytes) {
  st::header_info h;
  try {
    h = st::parse(bytes, "fuzz input");
  } catch (const st::format_error&) {
    return;
  }
  if (h.data_start > bytes.size()) __builtin_trap();
  std::uint64_t covered = 0;
  for (const auto& t : h.tensors) {
    if (t.begin != covered || t.end < t.begin || t.end > bytes.size() - h.data_start) __builtin_trap();
    if (t.name.empty() || t.numel() < 0) __builtin_trap();
    if (static_cast<std::uint64_t>(t.numel()) * st::dtype_size(t.type) != t.end - t.begin) __builtin_trap();
    covered = t.end;
    auto data =
        bytes.subspan(static_cast<std::size_t>(h.data_start + t.begin), static_cast<std::size_t>(t.end - t.begin));
    if (t.type == st::dtype::F32 || t.type == st::dtype::F16 || t.type == st::dtype::BF16 || t.type == st::dtype::F64)
      if (st::detail::to_f32(t, data, "fuzz input").size() != static_cast<std::size_t>(t.numel())) __builtin_trap();
  }
  if (covered != bytes.size() - h.data_start) __builtin_trap();
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  check({data, size});
  if (size > 8) {
    const void* brace = nullptr;
    for (std::size_t i = size; i > 8 && !brace; --i)
      if (data[i - 1] == '}') brace = data + i - 1;
    if (brace) {
      std::vector<unsigned char> copy(data, data + size);
      std::uint64_t n = static_cast<std::uint64_t>(static_cast<const std::uint8_t*>(brace) - data) + 1 - 8;
      for (int i = 0; i < 8; ++i) copy[static_cast<std::size_t>(i)] = static_cast<unsigned char>(n >> (8 * i));
      check(copy);
    }
  }
  return 0;
}
