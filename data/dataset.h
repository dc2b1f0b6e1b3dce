// TokenDataset: one token stream made of token files, concatenated in name order: llm.c
// shards (data/token_file.h) and Megatron indexed datasets (data/megatron_file.h; the
// concatenation of the dataset's sequences, which is its .bin), mixed freely.
//
// A spec (config `data.train` / `data.val`, or one path of a blend, data/blend.h) is
//   - a directory: every *.bin regular file inside it (not recursive), sorted by name;
//   - a glob with * ? or [ ]: the matches of glob(3), sorted by name, except shard
//     sidecars (*.meta.json, data/token_meta.h);
//   - a Megatron prefix P: P itself does not exist but P.idx does (P.bin beside it);
//   - otherwise a single file.
// Each resulting file X.bin that has an X.idx beside it is a Megatron dataset, as is a
// named X.idx (standing for X.bin: a glob matching both yields the dataset once); every
// other file is an llm.c shard. resolve_token_files names a Megatron dataset by its .bin.
// A spec that matches nothing is invalid_input naming the spec; a bad file is the
// invalid_input of TokenFile::open or open_megatron_dataset, naming the file.
//
// read() validates every id against the model's vocabulary, so a dataset tokenized for
// another model fails with the file, the position in that file, the id and the vocab
// size, instead of indexing out of the embedding table. Move-only; read() is const and
// safe from many threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "data/token_file.h"

namespace trident {

// The shard paths a spec names, in stream order (see above).
Result<std::vector<std::string>> resolve_token_files(const std::string& spec);

class TokenDataset {
 public:
  static Result<TokenDataset> open(const std::string& spec, int64_t vocab_size);

  uint64_t num_tokens() const { return offsets_.back(); }
  int64_t vocab_size() const { return vocab_size_; }
  const std::string& spec() const { return spec_; }
  const std::vector<TokenFile>& files() const { return files_; }

  // Copies tokens [start, start + count) of the stream into out, crossing shard
  // boundaries. Fails (invalid_input) on an id >= vocab_size, or when the range runs
  // past the end of the stream.
  Status read(uint64_t start, size_t count, int32_t* out /*[count]*/) const;

 private:
  TokenDataset() = default;

  std::string spec_;
  int64_t vocab_size_ = 0;
  std::vector<TokenFile> files_;
  std::vector<uint64_t> offsets_{0};  // [files + 1]: offsets_[i] = first token of file i
};

}  // namespace trident
