// Tile schedulers: map a persistent CTA's t-th tile to rows of A, a column block, a group and a K range.
// Every scheduler has the same interface, so a new layout (grouped MoE) is a new scheduler, not a new kernel:
//   prepare(smem, threads): once per CTA by all threads, then __syncthreads();
//   num_tiles(), tile(t).
#pragma once
#include <cstdint>

#include "cuda/scheduler/normal_scheduler.hpp"

namespace finegemm::cuda {

// Grouped GEMM over experts, with the row ranges read on the device (no host synchronisation):
//   contiguous layout: expert e owns rows [offsets[e], offsets[e+1]) of A and the output; experts are not padded
//   to the tile height: the last tile of an expert masks the rows past its end;
//   masked layout (offsets == nullptr): expert e owns rows [e·max_rows, e·max_rows + counts[e]).
// prepare() turns the per-expert row counts into a prefix of m-blocks in shared memory; tile(t) finds its expert
// by binary search there. Tiles run m-block major by default: the n-blocks of one expert's rows run together. With
// n_major (FINEGEMM_GROUPED_ORDER=n) an expert's tiles run n-block major instead: the m-blocks of one column block run
// together, on neighbouring SMs at the same time, so that an expert with several m-blocks streams each B block from
// DRAM once and the other m-blocks find it in L2 (m-block major, the expert's whole B, 29 MB for DeepSeek-V3's
// gate_up, streams once per m-block).
template <int BLOCK_M, int kMaxGroups>
struct GroupedScheduler {
  static constexpr int kSmemBytes = (kMaxGroups + 1) * 4;
  const int32_t* offsets = nullptr;  // [groups + 1] (contiguous) or nullptr
  const int32_t* counts = nullptr;   // [groups] (masked)
  int max_rows = 0;                  // masked: rows per group
  int num_groups = 0;
  int num_n_blocks = 0;
  int num_k_blocks = 0;
  bool n_major = false;              // an expert's tiles n-block major (see above)
  int* block_prefix = nullptr;       // shared memory, set by prepare()

  __device__ int group_start(int g) const { return offsets ? offsets[g] : g * max_rows; }
  __device__ int group_rows(int g) const {
    const int rows = offsets ? offsets[g + 1] - offsets[g] : counts[g];
    return max(0, offsets ? rows : min(rows, max_rows));
  }

  __device__ void prepare(void* smem, int num_threads) {
    block_prefix = static_cast<int*>(smem);
    // Per-expert m-blocks, then a serial prefix by warp 0 in chunks of 32 (E ≤ kMaxGroups).
    for (int g = threadIdx.x; g < num_groups; g += num_threads)
      block_prefix[g + 1] = (group_rows(g) + BLOCK_M - 1) / BLOCK_M;
    __syncthreads();
    if (threadIdx.x < 32) {
      int carry = 0;
      for (int base = 0; base < num_groups; base += 32) {
        const int g = base + threadIdx.x;
        int v = g < num_groups ? block_prefix[g + 1] : 0;
#pragma unroll
        for (int d = 1; d < 32; d *= 2) {
          const int other = __shfl_up_sync(0xFFFFFFFFu, v, d);
          if (static_cast<int>(threadIdx.x) >= d) v += other;
        }
        if (g < num_groups) block_prefix[g + 1] = carry + v;
        carry += __shfl_sync(0xFFFFFFFFu, v, 31);
      }
      if (threadIdx.x == 0) block_prefix[0] = 0;
    }
  }

  __device__ int num_tiles() const { return block_prefix[num_groups] * num_n_blocks; }

  __device__ TileInfo tile(int t) const {
    TileInfo info;
    const int mb = t / num_n_blocks;
    // Largest g with block_prefix[g] ≤ mb (empty experts have equal prefixes and are skipped). An expert's tiles are
    // the range [block_prefix[g] · num_n_blocks, block_prefix[g + 1] · num_n_blocks) in either order.
    int lo = 0, hi = num_groups - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (block_prefix[mid] <= mb) lo = mid;
      else hi = mid - 1;
    }
    info.group = lo;
    const int start = group_start(lo);
    int local_mb = mb - block_prefix[lo];
    info.n_block = t - mb * num_n_blocks;
    if (n_major) {
      const int expert_mbs = block_prefix[lo + 1] - block_prefix[lo];
      const int local = t - block_prefix[lo] * num_n_blocks;
      info.n_block = local / expert_mbs;
      local_mb = local - info.n_block * expert_mbs;
    }
    info.m_row0 = start + local_mb * BLOCK_M;
    info.m_end = start + group_rows(lo);
    info.split = 0;
    info.kb_begin = 0;
    info.kb_end = num_k_blocks;
    return info;
  }
};

}  // namespace finegemm::cuda
