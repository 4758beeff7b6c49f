// Whole-file reads and atomic writes, for every file bitparity reads as a whole or
// writes: plans, tokens files, configs, reports, dumps and checkpoints. A write goes
// to a temporary beside the target, is fsynced and renamed over it, so an error
// never leaves a partial file and never destroys an earlier one.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace bp::io {

// A file and the SHA-256 of its bytes (64 lowercase hex digits): what a record of
// the files a run read keeps.
struct FileDigest {
  std::string path, sha256;
};

// Reads a whole (small) text file; IoError if it cannot be opened or read, BadInput
// if it is larger than max_bytes. (Every caller reads JSON, and the message says so.)
std::string read_text_file(const std::string& path, size_t max_bytes = size_t{64} << 20);

// "" when `path` can take a file written here (its directory exists, it is not a
// directory), else the reason. Commands check every output path before writing
// any, so that a bad path never leaves one output new and another old.
std::string write_path_problem(const std::string& path);

// Writes `pieces` one after another to `path` atomically: a fresh temporary in the
// same directory, fsync, rename over `path`, then a best-effort fsync of the
// directory. IoError for a failed write (the temporary is removed and `path` is
// untouched).
void write_file_atomic(const std::string& path, std::span<const std::span<const uint8_t>> pieces);
// Writes `text` to `path` atomically (as above).
void write_file_atomic(const std::string& path, std::string_view text);

}  // namespace bp::io
