// Whole-file reads and atomic writes, for every file bitparity reads as a whole or
// writes: plans, tokens files, configs, reports, dumps and checkpoints. A write goes
// to a temporary beside the target, is fsynced and renamed over it, so an error
// never leaves a partial file and never destroys an earlier one.
//
// Outputs the user names (reports, dumps) go through write_output: "-" is standard
// output; a character device or FIFO (/dev/null, /dev/stdout on a terminal or pipe,
// a named pipe) is written straight, not replaced; a symbolic link is written
// through, atomically at the file it points to, so the link stays a link.
//
// Temporaries are named ".<target name>.tmp-<pid>-<n>". One left by a killed writer
// (kill -9, power loss) is removed the next time a file is written atomically in its
// folder, when it is ours and stale: owned by this user, and either no process <pid>
// runs here and it was last modified over a minute ago (the minute spares a writer
// in another pid namespace that is between its last write and its rename), or it was
// last modified over a day ago.
#pragma once
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

struct stat;

namespace bp::io {

// A file and the SHA-256 of its bytes (64 lowercase hex digits): what a record of
// the files a run read keeps.
struct FileDigest {
  std::string path, sha256;
};

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

// "" when `path` can take a file written by write_output, else the reason: it is a
// directory (or some other thing that is not a file, device or FIFO), its folder
// does not exist, or a file cannot really be created there (tried: create and
// remove a temporary, since for root permission bits say nothing). Commands check
// every output path before their work, so a bad path costs neither the work nor an
// earlier output.
std::string write_path_problem(const std::string& path);

// Whether `a` and `b` name one file, whatever their spelling: the same device and
// inode when it exists (after symbolic links; "-" is standard output's), else the
// same path once symbolic links and "." / ".." are resolved.
bool same_file(const std::string& a, const std::string& b);

// An output a command will write, and the option that names it ("--json").
struct NamedOutput {
  std::string option, path;
};
// Throws BadInput(path, option, reason) for the first output that cannot be written
// (write_path_problem), is one of `inputs` (a file the command reads: writing it
// would destroy it), or is the same file as an earlier output (two outputs on one
// path: "-" at most once). Inputs that do not exist are skipped.
void check_outputs(const std::vector<NamedOutput>& outputs, const std::vector<std::string>& inputs);

// Writes `pieces` to the output `path` as the file-head comment says: "-" (or another
// name of this process's standard output) to standard output, a character device or
// FIFO straight, anything else with write_file_atomic. IoError for a failed write.
void write_output(const std::string& path, std::span<const std::span<const uint8_t>> pieces);
void write_output(const std::string& path, std::string_view text);

// Writes `pieces` one after another to `path` atomically: a fresh temporary in the
// same directory, fsync, rename over `path`, then a best-effort fsync of the
// directory and the removal of stale temporaries there (file-head comment). When
// `path` is a symbolic link, all of this happens at the file it points to. IoError
// for a failed write (the temporary is removed and `path` is untouched).
void write_file_atomic(const std::string& path, std::span<const std::span<const uint8_t>> pieces);
// Writes `text` to `path` atomically (as above).
void write_file_atomic(const std::string& path, std::string_view text);

}  // namespace bp::io
