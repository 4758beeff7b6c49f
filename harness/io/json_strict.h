// Strict JSON for input files: RFC 8259 (nlohmann), plus what nlohmann accepts
// silently and bitparity refuses: duplicate keys in an object (JSON leaves them
// undefined; Python keeps the last) and nesting deeper than a small limit.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace bp::io {

// Parses `text` or throws BadInput(path, <dotted key path>, reason).
nlohmann::json parse_json_strict(std::string_view text, const std::string& path, int max_depth = 16);

// A JSON value's type with its article, for messages ("a string", "an integer", "null").
const char* json_type_word(const nlohmann::json& v);

}  // namespace bp::io
