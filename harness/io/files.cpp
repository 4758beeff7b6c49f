#include "harness/io/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>

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

std::string write_path_problem(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path p(path);
  if (path.empty()) return "empty path";
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  if (!fs::is_directory(dir, ec)) return "directory " + dir.string() + " does not exist";
  if (fs::is_directory(p, ec)) return "is a directory";
  return "";
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

}  // namespace

void write_file_atomic(const std::string& path, std::span<const std::span<const uint8_t>> pieces) {
  static std::atomic<uint64_t> counter{0};
  const std::filesystem::path target(path);
  const std::filesystem::path dir = target.has_parent_path() ? target.parent_path() : std::filesystem::path(".");
  std::string leaf = ".";
  leaf += target.filename().string();
  leaf += ".tmp-";
  leaf += std::to_string(::getpid());
  leaf += '-';
  leaf += std::to_string(counter.fetch_add(1));
  const std::string tmp = (dir / leaf).string();
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0) throw IoError(tmp + ": cannot create: " + std::strerror(errno));
  bool open_fd = true;
  try {
    for (const std::span<const uint8_t> piece : pieces) write_all(fd, piece.data(), piece.size(), tmp);
    if (::fsync(fd) != 0) throw IoError(tmp + ": fsync failed: " + std::strerror(errno));
    open_fd = false;
    if (::close(fd) != 0) throw IoError(tmp + ": close failed: " + std::strerror(errno));
  } catch (...) {
    if (open_fd) ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    throw IoError(path + ": rename from temporary failed: " + std::strerror(e));
  }
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);  // best effort: make the rename durable
    ::close(dfd);
  }
}

void write_file_atomic(const std::string& path, std::string_view text) {
  const std::span<const uint8_t> piece(reinterpret_cast<const uint8_t*>(text.data()), text.size());
  write_file_atomic(path, std::span<const std::span<const uint8_t>>(&piece, 1));
}

}  // namespace bp::io
