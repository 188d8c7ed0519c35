# Fails if a doctest TEST_CASE name contains a character that breaks ctest discovery: ';' splits one case into
# several bogus ctest entries whose filters match nothing (so they pass without running), and '[' / ']' are
# glob characters in doctest's --test-case filter. Usage: cmake -DTEST_DIR=<tests> -P check_test_names.cmake
file(GLOB sources "${TEST_DIR}/test_*.cpp")
set(bad "")
foreach(src ${sources})
  file(STRINGS "${src}" lines REGEX "TEST_CASE\\(\"")
  foreach(line ${lines})
    string(REGEX MATCH "TEST_CASE\\(\"[^\"]*\"" name "${line}")
    if(name MATCHES "[][]" OR name MATCHES ";")
      get_filename_component(f "${src}" NAME)
      string(APPEND bad "\n  ${f}: ${name}")
    endif()
  endforeach()
endforeach()
if(bad)
  message(FATAL_ERROR "test names with ';', '[' or ']' (ctest would not run them; rephrase):${bad}")
endif()
message(STATUS "all doctest names are ctest-safe")
