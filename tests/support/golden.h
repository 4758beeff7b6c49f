// Golden digests: SHA-256 of output bits for fixed seeded inputs, one file per
// suite under fixtures/golden/. Any change of bits fails; BP_UPDATE_GOLDEN=1
// rewrites the entries on purpose (and the diff shows in review).
#pragma once
#include <string>
#include <vector>

#include "reference/numerics/bf16.h"

namespace bp::test {

std::string digest(const std::vector<bf16>& v);   // NaN canonicalised first
std::string digest(const std::vector<float>& v);  // NaN canonicalised first

// EXPECTs that entry `name` of fixtures/golden/<file> equals `digest`.
void expect_golden(const std::string& file, const std::string& name, const std::string& digest);

// Path under the source tree (BP_SOURCE_DIR, set by CTest).
std::string source_path(const std::string& relative);

}  // namespace bp::test
