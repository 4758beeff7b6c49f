#include "support/json_schema.h"

#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <stdexcept>

#include "support/golden.h"

namespace bp::test {

namespace {

using nlohmann::json;

bool has_type(const json& v, const std::string& t) {
  if (t == "null") return v.is_null();
  if (t == "boolean") return v.is_boolean();
  if (t == "object") return v.is_object();
  if (t == "array") return v.is_array();
  if (t == "string") return v.is_string();
  if (t == "number") return v.is_number();
  if (t == "integer") {
    if (v.is_number_integer()) return true;
    if (v.is_number_float()) {
      const double d = v.get<double>();
      return d == static_cast<double>(static_cast<long long>(d));
    }
    return false;
  }
  return false;
}

// JSON equality for enum: numbers compare by value across integer/float kinds.
bool json_equal(const json& a, const json& b) {
  if (a.is_number() && b.is_number()) return a.get<double>() == b.get<double>();
  return a == b;
}

struct Validator {
  const json& root;
  std::vector<std::string>& errors;

  void fail(const std::string& at, const std::string& why) { errors.push_back((at.empty() ? "/" : at) + ": " + why); }

  void check(const json& s, const json& v, const std::string& at, int depth) {
    if (depth > 64) return fail(at, "schema recursion too deep");
    if (s.is_boolean()) {
      if (!s.get<bool>()) fail(at, "schema false");
      return;
    }
    if (!s.is_object()) return fail(at, "schema is not an object");
    static const std::set<std::string> known = {
        "$schema", "$id", "title", "description", "$defs", "type", "required", "properties",
        "additionalProperties", "enum", "items", "minItems", "maxItems", "minimum", "anyOf", "$ref"};
    for (const auto& [k, _] : s.items())
      if (!known.count(k)) fail(at, "schema uses unsupported keyword '" + k + "'");

    if (auto r = s.find("$ref"); r != s.end()) {
      const std::string ref = r->get<std::string>();
      const std::string prefix = "#/$defs/";
      if (ref.rfind(prefix, 0) != 0 || !root.contains("$defs") || !root["$defs"].contains(ref.substr(prefix.size())))
        fail(at, "unresolvable $ref '" + ref + "'");
      else
        check(root["$defs"][ref.substr(prefix.size())], v, at, depth + 1);
    }
    if (auto t = s.find("type"); t != s.end()) {
      bool ok = false;
      if (t->is_string()) ok = has_type(v, t->get<std::string>());
      else
        for (const json& one : *t) ok |= has_type(v, one.get<std::string>());
      if (!ok) fail(at, "type is not " + t->dump());
    }
    if (auto e = s.find("enum"); e != s.end()) {
      bool ok = false;
      for (const json& one : *e) ok |= json_equal(one, v);
      if (!ok) fail(at, "value " + v.dump() + " is not one of " + e->dump());
    }
    if (auto m = s.find("minimum"); m != s.end() && v.is_number())
      if (v.get<double>() < m->get<double>()) fail(at, "value " + v.dump() + " is below the minimum " + m->dump());
    if (auto a = s.find("anyOf"); a != s.end()) {
      bool ok = false;
      for (const json& one : *a) {
        std::vector<std::string> sub;
        Validator{root, sub}.check(one, v, at, depth + 1);
        ok |= sub.empty();
      }
      if (!ok) fail(at, "matches none of anyOf");
    }
    if (v.is_object()) {
      if (auto req = s.find("required"); req != s.end())
        for (const json& k : *req)
          if (!v.contains(k.get<std::string>())) fail(at, "required property '" + k.get<std::string>() + "' is missing");
      const json* props = s.contains("properties") ? &s["properties"] : nullptr;
      for (const auto& [k, val] : v.items()) {
        const std::string sub_at = at + "/" + k;
        if (props && props->contains(k)) {
          check((*props)[k], val, sub_at, depth + 1);
        } else if (auto ap = s.find("additionalProperties"); ap != s.end()) {
          if (ap->is_boolean() && !ap->get<bool>()) fail(sub_at, "additional property is not allowed");
          else check(*ap, val, sub_at, depth + 1);
        }
      }
    }
    if (v.is_array()) {
      if (auto mi = s.find("minItems"); mi != s.end() && v.size() < mi->get<size_t>())
        fail(at, "fewer than " + mi->dump() + " items");
      if (auto ma = s.find("maxItems"); ma != s.end() && v.size() > ma->get<size_t>())
        fail(at, "more than " + ma->dump() + " items");
      if (auto it = s.find("items"); it != s.end())
        for (size_t i = 0; i < v.size(); ++i) check(*it, v[i], at + "/" + std::to_string(i), depth + 1);
    }
  }
};

}  // namespace

std::vector<std::string> schema_errors(const json& schema, const json& instance) {
  std::vector<std::string> errors;
  Validator{schema, errors}.check(schema, instance, "", 0);
  return errors;
}

json report_schema() {
  const std::string path = source_path("reports/schema/report.schema.json");
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path);
  return json::parse(in);
}

nlohmann::json valid_report(const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text);
  std::string errs;
  for (const std::string& e : schema_errors(report_schema(), j)) errs += e + "\n";
  EXPECT_EQ(errs, "");
  return j;
}

}  // namespace bp::test
