// Tokenizer throughput: MB of text per second through sanitize_utf8 +
// BpeTokenizer::encode_parallel, one document (file) at a time as `trident prepare`
// does, at each thread count, for one vocabulary (--tokenizer: gpt2, cl100k_base,
// o200k_base, llama3, data/bpe_vocabularies.h; default gpt2). Columns:
//   threads   OpenMP threads for encode_parallel
//   MB        input bytes (10^6) encoded per repetition
//   tokens    ids produced
//   best_s    fastest of --reps repetitions (the first one warms the piece cache; a
//             fresh cache is what prepare sees, so the cold run is reported too)
//   cold_MB/s MB / the first repetition's seconds
//   MB/s      MB / best_s
//   wrong     ids that differ from the 1-thread serial encode() (must be 0)
// Prints a '#' header and a fixed-width table.
//
//   build/bench/bench_tokenizer [--tokenizer NAME] --vocab-dir DIR [--threads 1,2] [--reps N]
//                               FILE...
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "data/bpe_vocabularies.h"

namespace {

using trident::load_vocabulary;

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(std::atoi(item.c_str()));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string vocab_dir;
  std::string name = "gpt2";
  std::vector<int> thread_counts = {1, 2};
  int reps = 3;
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--tokenizer" && i + 1 < argc) {
      name = argv[++i];
    } else if (a == "--vocab-dir" && i + 1 < argc) {
      vocab_dir = argv[++i];
    } else if (a == "--threads" && i + 1 < argc) {
      thread_counts = parse_list(argv[++i]);
    } else if (a == "--reps" && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else {
      files.push_back(a);
    }
  }
  if (vocab_dir.empty() || files.empty()) {
    std::fprintf(stderr, "usage: bench_tokenizer [--tokenizer NAME] --vocab-dir DIR [--threads 1,2] "
                         "[--reps N] FILE...\n");
    return 2;
  }
  auto tokenizer = load_vocabulary(name, vocab_dir, "");
  if (!tokenizer.is_ok()) {
    std::fprintf(stderr, "bench_tokenizer: %s\n", tokenizer.status().message().c_str());
    return 2;
  }
  std::vector<std::string> raw;
  size_t bytes = 0;
  for (const std::string& f : files) {
    std::ifstream in(f, std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "bench_tokenizer: %s: cannot open\n", f.c_str());
      return 2;
    }
    std::ostringstream ss;
    ss << in.rdbuf();
    raw.push_back(ss.str());
    bytes += raw.back().size();
  }
  std::vector<uint32_t> reference;
  for (const std::string& r : raw) {
    std::string text;
    trident::sanitize_utf8(r, &text);
    tokenizer->bpe.encode(text, &reference);
  }

  std::printf("# %s tokenizer: %zu files, %.2f MB, %zu tokens (%.2f bytes/token)\n",
              name.c_str(), files.size(), bytes / 1e6, reference.size(),
              static_cast<double>(bytes) / reference.size());
  std::printf("# %7s %8s %10s %8s %10s %8s %6s\n", "threads", "MB", "tokens", "best_s",
              "cold_MB/s", "MB/s", "wrong");
  for (int threads : thread_counts) {
    // A fresh tokenizer per thread count, so the first repetition has a cold cache.
    auto fresh = load_vocabulary(name, vocab_dir, "");
    double best = 1e30, cold = 0;
    std::vector<uint32_t> ids;
    for (int r = 0; r < reps; ++r) {
      ids.clear();
      const auto start = std::chrono::steady_clock::now();
      std::string text;
      for (const std::string& doc : raw) {
        text.clear();
        trident::sanitize_utf8(doc, &text);
        fresh->bpe.encode_parallel(text, threads, &ids);
      }
      const double s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (r == 0) cold = s;
      best = std::min(best, s);
    }
    size_t wrong = ids.size() > reference.size() ? ids.size() - reference.size()
                                                 : reference.size() - ids.size();
    for (size_t i = 0; i < std::min(ids.size(), reference.size()); ++i) {
      wrong += ids[i] != reference[i];
    }
    std::printf("  %7d %8.2f %10zu %8.3f %10.2f %8.2f %6zu\n", threads, bytes / 1e6, ids.size(),
                best, bytes / 1e6 / cold, bytes / 1e6 / best, wrong);
  }
  return 0;
}
