#include "harness/io/files.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "harness/io/errors.h"

namespace bp::io {

std::string read_text_file(const std::string& path, size_t max_bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError(path + ": cannot open: " + std::strerror(errno));
  std::string s;
  char buf[65536];
  while (in.read(buf, sizeof buf) || in.gcount() > 0) {
    s.append(buf, static_cast<size_t>(in.gcount()));
    if (s.size() > max_bytes)
      throw BadInput(path, "", "file is larger than " + std::to_string(max_bytes) + " bytes; refusing to read it as JSON");
  }
  if (in.bad()) throw IoError(path + ": read failed");
  return s;
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
