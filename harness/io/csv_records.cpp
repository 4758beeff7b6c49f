#include "harness/io/csv_records.h"

#include "harness/io/errors.h"

namespace bp::io {

namespace {

constexpr std::string_view kByteOrderMark = "\xEF\xBB\xBF";

// Reads one record from text[at] on; `line` counts the line ends it passes.
class RecordReader {
 public:
  RecordReader(std::string_view text, const std::string& path) : text_(text), path_(path) {}

  bool done() const { return at_ >= text_.size(); }
  unsigned line() const { return line_; }
  void skip(size_t n) { at_ += n; }

  std::vector<std::string> record() {
    std::vector<std::string> fields(1);
    for (;;) {
      if (done()) return fields;
      if (peek() == '"') {
        fields.back() = quoted_field();
      } else {
        unquoted_field(fields.back());
      }
      if (done()) return fields;
      if (peek() == ',') {
        ++at_;
        fields.emplace_back();
        continue;
      }
      line_end();
      return fields;
    }
  }

 private:
  char peek() const { return text_[at_]; }
  bool at_line_end() const { return peek() == '\n' || (peek() == '\r' && at_ + 1 < text_.size() && text_[at_ + 1] == '\n'); }
  void line_end() {
    if (!at_line_end()) bad(line_, "expected ',' or a line end after a closing quote");
    at_ += peek() == '\r' ? 2 : 1;
    ++line_;
  }
  void unquoted_field(std::string& f) {
    while (!done() && peek() != ',' && !at_line_end()) {
      if (peek() == '"') bad(line_, "a '\"' inside a field that does not start with one");
      f += text_[at_++];
    }
  }
  std::string quoted_field() {
    const unsigned opened = line_;
    std::string f;
    for (++at_;; ++at_) {
      if (done()) bad(opened, "a quoted field is never closed");
      const char c = peek();
      if (c == '"' && at_ + 1 < text_.size() && text_[at_ + 1] == '"') {
        f += '"';
        ++at_;
      } else if (c == '"') {
        ++at_;
        return f;
      } else {
        line_ += c == '\n';
        f += c;
      }
    }
  }
  [[noreturn]] void bad(unsigned line, const std::string& why) const {
    throw BadInput(path_, "line " + std::to_string(line), why);
  }

  std::string_view text_;
  const std::string& path_;
  size_t at_ = 0;
  unsigned line_ = 1;
};

// `text` without the blank lines at its end, which tools that save CSV (and an
// `echo >>`) leave: an empty line is not a record.
std::string_view without_trailing_blank_lines(std::string_view text) {
  const size_t last = text.find_last_not_of("\r\n");
  return text.substr(0, last == std::string_view::npos ? 0 : last + 1);
}

}  // namespace

std::vector<CsvRecord> csv_records(std::string_view text, const std::string& path) {
  RecordReader in(without_trailing_blank_lines(text), path);
  if (text.substr(0, kByteOrderMark.size()) == kByteOrderMark) in.skip(kByteOrderMark.size());
  std::vector<CsvRecord> out;
  while (!in.done()) {
    const unsigned line = in.line();
    out.push_back({in.record(), line});
  }
  return out;
}

}  // namespace bp::io
