// Throughput of the start-up vocabulary check (data/token_check.h): scans a generated
// llm.c shard of uint16 and one of uint32 tokens for their largest id, from the page
// cache (the shard was just written), with every OpenMP thread.
//   bench_token_check [MiB per shard, default 512] [dir, default /tmp]
// Correctness column: the largest id found must be the one planted.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <omp.h>

#include "core/timer.h"
#include "data/dataset.h"
#include "data/token_check.h"
#include "data/token_file.h"

namespace {

using namespace trident;

// A shard of `bytes` token bytes: pseudo-random ids < 50000, one planted 50256.
bool write_shard(const std::string& path, int width, size_t bytes) {
  const size_t n = bytes / width;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return false;
  int32_t header[256] = {};
  header[0] = width == 2 ? kTokenFileMagicU16 : kTokenFileMagicU32;
  header[1] = width == 2 ? 1 : 7;
  header[2] = static_cast<int32_t>(n);
  std::fwrite(header, sizeof(header), 1, f);
  std::vector<unsigned char> chunk(1 << 20);
  uint64_t x = 88172645463325252ull, written = 0;
  while (written < n) {
    const size_t m = std::min<size_t>(chunk.size() / width, n - written);
    for (size_t i = 0; i < m; ++i) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      uint32_t id = static_cast<uint32_t>(x % 50000);
      if (written + i == n * 2 / 3) id = 50256;
      std::memcpy(chunk.data() + i * width, &id, width);  // little-endian low bytes
    }
    std::fwrite(chunk.data(), width, m, f);
    written += m;
  }
  return std::fclose(f) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  const size_t mib = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 512;
  const std::string dir = argc > 2 ? argv[2] : "/tmp";
  const int reps = 5;
  std::printf("# trident start-up token id check: %zu MiB shard from the page cache, %d OpenMP threads, %d reps after a warm-up\n",
              mib, omp_get_max_threads(), reps);
  std::printf("# first: the first scan, which also maps the pages (as at start-up); GB/s of the first and of the best\n");
  std::printf("# %-6s %8s %9s %9s %9s %8s %8s %8s %6s\n", "width", "MiB", "first_ms", "min_ms", "med_ms",
              "GB/s_1st", "GB/s", "max_id", "wrong");
  int wrong_total = 0;
  for (int width : {2, 4}) {
    const std::string path = dir + "/bench_token_check." + std::to_string(::getpid()) + ".bin";
    if (!write_shard(path, width, mib << 20)) {
      std::fprintf(stderr, "cannot write %s\n", path.c_str());
      return 1;
    }
    auto ds = TokenDataset::open(path, 1 << 30);
    if (!ds.is_ok()) {
      std::fprintf(stderr, "%s\n", ds.status().message().c_str());
      return 1;
    }
    std::vector<double> ms;
    double first_ms = 0;  // includes mapping the pages (as at start-up)
    uint32_t max_id = 0;
    for (int r = 0; r <= reps; ++r) {
      Timer t;
      auto check = check_token_ids(ds.value(), 50257);
      const double elapsed = t.elapsed_ms();
      if (!check.is_ok()) {
        std::fprintf(stderr, "%s\n", check.status().message().c_str());
        return 1;
      }
      max_id = check->max_id;
      if (r > 0) ms.push_back(elapsed);
      if (r == 0) first_ms = elapsed;
    }
    std::sort(ms.begin(), ms.end());
    const int wrong = max_id != 50256;
    wrong_total += wrong;
    const double gb = static_cast<double>(mib << 20) / 1e9;
    std::printf("  %-6s %8zu %9.1f %9.1f %9.1f %8.2f %8.2f %8u %6d\n", width == 2 ? "uint16" : "uint32",
                mib, first_ms, ms.front(), ms[ms.size() / 2], gb / (first_ms / 1e3),
                gb / (ms.front() / 1e3), max_id, wrong);
    ::unlink(path.c_str());
  }
  return wrong_total == 0 ? 0 : 1;
}
