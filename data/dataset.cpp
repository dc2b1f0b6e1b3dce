#include "data/dataset.h"

#include <glob.h>

#include <algorithm>
#include <filesystem>
#include <optional>
#include <set>
#include <string_view>
#include <system_error>

#include "data/megatron_file.h"
#include "data/token_meta.h"

namespace trident {

namespace {

bool exists(const std::string& path) {
  std::error_code ec;
  return std::filesystem::exists(path, ec);
}

// The Megatron prefix a resolved path names (see dataset.h), or nullopt for an llm.c shard.
std::optional<std::string> megatron_prefix(const std::string& path) {
  const std::string_view p(path);
  if (p.ends_with(".idx")) return path.substr(0, path.size() - 4);
  if (p.ends_with(".bin") && exists(path.substr(0, path.size() - 4) + ".idx")) {
    return path.substr(0, path.size() - 4);
  }
  return std::nullopt;
}

// X.idx stands for its dataset X, which the stream names by X.bin: a glob matching both
// files of a pair yields the dataset once.
std::vector<std::string> megatron_pairs_once(const std::vector<std::string>& paths) {
  std::vector<std::string> out;
  std::set<std::string> seen;
  for (const std::string& path : paths) {
    std::string name = path;
    if (std::string_view(path).ends_with(".idx")) name = path.substr(0, path.size() - 4) + ".bin";
    if (seen.insert(name).second) out.push_back(std::move(name));
  }
  return out;
}

bool has_glob_chars(const std::string& s) {
  return s.find_first_of("*?[") != std::string::npos;
}

Result<std::vector<std::string>> glob_files(const std::string& pattern) {
  glob_t g{};
  int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> out;
  if (rc == 0) {
    for (size_t i = 0; i < g.gl_pathc; ++i) {
      std::error_code ec;
      // Directories that happen to match are not shards, nor are shard sidecars
      // (`data/train_*` matches train_000000.bin.meta.json too).
      if (std::filesystem::is_directory(g.gl_pathv[i], ec)) continue;
      if (std::string_view(g.gl_pathv[i]).ends_with(kTokenMetaSuffix)) continue;
      out.emplace_back(g.gl_pathv[i]);
    }
  }
  ::globfree(&g);
  if (rc != 0 && rc != GLOB_NOMATCH) {
    return Status::invalid_input(pattern + ": glob failed (" +
                                 (rc == GLOB_ABORTED ? std::string("read error")
                                                     : std::string("out of memory")) + ")");
  }
  if (out.empty()) return Status::invalid_input(pattern + ": no token files match this glob");
  std::sort(out.begin(), out.end());  // glob sorts by locale; make it bytewise
  return megatron_pairs_once(out);
}

Result<std::vector<std::string>> directory_files(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator(dir, ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    std::error_code type_ec;
    if (it->path().extension() == ".bin" && it->is_regular_file(type_ec)) {
      out.push_back(it->path().string());
    }
  }
  if (ec) return Status::invalid_input(dir + ": cannot list directory: " + ec.message());
  if (out.empty()) return Status::invalid_input(dir + ": no *.bin token files in this directory");
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

Result<std::vector<std::string>> resolve_token_files(const std::string& spec) {
  if (spec.empty()) return Status::invalid_input("empty data path");
  std::error_code ec;
  if (std::filesystem::is_directory(spec, ec)) return directory_files(spec);
  if (has_glob_chars(spec) && !std::filesystem::exists(spec, ec)) return glob_files(spec);
  if (!std::filesystem::exists(spec, ec)) {
    if (exists(spec + ".idx")) return std::vector<std::string>{spec + ".bin"};  // a prefix
    return Status::invalid_input(spec + ": no such token file, directory or Megatron prefix");
  }
  return megatron_pairs_once({spec});
}

Result<TokenDataset> TokenDataset::open(const std::string& spec, int64_t vocab_size) {
  if (vocab_size <= 0) {
    return Status::invalid_config(spec + ": vocab size must be positive, got " +
                                  std::to_string(vocab_size));
  }
  TRIDENT_ASSIGN_OR_RETURN(std::vector<std::string> paths, resolve_token_files(spec));
  TokenDataset ds;
  ds.spec_ = spec;
  ds.vocab_size_ = vocab_size;
  ds.files_.reserve(paths.size());
  for (const std::string& path : paths) {
    const std::optional<std::string> prefix = megatron_prefix(path);
    TRIDENT_ASSIGN_OR_RETURN(TokenFile file,
                             prefix ? open_megatron_dataset(*prefix) : TokenFile::open(path));
    ds.offsets_.push_back(ds.offsets_.back() + file.num_tokens());
    ds.files_.push_back(std::move(file));
  }
  return ds;
}

Status TokenDataset::read(uint64_t start, size_t count, int32_t* out) const {
  const uint64_t total = num_tokens();
  if (start > total || count > total - start) {
    return Status::invalid_input(spec_ + ": read of tokens [" + std::to_string(start) + ", " +
                                 std::to_string(start + count) + ") past the end of the stream (" +
                                 std::to_string(total) + " tokens)");
  }
  // The shard holding `start`: the last one whose first token is <= start.
  size_t f = static_cast<size_t>(std::upper_bound(offsets_.begin(), offsets_.end(), start) -
                                 offsets_.begin()) - 1;
  uint32_t buffer[4096];
  size_t done = 0;
  while (done < count) {
    while (offsets_[f + 1] <= start + done) ++f;  // skips empty shards too
    const TokenFile& file = files_[f];
    const uint64_t in_file = start + done - offsets_[f];
    const size_t n = static_cast<size_t>(
        std::min<uint64_t>({count - done, file.num_tokens() - in_file, std::size(buffer)}));
    file.copy(in_file, n, buffer);
    for (size_t i = 0; i < n; ++i) {
      if (static_cast<int64_t>(buffer[i]) >= vocab_size_) {
        return Status::invalid_input(file.path() + ": token at position " +
                                     std::to_string(in_file + i) + " has id " +
                                     std::to_string(buffer[i]) + " >= vocab size " +
                                     std::to_string(vocab_size_));
      }
      out[done + i] = static_cast<int32_t>(buffer[i]);
    }
    done += n;
  }
  return Status::ok();
}

}  // namespace trident
