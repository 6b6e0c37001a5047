#include "models/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include <c10/util/Exception.h>

namespace tt {

std::string temporary_path_for(const std::string& path) { return path + ".tmp"; }

AtomicFile::AtomicFile(std::string path, std::string what)
    : path_(std::move(path)), tmp_(temporary_path_for(path_)), what_(std::move(what)) {
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  TORCH_CHECK(fd_ >= 0, "cannot write ", what_, " '", path_, "': cannot create '", tmp_, "': ", std::strerror(errno));
}

AtomicFile::~AtomicFile() {
  if (!committed_) discard();
}

size_t AtomicFile::write(const void* data, size_t n) {
  if (error_ || fd_ < 0) return 0;
  static const std::array<char, 4096> zeros{};
  size_t done = 0;
  while (done < n) {
    const size_t chunk = data ? n - done : std::min(n - done, zeros.size());
    const char* from = data ? static_cast<const char*>(data) + done : zeros.data();
    const ssize_t w = ::write(fd_, from, chunk);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      error_ = w < 0 ? errno : EIO;
      return done;
    }
    done += static_cast<size_t>(w);
  }
  return n;
}

void AtomicFile::commit() {
  if (error_) fail(std::strerror(error_));
  // On the disk before the rename, so that a crash never leaves a short file under the name.
  if (::fsync(fd_) != 0) fail(std::string("fsync: ") + std::strerror(errno));
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail(std::string("close: ") + std::strerror(errno));
  if (std::rename(tmp_.c_str(), path_.c_str()) != 0)
    fail("cannot move '" + tmp_ + "' into place: " + std::strerror(errno));
  committed_ = true;
}

void AtomicFile::fail(const std::string& why) {
  discard();
  TORCH_CHECK(false, "writing ", what_, " '", path_, "' failed (", why, "); the temporary file '", tmp_, "' is removed");
}

void AtomicFile::discard() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  std::remove(tmp_.c_str());
}

}  // namespace tt
