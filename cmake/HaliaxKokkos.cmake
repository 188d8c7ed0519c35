# Finds Kokkos and Kokkos Kernels and provides the targets Kokkos::kokkos and Kokkos::kokkoskernels, and sets
# HALIAX_HOST_BLAS (ON when Kokkos Kernels and its host BLAS are there; OFF only for a CUDA Kokkos without them).
#
# Two cases:
#  * a working Kokkos CMake package (e.g. a CUDA-enabled Kokkos built by hand): set HALIAX_KOKKOS_ROOT (or
#    Kokkos_ROOT) and its exported targets are used as they are;
#  * Debian's Trilinos packaging (libtrilinos-kokkos-dev), whose exported Kokkos::kokkos points at
#    /usr/lib/include: we ignore that target and define our own over the headers in /usr/include/trilinos
#    (included as SYSTEM so Kokkos's warnings do not drown ours) and the trilinos_kokkos* libraries.
include_guard(GLOBAL)

set(HALIAX_KOKKOS_ROOT "" CACHE PATH "Prefix of a Kokkos + Kokkos Kernels install with working CMake packages")

if(NOT HALIAX_KOKKOS_ROOT AND Kokkos_ROOT)
  set(HALIAX_KOKKOS_ROOT "${Kokkos_ROOT}")
endif()

if(HALIAX_KOKKOS_ROOT)
  find_package(Kokkos REQUIRED PATHS "${HALIAX_KOKKOS_ROOT}" NO_DEFAULT_PATH)
  find_package(KokkosKernels QUIET PATHS "${HALIAX_KOKKOS_ROOT}" NO_DEFAULT_PATH)
  if(TARGET Kokkos::kokkoskernels)
    set(HALIAX_HOST_BLAS ON)
  elseif(Kokkos_ENABLE_CUDA OR "CUDA" IN_LIST Kokkos_DEVICES)
    # A CUDA Kokkos alone (the device kit's prefix, docs/portability.md): cuBLAS does every array product, and
    # the host BLAS paths (OpenBLAS tiles, the host flash-attention kernels) are compiled out.
    set(HALIAX_HOST_BLAS OFF)
    message(STATUS "haliax: ${HALIAX_KOKKOS_ROOT} has no Kokkos Kernels: a device-only build (GEMMs through "
                   "cuBLAS, no host BLAS)")
  else()
    message(FATAL_ERROR "haliax: ${HALIAX_KOKKOS_ROOT} has Kokkos but no Kokkos Kernels (Kokkos::kokkoskernels); "
                        "a build whose arrays live in host memory needs it, with its BLAS TPL "
                        "(docs/portability.md has the commands)")
  endif()
  # Where Kokkos_Core.hpp is, for the tests that run the compiler by hand (tests/compile_fail).
  find_path(HALIAX_KOKKOS_INCLUDE_DIR Kokkos_Core.hpp PATHS "${HALIAX_KOKKOS_ROOT}/include" NO_DEFAULT_PATH)
  # ... and the flag its headers need there (an OpenMP Kokkos refuses to be included without it).
  set(HALIAX_KOKKOS_SYNTAX_FLAGS "")
  if("OPENMP" IN_LIST Kokkos_DEVICES)
    find_package(OpenMP REQUIRED COMPONENTS CXX)
    set(HALIAX_KOKKOS_SYNTAX_FLAGS "${OpenMP_CXX_FLAGS}")
  endif()
  message(STATUS "haliax: using Kokkos ${Kokkos_VERSION} from ${HALIAX_KOKKOS_ROOT} "
                 "(devices: ${Kokkos_DEVICES})")
  return()
endif()

set(HALIAX_HOST_BLAS ON)
if(TARGET Kokkos::kokkos AND TARGET Kokkos::kokkoskernels)
  return()
endif()

find_path(HALIAX_KOKKOS_INCLUDE_DIR Kokkos_Core.hpp PATH_SUFFIXES trilinos
          DOC "Directory holding Kokkos_Core.hpp (Debian: /usr/include/trilinos)")
find_library(HALIAX_KOKKOSCORE_LIBRARY NAMES kokkoscore trilinos_kokkoscore)
find_library(HALIAX_KOKKOSKERNELS_LIBRARY NAMES kokkoskernels trilinos_kokkoskernels)
find_library(HALIAX_KOKKOSCONTAINERS_LIBRARY NAMES kokkoscontainers trilinos_kokkoscontainers)
find_library(HALIAX_OPENBLAS_LIBRARY NAMES openblas)

foreach(var HALIAX_KOKKOS_INCLUDE_DIR HALIAX_KOKKOSCORE_LIBRARY HALIAX_KOKKOSKERNELS_LIBRARY
            HALIAX_KOKKOSCONTAINERS_LIBRARY HALIAX_OPENBLAS_LIBRARY)
  if(NOT ${var})
    message(FATAL_ERROR "haliax: ${var} not found. On Debian run scripts/setup-debian.sh "
                        "(packages libtrilinos-kokkos-dev libtrilinos-kokkos-kernels-dev libopenblas-dev), "
                        "or point HALIAX_KOKKOS_ROOT at a Kokkos install.")
  endif()
endforeach()

find_package(Threads REQUIRED)

add_library(Kokkos::kokkos INTERFACE IMPORTED)
set_target_properties(Kokkos::kokkos PROPERTIES
  INTERFACE_INCLUDE_DIRECTORIES "${HALIAX_KOKKOS_INCLUDE_DIR}"
  INTERFACE_SYSTEM_INCLUDE_DIRECTORIES "${HALIAX_KOKKOS_INCLUDE_DIR}"
  INTERFACE_LINK_LIBRARIES "${HALIAX_KOKKOSCONTAINERS_LIBRARY};${HALIAX_KOKKOSCORE_LIBRARY};Threads::Threads;${CMAKE_DL_LIBS}")

add_library(Kokkos::kokkoskernels INTERFACE IMPORTED)
set_target_properties(Kokkos::kokkoskernels PROPERTIES
  INTERFACE_LINK_LIBRARIES "${HALIAX_OPENBLAS_LIBRARY};${HALIAX_KOKKOSKERNELS_LIBRARY};Kokkos::kokkos")

message(STATUS "haliax: Kokkos headers ${HALIAX_KOKKOS_INCLUDE_DIR} (Debian Trilinos packaging, repaired targets)")
