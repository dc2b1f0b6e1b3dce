// The load-balanced chunk map of context parallelism (parallel/context_parallel.h), in one
// process; ring attention itself runs under mpirun (ring_attention_mpi_test.cpp).
#include <gtest/gtest.h>

#include <vector>

#include "parallel/context_parallel.h"

namespace trident {
namespace {

// The chunk map: every position of the sequence is held by exactly one row of one rank,
// rank r's rows are chunks r and 2 cp - 1 - r in order, and take / put are inverses.
TEST(CpChunks, TileTheSequence) {
  for (int cp : {1, 2, 3, 4, 8}) {
    const int T = 2 * cp * 5;
    std::vector<int> owner(static_cast<size_t>(T), -1);
    for (int r = 0; r < cp; ++r) {
      const CpChunks c = cp_chunks(T, cp, r);
      EXPECT_EQ(c.chunk, 5);
      for (int t = 0; t < c.rows(); ++t) {
        const int pos = c.position(t);
        EXPECT_EQ(pos / 5, t < 5 ? r : 2 * cp - 1 - r) << "cp " << cp << " rank " << r;
        EXPECT_EQ(owner[static_cast<size_t>(pos)], -1) << "position " << pos << " held twice";
        owner[static_cast<size_t>(pos)] = r;
      }
    }
    for (int o : owner) EXPECT_NE(o, -1);
    std::vector<int> global(static_cast<size_t>(2 * T * 3)), back(global.size(), -1);
    for (size_t i = 0; i < global.size(); ++i) global[i] = static_cast<int>(i);
    for (int r = 0; r < cp; ++r) {
      const CpChunks c = cp_chunks(T, cp, r);
      std::vector<int> l(static_cast<size_t>(2 * c.rows() * 3));
      take_cp_rows(global.data(), l.data(), 2, T, 3, c);
      put_cp_rows(l.data(), back.data(), 2, T, 3, c);
    }
    EXPECT_EQ(back, global) << "cp " << cp;
  }
}

TEST(CpChunksDeath, SequenceNotDivisibleByTwiceCp) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(cp_chunks(12, 4, 0), "a sequence of 12 positions cannot be cut into 2 x cp = 8");
}

}  // namespace
}  // namespace trident
