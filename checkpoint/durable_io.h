// Durable file operations for checkpoints, LevelDB style: a file is durable once it was
// written, fsync'ed, renamed into place and its directory fsync'ed; a rename is durable
// once the directory holding it is fsync'ed. Crashing between any two steps leaves
// either the old state or the new one, never a torn file under the final name.
//
// Every error is an io_error naming the path and the OS reason. Thread-safe (no
// shared state); the async writer calls these from its background thread.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "core/status.h"

namespace trident {

// Writes bytes to path + ".tmp", fsyncs it, renames it to path, fsyncs the directory.
Status write_file_atomic(const std::string& path, std::span<const char> bytes);
Status write_file_atomic(const std::string& path, const std::string& text);

// fsync of a directory, so the renames and creations inside it survive a crash.
Status fsync_dir(const std::string& dir);

// rename(2) from -> to, then fsync of to's directory (and from's, when different).
Status rename_durable(const std::string& from, const std::string& to);

// Reads a whole file. Missing file: io_error "<path>: No such file or directory".
Status read_whole_file(const std::string& path, std::string* out);

// mkdir -p. Existing directories are fine.
Status make_dirs(const std::string& dir);

// Removes a file or directory tree (missing is fine); errors name the path.
Status remove_tree(const std::string& path);

// A move-only owner of a POSIX file descriptor.
class FileHandle {
 public:
  FileHandle() = default;
  explicit FileHandle(int fd) : fd_(fd) {}
  ~FileHandle();
  FileHandle(FileHandle&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  FileHandle& operator=(FileHandle&& o) noexcept;
  FileHandle(const FileHandle&) = delete;
  FileHandle& operator=(const FileHandle&) = delete;

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }

  // O_RDONLY / O_WRONLY|O_CREAT|O_TRUNC.
  static Status open_read(const std::string& path, FileHandle* out);
  static Status open_write(const std::string& path, FileHandle* out);

  // The whole span, retrying short writes; then fsync. path is for messages.
  Status write_all(const void* data, size_t bytes, const std::string& path);
  Status sync(const std::string& path);
  // Reads exactly `bytes` at `offset`; a short read is reported through *got (may be
  // less than bytes at end of file) with an ok Status; only OS errors fail.
  Status pread_all(void* data, size_t bytes, int64_t offset, size_t* got,
                   const std::string& path) const;
  // File size via fstat.
  Status size(int64_t* out, const std::string& path) const;

 private:
  int fd_ = -1;
};

}  // namespace trident
