#include "data/megatron_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>

namespace trident {

namespace {

// Writes the parts to `path` via a temp file, fsync and rename, then fsyncs the directory.
Status write_durably(const std::string& path,
                     const std::vector<std::pair<const void*, size_t>>& parts) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Status::io_error(path + ": cannot create " + tmp + ": " + std::strerror(errno));
  auto fail = [&](const std::string& what) {
    Status st = Status::io_error(path + ": " + what + ": " + std::strerror(errno));
    ::close(fd);
    ::unlink(tmp.c_str());
    return st;
  };
  for (const auto& [data, bytes] : parts) {
    const char* p = static_cast<const char*>(data);
    for (size_t left = bytes; left > 0;) {
      const ssize_t n = ::write(fd, p, left);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return fail("write");
      p += n;
      left -= static_cast<size_t>(n);
    }
  }
  if (::fsync(fd) != 0) return fail("fsync");
  if (::close(fd) != 0) {
    Status st = Status::io_error(path + ": close: " + std::strerror(errno));
    ::unlink(tmp.c_str());
    return st;
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    Status st = Status::io_error(path + ": rename from " + tmp + ": " + std::strerror(errno));
    ::unlink(tmp.c_str());
    return st;
  }
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    ::fsync(dir_fd);
    ::close(dir_fd);
  }
  return Status::ok();
}

}  // namespace

Status write_megatron_dataset(const std::string& prefix, const uint16_t* tokens, uint64_t count,
                              const std::vector<uint64_t>& doc_lengths) {
  const std::string idx_path = prefix + ".idx";
  const uint64_t sequences = doc_lengths.size();
  std::vector<int32_t> lengths(sequences);
  std::vector<int64_t> pointers(sequences);
  std::vector<int64_t> doc_indices(sequences + 1);
  uint64_t offset = 0;
  for (uint64_t i = 0; i < sequences; ++i) {
    if (doc_lengths[i] > static_cast<uint64_t>(std::numeric_limits<int32_t>::max())) {
      return Status::invalid_input(idx_path + ": document " + std::to_string(i) + " has " +
                                   std::to_string(doc_lengths[i]) +
                                   " tokens, more than the int32 sequence length allows");
    }
    lengths[i] = static_cast<int32_t>(doc_lengths[i]);
    pointers[i] = static_cast<int64_t>(offset * sizeof(uint16_t));
    doc_indices[i] = static_cast<int64_t>(i);
    offset += doc_lengths[i];
  }
  doc_indices[sequences] = static_cast<int64_t>(sequences);
  if (offset != count) {
    return Status::internal(idx_path + ": document lengths sum to " + std::to_string(offset) +
                            ", not the " + std::to_string(count) + " tokens");
  }
  const uint64_t version = kMegatronIndexVersion;
  const uint8_t dtype = kMegatronDtypeUint16;
  const uint64_t doc_count = doc_indices.size();
  // .bin first: a reader that finds the .idx can trust the .bin beside it.
  TRIDENT_RETURN_IF_ERROR(write_durably(prefix + ".bin", {{tokens, count * sizeof(uint16_t)}}));
  return write_durably(idx_path, {{kMegatronIndexMagic, sizeof(kMegatronIndexMagic)},
                                  {&version, sizeof(version)},
                                  {&dtype, sizeof(dtype)},
                                  {&sequences, sizeof(sequences)},
                                  {&doc_count, sizeof(doc_count)},
                                  {lengths.data(), lengths.size() * sizeof(int32_t)},
                                  {pointers.data(), pointers.size() * sizeof(int64_t)},
                                  {doc_indices.data(), doc_indices.size() * sizeof(int64_t)}});
}

}  // namespace trident
