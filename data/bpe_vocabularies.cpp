#include "data/bpe_vocabularies.h"

#include <openssl/evp.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <utility>
#include <vector>

#include "data/bpe_hf_tokenizer.h"
#include "data/gpt2_tokenizer.h"

namespace trident {

namespace {

struct NamedVocabulary {
  const char* name;
  BpePattern pattern;
  size_t ranks;            // lines of <name>.tiktoken
  const char* document;    // the special token placed before each document
};

constexpr NamedVocabulary kNamed[] = {
    {"cl100k_base", BpePattern::kCl100k, 100256, "<|endoftext|>"},
    {"o200k_base", BpePattern::kO200k, 199998, "<|endoftext|>"},
    {"llama3", BpePattern::kLlama3, 128000, "<|begin_of_text|>"},
};

// tiktoken_ext/openai_public.py's special tokens; Llama 3.1's from Meta's tokenizer.py
// (the same ids as Llama 3's; 3.1 named four of the reserved ones).
std::vector<BpeSpecialToken> named_specials(BpePattern pattern) {
  switch (pattern) {
    case BpePattern::kCl100k:
      return {{"<|endoftext|>", 100257}, {"<|fim_prefix|>", 100258}, {"<|fim_middle|>", 100259},
              {"<|fim_suffix|>", 100260}, {"<|endofprompt|>", 100276}};
    case BpePattern::kO200k:
      return {{"<|endoftext|>", 199999}, {"<|endofprompt|>", 200018}};
    case BpePattern::kLlama3: {
      std::vector<BpeSpecialToken> s;
      for (const char* t : {"<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                            "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>",
                            "<|reserved_special_token_2|>", "<|start_header_id|>",
                            "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"}) {
        s.push_back({t, static_cast<uint32_t>(128000 + s.size())});
      }
      for (int i = 3; s.size() < 256; ++i) {
        s.push_back({"<|reserved_special_token_" + std::to_string(i) + "|>",
                     static_cast<uint32_t>(128000 + s.size())});
      }
      return s;
    }
    case BpePattern::kGpt2:
      break;
  }
  return {};
}

const NamedVocabulary* find_named(const std::string& name) {
  for (const NamedVocabulary& v : kNamed) {
    if (name == v.name) return &v;
  }
  return nullptr;
}

Result<LoadedTokenizer> with_document_token(BpeTokenizer bpe, const std::string& document) {
  const int64_t id = bpe.special_id(document);
  if (id < 0) return Status::internal(bpe.name() + ": no special token " + document);
  return LoadedTokenizer{std::move(bpe), static_cast<uint32_t>(id), {}, {}};
}

}  // namespace

bool is_named_vocabulary(const std::string& spec) {
  return spec == "gpt2" || find_named(spec) != nullptr;
}

namespace {

Result<LoadedTokenizer> load_bpe(const std::string& spec, const std::string& dir,
                                 const std::string& pattern, std::vector<std::string>* files) {
  if (is_named_vocabulary(spec) && !pattern.empty()) {
    return Status::invalid_config("--tokenizer-pattern: only for a rank file; " + spec +
                                  " has its own pattern");
  }
  if (spec == "gpt2") {
    TRIDENT_ASSIGN_OR_RETURN(Gpt2Tokenizer gpt2, Gpt2Tokenizer::load_dir(dir));
    *files = {dir + "/encoder.json", dir + "/vocab.bpe"};
    return LoadedTokenizer{std::move(gpt2).release(), kGpt2EndOfText, {}, {}};
  }
  if (const NamedVocabulary* named = find_named(spec)) {
    const std::string path = dir + "/" + spec + ".tiktoken";
    *files = {path};
    TRIDENT_ASSIGN_OR_RETURN(BpeTokenizer bpe, BpeTokenizer::load_tiktoken(
                                                   path, named->pattern,
                                                   named_specials(named->pattern)));
    return with_document_token(std::move(bpe), named->document);
  }
  *files = {spec};
  if (is_hf_tokenizer_spec(spec)) {
    if (!pattern.empty()) {
      return Status::invalid_config("--tokenizer-pattern: only for a rank file; " + spec +
                                    " declares its pre-tokenizer");
    }
    return load_hf_tokenizer(spec);
  }
  if (pattern.empty()) {
    return Status::invalid_config("--tokenizer " + spec +
                                  ": a rank file needs --tokenizer-pattern gpt2|cl100k|o200k|llama3 "
                                  "(the file does not say which)");
  }
  TRIDENT_ASSIGN_OR_RETURN(BpePattern p, parse_bpe_pattern(pattern));
  TRIDENT_ASSIGN_OR_RETURN(std::vector<std::string> tokens, read_tiktoken_ranks(spec));
  const size_t ranks = tokens.size();
  for (const NamedVocabulary& v : kNamed) {
    if (v.pattern == p && v.ranks == ranks) {
      TRIDENT_ASSIGN_OR_RETURN(BpeTokenizer bpe,
                               BpeTokenizer::create(spec, std::move(tokens), p,
                                                    BpeMergeRule::kTiktoken, {}, named_specials(p)));
      return with_document_token(std::move(bpe), v.document);
    }
  }
  TRIDENT_ASSIGN_OR_RETURN(
      BpeTokenizer bpe,
      BpeTokenizer::create(spec, std::move(tokens), p, BpeMergeRule::kTiktoken, {},
                           {{"<|endoftext|>", static_cast<uint32_t>(ranks)}}));
  return with_document_token(std::move(bpe), "<|endoftext|>");
}

}  // namespace

Result<LoadedTokenizer> load_vocabulary(const std::string& spec, const std::string& dir,
                                        const std::string& pattern) {
  std::vector<std::string> files;
  TRIDENT_ASSIGN_OR_RETURN(LoadedTokenizer loaded, load_bpe(spec, dir, pattern, &files));
  // A path is recorded absolute: the data's sidecars must name the file wherever they go.
  loaded.spec = is_named_vocabulary(spec)
                    ? spec
                    : std::filesystem::absolute(spec).lexically_normal().string();
  TRIDENT_ASSIGN_OR_RETURN(loaded.sha256, sha256_hex_of_files(files));
  return loaded;
}

// SHA-256 through OpenSSL's EVP digest (libcrypto).
Result<std::string> sha256_hex_of_files(const std::vector<std::string>& paths) {
  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> ctx(EVP_MD_CTX_new(), &EVP_MD_CTX_free);
  if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1) {
    return Status::internal("SHA-256: OpenSSL could not start a digest");
  }
  std::vector<unsigned char> buf(size_t{1} << 20);
  for (const std::string& path : paths) {
    std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
    if (!f) return Status::io_error(path + ": cannot open for reading");
    size_t n;
    while ((n = std::fread(buf.data(), 1, buf.size(), f.get())) > 0) {
      EVP_DigestUpdate(ctx.get(), buf.data(), n);
    }
    if (std::ferror(f.get())) return Status::io_error(path + ": read error");
  }
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx.get(), digest, &len);
  std::string out;
  char hex[3];
  for (unsigned int i = 0; i < len; ++i) {
    std::snprintf(hex, sizeof(hex), "%02x", digest[i]);
    out += hex;
  }
  return out;
}

}  // namespace trident
