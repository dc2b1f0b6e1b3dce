#include "checkpoint/durable_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

namespace trident {

namespace fs = std::filesystem;

namespace {
Status os_error(const std::string& what, const std::string& path, int err) {
  return Status::io_error(path + ": " + what + ": " + std::strerror(err));
}
std::string parent_of(const std::string& path) {
  std::string parent = fs::path(path).parent_path().string();
  return parent.empty() ? "." : parent;
}
}  // namespace

FileHandle::~FileHandle() {
  if (fd_ >= 0) ::close(fd_);
}

FileHandle& FileHandle::operator=(FileHandle&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

Status FileHandle::open_read(const std::string& path, FileHandle* out) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return os_error("open", path, errno);
  *out = FileHandle(fd);
  return Status::ok();
}

Status FileHandle::open_write(const std::string& path, FileHandle* out) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return os_error("create", path, errno);
  *out = FileHandle(fd);
  return Status::ok();
}

Status FileHandle::write_all(const void* data, size_t bytes, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd_, p, bytes);
    if (n < 0) {
      if (errno == EINTR) continue;
      return os_error("write", path, errno);
    }
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return Status::ok();
}

Status FileHandle::sync(const std::string& path) {
  if (::fsync(fd_) != 0) return os_error("fsync", path, errno);
  return Status::ok();
}

Status FileHandle::pread_all(void* data, size_t bytes, int64_t offset, size_t* got,
                             const std::string& path) const {
  char* p = static_cast<char*>(data);
  *got = 0;
  while (*got < bytes) {
    const ssize_t n = ::pread(fd_, p + *got, bytes - *got, offset + static_cast<int64_t>(*got));
    if (n < 0) {
      if (errno == EINTR) continue;
      return os_error("read", path, errno);
    }
    if (n == 0) break;  // end of file
    *got += static_cast<size_t>(n);
  }
  return Status::ok();
}

Status FileHandle::size(int64_t* out, const std::string& path) const {
  struct stat st;
  if (::fstat(fd_, &st) != 0) return os_error("stat", path, errno);
  *out = static_cast<int64_t>(st.st_size);
  return Status::ok();
}

Status fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return os_error("open directory", dir, errno);
  FileHandle handle(fd);
  if (::fsync(fd) != 0) return os_error("fsync directory", dir, errno);
  return Status::ok();
}

Status write_file_atomic(const std::string& path, std::span<const char> bytes) {
  const std::string tmp = path + ".tmp";
  {
    FileHandle f;
    TRIDENT_RETURN_IF_ERROR(FileHandle::open_write(tmp, &f));
    TRIDENT_RETURN_IF_ERROR(f.write_all(bytes.data(), bytes.size(), tmp));
    TRIDENT_RETURN_IF_ERROR(f.sync(tmp));
  }
  return rename_durable(tmp, path);
}

Status write_file_atomic(const std::string& path, const std::string& text) {
  return write_file_atomic(path, std::span<const char>(text.data(), text.size()));
}

Status rename_durable(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) {
    return os_error("rename to " + to, from, errno);
  }
  const std::string to_dir = parent_of(to), from_dir = parent_of(from);
  TRIDENT_RETURN_IF_ERROR(fsync_dir(to_dir));
  if (from_dir != to_dir) TRIDENT_RETURN_IF_ERROR(fsync_dir(from_dir));
  return Status::ok();
}

Status read_whole_file(const std::string& path, std::string* out) {
  FileHandle f;
  TRIDENT_RETURN_IF_ERROR(FileHandle::open_read(path, &f));
  int64_t size = 0;
  TRIDENT_RETURN_IF_ERROR(f.size(&size, path));
  out->resize(static_cast<size_t>(size));
  size_t got = 0;
  TRIDENT_RETURN_IF_ERROR(f.pread_all(out->data(), out->size(), 0, &got, path));
  out->resize(got);
  return Status::ok();
}

Status make_dirs(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Status::io_error(dir + ": create directory: " + ec.message());
  return Status::ok();
}

Status remove_tree(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  if (ec) return Status::io_error(path + ": remove: " + ec.message());
  return Status::ok();
}

}  // namespace trident
