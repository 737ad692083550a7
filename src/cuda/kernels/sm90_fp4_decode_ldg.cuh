// The sm_90a FP4 decode kernel without producer warps (FINEGEMM_FP4_DECODE_LDG=1): y[M, N] = x[M, K] · W[N, K]ᵀ
// for M ≤ 64 tokens, packed E2M1 weights with UE8M0 byte scales per 1x32, E4M3 activations quantized by linear() in
// the permuted order of the FP4 decode kernel (GemmParams::a_perm_k, fp4_perm_k_logical), one activation scale per
// 128 of K (per token and group of 128 or more, static, or none).
//
// Why another kernel: the FP4 decode kernel (sm90_fp4_decode.cuh) streams its weights through a TMA ring that a loader
// warp (and a preparer warp) feed stage by stage, 128 of K at a time. ncu put ~1150 warp instructions on each CTA stage
// of 4 KB of packed weights, with the SM's issue the bound: FP4 decode ran at the FP8 kernel's stage rate, so at half
// its bandwidth. Here the CTA is one warpgroup and nothing else:
//   - every thread copies its own bytes with cp.async (no loader warp, no mbarriers): per chunk of 512 of K, the
//     16-byte MX group t of each 128 of K of its rows r and r + 8 (eight copies, one per row and block: the permuted
//     activations make that group the thread's whole A fragment for the block), the rows' 16 UE8M0 scale bytes, and
//     its share of the chunk's activation tile (WN tokens × 512 bytes, written in the 128-byte swizzle the wgmma's B
//     descriptor reads) and activation scales;
//   - a ring of kRing chunk slots in shared memory, kRing - 1 chunks in flight while one is computed; one
//     __syncthreads_and per chunk both publishes the chunk's activation tile and takes the warpgroup's fold vote;
//   - per 128 of K the fold of the FP4 decode kernel's permuted path (each row's group t through the table of its
//     distance below the block's largest scale, one wgmma chain, promoted with 2^e_max), or where some row of the
//     chunk spreads past 8 binades, four chains per block, each keeping one group's lanes and promoted with that
//     group's scale: exact either way;
//   - the wgmma group of block j left running while block j + 1 is loaded and expanded (two accumulator sets).
// Work: one CTA per (64-row weight tile, K split of whole chunks). With split-K the totals go to
// p.workspace[split][M][N] raw (splitk_reduce_kernel applies the epilogue); otherwise the epilogue stores y.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/kernels/fp4_expand.hpp"
#include "cuda/kernels/gemm_params.cuh"
#include "cuda/kernels/fp4_decode_common.cuh"
#include "cuda/kernels/sm90_fp8_gemm.cuh"
#include "cuda/ptx/ptx.cuh"
#include "cuda/ptx/wgmma_fp8.cuh"

namespace finegemm::cuda {

inline constexpr int kFp4LdgRows = 64;       // weight rows per CTA: one consumer warpgroup
inline constexpr int kFp4LdgThreads = 128;
inline constexpr int kFp4LdgBlocks = 4;      // 128-wide K blocks per chunk (512 of K)

// Chunk slots of the ring: two chunks in flight beside the one computed up to 32 tokens, one at 64 (two CTAs per SM).
template <int WN>
inline constexpr int kFp4LdgRing = WN >= 64 ? 2 : 3;

// Shared memory: the ring's activation tiles [kRing][4 blocks][WN tokens][128 bytes] (128-byte swizzle, each
// 1024-aligned), then per slot the threads' packed codes [4 blocks][2 rows][128 threads][16 bytes], their scale bytes
// [2 rows][128 threads][16 bytes] and the activation scales [4 blocks][WN] float, then the fold table. At WN = 8 the
// 73.5 KB leave three CTAs per SM.
template <int WN>
struct Fp4LdgSmem {
  static constexpr int kX = kFp4LdgBlocks * WN * 128;
  static constexpr int kW = kFp4LdgBlocks * 2 * kFp4LdgThreads * 16;
  static constexpr int kWords = 2 * kFp4LdgThreads * 16;
  static constexpr int kXs = kFp4LdgBlocks * WN * 4;
  static constexpr int kRest = kW + kWords + kXs;
  static constexpr int kTable = 16 * 8;  // fold table rows 0-8 (fp4_fold_table_row)
  static constexpr int kBytes = kFp4LdgRing<WN> * (kX + kRest) + kTable + 1024;  // + the base's 1024-byte alignment
};

// cp.async of 16 bytes into shared memory, of which the first src_bytes (0..16) come from global memory and the rest
// are zero (src_bytes 0 reads nothing: src need only be a valid address).
__device__ __forceinline__ void ldg_cp_async_16(void* smem_dst, const void* gmem_src, uint32_t src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(ptx::smem_addr(smem_dst)), "l"(gmem_src),
               "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void ldg_cp_async_4(void* smem_dst, const void* gmem_src, uint32_t src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(ptx::smem_addr(smem_dst)), "l"(gmem_src),
               "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void ldg_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void ldg_cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// grid: tiles × split_k CTAs of 128 threads; each split takes chunks [split · chunks_per_split, ...) of 512 of K.
// words16: the weight scale rows are 16-byte aligned (one copy of a row's 16 scale bytes per chunk), else four 4-byte
// copies (4-byte aligned rows of a multiple of 4 groups, as the permuted kernel asks).
// kGrouped (MoE experts on the decode path, FINEGEMM_FP4_DECODE_LDG=1 there too): blockIdx.x is (expert slot, tile,
// split) over the experts listed on the device (DecodeGroups, as the FP4 decode kernel's grouped launch); the expert's
// rows of x run in chunks of WN (each streams the expert's weights again), and the epilogue applies its scales, bias
// (split 0) and the rows' routing weights; split-K partials hold the whole epilogue (the reduce only sums).
template <int WN, bool kGrouped = false>
__global__ void __launch_bounds__(kFp4LdgThreads, WN >= 64 ? 2 : 3)
    sm90_fp4_decode_ldg_kernel(const uint8_t* __restrict__ x, int64_t lda, const uint8_t* __restrict__ w, int64_t ldw,
                               const GemmParams p, int split_k, int chunks_per_split, bool words16,
                               const DecodeGroups groups, int tiles) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(WN == 8 || WN == 16 || WN == 32 || WN == 64, "WN: 8, 16, 32 or 64 token columns");
  using Smem = Fp4LdgSmem<WN>;
  constexpr int kRing = kFp4LdgRing<WN>;
  using Mma = ptx::WgmmaFp8RegA<WN>;
  constexpr int kAcc = WN / 2;
  constexpr uint32_t kDescHi = ptx::kDescHiKMajorSw128;

  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (ptx::smem_addr(smem_raw) & 1023)) & 1023);
  uint8_t* smem_rest = smem + kRing * Smem::kX;
  uint2* fold_tab = reinterpret_cast<uint2*>(smem_rest + kRing * Smem::kRest);

  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32, lane = tid % 32;
  const int g = lane >> 2, t = lane & 3;
  const int split = static_cast<int>(blockIdx.x) % split_k;
  const int tile = static_cast<int>(blockIdx.x) / split_k % tiles;
  const int n0 = tile * kFp4LdgRows;
  // Programmatic launch (p.pdl): the activations (and, grouped, the expert list) are the kernel ahead's output, so
  // wait for it (a no-op otherwise) before reading them. A dense call whose kernel ahead writes no weights
  // (p.pdl_weights_ready: linear()'s activation quantization, or the caller's promise) requests the first chunks'
  // weights before it waits.
  const bool weights_first = !kGrouped && p.pdl_weights_ready;
  if (!weights_first) cudaGridDependencySynchronize();
  // Grouped: this CTA's expert, its rows [row0, row0 + rows) of x and of the output, and its weights' first row.
  int group = 0, row0 = 0, rows = p.m;
  if constexpr (kGrouped) {
    const int slot = static_cast<int>(blockIdx.x) / split_k / tiles;
    if (slot >= *groups.list_count) return;  // the whole CTA, before any barrier
    group = __shfl_sync(0xffffffffu, groups.list[slot], 0);
    row0 = __shfl_sync(0xffffffffu, groups.offsets[group], 0);
    rows = __shfl_sync(0xffffffffu, groups.offsets[group + 1], 0) - row0;
  }
  const int r0 = warp * 16 + g;  // this thread's rows of the tile: r0 and r0 + 8
  const int num_kb = p.k / 128;
  const int num_chunks = (num_kb + kFp4LdgBlocks - 1) / kFp4LdgBlocks;
  const int c_begin = split * chunks_per_split;
  const int c_end = min(num_chunks, c_begin + chunks_per_split);
  if (tid < 9) fold_tab[tid] = fp4_fold_table_row(tid);

  // Per thread, what does not change along K: its rows' code and scale pointers (rows past N read row N - 1; their
  // results are never stored), and the activation pieces it copies.
  const int scale_cols = p.b_scale_cols;  // K / 32 groups per row
  const uint8_t* w_row[2];
  const uint8_t* s_row[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t n = static_cast<int64_t>(group) * p.n + min(n0 + r0 + 8 * h, p.n - 1);
    w_row[h] = w + n * ldw + 16 * t;
    s_row[h] = static_cast<const uint8_t*>(p.b_scale) + group * p.b_scale_group_stride +
               static_cast<int64_t>(min(n0 + r0 + 8 * h, p.n - 1)) * p.b_scale_stride_n;
  }
  const int x_last = p.a_scale_cols - 1;
  const int x_blocks_per_group = max(1, p.a_group / 128);

  // This chunk of tokens: rows tok0 .. tok0 + tok_count - 1 of x and of y (dense: all M, one chunk).
  int tok0 = row0, tok_count = min(WN, rows);
  // Chunk c's copies into its slot (nothing past the split): the weights' part and the activations' part; issue()
  // commits both as one group (committed empty past the split, so that every thread's group count stays one per
  // chunk).
  auto issue_w = [&](int c) {
    if (c < c_end) {
      uint8_t* sw = smem_rest + (c % kRing) * Smem::kRest;
      uint8_t* swords = sw + Smem::kW;
#pragma unroll
      for (int jb = 0; jb < kFp4LdgBlocks; ++jb) {
        const int kb = c * kFp4LdgBlocks + jb;
        const bool valid = kb < num_kb;
#pragma unroll
        for (int h = 0; h < 2; ++h)
          ldg_cp_async_16(sw + ((jb * 2 + h) * kFp4LdgThreads + tid) * 16, valid ? w_row[h] + kb * 64 : w_row[h],
                          valid ? 16u : 0u);
      }
      // The rows' scale bytes of the chunk: groups 16c .. 16c + 15, those past the row's last group zero.
      const int valid_bytes = min(16, scale_cols - 16 * c);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        uint8_t* dst = swords + (h * kFp4LdgThreads + tid) * 16;
        const uint8_t* src = s_row[h] + 16 * c;
        if (words16) {
          ldg_cp_async_16(dst, src, static_cast<uint32_t>(valid_bytes));
        } else {
#pragma unroll
          for (int q = 0; q < 4; ++q)
            ldg_cp_async_4(dst + 4 * q, 4 * q < valid_bytes ? src + 4 * q : s_row[h], 4 * q < valid_bytes ? 4u : 0u);
        }
      }
    }
  };
  auto issue_x = [&](int c) {
    if (c < c_end) {
      uint8_t* sx = smem + (c % kRing) * Smem::kX;
      float* sxs = reinterpret_cast<float*>(smem_rest + (c % kRing) * Smem::kRest + Smem::kW + Smem::kWords);
      // The activation tile: 4 blocks × WN tokens × 8 pieces of 16 bytes; piece q of token r in block jb at
      // jb·WN·128 + r·128 + ((q ^ (r & 7)) << 4). Tokens past M and blocks past K are zero.
      for (int e = tid; e < kFp4LdgBlocks * WN * 8; e += kFp4LdgThreads) {
        const int q = e & 7, r = (e >> 3) % WN, jb = e / (8 * WN);
        const int kb = c * kFp4LdgBlocks + jb;
        const bool valid = r < tok_count && kb < num_kb;
        ldg_cp_async_16(sx + jb * WN * 128 + r * 128 + ((q ^ (r & 7)) << 4),
                        valid ? x + static_cast<int64_t>(tok0 + r) * lda + kb * 128 + 16 * q : x, valid ? 16u : 0u);
      }
      // The activation scales [4][WN]: one per token and 128 of K (the last token's for the columns past M).
      for (int e = tid; e < kFp4LdgBlocks * WN; e += kFp4LdgThreads) {
        const int jb = e / WN, r = e % WN;
        const int kb = min(c * kFp4LdgBlocks + jb, num_kb - 1);
        if (p.a_scale) {
          const int xg = min(kb / x_blocks_per_group, x_last);
          ldg_cp_async_4(sxs + e,
                         p.a_scale + static_cast<int64_t>(tok0 + min(r, tok_count - 1)) * p.a_scale_stride_m +
                             static_cast<int64_t>(xg) * p.a_scale_stride_k,
                         4u);
        } else {
          sxs[e] = 1.0f;
        }
      }
    }
  };
  auto issue = [&](int c) {
    issue_w(c);
    issue_x(c);
    ldg_cp_async_commit();
  };

  float total[kAcc];

  // total += acc · (row r0's, row r0 + 8's scale) · the tokens' scales of the block.
  auto add_block = [&](const float (&acc)[kAcc], float rs0, float rs1, const float* xs) {
#pragma unroll
    for (int j = 0; j < WN / 8; ++j) {
      const float2 xv = *reinterpret_cast<const float2*>(xs + 8 * j + 2 * t);
      total[4 * j + 0] = fmaf(acc[4 * j + 0] * rs0, xv.x, total[4 * j + 0]);
      total[4 * j + 1] = fmaf(acc[4 * j + 1] * rs0, xv.y, total[4 * j + 1]);
      total[4 * j + 2] = fmaf(acc[4 * j + 2] * rs1, xv.x, total[4 * j + 2]);
      total[4 * j + 3] = fmaf(acc[4 * j + 3] * rs1, xv.y, total[4 * j + 3]);
    }
  };

  // Dense: one chunk of all M tokens (a loop of one trip the compiler sees).
  for (int tc = 0; tc < (kGrouped ? rows : 1); tc += WN) {
    tok0 = row0 + tc;
    tok_count = kGrouped ? min(WN, rows - tc) : p.m;
    if (tc > 0) __syncthreads();  // every thread is done with the previous token chunk's ring
    if (weights_first) {
      // The first group holds the first kRing - 1 chunks' weights and the first chunk's activations.
#pragma unroll
      for (int s = 0; s < kRing - 1; ++s) issue_w(c_begin + s);
      cudaGridDependencySynchronize();
#pragma unroll
      for (int s = 0; s < kRing - 1; ++s) {
        issue_x(c_begin + s);
        ldg_cp_async_commit();
      }
    } else {
#pragma unroll
      for (int s = 0; s < kRing - 1; ++s) issue(c_begin + s);
    }
#pragma unroll
    for (int i = 0; i < kAcc; ++i) total[i] = 0.0f;
    for (int c = c_begin; c < c_end; ++c) {
      ldg_cp_async_wait<kRing - 2>();  // this thread's copies of chunk c have landed
      const uint8_t* sx = smem + (c % kRing) * Smem::kX;
      const uint8_t* sw = smem_rest + (c % kRing) * Smem::kRest;
      const uint8_t* swords = sw + Smem::kW;
      const float* sxs = reinterpret_cast<const float*>(swords + Smem::kWords);
      const uint4 words0 = *reinterpret_cast<const uint4*>(swords + tid * 16);
      const uint4 words1 = *reinterpret_cast<const uint4*>(swords + (kFp4LdgThreads + tid) * 16);
      const uint32_t word[2][4] = {{words0.x, words0.y, words0.z, words0.w}, {words1.x, words1.y, words1.z, words1.w}};
      int emax[kFp4LdgBlocks][2], dist[kFp4LdgBlocks][2];
      bool ok = true;
#pragma unroll
      for (int jb = 0; jb < kFp4LdgBlocks; ++jb)
#pragma unroll
        for (int h = 0; h < 2; ++h) ok = fp4_perm_fold(word[h][jb], t, emax[jb][h], dist[jb][h]) && ok;
      // Every thread's copies of chunk c have landed and are visible (the activation tile is everyone's), every thread
      // is done with chunk c - 1 (its wgmma waited for), and the warpgroup's vote: whether every row folds every block.
      const bool fold = __syncthreads_and(ok) != 0;
      issue(c + kRing - 1);  // into chunk c - 1's slot

      const uint32_t desc_x0 = ptx::desc_lo_k_major_sw128(ptx::smem_addr(sx));
      const int blocks = min(kFp4LdgBlocks, num_kb - c * kFp4LdgBlocks);
      // Block jb's chain: each row's group-t codes through the table of its distance, four k32 steps into acc.
      auto fold_block = [&](int jb, float (&acc)[kAcc]) {
        const Chunk16 codes0 = *reinterpret_cast<const Chunk16*>(sw + ((jb * 2 + 0) * kFp4LdgThreads + tid) * 16);
        const Chunk16 codes1 = *reinterpret_cast<const Chunk16*>(sw + ((jb * 2 + 1) * kFp4LdgThreads + tid) * 16);
        const uint2 tab0 = fold_tab[dist[jb][0]], tab1 = fold_tab[dist[jb][1]];
        uint32_t a[4][4];
        fp4_perm_fragments(codes0, codes1, tab0.x, tab0.y, tab1.x, tab1.y, a);
        const uint32_t desc_x = desc_x0 + static_cast<uint32_t>((jb * WN * 128) >> 4);
        ptx::wgmma_fence();
#pragma unroll
        for (int s = 0; s < 4; ++s)
          Mma::mma(a[s], ptx::desc_from_words(desc_x + static_cast<uint32_t>((s * 32) >> 4), kDescHi), acc, s > 0);
        ptx::wgmma_commit();
      };
      auto fold_add = [&](int jb, float (&acc)[kAcc]) {
        ptx::fence_operands(acc);
        add_block(acc, ue8m0_bits_to_float(static_cast<uint32_t>(emax[jb][0])),
                  ue8m0_bits_to_float(static_cast<uint32_t>(emax[jb][1])), sxs + jb * WN);
      };
      if (fold && blocks == kFp4LdgBlocks) {
        // Block jb's group runs while block jb + 1 is loaded and expanded (two accumulator sets).
        float acc[2][kAcc];
#pragma unroll
        for (int jb = 0; jb < kFp4LdgBlocks; ++jb) {
          fold_block(jb, acc[jb & 1]);
          if (jb > 0) {
            ptx::wgmma_wait<1>();
            fold_add(jb - 1, acc[(jb - 1) & 1]);
          }
        }
        ptx::wgmma_wait<0>();
        fold_add(kFp4LdgBlocks - 1, acc[(kFp4LdgBlocks - 1) & 1]);
      } else if (fold) {
        // The K tail's chunk: its blocks one at a time (unrolled, so that emax and dist stay in registers).
#pragma unroll
        for (int jb = 0; jb < kFp4LdgBlocks; ++jb) {
          if (jb >= blocks) break;
          float acc[kAcc];
          fold_block(jb, acc);
          ptx::wgmma_wait<0>();
          fold_add(jb, acc);
        }
      } else {
        // Some row spreads past 8 somewhere in the chunk: per block, four chains over the plain codes, chain gi
        // keeping only the lanes of group gi (t == gi), promoted with that group's scale (the permuted kernel's way).
        const uint2 plain = fold_tab[0];
#pragma unroll 1
        for (int jb = 0; jb < blocks; ++jb) {
          const Chunk16 codes0 = *reinterpret_cast<const Chunk16*>(sw + ((jb * 2 + 0) * kFp4LdgThreads + tid) * 16);
          const Chunk16 codes1 = *reinterpret_cast<const Chunk16*>(sw + ((jb * 2 + 1) * kFp4LdgThreads + tid) * 16);
          const uint32_t desc_x = desc_x0 + static_cast<uint32_t>((jb * WN * 128) >> 4);
#pragma unroll 1
          for (int gi = 0; gi < 4; ++gi) {
            float acc[kAcc];
            fp4_perm_group_chain<WN>(codes0, codes1, plain, t, gi, desc_x, acc);
            // The word's byte gi of each row: any block of the chunk (word[h][jb] with jb varying at run time).
            uint32_t wd0 = word[0][0], wd1 = word[1][0];
#pragma unroll
            for (int q = 1; q < kFp4LdgBlocks; ++q) {
              wd0 = jb == q ? word[0][q] : wd0;
              wd1 = jb == q ? word[1][q] : wd1;
            }
            add_block(acc, ue8m0_bits_to_float((wd0 >> (8 * gi)) & 0xFFu),
                      ue8m0_bits_to_float((wd1 >> (8 * gi)) & 0xFFu), sxs + jb * WN);
          }
        }
      }
    }
    ldg_cp_async_wait<0>();  // the empty groups past the split: no copy outlives the chunk

    // Epilogue: accumulator i holds row n0 + r0 + 8·((i >> 1) & 1), token 8·(i >> 2) + 2t + (i & 1) of the chunk.
#pragma unroll
    for (int i = 0; i < kAcc; ++i) {
      const int tok = 8 * (i >> 2) + 2 * t + (i & 1);
      const int n = n0 + r0 + 8 * ((i >> 1) & 1);
      if (tok >= tok_count || n >= p.n) continue;
      const int row = tok0 + tok;
      decode_store<kGrouped>(p, group, split, row, n, total[i]);
    }
  }  // token chunks
#endif
}

}  // namespace finegemm::cuda
