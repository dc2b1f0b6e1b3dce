#include "data/prepare.h"

#include <fcntl.h>
#include <signal.h>
#include <omp.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <regex>
#include <set>
#include <system_error>

#include "data/bpe_vocabularies.h"
#include "data/megatron_file.h"
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

// The run was asked to stop (PrepareOptions::stop).
Status check_stop(const std::atomic<bool>* stop) {
  if (stop != nullptr && stop->load()) return Status::io_error("interrupted");
  return Status::ok();
}

// The sidecar of a file just written: it spares `trident train` a scan for the largest id
// and carries the tokenizer with the data (data/token_meta.h).
Status write_sidecar(const std::string& path, uint64_t tokens, uint32_t max_id,
                     const TokenizerRecord& tokenizer) {
  std::error_code ec;
  const uint64_t bytes = fs::file_size(path, ec);
  if (ec) return Status::io_error(path + ": cannot stat the file just written: " + ec.message());
  return write_token_meta(path, {tokens, max_id, bytes, tokenizer});
}

// Buffers tokens and writes a shard each time shard_tokens have arrived.
class ShardWriter {
 public:
  // version: llm.c's 1 (uint16 tokens) or 7 (uint32), data/token_file.h.
  ShardWriter(std::string dir, std::string prefix, uint64_t shard_tokens,
              const std::atomic<bool>* stop, const TokenizerRecord& tokenizer, int version = 1)
      : dir_(std::move(dir)), prefix_(std::move(prefix)), shard_tokens_(shard_tokens),
        stop_(stop), tokenizer_(tokenizer), version_(version) {}

  Status add(uint32_t token) {
    buffer_.push_back(token);
    if (buffer_.size() >= shard_tokens_) return flush();
    return Status::ok();
  }

  Status flush() {
    if (buffer_.empty()) return Status::ok();
    TRIDENT_RETURN_IF_ERROR(check_stop(stop_));
    std::string path = (fs::path(dir_) / shard_name(prefix_, written_.size())).string();
    TRIDENT_RETURN_IF_ERROR(write_token_file(path, buffer_, version_));
    TRIDENT_RETURN_IF_ERROR(write_sidecar(path, buffer_.size(),
                                          *std::max_element(buffer_.begin(), buffer_.end()),
                                          tokenizer_));
    written_.push_back(path);
    buffer_.clear();
    return Status::ok();
  }

  const std::vector<std::string>& written() const { return written_; }

 private:
  std::string dir_;
  std::string prefix_;
  uint64_t shard_tokens_;
  const std::atomic<bool>* stop_;
  const TokenizerRecord& tokenizer_;
  int version_;
  std::vector<uint32_t> buffer_;
  std::vector<std::string> written_;
};

// A --tokenizer that is not a name is the path of a rank file or a tokenizer.json.
bool is_rank_file_spec(const std::string& spec) {
  auto ends_with = [&](const std::string& tail) {
    return spec.size() > tail.size() && spec.compare(spec.size() - tail.size(), tail.size(), tail) == 0;
  };
  return spec.find('/') != std::string::npos || ends_with(".tiktoken") || ends_with(".model") ||
         ends_with(".json");
}

Status validate(const PrepareOptions& o) {
  if (o.tokenizer != "byte" && !is_named_vocabulary(o.tokenizer) && !is_rank_file_spec(o.tokenizer)) {
    return Status::invalid_config("--tokenizer: unknown tokenizer '" + o.tokenizer +
                                  "' (allowed: byte, gpt2, cl100k_base, o200k_base, llama3, or "
                                  "the path of a .tiktoken rank file or a tokenizer.json)");
  }
  if (o.allow_special && o.tokenizer == "byte") {
    return Status::invalid_config("--allow-special: the byte tokenizer has no special tokens");
  }
  if (!o.tokenizer_pattern.empty() && !is_rank_file_spec(o.tokenizer)) {
    return Status::invalid_config("--tokenizer-pattern: only for a rank file path, not for "
                                  "--tokenizer " + o.tokenizer);
  }
  if (o.inputs.empty()) return Status::invalid_config("--input: at least one file is required");
  if (o.out_dir.empty()) return Status::invalid_config("--out: an output directory is required");
  if (!(o.val_fraction >= 0.0 && o.val_fraction < 1.0)) {
    return Status::invalid_config("--val-fraction: must be in [0, 1), got " +
                                  std::to_string(o.val_fraction));
  }
  if (o.shard_tokens < 1) return Status::invalid_config("--shard-tokens: must be >= 1");
  if (o.format != "llmc" && o.format != "megatron") {
    return Status::invalid_config("--format: unknown format '" + o.format +
                                  "' (allowed: llmc, megatron)");
  }
  if (is_named_vocabulary(o.tokenizer) && o.vocab_dir.empty()) {
    return Status::invalid_config("--tokenizer " + o.tokenizer + " needs the directory of " +
                                  (o.tokenizer == "gpt2" ? std::string("encoder.json and vocab.bpe")
                                                         : o.tokenizer + ".tiktoken") +
                                  " (--vocab-dir)");
  }
  return Status::ok();
}

// Removes train_NNNNNN.bin / val_NNNNNN.bin shards and train/val.{bin,idx} Megatron files
// with their .meta.json sidecars (by file name) that this run did not write.
void remove_stale_shards(const std::string& dir, const std::set<std::string>& keep) {
  static const std::regex kShard(R"((train|val)(_\d{6}\.bin(\.meta\.json)?|\.bin(\.meta\.json)?|\.idx))");
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

// Every input is a readable regular file; sums their sizes into summary->bytes.
Status check_inputs(const PrepareOptions& options, PrepareSummary* summary) {
  for (const std::string& input : options.inputs) {
    std::error_code ec;
    if (!fs::is_regular_file(input, ec)) {
      return Status::invalid_input(input + ": not a readable regular file" +
                                   (fs::exists(input, ec) ? "" : " (no such file)"));
    }
    std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(input.c_str(), "rb"), &std::fclose);
    if (!f) return Status::invalid_input(input + ": cannot open for reading");
    summary->bytes += fs::file_size(input, ec);
    if (ec) return Status::invalid_input(input + ": cannot stat: " + ec.message());
  }
  summary->files = options.inputs.size();
  return Status::ok();
}

Result<PrepareSummary> prepare_tokenized(const PrepareOptions& options, PrepareSummary summary);

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

namespace {

// Writes the byte-tokenized llm.c shards into options.out_dir (the staging directory).
Result<PrepareSummary> prepare_bytes(const PrepareOptions& options, PrepareSummary summary) {

  const uint64_t total = summary.bytes;  // byte tokenizer: one token per byte
  summary.val_tokens = static_cast<uint64_t>(std::llround(total * options.val_fraction));
  summary.train_tokens = total - summary.val_tokens;
  if (summary.train_tokens < 2) {
    return Status::invalid_input("--input: " + std::to_string(total) +
                                 " bytes of text leave too few train tokens");
  }

  const TokenizerRecord byte{"byte", "", kByteVocab, -1, ""};
  ShardWriter train(options.out_dir, "train", options.shard_tokens, options.stop, byte);
  ShardWriter val(options.out_dir, "val", options.shard_tokens, options.stop, byte);
  std::vector<uint64_t> counts(kByteVocab, 0);
  uint64_t position = 0;
  std::vector<unsigned char> chunk(1 << 20);
  for (const std::string& input : options.inputs) {
    std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(input.c_str(), "rb"), &std::fclose);
    if (!f) return Status::invalid_input(input + ": cannot open for reading");
    size_t n;
    while ((n = std::fread(chunk.data(), 1, chunk.size(), f.get())) > 0) {
      TRIDENT_RETURN_IF_ERROR(check_stop(options.stop));
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
  summary.unigram_entropy = unigram_entropy(counts);
  return summary;
}

// ---- the tokenizing path: BPE (any format) and byte with --format megatron -----------

// Prints "prepare: done/total MB (p%), rate MB/s, tokens" on stderr every few seconds.
class Progress {
 public:
  Progress(bool enabled, uint64_t total_bytes) : enabled_(enabled), total_(total_bytes) {}
  void update(uint64_t bytes, uint64_t tokens) {
    if (!enabled_) return;
    const auto now = std::chrono::steady_clock::now();
    if (now - last_ < std::chrono::seconds(3)) return;
    last_ = now;
    const double s = std::chrono::duration<double>(now - start_).count();
    std::fprintf(stderr, "prepare: %.1f/%.1f MB (%.0f%%), %.1f MB/s, %llu tokens\n", bytes / 1e6,
                 total_ / 1e6, total_ ? 100.0 * bytes / total_ : 100.0, bytes / 1e6 / s,
                 static_cast<unsigned long long>(tokens));
  }

 private:
  bool enabled_;
  uint64_t total_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point last_ = start_;
};

// The whole token stream as uint16 or uint32 (width 2 or 4 bytes) in a temp file in the
// staging directory (the split needs the total before anything is written, and the
// stream may not fit in memory), mapped for reading once complete. Removed when the
// object goes away.
class TokenSpool {
 public:
  TokenSpool(std::string path, int width) : path_(std::move(path)), width_(width) {}
  ~TokenSpool() {
    if (map_ != nullptr) ::munmap(map_, count_ * width_);
    if (file_ != nullptr) std::fclose(file_);
    ::unlink(path_.c_str());
  }
  Status open() {
    file_ = std::fopen(path_.c_str(), "wb");
    if (file_ == nullptr) return Status::io_error(path_ + ": cannot create: " + std::strerror(errno));
    return Status::ok();
  }
  Status append(const std::vector<uint32_t>& ids) {
    size_t written;
    if (width_ == 4) {
      written = std::fwrite(ids.data(), sizeof(uint32_t), ids.size(), file_);
    } else {
      buffer_.resize(ids.size());
      for (size_t i = 0; i < ids.size(); ++i) buffer_[i] = static_cast<uint16_t>(ids[i]);
      written = std::fwrite(buffer_.data(), sizeof(uint16_t), ids.size(), file_);
    }
    if (written != ids.size()) return Status::io_error(path_ + ": write failed: " + std::strerror(errno));
    count_ += ids.size();
    return Status::ok();
  }
  // Closes the file and maps it; tokens() is valid afterwards.
  Status finish() {
    const bool closed = std::fclose(file_) == 0;
    file_ = nullptr;
    if (!closed) return Status::io_error(path_ + ": write failed: " + std::strerror(errno));
    if (count_ == 0) return Status::ok();
    const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return Status::io_error(path_ + ": cannot reopen: " + std::strerror(errno));
    void* map = ::mmap(nullptr, count_ * width_, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    if (map == MAP_FAILED) return Status::io_error(path_ + ": mmap: " + std::strerror(errno));
    map_ = map;
    return Status::ok();
  }
  uint64_t count() const { return count_; }
  int width() const { return width_; }
  uint32_t token(uint64_t i) const {
    return width_ == 4 ? static_cast<const uint32_t*>(map_)[i] : static_cast<const uint16_t*>(map_)[i];
  }
  const uint16_t* tokens16() const { return static_cast<const uint16_t*>(map_); }
  // The ids as Megatron's int32 (every id < 2^31).
  const int32_t* tokens32() const { return static_cast<const int32_t*>(map_); }

 private:
  std::string path_;
  int width_;
  FILE* file_ = nullptr;
  void* map_ = nullptr;
  uint64_t count_ = 0;
  std::vector<uint16_t> buffer_;
};

// Streams one input file through the tokenizer (nullptr = byte tokens) in blocks cut at
// safe splits (BpeTokenizer::safe_split), so the ids equal those of the whole file.
Status tokenize_file(const std::string& path, uint64_t expected_bytes, size_t block_bytes,
                     const BpeTokenizer* bpe, bool allow_special, int threads, TokenSpool* spool,
                     PrepareSummary* summary, uint64_t* bytes_done, Progress* progress,
                     const std::atomic<bool>* stop) {
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) return Status::invalid_input(path + ": cannot open for reading");
  std::string pending, text;
  std::vector<uint32_t> ids;
  uint64_t read_total = 0;
  bool eof = false;
  while (!eof || !pending.empty()) {
    TRIDENT_RETURN_IF_ERROR(check_stop(stop));
    if (!eof) {
      // Never read past the size checked up front: a file that grows meanwhile keeps it.
      const size_t want =
          static_cast<size_t>(std::min<uint64_t>(block_bytes, expected_bytes - read_total));
      const size_t old = pending.size();
      pending.resize(old + want);
      const size_t n = want ? std::fread(pending.data() + old, 1, want, f.get()) : 0;
      pending.resize(old + n);
      read_total += n;
      if (std::ferror(f.get())) return Status::io_error(path + ": read error");
      eof = n < want || read_total == expected_bytes;
    }
    // Cut after the last safe split; without one, read more (or take all at the end).
    size_t cut = pending.size();
    if (!eof && bpe != nullptr) {
      cut = 0;
      for (size_t p = pending.size() - 1; p > 0; --p) {
        if (bpe->safe_split(pending, p, allow_special)) {
          cut = p;
          break;
        }
      }
      if (cut == 0) continue;
    }
    ids.clear();
    if (bpe == nullptr) {
      ids.assign(pending.begin(), pending.begin() + static_cast<ptrdiff_t>(cut));
      for (uint32_t& id : ids) id &= 0xFF;
    } else {
      text.clear();
      summary->utf8_replacements += sanitize_utf8(std::string_view(pending).substr(0, cut), &text);
      const size_t end = text.size();
      if (cut < pending.size()) text.push_back(pending[cut]);  // ASCII look-ahead byte
      bpe->encode_parallel(text, threads, &ids, end, allow_special);
    }
    TRIDENT_RETURN_IF_ERROR(spool->append(ids));
    pending.erase(0, cut);
    *bytes_done += cut;
    progress->update(*bytes_done, spool->count());
  }
  if (read_total != expected_bytes) {
    return Status::io_error(path + ": the file shrank while being read (" +
                            std::to_string(read_total) + " of " +
                            std::to_string(expected_bytes) + " bytes)");
  }
  return Status::ok();
}

// Document lengths of tokens [begin, end) of the stream, given every document's length.
std::vector<uint64_t> documents_in(const std::vector<uint64_t>& doc_lengths, uint64_t begin,
                                   uint64_t end) {
  std::vector<uint64_t> out;
  uint64_t start = 0;
  for (uint64_t len : doc_lengths) {
    const uint64_t lo = std::max(start, begin), hi = std::min(start + len, end);
    if (lo < hi) out.push_back(hi - lo);
    start += len;
  }
  return out;
}

Result<PrepareSummary> prepare_tokenized(const PrepareOptions& options, PrepareSummary summary) {
  std::unique_ptr<LoadedTokenizer> bpe;
  if (options.tokenizer != "byte") {
    TRIDENT_ASSIGN_OR_RETURN(LoadedTokenizer loaded,
                             load_vocabulary(options.tokenizer, options.vocab_dir,
                                             options.tokenizer_pattern));
    bpe = std::make_unique<LoadedTokenizer>(std::move(loaded));
    summary.vocab_size = bpe->bpe.vocab_size();
  }
  const TokenizerRecord record =
      bpe == nullptr ? TokenizerRecord{"byte", "", kByteVocab, -1, ""}
                     : TokenizerRecord{bpe->spec, bpe->sha256, bpe->bpe.vocab_size(),
                                       bpe->document_token, options.tokenizer_pattern};
  // llm.c's uint16 shards hold ids < 65536; Megatron switches to int32 at 65500.
  const bool megatron = options.format == "megatron";
  const int width = summary.vocab_size > (megatron ? 65499 : 65536) ? 4 : 2;
  const int threads = options.threads > 0 ? options.threads : omp_get_max_threads();

  std::error_code ec;
  TokenSpool spool(
      (fs::path(options.out_dir) / (".prepare_tokens.tmp." + std::to_string(::getpid()))).string(),
      width);
  TRIDENT_RETURN_IF_ERROR(spool.open());
  Progress progress(options.progress, summary.bytes);
  std::vector<uint64_t> doc_lengths;
  uint64_t bytes_done = 0;
  for (const std::string& input : options.inputs) {
    const uint64_t size = fs::file_size(input, ec);
    if (ec) return Status::invalid_input(input + ": cannot stat: " + ec.message());
    const uint64_t first = spool.count();
    if (bpe != nullptr) TRIDENT_RETURN_IF_ERROR(spool.append({bpe->document_token}));
    TRIDENT_RETURN_IF_ERROR(tokenize_file(input, size, std::max<size_t>(options.read_block_bytes, 1),
                                          bpe ? &bpe->bpe : nullptr, options.allow_special,
                                          threads, &spool, &summary,
                                          &bytes_done,
                                          &progress, options.stop));
    doc_lengths.push_back(spool.count() - first);
  }
  TRIDENT_RETURN_IF_ERROR(spool.finish());
  summary.bytes = bytes_done;
  summary.documents = options.inputs.size();

  const uint64_t total = spool.count();
  summary.val_tokens = static_cast<uint64_t>(std::llround(total * options.val_fraction));
  summary.train_tokens = total - summary.val_tokens;
  if (summary.train_tokens < 2) {
    return Status::invalid_input("--input: " + std::to_string(total) + " tokens from " +
                                 std::to_string(summary.bytes) +
                                 " bytes of text leave too few train tokens");
  }
  std::vector<uint64_t> counts(summary.vocab_size, 0);
  for (uint64_t i = 0; i < summary.train_tokens; ++i) ++counts[spool.token(i)];

  if (options.format == "megatron") {
    for (const auto& [name, begin, end] :
         {std::tuple{"train", uint64_t{0}, summary.train_tokens},
          std::tuple{"val", summary.train_tokens, total}}) {
      if (begin == end) continue;
      TRIDENT_RETURN_IF_ERROR(check_stop(options.stop));
      const std::string prefix = (fs::path(options.out_dir) / name).string();
      const std::vector<uint64_t> docs = documents_in(doc_lengths, begin, end);
      TRIDENT_RETURN_IF_ERROR(width == 4 ? write_megatron_dataset(prefix, spool.tokens32() + begin,
                                                                  end - begin, docs)
                                         : write_megatron_dataset(prefix, spool.tokens16() + begin,
                                                                  end - begin, docs));
      uint32_t max_id = 0;
      for (uint64_t i = begin; i < end; ++i) max_id = std::max(max_id, spool.token(i));
      TRIDENT_RETURN_IF_ERROR(write_sidecar(prefix + ".bin", end - begin, max_id, record));
      (begin == 0 ? summary.train_shards : summary.val_shards).push_back(prefix + ".bin");
    }
  } else {
    const int version = width == 4 ? 7 : 1;
    ShardWriter train(options.out_dir, "train", options.shard_tokens, options.stop, record, version);
    ShardWriter val(options.out_dir, "val", options.shard_tokens, options.stop, record, version);
    for (uint64_t i = 0; i < total; ++i) {
      TRIDENT_RETURN_IF_ERROR((i < summary.train_tokens ? train : val).add(spool.token(i)));
    }
    TRIDENT_RETURN_IF_ERROR(train.flush());
    TRIDENT_RETURN_IF_ERROR(val.flush());
    summary.train_shards = train.written();
    summary.val_shards = val.written();
  }

  summary.unigram_entropy = unigram_entropy(counts);
  return summary;
}

// ---- staging: the new set is written beside out_dir and moved in only when complete ----

// ".<name>.prepare.<pid>" in the parent of out_dir: the same file system, so the files
// move into out_dir by rename.
constexpr const char* kStagingTag = ".prepare.";

struct StagingPaths {
  fs::path parent;
  std::string prefix;  // ".<name of out_dir>.prepare."
};

StagingPaths staging_paths(const std::string& out_dir) {
  fs::path out = fs::absolute(out_dir).lexically_normal();
  if (out.filename().empty()) out = out.parent_path();  // "dir/"
  std::string prefix = ".";  // appended piecewise: GCC 12 warns (-Wrestrict) on "." + s + t
  prefix += out.filename().string();
  prefix += kStagingTag;
  return {out.parent_path(), prefix};
}

// A process of that id no longer exists (or is this one, whose staging is never reused).
bool pid_is_gone(const std::string& digits) {
  if (digits.empty() || digits.size() > 9 ||
      digits.find_first_not_of("0123456789") != std::string::npos) {
    return false;
  }
  const pid_t pid = static_cast<pid_t>(std::stol(digits));
  return pid == ::getpid() || (::kill(pid, 0) != 0 && errno == ESRCH);
}

// Removes what a killed run left: its staging directory beside out_dir and, from runs
// before staging existed, a token spool inside out_dir.
void remove_dead_leftovers(const StagingPaths& staging, const std::string& out_dir) {
  for (const auto& [dir, prefix] : {std::pair{staging.parent, staging.prefix},
                                    std::pair{fs::path(out_dir), std::string(".prepare_tokens.tmp.")}}) {
    std::error_code ec;
    for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator();
         it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (name.rfind(prefix, 0) == 0 && pid_is_gone(name.substr(prefix.size()))) {
        std::error_code rm_ec;
        fs::remove_all(it->path(), rm_ec);
      }
    }
  }
}

// Removes the staging directory (and whatever is still in it) when the run ends.
class StagingGuard {
 public:
  explicit StagingGuard(fs::path dir) : dir_(std::move(dir)) {}
  ~StagingGuard() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  StagingGuard(const StagingGuard&) = delete;
  StagingGuard& operator=(const StagingGuard&) = delete;

 private:
  fs::path dir_;
};

// Moves every file of staging into out_dir (rename: replaces a file of the same name),
// then removes the shards of an earlier run that the new set does not have. SIGINT,
// SIGTERM and SIGHUP are held back meanwhile, so an interrupt cannot cut the swap short.
Status commit_staging(const fs::path& staging, const std::string& out_dir) {
  sigset_t hold, old;
  sigemptyset(&hold);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&hold, sig);
  pthread_sigmask(SIG_BLOCK, &hold, &old);
  std::set<std::string> keep;
  std::error_code ec;
  for (auto it = fs::directory_iterator(staging, ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::error_code mv_ec;
    fs::rename(it->path(), fs::path(out_dir) / name, mv_ec);
    if (mv_ec) {
      pthread_sigmask(SIG_SETMASK, &old, nullptr);
      return Status::io_error(out_dir + "/" + name + ": cannot move the new file in: " +
                              mv_ec.message());
    }
    keep.insert(name);
  }
  if (!ec) remove_stale_shards(out_dir, keep);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  if (ec) return Status::io_error(staging.string() + ": cannot list: " + ec.message());
  return Status::ok();
}

// Paths of staged files named as they are in out_dir once moved.
void rebase(const std::string& out_dir, std::vector<std::string>* paths) {
  for (std::string& path : *paths) path = (fs::path(out_dir) / fs::path(path).filename()).string();
}

}  // namespace

Result<PrepareSummary> prepare_corpus(const PrepareOptions& options) {
  TRIDENT_RETURN_IF_ERROR(validate(options));

  // Check every input before writing anything.
  PrepareSummary summary;
  summary.vocab_size = kByteVocab;
  TRIDENT_RETURN_IF_ERROR(check_inputs(options, &summary));

  // out_dir itself is created only when the new set moves in.
  const StagingPaths paths = staging_paths(options.out_dir);
  std::error_code ec;
  fs::create_directories(paths.parent, ec);
  if (ec) {
    return Status::io_error(paths.parent.string() + ": cannot create directory: " + ec.message());
  }
  remove_dead_leftovers(paths, options.out_dir);
  const fs::path staging = paths.parent / (paths.prefix + std::to_string(::getpid()));
  fs::create_directory(staging, ec);
  if (ec) {
    return Status::io_error(staging.string() + ": cannot create the staging directory: " +
                            ec.message());
  }
  StagingGuard guard(staging);

  PrepareOptions staged = options;
  staged.out_dir = staging.string();
  Result<PrepareSummary> result = options.tokenizer != "byte" || options.format != "llmc"
                                      ? prepare_tokenized(staged, std::move(summary))
                                      : prepare_bytes(staged, std::move(summary));
  if (!check_stop(options.stop).is_ok()) {
    return Status::io_error("interrupted (" + options.out_dir + " is unchanged)");
  }
  if (!result.is_ok()) return result.status();
  fs::create_directories(options.out_dir, ec);
  if (ec) {
    return Status::io_error(options.out_dir + ": cannot create directory: " + ec.message());
  }
  TRIDENT_RETURN_IF_ERROR(commit_staging(staging, options.out_dir));
  PrepareSummary done = std::move(result).value();
  rebase(options.out_dir, &done.train_shards);
  rebase(options.out_dir, &done.val_shards);
  return done;
}

}  // namespace trident
