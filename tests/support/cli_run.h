// A fixture for end-to-end tests of the REAL bitparity binary (BP_BITPARITY_EXE,
// set by tests/CMakeLists.txt): a fresh temporary directory per test, and the
// binary run through the shell with its exit code, stdout and stderr captured.
#pragma once
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#ifndef BP_BITPARITY_EXE
#error "BP_BITPARITY_EXE must name the bitparity binary"
#endif

namespace bp::test {

class CliTest : public ::testing::Test {
 protected:
  // The directory is named by suite, process and test, so parallel CTest runs of
  // the suites never share one.
  void SetUp() override {
    const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = std::filesystem::temp_directory_path() /
           ("bp_" + std::string(info->test_suite_name()) + "_" + std::to_string(::getpid()) + "_" + info->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string path(const std::string& leaf) const { return (dir_ / leaf).string(); }

  // Writes `text` to `leaf` in the test's directory; returns its path.
  std::string write(const std::string& leaf, const std::string& text) const {
    std::ofstream(path(leaf), std::ios::binary) << text;
    return path(leaf);
  }

  // Runs `command` through the shell; exit code (-1 when killed by a signal), with
  // stdout and stderr in out_/err_.
  int shell(const std::string& command) {
    const std::string o = path("stdout.txt"), e = path("stderr.txt");
    const int st = std::system((command + " >'" + o + "' 2>'" + e + "'").c_str());
    out_ = read(o);
    err_ = read(e);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  }
  // Runs bitparity with `args` (shell words, quoted by the caller where needed).
  int run(const std::string& args) { return shell("'" + exe() + "' " + args); }
  // The binary: BP_BITPARITY_EXE from the environment where CTest sets it (a build
  // carried to another folder, whose CTest files are rewritten but whose compiled-in
  // paths are not), else the one this test was built beside.
  static std::string exe() {
    const char* e = std::getenv("BP_BITPARITY_EXE");
    return e && *e ? e : BP_BITPARITY_EXE;
  }

  // The whole file ("" when it cannot be read).
  static std::string read(const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

  std::filesystem::path dir_;
  std::string out_, err_;
};

}  // namespace bp::test
