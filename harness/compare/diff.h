// `bitparity diff A.safetensors B.safetensors`: two tensor dumps from any framework,
// matched by name (with --map old=new renames), compared tensor by tensor.
#pragma once
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "harness/report/report.h"

namespace bp::harness {

struct DiffOptions {
  std::string a, b;
  std::vector<std::string> map;  // "nameInA=nameInB"
  std::string json, csv, junit;  // report paths ("" = none)
  bool quiet = false;
};

// Builds the comparison (one case, id "diff"). Tensors in file order of A (by byte
// offset), then those only in B in B's file order. Throws bp::io::BadInput for an
// unreadable or malformed file, a bad --map, or a dtype other than BF16/F32 in a
// pair to compare; bp::io::IoError when a file cannot be opened.
Report build_diff(const DiffOptions& o);

// The whole subcommand: prints the table (unless quiet) to `out`, messages to
// `err`, writes the requested reports atomically. Returns the exit code: 0 all
// identical, 1 a mismatch or a tensor present on one side only, 2 bad input or an
// unwritable report path (earlier reports are left untouched).
int run_diff(const DiffOptions& o, std::FILE* out, std::FILE* err);

}  // namespace bp::harness
