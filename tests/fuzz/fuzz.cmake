# libFuzzer harnesses as tests: each tests/fuzz/fuzz_NAME.cpp is built by scripts/fuzz.sh (clang++, libFuzzer,
# AddressSanitizer, UndefinedBehaviorSanitizer) as part of the build, and the test "fuzz: NAME" fuzzes it for
# HALIAX_FUZZ_SECONDS from its seeds (tests/fuzz/NAME-seeds/). Any finding (crash, sanitizer report, leak, hang,
# out-of-memory) fails the test; the input is kept in build/tests/fuzz/NAME/findings/ (docs/architecture.md,
# "Fuzzing and sanitizers"). Skipped, with a message, when no clang++ with a working libFuzzer is found.
#
# Included from the top-level CMakeLists.txt, not added as a subdirectory: Ninja 1.11 starts ready jobs in the order
# build.ninja lists them, and CMake lists a subdirectory's after all of its parent's. The harnesses are one chain of
# compiles (about 5 minutes on 2 cores); listed last, the chain ran alone on one core for the last 4 minutes of a
# clean build. Listed with the top directory's targets, it runs beside the rest.
function(haliax_add_fuzz_tests)
  set(fuzz_src ${PROJECT_SOURCE_DIR}/tests/fuzz)
  set(fuzz_bin ${PROJECT_BINARY_DIR}/tests/fuzz)
  option(HALIAX_FUZZ "Build the libFuzzer harnesses and fuzz each for HALIAX_FUZZ_SECONDS as a test (needs clang++ with libFuzzer)" ON)
  # 6 s each: the seven run beside the rest of the suite, and the CI run must stay within its 25 minutes on 2 cores;
  # longer runs are scripts/fuzz.sh NAME 600 or -DHALIAX_FUZZ_SECONDS=600.
  set(HALIAX_FUZZ_SECONDS 6 CACHE STRING "Seconds each fuzz test runs its harness")
  # -O0: the seven harnesses' sources compile about 2.5x faster than at scripts/fuzz.sh's -O1 (some 250 CPU-seconds of
  # the CI run), and a fuzz test of seconds needs coverage of the seeds more than speed.
  set(HALIAX_FUZZ_OPT "-O0" CACHE STRING "Optimisation level of the fuzz harnesses the build makes (scripts/fuzz.sh FUZZ_OPT)")
  if(NOT HALIAX_FUZZ)
    return()
  endif()

  find_program(HALIAX_FUZZ_CXX NAMES clang++ clang++-16 clang++-15 clang++-14 DOC "clang++ with libFuzzer, for the fuzz tests")
  if(NOT HALIAX_FUZZ_CXX)
    message(STATUS "haliax: no clang++ found; the fuzz tests are skipped (install clang and libclang-rt-14-dev)")
    return()
  endif()
  # Does it link and run a fuzzer with the sanitizers? (Debian's clang needs libclang-rt-NN-dev for libFuzzer.) Probed
  # once per compiler path.
  string(MAKE_C_IDENTIFIER "HALIAX_FUZZ_WORKS_${HALIAX_FUZZ_CXX}" works_var)
  if(NOT DEFINED ${works_var})
    set(probe_dir ${fuzz_bin}/probe)
    file(MAKE_DIRECTORY ${probe_dir})
    file(WRITE ${probe_dir}/probe.cpp
         "#include <cstddef>\n#include <cstdint>\nextern \"C\" int LLVMFuzzerTestOneInput(const std::uint8_t*, std::size_t) { return 0; }\n")
    execute_process(COMMAND ${HALIAX_FUZZ_CXX} -std=c++20 -fsanitize=fuzzer,address,undefined ${probe_dir}/probe.cpp
                            -o ${probe_dir}/probe
                    RESULT_VARIABLE build_rc OUTPUT_QUIET ERROR_QUIET)
    set(works OFF)
    if(build_rc EQUAL 0)
      execute_process(COMMAND ${probe_dir}/probe -runs=1 RESULT_VARIABLE run_rc OUTPUT_QUIET ERROR_QUIET)
      if(run_rc EQUAL 0)
        set(works ON)
      endif()
    endif()
    set(${works_var} ${works} CACHE INTERNAL "whether ${HALIAX_FUZZ_CXX} builds working fuzzers")
  endif()
  if(NOT ${works_var})
    message(STATUS "haliax: ${HALIAX_FUZZ_CXX} cannot build a libFuzzer program; the fuzz tests are skipped "
                   "(install libclang-rt-14-dev)")
    return()
  endif()

  file(GLOB HALIAX_FUZZ_HARNESSES CONFIGURE_DEPENDS ${fuzz_src}/fuzz_*.cpp)
  set(names "")
  # The project sources' instrumented objects are shared by the targets (FUZZ_OBJ_DIR), and the targets are built one
  # after another, so that a source several harnesses name (the YAML reader, the model configs) is compiled once.
  set(shared_obj ${fuzz_bin}/shared-obj)
  set(previous "")
  foreach(harness ${HALIAX_FUZZ_HARNESSES})
    get_filename_component(name ${harness} NAME_WE)
    string(REGEX REPLACE "^fuzz_" "" name ${name})
    list(APPEND names ${name})
    set(work ${fuzz_bin}/${name})
    # Always run: scripts/fuzz.sh rebuilds only what changed (its own Makefile tracks the sources and headers). One
    # compile at a time, as Ninja counts the target as one job.
    add_custom_target(haliax_fuzz_${name} ALL
      COMMAND ${CMAKE_COMMAND} -E env CXX=${HALIAX_FUZZ_CXX} FUZZ_OPT=${HALIAX_FUZZ_OPT} FUZZ_JOBS=1 FUZZ_OBJ_DIR=${shared_obj}
              bash ${PROJECT_SOURCE_DIR}/scripts/fuzz.sh ${name} 0 ${work}/findings ${work}
      COMMENT "Building the ${name} fuzzer (clang++, libFuzzer, ASan, UBSan)"
      VERBATIM)
    if(previous)
      add_dependencies(haliax_fuzz_${name} ${previous})
    endif()
    set(previous haliax_fuzz_${name})
    add_test(NAME "fuzz: ${name} for ${HALIAX_FUZZ_SECONDS} s from its seeds, no finding"
             COMMAND ${CMAKE_COMMAND} -E env CXX=${HALIAX_FUZZ_CXX} FUZZ_OPT=${HALIAX_FUZZ_OPT} FUZZ_OBJ_DIR=${shared_obj}
                     bash ${PROJECT_SOURCE_DIR}/scripts/fuzz.sh ${name} ${HALIAX_FUZZ_SECONDS} ${work}/findings ${work})
    math(EXPR timeout "${HALIAX_FUZZ_SECONDS} + 300")
    set_tests_properties("fuzz: ${name} for ${HALIAX_FUZZ_SECONDS} s from its seeds, no finding"
                         PROPERTIES TIMEOUT ${timeout} LABELS fuzz)
  endforeach()
  message(STATUS "haliax: fuzz tests (${HALIAX_FUZZ_CXX}, ${HALIAX_FUZZ_SECONDS} s each): ${names}")
endfunction()
haliax_add_fuzz_tests()
