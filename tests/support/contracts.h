// The contracts an op suite runs under: the selectable ones and the drafts the
// reference implements ahead of the kernels (SPEC.md §1.3), by name.
#pragma once
#include <stdexcept>
#include <string>
#include <string_view>

#include "reference/contract/contract.h"

namespace bp::test {

inline const Contract& contract_or_draft(std::string_view name) {
  if (const Contract* c = find_contract_or_draft(name)) return *c;
  throw std::invalid_argument("no contract or draft named " + std::string(name));
}

// "bf16-sm90tc-v1" -> "sm90tc_v1": a gtest parameter name.
inline std::string contract_test_name(std::string_view name) {
  std::string s(name.substr(5));
  for (char& c : s)
    if (c == '-') c = '_';
  return s;
}

}  // namespace bp::test
