// fast-cpp-csv-parser (libfccp's csv.h), included the one way every user in this
// tree shares: its reader classes are defined in the header, so two translation
// units of one binary must see the same configuration (test_report links read.cpp).
#pragma once

// A report is small: read it on this thread (fccp's reader thread buys nothing).
#define CSV_IO_NO_THREAD
// csv.h copies file names into a fixed buffer with strncpy, truncating on purpose.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstringop-truncation"
#endif
#include <libfccp/csv.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
