// fast-cpp-csv-parser (libfccp's csv.h), a third-party reader the tests check
// bitparity's CSVs against, included one way: its reader classes are defined in the
// header, so every translation unit of a binary must see the same configuration.
#pragma once

// Files in tests are small: read them on this thread (fccp's reader thread buys nothing).
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
