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

// The strict checks as a SAX pass that builds nothing: duplicate keys and depth,
// each key a set insert, so a pass is O(n log n) in the members. (nlohmann's DOM
// parser with a callback walks the parent object at every inner object's end,
// quadratic in its members: 22 s for a 25k-tensor safetensors header.)
class StrictChecker final : public nlohmann::json_sax<nlohmann::json> {
 public:
  StrictChecker(const std::string& path, int max_depth) : path_(path), max_depth_(max_depth) {}

  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return open(true); }
  bool start_array(std::size_t) override { return open(false); }
  bool end_object() override { return close(); }
  bool end_array() override { return close(); }
  bool key(string_t& k) override {
    if (!stack_.back().keys.insert(k).second)
      throw BadInput(path_, key_path(stack_, k), "duplicate key \"" + k + "\" in a JSON object");
    stack_.back().last_key = k;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    throw BadInput(path_, "", std::string("not valid JSON: ") + e.what());
  }

 private:
  bool open(bool is_object) {
    if (static_cast<int>(stack_.size()) >= max_depth_)
      throw BadInput(path_, "", "JSON nested deeper than " + std::to_string(max_depth_) + " levels");
    stack_.push_back(Frame{is_object, {}, {}});
    return true;
  }
  bool close() {
    stack_.pop_back();
    return true;
  }

  const std::string& path_;
  const int max_depth_;
  std::vector<Frame> stack_;
};

}  // namespace

// Two linear passes: the checks, then nlohmann's plain DOM parse of text known to
// pass them (its errors were the first pass's).
nlohmann::json parse_json_strict(std::string_view text, const std::string& path, int max_depth) {
  StrictChecker checker(path, max_depth);
  nlohmann::json::sax_parse(text.begin(), text.end(), &checker, nlohmann::json::input_format_t::json,
                            /*strict=*/true, /*ignore_comments=*/false);
  return nlohmann::json::parse(text.begin(), text.end());
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
