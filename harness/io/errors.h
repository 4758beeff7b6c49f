// Errors of the harness's inputs. BadInput is the user's input being wrong (a file,
// or the command line; the CLI maps it to exit code 2, kExitBadInput); IoError is
// the machine failing us (a read or write that the OS refused).
#pragma once
#include <stdexcept>
#include <string>
#include <utility>

namespace bp::io {

// A malformed, truncated, inconsistent or unsupported input file. Carries the
// file, the field or tensor at fault ("" when the whole file is at fault) and a
// one-line reason; what() is "<file>: <field>: <message>".
class BadInput : public std::runtime_error {
 public:
  BadInput(std::string file, std::string field, std::string message)
      : std::runtime_error(compose(file, field, message)),
        file_(std::move(file)),
        field_(std::move(field)),
        message_(std::move(message)) {}

  const std::string& file() const noexcept { return file_; }
  const std::string& field() const noexcept { return field_; }
  const std::string& message() const noexcept { return message_; }

 private:
  // One printable line: control characters become '?', a hostile field is cut.
  static std::string printable(const std::string& in, size_t max) {
    std::string s = in.size() > max ? in.substr(0, max - 3) + "..." : in;
    for (char& c : s)
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
    return s;
  }
  static std::string compose(const std::string& file, const std::string& field, const std::string& message) {
    std::string s = file.empty() ? std::string("<memory>") : printable(file, 4096);
    if (!field.empty()) s += ": " + printable(field, 200);
    return s + ": " + printable(message, 4096);
  }
  std::string file_, field_, message_;
};

// User input quoted in a message: 'text', or its first 64 characters and its length
// when longer ('tp111...' (100012 characters)), so that a message stays one short line.
inline std::string quoted_input(const std::string& text) {
  constexpr size_t kShown = 64;
  std::string q = "'";
  q.append(text, 0, kShown);
  if (text.size() <= kShown) return q += "'";
  return q += "...' (" + std::to_string(text.size()) + " characters)";
}

// The OS refused an open, read, write, fsync or rename.
class IoError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace bp::io
