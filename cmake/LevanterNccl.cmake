# The NCCL communicator (src/distributed/nccl.cpp, levanter/distributed/nccl.hpp): on with a CUDA Kokkos, else off
# unless -DLEVANTER_NCCL=ON.
#
# Included by the top-level CMakeLists.txt once levanter_core is defined. When ON it finds the CUDA toolkit
# (FindCUDAToolkit: CUDAToolkit_ROOT, or nvcc on PATH) and NCCL (nccl.h and libnccl under NCCL_ROOT, then the
# toolkit's directories, then the standard prefixes, e.g. Debian's libnccl-dev), defines LEVANTER_HAVE_NCCL=1 for
# levanter_core and its users, and links CUDA::cudart and libnccl into it. When OFF, nccl.cpp compiles to a stub
# whose make_nccl_communicator throws.
include_guard(GLOBAL)

# On by default with a CUDA Kokkos (the arrays are then in device memory, which NCCL reduces in place).
set(LEVANTER_NCCL_DEFAULT OFF)
if(Kokkos_ENABLE_CUDA OR "CUDA" IN_LIST Kokkos_DEVICES)
  set(LEVANTER_NCCL_DEFAULT ON)
endif()
option(LEVANTER_NCCL "Build the NCCL communicator (needs the CUDA toolkit and NCCL)" ${LEVANTER_NCCL_DEFAULT})
if(NOT LEVANTER_NCCL)
  return()
endif()

if(NOT TARGET levanter_core)
  message(FATAL_ERROR "levanter: include(LevanterNccl) after levanter_core is defined")
endif()

find_package(CUDAToolkit REQUIRED)

set(NCCL_ROOT "" CACHE PATH "Prefix of an NCCL install (holding include/nccl.h and lib/libnccl.so)")
# find_path/find_library honour <Package>_ROOT only inside a find module, so the prefix is passed as a hint (also
# read from the environment, as NCCL's own packaging suggests).
find_path(LEVANTER_NCCL_INCLUDE_DIR nccl.h
          HINTS ${NCCL_ROOT} $ENV{NCCL_ROOT} ${CUDAToolkit_INCLUDE_DIRS}
          PATH_SUFFIXES include
          DOC "Directory holding nccl.h")
# libnccl.so.2: the pip wheels (nvidia-nccl-cu*) ship no unversioned name. NAMES_PER_DIR: a library under
# NCCL_ROOT wins over another copy in a later directory, so header and library come from the same install.
find_library(LEVANTER_NCCL_LIBRARY NAMES nccl libnccl.so.2 NAMES_PER_DIR
             HINTS ${NCCL_ROOT} $ENV{NCCL_ROOT} ${CUDAToolkit_LIBRARY_DIR}
             PATH_SUFFIXES lib lib64
             DOC "The NCCL library (libnccl.so)")
if(NOT LEVANTER_NCCL_INCLUDE_DIR OR NOT LEVANTER_NCCL_LIBRARY)
  message(FATAL_ERROR "levanter: LEVANTER_NCCL is ON but NCCL was not found (nccl.h: ${LEVANTER_NCCL_INCLUDE_DIR}, "
                      "libnccl: ${LEVANTER_NCCL_LIBRARY}). Install it (Debian/Ubuntu with NVIDIA's repository: "
                      "libnccl-dev) and point -DNCCL_ROOT=<prefix> at the directory holding include/nccl.h and "
                      "lib/libnccl.so, or configure with -DLEVANTER_NCCL=OFF.")
endif()

# The version, for the configure log only.
file(STRINGS "${LEVANTER_NCCL_INCLUDE_DIR}/nccl.h" LEVANTER_NCCL_VERSION_LINES
     REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) +[0-9]+")
set(LEVANTER_NCCL_VERSION "")
foreach(part MAJOR MINOR PATCH)
  string(REGEX MATCH "NCCL_${part} +([0-9]+)" _ "${LEVANTER_NCCL_VERSION_LINES}")
  string(APPEND LEVANTER_NCCL_VERSION "${CMAKE_MATCH_1}.")
endforeach()
string(REGEX REPLACE "\\.$" "" LEVANTER_NCCL_VERSION "${LEVANTER_NCCL_VERSION}")

target_compile_definitions(levanter_core PUBLIC LEVANTER_HAVE_NCCL=1)
# nccl.h is needed by nccl.cpp only (levanter/distributed/nccl.hpp does not include it); the CUDA headers come with
# CUDA::cudart. levanter_core is static, so its users link NCCL and the CUDA runtime too.
target_include_directories(levanter_core SYSTEM PRIVATE "${LEVANTER_NCCL_INCLUDE_DIR}")
target_link_libraries(levanter_core PUBLIC CUDA::cudart "${LEVANTER_NCCL_LIBRARY}")
message(STATUS "levanter: NCCL ${LEVANTER_NCCL_VERSION} (${LEVANTER_NCCL_LIBRARY}), "
               "CUDA ${CUDAToolkit_VERSION} (${CUDAToolkit_BIN_DIR})")
