// levanter/run_metadata.hpp: what a run records about itself (run_metadata.json and the tracker's hparams), so
// a result can be traced to the source, build, libraries and machine that produced it. Compiled in
// src/run_metadata.cpp.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace levanter {

/// What only the program's build knows (set by the program from its generated header; see
/// cmake/levanter_git_info.cmake). Library code cannot know which source tree built the program.
struct build_info {
  std::string git_sha = "unknown";  ///< revision of the source tree the program was built from
  bool git_dirty = false;           ///< the tree had uncommitted changes to tracked files
  std::string build_type = "unknown";
  std::string program;
};

inline build_info& program_build_info() {
  static build_info b;
  return b;
}

/// The compiler that built the library ("gcc 12.2.0").
std::string compiler_string();

/// What `run_metadata.json` holds: the program's source revision and build, the compiler, library versions,
/// the BLAS kernels and thread counts in use, ranks, host, pid and start time.
nlohmann::ordered_json run_metadata(int ranks = 1);

}  // namespace levanter
