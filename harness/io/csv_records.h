// CSV text split into records by RFC 4180: fields separated by ',', records by
// CRLF or LF, a field in double quotes may hold ',', line breaks and '"' written
// twice. What bitparity's CSV reports need read back, and what a line-by-line
// parser cannot: a case's error message or a model path that holds a line break.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace bp::io {

struct CsvRecord {
  std::vector<std::string> fields;
  unsigned line = 0;  // the line the record starts on, from 1
};

// The records of `text` (a UTF-8 byte order mark at its start and blank lines at its
// end are not records). Strict: a '"' inside an unquoted field, anything but ',' or
// a line end after a closing quote, and a quote still open at the end are
// BadInput(path, "line N", why).
std::vector<CsvRecord> csv_records(std::string_view text, const std::string& path);

}  // namespace bp::io
