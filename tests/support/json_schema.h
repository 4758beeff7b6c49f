// A small JSON Schema (draft 2020-12) validator for the subset bitparity's report
// schema uses: type (a name or a list), required, properties, additionalProperties
// (false or a schema), enum, items (one schema), minItems, maxItems, minimum,
// anyOf, $ref to "#/$defs/<name>" (siblings of $ref apply too), and the
// annotations $schema, $id, title, description, $defs. Any other keyword is
// reported as an error, so the schema cannot use what this validator ignores.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace bp::test {

// The violations of `instance` against `schema` ("" when valid), each "<json
// pointer>: <reason>".
std::vector<std::string> schema_errors(const nlohmann::json& schema, const nlohmann::json& instance);

// bitparity's report schema, reports/schema/report.schema.json in the source tree.
nlohmann::json report_schema();

// The JSON report `text`, parsed; a gtest failure lists its schema violations.
nlohmann::json valid_report(const std::string& text);

}  // namespace bp::test
