// The sm_90a decode GEMM for FP4 weights (M ≤ 64 tokens; MoE experts in chunks of up to 64, or 128 on permuted
// activations): y[M, N] = x[M, K] · W[N, K]ᵀ with E4M3 x (per-token-group,
// per-token or static scales) and packed E2M1 W (two per byte, low nibble first) with MX 1x32 scales (UE8M0, packed
// UE8M0 or FP32).
//
// Swap AB: the weights are the wgmma's A operand, 64 weight rows per warpgroup, and the tokens its N (WN = 8, 16, 32
// or 64 columns, and 128 on permuted activations, from shared memory). A comes from registers: each consumer thread reads the packed bytes of its
// fragment from the TMA-loaded tile and expands them to E4M3 in registers (exact), so no expanded copy of the weights
// is written to shared memory and the expansion is ALU work spread over 128 threads. The general kernel
// (sm90_fp8_gemm.cuh) expands into shared memory with three loader warps, which bounded FP4 decode at 0.53 TB/s.
//
// CTA: one consumer warpgroup (warps 0-3), a loader warp (warp 4) and, for FP4 weights, a preparer warp (warp 5; none
// on permuted activations, kPermK below).
//   - Loader: per stage (128 or 256 of K), TMA loads of the packed weight tile (64 rows × 64 or 128 bytes,
//     swizzled) and the activation tile (WN rows × 128 bytes per 128 of K, 128-byte swizzle, rows past M
//     zero-filled), and cp.async copies of the stage's scales into shared memory (weight scales per row and group,
//     activation scales per token and step), which arrive on the stage's `landed` barrier (FP4) or, for E4M3
//     weights, on its full barrier.
//   - Preparer: once a stage's copies have landed, it prepares the weight scales for the consumers
//     (fp4_decode_prepare_scales): per 128 of K, a flag whether the whole tile folds, and then per row and group
//     either the expansion table or the float scale; its 32 arrivals complete the stage's full barrier with the TMA
//     bytes. A separate warp, so that it never waits for a free stage: done by the loader one stage late, the
//     preparation left one stage of lookahead for the scale loads (45 µs at M = 1, N = 7168, K = 16384).
//   - Consumers, per 128 of K (four 32-wide steps, four MX groups per row), one of two ways, as the flag says:
//     - fold: UE8M0 scales within 2^8 of the row's largest in every row, one activation scale over the 128: each
//       group's codes expand through its table, scaled by 2^-(e_max - e) (exact in E4M3), the four wgmma
//       m64nWNk32 accumulate in one chain, and total += acc · 2^e_max · x_scale[token] once;
//     - per step: each step's wgmma into its own accumulator (up to four in flight), then sum += acc · w_scale[row]
//       and, at the end of each activation group (32, 64 or 128 wide), total += sum · x_scale[token].
//     Both are exact for any spread of the weight scales. The consumers' work per 128 of K is the loads of their
//     codes and tables, the expansion (five instructions per four codes) and the wgmmas: ncu had the earlier
//     consumers, which made the fold decision themselves, bound by instruction issue.
// Work: one CTA per (64-row weight tile, K split). With split-K the partial totals go to p.workspace[split][M][N]
// (splitk_reduce_kernel finishes), or, with p.decode_cluster_reduce, stay in shared memory and the tile's cluster of
// split CTAs sums them there; otherwise the epilogue stores y with the row/col scales and the bias.
#pragma once
#include "cuda/kernels/fp4_decode_common.cuh"
#include "cuda/kernels/fp4_expand.hpp"
#include "cuda/kernels/sm90_fp8_gemm.cuh"
#include "cuda/kernels/split_finish.cuh"

namespace finegemm::cuda {

inline constexpr int kFp4DecodeRows = 64;  // weight rows per CTA (one consumer warpgroup)

// kStageK: K per pipeline stage, 128 or 256 (weight rows of 64 or 128 bytes per TMA box row; the activation tile is
// one or two 128-byte-swizzled boxes).
// kFp8W: E4M3 weights (128 bytes per row and 128 of K), the option FINEGEMM_FP8_DECODE=1.
// Per stage, in order: activations, weights, then (FP4 weights only) per 128 of K ("block"):
//   fold:  [4][64] uint2 expansion tables (the fold) or [4][64] float scales (per step), 2 KB;
//   words: [64] uint32, the rows' four UE8M0 scales as copied (UE8M0 and packed UE8M0 scales);
//   row:   [64] float, 2^e_max per row (the fold);
//   flag:  uint32, whether the block folds (padded to 16 bytes per stage);
// and the activation scales [kSteps][WN] float.
// kRows: weight rows per CTA, 64 (one consumer warpgroup) or, for E4M3 weights, 128 (two warpgroups sharing the
// activation tile: FINEGEMM_DECODE_ROWS=128).
// kPermK (permuted activations, no preparer): the words (and the flags, for prepared fold words); no fold area or
// row scales.
// kNoFold (prepared fold words without a preparer warp, kPreparers = 0): no fold area or row scales; the flags stay.
template <int WN, int kStages, int kStageK, bool kFp8W = false, int kRows = kFp4DecodeRows, bool kPermK = false,
          bool kNoFold = false>
struct Fp4DecodeSmem {
  static constexpr int kSteps = kStageK / 32;                     // wgmma k32 steps (MX groups) per stage
  static constexpr int kBlocks = kStageK / 128;                   // 128s of K per stage
  static constexpr int kStageX = WN * kStageK;                    // E4M3 activations: kStageK / 128 boxes of WN × 128
  static constexpr int kStageW = kRows * kStageK / (kFp8W ? 1 : 2);  // weights, packed FP4 or E4M3
  static constexpr int kBlockFold = 4 * kFp4DecodeRows * 8;
  static constexpr int kStageFold = kFp8W || kPermK || kNoFold ? 0 : kBlocks * kBlockFold;
  static constexpr int kStageWords = kFp8W ? 0 : kBlocks * kFp4DecodeRows * 4;
  static constexpr int kStageRowScale = kFp8W || kPermK || kNoFold ? 0 : kBlocks * kFp4DecodeRows * 4;
  static constexpr int kStageFlags = kFp8W ? 0 : 16;  // kPermK: for prepared fold words only
  static constexpr int kStageXScales = kSteps * WN * 4;  // [kSteps][WN] float
  static constexpr int kFoldTable = 16 * 8;              // rows 0-8: fp4_fold_table_row(d)
  static constexpr int kBytes = kStages * (kStageX + kStageW + kStageFold + kStageWords + kStageRowScale + kStageFlags +
                                           kStageXScales) +
                                3 * kStages * 8 + kFoldTable + 1024;
};

// Threads per CTA: the consumer warpgroups (one per 64 weight rows), the loader warp and (FP4 weights) the preparer
// warps (kPreparers: 1, or 2 with FINEGEMM_FP4_DECODE_PREPARERS=2, or 0 on prepared fold words with
// FINEGEMM_FP4_DECODE_FOLD_CACHE=2; none on permuted activations, kPermK).
template <bool kFp8W, int kRows = kFp4DecodeRows, int kPreparers = 1, bool kPermK = false>
inline constexpr int kFp4DecodeThreads = 2 * kRows + 32 + (kFp8W || kPermK ? 0 : 32 * kPreparers);

// The wgmma A fragment (m64k32, 8-bit) of step s for this thread: rows r and r + 8 of the warp's 16, columns
// 4t..4t+3 and 16+4t..16+4t+3. In the packed tile (kRowBytes per row) a step is one 16-byte chunk of each row; the
// thread's columns are bytes 2t..2t+1 and 8+2t..9+2t of it. Swizzled, chunk c of row r sits at c ^ (r/2 % 4) with
// 64-byte rows (64-byte swizzle) and at c ^ (r % 8) with 128-byte rows (128-byte swizzle).
// fp4_fragment_offset: the byte offset of the first pair in the tile (the second is 8 bytes on), the same in every
// stage, so computed once.
template <int kRowBytes>
__device__ __forceinline__ int fp4_fragment_offset(int row, int t, int s, bool swizzle) {
  const int pattern = swizzle ? (kRowBytes == 64 ? ((row >> 1) & 3) : (row & 7)) : 0;
  return row * kRowBytes + ((s ^ pattern) << 4) + 2 * t;
}

// The packed codes of one step's fragment, in the order of the A registers: row r lo, row r + 8 lo, row r hi,
// row r + 8 hi (16 bits each).
__device__ __forceinline__ void fp4_fragment_load(const uint8_t* tile, int off0, int off1, uint32_t (&raw)[4]) {
  raw[0] = *reinterpret_cast<const uint16_t*>(tile + off0);
  raw[1] = *reinterpret_cast<const uint16_t*>(tile + off1);
  raw[2] = *reinterpret_cast<const uint16_t*>(tile + off0 + 8);
  raw[3] = *reinterpret_cast<const uint16_t*>(tile + off1 + 8);
}

// The expansion of a loaded fragment (exact): row r's codes through tab0, row r + 8's through tab1.
__device__ __forceinline__ void fp4_fragment_expand(const uint32_t (&raw)[4], uint2 tab0, uint2 tab1, uint32_t (&a)[4]) {
  a[0] = e2m1x4_to_e4m3x4(raw[0], tab0.x, tab0.y);
  a[1] = e2m1x4_to_e4m3x4(raw[1], tab1.x, tab1.y);
  a[2] = e2m1x4_to_e4m3x4(raw[2], tab0.x, tab0.y);
  a[3] = e2m1x4_to_e4m3x4(raw[3], tab1.x, tab1.y);
}

// Four UE8M0 scales (one byte each, group j in byte j) as floats, exactly (ue8m0_bits_to_float): the common case,
// no byte 0 or 255, takes a shift and a mask per scale.
__device__ __forceinline__ void ue8m0x4_to_float(uint32_t w, float (&out)[4]) {
  const uint32_t has_zero = (w - 0x01010101u) & ~w & 0x80808080u;
  const uint32_t has_ff = (~w - 0x01010101u) & w & 0x80808080u;
  if ((has_zero | has_ff) == 0u) {
    out[0] = __uint_as_float((w << 23) & 0x7F800000u);
    out[1] = __uint_as_float((w << 15) & 0x7F800000u);
    out[2] = __uint_as_float((w << 7) & 0x7F800000u);
    out[3] = __uint_as_float((w >> 1) & 0x7F800000u);
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j) out[j] = ue8m0_bits_to_float((w >> (8 * j)) & 0xFFu);
  }
}

// A role's position in the stage ring: the stage and the parity of its barriers' current phase, advanced by one
// stage at a time (no division by kStages per stage: ncu counted them among the consumers' per-stage overhead).
template <int kStages>
struct RingPosition {
  int stage = 0;
  uint32_t phase = 0;
  __device__ __forceinline__ void advance() {
    if (++stage == kStages) {
      stage = 0;
      phase ^= 1u;
    }
  }
};

// Whether the weight scales are staged as 32-bit words of four groups (UE8M0 bytes or packed UE8M0) rather than one
// float per group. UE8M0 bytes need 4-byte aligned rows of a multiple of 4 groups (fp4_decode_scales_ok, host).
__device__ __forceinline__ bool fp4_decode_word_scales(const GemmParams& p) { return p.b_scale_fmt != ScaleFmt::F32; }

// The preparer warp's preparation of one stage's weight scales (FP4 weights), once its copies have landed: per 128
// of K (block q), with `valid` of its four MX groups inside K (at the K tail the rest have zero-filled codes; their
// scales take no part and are 0):
//   - UE8M0 words, when the recipe may fold (`may_fold`) and every row of the tile has its valid scales within 2^8 of
//     its largest e_max: flag 1, the tables fp4_fold_table_row(e_max - e) per row and group, 2^e_max per row;
//   - otherwise flag 0 and the groups' float scales (FP32 scales were copied as floats: only the tail is zeroed).
// Lane l prepares rows l and l + 32. (With two preparer warps, kPreparers = 2, each prepares every other stage whole.)
template <int kBlocks>
__device__ __forceinline__ void fp4_decode_prepare_scales(const GemmParams& p, bool word_scales, bool may_fold, int kb,
                                                          int lane, const uint2* fold_tab, uint8_t* fold,
                                                          const uint32_t* words, float* row_scale, uint32_t* flags) {
#pragma unroll
  for (int q = 0; q < kBlocks; ++q) {
    const int valid = p.b_scale_cols - (kb * kBlocks + q) * 4;
    uint2* tab = reinterpret_cast<uint2*>(fold + q * (4 * kFp4DecodeRows * 8));
    float* scale = reinterpret_cast<float*>(fold + q * (4 * kFp4DecodeRows * 8));
    bool vote = false;
    if (word_scales) {
      int e[2][4], hi[2];
      bool ok = may_fold;
      // Every block but the K tail's has its four groups inside K: no per-group masks there (the preparer shares a
      // scheduler with four consumer warps, so its instructions count).
      const bool whole = valid >= 4;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t w = words[q * kFp4DecodeRows + lane + 32 * h];
#pragma unroll
        for (int j = 0; j < 4; ++j) e[h][j] = static_cast<int>((w >> (8 * j)) & 0xFFu);
        int lo;
        if (whole) {
          hi[h] = max(max(e[h][0], e[h][1]), max(e[h][2], e[h][3]));
          lo = min(min(e[h][0], e[h][1]), min(e[h][2], e[h][3]));
        } else {
          lo = 255;
          hi[h] = 0;
#pragma unroll
          for (int j = 0; j < 4; ++j)
            if (j < valid) hi[h] = max(hi[h], e[h][j]), lo = min(lo, e[h][j]);
        }
        ok = ok && hi[h] - lo <= 8;
      }
      vote = __all_sync(0xFFFFFFFFu, ok);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = lane + 32 * h;
        if (vote) {
#pragma unroll
          for (int j = 0; j < 4; ++j) tab[j * kFp4DecodeRows + row] = fold_tab[whole || j < valid ? hi[h] - e[h][j] : 0];
          row_scale[q * kFp4DecodeRows + row] = ue8m0_bits_to_float(static_cast<uint32_t>(hi[h]));
        } else {
#pragma unroll
          for (int j = 0; j < 4; ++j)
            scale[j * kFp4DecodeRows + row] = j < valid ? ue8m0_bits_to_float(static_cast<uint32_t>(e[h][j])) : 0.0f;
        }
      }
    } else if (valid < 4) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int j = 0; j < 4; ++j)
          if (j >= valid) scale[j * kFp4DecodeRows + lane + 32 * h] = 0.0f;
      }
    }
    if (lane == 0) flags[q] = vote ? 1u : 0u;
  }
}

// The prepared fold words of one weight (FINEGEMM_FP4_DECODE_FOLD_CACHE=1; GemmParams::fp4_fold_words): grid (64-row
// tiles, 128s of K), one warp each; lane l takes rows l and l + 32 of the tile (clamped to the last row, as the
// loader's copies are). The decision is the preparer's (fp4_decode_prepare_scales with may_fold): the tile folds
// where every row's valid scales lie within 2^8 of its largest. Folding rows get their distances and e_max
// (GemmParams::fp4_fold_words), the others their scale word as stored. UE8M0 bytes (word_bytes 1, 4-byte aligned rows
// of a multiple of 4 groups) or packed UE8M0 (word_bytes 4).
// Grouped (MoE experts, blockIdx.z): the group's scales start group_stride scales on, its words n rows on, its flags
// gridDim.x tiles on.
__global__ void fp4_fold_words_kernel(const uint8_t* scale, int word_bytes, int64_t stride_n, int64_t group_stride,
                                      int n, int scale_cols, int blocks, uint32_t* words, uint32_t* flags) {
  const int tile = static_cast<int>(blockIdx.x), q = static_cast<int>(blockIdx.y), lane = static_cast<int>(threadIdx.x);
  const int64_t group = blockIdx.z;
  scale += group * group_stride * word_bytes;
  words += group * n * blocks;
  flags += group * gridDim.x * blocks;
  const int last_word = 4 * ((scale_cols + 3) / 4) - 4;
  const int valid = scale_cols - q * 4;
  const bool whole = valid >= 4;
  uint32_t raw[2], fold[2];
  bool ok = true;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = min(tile * kFp4DecodeRows + lane + 32 * h, n - 1);
    raw[h] = *reinterpret_cast<const uint32_t*>(scale + static_cast<int64_t>(row) * stride_n * word_bytes +
                                                min(4 * q, last_word));
    bool row_ok = false;
    fold[h] = fp4_fold_word(raw[h], whole ? 4 : valid, row_ok);
    ok = ok && row_ok;
  }
  const bool vote = __all_sync(0xFFFFFFFFu, ok);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = tile * kFp4DecodeRows + lane + 32 * h;
    if (row < n) words[static_cast<int64_t>(row) * blocks + q] = vote ? fold[h] : raw[h];
  }
  if (lane == 0) flags[static_cast<int64_t>(tile) * blocks + q] = vote ? 1u : 0u;
}

// grid: (ceil(N / 64) tiles) × split; block kFp4DecodeThreads threads. kb_per_split stages (kStageK of K each) per split.
// kFp8W (FINEGEMM_FP8_DECODE=1, off until measured): E4M3 weights with block scales constant over each 64-row tile
// and 128 of K (b_block_n % 64 == 0, b_block_k % 128 == 0). The weights are the wgmma's A from shared memory (no
// expansion); the four steps of a stage accumulate in the wgmma, promoted once per stage with the tile's block scale
// (loaded by the consumers before they wait for the stage) and the tokens' scales.
// kGrouped: MoE experts (DecodeGroups, chunks of WN rows per expert); without it one chunk of p.m ≤ WN rows, known at
// compile time: the chunk loop in the dense kernel took FP4 at M = 1 (N = 7168, K = 16384) from 37.5 to 41.4 µs
// even at the same registers and occupancy.
// kPreparers: FP4 weights, 64-row dense CTAs: 2 gives alternate stages to two preparer warps (on two SM
// sub-partitions), FINEGEMM_FP4_DECODE_PREPARERS=2. (Until stop 45 the two split each stage's rows and both voted
// over all 64: slower, since each still ran most of the stage's chain.)
// kPipe: the FP4 consumers software-pipelined over two stages (FINEGEMM_FP4_DECODE_PIPE=1, stop 45; see the consumer
// loop).
// kPermK: FP4 weights on activations permuted within each 128 of K (GemmParams::a_perm_k, fp4_perm_k_logical): no
// preparer warp; per 128 of K each consumer thread loads one 16-byte chunk per row (MX group t of it), folds its rows
// from the scale words itself, and the warpgroup votes (bar.red.and) between the fold's one chain and, where some row
// spreads past 8, four chains that each keep one group's lanes (promoted with that group's scale). 64 rows, 128 of K
// per stage, K % 128 == 0, UE8M0 words, one activation scale per 128 (launch_sm90_fp4_decode checks:
// fp4_decode_perm_ok); dense, or grouped (MoE experts on the decode path, moe_decode_perm_wanted).
template <int WN, int kStages, int kStageK, bool kFp8W = false, int kRows = kFp4DecodeRows, bool kGrouped = false,
          int kPreparers = 1, bool kSplitFinish = false, bool kPermK = false, bool kPipe = false>
// Two CTAs per SM at WN = 64 (ten warps: three on some SM sub-partition, whose 16K registers then allow 168 a
// thread). With __maxnreg__(200) instead, the occupancy calculator gave one CTA per SM: 115 vs 85 µs at M = 64.
// Four at WN = 8 with FP4 weights and 128 of K per stage (80 registers): the groups' chunk loop took it to 91
// registers, three CTAs per SM, and M = 1 (N = 7168, K = 16384) from 37.5 to 41.7 µs.
// 128 rows (nine warps): one CTA per SM asked; at WN = 64 two would cap the registers at 96 (five warps on some
// sub-partition) and spill, where the kernel takes 113.
// Two preparers (seven warps): 72 registers at WN = 8 (4 CTAs per SM, no spills); at WN = 16, 98 registers leave 2
// CTAs per SM (3 asked for spilled: 80 registers, the sub-partitions' register files); at WN = 64, 2 CTAs cost 136
// bytes of spills (128 registers).
// kPipe at WN = 8: two CTAs per SM. ptxas serialized its wgmma for want of registers (C7512) at 4 CTAs per SM (80
// registers) and at 3 (113); unbounded it takes 129 (stop 45). At WN = 16 and 32 the wgmma stay asynchronous; WN = 64
// spills.
// WN = 128 (permuted activations, five warps): two CTAs per SM cap the registers at 168 (ptxas spills 4 bytes
// dense, 36-48 grouped, at 489861e); one CTA per SM would leave five warps on the SM.
__global__ void __launch_bounds__(kFp4DecodeThreads<kFp8W, kRows, kPreparers, kPermK>,
                                  kRows == 128 ? 1 : (WN >= 64 ? 2 : (!kFp8W && WN == 8 && kStageK == 128 ? (kPipe ? 2 : (kPreparers == 0 ? 5 : 4)) : 1)))
    sm90_fp4_decode_kernel(const __grid_constant__ CUtensorMap tma_x, const __grid_constant__ CUtensorMap tma_w,
                           const GemmParams p, int split_k, int kb_per_split, bool swizzle, const DecodeGroups groups,
                           int tiles, int* split_counters) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(WN == 8 || WN == 16 || WN == 32 || WN == 64 || (WN == 128 && kPermK),
                "WN: 8, 16, 32 or 64 token columns, or 128 on permuted activations");
  static_assert(kStageK == 128 || kStageK == 256, "kStageK: 128 or 256");
  static_assert(!kFp8W || kStageK == 128, "E4M3 weights: 128 of K per stage (128-byte rows)");
  static_assert(kRows == 64 || (kRows == 128 && kFp8W), "kRows: 64, or 128 with E4M3 weights");
  static_assert(kPreparers == 1 || (kPreparers == 2 && !kFp8W && kRows == 64) ||
                    (kPreparers == 0 && !kFp8W && kRows == 64 && !kPermK && !kGrouped && !kPipe && kStageK == 128),
                "kPreparers: 2 with FP4 weights only; 0 (prepared fold words) dense FP4, 64 rows, 128 of K per stage");
  static_assert(!kPermK || (!kFp8W && kStageK == 128 && kRows == 64 && kPreparers == 1),
                "kPermK: FP4 weights, 64 rows, 128 of K per stage, no preparer");
  static_assert(!kPipe || (!kFp8W && !kPermK && !kGrouped && kStageK == 128 && kRows == 64 && kPreparers == 1 &&
                           !kSplitFinish),
                "kPipe: dense FP4 weights, 64 rows, 128 of K per stage, one preparer");
  using Smem = Fp4DecodeSmem<WN, kStages, kStageK, kFp8W, kRows, kPermK, kPreparers == 0>;
  constexpr int kConsumerWarps = kRows / 16;  // one warpgroup per 64 weight rows
  constexpr int kLoaderWarp = kConsumerWarps, kPreparerWarp = kConsumerWarps + 1;
  using Mma = ptx::WgmmaFp8RegA<WN>;
  using MmaSmem = ptx::WgmmaFp8<WN>;
  constexpr int kAcc = WN / 2;
  constexpr int kSteps = Smem::kSteps;
  constexpr int kRowBytes = kFp8W ? kStageK : kStageK / 2;

  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (ptx::smem_addr(smem_raw) & 1023)) & 1023);
  constexpr int kBlocks = Smem::kBlocks;
  uint8_t* smem_x = smem;
  uint8_t* smem_w = smem_x + kStages * Smem::kStageX;
  uint8_t* smem_fold = smem_w + kStages * Smem::kStageW;
  uint32_t* smem_words = reinterpret_cast<uint32_t*>(smem_fold + kStages * Smem::kStageFold);
  float* smem_rs = reinterpret_cast<float*>(reinterpret_cast<uint8_t*>(smem_words) + kStages * Smem::kStageWords);
  uint32_t* smem_flags = reinterpret_cast<uint32_t*>(reinterpret_cast<uint8_t*>(smem_rs) + kStages * Smem::kStageRowScale);
  float* smem_xs = reinterpret_cast<float*>(reinterpret_cast<uint8_t*>(smem_flags) + kStages * Smem::kStageFlags);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem_xs + kStages * kSteps * WN);
  uint64_t* empty = full + kStages;
  uint64_t* landed = empty + kStages;
  uint2* fold_tab = reinterpret_cast<uint2*>(landed + kStages);

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int split = static_cast<int>(blockIdx.x) % split_k;
  const int tile = static_cast<int>(blockIdx.x) / split_k % tiles;
  const int n0 = tile * kRows;
  // Groups (MoE experts): this CTA's expert, its rows [row0, row0 + rows) of x and of the output, and its weights'
  // first row in B. An expert with more rows than WN runs them in chunks of WN (each streams the weights again: the
  // host picks WN for the rows an expert usually has). A slot past the listed experts has no work.
  int group = 0, row0 = 0, rows = p.m;
  // Grouped: the expert list comes from earlier kernels; unless it was complete before the previous kernel started
  // (p.pdl_groups_ready), wait for that kernel before reading it (a no-op without a programmatic launch).
  // Dense: the weights are requested before the wait only when the kernel ahead is finegemm's activation quantization
  // (p.pdl_weights_ready), which writes no weights.
  const bool prefetch = p.pdl && (kGrouped ? p.pdl_groups_ready : p.pdl_weights_ready);
  if (kGrouped && !prefetch) cudaGridDependencySynchronize();
  if constexpr (kGrouped) {
    const int slot = static_cast<int>(blockIdx.x) / split_k / tiles;
    if (slot >= *groups.list_count) return;  // the whole CTA, before any barrier
    // Broadcast from lane 0 (global loads look varying to ptxas): a uniform chunk loop keeps the ring position and
    // descriptors in uniform registers.
    group = __shfl_sync(0xffffffffu, groups.list[slot], 0);
    row0 = __shfl_sync(0xffffffffu, groups.offsets[group], 0);
    rows = __shfl_sync(0xffffffffu, groups.offsets[group + 1], 0) - row0;
  }
  const int chunks = kGrouped ? (rows + WN - 1) / WN : 1;
  const int w_row0 = group * p.n;  // the group's first row of B
  const int num_kb = (p.k + kStageK - 1) / kStageK;
  const int kb_begin = split * kb_per_split;
  const int kb_count = min(num_kb, kb_begin + kb_per_split) - kb_begin;

  // full[s]: the loader's expect_tx (one arrival), the TMA bytes, and 32 arrivals: the loader lanes' once their
  // cp.async copies have landed (E4M3 weights) or the lanes of the stage's preparer warp once the scales are prepared
  // (FP4 weights; with two preparers, the one whose turn the stage is).
  // empty[s]: one arrival per consumer thread, after its last read of the stage (or one per warp, after
  // __syncwarp, with p.decode_thread_release off: racecheck reported the reads of the activation scales against the
  // next cp.async into the stage there). landed[s] (FP4): the loader lanes' cp.async copies.
  // Direct (p.fp4_decode_direct) and permuted activations (kPermK): no preparation; the loader's copies complete the
  // full barrier (1 + 32 arrivals) and `landed` is unused.
  const bool direct = !kFp8W && !kPermK && kPreparers != 0 && p.fp4_decode_direct;
  // Prepared fold words (p.fp4_fold_words, FINEGEMM_FP4_DECODE_FOLD_CACHE=1): the loader copies the words and the
  // tiles' flags that fp4_fold_words_kernel made once per weight; no preparer, the loader's copies complete `full`.
  // With kPreparers = 0 (FINEGEMM_FP4_DECODE_FOLD_CACHE=2) the CTA has no preparer warp and no fold area at all.
  const bool prepared = kPreparers == 0 || (!kFp8W && !kPermK && !kPipe && !kGrouped && kPreparers == 1 && !direct &&
                                            p.fp4_fold_words != nullptr);
  // Permuted activations (dense or grouped) on prepared fold words: the same copies; the consumers take each row's
  // distance and e_max from its word and the tile's fold from the flag, with no vote.
  const bool perm_prepared = kPermK && p.fp4_fold_words != nullptr;
  // In-kernel split-K (p.decode_cluster_reduce, dense launches in clusters of split_k CTAs, one tile each): every
  // thread of the cluster passes two cluster barriers (partials written; partials read). The producer warps pass
  // both on their way out.
  const bool cluster_reduce = !kGrouped && p.decode_cluster_reduce;
  auto leave_cluster = [&] {
    if (cluster_reduce) {
      ptx::cluster_sync_relaxed();  // they publish nothing through either barrier
      ptx::cluster_sync_relaxed();
    }
  };
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      ptx::mbar_init(&full[s], 1 + 32);
      ptx::mbar_init(&empty[s], p.decode_thread_release ? 32 * kConsumerWarps : kConsumerWarps);
      ptx::mbar_init(&landed[s], 32);
    }
    ptx::fence_barrier_init();
  }
  if (!kFp8W && threadIdx.x < 9) fold_tab[threadIdx.x] = fp4_fold_table_row(threadIdx.x);
  __syncthreads();
  // Programmatic dependent launch (p.pdl; grouped with p.pdl_groups_ready, dense with p.pdl_weights_ready): the weight
  // tiles of the first `pre` stages
  // (chunk 0's) are requested before the wait for the previous kernel (the weights are no kernel's output); the loop
  // below then adds only the activation tile's bytes to those stages' full barriers. Every thread waits before it
  // reads anything else from global memory.
  const int pre = prefetch ? min(kStages, kb_count) : 0;
  if (pre > 0 && warp == kLoaderWarp && lane == 0) {
    for (int s = 0; s < pre; ++s) {
      ptx::mbar_expect_tx(&full[s], Smem::kStageW);
      ptx::tma_load_2d(smem_w + s * Smem::kStageW, &tma_w, &full[s], (kb_begin + s) * kRowBytes, w_row0 + n0);
    }
  }
  cudaGridDependencySynchronize();
  // The split-K reduce (launched the same way) may start now; it waits for this grid to complete.
  if (threadIdx.x == 0) cudaTriggerProgrammaticLaunchCompletion();
  // kPermK: UE8M0 words by construction (fp4_decode_perm_ok, checked at launch); no float branch in that build.
  const bool word_scales = kPermK || fp4_decode_word_scales(p);
  // Steps (32 wide) per activation-scale group, less one: a power of two (1, 2 or 4: the host sends only groups
  // dividing 128 or multiples of it), so that the step tests are masks, not divisions. The fold needs 3 (one
  // activation scale over each 128 of K) and UE8M0 words.
  const int xgroup_mask = (p.a_scale ? max(1, min(p.a_group, kGemmBlockK) / 32) : 4) - 1;
  const bool may_fold = word_scales && xgroup_mask == 3;

  // Direct: the preparer warps exit at once; the consumers decode the scales themselves (per-step promotion).
  if (!kFp8W && !kPermK && warp >= kPreparerWarp) {
    if (direct || prepared) {
      leave_cluster();
      return;
    }
    // ---------------- Preparer warp (FP4 weights). With two (kPreparers = 2), preparer `part` takes the stages whose
    // running index i is part modulo 2, so that each has two stages' time for one stage's dependent chain (the one
    // preparer's ~235 instructions per stage fit the ~1.15 µs per stage measured at M = 1, stop 44). Each waits only
    // on its own stages' `landed` phases; a slot's next phase cannot complete before the consumers release it, which
    // needs this preparer's arrival, so no phase is skipped.
    const int part = warp - kPreparerWarp;
    RingPosition<kStages> ring;
    for (int c = 0, i = 0; c < chunks; ++c) {
      for (int j = 0; j < kb_count; ++j, ++i, ring.advance()) {
        if (kPreparers == 2 && (i & 1) != part) continue;
        const int stage = ring.stage;
        ptx::mbar_wait(&landed[stage], ring.phase);
        fp4_decode_prepare_scales<kBlocks>(p, word_scales, may_fold, kb_begin + j, lane, fold_tab,
                                           smem_fold + stage * Smem::kStageFold,
                                           smem_words + stage * kBlocks * kFp4DecodeRows,
                                           smem_rs + stage * kBlocks * kFp4DecodeRows, smem_flags + stage * 4);
        ptx::mbar_arrive(&full[stage]);
      }
    }
    leave_cluster();
    return;
  }
  if (warp == kLoaderWarp) {
    // ---------------- Loader warp: TMA for the tiles; cp.async for the scales, so that no lane ever waits on a
    // global load (a register-staged version, with its loads two stages ahead, streamed 0.57 TB/s: every stage
    // waited out a load latency).
    if (lane == 0) {
      ptx::prefetch_tensor_map(&tma_x);
      ptx::prefetch_tensor_map(&tma_w);
    }
    // Per lane, everything that does not change along K is computed once: the scale rows' base pointers and the
    // activation group of a step as a shift. ncu (M = 1, WN = 8) counted 245 loader instructions per stage with
    // these in the loop (64-bit products, a division per step): every CTA's loader is warp 4, so the four loaders
    // of an SM share one scheduler with four consumer warps, and that scheduler bounded the kernel.
    const int w_rows[2] = {min(n0 + lane, p.n - 1), min(n0 + lane + 32, p.n - 1)};
    // Weight scales. Words: UE8M0 bytes or packed UE8M0 (one int32 per four groups): both at byte offset `group`
    // of the row (group % 4 == 0), clamped to the last word (UE8M0 rows hold a multiple of 4 groups, host).
    // Floats: one per group.
    const int word_bytes = p.b_scale_fmt == ScaleFmt::UE8M0 ? 1 : 4;
    const int last_word = 4 * ((p.b_scale_cols + 3) / 4) - 4;
    const uint8_t* w_row[2];
#pragma unroll
    for (int h = 0; h < 2; ++h)
      w_row[h] = static_cast<const uint8_t*>(p.b_scale) +
                 (group * p.b_scale_group_stride + static_cast<int64_t>(w_rows[h]) * p.b_scale_stride_n) *
                     (word_scales ? word_bytes : 4);
    // Activation scales: step (32 of K) st lies in group st * 32 / a_group, a shift when a_group is a power of two
    // (32, 64, 128, ...), clamped to the last group (per-token: one).
    const int x_last = p.a_scale_cols - 1;
    const bool x_pow2 = (p.a_group & (p.a_group - 1)) == 0 && p.a_group >= 32;
    const int x_shift = x_pow2 ? __ffs(p.a_group) - 6 : 0;
    const int load_batch = kStages % p.decode_load_batch == 0 ? p.decode_load_batch : 1;
    RingPosition<kStages> ring;
    for (int c = 0, i = 0; c < chunks; ++c) {
      // The chunk's tokens: rows tok0.. of x (its last one repeated for the scales of the columns past it).
      const int tok0 = row0 + c * WN, tok_last = min(WN, rows - c * WN) - 1;
      const float* x_row[2] = {
          p.a_scale ? p.a_scale + static_cast<int64_t>(tok0 + min(lane, tok_last)) * p.a_scale_stride_m : nullptr,
          p.a_scale ? p.a_scale + static_cast<int64_t>(tok0 + min(lane + 32, tok_last)) * p.a_scale_stride_m : nullptr};
      // WN = 128: tokens lane + 64 and lane + 96 too.
      const float* x_row_hi[2] = {
          WN > 64 && p.a_scale ? p.a_scale + static_cast<int64_t>(tok0 + min(lane + 64, tok_last)) * p.a_scale_stride_m
                               : nullptr,
          WN > 64 && p.a_scale ? p.a_scale + static_cast<int64_t>(tok0 + min(lane + 96, tok_last)) * p.a_scale_stride_m
                               : nullptr};
      for (int j_kb = 0; j_kb < kb_count; ++j_kb, ++i, ring.advance()) {
        const int kb = kb_begin + j_kb;
        const int stage = ring.stage;
        const int step0 = kb * kSteps;
        // With a load batch of B stages (B divides kStages, so a batch never wraps the ring), the first stage of each
        // batch waits for the slots of all B, so that their weight tiles go out together.
        if (load_batch > 1) {
          if (i % load_batch == 0 && i >= kStages)
            for (int b = 0; b < load_batch; ++b) ptx::mbar_wait(&empty[stage + b], ring.phase ^ 1u);
        } else if (i >= kStages) {
          ptx::mbar_wait(&empty[stage], ring.phase ^ 1u);
        }
        if (lane == 0) {
          // A box past K (the second half of a 256-wide stage at the K tail) arrives zero-filled, bytes counted.
          // Stages i < pre had their weight tile requested before the programmatic wait.
          ptx::mbar_arrive_expect_tx(&full[stage], Smem::kStageX + (i < pre ? 0 : Smem::kStageW));
          if (i >= pre) ptx::tma_load_2d(smem_w + stage * Smem::kStageW, &tma_w, &full[stage], kb * kRowBytes, w_row0 + n0);
          // GemmParams::l2_prefetch: the weight tile D stages ahead into L2 (first chunk only: later chunks of
          // tokens read the same weights again).
          if (p.l2_prefetch > 0 && c == 0 && j_kb + p.l2_prefetch < kb_count)
            ptx::tma_prefetch_l2_2d(&tma_w, (kb + p.l2_prefetch) * kRowBytes, w_row0 + n0);
#pragma unroll
          for (int j = 0; j < kStageK / kGemmBlockK; ++j)
            ptx::tma_load_2d(smem_x + stage * Smem::kStageX + j * WN * kGemmBlockK, &tma_x, &full[stage],
                             kb * kStageK + j * kGemmBlockK, tok0);
        }
        float* xs = smem_xs + stage * kSteps * WN;
        // Weight scales: words of four groups ([kBlocks][64], prepared into the fold area a stage later) or floats
        // straight into the fold area ([kBlocks][4][64]). The K tail's groups past the last scale read the last one
        // (their weights are zero-filled; the preparation zeroes their scales).
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          if (kFp8W) {
            // E4M3 weights: the consumers load the tile's block scale themselves.
          } else if (prepared || perm_prepared) {
            // Prepared words: [groups][n][blocks] (the group's rows start at w_row0).
#pragma unroll
            for (int q = 0; q < kBlocks; ++q)
              ptx::cp_async_4(smem_words + stage * kBlocks * kFp4DecodeRows + q * kFp4DecodeRows + lane + 32 * h,
                              p.fp4_fold_words + static_cast<int64_t>(w_row0 + w_rows[h]) * p.fp4_fold_blocks +
                                  kb * kBlocks + q);
          } else if (word_scales) {
#pragma unroll
            for (int q = 0; q < kBlocks; ++q)
              ptx::cp_async_4(smem_words + stage * kBlocks * kFp4DecodeRows + q * kFp4DecodeRows + lane + 32 * h,
                              w_row[h] + min(step0 + 4 * q, last_word));
          } else {
            float* ws = reinterpret_cast<float*>(smem_fold + stage * Smem::kStageFold);
            const float* src = reinterpret_cast<const float*>(w_row[h]);
#pragma unroll
            for (int st = 0; st < kSteps; ++st)
              ptx::cp_async_4(ws + (st / 4) * (Smem::kBlockFold / 4) + (st % 4) * kFp4DecodeRows + lane + 32 * h,
                              src + min(step0 + st, p.b_scale_cols - 1));
          }
          // Activation scales [kSteps][WN] (none without a_scale: the consumers use 1), at the first step of each
          // activation group only (the consumers read them there): one per 128 of K with groups of 128 or more.
          if (p.a_scale && lane + 32 * h < WN) {
#pragma unroll
            for (int st = 0; st < kSteps; ++st) {
              if (st & xgroup_mask) continue;
              const int xg = min(x_pow2 ? (step0 + st) >> x_shift : (step0 + st) * 32 / p.a_group, x_last);
              ptx::cp_async_4(xs + st * WN + lane + 32 * h, x_row[h] + static_cast<int64_t>(xg) * p.a_scale_stride_k);
            }
          }
        }
        // WN = 128: the activation scales of tokens 64..127 (lanes take tokens lane + 64 and lane + 96).
        if constexpr (WN > 64) {
          if (p.a_scale) {
#pragma unroll
            for (int h = 2; h < 4; ++h) {
#pragma unroll
              for (int st = 0; st < kSteps; ++st) {
                if (st & xgroup_mask) continue;
                const int xg = min(x_pow2 ? (step0 + st) >> x_shift : (step0 + st) * 32 / p.a_group, x_last);
                ptx::cp_async_4(xs + st * WN + lane + 32 * h,
                                x_row_hi[h - 2] + static_cast<int64_t>(xg) * p.a_scale_stride_k);
              }
            }
          }
        }
        if ((prepared || perm_prepared) && lane < kBlocks)  // flags: [groups][tiles][blocks]
          ptx::cp_async_4(smem_flags + stage * 4 + lane,
                          p.fp4_fold_flags + (static_cast<int64_t>(group) * tiles + tile) * p.fp4_fold_blocks +
                              kb * kBlocks + lane);
        ptx::cp_async_mbar_arrive_noinc(kFp8W || kPermK || direct || prepared ? &full[stage] : &landed[stage]);
      }
    }
    ptx::cp_async_wait_all();  // no copy outlives its thread
    leave_cluster();
    return;
  }

  // ---------------- Consumer warpgroups (warpgroup wg: rows 64·wg .. 64·wg + 63 of the tile).
  const int g = lane >> 2, t = lane & 3;
  const int r0 = warp * 16 + g;  // this thread's rows: r0 and r0 + 8 of the tile
  const int wg = kRows == 64 ? 0 : warp / 4;
  // Stages i = c·kb_count .. (c + 1)·kb_count - 1 hold chunk c (one chunk without groups).
  RingPosition<kStages> ring;
  // The descriptors of stage 0's tiles; stage s's start kStageX · s (kStageW · s) bytes on, in the 16-byte units of
  // the descriptor's address field (shared memory stays below 256 KB, so the field never carries).
  // As 32-bit words (ptx::desc_lo_k_major_sw128): 64-bit descriptor adds went through R2UR before every wgmma.
  const uint32_t desc_x0 = ptx::desc_lo_k_major_sw128(ptx::smem_addr(smem_x));
  const uint32_t full_addr = ptx::smem_addr(full);
  constexpr uint32_t kDescHi = ptx::kDescHiKMajorSw128;
  for (int c = 0; c < chunks; ++c) {
    const int i_begin = c * kb_count, i_end = i_begin + kb_count;
    float total[kAcc];
#pragma unroll
    for (int i = 0; i < kAcc; ++i) total[i] = 0.0f;

    // Step s's wgmma result into the sum of its activation group, with the weight scales w0, w1 of rows r0, r0 + 8;
    // the sum into the total at the group's end, with the tokens' scales.
    // `sum` lives within one 128 of K: activation groups are 32, 64 or 128 wide there (xgroup_mask ≤ 3), so every
    // 128 starts a group.
    auto promote = [&](int s, const float (&acc)[kAcc], float w0, float w1, const float* xs, float (&sum)[kAcc]) {
      const bool first = (s & xgroup_mask) == 0;
#pragma unroll
      for (int i = 0; i < kAcc; ++i) {
        const float w = (i & 2) ? w1 : w0;  // accumulator i: row r0 + 8·((i >> 1) & 1), token 8·(i >> 2) + 2t + (i & 1)
        sum[i] = first ? acc[i] * w : fmaf(acc[i], w, sum[i]);
      }
      if (((s + 1) & xgroup_mask) == 0) {
#pragma unroll
        for (int j = 0; j < WN / 8; ++j) {
          const float2 xv = p.a_scale ? *reinterpret_cast<const float2*>(xs + (s & ~xgroup_mask) * WN + 8 * j + 2 * t)
                                      : make_float2(1.0f, 1.0f);
          total[4 * j + 0] = fmaf(sum[4 * j + 0], xv.x, total[4 * j + 0]);
          total[4 * j + 1] = fmaf(sum[4 * j + 1], xv.y, total[4 * j + 1]);
          total[4 * j + 2] = fmaf(sum[4 * j + 2], xv.x, total[4 * j + 2]);
          total[4 * j + 3] = fmaf(sum[4 * j + 3], xv.y, total[4 * j + 3]);
        }
      }
    };

    if constexpr (kFp8W) {
      const uint32_t desc_w0 = ptx::desc_lo_k_major_sw128(ptx::smem_addr(smem_w + wg * 64 * kGemmBlockK));
      for (int i = i_begin; i < i_end; ++i, ring.advance()) {
        const int stage = ring.stage;
        const int kb = kb_begin + i - i_begin;
        // The tile's block scale for this stage, loaded before the wait so that its latency hides behind it. The
        // second warpgroup of a 128-row CTA over N's last 64 rows or fewer has no rows: its row block is clamped into
        // the scales (compute-sanitizer memcheck read one row block past them at N = 320, 64-row blocks); its
        // output is never stored.
        const float w_scale = load_b_scale(p, group, min(n0 + 64 * wg, p.n - 1) / p.b_block_n,
                                           min(kb * kGemmBlockK / p.b_block_k, p.b_scale_cols - 1));
        ptx::mbar_wait_shared(full_addr + stage * 8, ring.phase);
        // One wgmma per step over the warpgroup's 64 rows: A (weights) and B (tokens) both from shared memory.
        const uint32_t desc_w = desc_w0 + static_cast<uint32_t>(stage * (Smem::kStageW >> 4));
        const uint32_t desc_x = desc_x0 + static_cast<uint32_t>(stage * (Smem::kStageX >> 4));
        float acc[kAcc];
        ptx::wgmma_fence();
#pragma unroll
        for (int s = 0; s < 4; ++s)
          MmaSmem::mma(ptx::desc_from_words(desc_w + (s * 32 >> 4), kDescHi), ptx::desc_from_words(desc_x + (s * 32 >> 4), kDescHi),
                       acc, s > 0);
        ptx::wgmma_commit();
        // The tokens' scales of this stage (one per token over its 128 of K) into registers before the release.
        const float* xs = smem_xs + stage * kSteps * WN;
        float2 xv[WN / 8];
#pragma unroll
        for (int j = 0; j < WN / 8; ++j)
          xv[j] = p.a_scale ? *reinterpret_cast<const float2*>(xs + 8 * j + 2 * t) : make_float2(1.0f, 1.0f);
        ptx::wgmma_wait<0>();
        ptx::fence_operands(acc);
        if (p.decode_thread_release) {
          ptx::mbar_arrive(&empty[stage]);
        } else {
          __syncwarp();
          if (lane == 0) ptx::mbar_arrive(&empty[stage]);
        }
#pragma unroll
        for (int j = 0; j < WN / 8; ++j) {
          const float s0 = w_scale * xv[j].x, s1 = w_scale * xv[j].y;
          total[4 * j + 0] = fmaf(acc[4 * j + 0], s0, total[4 * j + 0]);
          total[4 * j + 1] = fmaf(acc[4 * j + 1], s1, total[4 * j + 1]);
          total[4 * j + 2] = fmaf(acc[4 * j + 2], s0, total[4 * j + 2]);
          total[4 * j + 3] = fmaf(acc[4 * j + 3], s1, total[4 * j + 3]);
        }
      }
    } else if constexpr (kPermK) {
      // Permuted activations: per stage (one 128 of K), this thread's chunk t (MX group t) of rows r0 and r0 + 8 holds
      // its A registers of all four steps (fp4_perm_fragments); its rows' scale words give each row's fold
      // (fp4_perm_fold). The warpgroup folds the block when all its 64 rows do (one bar.red over the consumers):
      // one wgmma chain through each row's table for group t, promoted with 2^emax per row. Otherwise (some row spreads
      // past 8) four chains over the plain codes, chain g keeping only the lanes of group g (t == g) and promoted with
      // that group's scale: exact either way.
      const int chunk_off[2] = {fp4_perm_chunk_offset(r0, t, swizzle), fp4_perm_chunk_offset(r0 + 8, t, swizzle)};
      const uint2 plain_tab = fold_tab[0];
      // total += acc · (row r0's, row r0 + 8's scale) · the tokens' scales of the stage's block (one per token over
      // its 128 of K; 1 without group scales): loaded into xv_reg before the wgmma up to WN = 64, read from shared
      // memory here at WN = 128 (32 registers more than two CTAs per SM leave).
      float2 xv_reg[WN <= 64 ? WN / 8 : 1];
      auto add_block = [&](const float (&acc)[kAcc], const float (&row_scale)[2], const float* xs) {
#pragma unroll
        for (int j = 0; j < WN / 8; ++j) {
          float2 xv;
          if constexpr (WN <= 64) xv = xv_reg[j];
          else xv = p.a_scale ? *reinterpret_cast<const float2*>(xs + 8 * j + 2 * t) : make_float2(1.0f, 1.0f);
          total[4 * j + 0] = fmaf(acc[4 * j + 0] * row_scale[0], xv.x, total[4 * j + 0]);
          total[4 * j + 1] = fmaf(acc[4 * j + 1] * row_scale[0], xv.y, total[4 * j + 1]);
          total[4 * j + 2] = fmaf(acc[4 * j + 2] * row_scale[1], xv.x, total[4 * j + 2]);
          total[4 * j + 3] = fmaf(acc[4 * j + 3] * row_scale[1], xv.y, total[4 * j + 3]);
        }
      };
      for (int i = i_begin; i < i_end; ++i, ring.advance()) {
        const int stage = ring.stage;
        ptx::mbar_wait_shared(full_addr + stage * 8, ring.phase);
        const uint8_t* wt = smem_w + stage * Smem::kStageW;
        const uint32_t* words = smem_words + stage * kFp4DecodeRows;
        const float* xs = smem_xs + stage * kSteps * WN;
        const uint32_t desc_x = desc_x0 + static_cast<uint32_t>(stage * (Smem::kStageX >> 4));
        const Chunk16 codes0 = *reinterpret_cast<const Chunk16*>(wt + chunk_off[0]);
        const Chunk16 codes1 = *reinterpret_cast<const Chunk16*>(wt + chunk_off[1]);
        const uint32_t word[2] = {words[r0], words[r0 + 8]};
        int emax[2], dist[2];
        bool fold;
        if (perm_prepared) {
          // The tile's fold from its flag (broadcast from lane 0: warp-uniform for ptxas), each row's group-t distance
          // and e_max from its prepared word (a tile that does not fold has the stored scale words).
          fold = __shfl_sync(0xffffffffu, smem_flags[stage * 4] != 0u ? 1 : 0, 0) != 0;
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            emax[h] = fp4_fold_word_emax(word[h]);
            dist[h] = fp4_fold_word_dist(word[h], t);
          }
        } else {
          fold = fp4_perm_fold(word[0], t, emax[0], dist[0]);
          fold = fp4_perm_fold(word[1], t, emax[1], dist[1]) && fold;
          fold = ptx::named_bar_red_and<2, 32 * kConsumerWarps>(fold);
        }
        if constexpr (WN <= 64) {
#pragma unroll
          for (int j = 0; j < WN / 8; ++j)
            xv_reg[j] = p.a_scale ? *reinterpret_cast<const float2*>(xs + 8 * j + 2 * t) : make_float2(1.0f, 1.0f);
        }
        if (fold) {
          const uint2 tab0 = fold_tab[dist[0]], tab1 = fold_tab[dist[1]];
          uint32_t a[4][4];
          fp4_perm_fragments(codes0, codes1, tab0.x, tab0.y, tab1.x, tab1.y, a);
          float acc[kAcc];
          ptx::wgmma_fence();
#pragma unroll
          for (int s = 0; s < 4; ++s)
            Mma::mma(a[s], ptx::desc_from_words(desc_x + static_cast<uint32_t>((s * 32) >> 4), kDescHi), acc, s > 0);
          ptx::wgmma_commit();
          const float row_scale[2] = {ue8m0_bits_to_float(static_cast<uint32_t>(emax[0])),
                                      ue8m0_bits_to_float(static_cast<uint32_t>(emax[1]))};
          ptx::wgmma_wait<0>();
          ptx::fence_operands(acc);
#pragma unroll
          for (int s = 0; s < 4; ++s) fence_regs(a[s]);
          add_block(acc, row_scale, xs);
        } else {
#pragma unroll 1
          for (int g = 0; g < 4; ++g) {
            // Chain g: the lanes of group g feed their codes (expanded again for each chain: registers are short at
            // WN = 128, and this path is rare), the others zeros.
            float acc[kAcc];
            fp4_perm_group_chain<WN>(codes0, codes1, plain_tab, t, g, desc_x, acc);
            const float w_scale[2] = {ue8m0_bits_to_float((word[0] >> (8 * g)) & 0xFFu),
                                      ue8m0_bits_to_float((word[1] >> (8 * g)) & 0xFFu)};
            add_block(acc, w_scale, xs);
          }
        }
        if (p.decode_thread_release) {
          ptx::mbar_arrive(&empty[stage]);
        } else {
          __syncwarp();
          if (lane == 0) ptx::mbar_arrive(&empty[stage]);
        }
      }
    } else {
      // Per 128 of K (block q of the stage) the preparer's flag says whether the block folds (see
      // fp4_decode_prepare_scales): then each group's codes expand through their prepared table, the four steps
      // accumulate in one wgmma chain, and one promotion per row applies 2^e_max. Otherwise each step runs into its own
      // accumulator (kPar at once) and is promoted with its own scale.
      constexpr int kPar = WN <= 32 ? 4 : 1;  // WN = 64: one 32-register accumulator, within 168 registers
      // This thread's fragment offsets in a stage's weight tile, per row and step (the same in every stage).
      int frag_off[2][kSteps];
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int s = 0; s < kSteps; ++s) frag_off[h][s] = fp4_fragment_offset<kRowBytes>(r0 + 8 * h, t, s, swizzle);
      // The permutes' constant operands, loaded once (as immediates, ptxas materialised them before every use).
      const uint2 plain_tab = fold_tab[0];
      // kPipe (FINEGEMM_FP4_DECODE_PIPE=1; dense, 128 of K per stage, one preparer): a folding stage's wgmma group
      // is left running while the next stage is waited for, loaded and expanded; its promotion and release follow
      // the next group's issue (wgmma_wait<1>). The A registers and accumulators alternate between two sets, so the
      // loop runs two stages per turn. The totals take the stages in the same order, so the bits are the default's.
      // A stage that does not fold first finishes the pending one, then runs per step (a copy of the default loop's
      // per-step path below, kept apart so that the default kernels' code stays as it was).
      if constexpr (kPipe) {
        // One 128 of K (block q of the stage at `stage`, its codes in raw) whose rows do not all fold, or with the
        // preparer off (direct): each step into its own accumulator, promoted with its group's scale.
        auto per_step_block = [&](int stage, int i, int q, const uint32_t (&raw)[4][4], const uint8_t* fold_area,
                                  const float* xs, const uint32_t desc_x) {
          const float* scale = reinterpret_cast<const float*>(fold_area + q * Smem::kBlockFold);  // [4][64]
          auto desc_of = [&](int s) {  // step s: box s / 4, 32 bytes per step inside it
            return ptx::desc_from_words(desc_x + static_cast<uint32_t>(((s / 4) * WN * kGemmBlockK + (s % 4) * 32) >> 4), kDescHi);
          };
          float wsc[2][4];  // per row and step: the group's scale (0 past K)
          if (direct) {
            // The loader's copies as they are: words of four UE8M0 scales per row, or floats per group (the K
            // tail's groups past the last scale read the last one: zeroed here, their codes are zero-filled).
            const int valid = p.b_scale_cols - ((kb_begin + i - i_begin) * kBlocks + q) * 4;
            const uint32_t* words = smem_words + stage * kBlocks * kFp4DecodeRows + q * kFp4DecodeRows;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              if (word_scales) {
                ue8m0x4_to_float(words[r0 + 8 * h], wsc[h]);
              } else {
#pragma unroll
                for (int j = 0; j < 4; ++j) wsc[h][j] = scale[j * kFp4DecodeRows + r0 + 8 * h];
              }
              if (valid < 4) {
#pragma unroll
                for (int j = 0; j < 4; ++j)
                  if (j >= valid) wsc[h][j] = 0.0f;
              }
            }
          } else {
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
              for (int j = 0; j < 4; ++j) wsc[h][j] = scale[j * kFp4DecodeRows + r0 + 8 * h];
          }
          float sum[kAcc];
#pragma unroll
          for (int b = 0; b < 4; b += kPar) {
            uint32_t a[kPar][4];
            float acc[kPar][kAcc];
#pragma unroll
            for (int j = 0; j < kPar; ++j) fp4_fragment_expand(raw[b + j], plain_tab, plain_tab, a[j]);
            ptx::wgmma_fence();
#pragma unroll
            for (int j = 0; j < kPar; ++j) Mma::mma(a[j], desc_of(4 * q + b + j), acc[j], false);
            ptx::wgmma_commit();
            ptx::wgmma_wait<0>();
#pragma unroll
            for (int j = 0; j < kPar; ++j) {
              ptx::fence_operands(acc[j]);
              fence_regs(a[j]);
            }
#pragma unroll
            for (int j = 0; j < kPar; ++j) promote(4 * q + b + j, acc[j], wsc[0][b + j], wsc[1][b + j], xs, sum);
          }
        };
        static_assert(kBlocks == 1 && !kGrouped, "kPipe: dense, 128 of K per stage");
        // Without branches on the lane while a wgmma group may run (ptxas serializes every wgmma of a kernel that
        // waits for one on a divergent path, C7518): with p.decode_thread_release off, lane 0's arrival is predicated.
        const uint32_t empty_addr = ptx::smem_addr(empty);
        const bool arrive_here = p.decode_thread_release || lane == 0;
        auto release_stage = [&](int stage) {
          if (!p.decode_thread_release) __syncwarp();
          asm volatile("{\n.reg .pred p;\nsetp.ne.u32 p, %1, 0;\n@p mbarrier.arrive.shared::cta.b64 _, [%0];\n}\n" ::"r"(
                           empty_addr + static_cast<uint32_t>(stage) * 8u),
                       "r"(static_cast<uint32_t>(arrive_here))
                       : "memory");
        };
        bool pending = false;
        int pend_stage = 0;
        float pend_rs[2] = {0.0f, 0.0f};
        float2 pend_xv[WN / 8];
#pragma unroll
        for (int j = 0; j < WN / 8; ++j) pend_xv[j] = make_float2(0.0f, 0.0f);
        uint32_t a0[4][4], a1[4][4];
        float acc0[kAcc], acc1[kAcc];
        // The pending stage's promotion, once its group is done (the caller waited), then its release.
        auto finish = [&](float (&acc)[kAcc], uint32_t (&a)[4][4]) {
          ptx::fence_operands(acc);
#pragma unroll
          for (int j = 0; j < 4; ++j) fence_regs(a[j]);
#pragma unroll
          for (int j = 0; j < WN / 8; ++j) {
            total[4 * j + 0] = fmaf(acc[4 * j + 0] * pend_rs[0], pend_xv[j].x, total[4 * j + 0]);
            total[4 * j + 1] = fmaf(acc[4 * j + 1] * pend_rs[0], pend_xv[j].y, total[4 * j + 1]);
            total[4 * j + 2] = fmaf(acc[4 * j + 2] * pend_rs[1], pend_xv[j].x, total[4 * j + 2]);
            total[4 * j + 3] = fmaf(acc[4 * j + 3] * pend_rs[1], pend_xv[j].y, total[4 * j + 3]);
          }
          release_stage(pend_stage);
          pending = false;
        };
        // Stage i into (a, acc); (a_prev, acc_prev) hold the pending stage's group, if any.
        auto stage_turn = [&](int i, uint32_t (&a)[4][4], float (&acc)[kAcc], uint32_t (&a_prev)[4][4],
                              float (&acc_prev)[kAcc]) {
          const int stage = ring.stage;
          ptx::mbar_wait_shared(full_addr + stage * 8, ring.phase);
          const uint8_t* wt = smem_w + stage * Smem::kStageW;
          const uint8_t* fold_area = smem_fold + stage * Smem::kStageFold;
          const float* rs = smem_rs + stage * kFp4DecodeRows;
          const float* xs = smem_xs + stage * kSteps * WN;
          const uint32_t desc_x = desc_x0 + static_cast<uint32_t>(stage * (Smem::kStageX >> 4));
          uint32_t raw[4][4];
#pragma unroll
          for (int j = 0; j < 4; ++j) fp4_fragment_load(wt, frag_off[0][j], frag_off[1][j], raw[j]);
          // The flag through a broadcast from lane 0, so that ptxas sees it warp-uniform: with a wgmma group in flight
          // across this branch, a branch it took for divergent made it serialize every wgmma of the kernel (C7518).
          const bool fold = __shfl_sync(0xffffffffu, !direct && smem_flags[stage * 4] != 0u ? 1 : 0, 0) != 0;
          if (fold) {
            const uint2* tab = reinterpret_cast<const uint2*>(fold_area);  // [4][64]
#pragma unroll
            for (int j = 0; j < 4; ++j)
              fp4_fragment_expand(raw[j], tab[j * kFp4DecodeRows + r0], tab[j * kFp4DecodeRows + r0 + 8], a[j]);
            ptx::wgmma_fence();
#pragma unroll
            for (int j = 0; j < 4; ++j)
              Mma::mma(a[j], ptx::desc_from_words(desc_x + static_cast<uint32_t>((j * 32) >> 4), kDescHi), acc, j > 0);
            ptx::wgmma_commit();
            // No fence on acc here: any instruction touching a running group's accumulators makes ptxas serialize
            // every wgmma of the kernel (C7514; stop 45's measured build had one). finish() fences them after the wait.
            // This stage's scales into registers: the stage may go back before its promotion.
            float2 xv[WN / 8];
#pragma unroll
            for (int j = 0; j < WN / 8; ++j)
              xv[j] = p.a_scale ? *reinterpret_cast<const float2*>(xs + 8 * j + 2 * t) : make_float2(1.0f, 1.0f);
            const float row_scale[2] = {rs[r0], rs[r0 + 8]};
            // Unconditional waits (a no-op with nothing pending), so that no wait sits on a branch.
            ptx::wgmma_wait<1>();
            if (pending) finish(acc_prev, a_prev);
            pending = true;
            pend_stage = stage;
            pend_rs[0] = row_scale[0];
            pend_rs[1] = row_scale[1];
#pragma unroll
            for (int j = 0; j < WN / 8; ++j) pend_xv[j] = xv[j];
          } else {
            ptx::wgmma_wait<0>();
            if (pending) finish(acc_prev, a_prev);
            per_step_block(stage, i, 0, raw, fold_area, xs, desc_x);
            release_stage(stage);
          }
          ring.advance();
        };
        int i = i_begin;
        for (; i + 1 < i_end; i += 2) {
          stage_turn(i, a0, acc0, a1, acc1);
          stage_turn(i + 1, a1, acc1, a0, acc0);
          // No group crosses the loop's back edge: the register allocator's moves there would read a running group's
          // accumulators, and ptxas then serializes every wgmma (C7514). So each pair of stages overlaps within itself.
          ptx::wgmma_wait<0>();
          if (pending) finish(acc1, a1);
        }
        const bool odd = i < i_end;
        if (odd) stage_turn(i, a0, acc0, a1, acc1);
        ptx::wgmma_wait<0>();
        if (pending) {
          if (odd) finish(acc0, a0);
          else finish(acc1, a1);
        }
      } else
      for (int i = i_begin; i < i_end; ++i, ring.advance()) {
        const int stage = ring.stage;
        ptx::mbar_wait_shared(full_addr + stage * 8, ring.phase);
        const uint8_t* wt = smem_w + stage * Smem::kStageW;
        const uint8_t* fold_area = smem_fold + stage * Smem::kStageFold;
        const float* rs = smem_rs + stage * kBlocks * kFp4DecodeRows;
        const uint32_t* flags = smem_flags + stage * 4;
        const float* xs = smem_xs + stage * kSteps * WN;
        const uint32_t desc_x = desc_x0 + static_cast<uint32_t>(stage * (Smem::kStageX >> 4));
        auto desc_of = [&](int s) {  // step s: box s / 4, 32 bytes per step inside it
          return ptx::desc_from_words(desc_x + static_cast<uint32_t>(((s / 4) * WN * kGemmBlockK + (s % 4) * 32) >> 4), kDescHi);
        };
#pragma unroll
        for (int q = 0; q < kBlocks; ++q) {
          uint32_t raw[4][4];
#pragma unroll
          for (int j = 0; j < 4; ++j) fp4_fragment_load(wt, frag_off[0][4 * q + j], frag_off[1][4 * q + j], raw[j]);
          const uint2* tab = reinterpret_cast<const uint2*>(fold_area + q * Smem::kBlockFold);      // [4][64]
          const float* scale = reinterpret_cast<const float*>(fold_area + q * Smem::kBlockFold);   // [4][64]
          if (!direct && flags[q] != 0u) {
            uint32_t a[4][4];
            float row_scale[2];
            if (prepared) {
              // The prepared words: group j's distance in bits 4j..4j+3, e_max in bits 16-23.
              const uint32_t* words = smem_words + stage * kBlocks * kFp4DecodeRows + q * kFp4DecodeRows;
              const uint32_t w0 = words[r0], w1 = words[r0 + 8];
#pragma unroll
              for (int j = 0; j < 4; ++j)
                fp4_fragment_expand(raw[j], fold_tab[fp4_fold_word_dist(w0, j)], fold_tab[fp4_fold_word_dist(w1, j)], a[j]);
              row_scale[0] = ue8m0_bits_to_float(static_cast<uint32_t>(fp4_fold_word_emax(w0)));
              row_scale[1] = ue8m0_bits_to_float(static_cast<uint32_t>(fp4_fold_word_emax(w1)));
            } else {
#pragma unroll
              for (int j = 0; j < 4; ++j)
                fp4_fragment_expand(raw[j], tab[j * kFp4DecodeRows + r0], tab[j * kFp4DecodeRows + r0 + 8], a[j]);
              row_scale[0] = rs[q * kFp4DecodeRows + r0];
              row_scale[1] = rs[q * kFp4DecodeRows + r0 + 8];
            }
            float acc[kAcc];
            ptx::wgmma_fence();
#pragma unroll
            for (int j = 0; j < 4; ++j) Mma::mma(a[j], desc_of(4 * q + j), acc, j > 0);
            ptx::wgmma_commit();
            float2 xv[WN / 8];
#pragma unroll
            for (int j = 0; j < WN / 8; ++j)
              xv[j] = p.a_scale ? *reinterpret_cast<const float2*>(xs + 4 * q * WN + 8 * j + 2 * t) : make_float2(1.0f, 1.0f);
            ptx::wgmma_wait<0>();
            ptx::fence_operands(acc);
#pragma unroll
            for (int j = 0; j < 4; ++j) fence_regs(a[j]);
#pragma unroll
            for (int j = 0; j < WN / 8; ++j) {
              total[4 * j + 0] = fmaf(acc[4 * j + 0] * row_scale[0], xv[j].x, total[4 * j + 0]);
              total[4 * j + 1] = fmaf(acc[4 * j + 1] * row_scale[0], xv[j].y, total[4 * j + 1]);
              total[4 * j + 2] = fmaf(acc[4 * j + 2] * row_scale[1], xv[j].x, total[4 * j + 2]);
              total[4 * j + 3] = fmaf(acc[4 * j + 3] * row_scale[1], xv[j].y, total[4 * j + 3]);
            }
          } else {
            float wsc[2][4];  // per row and step: the group's scale (0 past K)
            if (direct || prepared) {
              // The loader's copies as they are (prepared words of a tile that does not fold are the scale words): words of four UE8M0 scales per row, or floats per group (the K
              // tail's groups past the last scale read the last one: zeroed here, their codes are zero-filled).
              const int valid = p.b_scale_cols - ((kb_begin + i - i_begin) * kBlocks + q) * 4;
              const uint32_t* words = smem_words + stage * kBlocks * kFp4DecodeRows + q * kFp4DecodeRows;
#pragma unroll
              for (int h = 0; h < 2; ++h) {
                if (word_scales) {
                  ue8m0x4_to_float(words[r0 + 8 * h], wsc[h]);
                } else {
#pragma unroll
                  for (int j = 0; j < 4; ++j) wsc[h][j] = scale[j * kFp4DecodeRows + r0 + 8 * h];
                }
                if (valid < 4) {
#pragma unroll
                  for (int j = 0; j < 4; ++j)
                    if (j >= valid) wsc[h][j] = 0.0f;
                }
              }
            } else {
#pragma unroll
              for (int h = 0; h < 2; ++h)
#pragma unroll
                for (int j = 0; j < 4; ++j) wsc[h][j] = scale[j * kFp4DecodeRows + r0 + 8 * h];
            }
            float sum[kAcc];
#pragma unroll
            for (int b = 0; b < 4; b += kPar) {
              uint32_t a[kPar][4];
              float acc[kPar][kAcc];
#pragma unroll
              for (int j = 0; j < kPar; ++j) fp4_fragment_expand(raw[b + j], plain_tab, plain_tab, a[j]);
              ptx::wgmma_fence();
#pragma unroll
              for (int j = 0; j < kPar; ++j) Mma::mma(a[j], desc_of(4 * q + b + j), acc[j], false);
              ptx::wgmma_commit();
              ptx::wgmma_wait<0>();
#pragma unroll
              for (int j = 0; j < kPar; ++j) {
                ptx::fence_operands(acc[j]);
                fence_regs(a[j]);
              }
#pragma unroll
              for (int j = 0; j < kPar; ++j) promote(4 * q + b + j, acc[j], wsc[0][b + j], wsc[1][b + j], xs, sum);
            }
          }
        }
        if (p.decode_thread_release) {
          ptx::mbar_arrive(&empty[stage]);
        } else {
          __syncwarp();
          if (lane == 0) ptx::mbar_arrive(&empty[stage]);
        }
      }
    }  // FP4 weights

    // Epilogue: accumulator i holds row n0 + r0 + 8·((i >> 1) & 1), token 8·(i >> 2) + 2t + (i & 1) of the chunk.
    // Without groups, split-K partials are stored raw (splitk_reduce_kernel applies the epilogue); with groups the
    // scales, the bias (split 0) and the row weight apply here, per expert, and the reduce only sums.
    const int tok0 = row0 + c * WN, tok_count = min(WN, rows - c * WN);
    if (!kGrouped && cluster_reduce) {
      // In-kernel split-K: this CTA's totals [WN tokens][kRows rows] go where the stages were, once every consumer
      // is done with them (every TMA and cp.async into them has landed: the consumers waited for each); then each
      // CTA of the cluster sums one slice of the tile's rows over all split_k CTAs' totals (in split order, as
      // splitk_reduce_kernel does) and stores y with the epilogue.
      static_assert(WN * kRows * 4 <= kStages * (Smem::kStageX + Smem::kStageW), "the totals fit in the stages");
      float* red = reinterpret_cast<float*>(smem);
      ptx::named_bar_sync<1, 32 * kConsumerWarps>();
#pragma unroll
      for (int i = 0; i < kAcc; ++i)
        red[(8 * (i >> 2) + 2 * t + (i & 1)) * kRows + r0 + 8 * ((i >> 1) & 1)] = total[i];
      ptx::cluster_sync();
      const int lo = split * kRows / split_k, width = (split + 1) * kRows / split_k - lo;
      for (int e = static_cast<int>(threadIdx.x); e < tok_count * width; e += 32 * kConsumerWarps) {
        const int tok = e / width, n = n0 + lo + e % width;
        if (n >= p.n) continue;
        const float* at = red + tok * kRows + (n - n0);
        float v = 0.0f;
        for (int s = 0; s < split_k; ++s) v += ptx::ld_shared_cluster_f32(at, static_cast<uint32_t>(s));
        const int row = tok0 + tok;
        store_one(p, row, n,
                  splitk_finish(v, load_vec(p.row_mode, p.row_scale, row), load_vec(p.col_mode, p.col_scale, n),
                                load_bias(p, n)));
      }
      // No CTA leaves while another reads its totals. Relaxed: this thread's loads of the others' totals have returned
      // (their values are stored), and it publishes nothing through this barrier (y is not read in the kernel), so
      // the release fence (a MEMBAR over y's stores) is not needed.
      ptx::cluster_sync_relaxed();
      continue;             // the dense kernel's one chunk
    }
#pragma unroll
    for (int i = 0; i < kAcc; ++i) {
      const int tok = 8 * (i >> 2) + 2 * t + (i & 1);
      const int n = n0 + r0 + 8 * ((i >> 1) & 1);
      if (tok >= tok_count || n >= p.n) continue;
      const int row = tok0 + tok;
      decode_store<kGrouped>(p, group, split, row, n, total[i]);
    }
  }  // chunks
  // kSplitFinish (split_counters set, p.workspace set, no cluster reduce): the tile's last CTA finishes the split-K
  // here. A separate instantiation, so that the others compile as before.
  if constexpr (kSplitFinish) {
    const int slot = kGrouped ? static_cast<int>(blockIdx.x) / split_k / tiles : 0;
    split_finish_in_kernel<kRows, 32 * kConsumerWarps>(p, !kGrouped, split_counters + slot * tiles + tile, split_k,
                                                       row0, rows, n0, reinterpret_cast<volatile int*>(smem));
  }
#endif
}

}  // namespace finegemm::cuda
