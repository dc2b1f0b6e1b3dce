#include "data/bpe_vocabularies.h"

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
  return LoadedTokenizer{std::move(bpe), static_cast<uint32_t>(id)};
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
    return LoadedTokenizer{std::move(gpt2).release(), kGpt2EndOfText};
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

namespace {

// SHA-256 over a stream of bytes, block by block (FIPS 180-4, section 6.2).
class Sha256 {
 public:
  void update(const unsigned char* p, size_t n) {
    bytes_ += n;
    while (n > 0) {
      const size_t take = std::min(n, size_t{64} - fill_);
      std::copy(p, p + take, block_.begin() + static_cast<ptrdiff_t>(fill_));
      fill_ += take;
      p += take;
      n -= take;
      if (fill_ == 64) {
        compress();
        fill_ = 0;
      }
    }
  }
  std::string hex() {
    const uint64_t bits = bytes_ * 8;
    const unsigned char pad = 0x80;
    update(&pad, 1);
    const unsigned char zero = 0;
    while (fill_ != 56) update(&zero, 1);
    unsigned char length[8];
    for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>(bits >> (56 - 8 * i));
    update(length, 8);
    std::string out;
    char buf[9];
    for (uint32_t v : h_) {
      std::snprintf(buf, sizeof(buf), "%08x", v);
      out += buf;
    }
    return out;
  }

 private:
  static uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }
  void compress() {
    static constexpr uint32_t k[64] = {
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
        0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
        0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
        0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
        0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
        0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
        0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
        0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
        0xc67178f2};
    uint32_t w[64];
    for (int i = 0; i < 16; ++i) {
      w[i] = uint32_t{block_[4 * i]} << 24 | uint32_t{block_[4 * i + 1]} << 16 |
             uint32_t{block_[4 * i + 2]} << 8 | uint32_t{block_[4 * i + 3]};
    }
    for (int i = 16; i < 64; ++i) {
      const uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      const uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h_[0], b = h_[1], c = h_[2], d = h_[3], e = h_[4], f = h_[5], g = h_[6], h = h_[7];
    for (int i = 0; i < 64; ++i) {
      const uint32_t t1 = h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + k[i] + w[i];
      const uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      h = g;
      g = f;
      f = e;
      e = d + t1;
      d = c;
      c = b;
      b = a;
      a = t1 + t2;
    }
    const uint32_t v[8] = {a, b, c, d, e, f, g, h};
    for (int i = 0; i < 8; ++i) h_[i] += v[i];
  }

  std::array<uint32_t, 8> h_ = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  std::array<unsigned char, 64> block_{};
  size_t fill_ = 0;
  uint64_t bytes_ = 0;
};

}  // namespace

Result<std::string> sha256_hex_of_files(const std::vector<std::string>& paths) {
  Sha256 sha;
  std::vector<unsigned char> buf(size_t{1} << 20);
  for (const std::string& path : paths) {
    std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
    if (!f) return Status::io_error(path + ": cannot open for reading");
    size_t n;
    while ((n = std::fread(buf.data(), 1, buf.size(), f.get())) > 0) sha.update(buf.data(), n);
    if (std::ferror(f.get())) return Status::io_error(path + ": read error");
  }
  return sha.hex();
}

}  // namespace trident
