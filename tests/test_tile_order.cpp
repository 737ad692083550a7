// The dense GEMM's tile order (src/cuda/scheduler/normal_scheduler.hpp), run on the host: FastDiv against the
// hardware division, and NormalScheduler::tile against the order written out with plain divisions, on every tile of
// shapes that cover whole and partial column-block groups, split-K and one-block edges. The GPU tests check the
// kernels that use it end to end; these catch a wrong quotient without a GPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "cuda/scheduler/normal_scheduler.hpp"

namespace finegemm::cuda {
namespace {

TEST(FastDiv, MatchesDivisionOnEdgesAndRandomNumerators) {
  std::mt19937 rng(20261203);
  std::vector<int> divisors;
  for (int d = 1; d <= 600; ++d) divisors.push_back(d);
  for (int d : {1000, 1023, 1024, 1025, 4095, 4097, 65535, 65536, 65537, 1 << 20, (1 << 20) + 7, 123456789,
                (1 << 30) - 1, 1 << 30, (1 << 30) + 1, 2147483646, 2147483647})
    divisors.push_back(d);
  std::uniform_int_distribution<int> any(0, 2147483647);
  for (int d : divisors) {
    const FastDiv f(d);
    auto check = [&](int n) { ASSERT_EQ(f.div(n), n / d) << "n=" << n << " d=" << d; };
    for (int n = 0; n < 5000; ++n) check(n);
    for (int q : {1, 2, 3, 100, 1000, 65535, 1 << 20}) {
      const int64_t base = int64_t{q} * d;
      for (int64_t n = base - 2; n <= base + 2; ++n)
        if (n >= 0 && n <= 2147483647) check(static_cast<int>(n));
    }
    for (int64_t n = 2147483647 - 3 * int64_t{d}; n <= 2147483647; n += d > 1 ? d - 1 : 1)
      if (n >= 0) check(static_cast<int>(n));
    for (int i = 0; i < 2000; ++i) check(any(rng));
  }
}

// The order as NormalScheduler wrote it before FastDiv (four divisions per tile).
TileInfo reference_tile(int t, int block_m, int m, int m_blocks, int n_blocks, int k_blocks, int split_k, int kbps) {
  constexpr int kGroupN = 16;
  const int per_split = m_blocks * n_blocks;
  TileInfo info{};
  info.split = t / per_split;
  const int r = t - info.split * per_split;
  const int span = kGroupN * m_blocks;
  const int group = r / span;
  const int first_n = group * kGroupN;
  const int group_n = std::min(kGroupN, n_blocks - first_n);
  const int in_group = r - group * span;
  info.n_block = first_n + in_group % group_n;
  info.m_row0 = (in_group / group_n) * block_m;
  info.m_end = m;
  info.kb_begin = info.split * kbps;
  info.kb_end = std::min(k_blocks, info.kb_begin + kbps);
  return info;
}

TEST(TileOrder, EveryTileAsThePlainDivisions) {
  constexpr int kBlockM = 192;
  int shapes = 0;
  for (int m : {1, 191, 192, 193, 512, 4096, 16384})
    for (int n_blocks : {1, 2, 15, 16, 17, 31, 32, 56, 192, 257})
      for (int split_k : {1, 2, 3, 7}) {
        const int m_blocks = (m + kBlockM - 1) / kBlockM, k_blocks = 9 * split_k - 1;
        const int kbps = (k_blocks + split_k - 1) / split_k;
        const auto s = NormalScheduler<kBlockM>::make(m, m_blocks, n_blocks, k_blocks, split_k, kbps);
        ASSERT_EQ(s.num_tiles(), m_blocks * n_blocks * split_k);
        std::vector<int> seen(static_cast<size_t>(s.num_tiles()), 0);
        for (int t = 0; t < s.num_tiles(); ++t) {
          const TileInfo got = s.tile(t);
          const TileInfo want = reference_tile(t, kBlockM, m, m_blocks, n_blocks, k_blocks, split_k, kbps);
          ASSERT_EQ(got.split, want.split) << "t=" << t;
          ASSERT_EQ(got.n_block, want.n_block) << "t=" << t << " m=" << m << " n_blocks=" << n_blocks;
          ASSERT_EQ(got.m_row0, want.m_row0) << "t=" << t << " m=" << m << " n_blocks=" << n_blocks;
          ASSERT_EQ(got.m_end, m);
          ASSERT_EQ(got.group, 0);
          ASSERT_EQ(got.kb_begin, want.kb_begin);
          ASSERT_EQ(got.kb_end, want.kb_end);
          // Every (split, m block, n block) exactly once.
          const int m_block = got.m_row0 / kBlockM;
          ASSERT_LT(m_block, m_blocks);
          ASSERT_LT(got.n_block, n_blocks);
          ++seen[static_cast<size_t>((got.split * m_blocks + m_block) * n_blocks + got.n_block)];
        }
        for (int v : seen) ASSERT_EQ(v, 1);
        // Past the last tile: no K blocks (the producer's cursors stop there).
        const TileInfo past = s.tile(s.num_tiles());
        EXPECT_GE(past.kb_begin, past.kb_end);
        ++shapes;
      }
  EXPECT_EQ(shapes, 7 * 10 * 4);
}

}  // namespace
}  // namespace finegemm::cuda
