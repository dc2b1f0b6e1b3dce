#include "data/megatron_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
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

template <typename Token>
Status write_dataset(const std::string& prefix, const Token* tokens, uint64_t count,
                     const std::vector<uint64_t>& doc_lengths, uint8_t dtype) {
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
    pointers[i] = static_cast<int64_t>(offset * sizeof(Token));
    doc_indices[i] = static_cast<int64_t>(i);
    offset += doc_lengths[i];
  }
  doc_indices[sequences] = static_cast<int64_t>(sequences);
  if (offset != count) {
    return Status::internal(idx_path + ": document lengths sum to " + std::to_string(offset) +
                            ", not the " + std::to_string(count) + " tokens");
  }
  const uint64_t version = kMegatronIndexVersion;
  const uint64_t doc_count = doc_indices.size();
  // .bin first: a reader that finds the .idx can trust the .bin beside it.
  TRIDENT_RETURN_IF_ERROR(write_durably(prefix + ".bin", {{tokens, count * sizeof(Token)}}));
  return write_durably(idx_path, {{kMegatronIndexMagic, sizeof(kMegatronIndexMagic)},
                                  {&version, sizeof(version)},
                                  {&dtype, sizeof(dtype)},
                                  {&sequences, sizeof(sequences)},
                                  {&doc_count, sizeof(doc_count)},
                                  {lengths.data(), lengths.size() * sizeof(int32_t)},
                                  {pointers.data(), pointers.size() * sizeof(int64_t)},
                                  {doc_indices.data(), doc_indices.size() * sizeof(int64_t)}});
}


// The index file mapped read-only for the duration of the validation.
class MappedIndex {
 public:
  ~MappedIndex() {
    if (map_ != nullptr) ::munmap(map_, bytes_);
  }
  Status open(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      return Status::invalid_input(path + ": cannot open Megatron index: " + std::strerror(errno));
    }
    struct stat st {};
    Status status = Status::ok();
    if (::fstat(fd, &st) != 0) {
      status = Status::invalid_input(path + ": cannot stat: " + std::strerror(errno));
    } else if (!S_ISREG(st.st_mode)) {
      status = Status::invalid_input(path + ": not a regular file");
    } else {
      bytes_ = static_cast<size_t>(st.st_size);
      if (bytes_ > 0) {
        void* map = ::mmap(nullptr, bytes_, PROT_READ, MAP_SHARED, fd, 0);
        if (map == MAP_FAILED) {
          status = Status::invalid_input(path + ": mmap failed: " + std::strerror(errno));
        } else {
          map_ = map;
        }
      }
    }
    ::close(fd);
    return status;
  }
  uint64_t bytes() const { return bytes_; }
  template <typename T>
  T at(uint64_t offset) const {  // unaligned little-endian read; offset + sizeof(T) <= bytes
    T v;
    std::memcpy(&v, static_cast<const char*>(map_) + offset, sizeof(T));
    return v;
  }
  const char* data() const { return static_cast<const char*>(map_); }

 private:
  void* map_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace

const char* megatron_dtype_name(uint8_t code) {
  static const char* const kNames[] = {"uint8",   "int8",    "int16",   "int32",
                                       "int64",   "float64", "float32", "uint16"};
  return code >= 1 && code <= 8 ? kNames[code - 1] : "unknown";
}

Status write_megatron_dataset(const std::string& prefix, const uint16_t* tokens, uint64_t count,
                              const std::vector<uint64_t>& doc_lengths) {
  return write_dataset(prefix, tokens, count, doc_lengths, kMegatronDtypeUint16);
}

Status write_megatron_dataset(const std::string& prefix, const int32_t* tokens, uint64_t count,
                              const std::vector<uint64_t>& doc_lengths) {
  return write_dataset(prefix, tokens, count, doc_lengths, kMegatronDtypeInt32);
}

Result<MegatronIndex> read_megatron_index(const std::string& idx_path, const std::string& bin_path,
                                          uint64_t bin_bytes) {
  auto fail = [&](const std::string& what) { return Status::invalid_input(idx_path + ": " + what); };
  MappedIndex idx;
  TRIDENT_RETURN_IF_ERROR(idx.open(idx_path));
  if (idx.bytes() < kMegatronIndexHeaderBytes) {
    return fail("truncated: the header needs " + std::to_string(kMegatronIndexHeaderBytes) +
                " bytes (magic, version, dtype, sequence count, document count), found " +
                std::to_string(idx.bytes()));
  }
  if (std::memcmp(idx.data(), kMegatronIndexMagic, sizeof(kMegatronIndexMagic)) != 0) {
    return fail("bad magic: expected \"MMIDIDX\\0\\0\": not a Megatron indexed dataset index");
  }
  MegatronIndex out;
  const uint64_t version = idx.at<uint64_t>(9);
  if (version != kMegatronIndexVersion) {
    return fail("unsupported version " + std::to_string(version) + " (expected " +
                std::to_string(kMegatronIndexVersion) + ")");
  }
  out.dtype_code = idx.at<uint8_t>(17);
  if (out.dtype_code == kMegatronDtypeUint16) {
    out.token_width = 2;
  } else if (out.dtype_code == kMegatronDtypeInt32) {
    out.token_width = 4;
  } else {
    return fail("dtype code " + std::to_string(out.dtype_code) + " (" +
                megatron_dtype_name(out.dtype_code) +
                ") is not a token type Trident reads (uint16 = 8 or int32 = 4)");
  }
  out.sequences = idx.at<uint64_t>(18);
  out.doc_indices = idx.at<uint64_t>(26);
  const uint64_t S = out.sequences, D = out.doc_indices;
  uint64_t arrays = 0, doc_bytes = 0;
  if (__builtin_mul_overflow(S, uint64_t{12}, &arrays) ||
      __builtin_mul_overflow(D, uint64_t{8}, &doc_bytes) ||
      __builtin_add_overflow(arrays, doc_bytes, &arrays) ||
      __builtin_add_overflow(arrays, kMegatronIndexHeaderBytes, &arrays)) {
    return fail("sequence count " + std::to_string(S) + " and document count " +
                std::to_string(D) + " overflow the file size");
  }
  const uint64_t expected = arrays;
  if (idx.bytes() < expected) {
    return fail("truncated: sequence count " + std::to_string(S) + " and document count " +
                std::to_string(D) + " need " + std::to_string(expected) + " bytes, found " +
                std::to_string(idx.bytes()));
  }
  if (idx.bytes() != expected && idx.bytes() != expected + S) {  // + S: multimodal modes
    return fail("trailing bytes: sequence count " + std::to_string(S) + " and document count " +
                std::to_string(D) + " need " + std::to_string(expected) + " bytes, found " +
                std::to_string(idx.bytes()));
  }
  const uint64_t lengths_at = kMegatronIndexHeaderBytes;
  const uint64_t pointers_at = lengths_at + 4 * S;
  const uint64_t docs_at = pointers_at + 8 * S;
  const uint64_t width = static_cast<uint64_t>(out.token_width);
  uint64_t offset = 0;  // bytes of .bin covered so far
  for (uint64_t i = 0; i < S; ++i) {
    const int32_t length = idx.at<int32_t>(lengths_at + 4 * i);
    const int64_t pointer = idx.at<int64_t>(pointers_at + 8 * i);
    // (Built only on failure: an index can hold billions of sequences.)
    auto at = [i] {
      std::string text = "[";
      text += std::to_string(i);
      text += ']';
      return text;
    };
    if (length < 0) return fail("sequence_lengths" + at() + " = " + std::to_string(length) + " is negative");
    const uint64_t bytes = static_cast<uint64_t>(length) * width;
    if (pointer < 0 || static_cast<uint64_t>(pointer) > bin_bytes ||
        bytes > bin_bytes - static_cast<uint64_t>(pointer)) {
      return fail("sequence_pointers" + at() + " = " + std::to_string(pointer) + " with length " +
                  std::to_string(length) + " runs past the end of " + bin_path + " (" +
                  std::to_string(bin_bytes) + " bytes)");
    }
    if (static_cast<uint64_t>(pointer) != offset) {
      return fail("sequence_pointers" + at() + " = " + std::to_string(pointer) + ", expected " +
                  std::to_string(offset) +
                  " (the end of the previous sequence): Trident reads the sequences as one "
                  "contiguous stream and refuses gaps or overlaps");
    }
    offset += bytes;
  }
  if (offset != bin_bytes) {
    return Status::invalid_input(bin_path + ": " + std::to_string(bin_bytes) + " bytes, but the " +
                                 std::to_string(S) + " sequences of " + idx_path + " cover " +
                                 std::to_string(offset) + " bytes");
  }
  int64_t previous = 0;
  for (uint64_t i = 0; i < D; ++i) {
    const int64_t d = idx.at<int64_t>(docs_at + 8 * i);
    if (d < previous || static_cast<uint64_t>(d) > S) {
      return fail("document_indices[" + std::to_string(i) + "] = " + std::to_string(d) +
                  " is not in [" + std::to_string(previous) + ", " + std::to_string(S) +
                  "] (the indices must be non-decreasing sequence numbers)");
    }
    previous = d;
  }
  out.tokens = offset / width;
  return out;
}

Result<TokenFile> open_megatron_dataset(const std::string& prefix) {
  const std::string bin_path = prefix + ".bin", idx_path = prefix + ".idx";
  struct stat st {};
  if (::stat(bin_path.c_str(), &st) != 0) {
    return Status::invalid_input(bin_path + ": cannot open the data file of Megatron index " +
                                 idx_path + ": " + std::strerror(errno));
  }
  TRIDENT_ASSIGN_OR_RETURN(MegatronIndex index,
                           read_megatron_index(idx_path, bin_path, static_cast<uint64_t>(st.st_size)));
  TRIDENT_ASSIGN_OR_RETURN(TokenFile file, TokenFile::open_raw(bin_path, index.token_width));
  if (file.num_tokens() != index.tokens) {  // the .bin changed between the stat and the map
    return Status::invalid_input(bin_path + ": holds " + std::to_string(file.num_tokens()) +
                                 " tokens, " + idx_path + " says " + std::to_string(index.tokens));
  }
  return file;
}

}  // namespace trident
