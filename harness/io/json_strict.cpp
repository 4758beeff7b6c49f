#include "harness/io/json_strict.h"

#include <set>
#include <vector>

#include "harness/io/errors.h"

namespace bp::io {

namespace {

struct Frame {
  bool is_object = false;
  std::set<std::string> keys;
  std::string last_key;
};

std::string key_path(const std::vector<Frame>& stack, const std::string& leaf) {
  std::string p;
  for (const Frame& f : stack) {
    if (f.is_object && !f.last_key.empty() && &f != &stack.back()) {
      if (!p.empty()) p += '.';
      p += f.last_key;
    }
  }
  if (!p.empty()) p += '.';
  return p + leaf;
}

}  // namespace

nlohmann::json parse_json_strict(std::string_view text, const std::string& path, int max_depth) {
  using nlohmann::json;
  std::vector<Frame> stack;
  auto cb = [&](int /*depth*/, json::parse_event_t ev, json& parsed) -> bool {
    switch (ev) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        if (static_cast<int>(stack.size()) >= max_depth)
          throw BadInput(path, "", "JSON nested deeper than " + std::to_string(max_depth) + " levels");
        stack.push_back(Frame{ev == json::parse_event_t::object_start, {}, {}});
        break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        if (!stack.empty()) stack.pop_back();
        break;
      case json::parse_event_t::key: {
        if (stack.empty()) break;
        const std::string k = parsed.get<std::string>();
        if (!stack.back().keys.insert(k).second)
          throw BadInput(path, key_path(stack, k), "duplicate key \"" + k + "\" in a JSON object");
        stack.back().last_key = k;
        break;
      }
      case json::parse_event_t::value:
        break;
    }
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), cb, /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const json::exception& e) {
    throw BadInput(path, "", std::string("not valid JSON: ") + e.what());
  }
}

const char* json_type_word(const nlohmann::json& v) {
  switch (v.type()) {
    case nlohmann::json::value_t::null: return "null";
    case nlohmann::json::value_t::object: return "an object";
    case nlohmann::json::value_t::array: return "an array";
    case nlohmann::json::value_t::string: return "a string";
    case nlohmann::json::value_t::boolean: return "a boolean";
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned: return "an integer";
    case nlohmann::json::value_t::number_float: return "a float";
    case nlohmann::json::value_t::binary: return "binary data";
    case nlohmann::json::value_t::discarded: return "nothing";
  }
  return "unknown";
}

}  // namespace bp::io
