#include "data/prepare.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <regex>
#include <set>
#include <system_error>

#include "data/token_file.h"
#include "data/token_meta.h"

namespace trident {

namespace {

namespace fs = std::filesystem;

constexpr int64_t kByteVocab = 256;

std::string shard_name(const std::string& prefix, size_t index) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "_%06zu.bin", index);
  return prefix + buf;
}

// Buffers tokens and writes a shard each time shard_tokens have arrived.
class ShardWriter {
 public:
  ShardWriter(std::string dir, std::string prefix, uint64_t shard_tokens)
      : dir_(std::move(dir)), prefix_(std::move(prefix)), shard_tokens_(shard_tokens) {}

  Status add(uint32_t token) {
    buffer_.push_back(token);
    if (buffer_.size() >= shard_tokens_) return flush();
    return Status::ok();
  }

  Status flush() {
    if (buffer_.empty()) return Status::ok();
    std::string path = (fs::path(dir_) / shard_name(prefix_, written_.size())).string();
    TRIDENT_RETURN_IF_ERROR(write_token_file(path, buffer_, 1));
    // The sidecar spares `trident train` a scan for the largest id (data/token_meta.h).
    std::error_code ec;
    const uint64_t bytes = fs::file_size(path, ec);
    if (ec) return Status::io_error(path + ": cannot stat the shard just written: " + ec.message());
    TRIDENT_RETURN_IF_ERROR(write_token_meta(
        path, {buffer_.size(), *std::max_element(buffer_.begin(), buffer_.end()), bytes}));
    written_.push_back(path);
    buffer_.clear();
    return Status::ok();
  }

  const std::vector<std::string>& written() const { return written_; }

 private:
  std::string dir_;
  std::string prefix_;
  uint64_t shard_tokens_;
  std::vector<uint32_t> buffer_;
  std::vector<std::string> written_;
};

Status validate(const PrepareOptions& o) {
  if (o.tokenizer == "gpt2") {
    return Status::invalid_config(
        "--tokenizer gpt2 is not implemented yet; use --tokenizer byte");
  }
  if (o.tokenizer != "byte") {
    return Status::invalid_config("--tokenizer: unknown tokenizer '" + o.tokenizer +
                                  "' (allowed: byte, gpt2)");
  }
  if (o.inputs.empty()) return Status::invalid_config("--input: at least one file is required");
  if (o.out_dir.empty()) return Status::invalid_config("--out: an output directory is required");
  if (!(o.val_fraction >= 0.0 && o.val_fraction < 1.0)) {
    return Status::invalid_config("--val-fraction: must be in [0, 1), got " +
                                  std::to_string(o.val_fraction));
  }
  if (o.shard_tokens < 1) return Status::invalid_config("--shard-tokens: must be >= 1");
  return Status::ok();
}

// Removes train_NNNNNN.bin / val_NNNNNN.bin files and their .meta.json sidecars (by file
// name) this run did not write.
void remove_stale_shards(const std::string& dir, const std::set<std::string>& keep) {
  static const std::regex kShard(R"((train|val)_\d{6}\.bin(\.meta\.json)?)");
  std::error_code ec;
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (std::regex_match(name, kShard) && !keep.count(name)) {
      std::error_code rm_ec;
      fs::remove(it->path(), rm_ec);
    }
  }
}

}  // namespace

double unigram_entropy(const std::vector<uint64_t>& counts) {
  long double total = 0;
  for (uint64_t c : counts) total += c;
  if (total == 0) return 0.0;
  long double h = 0;
  for (uint64_t c : counts) {
    if (c == 0) continue;
    const long double p = c / total;
    h -= p * std::log(p);
  }
  return static_cast<double>(h);
}

Result<PrepareSummary> prepare_corpus(const PrepareOptions& options) {
  TRIDENT_RETURN_IF_ERROR(validate(options));

  // Check every input before writing anything.
  PrepareSummary summary;
  summary.vocab_size = kByteVocab;
  for (const std::string& input : options.inputs) {
    std::error_code ec;
    if (!fs::is_regular_file(input, ec)) {
      return Status::invalid_input(input + ": not a readable regular file" +
                                   (fs::exists(input, ec) ? "" : " (no such file)"));
    }
    std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(input.c_str(), "rb"), &std::fclose);
    if (!f) return Status::invalid_input(input + ": cannot open for reading");
    summary.bytes += fs::file_size(input, ec);
    if (ec) return Status::invalid_input(input + ": cannot stat: " + ec.message());
  }
  summary.files = options.inputs.size();

  const uint64_t total = summary.bytes;  // byte tokenizer: one token per byte
  summary.val_tokens = static_cast<uint64_t>(std::llround(total * options.val_fraction));
  summary.train_tokens = total - summary.val_tokens;
  if (summary.train_tokens < 2) {
    return Status::invalid_input("--input: " + std::to_string(total) +
                                 " bytes of text leave too few train tokens");
  }

  std::error_code ec;
  fs::create_directories(options.out_dir, ec);
  if (ec) {
    return Status::io_error(options.out_dir + ": cannot create directory: " + ec.message());
  }

  ShardWriter train(options.out_dir, "train", options.shard_tokens);
  ShardWriter val(options.out_dir, "val", options.shard_tokens);
  std::vector<uint64_t> counts(kByteVocab, 0);
  uint64_t position = 0;
  std::vector<unsigned char> chunk(1 << 20);
  for (const std::string& input : options.inputs) {
    std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(input.c_str(), "rb"), &std::fclose);
    if (!f) return Status::invalid_input(input + ": cannot open for reading");
    size_t n;
    while ((n = std::fread(chunk.data(), 1, chunk.size(), f.get())) > 0) {
      for (size_t i = 0; i < n; ++i, ++position) {
        if (position >= total) break;  // the file grew while we read: keep the stat size
        const uint32_t token = chunk[i];
        if (position < summary.train_tokens) {
          ++counts[token];
          TRIDENT_RETURN_IF_ERROR(train.add(token));
        } else {
          TRIDENT_RETURN_IF_ERROR(val.add(token));
        }
      }
    }
    if (std::ferror(f.get())) return Status::io_error(input + ": read error");
  }
  if (position != total) {
    return Status::io_error(options.inputs.back() + ": the input files shrank while being read (" +
                            std::to_string(position) + " of " + std::to_string(total) +
                            " bytes)");
  }
  TRIDENT_RETURN_IF_ERROR(train.flush());
  TRIDENT_RETURN_IF_ERROR(val.flush());

  summary.train_shards = train.written();
  summary.val_shards = val.written();
  std::set<std::string> keep;
  for (const auto* shards : {&summary.train_shards, &summary.val_shards}) {
    for (const std::string& path : *shards) {
      keep.insert(fs::path(path).filename().string());
      keep.insert(fs::path(token_meta_path(path)).filename().string());
    }
  }
  remove_stale_shards(options.out_dir, keep);
  summary.unigram_entropy = unigram_entropy(counts);
  return summary;
}

}  // namespace trident
