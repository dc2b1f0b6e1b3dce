// Helpers shared by the multi-rank tests: the world communicator made by main.cpp,
// seeded per-rank inputs (nccl-tests style), and an independent, brute-force model of
// the rank grid that the topology code is checked against.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "data/token_file.h"
#include "tests/common/scratch_dir.h"

#include "comm/communicator.h"
#include "comm/topology.h"

namespace trident::test {

// The world communicator of this process (MPI under mpirun), alive for all tests. It
// serves host memory, like the trainer's world.
Communicator& world();
// The same ranks as a device-space group (comm/communicator.h "memory space"), for tests
// that hand a communicator device buffers the way dp, tp and pp groups get them.
Communicator& device_world();

// A reproducible value in [-1, 1) for (seed, rank, index): splitmix64 of the three.
inline float seeded_value(std::uint64_t seed, int rank, std::uint64_t index) {
  std::uint64_t z = seed * 0x9E3779B97F4A7C15ULL +
                    static_cast<std::uint64_t>(rank) * 0xBF58476D1CE4E5B9ULL +
                    index * 0x94D049BB133111EBULL + 0x632BE59BD9B4E019ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  z ^= z >> 31;
  return static_cast<float>(static_cast<double>(z >> 40) / static_cast<double>(1ULL << 24) * 2.0 -
                            1.0);
}

// ||a - b|| / ||b|| in double.
inline double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    num += d * d;
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

// A directory of this process, made fresh (mkdtemp) on first use and removed with
// everything in it at exit. Names made from the pid alone are not enough: a fresh machine
// hands out the same pids run after run, and a directory left by a killed earlier run
// under the same pid (a checkpoint in it, say) would change what a test sees.
inline const std::string& process_scratch_dir() {
  static const trident::testing::ScratchDir dir;
  return dir.path();
}

// Writes 20000 structured tokens ((i * mul + i / 13) % modulus) to a file of this
// process (every rank writes its own, so there are no shared-file races); returns it.
// Tests put their checkpoint directory beside it (path + ".ckpt"), so that too is new.
inline std::string write_test_tokens(const std::string& tag, uint32_t mul, uint32_t modulus) {
  const std::string path = process_scratch_dir() + "/" + tag + ".bin";
  std::vector<uint32_t> tokens(20000);
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<uint32_t>((i * mul + i / 13) % modulus);
  }
  (void)write_token_file(path, tokens, 1);
  return path;
}

// The grid enumerated in launch order (pp outermost, tp innermost), without the formula.
struct GridRank {
  int pp, dp, tp;
};
inline std::vector<GridRank> enumerate_grid(const ParallelLayout& layout) {
  std::vector<GridRank> grid;
  for (int pp = 0; pp < layout.pp; ++pp)
    for (int dp = 0; dp < layout.dp; ++dp)
      for (int tp = 0; tp < layout.tp; ++tp) grid.push_back({pp, dp, tp});
  return grid;
}

enum class GroupKind { kTp, kDp, kPp, kEmbedding };

// World ranks in the group of `rank`, ascending (= group-rank order), by brute force.
inline std::vector<int> expected_members(const ParallelLayout& layout, int rank, GroupKind kind,
                                         bool tied) {
  const std::vector<GridRank> grid = enumerate_grid(layout);
  const GridRank me = grid[rank];
  std::vector<int> members;
  if (kind == GroupKind::kEmbedding &&
      (!tied || layout.pp == 1 || (me.pp != 0 && me.pp != layout.pp - 1))) {
    return members;
  }
  for (int r = 0; r < static_cast<int>(grid.size()); ++r) {
    const GridRank g = grid[r];
    bool same = false;
    switch (kind) {
      case GroupKind::kTp:
        same = g.pp == me.pp && g.dp == me.dp;
        break;
      case GroupKind::kDp:
        same = g.pp == me.pp && g.tp == me.tp;
        break;
      case GroupKind::kPp:
        same = g.dp == me.dp && g.tp == me.tp;
        break;
      case GroupKind::kEmbedding:
        same = g.dp == me.dp && g.tp == me.tp && (g.pp == 0 || g.pp == layout.pp - 1);
        break;
    }
    if (same) members.push_back(r);
  }
  return members;
}

// Every (dp, tp, pp) with dp*tp*pp == n.
inline std::vector<ParallelLayout> all_layouts(int n) {
  std::vector<ParallelLayout> layouts;
  for (int dp = 1; dp <= n; ++dp)
    for (int tp = 1; tp <= n; ++tp)
      for (int pp = 1; pp <= n; ++pp)
        if (dp * tp * pp == n) layouts.push_back({dp, tp, pp});
  return layouts;
}

}  // namespace trident::test
