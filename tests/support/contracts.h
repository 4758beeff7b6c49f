// The contracts an op suite runs under, by name (SPEC.md §1.2-§1.4).
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "reference/contract/contract.h"

namespace bp::test {

// Every contract's name, v1, v2 then v3: the suites of the ops whose bits a later
// version changes (attention, logprob, the weight gradients) and of the whole model.
inline std::vector<const char*> all_contract_names() {
  std::vector<const char*> names;
  for (const Contract& c : contracts()) names.push_back(c.name.c_str());
  return names;
}

// "bf16-sm90tc-v1" -> "sm90tc_v1": a gtest parameter name.
inline std::string contract_test_name(std::string_view name) {
  std::string s(name.substr(5));
  for (char& c : s)
    if (c == '-') c = '_';
  return s;
}

}  // namespace bp::test
