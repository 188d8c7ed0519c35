# Compiles SOURCE (syntax only) and succeeds only if compilation fails with every `// expect: TEXT` line of
# the source present in the compiler output.
#
# A source may also mark one line with `// expect-first-error-at-line`: then the compiler's first `error:`
# line must point at that line of SOURCE itself (the user's line), not into a library header. That is what a
# constrained entry point buys: the mistake is reported where it was made.
file(STRINGS ${SOURCE} expect_lines REGEX "// expect: ")
set(args -std=c++20 -fsyntax-only ${FLAGS})
foreach(inc ${INCLUDES})
  list(APPEND args -isystem ${inc})
endforeach()
execute_process(COMMAND ${CXX} ${args} ${SOURCE} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0)
  message(FATAL_ERROR "${SOURCE} compiled, but it must not")
endif()
set(all "${out}${err}")
if(NVCC_DIAGNOSTICS)
  set(expect_lines "")  # the texts quote GCC; EDG words its messages differently (see CMakeLists.txt)
  # but an error must still be reported in the user's file, not only inside a header
  string(REGEX MATCH "[^\n]*\\([0-9]+\\): error: " edg_error "${all}")
  string(FIND "${all}" "${SOURCE}(" in_source)
  if(edg_error STREQUAL "" OR in_source EQUAL -1)
    message(FATAL_ERROR "${SOURCE}: no error reported in this file. Output was:\n${all}")
  endif()
endif()
foreach(line ${expect_lines})
  string(REGEX REPLACE ".*// expect: " "" text "${line}")
  string(FIND "${all}" "${text}" pos)
  if(pos EQUAL -1)
    message(FATAL_ERROR "${SOURCE}: compiler output lacks '${text}'. Output was:\n${all}")
  endif()
endforeach()

# ---- first error at the marked line ----
file(READ ${SOURCE} source_text)
set(marker "// expect-first-error-at-line")
string(FIND "${source_text}" "${marker}" marker_pos)
if(NOT marker_pos EQUAL -1)
  string(FIND "${source_text}" "${marker}" marker_last REVERSE)
  if(NOT marker_last EQUAL marker_pos)
    message(FATAL_ERROR "${SOURCE}: more than one '${marker}' line")
  endif()
  # Line number of the marker: newlines before it, plus one (file(STRINGS) would skip empty lines).
  string(SUBSTRING "${source_text}" 0 ${marker_pos} before_marker)
  string(REGEX MATCHALL "\n" newlines "${before_marker}")
  list(LENGTH newlines marker_line)
  math(EXPR marker_line "${marker_line} + 1")
  # The first diagnostic line that is an error (GCC and clang: `file:line:col: error: ...`; nvcc's EDG front
  # end: `file(line): error: ...`).
  string(REGEX MATCH "[^\n]*: (fatal )?error: [^\n]*" first_error "${all}")
  if(first_error STREQUAL "")
    message(FATAL_ERROR "${SOURCE}: no `error:` line in the compiler output. Output was:\n${all}")
  endif()
  # `file:line:column:` (GCC and clang by default), else `file:line:`. (Separate tests: if() evaluates every
  # MATCHES of an OR, and the last one sets CMAKE_MATCH_n.)
  if(first_error MATCHES "^(.*):([0-9]+):[0-9]+: (fatal )?error: ")
    set(error_file "${CMAKE_MATCH_1}")
    set(error_line "${CMAKE_MATCH_2}")
  elseif(first_error MATCHES "^(.*):([0-9]+): (fatal )?error: ")
    set(error_file "${CMAKE_MATCH_1}")
    set(error_line "${CMAKE_MATCH_2}")
  elseif(first_error MATCHES "^(.*)\\(([0-9]+)\\): (fatal )?error: ")
    set(error_file "${CMAKE_MATCH_1}")
    set(error_line "${CMAKE_MATCH_2}")
  else()
    message(FATAL_ERROR "${SOURCE}: cannot read file:line from the first error '${first_error}'")
  endif()
  if(NOT error_file STREQUAL SOURCE OR NOT error_line EQUAL marker_line)
    message(FATAL_ERROR "${SOURCE}: the first error must be at ${SOURCE}:${marker_line} (the line marked "
                        "'${marker}'), but it is at ${error_file}:${error_line}:\n${first_error}\n"
                        "Output was:\n${all}")
  endif()
endif()
message(STATUS "${SOURCE}: fails to compile as expected")
