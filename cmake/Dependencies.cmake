# Dependencies come from the system (Debian packages: scripts/setup installs them).
find_package(OpenMP REQUIRED COMPONENTS CXX)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(CLI11 REQUIRED)
find_package(Eigen3 3.3 REQUIRED NO_MODULE)

if(BITPARITY_TESTS)
  # fast-cpp-csv-parser (header only) reads the captured hardware vectors, and is the
  # third-party reader the report tests check bitparity's CSVs against.
  find_path(BP_FCCP_INCLUDE libfccp/csv.h)
  if(NOT BP_FCCP_INCLUDE)
    message(FATAL_ERROR "fast-cpp-csv-parser not found: install libfccp-dev (scripts/setup) "
                        "or set BP_FCCP_INCLUDE to the folder holding libfccp/csv.h")
  endif()
  find_package(GTest QUIET)
  if(NOT GTest_FOUND)
    # Some images ship GoogleTest as sources only (/usr/src/googletest).
    find_path(BP_GTEST_SOURCE_DIR CMakeLists.txt PATHS /usr/src/googletest NO_DEFAULT_PATH)
    if(NOT BP_GTEST_SOURCE_DIR)
      message(FATAL_ERROR "GoogleTest not found: install libgtest-dev (scripts/setup) or set BP_GTEST_SOURCE_DIR")
    endif()
    set(INSTALL_GTEST OFF CACHE BOOL "" FORCE)
    add_subdirectory(${BP_GTEST_SOURCE_DIR} ${CMAKE_BINARY_DIR}/_googletest EXCLUDE_FROM_ALL)
    add_library(GTest::gtest ALIAS gtest)
    add_library(GTest::gtest_main ALIAS gtest_main)
  endif()
endif()
