// `trident prepare --input FILES... --out DIR --tokenizer SPEC [--format llmc|megatron]
//                  [--val-fraction F] [--shard-tokens N] [--vocab-dir DIR]
//                  [--tokenizer-pattern P] [--allow-special] [--threads N]`
// SPEC: byte, gpt2, cl100k_base, o200k_base, llama3, the path of a tiktoken rank file
// (with --tokenizer-pattern gpt2|cl100k|o200k|llama3) or of a Hugging Face tokenizer.json.
// --allow-special: special-token text in a document becomes the special id. Parses the
// flags, runs prepare_corpus (data/prepare.h) and prints a summary; progress lines go to
// stderr every few seconds. The vocabulary's files are looked up in --vocab-dir, else for gpt2
// $TRIDENT_GPT2_DIR, else the .cache/gpt2 that scripts/fetch_gpt2_vocab.sh fills, and for
// cl100k_base, o200k_base and llama3 $TRIDENT_VOCAB_DIR, else the .cache/vocab that
// scripts/fetch_vocabs.sh fills, in the source tree. Exit 0 on success, 2 on bad usage or
// unreadable input, 1 on a write failure, 128 + the signal number after SIGINT, SIGTERM or
// SIGHUP (the output directory is left as it was and the partial files are removed).
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "data/bpe_vocabularies.h"
#include "data/prepare.h"

namespace trident {

namespace {

void print_prepare_usage(std::FILE* to = stderr) {
  std::fprintf(to,
               "usage: trident prepare --input FILES... --out DIR --tokenizer SPEC\n"
               "         SPEC: byte | gpt2 | cl100k_base | o200k_base | llama3 | PATH.tiktoken |\n"
               "               PATH/tokenizer.json (Hugging Face, byte-level BPE)\n"
               "                       [--format llmc|megatron (default llmc)]\n"
               "                       [--val-fraction F (default 0.05)]\n"
               "                       [--shard-tokens N (default 100000000; llmc)]\n"
               "                       [--vocab-dir DIR (gpt2: default $TRIDENT_GPT2_DIR,\n"
               "                        else %s;\n"
               "                        cl100k_base, o200k_base, llama3: default\n"
               "                        $TRIDENT_VOCAB_DIR, else %s)]\n"
               "                       [--tokenizer-pattern gpt2|cl100k|o200k|llama3\n"
               "                        (a rank file PATH: its pre-tokenizer)]\n"
               "                       [--allow-special (special-token text becomes the\n"
               "                        special id; default: ordinary text)]\n"
               "                       [--threads N (BPE; default all cores)]\n",
               TRIDENT_DEFAULT_GPT2_DIR, TRIDENT_DEFAULT_VOCAB_DIR);
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

bool parse_int(const std::string& s, int* out) {
  if (s.empty() || s[0] == '-') return false;
  char* end = nullptr;
  const long v = std::strtol(s.c_str(), &end, 10);
  *out = static_cast<int>(v);
  return end != nullptr && *end == '\0' && v > 0 && v <= 4096;
}

bool parse_u64(const std::string& s, uint64_t* out) {
  if (s.empty() || s[0] == '-') return false;
  char* end = nullptr;
  *out = std::strtoull(s.c_str(), &end, 10);
  return end != nullptr && *end == '\0';
}

std::atomic<bool> g_stop{false};
std::atomic<int> g_stop_signal{0};

void on_stop_signal(int sig) {
  g_stop_signal.store(sig);
  g_stop.store(true);
}

// SIGINT, SIGTERM and SIGHUP ask prepare_corpus to stop and clean up; an inherited
// ignore (nohup) is kept.
void install_stop_handlers() {
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction old {};
    if (sigaction(sig, nullptr, &old) == 0 && old.sa_handler == SIG_IGN) continue;
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(sig, &sa, nullptr);
  }
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
      if (!value(&options.tokenizer)) {
        return usage_error("--tokenizer needs byte, gpt2, cl100k_base, o200k_base, llama3, a "
                           "rank file path or a tokenizer.json path");
      }
      have_tokenizer = true;
    } else if (flag == "--val-fraction") {
      if (!value(&v) || !parse_double(v, &options.val_fraction)) {
        return usage_error("--val-fraction needs a number in [0, 1)");
      }
    } else if (flag == "--shard-tokens") {
      if (!value(&v) || !parse_u64(v, &options.shard_tokens) || options.shard_tokens == 0) {
        return usage_error("--shard-tokens needs a positive integer");
      }
    } else if (flag == "--format") {
      if (!value(&options.format)) return usage_error("--format needs llmc or megatron");
    } else if (flag == "--vocab-dir") {
      if (!value(&options.vocab_dir)) return usage_error("--vocab-dir needs a directory");
    } else if (flag == "--tokenizer-pattern") {
      if (!value(&options.tokenizer_pattern)) {
        return usage_error("--tokenizer-pattern needs gpt2, cl100k, o200k or llama3");
      }
    } else if (flag == "--allow-special") {
      options.allow_special = true;
    } else if (flag == "--threads") {
      if (!value(&v) || !parse_int(v, &options.threads)) {
        return usage_error("--threads needs an integer in [1, 4096]");
      }
    } else {
      return usage_error("unknown option '" + flag + "'");
    }
  }
  if (options.inputs.empty()) return usage_error("missing --input FILES...");
  if (options.out_dir.empty()) return usage_error("missing --out DIR");
  if (!have_tokenizer) return usage_error("missing --tokenizer SPEC");
  const bool gpt2 = options.tokenizer == "gpt2";
  if (is_named_vocabulary(options.tokenizer) && options.vocab_dir.empty()) {
    const char* env = std::getenv(gpt2 ? "TRIDENT_GPT2_DIR" : "TRIDENT_VOCAB_DIR");
    options.vocab_dir = env != nullptr && *env != '\0'
                            ? env
                            : (gpt2 ? TRIDENT_DEFAULT_GPT2_DIR : TRIDENT_DEFAULT_VOCAB_DIR);
    const std::string file = options.vocab_dir + (gpt2 ? "/encoder.json" : "/" + options.tokenizer + ".tiktoken");
    std::error_code ec;
    if (!std::filesystem::exists(file, ec)) {
      std::fprintf(stderr,
                   "trident prepare: %s tokenizer files not found: %s (run scripts/%s, or pass "
                   "--vocab-dir DIR or set %s)\n",
                   gpt2 ? "GPT-2" : options.tokenizer.c_str(), file.c_str(),
                   gpt2 ? "fetch_gpt2_vocab.sh" : "fetch_vocabs.sh",
                   gpt2 ? "TRIDENT_GPT2_DIR" : "TRIDENT_VOCAB_DIR");
      return 2;
    }
  }
  options.progress = true;
  options.stop = &g_stop;
  install_stop_handlers();

  Result<PrepareSummary> result = prepare_corpus(options);
  if (!result.is_ok()) {
    std::fprintf(stderr, "trident prepare: %s\n", result.status().message().c_str());
    return g_stop.load() ? 128 + g_stop_signal.load() : result.status().exit_code();
  }
  const PrepareSummary& s = result.value();
  std::printf("prepared %s (tokenizer %s, vocab %lld, format %s)\n", options.out_dir.c_str(),
              options.tokenizer.c_str(), static_cast<long long>(s.vocab_size),
              options.format.c_str());
  std::printf("files: %llu\n", static_cast<unsigned long long>(s.files));
  if (s.documents > 0) {
    std::printf("documents: %llu\n", static_cast<unsigned long long>(s.documents));
  }
  if (s.utf8_replacements > 0) {
    std::printf("invalid UTF-8 replaced by U+FFFD: %llu\n",
                static_cast<unsigned long long>(s.utf8_replacements));
  }
  std::printf("bytes: %llu\n", static_cast<unsigned long long>(s.bytes));
  std::printf("train tokens: %llu in %zu shard(s)\n",
              static_cast<unsigned long long>(s.train_tokens), s.train_shards.size());
  std::printf("val tokens: %llu in %zu shard(s)\n", static_cast<unsigned long long>(s.val_tokens),
              s.val_shards.size());
  std::printf("unigram entropy: %.4f nats/token\n", s.unigram_entropy);
  return 0;
}

}  // namespace trident
