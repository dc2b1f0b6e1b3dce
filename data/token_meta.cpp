#include "data/token_meta.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <system_error>

#include <nlohmann/json.hpp>

namespace trident {

namespace fs = std::filesystem;

nlohmann::ordered_json tokenizer_record_to_json(const TokenizerRecord& r) {
  nlohmann::ordered_json t = {{"name", r.name}};
  if (!r.sha256.empty()) t["sha256"] = r.sha256;
  t["vocab_size"] = r.vocab_size;
  if (r.document_token >= 0) t["document_token"] = r.document_token;
  if (!r.pattern.empty()) t["pattern"] = r.pattern;
  return t;
}

std::optional<TokenizerRecord> tokenizer_record_from_json(const nlohmann::json& t) {
  if (!t.is_object()) return std::nullopt;
  auto name = t.find("name"), sha = t.find("sha256"), vocab = t.find("vocab_size"),
       doc = t.find("document_token"), pattern = t.find("pattern");
  if (name == t.end() || !name->is_string() || vocab == t.end() ||
      !vocab->is_number_unsigned() || vocab->get<uint64_t>() > (uint64_t{1} << 32) ||
      (sha != t.end() && !sha->is_string()) ||
      (doc != t.end() && !doc->is_number_unsigned()) ||
      (pattern != t.end() && !pattern->is_string())) {
    return std::nullopt;
  }
  TokenizerRecord r;
  r.name = name->get<std::string>();
  r.vocab_size = vocab->get<int64_t>();
  if (sha != t.end()) r.sha256 = sha->get<std::string>();
  if (doc != t.end()) r.document_token = doc->get<int64_t>();
  if (pattern != t.end()) r.pattern = pattern->get<std::string>();
  return r;
}

std::string token_meta_path(const std::string& shard_path) {
  return shard_path + kTokenMetaSuffix;
}

Status write_token_meta(const std::string& shard_path, const TokenFileMeta& meta) {
  const std::string path = token_meta_path(shard_path);
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  nlohmann::ordered_json j = {
      {"tokens", meta.tokens}, {"max_id", meta.max_id}, {"bytes", meta.bytes}};
  if (meta.tokenizer) j["tokenizer"] = tokenizer_record_to_json(*meta.tokenizer);
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << j.dump() << "\n";
    if (!out.flush()) {
      std::error_code ec;
      fs::remove(tmp, ec);
      return Status::io_error(path + ": cannot write token sidecar");
    }
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    return Status::io_error(path + ": cannot rename the token sidecar into place: " +
                            ec.message());
  }
  return Status::ok();
}

std::optional<TokenFileMeta> read_token_meta(const TokenFile& file) {
  const std::string path = token_meta_path(file.path());
  std::error_code ec;
  const auto meta_time = fs::last_write_time(path, ec);
  if (ec) return std::nullopt;  // absent (the usual case for shards from elsewhere)
  const auto shard_time = fs::last_write_time(file.path(), ec);
  if (ec || meta_time < shard_time) return std::nullopt;

  std::ifstream in(path, std::ios::binary);
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return std::nullopt;
  auto field = [&](const char* key, uint64_t* out) {
    auto it = j.find(key);
    if (it == j.end() || !it->is_number_unsigned()) return false;
    *out = it->get<uint64_t>();
    return true;
  };
  uint64_t tokens = 0, max_id = 0, bytes = 0;
  if (!field("tokens", &tokens) || !field("max_id", &max_id) || !field("bytes", &bytes)) {
    return std::nullopt;
  }
  if (tokens != file.num_tokens() || bytes != file.file_bytes() ||
      max_id > std::numeric_limits<uint32_t>::max()) {
    return std::nullopt;
  }
  TokenFileMeta meta{tokens, static_cast<uint32_t>(max_id), bytes, std::nullopt};
  if (auto t = j.find("tokenizer"); t != j.end()) {
    meta.tokenizer = tokenizer_record_from_json(*t);
    if (!meta.tokenizer) return std::nullopt;
  }
  return meta;
}

}  // namespace trident
