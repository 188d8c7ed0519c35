// levanter/version.hpp: the one place the version is written; CMakeLists.txt reads it for project(VERSION).
#pragma once

#define LEVANTER_VERSION_STRING "0.1.0"

namespace levanter {

/// Version of the levanter library (also the CMake package version).
inline constexpr const char* version = LEVANTER_VERSION_STRING;

}  // namespace levanter
