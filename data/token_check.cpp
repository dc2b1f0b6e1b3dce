#include "data/token_check.h"

#include <algorithm>
#include <optional>

#include "core/log.h"
#include "core/timer.h"

namespace trident {

namespace {

// Largest of p[0, n): static blocks per thread, a vectorisable max within a chunk of
// the token type itself (16 uint16 lanes per AVX2 op rather than 8 widened ones).
template <typename T>
uint32_t max_of(const T* p, uint64_t n) {
  constexpr int64_t kChunk = 1 << 16;
  const int64_t chunks = static_cast<int64_t>((n + kChunk - 1) / kChunk);
  uint32_t m = 0;
#pragma omp parallel for schedule(static) reduction(max : m)
  for (int64_t c = 0; c < chunks; ++c) {
    const T* q = p + c * kChunk;
    const int64_t len = std::min<int64_t>(kChunk, static_cast<int64_t>(n) - c * kChunk);
    T cm = 0;
    for (int64_t i = 0; i < len; ++i) cm = q[i] > cm ? q[i] : cm;
    m = std::max<uint32_t>(m, cm);
  }
  return m;
}

uint32_t max_token_id(const TokenFile& file) {
  if (file.num_tokens() == 0) return 0;
  if (file.token_width() == 2) {
    return max_of(reinterpret_cast<const uint16_t*>(file.token_bytes()), file.num_tokens());
  }
  return max_of(reinterpret_cast<const uint32_t*>(file.token_bytes()), file.num_tokens());
}

// The position of the first id >= vocab_size in `file`, if any.
std::optional<uint64_t> first_out_of_range(const TokenFile& file, int64_t vocab_size) {
  for (uint64_t i = 0; i < file.num_tokens(); ++i) {
    if (static_cast<int64_t>(file.token(i)) >= vocab_size) return i;
  }
  return std::nullopt;
}

}  // namespace

Result<TokenIdCheck> check_token_ids(const TokenDataset& dataset, int64_t vocab_size) {
  Timer timer;
  TokenIdCheck r;
  std::string tokenizer_file;  // the first file whose sidecar records the tokenizer
  for (const TokenFile& file : dataset.files()) {
    r.tokens += file.num_tokens();
    const std::optional<TokenFileMeta> meta = read_token_meta(file);
    if (meta && meta->tokenizer) {
      const TokenizerRecord& t = *meta->tokenizer;
      // The byte tokenizer is exempt: a model may cover only the bytes that occur (ASCII
      // text under a vocabulary of 128), which the id check below bounds.
      if (t.vocab_size > vocab_size && t.name != "byte") {
        return Status::invalid_input(file.path() + ": its tokenizer " + t.name + " has " +
                                     std::to_string(t.vocab_size) +
                                     " ids, more than model.vocab_size " +
                                     std::to_string(vocab_size));
      }
      if (!r.tokenizer) {
        r.tokenizer = t;
        tokenizer_file = file.path();
      } else if (r.tokenizer->vocab_size != t.vocab_size || r.tokenizer->sha256 != t.sha256) {
        return Status::invalid_input(file.path() + ": its tokenizer " + t.name + " (" +
                                     std::to_string(t.vocab_size) + " ids) is not the one of " +
                                     tokenizer_file + " (" + r.tokenizer->name + ", " +
                                     std::to_string(r.tokenizer->vocab_size) + " ids)");
      }
    }
    if (file.token_width() == 2 && vocab_size >= 65536) {
      ++r.files_skipped;
      continue;
    }
    uint32_t file_max = 0;
    bool scanned = false;
    if (meta) {
      file_max = meta->max_id;
    } else {
      file_max = max_token_id(file);
      scanned = true;
    }
    if (file_max >= vocab_size) {
      if (auto pos = first_out_of_range(file, vocab_size)) {
        return Status::invalid_input(
            file.path() + ": token id " + std::to_string(file.token(*pos)) + " at position " +
            std::to_string(*pos) + " is >= model.vocab_size " + std::to_string(vocab_size) +
            " (largest id in this file: " +
            std::to_string(scanned ? file_max : max_token_id(file)) + ")");
      }
      // Only a wrong sidecar gets here: believe the tokens.
      file_max = max_token_id(file);
      scanned = true;
    }
    if (scanned) {
      ++r.files_scanned;
      r.scanned_bytes += file.num_tokens() * static_cast<uint64_t>(file.token_width());
    } else {
      ++r.files_from_sidecar;
    }
    r.max_id = std::max(r.max_id, file_max);
  }
  r.seconds = timer.elapsed_ms() / 1000.0;
  return r;
}

Status check_token_ids_at_startup(const std::string& key, const TokenDataset& dataset,
                                  int64_t vocab_size,
                                  std::optional<TokenizerRecord>* tokenizer) {
  auto check = check_token_ids(dataset, vocab_size);
  if (!check.is_ok()) return Status(check.status().code(), key + " " + check.status().message());
  const TokenIdCheck& c = check.value();
  if (tokenizer != nullptr) *tokenizer = c.tokenizer;
  if (c.seconds > 1.0) {
    log::info("{}: token ids checked against model.vocab_size {} in {:.1f} s ({} shards scanned, "
              "{:.2f} GB at {:.2f} GB/s; {} from sidecars, {} need no check)",
              key, vocab_size, c.seconds, c.files_scanned, c.scanned_bytes / 1e9,
              c.scanned_bytes / 1e9 / c.seconds, c.files_from_sidecar, c.files_skipped);
  }
  return Status::ok();
}

}  // namespace trident
