// One llm.c token shard, opened read-only by mmap.
//
// Format (llm.c): a 1024-byte header of int32[256] — [0] magic, [1] version, [2] number
// of tokens — then the tokens, little-endian:
//   magic 20240520, version 1: uint16 tokens (vocabularies up to 65536, e.g. GPT-2)
//   magic 20240801, version 7: uint32 tokens (larger vocabularies, e.g. Llama 3)
// The file size must be exactly 1024 + ntok * width: a shorter file is truncated, a
// longer one has trailing bytes; both are errors, since either means the writer died
// or the header lies.
//
// open_raw() maps a file of bare little-endian tokens with no header (a Megatron .bin,
// data/megatron_file.h): version() is then 0.
//
// Failures are Status::invalid_input with a message that starts with the file path.
// TokenFile is move-only; the mapping lives as long as the object. Reads are const and
// safe from many threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace trident {

inline constexpr size_t kTokenFileHeaderBytes = 1024;
inline constexpr int32_t kTokenFileMagicU16 = 20240520;  // version 1
inline constexpr int32_t kTokenFileMagicU32 = 20240801;  // version 7

class TokenFile {
 public:
  static Result<TokenFile> open(const std::string& path);
  // The whole file as tokens of `width` bytes (2: uint16, 4: uint32 or int32 read as
  // uint32); its size must be a multiple of the width. An empty file holds no tokens.
  static Result<TokenFile> open_raw(const std::string& path, int width);

  TokenFile(TokenFile&& other) noexcept;
  TokenFile& operator=(TokenFile&& other) noexcept;
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;
  ~TokenFile();

  const std::string& path() const { return path_; }
  int version() const { return version_; }
  int token_width() const { return width_; }  // bytes per token: 2 or 4
  uint64_t num_tokens() const { return num_tokens_; }
  uint64_t file_bytes() const { return map_bytes_; }
  // The mapped tokens, num_tokens() * token_width() bytes, aligned to the width (the
  // header is 1024 bytes): for whole-file scans (data/token_check.h).
  const unsigned char* token_bytes() const { return tokens_; }

  // Token i (i < num_tokens()).
  uint32_t token(uint64_t i) const;
  // Copies tokens [start, start + count) widened to uint32; the range must be in bounds.
  void copy(uint64_t start, size_t count, uint32_t* out /*[count]*/) const;

 private:
  TokenFile() = default;
  void release();

  std::string path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const unsigned char* tokens_ = nullptr;  // points into map_, past the header
  uint64_t num_tokens_ = 0;
  int version_ = 0;
  int width_ = 0;
};

// Writes `tokens` as an llm.c shard: version 1 (uint16; every id must be < 65536) or
// version 7 (uint32). Durable and atomic: a temp file beside `path`, fsync, rename,
// fsync of the directory. Errors name the path.
Status write_token_file(const std::string& path, const std::vector<uint32_t>& tokens, int version);

}  // namespace trident
