// `trident prepare --input FILES... --out DIR --tokenizer byte|gpt2
//                  [--val-fraction F] [--shard-tokens N]`
// Parses the flags, runs prepare_corpus (data/prepare.h) and prints a summary. Exit 0 on
// success, 2 on bad usage or unreadable input, 1 on a write failure.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "data/prepare.h"
#include "trainer/commands.h"

namespace trident {

namespace {

void print_prepare_usage(std::FILE* to = stderr) {
  std::fprintf(to,
               "usage: trident prepare --input FILES... --out DIR --tokenizer byte|gpt2\n"
               "                       [--val-fraction F (default 0.05)]\n"
               "                       [--shard-tokens N (default 100000000)]\n");
}

int usage_error(const std::string& message) {
  std::fprintf(stderr, "trident prepare: %s\n", message.c_str());
  print_prepare_usage();
  return 2;
}

bool parse_double(const std::string& s, double* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  *out = std::strtod(s.c_str(), &end);
  return end != nullptr && *end == '\0';
}

bool parse_u64(const std::string& s, uint64_t* out) {
  if (s.empty() || s[0] == '-') return false;
  char* end = nullptr;
  *out = std::strtoull(s.c_str(), &end, 10);
  return end != nullptr && *end == '\0';
}

}  // namespace

int cmd_prepare(const std::vector<std::string>& args) {
  PrepareOptions options;
  bool have_tokenizer = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& flag = args[i];
    auto value = [&](std::string* out) {
      if (i + 1 >= args.size() || args[i + 1].rfind("--", 0) == 0) return false;
      *out = args[++i];
      return true;
    };
    std::string v;
    if (flag == "--help" || flag == "-h") {
      print_prepare_usage(stdout);
      return 0;
    } else if (flag == "--input") {
      while (i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0) {
        options.inputs.push_back(args[++i]);
      }
      if (options.inputs.empty()) return usage_error("--input needs at least one file");
    } else if (flag == "--out") {
      if (!value(&options.out_dir)) return usage_error("--out needs a directory");
    } else if (flag == "--tokenizer") {
      if (!value(&options.tokenizer)) return usage_error("--tokenizer needs byte or gpt2");
      have_tokenizer = true;
    } else if (flag == "--val-fraction") {
      if (!value(&v) || !parse_double(v, &options.val_fraction)) {
        return usage_error("--val-fraction needs a number in [0, 1)");
      }
    } else if (flag == "--shard-tokens") {
      if (!value(&v) || !parse_u64(v, &options.shard_tokens) || options.shard_tokens == 0) {
        return usage_error("--shard-tokens needs a positive integer");
      }
    } else {
      return usage_error("unknown option '" + flag + "'");
    }
  }
  if (options.inputs.empty()) return usage_error("missing --input FILES...");
  if (options.out_dir.empty()) return usage_error("missing --out DIR");
  if (!have_tokenizer) return usage_error("missing --tokenizer byte|gpt2");

  Result<PrepareSummary> result = prepare_corpus(options);
  if (!result.is_ok()) {
    std::fprintf(stderr, "trident prepare: %s\n", result.status().message().c_str());
    return result.status().exit_code();
  }
  const PrepareSummary& s = result.value();
  std::printf("prepared %s (tokenizer %s, vocab %lld)\n", options.out_dir.c_str(),
              options.tokenizer.c_str(), static_cast<long long>(s.vocab_size));
  std::printf("files: %llu\n", static_cast<unsigned long long>(s.files));
  std::printf("bytes: %llu\n", static_cast<unsigned long long>(s.bytes));
  std::printf("train tokens: %llu in %zu shard(s)\n",
              static_cast<unsigned long long>(s.train_tokens), s.train_shards.size());
  std::printf("val tokens: %llu in %zu shard(s)\n", static_cast<unsigned long long>(s.val_tokens),
              s.val_shards.size());
  std::printf("unigram entropy: %.4f nats/token\n", s.unigram_entropy);
  return 0;
}

}  // namespace trident
