// FP4 prefill: packed E2M1 weights with MX 1x32 scales expanded once per call into E4M3 rows, so that the E4M3 GEMM
// (sm90_fp8_gemm.cuh at its full speed) runs on them. At M = 4096 the GEMM reads each weight 32 times or more; the
// in-kernel expansion of the FP4 GEMM repeats it for every 128-row tile and is bound by its loader warps. Here each
// weight is expanded once: N·K/2 bytes read, N·K written (launch_sm90_fp8_gemm, sm90_fp8_gemm.cu).
//
// Byte UE8M0 scales fold: a group of 32 with exponent e expands as E2M1 · 2^-(emax - e) under a float scale 2^emax,
// exact while emax - e ≤ 8 (fp4_fold_table_word). fp4_fold_scan_kernel reads the scales first and flags
//   kTileUnfoldable: some 128-row × 128-K tile spreads wider than 8 binades;
//   kRowUnfoldable:  some row's 128-K block does.
// Without either flag, emax is the tile's: one scale per 128×128 block, the E4M3 GEMM's fastest recipe (the FP8 block
// recipe's scale layout). With only the first, emax is the row block's: one scale per row and 128 of K. With the
// second, the gated FP4 kernel (promotion every 32) runs instead and the expansion writes nothing.
// FP32 and packed scales expand unfolded and the E4M3 GEMM promotes every 32 with the original scales.
// NOTE: plain __global__ functions in a header: included by src/cuda/runtime/fp4_expand.cu only.
#pragma once
#include <cstdint>

#include "core/formats.hpp"
#include "cuda/kernels/fp4_expand.hpp"
#include "cuda/ptx/ptx.cuh"

namespace finegemm::cuda {

inline constexpr int kFp4ExpandThreads = 256;
inline constexpr int kFp4TileUnfoldable = 1;
inline constexpr int kFp4RowUnfoldable = 2;

// The weights' rows: `groups` experts of n rows each (one group for a dense layer). The scale of row r, K group g:
// scale[(r / n) · group_stride + (r % n) · stride_n + g] (bytes). offsets / counts (a grouped layout's row offsets
// [groups + 1] or row counts [groups], on the device; both null for a dense layer): experts without rows are skipped.
// Tiles of 128 rows start at each expert's first row: tile t of expert e is tile e · tiles_per_group + t.
struct Fp4ScaleView {
  const uint8_t* scale;
  int64_t stride_n, group_stride;
  int n;
  const int32_t* offsets;
  const int32_t* counts;
  __device__ __forceinline__ int at(int64_t row, int g) const {
    return scale[(row / n) * group_stride + (row % n) * stride_n + g];
  }
  __device__ __forceinline__ bool group_used(int64_t group) const {
    if (offsets != nullptr) return offsets[group + 1] > offsets[group];
    return counts == nullptr || counts[group] > 0;
  }
  __device__ __forceinline__ int tiles_per_group() const { return (n + 127) / 128; }
  __device__ __forceinline__ int64_t tile_of(int64_t row) const { return (row / n) * tiles_per_group() + (row % n) / 128; }
};

// Grid (groups · tiles_per_group, K blocks of 128), 128 threads (a row each): the tile's largest exponent and its
// scale ([groups · tiles_per_group, blocks]), and the two flags. (Tiles on x: up to 2^31 - 1; blocks on y: K < 2^23.)
__global__ void __launch_bounds__(128) fp4_fold_scan_kernel(Fp4ScaleView s, int k, int* __restrict__ tile_emax,
                                                            float* __restrict__ tile_scale, int* __restrict__ flags) {
  __shared__ int warp_hi[4], warp_lo[4];
  const int groups = k / 32, blocks = (k + 127) / 128;
  const int kb = blockIdx.y;
  const int64_t tile = blockIdx.x, group = tile / s.tiles_per_group();
  if (!s.group_used(group)) return;  // block-uniform
  const int row_in_group = static_cast<int>(tile % s.tiles_per_group()) * 128 + threadIdx.x;
  const int64_t row = group * s.n + row_in_group;
  int hi = 0, lo = 255;
  if (row_in_group < s.n) {
    for (int g = 4 * kb; g < min(4 * kb + 4, groups); ++g) {
      const int e = s.at(row, g);
      hi = max(hi, e);
      lo = min(lo, e);
    }
    if (hi - lo > 8) atomicOr(flags, kFp4RowUnfoldable);
  }
  hi = static_cast<int>(__reduce_max_sync(0xFFFFFFFFu, static_cast<unsigned>(hi)));
  lo = static_cast<int>(__reduce_min_sync(0xFFFFFFFFu, static_cast<unsigned>(lo)));
  if (threadIdx.x % 32 == 0) {
    warp_hi[threadIdx.x / 32] = hi;
    warp_lo[threadIdx.x / 32] = lo;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    hi = max(max(warp_hi[0], warp_hi[1]), max(warp_hi[2], warp_hi[3]));
    lo = min(min(warp_lo[0], warp_lo[1]), min(warp_lo[2], warp_lo[3]));
    if (hi - lo > 8) atomicOr(flags, kFp4TileUnfoldable);
    tile_emax[tile * blocks + kb] = hi;
    tile_scale[tile * blocks + kb] = fmt::ue8m0_to_float(static_cast<uint8_t>(hi));
  }
}

// The chunked scans' reductions (fp4_fold_scan_wide_kernel, fp4_fold_scan_tiles_kernel; 128 threads, a row each):
// fp4_scan_publish puts the warp's largest and smallest exponent of block slot i into shared memory (lane 0);
// fp4_scan_finish, after a barrier, has thread i < count finish slot i over the kWarps warps (four, or the staged
// scan's eight): the tile flag, and the tile's emax and scale at index out0 + i.
template <int kSlots>
__device__ __forceinline__ void fp4_scan_publish(int hi, int lo, int i, int (*warp_hi)[kSlots], int (*warp_lo)[kSlots]) {
  hi = static_cast<int>(__reduce_max_sync(0xFFFFFFFFu, static_cast<unsigned>(hi)));
  lo = static_cast<int>(__reduce_min_sync(0xFFFFFFFFu, static_cast<unsigned>(lo)));
  if (threadIdx.x % 32 == 0) {
    warp_hi[threadIdx.x / 32][i] = hi;
    warp_lo[threadIdx.x / 32][i] = lo;
  }
}
template <int kSlots, int kWarps = 4>
__device__ __forceinline__ void fp4_scan_finish(int count, const int (*warp_hi)[kSlots], const int (*warp_lo)[kSlots],
                                                int64_t out0, int* __restrict__ tile_emax,
                                                float* __restrict__ tile_scale, int* __restrict__ flags) {
  if (static_cast<int>(threadIdx.x) < count) {
    const int i = threadIdx.x;
    int hi = warp_hi[0][i], lo = warp_lo[0][i];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) hi = max(hi, warp_hi[w][i]), lo = min(lo, warp_lo[w][i]);
    if (hi - lo > 8) atomicOr(flags, kFp4TileUnfoldable);
    tile_emax[out0 + i] = hi;
    tile_scale[out0 + i] = fmt::ue8m0_to_float(static_cast<uint8_t>(hi));
  }
}

// The same scan with a CTA per (128-row tile, kFp4ScanWideBlocks K blocks) (FINEGEMM_FP4_EXPAND_WIDE=2, with the wide
// expansion; stop 43, not yet run on a GPU): grid (groups · tiles_per_group, ceil(blocks / kFp4ScanWideBlocks)), 128
// threads, a row each. Each thread issues every scale load of its row's blocks first (up to 32 byte loads in flight;
// the row's scale address once, in 64-bit arithmetic without divisions by n), then per block the warps reduce their
// rows' largest and smallest exponents, and threads 0..7 finish the blocks over the four warps. fp4_fold_scan_kernel
// took 6.7-7.0 µs under ncu for M = 4096 N = 4096 K = 7168 (1792 CTAs of four byte loads per thread, stop 22). The
// same outputs: tile_emax, tile_scale and the flags.
inline constexpr int kFp4ScanWideBlocks = 8;

__global__ void __launch_bounds__(128) fp4_fold_scan_wide_kernel(Fp4ScaleView s, int k, int* __restrict__ tile_emax,
                                                                 float* __restrict__ tile_scale,
                                                                 int* __restrict__ flags) {
  __shared__ int warp_hi[4][kFp4ScanWideBlocks], warp_lo[4][kFp4ScanWideBlocks];
  const int groups = k / 32, blocks = (k + 127) / 128;
  const int tiles_per_group = s.tiles_per_group();
  const int64_t tile = blockIdx.x, group = tile / tiles_per_group;
  if (!s.group_used(group)) return;  // block-uniform
  const int row_in_group = static_cast<int>(tile - group * tiles_per_group) * 128 + threadIdx.x;
  const bool row_valid = row_in_group < s.n;
  const uint8_t* scale_row = s.scale + group * s.group_stride + static_cast<int64_t>(row_in_group) * s.stride_n;
  const int kb0 = static_cast<int>(blockIdx.y) * kFp4ScanWideBlocks;
  const int count = min(kFp4ScanWideBlocks, blocks - kb0);
  int e[kFp4ScanWideBlocks][4];
#pragma unroll
  for (int i = 0; i < kFp4ScanWideBlocks; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int g = 4 * (kb0 + i) + j;
      e[i][j] = row_valid && i < count && g < groups ? static_cast<int>(scale_row[g]) : -1;
    }
  bool row_wide = false;
#pragma unroll
  for (int i = 0; i < kFp4ScanWideBlocks; ++i) {
    if (i >= count) break;  // block-uniform
    int hi = 0, lo = 255;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (e[i][j] < 0) continue;  // past N or past K
      hi = max(hi, e[i][j]);
      lo = min(lo, e[i][j]);
    }
    row_wide = row_wide || (row_valid && hi - lo > 8);
    fp4_scan_publish(hi, lo, i, warp_hi, warp_lo);
  }
  __syncthreads();
  fp4_scan_finish(count, warp_hi, warp_lo, tile * blocks + kb0, tile_emax, tile_scale, flags);
  if (row_wide) atomicOr(flags, kFp4RowUnfoldable);
}

// The same scan with one CTA per 128-row tile (grid: groups · tiles_per_group, 128 threads, a row each) walking every K
// block, for the lean kernels' scan-only calls (Fp4Expansion::Mode::ScanOnly): fp4_fold_scan_kernel's grid has a CTA
// per (tile, K block), 458752 of them for DeepSeek-V3's gate_up experts, each reading four bytes per thread. Per block
// of kScanChunk K blocks: each warp reduces its 32 rows' largest and smallest exponents (rows past N take no part), lane
// 0 keeps them in shared memory, and after a barrier the CTA's threads finish one K block each over the four warps.
// The same outputs: tile_emax, tile_scale, and the flags.
inline constexpr int kFp4ScanChunk = 64;

__global__ void __launch_bounds__(128) fp4_fold_scan_tiles_kernel(Fp4ScaleView s, int k, int* __restrict__ tile_emax,
                                                                  float* __restrict__ tile_scale,
                                                                  int* __restrict__ flags) {
  __shared__ int warp_hi[4][kFp4ScanChunk], warp_lo[4][kFp4ScanChunk];
  const int groups = k / 32, blocks = (k + 127) / 128;
  const int64_t tile = blockIdx.x, group = tile / s.tiles_per_group();
  if (!s.group_used(group)) return;  // block-uniform
  const int row_in_group = static_cast<int>(tile % s.tiles_per_group()) * 128 + threadIdx.x;
  const bool row_valid = row_in_group < s.n;
  const int64_t row = group * s.n + min(row_in_group, s.n - 1);
  bool row_wide = false;
  for (int kb0 = 0; kb0 < blocks; kb0 += kFp4ScanChunk) {
    const int count = min(kFp4ScanChunk, blocks - kb0);
    for (int i = 0; i < count; ++i) {
      const int kb = kb0 + i;
      int hi = 0, lo = 255;
      if (row_valid) {
        for (int g = 4 * kb; g < min(4 * kb + 4, groups); ++g) {
          const int e = s.at(row, g);
          hi = max(hi, e);
          lo = min(lo, e);
        }
        row_wide = row_wide || hi - lo > 8;
      }
      fp4_scan_publish(hi, lo, i, warp_hi, warp_lo);
    }
    __syncthreads();
    fp4_scan_finish(count, warp_hi, warp_lo, tile * blocks + kb0, tile_emax, tile_scale, flags);
    __syncthreads();  // the chunk's shared values read before the next chunk writes them
  }
  if (row_wide) atomicOr(flags, kFp4RowUnfoldable);
}

// The scan read along the scale rows (stop 52; the default for grouped expansions and the lean kernels' scan-only calls,
// FINEGEMM_FP4_EXPAND_WIDE unset): a CTA per 128-row tile, 128 threads. A row's K blocks go to L lanes (L = 32, or the
// blocks rounded up to a power of two where fewer: 16 at K = 2048), so a warp's load covers 32 / L rows of 4 · L
// contiguous bytes each; warp w takes the tile's rows in runs of 32 / L, every fourth run. kFp4ScanRowsUnroll loads at
// once per lane: 8 where L = 32, 16 where fewer (fp4_scan_rows_unroll). Stop 53 sized the lanes to the row (ncu, H100,
// DeepSeek-V3 FP4 at T = 4096: down's 117 MB of scales, 16 K blocks a row, 127.5 -> 81.2 µs; gate_up's 235 MB,
// 56 K blocks, 147.7 µs with 8 loads and 164.4 with 16, hence 8 there). Each lane keeps its blocks' largest and smallest exponent
// over its rows and flags a row block that spreads over 8; the lanes of one block fold by shuffles, and after a
// barrier the first warp finishes each block over the four warps. The same outputs as fp4_fold_scan_kernel:
// tile_emax, tile_scale and the flags.
// Under ncu (stop 52, H100, DeepSeek-V3 gate_up experts at T = 16384: 256 x 4096 rows, K = 7168) fp4_fold_scan_kernel
// took 1.55 ms for 235 MB of scales (a CTA per tile and K block, 458752 CTAs).

// One row's scale word of a K block (byte j: group j, the first `count` valid) into a lane's running largest and
// smallest exponent, and the row flag where the row's own groups spread over 2^8 (the rows and staged scans).
__device__ __forceinline__ void fp4_scan_row_word(uint32_t w, int count, int& hi, int& lo, bool& row_wide) {
  int rh = 0, rl = 255;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    if (j >= count) break;
    const int e = static_cast<int>((w >> (8 * j)) & 0xFFu);
    rh = max(rh, e);
    rl = min(rl, e);
  }
  row_wide = row_wide || rh - rl > 8;
  hi = max(hi, rh);
  lo = min(lo, rl);
}

// Loads in flight per lane in fp4_fold_scan_rows_kernel (its template argument) for rows of `blocks` K blocks.
inline int fp4_scan_rows_unroll(int blocks) { return blocks >= 32 ? 8 : 16; }

// Lanes per scale row in fp4_fold_scan_rows_kernel: the K blocks rounded up to a power of two, at most 32.
FG_HD int fp4_scan_row_lanes(int blocks) {
  int lanes = 1;
  while (lanes < blocks && lanes < 32) lanes *= 2;
  return lanes;
}

template <int kFp4ScanRowsUnroll>
__global__ void __launch_bounds__(128) fp4_fold_scan_rows_kernel(Fp4ScaleView s, int k, int* __restrict__ tile_emax,
                                                                 float* __restrict__ tile_scale,
                                                                 int* __restrict__ flags) {
  __shared__ int warp_hi[4][32], warp_lo[4][32];
  const int groups = k / 32, blocks = (k + 127) / 128;
  const int tiles_per_group = s.tiles_per_group();
  const int64_t tile = blockIdx.x, group = tile / tiles_per_group;
  if (!s.group_used(group)) return;  // block-uniform
  const int row0 = static_cast<int>(tile - group * tiles_per_group) * 128;
  const int rows = min(128, s.n - row0);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int lanes = fp4_scan_row_lanes(blocks), per_load = 32 / lanes;  // lanes per row, rows per warp load
  const int sub = lane / lanes, col = lane % lanes;
  const uint8_t* tile_scales = s.scale + group * s.group_stride + static_cast<int64_t>(row0) * s.stride_n;
  // A block's four scales as one 32-bit load where every row start is 4-byte aligned (block-uniform), else bytes.
  const bool words = (reinterpret_cast<uintptr_t>(tile_scales) % 4 == 0) && s.stride_n % 4 == 0;
  bool row_wide = false;
  for (int kb0 = 0; kb0 < blocks; kb0 += lanes) {
    const int kb = kb0 + col;
    const int g0 = 4 * kb, count = min(4, groups - g0);  // count <= 0: past K
    int hi = 0, lo = 255;
    // This lane's rows: warp · per_load + sub, then every 4 · per_load rows.
    for (int r = warp * per_load + sub; r < rows; r += 4 * per_load * kFp4ScanRowsUnroll) {
      uint32_t w[kFp4ScanRowsUnroll];
#pragma unroll
      for (int u = 0; u < kFp4ScanRowsUnroll; ++u) {
        const int row = r + 4 * per_load * u;
        const uint8_t* at = tile_scales + static_cast<int64_t>(row) * s.stride_n + g0;
        w[u] = 0;
        if (row < rows && count > 0) {
          if (words && count == 4) {
            w[u] = __ldg(reinterpret_cast<const uint32_t*>(at));
          } else {
            for (int j = 0; j < count; ++j) w[u] |= static_cast<uint32_t>(__ldg(at + j)) << (8 * j);
          }
        }
      }
#pragma unroll
      for (int u = 0; u < kFp4ScanRowsUnroll; ++u) {
        if (r + 4 * per_load * u >= rows || count <= 0) continue;
        fp4_scan_row_word(w[u], count, hi, lo, row_wide);
      }
    }
    // The lanes of one K block (col, col + lanes, ...) fold theirs (identities where a lane had no rows).
    for (int off = lanes; off < 32; off *= 2) {
      hi = max(hi, __shfl_xor_sync(0xFFFFFFFFu, hi, off));
      lo = min(lo, __shfl_xor_sync(0xFFFFFFFFu, lo, off));
    }
    if (sub == 0) {
      warp_hi[warp][col] = hi;
      warp_lo[warp][col] = lo;
    }
    __syncthreads();
    fp4_scan_finish(min(lanes, blocks - kb0), warp_hi, warp_lo, tile * blocks + kb0, tile_emax, tile_scale, flags);
    __syncthreads();  // the chunk's shared values read before the next chunk writes them
  }
  if (row_wide) atomicOr(flags, kFp4RowUnfoldable);
}

// The scan with the tile's scales staged whole (stop 53, FINEGEMM_FP4_SCAN_STAGED=1, off until measured): a CTA per
// 128-row tile, 256 threads; thread 0 copies the tile's rows, (rows - 1) · stride_n + K / 32 contiguous bytes, into
// shared memory with one cp.async.bulk (fp4_scan_staged_ok: 16-byte aligned rows and K a multiple of 512, so the copy
// ends at the last row's last scale), then lane l of warp w takes K block kb0 + l over rows w, w + 8, ... from shared
// memory. One load in flight per tile instead of a warp load per row and 32 K blocks (the rows scan reaches ~1.5 TB/s
// on DeepSeek-V3's experts). The same outputs as fp4_fold_scan_kernel.
inline constexpr int kFp4ScanStagedThreads = 256;
__global__ void __launch_bounds__(kFp4ScanStagedThreads) fp4_fold_scan_staged_kernel(Fp4ScaleView s, int k,
                                                                                     int* __restrict__ tile_emax,
                                                                                     float* __restrict__ tile_scale,
                                                                                     int* __restrict__ flags) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(16) uint8_t staged[];
  __shared__ uint64_t bar;
  __shared__ int warp_hi[8][32], warp_lo[8][32];
  const int groups = k / 32, blocks = (k + 127) / 128;
  const int tiles_per_group = s.tiles_per_group();
  const int64_t tile = blockIdx.x, group = tile / tiles_per_group;
  if (!s.group_used(group)) return;  // block-uniform
  const int row0 = static_cast<int>(tile - group * tiles_per_group) * 128;
  const int rows = min(128, s.n - row0);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const uint8_t* tile_scales = s.scale + group * s.group_stride + static_cast<int64_t>(row0) * s.stride_n;
  if (threadIdx.x == 0) {
    ptx::mbar_init(&bar, 1);
    ptx::fence_barrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const uint32_t bytes = static_cast<uint32_t>((rows - 1) * s.stride_n + groups);
    ptx::mbar_arrive_expect_tx(&bar, bytes);
    ptx::bulk_load(staged, tile_scales, bytes, &bar);
  }
  ptx::mbar_wait(&bar, 0);
  bool row_wide = false;
  for (int kb0 = 0; kb0 < blocks; kb0 += 32) {
    const int kb = kb0 + lane;
    const int count = kb < blocks ? min(4, groups - 4 * kb) : 0;
    int hi = 0, lo = 255;
    if (count > 0) {
      for (int r = warp; r < rows; r += 8)
        fp4_scan_row_word(*reinterpret_cast<const uint32_t*>(staged + static_cast<int64_t>(r) * s.stride_n + 4 * kb),
                          count, hi, lo, row_wide);
    }
    warp_hi[warp][lane] = hi;
    warp_lo[warp][lane] = lo;
    __syncthreads();
    fp4_scan_finish<32, 8>(min(32, blocks - kb0), warp_hi, warp_lo, tile * blocks + kb0, tile_emax, tile_scale, flags);
    __syncthreads();  // the chunk's shared values read before the next chunk writes them
  }
  if (row_wide) atomicOr(flags, kFp4RowUnfoldable);
#endif
}

// The expansion kernels' start: the fold table's rows 0-8 into shared memory (threads 0-8), a barrier, and the scan's
// flags (kFold; 0 without a fold).
template <bool kFold>
__device__ __forceinline__ int fp4_expand_prologue(uint2* table, const int* __restrict__ flags) {
  if (threadIdx.x < 9) table[threadIdx.x] = make_uint2(fp4_fold_table_word(threadIdx.x, 0), fp4_fold_table_word(threadIdx.x, 1));
  __syncthreads();
  return kFold ? *flags : 0;
}

// One warp per (row, 1024 codes of K): lane q takes the 32 codes of group q (16 packed bytes in, 32 bytes out).
// kFold: emax per the flags (above); row_scale [rows, blocks] is written where the row blocks' emax is used.
template <bool kFold>
__global__ void __launch_bounds__(kFp4ExpandThreads) fp4_expand_weights_kernel(
    const uint8_t* __restrict__ b, int64_t ldb, Fp4ScaleView s, int64_t rows, int k, uint8_t* __restrict__ out,
    const int* __restrict__ tile_emax, float* __restrict__ row_scale, const int* __restrict__ flags) {
  __shared__ uint2 table[9];
  const int flag = fp4_expand_prologue<kFold>(table, flags);
  if (flag & kFp4RowUnfoldable) return;  // the FP4 kernel runs on the packed weights instead
  const int groups = k / 32, blocks = (k + 127) / 128;
  const int chunks = (groups + 31) / 32;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * kFp4ExpandThreads + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (warp >= rows * chunks) return;  // whole warps: the shuffles below see every lane of the warp
  const int64_t row = warp / chunks;
  if (!s.group_used(row / s.n)) return;  // warp-uniform: one row per warp
  const int q = static_cast<int>(warp % chunks) * 32 + lane;
  const bool valid = q < groups;
  uint2 tab = table[0];
  if constexpr (kFold) {
    const int e = valid ? s.at(row, q) : -1;
    if (!(flag & kFp4TileUnfoldable)) {
      if (valid) tab = table[min(tile_emax[s.tile_of(row) * blocks + q / 4] - e, 8)];
    } else {
      // The row's block of 128 is lanes 4j..4j+3 (q = 4·block + i); lanes past K take no part.
      int hi = e;
      hi = max(hi, __shfl_xor_sync(0xFFFFFFFFu, hi, 1));
      hi = max(hi, __shfl_xor_sync(0xFFFFFFFFu, hi, 2));
      if (valid) {
        tab = table[min(hi - e, 8)];
        if (q % 4 == 0) row_scale[row * blocks + q / 4] = fmt::ue8m0_to_float(static_cast<uint8_t>(hi));
      }
    }
  }
  if (!valid) return;
  const uint4 w = __ldg(reinterpret_cast<const uint4*>(b + row * ldb + static_cast<int64_t>(q) * 16));
  const uint32_t words[4] = {w.x, w.y, w.z, w.w};
  uint32_t o[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    o[2 * i] = e2m1x4_to_e4m3x4(words[i], tab.x, tab.y);
    o[2 * i + 1] = e2m1x4_to_e4m3x4(words[i] >> 16, tab.x, tab.y);
  }
  uint4* dst = reinterpret_cast<uint4*>(out + row * static_cast<int64_t>(k) + static_cast<int64_t>(q) * 32);
  dst[0] = make_uint4(o[0], o[1], o[2], o[3]);
  dst[1] = make_uint4(o[4], o[5], o[6], o[7]);
}

// The same expansion with one warp per (row, kFp4ExpandGroupsPerWarp groups of 32 codes of K)
// (FINEGEMM_FP4_EXPAND_WIDE=1, off: written at stop 43 without a GPU): in step j lane l takes group
// q = kFp4ExpandGroupsPerWarp · chunk + 32 · j + l (16 packed bytes in, 32 bytes out). The row's scale, weight and
// output addresses (and its tile) are computed once per warp, and every step's loads are issued before the first
// expansion. fp4_expand_weights_kernel has each thread redo the 64-bit row and tile divisions (subroutine calls) for
// its 16 bytes: ncu gave it 23.1-24.3 µs at M = 4096 N = 4096 K = 7168 (44 MB moved, 1.9 TB/s; stop 22), about the
// margin by which the expanded FP4 prefill misses 85% of the FP8 GEMM's speed (stop 43: 205.6 against 173.9 µs).
inline constexpr int kFp4ExpandGroupsPerWarp = 128;
inline constexpr int kFp4ExpandSteps = kFp4ExpandGroupsPerWarp / 32;

template <bool kFold>
__global__ void __launch_bounds__(kFp4ExpandThreads) fp4_expand_weights_wide_kernel(
    const uint8_t* __restrict__ b, int64_t ldb, Fp4ScaleView s, int64_t rows, int k, uint8_t* __restrict__ out,
    const int* __restrict__ tile_emax, float* __restrict__ row_scale, const int* __restrict__ flags) {
  __shared__ uint2 table[9];
  const int flag = fp4_expand_prologue<kFold>(table, flags);
  if (flag & kFp4RowUnfoldable) return;  // the FP4 kernel runs on the packed weights instead
  const int groups = k / 32, blocks = (k + 127) / 128;
  const int chunks = (groups + kFp4ExpandGroupsPerWarp - 1) / kFp4ExpandGroupsPerWarp;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * kFp4ExpandThreads + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (warp >= rows * chunks) return;  // whole warps: the shuffles below see every lane of the warp
  const int64_t row = warp / chunks;
  const int64_t expert = row / s.n;
  if (!s.group_used(expert)) return;  // warp-uniform: one row per warp
  const int q0 = static_cast<int>(warp - row * chunks) * kFp4ExpandGroupsPerWarp;
  // Steps past K (warp-uniform): only the last chunk of a row has them.
  const int steps = min(kFp4ExpandSteps, (groups - q0 + 31) / 32);
  const uint8_t* scale_row = s.scale + expert * s.group_stride + (row - expert * s.n) * s.stride_n;
  const bool tile_fold = kFold && !(flag & kFp4TileUnfoldable);
  const int* emax_row = tile_fold ? tile_emax + s.tile_of(row) * blocks : nullptr;
  const uint8_t* w_row = b + row * ldb;
  uint8_t* out_row = out + row * static_cast<int64_t>(k);
  uint4 w[kFp4ExpandSteps];
  int e[kFp4ExpandSteps], emax[kFp4ExpandSteps];
#pragma unroll
  for (int j = 0; j < kFp4ExpandSteps; ++j) {
    const int q = q0 + 32 * j + lane;
    const bool valid = j < steps && q < groups;
    w[j] = valid ? __ldg(reinterpret_cast<const uint4*>(w_row + static_cast<int64_t>(q) * 16)) : make_uint4(0, 0, 0, 0);
    e[j] = kFold && valid ? scale_row[q] : -1;
    emax[j] = tile_fold && valid ? emax_row[q / 4] : 0;
  }
#pragma unroll
  for (int j = 0; j < kFp4ExpandSteps; ++j) {
    if (j >= steps) break;  // warp-uniform
    const int q = q0 + 32 * j + lane;
    const bool valid = q < groups;
    uint2 tab = table[0];
    if constexpr (kFold) {
      if (tile_fold) {
        if (valid) tab = table[min(emax[j] - e[j], 8)];
      } else {
        // The row's block of 128 is lanes 4i..4i+3 (q = 4·block + i; q0 and 32·j are multiples of 4); lanes past K
        // take no part (e = -1).
        int hi = e[j];
        hi = max(hi, __shfl_xor_sync(0xFFFFFFFFu, hi, 1));
        hi = max(hi, __shfl_xor_sync(0xFFFFFFFFu, hi, 2));
        if (valid) {
          tab = table[min(hi - e[j], 8)];
          if (q % 4 == 0) row_scale[row * blocks + q / 4] = fmt::ue8m0_to_float(static_cast<uint8_t>(hi));
        }
      }
    }
    if (!valid) continue;
    const uint32_t words[4] = {w[j].x, w[j].y, w[j].z, w[j].w};
    uint32_t o[8];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      o[2 * i] = e2m1x4_to_e4m3x4(words[i], tab.x, tab.y);
      o[2 * i + 1] = e2m1x4_to_e4m3x4(words[i] >> 16, tab.x, tab.y);
    }
    uint4* dst = reinterpret_cast<uint4*>(out_row + static_cast<int64_t>(q) * 32);
    dst[0] = make_uint4(o[0], o[1], o[2], o[3]);
    dst[1] = make_uint4(o[4], o[5], o[6], o[7]);
  }
}

// The fold scan and the expansion in one kernel (FINEGEMM_FP4_EXPAND_WIDE=3; stop 50): a CTA per (128-row tile,
// kFp4FusedBlocks K blocks), 256 threads. Each thread takes (row, K block) pairs of the tile: the row's four
// exponents there, their largest and smallest; the CTA reduces them to the tile's (tile_emax, tile_scale and the tile
// flag, as the scans write them; the row flag where a row block spreads wider than 8). Each row block then folds
// relative to its tile's largest exponent where the tile spreads 8 or less, else to its own largest, and the row
// scale 2^base goes to row_scale for every row block: the row-scale GEMM (gated on the tile flag) then reads, for the
// rows of tiles that fold, their tile's scale beside codes folded to it, the same real values as a row fold (powers
// of two scale exactly, so the GEMM gives the same bits), and the tile-scale GEMM runs where no tile spreads wider.
// Then the CTA expands its 128 x (128 · kFp4FusedBlocks) codes: 8-byte halves of MX groups, 32 per row (a warp's row)
// and 16 per thread at 4 K blocks, each through its group's fold row. 4 K blocks: 118 registers, no local memory, two
// CTAs per SM (8 K blocks of 16-byte chunks took 187 registers, one CTA per SM). The codes are loaded before the
// scales (streaming: the packed weights are read once), so that one memory latency, not two, stands before a CTA's
// expansion. One launch and one pass over the scales instead of two (the scan took 6.7-7.0 µs, the expansion
// 23.1-24.3, at M = 4096 N = 4096 K = 7168 under ncu, stop 22; the fused kernel 17.5-17.9 on an H100, stop 51).
// Byte UE8M0 scales only (the fold). Where a row block spreads over 8 the codes are still written (no CTA knows the
// others' flags), and go unused: the row flag gates both E4M3 GEMMs off and the FP4 kernel runs on the packed weights.
inline constexpr int kFp4FusedBlocks = 4;
inline constexpr int kFp4FusedThreads = 256;
static_assert(kFp4FusedBlocks <= 32 && (kFp4FusedBlocks & (kFp4FusedBlocks - 1)) == 0 &&
                  128 * kFp4FusedBlocks % kFp4FusedThreads == 0,
              "whole (row, K block) pairs per thread, the K blocks of a warp's lanes a power of two");

__global__ void __launch_bounds__(kFp4FusedThreads, 2) fp4_scan_expand_kernel(
    const uint8_t* __restrict__ b, int64_t ldb, Fp4ScaleView s, int k, uint8_t* __restrict__ out,
    int* __restrict__ tile_emax, float* __restrict__ tile_scale, float* __restrict__ row_scale,
    int* __restrict__ flags) {
  constexpr int kWarps = kFp4FusedThreads / 32;
  constexpr int kPairs = 128 * kFp4FusedBlocks / kFp4FusedThreads;  // (row, K block) pairs per thread
  constexpr int kRowStep = kFp4FusedThreads / kFp4FusedBlocks;       // rows between a thread's pairs
  constexpr int kChunksPerRow = 4 * kFp4FusedBlocks;                 // 16-byte chunks (MX groups) per row
  constexpr int kHalvesPerRow = 2 * kChunksPerRow;                    // 8-byte halves of them
  constexpr int kPerThread = 128 * kHalvesPerRow / kFp4FusedThreads;
  static_assert(kHalvesPerRow == 32, "a warp takes one row's halves, so that each store writes 512 contiguous bytes");
  __shared__ uint2 table[9];
  __shared__ int blk_hi[kWarps][kFp4FusedBlocks], blk_lo[kWarps][kFp4FusedBlocks];
  __shared__ int tile_hi[kFp4FusedBlocks], tile_fold[kFp4FusedBlocks];
  __shared__ uint8_t dist[128][kChunksPerRow];  // each group's fold row (0..8)
  if (threadIdx.x < 9) table[threadIdx.x] = make_uint2(fp4_fold_table_word(threadIdx.x, 0), fp4_fold_table_word(threadIdx.x, 1));
  const int groups = k / 32, blocks = (k + 127) / 128;
  const int tiles_per_group = s.tiles_per_group();
  const int64_t tile = blockIdx.x, group = tile / tiles_per_group;
  if (!s.group_used(group)) return;  // block-uniform
  const int tile_row0 = static_cast<int>(tile - group * tiles_per_group) * 128;
  const int kb0 = static_cast<int>(blockIdx.y) * kFp4FusedBlocks;
  const int t = static_cast<int>(threadIdx.x);
  // The packed codes first (they do not depend on the scales), so that their loads are in flight while the scales
  // are read and reduced. Half h = i · 256 + t (8 bytes, half an MX group) is row h / 32, group (h % 32) / 2 of the
  // CTA's: a warp reads one row's 256 contiguous packed bytes per i and writes its 512 contiguous E4M3 bytes with one
  // store (whole sectors; the first version's 16-byte-per-lane chunks, each store writing half sectors 32 bytes apart,
  // took as long as the two separate kernels: 24.5-25.9 against 17.5-17.9 µs on an H100, stop 51).
  uint2 w[kPerThread];
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int h = i * kFp4FusedThreads + t;
    const int cr = h / kHalvesPerRow, qh = 8 * kb0 + h % kHalvesPerRow;  // qh: the half's index along the row
    const bool valid = tile_row0 + cr < s.n && qh / 2 < groups;
    w[i] = valid ? __ldcs(reinterpret_cast<const uint2*>(b + (group * s.n + tile_row0 + cr) * ldb +
                                                         static_cast<int64_t>(qh) * 8))
                 : make_uint2(0, 0);
  }
  // Phase 1: thread t takes K block kb0 + t % kFp4FusedBlocks of rows t / kFp4FusedBlocks + kRowStep · i: each pair's
  // four exponents, their largest and smallest; then the thread's, the warp's (lanes of one K block: equal lane %
  // kFp4FusedBlocks) and the CTA's per K block.
  const int bl = t % kFp4FusedBlocks, kb = kb0 + bl;
  const bool block_valid = kb < blocks;
  const uint8_t* scale_at = s.scale + group * s.group_stride;
  int e[kPairs][4], hi[kPairs];
  int thi = 0, tlo = 255;
  bool row_wide = false;
#pragma unroll
  for (int i = 0; i < kPairs; ++i) {
    const int r = t / kFp4FusedBlocks + kRowStep * i;
    const bool valid = block_valid && tile_row0 + r < s.n;
    int h = 0, l = 255;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int g = 4 * kb + j;
      e[i][j] = valid && g < groups ? static_cast<int>(scale_at[static_cast<int64_t>(tile_row0 + r) * s.stride_n + g]) : -1;
      if (e[i][j] >= 0) {
        h = max(h, e[i][j]);
        l = min(l, e[i][j]);
      }
    }
    hi[i] = h;
    row_wide = row_wide || (valid && h - l > 8);
    thi = max(thi, h);
    tlo = min(tlo, l);
  }
  if (row_wide) atomicOr(flags, kFp4RowUnfoldable);
#pragma unroll
  for (int off = kFp4FusedBlocks; off < 32; off *= 2) {
    thi = max(thi, __shfl_xor_sync(0xFFFFFFFFu, thi, off));
    tlo = min(tlo, __shfl_xor_sync(0xFFFFFFFFu, tlo, off));
  }
  const int warp = t / 32, lane = t % 32;
  if (lane < kFp4FusedBlocks) {
    blk_hi[warp][lane] = thi;
    blk_lo[warp][lane] = tlo;
  }
  __syncthreads();
  if (t < kFp4FusedBlocks) {
    int h = 0, l = 255;
#pragma unroll
    for (int v = 0; v < kWarps; ++v) {
      h = max(h, blk_hi[v][t]);
      l = min(l, blk_lo[v][t]);
    }
    const bool fold = h - l <= 8;
    tile_hi[t] = h;
    tile_fold[t] = fold;
    if (kb0 + t < blocks) {
      if (!fold) atomicOr(flags, kFp4TileUnfoldable);
      tile_emax[tile * blocks + kb0 + t] = h;
      tile_scale[tile * blocks + kb0 + t] = fmt::ue8m0_to_float(static_cast<uint8_t>(h));
    }
  }
  __syncthreads();
  // Each pair's fold base (the tile's top where the tile folds, else the row block's), its row scale and its groups'
  // fold rows.
#pragma unroll
  for (int i = 0; i < kPairs; ++i) {
    const int r = t / kFp4FusedBlocks + kRowStep * i;
    const int base = tile_fold[bl] ? tile_hi[bl] : hi[i];
    if (block_valid && tile_row0 + r < s.n)
      row_scale[(group * s.n + tile_row0 + r) * blocks + kb] = fmt::ue8m0_to_float(static_cast<uint8_t>(base));
#pragma unroll
    for (int j = 0; j < 4; ++j) dist[r][4 * bl + j] = static_cast<uint8_t>(e[i][j] >= 0 ? min(base - e[i][j], 8) : 0);
  }
  __syncthreads();
  // Phase 2: expand the halves loaded at the start.
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int h = i * kFp4FusedThreads + t;
    const int cr = h / kHalvesPerRow, qh = 8 * kb0 + h % kHalvesPerRow;
    if (!(tile_row0 + cr < s.n && qh / 2 < groups)) continue;
    const uint2 tab = table[dist[cr][(h % kHalvesPerRow) / 2]];
    uint32_t o[4];
    e2m1x8_to_e4m3x8(w[i].x, tab.x, tab.y, o[0], o[1]);
    e2m1x8_to_e4m3x8(w[i].y, tab.x, tab.y, o[2], o[3]);
    *reinterpret_cast<uint4*>(out + (group * s.n + tile_row0 + cr) * static_cast<int64_t>(k) +
                              static_cast<int64_t>(qh) * 16) = make_uint4(o[0], o[1], o[2], o[3]);
  }
}

}  // namespace finegemm::cuda
