// libFuzzer target: the RFC 4180 record splitter the report reader uses
// (harness/io/csv_records.h).
//
// Contract: only bp::io::BadInput may escape; any other exception, a crash or a
// sanitizer report is a finding. What it accepts it reads back: the records written
// again (every field quoted, quotes doubled, CRLF between records) split into the
// same fields.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_contract.h"
#include "harness/io/csv_records.h"

namespace {

std::string quoted(const std::string& field) {
  std::string q = "\"";
  for (const char c : field) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

std::string written(const std::vector<bp::io::CsvRecord>& records) {
  std::string text;
  for (size_t r = 0; r < records.size(); ++r) {
    if (r) text += "\r\n";
    for (size_t f = 0; f < records[r].fields.size(); ++f) text += (f ? "," : "") + quoted(records[r].fields[f]);
  }
  return text;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::vector<bp::io::CsvRecord> records;
  bool accepted = false;
  bp::fuzz::allow_bad_input([&] {
    records = bp::io::csv_records(text, "fuzz.csv");
    accepted = true;
  });
  if (!accepted) return 0;
  std::vector<bp::io::CsvRecord> again;
  bp::fuzz::allow_bad_input([&] { again = bp::io::csv_records(written(records), "fuzz.csv"); });
  bp::fuzz::require(again.size() == records.size(), "a written-again CSV has another number of records");
  for (size_t r = 0; r < records.size(); ++r)
    bp::fuzz::require(again[r].fields == records[r].fields, "a written-again CSV reads back other fields");
  for (size_t r = 1; r < records.size(); ++r)
    bp::fuzz::require(records[r].line > records[r - 1].line, "record line numbers do not increase");
  return 0;
}
