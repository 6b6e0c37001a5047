// A file that appears under its name complete or not at all: written to `<path>.tmp`, flushed to the disk,
// then renamed into place. A failed write (a full disk) or an exception before commit() removes the
// temporary file. Checkpoints and safetensors exports are written through it.
#pragma once

#include <cstddef>
#include <string>

namespace tt {

// The temporary name of `path` while it is written: `<path>.tmp`.
std::string temporary_path_for(const std::string& path);

class AtomicFile {
 public:
  // `what` names the file in errors ("checkpoint", "safetensors file"). Throws (c10::Error, as every
  // failure here) when the temporary file cannot be created.
  AtomicFile(std::string path, std::string what);
  ~AtomicFile();  // removes the temporary file unless committed
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  // Appends n bytes (n zero bytes when data is null). Never throws: returns the bytes written, fewer than n
  // after an error, which error() keeps (an errno).
  size_t write(const void* data, size_t n);
  int error() const { return error_; }
  // fsync, close, rename; on any failure removes the temporary file and throws as fail() does.
  void commit();
  // Removes the temporary file and throws "writing <what> '<path>' failed (<why>); the temporary file ... is
  // removed".
  [[noreturn]] void fail(const std::string& why);

  const std::string& path() const { return path_; }
  const std::string& temporary_path() const { return tmp_; }

 private:
  void discard();
  std::string path_, tmp_, what_;
  int fd_ = -1;
  int error_ = 0;
  bool committed_ = false;
};

}  // namespace tt
