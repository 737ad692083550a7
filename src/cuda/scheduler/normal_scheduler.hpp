// The dense GEMM's tile order (NormalScheduler) in host/device code, with its divisions by run-time divisors done as
// a multiply-high and a shift (FastDiv), so that the CPU tests check the order on every tile
// (tests/test_tile_order.cpp) and the kernel's tile change costs a few instructions, not four integer divisions.
// NOTE: stop 32's profile of the 192x128 kernel at M = 4096 N = 32768 K = 512 (ncu source counters): tile(t)'s four
// divisions were ~130 of a consumer warp's ~700 instructions per tile, one dependent chain through MUFU.RCP and
// R2UR on the path from a tile's last store to the next tile's first wgmma.
#pragma once
#include <cstdint>

#include "core/formats.hpp"

namespace finegemm::cuda {

struct TileInfo {
  int m_row0;    // first row of A (and of the output) in this tile
  int m_end;     // rows ≥ m_end belong to another group or are past M: loaded, never stored
  int n_block;   // column block
  int group;     // expert (0 for a plain GEMM)
  int split;     // split-K index (0 when not split)
  int kb_begin;  // first K block (of 128)
  int kb_end;    // one past the last
};

// n / d for 0 ≤ n < 2^31 and a divisor 1 ≤ d < 2^31 fixed on the host: q = (umulhi(n, mul) + n) >> shift with
// shift = ceil(log2 d) and mul = floor(2^32 · (2^shift - d) / d) + 1 (the round-up method of Granlund and
// Montgomery; n < 2^31 keeps the sum inside 32 bits). d = 1 and powers of two take mul = 1: umulhi(n, 1) = 0.
struct FastDiv {
  uint32_t mul = 1;
  uint32_t shift = 0;
  int d = 1;

  FastDiv() = default;
  explicit FastDiv(int divisor) : d(divisor) {
    while ((uint64_t{1} << shift) < static_cast<uint64_t>(divisor)) ++shift;
    mul = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << shift) - static_cast<uint64_t>(divisor))) /
                                    static_cast<uint64_t>(divisor) +
                                1);
  }
  FG_HD int div(int n) const {
#if defined(__CUDA_ARCH__)
    const uint32_t hi = __umulhi(static_cast<uint32_t>(n), mul);
#else
    const uint32_t hi = static_cast<uint32_t>((static_cast<uint64_t>(static_cast<uint32_t>(n)) * mul) >> 32);
#endif
    return static_cast<int>((hi + static_cast<uint32_t>(n)) >> shift);
  }
};

// A plain M×N×K problem, optionally split along K. Tiles walk groups of kGroupN n-blocks with m fastest inside
// a group, so the CTAs in flight share a few B panels and A panels in L2:
//   t = split · (m_blocks · n_blocks) + group · (kGroupN · m_blocks) + m_block · group_n + (n_block - group · kGroupN)
// with group_n = kGroupN, or n_blocks % kGroupN in the last group. Build it with make() (the divisors).
template <int BLOCK_M>
struct NormalScheduler {
  static constexpr int kGroupN = 16;
  static constexpr int kSmemBytes = 0;
  int m = 0;
  int num_m_blocks = 0;
  int num_n_blocks = 0;
  int num_k_blocks = 0;
  int split_k = 1;
  int k_blocks_per_split = 0;
  int per_split = 1;     // m_blocks · n_blocks
  int group_span = 1;    // kGroupN · m_blocks
  int tail_n = 1;        // n-blocks in the last group when it is partial
  FastDiv per_split_div, group_span_div, tail_div;

  static NormalScheduler make(int m, int num_m_blocks, int num_n_blocks, int num_k_blocks, int split_k,
                              int k_blocks_per_split) {
    NormalScheduler s;
    s.m = m;
    s.num_m_blocks = num_m_blocks;
    s.num_n_blocks = num_n_blocks;
    s.num_k_blocks = num_k_blocks;
    s.split_k = split_k;
    s.k_blocks_per_split = k_blocks_per_split;
    s.per_split = num_m_blocks * num_n_blocks;
    s.group_span = kGroupN * num_m_blocks;
    s.tail_n = num_n_blocks % kGroupN == 0 ? kGroupN : num_n_blocks % kGroupN;
    s.per_split_div = FastDiv(s.per_split > 0 ? s.per_split : 1);
    s.group_span_div = FastDiv(s.group_span > 0 ? s.group_span : 1);
    s.tail_div = FastDiv(s.tail_n);
    return s;
  }

  FG_HD void prepare(void*, int) {}
  FG_HD int num_tiles() const { return per_split * split_k; }

  FG_HD TileInfo tile(int t) const {
    TileInfo info;
    info.split = per_split_div.div(t);  // also past the last tile: t = num_tiles has no K blocks
    const int r = t - info.split * per_split;
    const int group = group_span_div.div(r);
    const int first_n = group * kGroupN;
    const int in_group = r - group * group_span;
    int m_block, n_in_group;
    if (first_n + kGroupN <= num_n_blocks) {  // a whole group: kGroupN is a power of two
      m_block = in_group / kGroupN;
      n_in_group = in_group % kGroupN;
    } else {
      m_block = tail_div.div(in_group);
      n_in_group = in_group - m_block * tail_n;
    }
    info.n_block = first_n + n_in_group;
    info.m_row0 = m_block * BLOCK_M;
    info.m_end = m;
    info.group = 0;
    info.kb_begin = info.split * k_blocks_per_split;
    info.kb_end = info.kb_begin + k_blocks_per_split < num_k_blocks ? info.kb_begin + k_blocks_per_split : num_k_blocks;
    return info;
  }
};

}  // namespace finegemm::cuda
