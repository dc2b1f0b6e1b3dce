#include "data/token_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <utility>

#include "core/check.h"

namespace trident {

namespace {

std::string errno_text() { return std::strerror(errno); }

// Closes a descriptor on every return path.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_;
};

Status write_all(int fd, const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t n = ::write(fd, p, bytes);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::io_error("write failed: " + errno_text());
    }
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return Status::ok();
}

}  // namespace

namespace {

// Opens `path` read-only into *fd after checking it is a regular file; *bytes receives
// its size. Errors name the path.
Status open_regular_file(const std::string& path, Fd* fd, uint64_t* bytes) {
  auto fail = [&](const std::string& what) { return Status::invalid_input(path + ": " + what); };
  fd->reset(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd->get() < 0) return fail("cannot open token file: " + errno_text());
  struct stat st {};
  if (::fstat(fd->get(), &st) != 0) return fail("cannot stat: " + errno_text());
  if (!S_ISREG(st.st_mode)) return fail("not a regular file");
  *bytes = static_cast<uint64_t>(st.st_size);
  return Status::ok();
}

}  // namespace

Result<TokenFile> TokenFile::open(const std::string& path) {
  auto fail = [&](const std::string& what) { return Status::invalid_input(path + ": " + what); };
  Fd fd(-1);
  uint64_t file_bytes = 0;
  TRIDENT_RETURN_IF_ERROR(open_regular_file(path, &fd, &file_bytes));
  if (file_bytes < kTokenFileHeaderBytes) {
    return fail("truncated: expected a " + std::to_string(kTokenFileHeaderBytes) +
                "-byte header, found " + std::to_string(file_bytes) + " bytes");
  }

  int32_t header[256];
  size_t got = 0;
  while (got < sizeof(header)) {
    ssize_t n = ::pread(fd.get(), reinterpret_cast<char*>(header) + got, sizeof(header) - got,
                        static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return fail("cannot read header: " + (n < 0 ? errno_text() : "short read"));
    got += static_cast<size_t>(n);
  }

  const int32_t magic = header[0], version = header[1], ntok = header[2];
  int width = 0;
  if (magic == kTokenFileMagicU16) {
    if (version != 1) {
      return fail("unsupported version " + std::to_string(version) + " for magic " +
                  std::to_string(magic) + " (expected 1)");
    }
    width = 2;
  } else if (magic == kTokenFileMagicU32) {
    if (version != 7) {
      return fail("unsupported version " + std::to_string(version) + " for magic " +
                  std::to_string(magic) + " (expected 7)");
    }
    width = 4;
  } else {
    return fail("bad magic " + std::to_string(magic) + " (expected " +
                std::to_string(kTokenFileMagicU16) + " or " + std::to_string(kTokenFileMagicU32) +
                "): not an llm.c token file");
  }
  if (ntok < 0) return fail("negative token count " + std::to_string(ntok) + " in header");

  const uint64_t expected = kTokenFileHeaderBytes + static_cast<uint64_t>(ntok) * width;
  if (file_bytes < expected) {
    return fail("truncated: expected " + std::to_string(expected) + " bytes, found " +
                std::to_string(file_bytes) + " (header says " + std::to_string(ntok) + " tokens)");
  }
  if (file_bytes > expected) {
    return fail("trailing bytes: expected " + std::to_string(expected) + " bytes, found " +
                std::to_string(file_bytes) + " (header says " + std::to_string(ntok) + " tokens)");
  }

  void* map = ::mmap(nullptr, file_bytes, PROT_READ, MAP_SHARED, fd.get(), 0);
  if (map == MAP_FAILED) return fail("mmap failed: " + errno_text());
  // Training reads mostly forward; let the kernel read ahead.
  ::madvise(map, file_bytes, MADV_SEQUENTIAL);

  TokenFile file;
  file.path_ = path;
  file.map_ = map;
  file.map_bytes_ = file_bytes;
  file.tokens_ = static_cast<const unsigned char*>(map) + kTokenFileHeaderBytes;
  file.num_tokens_ = static_cast<uint64_t>(ntok);
  file.version_ = version;
  file.width_ = width;
  return file;
}

Result<TokenFile> TokenFile::open_raw(const std::string& path, int width) {
  auto fail = [&](const std::string& what) { return Status::invalid_input(path + ": " + what); };
  TRIDENT_CHECK_MSG(width == 2 || width == 4, "token width " + std::to_string(width));
  Fd fd(-1);
  uint64_t file_bytes = 0;
  TRIDENT_RETURN_IF_ERROR(open_regular_file(path, &fd, &file_bytes));
  if (file_bytes % static_cast<uint64_t>(width) != 0) {
    return fail(std::to_string(file_bytes) + " bytes is not a whole number of " +
                std::to_string(width) + "-byte tokens");
  }
  TokenFile file;
  file.path_ = path;
  file.num_tokens_ = file_bytes / static_cast<uint64_t>(width);
  file.width_ = width;
  if (file_bytes == 0) return file;  // mmap of 0 bytes fails; nothing to read anyway
  void* map = ::mmap(nullptr, file_bytes, PROT_READ, MAP_SHARED, fd.get(), 0);
  if (map == MAP_FAILED) return fail("mmap failed: " + errno_text());
  ::madvise(map, file_bytes, MADV_SEQUENTIAL);
  file.map_ = map;
  file.map_bytes_ = file_bytes;
  file.tokens_ = static_cast<const unsigned char*>(map);
  return file;
}

TokenFile::TokenFile(TokenFile&& other) noexcept { *this = std::move(other); }

TokenFile& TokenFile::operator=(TokenFile&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    map_ = std::exchange(other.map_, nullptr);
    map_bytes_ = std::exchange(other.map_bytes_, 0);
    tokens_ = std::exchange(other.tokens_, nullptr);
    num_tokens_ = std::exchange(other.num_tokens_, 0);
    version_ = std::exchange(other.version_, 0);
    width_ = std::exchange(other.width_, 0);
  }
  return *this;
}

TokenFile::~TokenFile() { release(); }

void TokenFile::release() {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
  map_ = nullptr;
  map_bytes_ = 0;
  tokens_ = nullptr;
}

uint32_t TokenFile::token(uint64_t i) const {
  TRIDENT_CHECK_MSG(i < num_tokens_, path_ + ": token " + std::to_string(i) + " out of range");
  if (width_ == 2) {
    uint16_t v;
    std::memcpy(&v, tokens_ + i * 2, 2);
    return v;
  }
  uint32_t v;
  std::memcpy(&v, tokens_ + i * 4, 4);
  return v;
}

void TokenFile::copy(uint64_t start, size_t count, uint32_t* out) const {
  TRIDENT_CHECK_MSG(start <= num_tokens_ && count <= num_tokens_ - start,
                    path_ + ": copy of [" + std::to_string(start) + ", +" +
                        std::to_string(count) + ") out of range");
  if (width_ == 4) {
    std::memcpy(out, tokens_ + start * 4, count * 4);
    return;
  }
  const unsigned char* src = tokens_ + start * 2;
  for (size_t i = 0; i < count; ++i) {
    uint16_t v;
    std::memcpy(&v, src + i * 2, 2);
    out[i] = v;
  }
}

Status write_token_file(const std::string& path, const std::vector<uint32_t>& tokens,
                        int version) {
  auto fail = [&](const Status& st) { return st.with_context(path); };
  int width = 0;
  int32_t magic = 0;
  if (version == 1) {
    width = 2;
    magic = kTokenFileMagicU16;
  } else if (version == 7) {
    width = 4;
    magic = kTokenFileMagicU32;
  } else {
    return Status::invalid_input(path + ": cannot write token file version " +
                                 std::to_string(version) + " (allowed: 1 = uint16, 7 = uint32)");
  }
  if (tokens.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return Status::invalid_input(path + ": " + std::to_string(tokens.size()) +
                                 " tokens exceed the int32 count of the llm.c header");
  }

  int32_t header[256] = {};
  header[0] = magic;
  header[1] = version;
  header[2] = static_cast<int32_t>(tokens.size());
  std::vector<unsigned char> body(tokens.size() * width);
  if (width == 2) {
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (tokens[i] > 0xFFFFu) {
        return Status::invalid_input(path + ": token " + std::to_string(i) + " has id " +
                                     std::to_string(tokens[i]) +
                                     ", too large for version 1 (uint16); use version 7");
      }
      uint16_t v = static_cast<uint16_t>(tokens[i]);
      std::memcpy(body.data() + i * 2, &v, 2);
    }
  } else if (!tokens.empty()) {
    std::memcpy(body.data(), tokens.data(), body.size());
  }

  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (fd.get() < 0) {
      return Status::io_error(path + ": cannot create " + tmp + ": " + errno_text());
    }
    Status st = write_all(fd.get(), header, sizeof(header));
    if (st.is_ok()) st = write_all(fd.get(), body.data(), body.size());
    if (st.is_ok() && ::fsync(fd.get()) != 0) st = Status::io_error("fsync: " + errno_text());
    if (st.is_ok() && ::close(fd.release()) != 0) st = Status::io_error("close: " + errno_text());
    if (!st.is_ok()) {
      ::unlink(tmp.c_str());
      return fail(st);
    }
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    Status st = Status::io_error("rename from " + tmp + ": " + errno_text());
    ::unlink(tmp.c_str());
    return fail(st);
  }
  // Make the rename itself durable.
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  Fd dir_fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir_fd.get() >= 0) ::fsync(dir_fd.get());
  return Status::ok();
}

}  // namespace trident
