// The sidecar of a token shard: <shard>.meta.json beside <shard>, written by
// `trident prepare` after each shard it writes (data/prepare.h), read by the start-up
// vocabulary check (data/token_check.h) so that it need not scan the shard:
//   {"tokens": 1000000, "max_id": 128000, "bytes": 4001024,
//    "tokenizer": {"name": "llama3", "sha256": "82e9...", "vocab_size": 128256,
//                  "document_token": 128000}}
// tokens: the header's token count; max_id: the largest id in the shard (0 when empty);
// bytes: the shard's file size (a Megatron X.bin has X.bin.meta.json too); tokenizer: what
// made the ids, so the data says which vocabulary it needs: --tokenizer as given (a name
// or the path of a rank file / tokenizer.json), the SHA-256 of the file(s) it was read
// from (data/bpe_vocabularies.h), one past its largest id, and the id prepare placed
// before every document. The byte tokenizer has neither file nor document token (both
// keys absent). A rank file's record also has "pattern" (its --tokenizer-pattern), which
// the file does not say. The trainer stores the record in its checkpoints' trainer state
// ("tokenizer"), where `trident generate` finds it. Sidecars written before the tokenizer was recorded lack the key and keep
// working: they just say nothing about the tokenizer.
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

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "data/token_file.h"

namespace trident {

struct TokenizerRecord {
  std::string name;
  std::string sha256;           // empty: none (byte)
  int64_t vocab_size = 0;
  int64_t document_token = -1;  // -1: none (byte)
  std::string pattern;          // a rank file's --tokenizer-pattern; empty otherwise
};

// The record as the sidecars and the checkpoints' trainer state hold it (see above), and
// back: nullopt when `json` is not a well-formed record.
nlohmann::ordered_json tokenizer_record_to_json(const TokenizerRecord& record);
std::optional<TokenizerRecord> tokenizer_record_from_json(const nlohmann::json& json);

struct TokenFileMeta {
  uint64_t tokens = 0;
  uint32_t max_id = 0;
  uint64_t bytes = 0;
  std::optional<TokenizerRecord> tokenizer;
};

inline constexpr const char* kTokenMetaSuffix = ".meta.json";

std::string token_meta_path(const std::string& shard_path);
// Errors (io_error) name the sidecar.
Status write_token_meta(const std::string& shard_path, const TokenFileMeta& meta);
// The sidecar of `file` when it exists and matches the shard (see above), else nullopt;
// a tokenizer key that is not a well-formed record makes the sidecar untrusted too.
std::optional<TokenFileMeta> read_token_meta(const TokenFile& file);

}  // namespace trident
