// libFuzzer target for the checkpoint metadata.json reader (levanter::checkpoint::read_metadata, through discover,
// and verify_files; src/checkpoint/checkpointer.cpp). Built and run by scripts/fuzz.sh checkpoint_metadata SECONDS.
// fuzz-sources: src/checkpoint/checkpointer.cpp src/checkpoint/h5.cpp src/io/atomic_file.cpp src/io/dir_lock.cpp src/io/json_limits.cpp
// fuzz-libs: -L/usr/lib/x86_64-linux-gnu/hdf5/serial -lhdf5 -lz
// fuzz-flags: -max_len=4096 -dict=tests/fuzz/checkpoint_metadata.dict
//
// The input is up to two metadata.json files separated by a NUL byte (which JSON text cannot hold): they become
// <base>/step-1/metadata.json and <base>/step-2/metadata.json, each directory also holding model.h5 and
// config.yaml (10 and 4 bytes). discover(<base>) reads them; verify_files checks each checkpoint found, with and
// without contents. The contract checked: read_metadata and verify_files throw checkpoint::error or nothing (callers
// such as resume_newest catch only that), a checkpoint found has a non-negative step, and one verify_files accepts
// lists only files that exist with the sizes (and CRC-32s) it records, and lists every file of the format the
// directory holds (model.h5 and config.yaml here). With FUZZ_MEMORY_ONLY=1 in the environment
// only sanitizer reports, crashes and hangs are findings.
// The seeds in checkpoint_metadata-seeds/ are metadata.json files written by train_lm and by write_checkpoint.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <levanter/checkpoint/checkpointer.hpp>
#include <string>
#include <string_view>

namespace fs = std::filesystem;
namespace ck = levanter::checkpoint;

namespace {

const fs::path& root() {
  static const fs::path r = [] {
    std::string t = (fs::temp_directory_path() / "fuzz-checkpoint-metadata-XXXXXX").string();
    if (!::mkdtemp(t.data())) std::abort();
    std::atexit([] { fs::remove_all(root()); });
    return fs::path(t);
  }();
  return r;
}

void write(const fs::path& p, std::string_view bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) std::abort();
}

void check_verified(const ck::checkpoint_info& c) {
  if (!c.metadata.is_object() || !c.metadata.contains("files")) return;
  // The manifest vouches for every file of the format the directory holds (model.h5 always).
  if (!c.metadata["files"].contains("model.h5")) __builtin_trap();
  for (const char* f : ck::format_files())
    if (fs::exists(c.path / f) && !c.metadata["files"].contains(f)) __builtin_trap();
  for (const auto& [name, size] : c.metadata["files"].items()) {
    std::error_code ec;
    const auto actual = fs::file_size(c.path / name, ec);
    if (ec || !size.is_number()) __builtin_trap();
    if (size.is_number_unsigned() ? actual != size.get<std::uint64_t>() : double(actual) != size.get<double>())
      __builtin_trap();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const auto nul = in.find('\0');
  const fs::path base = root() / "ckpt";
  fs::remove_all(base);
  for (int i = 1; i <= (nul == std::string_view::npos ? 1 : 2); ++i) {
    const fs::path dir = base / ("step-" + std::to_string(i));
    fs::create_directories(dir);
    write(dir / "model.h5", "0123456789");
    write(dir / "config.yaml", "a: 1");
    write(dir / "metadata.json", i == 1 ? in.substr(0, nul) : in.substr(nul + 1));
  }
  static const bool memory_only = std::getenv("FUZZ_MEMORY_ONLY") && *std::getenv("FUZZ_MEMORY_ONLY") == '1';
  try {
    const auto found = ck::discover(base);
    for (const auto& c : found.checkpoints) {
      if (c.step < 0 && !memory_only) __builtin_trap();
      for (bool contents : {false, true}) {
        try {
          ck::verify_files(c, contents);
        } catch (const ck::error&) {
          continue;
        }
        if (!memory_only) check_verified(c);
      }
    }
  } catch (const ck::error&) {
  } catch (const std::exception&) {
    if (!memory_only) throw;
  }
  return 0;
}
