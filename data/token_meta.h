// The sidecar of a token shard: <shard>.meta.json beside <shard>, written by
// `trident prepare` after each shard it writes (data/prepare.h), read by the start-up
// vocabulary check (data/token_check.h) so that it need not scan the shard:
//   {"tokens": 1000000, "max_id": 255, "bytes": 2001024}
// tokens: the header's token count; max_id: the largest id in the shard (0 when empty);
// bytes: the shard's file size.
//
// A sidecar is trusted only when it parses, its tokens and bytes equal the shard's, and
// it is not older than the shard (mtime): a shard rewritten by some other tool after
// prepare, or a sidecar copied from another corpus, then fails one of the checks and the
// shard is scanned instead. A sidecar is an optimisation, never required; it is written
// with temp + rename (no fsync: a torn one fails to parse and is ignored).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "core/status.h"
#include "data/token_file.h"

namespace trident {

struct TokenFileMeta {
  uint64_t tokens = 0;
  uint32_t max_id = 0;
  uint64_t bytes = 0;
};

inline constexpr const char* kTokenMetaSuffix = ".meta.json";

std::string token_meta_path(const std::string& shard_path);
// Errors (io_error) name the sidecar.
Status write_token_meta(const std::string& shard_path, const TokenFileMeta& meta);
// The sidecar of `file` when it exists and matches the shard (see above), else nullopt.
std::optional<TokenFileMeta> read_token_meta(const TokenFile& file);

}  // namespace trident
