// Reading reports back (for `bitparity report` and its --baseline).
//
// JSON: strict. schema_version must be kReportSchemaVersion; every field of the
// schema must be present with its type, no other key is allowed, and what the
// writer derives (bit_identical, case and overall verdicts, summary counts) must
// agree with the records. So render_json(read_report_json(p)) reproduces the file
// written by render_json byte for byte. A report of an earlier schema_version is
// refused (exit 2, "re-run the command that wrote the report"): no report kept in
// the repository is read by its tests or scripts (reports/baselines/ holds the runs
// of record: benchmark CSVs, test logs, and the scale runs' gzipped reports, which
// nothing reads: its README).
//
// CSV (fast-cpp-csv-parser): the header must name exactly kCsvColumns (in any
// order; an earlier layout lacks a column and is refused naming it, except the GPU
// columns: a CSV written before them reads as made without a GPU); consecutive
// rows with one case_id form a case, and agree on the case's columns (verdict,
// parameters, first_divergent_op, seconds, peak_device_bytes, error); every row agrees on
// the report's columns, run_status (its status) and the GPU's (a report without
// cases is one row with only those). Line ends may be CRLF or LF; blank lines at the
// end are no rows. Of the environment the CSV holds only the GPU fields; no command,
// timestamp, skip reason, ranks or communication, and its "parameters" column
// ("k=v;k=v") is split at the first '=' of each ';'-separated item, so a key or
// value holding ';' or '=' does not come back whole; a field holding a line break
// cannot be read at all (the parser reads line by line). Verdicts and metrics come
// back exactly.
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
