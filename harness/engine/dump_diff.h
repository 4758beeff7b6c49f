// The diff of two tensor dumps from any framework (`bitparity diff`, cli/diff.cpp):
// matched by name (with --map old=new renames), compared tensor by tensor.
#pragma once
#include <string>
#include <vector>

#include "harness/report/report.h"

namespace bp::harness {

// Builds the comparison of dumps `a` and `b` (one case, id "diff"); `map` holds
// "nameInA=nameInB" renames. Tensors in file order of A (by byte offset), then
// those only in B in B's file order. Throws bp::io::BadInput for an unreadable or
// malformed file, a bad --map, or a dtype other than BF16/F32 in a pair to
// compare; bp::io::IoError when a file cannot be opened.
Report build_diff(const std::string& a, const std::string& b, const std::vector<std::string>& map);

}  // namespace bp::harness
