// What the tests that run train_lm (and programs on its checkpoints) share: a fresh temporary directory, a small
// structured corpus as JSON lines, the train/loss log of a run, and a file's bytes.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

namespace train_helpers {

namespace fs = std::filesystem;

/// An empty directory `<tmp>/<prefix>_<name>_<pid>`.
inline fs::path temp_dir(const std::string& prefix, const std::string& name) {
  auto d = fs::temp_directory_path() / (prefix + "_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

/// `docs` documents of 30 words from a fixed vocabulary (repeated sentences), different for each `seed`.
inline void write_corpus(const fs::path& path, int docs, int seed, unsigned base = 12345u) {
  std::ofstream out(path);
  const char* words[] = {"alpha", "beta", "gamma", "delta", "the", "cat", "sat", "on", "mat", "and", "ran"};
  unsigned s = base + static_cast<unsigned>(seed);
  for (int d = 0; d < docs; ++d) {
    std::string text;
    for (int w = 0; w < 30; ++w) {
      s = s * 1103515245u + 12345u;
      text += words[(s >> 16) % 11];
      text += w % 7 == 6 ? ". " : " ";
    }
    out << "{\"text\": \"" << text << "\"}\n";
  }
}

/// The last logged train/loss of every step, as the exact text json_logger wrote (a resumed run logs the steps
/// after its checkpoint again; the later record wins).
inline std::map<std::int64_t, std::string> loss_log(const fs::path& metrics) {
  std::map<std::int64_t, std::string> out;
  std::ifstream in(metrics);
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    if (j["event"] == "log" && j["metrics"].contains("train/loss"))
      out[j["step"].get<std::int64_t>()] = j["metrics"]["train/loss"].dump();
  }
  return out;
}

inline std::string file_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace train_helpers
