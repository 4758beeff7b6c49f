// Whole-file reads and atomic writes, for every file bitparity reads as a whole or
// writes: plans, tokens files, configs, reports, dumps and checkpoints. A write goes
// to a temporary beside the target, is fsynced and renamed over it, so an error
// never leaves a partial file and never destroys an earlier one.
#pragma once
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>

struct stat;

namespace bp::io {

// Reads a whole (small) text file (opened by open_regular_file); IoError if it cannot
// be read, BadInput if it is larger than max_bytes. (Every caller reads JSON, and the
// message says so.)
std::string read_text_file(const std::string& path, size_t max_bytes = size_t{64} << 20);

// Opens `path` for reading, refusing before it could block what is not a regular file:
// standard input by name ("-", /dev/stdin, /dev/fd/N), and FIFOs, devices, sockets and
// directories (BadInput "not a regular file"). stat() follows symlinks first; the open
// is O_NONBLOCK (a FIFO swapped in after the stat does not block it) and the opened
// descriptor is checked again, then made blocking. Returns the descriptor (O_CLOEXEC;
// the caller closes it) and its fstat in `st`. BadInput "no such file" when nothing is
// there, IoError with the OS's reason (permission denied, a symlink loop) otherwise.
int open_regular_file(const std::string& path, struct stat& st);

// The type of what is at `path`, symlinks followed (not_found when nothing is). When
// the file system cannot say (a symlink loop, permission denied on a folder on the
// way): BadInput(file, field, "'<path>': <the OS's reason>"), `file` defaulting to path.
std::filesystem::file_type path_type(const std::string& path, const std::string& file = "",
                                     const std::string& field = "");

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
