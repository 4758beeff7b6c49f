// Reading reports back (for `bitparity report` and its --baseline).
//
// JSON: strict, of any size. schema_version 3 to kReportSchemaVersion: a report of an
// earlier version is read as the current version's document it stands for (the
// summary counts and case fields added since at their defaults, no truth errors;
// report.h lists them), after checking it holds nothing its version did not have; a
// version before 3 or after the current one is refused, naming it. Every field of the
// schema must be present with its type, no other key is allowed, and what the writer derives
// (bit_identical, case and overall verdicts, summary counts) must agree with the
// records. So render_json(read_report_json(p)) reproduces a file of the current
// version written by render_json byte for byte.
//
// CSV (io/csv_records.h, RFC 4180: quoted fields may hold line breaks; CRLF or LF
// line ends; a byte order mark and blank lines at the end are ignored): the header
// names kCsvColumns in any order, none twice, no other. A CSV written by an earlier
// bitparity lacks the columns added since schema_version 3 (run_status, error, the
// truth errors', the GPU's): they read as a complete run, no error message, no truth
// errors, no GPU; any other column missing is refused, naming it. A side's truth
// error is both its columns or neither. Consecutive rows with one case_id form a
// case, and agree on the case's columns (verdict, parameters, first_divergent_op, seconds,
// peak_device_bytes, error); every row agrees on the report's columns, run_status
// (its status) and the GPU's (a report without cases is one row with only those).
// Of the environment the CSV holds only the GPU fields; no command, timestamp, skip
// reason, ranks or communication. Its "parameters" column is read as csv.cpp writes
// it (parameters_from_csv; unescaped in a CSV without the GPU columns, written before
// the escaping). Verdicts, metrics and truth errors come back exactly.
//
// Both throw bp::io::BadInput(file, field, reason) for a malformed report, where
// field is the JSON path ("cases[2].tensors[0].metrics.max_ulp_diff") or the CSV
// line and column ("line 7, column max_ulp_diff"); bp::io::IoError when the file
// cannot be read. Duplicate case ids are refused: a baseline matches cases by id.
#pragma once
#include <string>
#include <string_view>

#include "harness/report/report.h"

namespace bp::harness {

Report parse_report_json(std::string_view text, const std::string& path);
Report read_report_json(const std::string& path);
Report read_report_csv(const std::string& path);
// By extension: ".csv" (any case) is read as CSV, anything else as JSON.
Report read_report(const std::string& path);

}  // namespace bp::harness
