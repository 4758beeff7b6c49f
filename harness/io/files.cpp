#include "harness/io/files.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <optional>

#include "harness/io/errors.h"

namespace bp::io {

namespace {

// Names under which a path means this process's standard input (or another open
// descriptor): reading one would wait on a terminal or a pipe.
bool names_standard_input(const std::string& path) {
  return path == "-" || path == "/dev/stdin" || path.starts_with("/dev/fd/") || path.starts_with("/proc/self/fd/");
}

[[noreturn]] void refuse_open(const std::string& path, int e) {
  if (e == ENOENT) throw BadInput(path, "", "no such file");
  throw IoError(path + ": cannot open: " + std::strerror(e));
}

// A descriptor closed when it goes out of scope.
class ScopedFd {
 public:
  explicit ScopedFd(int fd) : fd_(fd) {}
  ~ScopedFd() { ::close(fd_); }
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

[[noreturn]] void refuse_non_regular(const std::string& path, int fd) {
  if (fd >= 0) ::close(fd);
  throw BadInput(path, "", "not a regular file (a FIFO, device, socket or directory); bitparity reads regular files");
}

}  // namespace

int open_regular_file(const std::string& path, struct stat& st) {
  if (names_standard_input(path))
    throw BadInput(path, "", "standard input is not read; name a regular file instead");
  if (::stat(path.c_str(), &st) != 0) refuse_open(path, errno);
  if (!S_ISREG(st.st_mode)) refuse_non_regular(path, -1);
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) refuse_open(path, errno);
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    throw IoError(path + ": cannot stat: " + std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) refuse_non_regular(path, fd);
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
    const int e = errno;
    ::close(fd);
    throw IoError(path + ": cannot clear O_NONBLOCK: " + std::strerror(e));
  }
  return fd;
}

std::filesystem::file_type path_type(const std::string& path, const std::string& file, const std::string& field) {
  std::error_code ec;
  const std::filesystem::file_status st = std::filesystem::status(path, ec);
  if (ec && st.type() != std::filesystem::file_type::not_found)
    throw BadInput(file.empty() ? path : file, field, (file.empty() ? "" : quoted_input(path) + ": ") + ec.message());
  return st.type();
}

std::string read_text_file(const std::string& path, size_t max_bytes) {
  struct stat st {};
  const ScopedFd fd(open_regular_file(path, st));
  std::string s;
  char buf[65536];
  while (true) {
    const ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw IoError(path + ": read failed: " + std::strerror(errno));
    if (n == 0) return s;
    s.append(buf, static_cast<size_t>(n));
    if (s.size() > max_bytes)
      throw BadInput(path, "",
                     "file is larger than " + std::to_string(max_bytes) + " bytes; refusing to read it as JSON");
  }
}

namespace {

namespace fs = std::filesystem;

constexpr const char* kStandardOutput = "-";
constexpr int kMaxLinks = 40;  // the kernel's limit (ELOOP)
constexpr const char* kTemporaryMark = ".tmp-";
// A temporary whose writer no process here has is stale after this long untouched;
// any other after kStaleAnyway (file-head comment).
constexpr double kStaleWriterGoneSeconds = 60;
constexpr double kStaleAnywaySeconds = 24 * 3600;

// `path` with the symbolic links of its last component followed, also when the last
// link dangles: the file that a write through `path` lands on.
fs::path link_target(const fs::path& path) {
  fs::path p = path;
  std::error_code ec;
  for (int hops = 0; hops < kMaxLinks && fs::is_symlink(fs::symlink_status(p, ec)); ++hops) {
    const fs::path to = fs::read_symlink(p, ec);
    if (ec) break;
    p = to.is_absolute() ? to : p.parent_path() / to;
  }
  return p;
}

fs::path folder_of(const fs::path& p) { return p.has_parent_path() ? p.parent_path() : fs::path("."); }

// A fresh name for a temporary beside `target`: ".<name>.tmp-<pid>-<n>".
fs::path temporary_beside(const fs::path& target) {
  static std::atomic<uint64_t> counter{0};
  return folder_of(target) / ("." + target.filename().string() + kTemporaryMark + std::to_string(::getpid()) + "-" +
                              std::to_string(counter.fetch_add(1)));
}

// The writer's pid when `leaf` is a name temporary_beside gives, else nullopt.
std::optional<pid_t> temporary_writer(const std::string& leaf) {
  const size_t mark = leaf.rfind(kTemporaryMark);
  if (leaf.front() != '.' || mark == std::string::npos || mark < 2) return std::nullopt;
  const char* const end = leaf.data() + leaf.size();
  pid_t pid = 0;
  uint64_t n = 0;
  const auto [dash, pid_ec] = std::from_chars(leaf.data() + mark + std::strlen(kTemporaryMark), end, pid);
  if (pid_ec != std::errc() || pid <= 0 || dash == end || *dash != '-') return std::nullopt;
  const auto [tail, n_ec] = std::from_chars(dash + 1, end, n);
  if (n_ec != std::errc() || tail != end) return std::nullopt;
  return pid;
}

bool is_stale(const struct stat& st, pid_t writer) {
  if (!S_ISREG(st.st_mode) || st.st_uid != ::geteuid() || writer == ::getpid()) return false;
  const double age = std::difftime(std::time(nullptr), st.st_mtime);
  const bool writer_gone = ::kill(writer, 0) != 0 && errno == ESRCH;
  return (writer_gone && age > kStaleWriterGoneSeconds) || age > kStaleAnywaySeconds;
}

// Best effort: a folder we cannot list keeps its temporaries.
void remove_stale_temporaries(const fs::path& dir) {
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const auto writer = temporary_writer(it->path().filename().string());
    struct stat st {};
    if (writer && ::lstat(it->path().c_str(), &st) == 0 && is_stale(st, *writer)) ::unlink(it->path().c_str());
  }
}

// stat() of an output path, "-" being standard output.
bool stat_output(const std::string& path, struct stat& st) {
  return path == kStandardOutput ? ::fstat(STDOUT_FILENO, &st) == 0 : ::stat(path.c_str(), &st) == 0;
}

bool is_stream(const struct stat& st) { return S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode); }

bool is_standard_output(const std::string& path) {
  struct stat st {}, out {};
  return path == kStandardOutput || (stat_output(path, st) && ::fstat(STDOUT_FILENO, &out) == 0 &&
                                     st.st_dev == out.st_dev && st.st_ino == out.st_ino);
}

// The path once symbolic links and "." / ".." are resolved, as far as it exists.
fs::path resolved(const std::string& path) {
  std::error_code ec;
  const fs::path p = fs::weakly_canonical(link_target(fs::absolute(path, ec)), ec);
  return ec ? fs::path(path) : p;
}

// "" when a file can be created beside `target` (one is made and removed), else why not.
std::string creation_problem(const fs::path& target) {
  const fs::path probe = temporary_beside(target);
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return "cannot create a file in directory " + folder_of(target).string() + ": " + std::strerror(errno);
  ::close(fd);
  ::unlink(probe.c_str());
  return "";
}

}  // namespace

std::string write_path_problem(const std::string& path) {
  if (path.empty()) return "empty path";
  if (path == kStandardOutput) return "";
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return "is a directory";
    if (is_stream(st))
      return ::access(path.c_str(), W_OK) == 0 ? "" : std::string("cannot write: ") + std::strerror(errno);
    if (!S_ISREG(st.st_mode)) return "is not a regular file, character device or FIFO";
  } else if (errno != ENOENT) {
    return std::string("cannot look it up: ") + std::strerror(errno);
  }
  const fs::path target = link_target(path);
  std::error_code ec;
  if (!fs::is_directory(folder_of(target), ec)) return "directory " + folder_of(target).string() + " does not exist";
  return creation_problem(target);
}

bool same_file(const std::string& a, const std::string& b) {
  struct stat sa {}, sb {};
  const bool a_exists = stat_output(a, sa), b_exists = stat_output(b, sb);
  if (a_exists || b_exists) return a_exists && b_exists && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
  return resolved(a) == resolved(b);
}

void check_outputs(const std::vector<NamedOutput>& outputs, const std::vector<std::string>& inputs) {
  for (size_t i = 0; i < outputs.size(); ++i) {
    const NamedOutput& o = outputs[i];
    if (const std::string why = write_path_problem(o.path); !why.empty()) throw BadInput(o.path, o.option, why);
    for (const std::string& in : inputs) {
      struct stat st {};
      if (::stat(in.c_str(), &st) == 0 && same_file(o.path, in))
        throw BadInput(o.path, o.option, "is the input " + in + ": writing it would destroy it");
    }
    for (size_t k = 0; k < i; ++k)
      if (same_file(o.path, outputs[k].path))
        throw BadInput(o.path, o.option,
                       "is also the " + outputs[k].option + " output (" + outputs[k].path + "): one file per output" +
                           (is_standard_output(o.path) ? "; at most one output may be standard output" : ""));
  }
}

namespace {

void write_all(int fd, const void* p, size_t n, const std::string& path) {
  const uint8_t* c = static_cast<const uint8_t*>(p);
  while (n > 0) {
    const ssize_t w = ::write(fd, c, std::min<size_t>(n, size_t{1} << 30));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) throw IoError(path + ": write failed: " + std::strerror(w < 0 ? errno : EIO));
    c += w;
    n -= static_cast<size_t>(w);
  }
}

void write_pieces(int fd, std::span<const std::span<const uint8_t>> pieces, const std::string& name) {
  for (const std::span<const uint8_t> piece : pieces) write_all(fd, piece.data(), piece.size(), name);
}

// A stream is written where it is: a device or FIFO cannot be replaced by a rename.
void write_stream(const std::string& path, std::span<const std::span<const uint8_t>> pieces) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) throw IoError(path + ": cannot open: " + std::strerror(errno));
  try {
    write_pieces(fd, pieces, path);
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (::close(fd) != 0) throw IoError(path + ": close failed: " + std::strerror(errno));
}

}  // namespace

void write_output(const std::string& path, std::span<const std::span<const uint8_t>> pieces) {
  if (is_standard_output(path)) {
    std::fflush(stdout);  // whatever the command printed first stays first
    write_pieces(STDOUT_FILENO, pieces, "standard output");
    return;
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && is_stream(st)) return write_stream(path, pieces);
  write_file_atomic(path, pieces);
}

void write_output(const std::string& path, std::string_view text) {
  const std::span<const uint8_t> piece(reinterpret_cast<const uint8_t*>(text.data()), text.size());
  write_output(path, std::span<const std::span<const uint8_t>>(&piece, 1));
}

void write_file_atomic(const std::string& path, std::span<const std::span<const uint8_t>> pieces) {
  const fs::path target = link_target(path);
  const fs::path dir = folder_of(target);
  const std::string tmp = temporary_beside(target).string();
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  // Messages name the file the user asked for; its temporary is gone when they are read.
  if (fd < 0) throw IoError(path + ": cannot create its temporary " + tmp + ": " + std::strerror(errno));
  bool open_fd = true;
  try {
    write_pieces(fd, pieces, path);
    if (::fsync(fd) != 0) throw IoError(path + ": fsync failed: " + std::strerror(errno));
    open_fd = false;
    if (::close(fd) != 0) throw IoError(path + ": close failed: " + std::strerror(errno));
  } catch (...) {
    if (open_fd) ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (::rename(tmp.c_str(), target.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    throw IoError(path + ": rename from temporary failed: " + std::strerror(e));
  }
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);  // best effort: make the rename durable
    ::close(dfd);
  }
  remove_stale_temporaries(dir);
}

void write_file_atomic(const std::string& path, std::string_view text) {
  const std::span<const uint8_t> piece(reinterpret_cast<const uint8_t*>(text.data()), text.size());
  write_file_atomic(path, std::span<const std::span<const uint8_t>>(&piece, 1));
}

}  // namespace bp::io
