// Tile schedulers: map a persistent CTA's t-th tile to (m block, n block, K range).
// Every scheduler has the same interface, so a new layout (grouped MoE) is a new scheduler, not a new kernel.
#pragma once
#include <cstdint>

namespace finegemm::cuda {

struct TileInfo {
  int m_block;    // in units of BLOCK_M
  int n_block;    // in units of BLOCK_N
  int split;      // split-K index (0 when not split)
  int kb_begin;   // first K block (of 128)
  int kb_end;     // one past the last
};

// A plain M×N×K problem, optionally split along K. Tiles walk groups of kGroupN n-blocks with m fastest inside
// a group, so the CTAs in flight share a few B panels and A panels in L2.
struct NormalScheduler {
  static constexpr int kGroupN = 16;
  int num_m_blocks = 0;
  int num_n_blocks = 0;
  int num_k_blocks = 0;
  int split_k = 1;
  int k_blocks_per_split = 0;

  __host__ __device__ int num_tiles() const { return num_m_blocks * num_n_blocks * split_k; }

  __device__ TileInfo tile(int t) const {
    const int per_split = num_m_blocks * num_n_blocks;
    TileInfo info;
    info.split = t / per_split;
    const int r = t - info.split * per_split;
    const int group_span = kGroupN * num_m_blocks;
    const int group = r / group_span;
    const int first_n = group * kGroupN;
    const int group_n = min(kGroupN, num_n_blocks - first_n);
    const int in_group = r - group * group_span;
    info.n_block = first_n + in_group % group_n;
    info.m_block = in_group / group_n;
    info.kb_begin = info.split * k_blocks_per_split;
    info.kb_end = min(num_k_blocks, info.kb_begin + k_blocks_per_split);
    return info;
  }
};

}  // namespace finegemm::cuda
