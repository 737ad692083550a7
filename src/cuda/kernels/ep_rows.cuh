// Expert parallelism: the receiver's row layout and the row copies between the wire's order and the experts'.
//
// A rank receives, from each source s, the rows the source routed to this rank's experts, source-major: source 0's
// rows (sorted by expert, as the source permuted them), then source 1's, ... The grouped GEMMs want them
// expert-major: expert 0's rows from source 0, then from source 1, ..., then expert 1's. Both orders are fixed by
// the sources' per-expert offsets alone, so the layout is deterministic.
#pragma once
#include <cstdint>

namespace finegemm::cuda {

inline constexpr int kEpLayoutThreads = 256;
inline constexpr int kEpLayoutRowsPerBlock = 2048;
inline constexpr int kEpMaxExperts = 4096;  // dynamic shared memory of the layout kernel: (2·E + 1) ints

// gathered: every source's routing offsets, source s's at gathered + s·source_stride: [E + 1], exclusive prefix over
// the E global experts. This rank owns experts [rank·local_experts, (rank+1)·local_experts).
// Writes local_offsets [local_experts + 1] (expert-major offsets over the received rows; block 0 only) and
// row_map [received rows]: expert-major row i → its source-major row.
// grid: ceil(received rows / kEpLayoutRowsPerBlock) (at least 1), kEpLayoutThreads threads.
__global__ void __launch_bounds__(kEpLayoutThreads)
    ep_layout_kernel(const int32_t* __restrict__ gathered, int64_t source_stride, int world, int rank,
                     int local_experts, int received_rows, int32_t* __restrict__ local_offsets,
                     int32_t* __restrict__ row_map) {
  extern __shared__ int32_t smem[];
  const int num_blocks = world * local_experts;  // block b = (expert el, source s), b = el·world + s
  int32_t* dst_start = smem;                     // [num_blocks + 1]: expert-major start of block b
  int32_t* src_start = smem + num_blocks + 1;    // [num_blocks]: source-major start of block b

  // Each block's row count, and its start within its source's segment
  for (int b = threadIdx.x; b < num_blocks; b += blockDim.x) {
    const int el = b / world, s = b % world;
    const int32_t* g = gathered + s * source_stride + static_cast<int64_t>(rank) * local_experts;
    dst_start[b] = g[el + 1] - g[el];
    src_start[b] = g[el] - g[0];
  }
  __syncthreads();

  // Serial prefix sums (thread 0): each source's base in the received rows, then the expert-major starts.
  // NOTE: at most 4096 blocks; at E = 256 this is well under a microsecond of one thread.
  if (threadIdx.x == 0) {
    int32_t base = 0;
    for (int s = 0; s < world; ++s) {
      const int32_t* g = gathered + s * source_stride + static_cast<int64_t>(rank) * local_experts;
      const int32_t segment = g[local_experts] - g[0];
      for (int el = 0; el < local_experts; ++el) src_start[el * world + s] += base;
      base += segment;
    }
    int32_t run = 0;
    for (int b = 0; b < num_blocks; ++b) {
      const int32_t count = dst_start[b];
      dst_start[b] = run;
      run += count;
    }
    dst_start[num_blocks] = run;
  }
  __syncthreads();

  if (blockIdx.x == 0)
    for (int el = threadIdx.x; el <= local_experts; el += blockDim.x) local_offsets[el] = dst_start[el * world];

  // Each expert-major row: the last block starting at or before it (empty blocks share their start with the next)
  const int first = blockIdx.x * kEpLayoutRowsPerBlock;
  const int last = min(received_rows, first + kEpLayoutRowsPerBlock);
  for (int i = first + threadIdx.x; i < last; i += blockDim.x) {
    int lo = 0, hi = num_blocks - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (dst_start[mid] <= i) lo = mid;
      else hi = mid - 1;
    }
    row_map[i] = src_start[lo] + (i - dst_start[lo]);
  }
}

// One array of rows to copy: row_bytes a multiple of 4 (16-byte vectors when it is a multiple of 16).
struct EpRowPlane {
  const uint8_t* src = nullptr;
  uint8_t* dst = nullptr;
  int64_t row_bytes = 0;
};
inline constexpr int kEpMaxPlanes = 3;
struct EpRowPlanes {
  EpRowPlane plane[kEpMaxPlanes];
  int count = 0;
};

// kScatter false (gather): dst row i ← src row map[i]. kScatter true: dst row map[i] ← src row i.
// grid: (rows), 128 threads; every plane of the row is copied by the row's block.
template <bool kScatter>
__global__ void __launch_bounds__(128) ep_copy_rows_kernel(EpRowPlanes planes, const int32_t* __restrict__ row_map) {
  const int64_t i = blockIdx.x;
  const int64_t mapped = row_map[i];
  const int64_t src_row = kScatter ? i : mapped, dst_row = kScatter ? mapped : i;
#pragma unroll
  for (int p = 0; p < kEpMaxPlanes; ++p) {
    if (p >= planes.count) break;
    const EpRowPlane& pl = planes.plane[p];
    const uint8_t* src = pl.src + src_row * pl.row_bytes;
    uint8_t* dst = pl.dst + dst_row * pl.row_bytes;
    if (pl.row_bytes % 16 == 0) {
      const int64_t n = pl.row_bytes / 16;
      for (int64_t v = threadIdx.x; v < n; v += blockDim.x)
        reinterpret_cast<uint4*>(dst)[v] = reinterpret_cast<const uint4*>(src)[v];
    } else {
      const int64_t n = pl.row_bytes / 4;
      for (int64_t v = threadIdx.x; v < n; v += blockDim.x)
        reinterpret_cast<uint32_t*>(dst)[v] = reinterpret_cast<const uint32_t*>(src)[v];
    }
  }
}

}  // namespace finegemm::cuda
