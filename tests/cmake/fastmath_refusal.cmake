# Fast-math refusal test (SPEC.md §3), run by CTest as `cmake -P`:
#   cmake -DSOURCE_DIR=... -DWORK_DIR=... -DCXX_COMPILER=... -DGENERATOR=...
#         -DFLAG=<one -D cache setting> [-DEXPECT_FLAG=<forbidden flag> -DEXPECT_VAR=<variable>]
#         -P fastmath_refusal.cmake
# Configures the project in a fresh temporary build directory with FLAG (CUDA and
# the test suites off, to keep it fast). With EXPECT_FLAG the configure must fail
# with cmake/StrictFP.cmake's message naming the variable, the flag and the reason;
# without it (the negative control) it must succeed. The directory is removed.
cmake_minimum_required(VERSION 3.25...4.4)

include(${CMAKE_CURRENT_LIST_DIR}/script_common.cmake)
bp_require(fastmath_refusal SOURCE_DIR WORK_DIR FLAG)
bp_scratch_dir(dir "${WORK_DIR}" fastmath-refusal)

set(args -S "${SOURCE_DIR}" -B "${dir}" -DBITPARITY_CUDA=OFF -DBITPARITY_TESTS=OFF "${FLAG}")
if(DEFINED GENERATOR AND NOT GENERATOR STREQUAL "")
  list(APPEND args -G "${GENERATOR}")
endif()
if(DEFINED CXX_COMPILER AND NOT CXX_COMPILER STREQUAL "")
  list(APPEND args "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}")
endif()
execute_process(COMMAND "${CMAKE_COMMAND}" ${args}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
file(REMOVE_RECURSE "${dir}")
set(log "${out}\n${err}")

if(NOT DEFINED EXPECT_FLAG)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "FAIL: the normal configure (${FLAG}) failed with ${rc}; output:\n${log}")
  endif()
  message(STATUS "PASS: configure with ${FLAG} succeeds")
  return()
endif()

if(rc EQUAL 0)
  message(FATAL_ERROR "FAIL: configure with ${FLAG} SUCCEEDED; cmake/StrictFP.cmake must refuse '${EXPECT_FLAG}'. Output:\n${log}")
endif()
# The message names the variable and the flag, and says why (the whole message is
# checked piecewise, since cmake wraps FATAL_ERROR text).
string(REGEX REPLACE "[ \t\r\n]+" " " flat "${err}")
set(expected
  "bitparity: ${EXPECT_VAR} contains '${EXPECT_FLAG}'"
  "bitparity defines the bits of every op"
  "${EXPECT_FLAG} lets the compiler contract, reassociate or flush values"
  "results would no longer follow reference/SPEC.md"
  "Remove it")
foreach(piece IN LISTS expected)
  string(FIND "${flat}" "${piece}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "FAIL: configure with ${FLAG} failed, but its message lacks \"${piece}\". Output:\n${log}")
  endif()
endforeach()
message(STATUS "PASS: configure with ${FLAG} is refused: ${EXPECT_VAR} contains '${EXPECT_FLAG}'")
