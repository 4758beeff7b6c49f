// `bitparity report R.json|R.csv [--baseline OLD.json|OLD.csv] [--html out.html]`:
// reads a report back, prints its summary (and its comparison against a baseline),
// and renders it as one HTML page.
#pragma once
#include <cstdio>
#include <string>

namespace bp::harness {

struct ReportOptions {
  std::string report;    // JSON, or CSV by the ".csv" extension
  std::string baseline;  // "" = none
  std::string html;      // "" = none
};

// Exit code: without a baseline the report's verdict (0 exact or skipped only, 1 a
// mismatch); with one, 1 iff something newly fails or a case compared in the
// baseline is gone, else 0; 2 for an unreadable or malformed report (the message
// names the file and the field) or an unwritable --html path. Every input is read
// before the page is written (atomically), so a failed run leaves an earlier page
// untouched.
int run_report(const ReportOptions& o, std::FILE* out, std::FILE* err);

}  // namespace bp::harness
