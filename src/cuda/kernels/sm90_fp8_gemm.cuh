// The sm_90a FP8 GEMM: y = A·Bᵀ with E4M3 A [M, K] and B [N, K] (both K-major), FP32 accumulation.
//
// Structure (one persistent CTA per SM):
//   - warpgroup kNumConsumers (the last): producer; one thread issues TMA loads of A and B K-blocks (128 wide)
//     into a kNumStages ring guarded by full/empty mbarriers;
//   - warpgroups 0..kNumConsumers-1: consumers; each owns 64 rows of the BLOCK_M × BLOCK_N tile and runs
//     wgmma m64nBLOCK_Nk32. With kPromote, the wgmma result of every `promote_k` slice of K is scaled by the
//     A (row, group) and B (block row, block) scales and added to FP32 registers: the block-scaled recipes.
//     Without it, per-tensor/per-channel/per-token scales are folded into the epilogue.
//   - the scheduler (a template parameter) maps tiles to rows, column blocks, groups (MoE experts) and K ranges;
//   - the epilogue (a template parameter) stores y, or applies the MoE activation to the tile's gate/up columns and
//     requantizes the result to E4M3 (the intermediate never reaches memory in high precision).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdio>
#include <type_traits>

#include "core/formats.hpp"
#include "cuda/kernels/fp4_expand.hpp"
#include "cuda/kernels/gemm_params.cuh"
#include "cuda/kernels/moe_activation.cuh"
#include "cuda/kernels/quant_activations.cuh"
#include "cuda/ptx/ptx.cuh"
#include "cuda/ptx/wgmma_fp8.cuh"
#include "cuda/scheduler/gemm_scheduler.cuh"

namespace finegemm::cuda {

inline constexpr int kGemmBlockK = 128;
// A tile whose B scale is one value over all its columns (the promotion's split chunk lies past the tile).
inline constexpr int kSplitNone = 1 << 20;
// promoted_k_loop's tag for a b_split known only at run time.
inline constexpr int kSplitRuntime = -(1 << 20);

// kPromoteK: 0 when no scale varies along K (they fold into the epilogue), else the K slice (32, 64 or 128)
// after which the wgmma result is scaled and added to the FP32 total.
// FP4 B with kPromoteK = 128 ("fold"): each 1x32 group's power-of-two scale is folded into the expanded E4M3
// values relative to the largest scale of its 128-wide K block, so the accumulator is promoted once per 128.
// A K block whose scales spread more than 8 binades (E4M3 holds E2M1·2^-d exactly for d ≤ 8 only) is expanded
// unfolded and promoted every 32: the loader warp flags each stage.
// kOutBytes: the TMA-store epilogue's staging buffer (one 64 x BLOCK_N 16-bit tile per consumer warpgroup), after
// B's stages (1024-aligned, as the 128-byte swizzle wants).
template <int BLOCK_M, int BLOCK_N, int kNumStages, int kPromoteK, int kSchedulerBytes = 0, bool kFp4B = false,
          int kOutBytes = 0>
struct GemmSmem;
// The TMA-store epilogue's staging buffer (GemmSmem's kOutBytes): one 64 x BLOCK_N tile of 16-bit outputs per consumer
// warpgroup. The kernel lays its shared memory out with it and the launcher sizes the allocation with it.
template <int BLOCK_M, int BLOCK_N>
inline constexpr int kTmaStoreStagingBytes = (BLOCK_M / 64) * 64 * BLOCK_N * 2;

template <int BLOCK_M, int BLOCK_N, int kNumStages, int kPromoteK, int kSchedulerBytes, bool kFp4B, int kOutBytes>
struct GemmSmem {
  static constexpr int kSubs = kPromoteK == 0 ? 0 : kGemmBlockK / kPromoteK;
  // Promotion slices stored per stage: FP4 keeps four (the unfolded fallback promotes every 32).
  static constexpr int kScaleSubs = kFp4B ? 4 : kSubs;
  static constexpr bool kFold = kFp4B && kPromoteK == 128;
  static constexpr int kStageA = BLOCK_M * kGemmBlockK;
  static constexpr int kStageB = BLOCK_N * kGemmBlockK;
  // Per stage: A scales [kScaleSubs][BLOCK_M] and B scales [kScaleSubs][BLOCK_N], staged by the scale-loader warps.
  static constexpr int kStageScales = kScaleSubs * (BLOCK_M + BLOCK_N) * 4;
  // Fold: a flag per stage, then per loader warp a 9-entry expansion table (E2M1·2^-d, d = 0..8) and the
  // per-row shifts of the four groups of its current K block.
  // NOTE: the flags take a multiple of 16 bytes: the tables after them are read as 8-byte words (a 20-byte flag
  // area faulted with "misaligned address" on the H200).
  static constexpr int kFoldFlagBytes = (kNumStages * 4 + 15) / 16 * 16;
  static constexpr int kFoldWarpBytes = 80 + BLOCK_N * 4;
  static constexpr int kFoldBytes = kFold ? kFoldFlagBytes + 3 * kFoldWarpBytes + 16 : 0;
  // FP4 B: the packed tile (64 bytes per row per K block) lands here, and is expanded into the B stage.
  static constexpr int kStageRawB = kFp4B ? BLOCK_N * kGemmBlockK / 2 : 0;
  static constexpr int kBarriers = (kFp4B ? 3 : 2) * kNumStages * 8;
  // +1024: the dynamic base is re-aligned to 1024 B for the 128-byte swizzle.
  static constexpr int kBytes =
      kNumStages * (kStageA + kStageB + kStageScales + kStageRawB) + kOutBytes + kBarriers + kSchedulerBytes + kFoldBytes +
      1024;
};

// One output of a split-K finish: the summed partials times the row and column scales, plus the bias, rounded as
// written (no FMA contraction), so that every path that finishes split-K (this kernel, the decode kernel's cluster
// reduce) gives the same bits.
__device__ __forceinline__ float splitk_finish(float sum, float row_scale, float col_scale, float bias) {
  return __fadd_rn(__fmul_rn(__fmul_rn(sum, row_scale), col_scale), bias);
}

__device__ __forceinline__ float load_b_scale(const GemmParams& p, int group, int block_row, int k_index) {
  const int64_t base = group * p.b_scale_group_stride + block_row * p.b_scale_stride_n;
  if (p.b_scale_fmt == ScaleFmt::F32) return static_cast<const float*>(p.b_scale)[base + k_index];
  if (p.b_scale_fmt == ScaleFmt::UE8M0) return fmt::ue8m0_to_float(static_cast<const uint8_t*>(p.b_scale)[base + k_index]);
  const int32_t word = static_cast<const int32_t*>(p.b_scale)[base + (k_index >> 2)];
  return fmt::ue8m0_to_float(fmt::ue8m0_unpack(word, k_index & 3));
}

// B row (within the group) of column i of the tile at column block n_block.
template <int BLOCK_N>
__device__ __forceinline__ int tile_b_row(const GemmParams& p, int n_block, int i) {
  if (p.b_layout == BLayout::GateUpHalves) {
    constexpr int kHalf = BLOCK_N / 2;
    return (i < kHalf ? 0 : p.gate_up_split) + n_block * kHalf + (i % kHalf);
  }
  return n_block * BLOCK_N + i;
}

// The wide lean stores (GemmParams::wide_stores): the 4 x 4 words of a quad of lanes transposed, lane t ending with
// word t of every lane (lane t's word j = lane j's word t before), in two butterfly steps (xor 1, then xor 2) that
// each swap the off-diagonal 2 x 2 blocks: four shuffles per 32-bit word set.
__device__ __forceinline__ uint32_t shfl_xor_word(uint32_t v, int mask) { return __shfl_xor_sync(0xffffffffu, v, mask); }
__device__ __forceinline__ uint2 shfl_xor_word(uint2 v, int mask) {
  return make_uint2(__shfl_xor_sync(0xffffffffu, v.x, mask), __shfl_xor_sync(0xffffffffu, v.y, mask));
}
template <typename W>
__device__ __forceinline__ void quad_transpose(W (&a)[4], int lane) {
#pragma unroll
  for (int m = 1; m <= 2; m *= 2) {
    // Pairs (j, j | m): the lane with bit m set trades its word j for the partner's word j | m.
    const bool set = lane & m;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (j & m) continue;
      const W got = shfl_xor_word(set ? a[j] : a[j | m], m);
      if (set) a[j] = got;
      else a[j | m] = got;
    }
  }
}
// Two values rounded to a 16-bit pair (element 0 in the low half), as __floats2bfloat162_rn / __floats2half2_rn.
template <typename T>
__device__ __forceinline__ uint32_t pack_pair(float lo, float hi) {
  if constexpr (std::is_same_v<T, __half>) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  } else {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
}

// Eight E2M1 codes (a 32-bit word, element 0 in the low nibble) → eight E4M3 bytes. Exact: every E2M1 value is an
// E4M3 value. Two halves of e2m1x4_to_e4m3x4 (fp4_expand.hpp, proven on every input by test_fp4_expand): eleven
// instructions per eight codes (the sign bits moved by a byte permute; they were moved by masks and shifts, about
// twice the work, on the loader warps that bound FP4 prefill).
// `table` (lo, hi): the E4M3 bytes of the eight magnitudes; the default is E2M1 itself, a folded group passes the
// magnitudes times 2^-d.
__device__ __forceinline__ uint2 e2m1x8_to_e4m3x8(uint32_t w, uint32_t kLo = kE2m1TableLo, uint32_t kHi = kE2m1TableHi) {
  return make_uint2(e2m1x4_to_e4m3x4(w, kLo, kHi), e2m1x4_to_e4m3x4(w >> 16, kLo, kHi));
}

// The MoE activations (RECIPES.md), in float from the fp32 accumulators (moe_activation.cuh).
__device__ __forceinline__ float gated_act(const GemmParams& p, float gate, float up) {
  return moe_gated_act(p.act_kind, p.swiglu_limit, p.swiglu_alpha, gate, up);
}
__device__ __forceinline__ float plain_act(const GemmParams& p, float up) { return moe_plain_act(p.act_kind, up); }

__device__ __forceinline__ float load_vec(VecMode mode, const float* v, int index) {
  return mode == VecMode::PerIndex ? v[index] : (mode == VecMode::Scalar ? v[0] : 1.0f);
}

// Two adjacent outputs of one row, rounded to the output type T (float, __half or __nv_bfloat16).
template <typename T>
__device__ __forceinline__ void store_out_pair(T* at, float a, float b) {
  if constexpr (std::is_same_v<T, float>) *reinterpret_cast<float2*>(at) = make_float2(a, b);
  else if constexpr (std::is_same_v<T, __half>) *reinterpret_cast<__half2*>(at) = __floats2half2_rn(a, b);
  else *reinterpret_cast<__nv_bfloat162*>(at) = __floats2bfloat162_rn(a, b);
}

__device__ __forceinline__ float load_bias(const GemmParams& p, int64_t col) {
  switch (p.bias_dtype) {
    case static_cast<int>(OutDType::F32): return static_cast<const float*>(p.bias)[col];
    case static_cast<int>(OutDType::BF16): return __bfloat162float(static_cast<const __nv_bfloat16*>(p.bias)[col]);
    case static_cast<int>(OutDType::F16): return __half2float(static_cast<const __half*>(p.bias)[col]);
    default: return 0.0f;
  }
}

__device__ __forceinline__ void store_pair(const GemmParams& p, int row, int col, float v0, float v1) {
  const int64_t offset = static_cast<int64_t>(row) * p.ldo + col;
  switch (p.out_dtype) {
    case OutDType::F32: *reinterpret_cast<float2*>(static_cast<float*>(p.out) + offset) = make_float2(v0, v1); break;
    case OutDType::BF16:
      *reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(p.out) + offset) = __floats2bfloat162_rn(v0, v1);
      break;
    case OutDType::F16:
      *reinterpret_cast<__half2*>(static_cast<__half*>(p.out) + offset) = __floats2half2_rn(v0, v1);
      break;
  }
}

// Promotion of wgmma chunk `ch` (WGMMA_N columns) of a tile whose B scale takes one value on the 8-column chunks
// before kSplit and another from kSplit on (counted over the whole tile): the block-scaled recipes. lo0/lo1 and
// hi0/hi1 are this thread's two rows' A scale times the two B scales, formed before the wgmma wait, so that the
// promotion is one FMA per accumulator.
// NOTE: a free function: the same code as a generic lambda inside the kernel crashed cicc (CUDA 13.0).
template <int kSplit, int WGMMA_N, int kNumTotal>
__device__ __forceinline__ void promote_split(float (&total)[kNumTotal], const float (&a)[WGMMA_N / 2], float lo0, float lo1,
                                              float hi0, float hi1, int ch) {
#pragma unroll
  for (int c = 0; c < WGMMA_N / 8; ++c) {
    const bool lo = ch * (WGMMA_N / 8) + c < kSplit;
    const float s0 = lo ? lo0 : hi0, s1 = lo ? lo1 : hi1;
    float* tot = total + ch * (WGMMA_N / 2) + c * 4;
    tot[0] = fmaf(a[c * 4 + 0], s0, tot[0]);
    tot[1] = fmaf(a[c * 4 + 1], s0, tot[1]);
    tot[2] = fmaf(a[c * 4 + 2], s1, tot[2]);
    tot[3] = fmaf(a[c * 4 + 3], s1, tot[3]);
  }
}

// kCluster = 2: two CTAs of a cluster take vertically adjacent tiles of one column block (the scheduler hands out
// pairs, Scheduler's BLOCK_M is 2·BLOCK_M); each loads its own A and half of the shared B tile, multicast to both,
// which halves the B traffic from L2.
// kShareA (with kCluster = 2): the pair takes horizontally adjacent tiles of one row block instead (the scheduler
// counts column-block pairs: n_block 2·pair + rank); each loads half of the shared A tile, multicast to both, and its
// own B. The tensor map of A then has boxes of BLOCK_M / 2 rows.
// kCluster = 4: a 2x2 block of tiles (two row blocks by two column blocks; the scheduler counts row-block pairs and
// column-block pairs). CTA rank r takes row block r & 1 and column block r >> 1 of the block: A is shared with rank
// r ^ 2 (same rows) and B with rank r ^ 1 (same columns). Each CTA loads half of its A tile, multicast to itself and
// r ^ 2, and half of its B tile, multicast to itself and r ^ 1: a quarter less L2 traffic per CTA than a pair
// sharing A alone at 192x128. A stage of CTA r is written by r, r ^ 1 and r ^ 2, so each producer's empty barrier
// counts the releases of all three, and a consumer releases its stage in all three.
// kTmaStore (the default where it applies; FINEGEMM_GEMM_TMA_STORE=0 turns it off): the dense Store epilogue through
// shared memory and TMA stores of y (tma_out: y as bytes, boxes of 64 rows x 128 bytes, 128-byte swizzle); the host
// takes it only where the lean epilogue serves (no split-K workspace, no column scale, no bias) with 16-bit output.
// FINEGEMM_GEMM_TRACE (a build flag, off in every shipped build): CTA 0 records clock() at fixed points of its first
// kGemmTraceIters K blocks, per consumer warpgroup (role 0..2) and for the TMA thread (role 3), 8 words per K block:
// consumers: e0 loop top, e1 stage landed, e2 issue order passed, e3 wgmma committed, e4 wgmma complete, e5 promoted,
// e6 released, e7 the tile index at a tile's first K block (else ~0); TMA thread: e0 before the empty wait, e1 after
// it, e2 after the copies, e7 the tile index. scripts/gemm-trace summarises them.
#ifndef FINEGEMM_GEMM_TRACE
#define FINEGEMM_GEMM_TRACE 0
#endif
constexpr int kGemmTraceIters = 512;
constexpr int kGemmTraceWords = 4 * kGemmTraceIters * 8;

// kOneAcc: a 128-wide two-consumer tile compiled with one accumulator set only (no two-set loop), so that it can
// take the lookahead loop (GemmParams::one_acc; with both loops in one kernel ptxas outlined the promotion).
template <int BLOCK_M, int BLOCK_N, int kNumStages, int kPromoteK, Epilogue kEpilogue, typename Scheduler, bool kFp4B,
          int kCluster = 1, bool kShareA = false, bool kTmaStore = false, bool kOneAcc = false>
__global__ void __launch_bounds__(128 * (BLOCK_M / 64 + 1), 1)
    sm90_fp8_gemm_kernel(const __grid_constant__ CUtensorMap tma_a, const __grid_constant__ CUtensorMap tma_b,
                         const __grid_constant__ CUtensorMap tma_out, const GemmParams p, const Scheduler scheduler_arg) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(BLOCK_M == 64 || BLOCK_M == 128 || BLOCK_M == 192, "BLOCK_M: one to three consumer warpgroups of 64 rows");
  static_assert(BLOCK_M != 192 || (BLOCK_N <= 128 && kPromoteK != 32 && !kFp4B),
                "192-row tiles: three consumer warpgroups at 152 registers, up to 128 wide, E4M3, no 32-wide promotion");
  static_assert(BLOCK_N % 16 == 0 && BLOCK_N <= 256, "BLOCK_N: a multiple of 16, at most 256");
  static_assert(kPromoteK == 0 || kPromoteK == 32 || kPromoteK == 64 || kPromoteK == 128, "kPromoteK: 0, 32, 64, 128");
  constexpr bool kPromote = kPromoteK != 0;
  constexpr int kNumConsumers = BLOCK_M / 64;
  // NOTE: with promotion, a 256-wide tile runs as two n128 wgmma per K slice so that the partial accumulator
  // (64 registers) fits beside the 128-register total.
  constexpr int kNChunks = (kPromote && BLOCK_N > 192) ? 2 : 1;
  constexpr int WGMMA_N = BLOCK_N / kNChunks;
  constexpr int kNumAcc = WGMMA_N / 2;
  constexpr int kNumTotal = BLOCK_N / 2;
  // NOTE: setmaxnreg.inc waits until the registers are free in the pool the launch allocated (168 per thread ×
  // 384 threads = 64512 for two consumers), not the 65536 of the SM: 64 + 2 × 224 = 65536 hung on the H200.
  // Three consumers (512 threads, 128 each at launch): 56 + 3 × 152 = 512 = 4 × 128 (40 made the loaders spill).
  constexpr int kProducerRegs = kNumConsumers == 1 ? 64 : 56;
  constexpr int kConsumerRegs = kNumConsumers == 1 ? 240 : (kNumConsumers == 2 ? 224 : 152);
  constexpr int kLaunchRegs = (65536 / (128 * (kNumConsumers + 1)) > 255 ? 255 : 65536 / (128 * (kNumConsumers + 1))) / 8 * 8;
  static_assert(kProducerRegs + kNumConsumers * kConsumerRegs <= kLaunchRegs * (kNumConsumers + 1),
                "setmaxnreg: the warpgroups ask for more registers than the launch allocated");
  static_assert(!kFp4B || kPromoteK == 32 || kPromoteK == 128, "FP4 B: promote every 32, or fold (128)");
  static_assert(kCluster == 1 || ((kCluster == 2 || kCluster == 4) && !kFp4B),
                "clusters: 1, 2 CTAs sharing an E4M3 A or B tile, or 2x2 sharing both");
  static_assert(kCluster != 4 || (!kShareA && kEpilogue == Epilogue::Store), "2x2 clusters: dense Store");
  // The CTAs that write into this CTA's stages (and whose producers this CTA's consumers release): itself and one
  // peer in a pair, itself and two peers in a 2x2 block.
  constexpr int kStageWriters = kCluster == 4 ? 3 : kCluster;
  static_assert(!kShareA || (kCluster == 2 && kEpilogue == Epilogue::Store), "shared A: 2-CTA clusters, dense Store");
  static_assert(!kTmaStore || (kEpilogue == Epilogue::Store && !kFp4B && BLOCK_N % 64 == 0 && BLOCK_N <= 192),
                "TMA-store epilogue: dense Store, E4M3, tiles 64, 128 or 192 wide");
  constexpr int kOutTileBytes = 64 * BLOCK_N * 2;  // one consumer warpgroup's 16-bit outputs
  constexpr int kStagingBytes = kTmaStore ? kTmaStoreStagingBytes<BLOCK_M, BLOCK_N> : 0;
  static_assert(!kTmaStore || kStagingBytes == kNumConsumers * kOutTileBytes, "TMA store: a staging tile per warpgroup");
  using Smem = GemmSmem<BLOCK_M, BLOCK_N, kNumStages, kPromoteK, Scheduler::kSmemBytes, kFp4B, kStagingBytes>;
  constexpr int kSubs = Smem::kSubs;
  constexpr int kScaleSubs = Smem::kScaleSubs;
  constexpr bool kFold = Smem::kFold;
  using Mma = ptx::WgmmaFp8<WGMMA_N>;
  if (p.gate != nullptr) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (p.gate_wait) cudaGridDependencySynchronize();  // GemmParams::gate_wait: after the gated launch ahead
    if (p.gate_trigger) cudaTriggerProgrammaticLaunchCompletion();
#endif
    if ((*p.gate & p.gate_mask) != p.gate_value) return;  // the other path of a gated pair runs
  }

  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (ptx::smem_addr(smem_raw) & 1023)) & 1023);
  uint8_t* smem_a = smem;
  uint8_t* smem_b = smem_a + kNumStages * Smem::kStageA;
  uint8_t* smem_out = smem_b + kNumStages * Smem::kStageB;  // kTmaStore: the staging tiles
  uint8_t* smem_raw_b = smem_out + kStagingBytes;
  float* smem_scales = reinterpret_cast<float*>(smem_raw_b + kNumStages * Smem::kStageRawB);
  uint64_t* full = reinterpret_cast<uint64_t*>(reinterpret_cast<uint8_t*>(smem_scales) + kNumStages * Smem::kStageScales);
  uint64_t* empty = full + kNumStages;
  uint64_t* raw_full = empty + kNumStages;  // FP4 B: the packed tile has landed (kFp4B only)
  void* smem_scheduler = empty + (kFp4B ? 2 : 1) * kNumStages;
  auto stage_scales_a = [&](int stage, int sub) {
    return smem_scales + stage * (kScaleSubs * (BLOCK_M + BLOCK_N)) + sub * BLOCK_M;
  };
  auto stage_scales_b = [&](int stage, int sub) {
    return smem_scales + stage * (kScaleSubs * (BLOCK_M + BLOCK_N)) + kScaleSubs * BLOCK_M + sub * BLOCK_N;
  };
  // Fold: per-stage flags (1: folded, promote once) and the loader warps' tables and shifts.
  // NOTE: aligned by pointer arithmetic, not through an integer: a pointer rebuilt from an integer lost its shared
  // address space, and the FP4 expansion loop read its table and shifts with generic loads (ncu, 303b74c).
  uint8_t* const scheduler_end = reinterpret_cast<uint8_t*>(smem_scheduler) + Scheduler::kSmemBytes;
  uint8_t* fold_area = scheduler_end + ((16u - (ptx::smem_addr(scheduler_end) & 15u)) & 15u);
  int* fold_flags = reinterpret_cast<int*>(fold_area);

  // Broadcast from lane 0 so that ptxas knows the value is warp-uniform (the consumers' descriptors and barrier
  // addresses derived from it then stay in uniform registers).
  const int warpgroup = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / 128), 0);
  const int lane = threadIdx.x % 32;
  // The CTA's place in its cluster; its tiles are every (gridDim.x / kCluster)-th from its cluster's index.
  const uint32_t cta_rank = kCluster == 1 ? 0u : ptx::cluster_ctarank();
  const int tile_begin = static_cast<int>(blockIdx.x) / kCluster;
  const int tile_step = static_cast<int>(gridDim.x) / kCluster;
  // One B scale for the whole tile, or one per 8-column chunk, or one per column.
  const bool b_uniform = p.b_layout == BLayout::Plain && p.b_block_n % BLOCK_N == 0;
  const bool b_chunk_uniform = p.b_block_n % 8 == 0;

  // Barriers: full[s] completes on the TMA thread's expect_tx plus the bytes, and (with promotion) on the 32
  // arrivals of the scale-loader warp; empty[s] on one arrive per consumer warp.
  if (threadIdx.x == 0) {
    for (int s = 0; s < kNumStages; ++s) {
      ptx::mbar_init(&full[s], kPromote ? 1 + 32 : 1);
      // With a cluster, every reader CTA releases: each peer by one arrival per consumer warp; this CTA's own consumers
      // by one per warp, or with p.thread_release one per thread.
      ptx::mbar_init(&empty[s], kNumConsumers * (p.thread_release ? 128 : 4) + kNumConsumers * 4 * (kStageWriters - 1));
      if constexpr (kFp4B) ptx::mbar_init(&raw_full[s], 1);
    }
    ptx::fence_barrier_init();
  }
  Scheduler scheduler = scheduler_arg;
  scheduler.prepare(smem_scheduler, blockDim.x);
  if constexpr (kCluster > 1) {
    ptx::cluster_sync();  // the peer's barriers are initialised before any multicast or remote arrive reaches them
  } else {
    __syncthreads();
  }
  auto tile_at = [&](int t) {
    TileInfo info = scheduler.tile(t);
    if constexpr (kCluster == 4) {
      info.n_block = info.n_block * 2 + static_cast<int>(cta_rank >> 1);
      info.m_row0 += static_cast<int>(cta_rank & 1u) * BLOCK_M;
    } else if constexpr (kCluster > 1 && kShareA) {
      info.n_block = info.n_block * 2 + static_cast<int>(cta_rank);
    } else if constexpr (kCluster > 1) {
      info.m_row0 += static_cast<int>(cta_rank) * BLOCK_M;
    }
    return info;
  };
  // A consumer warp releases a stage in its own CTA and, with a cluster, in the peer (whose B half it also holds).
  // Called by every lane of the warp once the warp is done with the stage's shared memory.
  // p.thread_release: every thread arrives on its own CTA's barrier (its reads precede its own arrival, which racecheck
  // follows; one lane's arrival after __syncwarp is the same order by bar.warp.sync, which racecheck does not
  // follow: stop 27), and lane 0 alone arrives on the peers'.
  const bool thread_release = p.thread_release;
  auto release = [&](int stage) {
    if (thread_release) ptx::mbar_arrive(&empty[stage]);
    __syncwarp();
    if (lane == 0) {
      if (!thread_release) ptx::mbar_arrive(&empty[stage]);
      if constexpr (kCluster > 1) ptx::mbar_arrive_cluster(&empty[stage], cta_rank ^ 1u);
      if constexpr (kCluster == 4) ptx::mbar_arrive_cluster(&empty[stage], cta_rank ^ 2u);
    }
  };

  // Broadcast from lane 0: the grouped scheduler reads its tables from shared memory, and ptxas treats such loads as
  // varying across the warp. A uniform tile loop lets the consumers keep the ring position and the descriptors in
  // uniform registers (with varying ones the 128x256 gate_up kernel rebuilt them through R2UR at every wgmma and
  // spilled in its K loop).
  const int num_tiles = __shfl_sync(0xffffffffu, scheduler.num_tiles(), 0);
  auto uniform_tile = [](TileInfo info) {
    info.m_row0 = __shfl_sync(0xffffffffu, info.m_row0, 0);
    info.m_end = __shfl_sync(0xffffffffu, info.m_end, 0);
    info.n_block = __shfl_sync(0xffffffffu, info.n_block, 0);
    info.group = __shfl_sync(0xffffffffu, info.group, 0);
    info.split = __shfl_sync(0xffffffffu, info.split, 0);
    info.kb_begin = __shfl_sync(0xffffffffu, info.kb_begin, 0);
    info.kb_end = __shfl_sync(0xffffffffu, info.kb_end, 0);
    return info;
  };

  if (warpgroup == kNumConsumers) {
    // ---------------- Producer warpgroup: warp 0 issues TMA, warps 1..3 stage the promotion scales.
    ptx::setmaxnreg_dec<kProducerRegs>();
    const int warp = (threadIdx.x % 128) / 32;
    if (warp == 0 && lane == 0) {
      ptx::prefetch_tensor_map(&tma_a);
      ptx::prefetch_tensor_map(&tma_b);
      // L2 prefetch (GemmParams::l2_prefetch = D): a second cursor walks the K blocks D ahead of the loads, in the
      // same order (across tile ends), and requests each one's B tile into L2.
      const bool l2_prefetch = !kFp4B && p.l2_prefetch > 0;
      int pf_t = tile_begin, pf_kb = 0, pf_end = 0, pf_row0 = 0, pf_row1 = 0;
      auto pf_seek = [&]() {  // from tile pf_t on, the first tile with K blocks (pf_t = num_tiles: none left)
        for (; pf_t < num_tiles; pf_t += tile_step) {
          const TileInfo tl = tile_at(pf_t);
          if (tl.kb_begin < tl.kb_end) {
            pf_kb = tl.kb_begin;
            pf_end = tl.kb_end;
            pf_row0 = tl.group * p.n + tile_b_row<BLOCK_N>(p, tl.n_block, 0);
            pf_row1 = tl.group * p.n + tile_b_row<BLOCK_N>(p, tl.n_block, BLOCK_N / 2);
            return;
          }
        }
      };
      auto pf_step = [&]() {
        if (++pf_kb >= pf_end) {
          pf_t += tile_step;
          pf_seek();
        }
      };
      if (l2_prefetch) {
        pf_seek();
        for (int i = 0; i < p.l2_prefetch && pf_t < num_tiles; ++i) pf_step();
      }
      uint32_t iter = 0;
      for (int t = tile_begin; t < num_tiles; t += tile_step) {
        const TileInfo tile = tile_at(t);
        const int b_row0 = tile.group * p.n + tile_b_row<BLOCK_N>(p, tile.n_block, 0);
        const int b_row1 = tile.group * p.n + tile_b_row<BLOCK_N>(p, tile.n_block, BLOCK_N / 2);
        for (int kb = tile.kb_begin; kb < tile.kb_end; ++kb, ++iter) {
          const int stage = iter % kNumStages;
          // Before this stage's wait: the request runs while the consumers still hold the stage.
          if (l2_prefetch && pf_t < num_tiles) {
            ptx::tma_prefetch_l2_2d(&tma_b, pf_kb * kGemmBlockK, pf_row0);
            ptx::tma_prefetch_l2_2d(&tma_b, pf_kb * kGemmBlockK, pf_row1);
            pf_step();
          }
#if FINEGEMM_GEMM_TRACE
          const bool ptrace = p.trace != nullptr && blockIdx.x == 0 && iter < static_cast<uint32_t>(kGemmTraceIters);
          if (ptrace) {
            p.trace[(3 * kGemmTraceIters + iter) * 8 + 0] = static_cast<uint32_t>(clock());
            p.trace[(3 * kGemmTraceIters + iter) * 8 + 7] = kb == tile.kb_begin ? static_cast<uint32_t>(t) : ~0u;
          }
#endif
          // Wait until the consumers released this stage (passes at once on the first lap).
          ptx::mbar_wait(&empty[stage], ((iter / kNumStages) & 1) ^ 1);
#if FINEGEMM_GEMM_TRACE
          if (ptrace) p.trace[(3 * kGemmTraceIters + iter) * 8 + 1] = static_cast<uint32_t>(clock());
#endif
          if constexpr (kFp4B) {
            // A to its stage; packed B to the staging buffer, expanded by a loader warp (which then completes full).
            ptx::mbar_arrive_expect_tx(&full[stage], Smem::kStageA);
            ptx::tma_load_2d(smem_a + stage * Smem::kStageA, &tma_a, &full[stage], kb * kGemmBlockK, tile.m_row0);
            ptx::mbar_arrive_expect_tx(&raw_full[stage], Smem::kStageRawB);
            uint8_t* raw_dst = smem_raw_b + stage * Smem::kStageRawB;
            ptx::tma_load_2d(raw_dst, &tma_b, &raw_full[stage], kb * kGemmBlockK / 2, b_row0);
            ptx::tma_load_2d(raw_dst + (BLOCK_N / 2) * kGemmBlockK / 2, &tma_b, &raw_full[stage], kb * kGemmBlockK / 2, b_row1);
          } else {
            // A scales by the async proxy (GemmParams::a_scale_bulk, groups of 128: group kb): the tile's rows up to M,
            // in whole 16 bytes (at most three rows past M, inside the scale row's padding; never stored).
            uint32_t scale_bytes = 0;
            const float* scale_src = nullptr;
            if constexpr (kPromoteK == 128 && !kFp4B) {
              if (p.a_scale_bulk) {
                const int rows = min(BLOCK_M, p.m - tile.m_row0);
                scale_bytes = rows > 0 ? static_cast<uint32_t>((rows + 3) / 4 * 16) : 0u;
                scale_src = p.a_scale + static_cast<int64_t>(min(kb, p.a_scale_cols - 1)) * p.a_scale_stride_k + tile.m_row0;
              }
            }
            ptx::mbar_arrive_expect_tx(&full[stage], Smem::kStageA + Smem::kStageB + scale_bytes);
            if (scale_bytes != 0) ptx::bulk_load(stage_scales_a(stage, 0), scale_src, scale_bytes, &full[stage]);
            if constexpr (kCluster == 4) {
              // Half of A (by this CTA's column in the block) into itself and r ^ 2, which has the same rows; half of
              // B (by its row in the block) into itself and r ^ 1, which has the same columns.
              const uint32_t cx = cta_rank >> 1, ry = cta_rank & 1u;
              const uint16_t a_mask = static_cast<uint16_t>((1u << cta_rank) | (1u << (cta_rank ^ 2u)));
              const uint16_t b_mask = static_cast<uint16_t>((1u << cta_rank) | (1u << (cta_rank ^ 1u)));
              ptx::tma_load_2d_multicast(smem_a + stage * Smem::kStageA + cx * (BLOCK_M / 2) * kGemmBlockK, &tma_a,
                                         &full[stage], kb * kGemmBlockK, tile.m_row0 + static_cast<int>(cx) * (BLOCK_M / 2), a_mask);
              ptx::tma_load_2d_multicast(smem_b + stage * Smem::kStageB + ry * (BLOCK_N / 2) * kGemmBlockK, &tma_b,
                                         &full[stage], kb * kGemmBlockK, ry == 0 ? b_row0 : b_row1, b_mask);
            } else if constexpr (kShareA) {
              // This CTA's half of A, into both CTAs (the peer loads the other half into both). The halves start at
              // multiples of 1024 bytes (64 or 96 rows of 128), so the 128-byte swizzle lines up.
              ptx::tma_load_2d_multicast(smem_a + stage * Smem::kStageA + cta_rank * (BLOCK_M / 2) * kGemmBlockK, &tma_a,
                                         &full[stage], kb * kGemmBlockK, tile.m_row0 + static_cast<int>(cta_rank) * (BLOCK_M / 2), 0x3);
            } else {
              ptx::tma_load_2d(smem_a + stage * Smem::kStageA, &tma_a, &full[stage], kb * kGemmBlockK, tile.m_row0);
            }
            // B in two halves of BLOCK_N/2 rows (the gate and up halves of a fused gate_up tile); 2x2: loaded above.
            uint8_t* b_dst = smem_b + stage * Smem::kStageB;
            if constexpr (kCluster == 2 && !kShareA) {
              // This CTA's half of B, into both CTAs (the peer loads the other half into both).
              ptx::tma_load_2d_multicast(b_dst + cta_rank * (BLOCK_N / 2) * kGemmBlockK, &tma_b, &full[stage],
                                         kb * kGemmBlockK, cta_rank == 0 ? b_row0 : b_row1, 0x3);
            } else if constexpr (kCluster != 4) {
              // With p.b_box_full the box holds BLOCK_N rows (b_row1 = b_row0 + BLOCK_N / 2): one copy, the same bytes in
              // the same swizzled layout.
              ptx::tma_load_2d(b_dst, &tma_b, &full[stage], kb * kGemmBlockK, b_row0);
              if (!p.b_box_full)
                ptx::tma_load_2d(b_dst + (BLOCK_N / 2) * kGemmBlockK, &tma_b, &full[stage], kb * kGemmBlockK, b_row1);
            }
          }
#if FINEGEMM_GEMM_TRACE
          if (ptrace) p.trace[(3 * kGemmTraceIters + iter) * 8 + 2] = static_cast<uint32_t>(clock());
#endif
        }
      }
    } else if (kPromote && warp >= 1) {
      // Warps 1..3 stage the promotion scales, taking the K blocks in turn.
      // NOTE: one warp gathering every stage was latency-bound (a dependent global load per stage): decode at
      // M=1, N=7168, K=16384 streamed 1.5 TB/s. Three warps keep three stages' loads in flight, and (one promotion
      // slice per stage) each warp loads its next K block's scales into registers before it waits for and fills
      // the current stage: six K blocks' loads in flight, so the load latency stays off the consumers' path.
      // Scales are gathered with plain loads, so any scale layout (row- or column-major, UE8M0, packed) works.
      constexpr int kLoaders = 3;
      constexpr int kVa = BLOCK_M / 32, kVb = (BLOCK_N + 31) / 32;
      // Two sets in flight when a stage has one promotion slice; FP4 / 1x32 recipes (four slices) keep one.
      constexpr bool kPipelined = kSubs == 1 && !kFp4B;
      const int loader = warp - 1;
      struct Cursor {
        int t;
        TileInfo tile;
        int kb;
        uint32_t iter;
        bool valid;
      };
      auto seek_tile = [&](Cursor& c) {  // from tile c.t on, the first tile with K blocks
        for (; c.t < num_tiles; c.t += tile_step) {
          c.tile = tile_at(c.t);
          if (c.tile.kb_begin < c.tile.kb_end) {
            c.kb = c.tile.kb_begin;
            c.valid = true;
            return;
          }
        }
        c.valid = false;
      };
      auto step = [&](Cursor& c, int n) {  // n K blocks forward, in the order the producer and consumers walk
        for (int i = 0; i < n && c.valid; ++i) {
          ++c.iter;
          if (++c.kb >= c.tile.kb_end) {
            c.t += tile_step;
            seek_tile(c);
          }
        }
      };
      // The TMA thread copies the A scales (GemmParams::a_scale_bulk): these warps stage the B scales only.
      const bool a_bulk = kPromoteK == 128 && !kFp4B && p.a_scale_bulk;
      auto load = [&](const Cursor& c, int sub, float(&va)[kVa], float(&vb)[kVb]) {
        const int k_global = c.kb * kGemmBlockK + sub * kPromoteK;
        const int g = min(k_global / p.a_group, p.a_scale_cols - 1);
        const int kb_scale = min(k_global / p.b_block_k, p.b_scale_cols - 1);
        if (!a_bulk) {
#pragma unroll
          for (int j = 0; j < kVa; ++j) {
            // Rows past the tile's last (a grouped tile's expert ends there, a dense tile at M) read its last row's
            // scales: their outputs are never stored, and the rows past the last routed slot were never written
            // (compute-sanitizer initcheck, stop 56).
            const int row = min(c.tile.m_row0 + lane + 32 * j, max(min(c.tile.m_end, p.m) - 1, 0));
            va[j] = p.a_scale ? p.a_scale[row * p.a_scale_stride_m + g * p.a_scale_stride_k] : 1.0f;
          }
        }
        // NOTE: 128-wide promotion of E4M3 B only (FP4 scales are per row); in the 32-wide kernels the extra path
        // made the grouped 128x128 kernel spill 8 bytes.
        if (kPromoteK == 128 && !kFp4B && b_chunk_uniform && p.chunk_scales) {
          // One scale per 8-column chunk (lane = chunk): the consumers read each chunk's first column only.
          const int i = min(lane * 8, BLOCK_N - 1);
          const int b_row = min(tile_b_row<BLOCK_N>(p, c.tile.n_block, i), p.n - 1);
          vb[0] = (p.b_scale && lane < BLOCK_N / 8 && (!b_uniform || lane == 0))
                      ? load_b_scale(p, c.tile.group, b_row / p.b_block_n, kb_scale)
                      : 1.0f;
          return;
        }
#pragma unroll
        for (int j = 0; j < kVb; ++j) {
          const int i = lane + 32 * j;
          const int b_row = min(tile_b_row<BLOCK_N>(p, c.tile.n_block, min(i, BLOCK_N - 1)), p.n - 1);
          vb[j] = (p.b_scale && i < BLOCK_N && (!b_uniform || i == 0))
                      ? load_b_scale(p, c.tile.group, b_row / p.b_block_n, kb_scale)
                      : 1.0f;
        }
      };
      auto store = [&](int stage, int sub, const float(&va)[kVa], const float(&vb)[kVb]) {
        float* sa = stage_scales_a(stage, sub);
        float* sb = stage_scales_b(stage, sub);
        if (!a_bulk) {
#pragma unroll
          for (int j = 0; j < kVa; ++j) sa[lane + 32 * j] = va[j];
        }
        if (kPromoteK == 128 && !kFp4B && b_chunk_uniform && p.chunk_scales) {
          if (lane < BLOCK_N / 8) sb[lane * 8] = vb[0];
          return;
        }
#pragma unroll
        for (int j = 0; j < kVb; ++j)
          if (lane + 32 * j < BLOCK_N) sb[lane + 32 * j] = vb[j];
      };
      // Fold: this warp's expansion table (entry d: the eight E2M1 magnitudes times 2^-d, as E4M3) and shifts.
      uint2* fold_table = reinterpret_cast<uint2*>(fold_area + Smem::kFoldFlagBytes + loader * Smem::kFoldWarpBytes);
      uint32_t* fold_shift = reinterpret_cast<uint32_t*>(fold_area + Smem::kFoldFlagBytes + loader * Smem::kFoldWarpBytes + 80);
      if constexpr (kFold) {
        if (lane < 9) fold_table[lane] = make_uint2(fp4_fold_table_word(lane, 0), fp4_fold_table_word(lane, 1));
        __syncwarp();
      }
      Cursor c{tile_begin, TileInfo{}, 0, 0, false};
      seek_tile(c);
      step(c, loader);
      float va[kVa], vb[kVb];
      if (kPipelined && c.valid) load(c, 0, va, vb);
      while (c.valid) {
        Cursor next = c;
        step(next, kLoaders);
        float va_next[kVa], vb_next[kVb];
        if (kPipelined && next.valid) load(next, 0, va_next, vb_next);  // in flight across this stage's wait
        const int stage = c.iter % kNumStages;
        ptx::mbar_wait(&empty[stage], ((c.iter / kNumStages) & 1) ^ 1);
        if constexpr (kPipelined) {
          store(stage, 0, va, vb);
        } else if constexpr (kFold) {
          // A: one scale per row over the K block (the fold kernel runs only when A's groups are ≥ 128 wide).
          const int k0 = c.kb * kGemmBlockK;
          const int g = p.a_scale ? min(k0 / p.a_group, p.a_scale_cols - 1) : 0;
#pragma unroll
          for (int j = 0; j < kVa; ++j) {
            const int row = min(c.tile.m_row0 + lane + 32 * j, max(min(c.tile.m_end, p.m) - 1, 0));  // as in load
            va[j] = p.a_scale ? p.a_scale[row * p.a_scale_stride_m + g * p.a_scale_stride_k] : 1.0f;
          }
          // B: the four UE8M0 exponents of each row's K block; fold when every row spreads ≤ 8.
          bool ok = true;
          for (int i = lane; i < BLOCK_N; i += 32) {
            const int b_row = min(tile_b_row<BLOCK_N>(p, c.tile.n_block, i), p.n - 1);
            const uint8_t* e = static_cast<const uint8_t*>(p.b_scale) + c.tile.group * p.b_scale_group_stride +
                               static_cast<int64_t>(b_row / p.b_block_n) * p.b_scale_stride_n;
            // The four exponents in one 32-bit load where they are aligned and in range (else byte by byte).
            const int q0 = k0 / 32;
            uint32_t word = 0;
            if (q0 + 3 < p.b_scale_cols && (reinterpret_cast<uintptr_t>(e + q0) & 3u) == 0) {
              word = *reinterpret_cast<const uint32_t*>(e + q0);
            } else {
#pragma unroll
              for (int q = 0; q < 4; ++q) word |= static_cast<uint32_t>(e[min(q0 + q, p.b_scale_cols - 1)]) << (8 * q);
            }
            int emax = 0, emin = 255;
#pragma unroll
            for (int q = 0; q < 4; ++q) {
              const int v = (word >> (8 * q)) & 0xFF;
              emax = max(emax, v);
              emin = min(emin, v);
            }
            ok = ok && emax - emin <= 8;
            fold_shift[i] = word;
          }
          const bool fold = __all_sync(0xFFFFFFFFu, ok);
#pragma unroll 1
          for (int q = 0; q < (fold ? 1 : 4); ++q) {
            float* sa = stage_scales_a(stage, q);
#pragma unroll
            for (int j = 0; j < kVa; ++j) sa[lane + 32 * j] = va[j];
          }
          for (int i = lane; i < BLOCK_N; i += 32) {
            const uint32_t word = fold_shift[i];  // written by this lane above
            const int e0 = word & 0xFF, e1 = (word >> 8) & 0xFF, e2 = (word >> 16) & 0xFF, e3 = word >> 24;
            if (fold) {
              const int emax = max(max(e0, e1), max(e2, e3));
              stage_scales_b(stage, 0)[i] = fmt::ue8m0_to_float(static_cast<uint8_t>(emax));
              fold_shift[i] = static_cast<uint32_t>(emax - e0) | (static_cast<uint32_t>(emax - e1) << 8) |
                              (static_cast<uint32_t>(emax - e2) << 16) | (static_cast<uint32_t>(emax - e3) << 24);
            } else {
              stage_scales_b(stage, 0)[i] = fmt::ue8m0_to_float(static_cast<uint8_t>(e0));
              stage_scales_b(stage, 1)[i] = fmt::ue8m0_to_float(static_cast<uint8_t>(e1));
              stage_scales_b(stage, 2)[i] = fmt::ue8m0_to_float(static_cast<uint8_t>(e2));
              stage_scales_b(stage, 3)[i] = fmt::ue8m0_to_float(static_cast<uint8_t>(e3));
              fold_shift[i] = 0;
            }
          }
          if (lane == 0) fold_flags[stage] = fold ? 1 : 0;
          __syncwarp();
        } else {
#pragma unroll 1
          for (int sub = 0; sub < kSubs; ++sub) {
            load(c, sub, va, vb);  // every load of the slice before the first store
            store(stage, sub, va, vb);
          }
        }
        if constexpr (kFp4B) {
          // Expand the packed E2M1 tile into E4M3, in the 128-byte-swizzled layout wgmma reads: row r's 16-byte
          // chunk j goes to chunk j ^ (r % 8). Then make the generic-proxy writes visible to wgmma.
          ptx::mbar_wait(&raw_full[stage], (c.iter / kNumStages) & 1);
          const uint8_t* raw = smem_raw_b + stage * Smem::kStageRawB;
          uint8_t* dst = smem_b + stage * Smem::kStageB;
          if (p.fp4_batched_expand) {
            // Two items per lane per round (four spilled in the grouped FP4 kernels): every shared load of the round (packed bytes, shifts, tables) before
            // any store. NOTE: the loop below issues one item's loads after the previous item's store (the compiler
            // cannot tell the store from the next loads apart), so each item waits out two dependent shared-memory
            // latencies; the ncu profile of FP4 decode (303b74c) has the loader warps as the bottleneck.
            constexpr int kBatch = 2;
            static_assert((BLOCK_N * 8) % (32 * kBatch) == 0, "whole rounds of 32 lanes x kBatch items");
#pragma unroll 1
            for (int base = lane; base < BLOCK_N * 8; base += 32 * kBatch) {
              uint2 packed[kBatch], table[kBatch];
              uint32_t shift[kBatch];
#pragma unroll
              for (int u = 0; u < kBatch; ++u) {
                const int item = base + 32 * u, r = item >> 3, j = item & 7;
                packed[u] = *reinterpret_cast<const uint2*>(raw + r * (kGemmBlockK / 2) + j * 8);
                shift[u] = kFold ? fold_shift[r] : 0u;
              }
#pragma unroll
              for (int u = 0; u < kBatch; ++u) {
                const int j = (base + 32 * u) & 7;
                table[u] = kFold ? fold_table[(shift[u] >> (8 * (j >> 1))) & 0xFF] : make_uint2(kE2m1TableLo, kE2m1TableHi);
              }
#pragma unroll
              for (int u = 0; u < kBatch; ++u) {
                const int item = base + 32 * u, r = item >> 3, j = item & 7;
                const uint2 lo = e2m1x8_to_e4m3x8(packed[u].x, table[u].x, table[u].y);
                const uint2 hi = e2m1x8_to_e4m3x8(packed[u].y, table[u].x, table[u].y);
                *reinterpret_cast<uint4*>(dst + r * kGemmBlockK + ((j ^ (r & 7)) << 4)) = make_uint4(lo.x, lo.y, hi.x, hi.y);
              }
            }
          } else {
#pragma unroll 4
            for (int item = lane; item < BLOCK_N * 8; item += 32) {
              const int r = item >> 3, j = item & 7;
              const uint2 packed = *reinterpret_cast<const uint2*>(raw + r * (kGemmBlockK / 2) + j * 8);
              uint2 table = make_uint2(kE2m1TableLo, kE2m1TableHi);
              if constexpr (kFold) table = fold_table[(fold_shift[r] >> (8 * (j >> 1))) & 0xFF];  // 16-byte chunk j: group j/2
              const uint2 lo = e2m1x8_to_e4m3x8(packed.x, table.x, table.y), hi = e2m1x8_to_e4m3x8(packed.y, table.x, table.y);
              *reinterpret_cast<uint4*>(dst + r * kGemmBlockK + ((j ^ (r & 7)) << 4)) = make_uint4(lo.x, lo.y, hi.x, hi.y);
            }
          }
          ptx::fence_proxy_async_shared();
          if constexpr (kFold) __syncwarp();  // every lane has read this stage's shifts before they are rewritten
        }
        ptx::mbar_arrive(&full[stage]);
        if constexpr (kPipelined) {
#pragma unroll
          for (int j = 0; j < kVa; ++j) va[j] = va_next[j];
#pragma unroll
          for (int j = 0; j < kVb; ++j) vb[j] = vb_next[j];
        }
        c = next;
      }
    }
  } else {
    // ---------------- Consumer warpgroups: wgmma, promotion, epilogue.
    ptx::setmaxnreg_inc<kConsumerRegs>();
    const int tid = threadIdx.x % 128;
    const int warp = tid / 32;
    const int row_in_wg = warp * 16 + lane / 4;  // this thread's rows: row_in_wg and row_in_wg + 8
    const int quad = lane % 4;
    const int col_in_chunk = quad * 2;           // and +1, in every 8-column chunk
    const int row_in_tile = warpgroup * 64 + row_in_wg;
#if FINEGEMM_GEMM_TRACE
    const bool tracing = p.trace != nullptr && blockIdx.x == 0 && tid == 0;
    // K-block counters of the issue side (e0..e3, e7) and the promotion side (e4..e6). NOTE: the double-accumulator
    // loop is not stamped: its lambdas grew past inlining and ptxas serialised every wgmma of the 128x128 kernels
    // (C7510); trace 128-wide tiles with FINEGEMM_GEMM_DOUBLE_ACC=0.
    int trace_ii = 0, trace_if = 0;
    // NOTE: macros, not a lambda: a called (not inlined) stamp serialises every wgmma of the kernel (ptxas C7510).
#define FG_TRACE_V(e, v)                                                                   \
  do {                                                                                     \
    const int trace_at_ = (e) <= 3 || (e) == 7 ? trace_ii : trace_if;                      \
    if (tracing && trace_at_ < kGemmTraceIters)                                            \
      p.trace[(warpgroup * kGemmTraceIters + trace_at_) * 8 + (e)] = static_cast<uint32_t>(v); \
  } while (0)
#define FG_TRACE(e) FG_TRACE_V(e, clock())
#define FG_TRACE_NEXT_ISSUE() (++trace_ii)
#define FG_TRACE_NEXT_FINISH() (++trace_if)
#else
#define FG_TRACE(e) ((void)0)
#define FG_TRACE_V(e, v) ((void)0)
#define FG_TRACE_NEXT_ISSUE() ((void)0)
#define FG_TRACE_NEXT_FINISH() ((void)0)
#endif

    float acc[kNumAcc];
    float total[kPromote ? kNumTotal : 1];
    // Double accumulators (p.double_acc, kDoubleAcc kernels): the wgmma of K block kb + 1 runs into the second set
    // while kb's result is promoted, so that a warpgroup always has a wgmma group in flight. Two consumer warpgroups
    // at 224 registers hold the 64-register total and two 64-register accumulators of a 128-wide tile.
    constexpr bool kDoubleAcc = kPromoteK == 128 && kNumConsumers == 2 && kNChunks == 1 && BLOCK_N <= 128 && !kFp4B && !kOneAcc;
    float acc2[kDoubleAcc ? kNumAcc : 1];
    // The ring position: stage and the parity of its current lap (running counters: no division in the loop).
    int stage = 0;
    uint32_t phase = 0;
    auto advance = [&]() {
      if (++stage == kNumStages) {
        stage = 0;
        phase ^= 1u;
      }
    };
    // Shared addresses and descriptor words computed once: in the loop a stage's descriptor is the base word plus a
    // constant multiple of the stage (stop 22's profile of the 192x128 kernel: ~80 of a consumer warp's 179
    // instructions per K block rebuilt the addresses from the generic pointers).
    const uint32_t full_addr = ptx::smem_addr(full);
    const uint32_t desc_a0 = ptx::desc_lo_k_major_sw128(ptx::smem_addr(smem_a) + warpgroup * 64 * kGemmBlockK);
    const uint32_t desc_b0 = ptx::desc_lo_k_major_sw128(ptx::smem_addr(smem_b));
    constexpr uint32_t kDescHi = ptx::kDescHiKMajorSw128;
    // Promotion of one wgmma chunk: total += a · sa · sb, with this thread's A scales (sa0, sa1) and the slice's B
    // scales sb in shared memory. Scale blocks of 8 or more columns are constant over a chunk: one read per chunk.
    auto promote = [&](const float(&a)[kNumAcc], float sa0, float sa1, const float* sb, float sb_uniform, int ch) {
#pragma unroll
      for (int c = 0; c < WGMMA_N / 8; ++c) {
        const int col = ch * WGMMA_N + c * 8;
        const float sbc = b_uniform ? sb_uniform : sb[col + (b_chunk_uniform ? 0 : col_in_chunk)];
        const float sbd = b_uniform ? sb_uniform : (b_chunk_uniform ? sbc : sb[col + col_in_chunk + 1]);
        float* tot = total + ch * kNumAcc + c * 4;
        tot[0] = fmaf(a[c * 4 + 0], sa0 * sbc, tot[0]);
        tot[1] = fmaf(a[c * 4 + 1], sa0 * sbd, tot[1]);
        tot[2] = fmaf(a[c * 4 + 2], sa1 * sbc, tot[2]);
        tot[3] = fmaf(a[c * 4 + 3], sa1 * sbd, tot[3]);
      }
    };
    // One promotion slice (sub of the stage st, wgmma chunk ch) of accumulator set `a`: its scales read from shared
    // memory while the wgmma runs, then the wgmma wait that completes `a` (with `pending`, the one group issued after
    // it may still run), then total += a · scales, by the tile's B scale pattern b_split (promote_split's kSplit, or
    // -1: per chunk from shared memory).
    // NOTE: not a generic lambda (the wait passed as a callable): that crashed cicc (CUDA 13.0).
    // release_early: with the B scales in registers (b_split kSplitNone, 8 or 16) the stage is released right after
    // the wait (GemmParams::early_release); returns whether it was.
    auto promote_slice = [&](float(&a)[kNumAcc], int st, int sub, int ch, int b_split, bool pending,
                             bool release_early = false) {
      const float* sa = stage_scales_a(st, sub);
      const float* sb = stage_scales_b(st, sub);
      const float sa0 = sa[row_in_tile], sa1 = sa[row_in_tile + 8];
      const float s_lo = sb[0];
      const float s_hi = b_split == 8 ? sb[64] : (b_split == 16 ? sb[128] : s_lo);
      const float lo0 = sa0 * s_lo, lo1 = sa1 * s_lo, hi0 = sa0 * s_hi, hi1 = sa1 * s_hi;
      if (pending) ptx::wgmma_wait<1>();
      else ptx::wgmma_wait<0>();
      ptx::fence_operands(a);
      // E4M3 B with 128-wide promotion only (the FP4 kernels keep their register allocation).
      const bool released = kPromoteK == 128 && !kFp4B && release_early &&
                            (b_split == kSplitNone || b_split == 8 || b_split == 16);
      if (released) {
        // The scales must have arrived in registers before the stage goes back (the asm takes them as inputs).
        asm volatile("" ::"f"(lo0), "f"(lo1), "f"(hi0), "f"(hi1));
        release(st);
      }
      if (b_split == kSplitNone) {
        promote_split<kSplitNone, WGMMA_N>(total, a, lo0, lo1, lo0, lo1, ch);
      } else if (b_split == 8) {
        promote_split<8, WGMMA_N>(total, a, lo0, lo1, hi0, hi1, ch);
      } else if (b_split == 16) {
        promote_split<16, WGMMA_N>(total, a, lo0, lo1, hi0, hi1, ch);
      } else {
        promote(a, sa0, sa1, sb, s_lo, ch);
      }
      return released;
    };
    // Pingpong (p.pingpong, two consumer warpgroups): the warpgroups issue their wgmma groups in turn (named
    // barriers 1 and 2), so that one promotes while the other's wgmma runs. Without it both wait on the same stage,
    // issue together, finish together and promote together, leaving the tensor cores idle meanwhile.
    // Three consumer warpgroups (192-row tiles) take the same ring with p.rotate_issue: warpgroup w > 0 waits on
    // barrier w for warpgroup w - 1's issue, warpgroup 0 on barrier 3 for warpgroup 2's previous one.
    // NOTE: not for 256-wide tiles: its two registers made the 128x256 gate_up kernel (128 + 64 accumulators)
    // spill 32 bytes.
    const bool double_acc = kDoubleAcc && p.double_acc;
    const bool ordered = (kNumConsumers == 2 && BLOCK_N <= 192 && p.pingpong && !double_acc) ||
                         (kNumConsumers == 3 && kPromote && p.rotate_issue);
    bool issued_before = false;  // warpgroup 0: a group of the last warpgroup is pending on barrier kNumConsumers
    auto order_before_issue = [&]() {
      if (!ordered) return;
      if (warpgroup == 1) ptx::named_bar_sync<1, 256>();
      else if (kNumConsumers == 3 && warpgroup == 2) ptx::named_bar_sync<2, 256>();
      else if (warpgroup == 0 && issued_before) ptx::named_bar_sync<kNumConsumers == 3 ? 3 : 2, 256>();
    };
    auto order_after_issue = [&]() {
      if (!ordered) return;
      if (warpgroup == 0) ptx::named_bar_arrive<1, 256>();
      else if (warpgroup == 1) ptx::named_bar_arrive<2, 256>();
      else ptx::named_bar_arrive<3, 256>();
      issued_before = true;
    };

    for (int t = tile_begin; t < num_tiles; t += tile_step) {
      const TileInfo tile = uniform_tile(tile_at(t));
      const int row0 = tile.m_row0 + row_in_tile;
      const int row1 = row0 + 8;
      // A warpgroup whose 64 rows all lie past the tile's end (an expert's last rows, M's last tile) only waits for
      // and releases the tile's stages: no wgmma, promotion or epilogue, so that the tensor cores run the other
      // warpgroups' groups alone. Not with pingpong ordering (its barriers pair the warpgroups' issues).
      // NOTE: a separate loop without wgmma; predicating the wgmma inside the mainloop made the 128x256 gate_up
      // kernel spill 4956 bytes.
      if (kNumConsumers > 1 && !ordered && p.skip_idle && tile.m_row0 + warpgroup * 64 >= tile.m_end) {
        for (int kb = tile.kb_begin; kb < tile.kb_end; ++kb, advance()) {
          ptx::mbar_wait_shared(full_addr + stage * 8, phase);
          release(stage);
        }
        continue;
      }
      // Rows past M read a valid row's scale; their results are never stored.
      const int scale_row0 = min(row0, p.m - 1), scale_row1 = min(row1, p.m - 1);
      // The B scales' pattern over the tile's 8-column chunks (block-scaled B: the scale changes at most once):
      // kSplitNone (one value), 8 or 16 (the chunk where it changes), or -1 (per chunk, read from shared memory).
      int b_split = -1;
      // NOTE: 128-wide promotion of E4M3 B only: with four 32-wide slices the extra paths made 128x192 spill.
      if constexpr (kPromoteK == 128 && !kFp4B) {
        if (!p.b_scale || b_uniform) {
          b_split = kSplitNone;
        } else if (b_chunk_uniform) {
          auto block_of = [&](int i) { return min(tile_b_row<BLOCK_N>(p, tile.n_block, i), p.n - 1) / p.b_block_n; };
          const int first = block_of(0);
          int change = kSplitNone, last = first;
          bool two_runs = true;
          for (int c = 1; c < BLOCK_N / 8; ++c) {
            const int b = block_of(c * 8);
            if (b == last) continue;
            two_runs = two_runs && change == kSplitNone;
            change = change == kSplitNone ? c : change;
            last = b;
          }
          if (two_runs && (change == kSplitNone || change == 8 || change == 16)) b_split = change;
        }
      }
      // Epilogue row scales, loaded early: their latency hides behind the mainloop.
      const float* row_scale = p.row_scale + (p.row_mode == VecMode::Scalar ? tile.group * p.row_scale_group_stride : 0);
      const float rs0 = load_vec(p.row_mode, row_scale, scale_row0);
      const float rs1 = load_vec(p.row_mode, row_scale, scale_row1);

      // The promoted K loop, over the tile's K blocks. split_tag: the B scale pattern b_split as a compile-time
      // constant (kSplitNone: one B scale per tile), or kSplitRuntime for the value computed above. With
      // GemmParams::hoist_split a one-scale tile takes the constant loop, so that no K block tests b_split (stop 26:
      // three dependent branches per K block chose the promotion variant).
      auto promoted_k_loop = [&](auto split_tag) {
        constexpr int kTagSplit = decltype(split_tag)::value;
        const int split = kTagSplit == kSplitRuntime ? b_split : kTagSplit;
#pragma unroll
        for (int i = 0; i < kNumTotal; ++i) total[i] = 0.0f;
        if constexpr (kDoubleAcc) {
          if (double_acc) {
            // The four k32 steps of the stage's K block into accumulator set `a`, as one committed group.
            auto issue = [&](float(&a)[kNumAcc], int st) {
              const uint32_t desc_a = desc_a0 + st * (Smem::kStageA >> 4);
              const uint32_t desc_b = desc_b0 + st * (Smem::kStageB >> 4);
              ptx::fence_operands(a);
              ptx::wgmma_fence();
#pragma unroll
              for (int s = 0; s < kGemmBlockK / 32; ++s)
                Mma::mma(ptx::desc_from_words(desc_a + (s * 32 >> 4), kDescHi),
                         ptx::desc_from_words(desc_b + (s * 32 >> 4), kDescHi), a, s > 0);
              ptx::wgmma_commit();
            };
            // Promote set `a` (the K block of stage st) once its group is complete: with `pending`, the one group
            // issued after it may still run. Then release the stage.
            auto finish = [&](float(&a)[kNumAcc], int st, bool pending) {
              if (promote_slice(a, st, 0, 0, split, pending, p.early_release)) return;
              release(st);
            };
            // K blocks in runs of eight (p.double_acc_run == 8) and four, alternating the sets: every block's wgmma
            // but the run's last is issued before the previous block is promoted. Then single blocks, promoted after
            // their own wgmma.
            // NOTE: no wgmma group may stay pending across a loop's back edge, nor behind a branch: ptxas (CUDA 13.0)
            // then serializes every wgmma of the kernel (C7514: a running set stayed pending into the next
            // iteration, or its issue was conditional).
            int kb = tile.kb_begin;
            auto wait_issue = [&](float(&a)[kNumAcc]) {
              ptx::mbar_wait_shared(full_addr + stage * 8, phase);
              const int st = stage;
              issue(a, st);
              advance();
              return st;
            };
            // Runs of R K blocks (R even, the inner loop fully unrolled: straight-line code for ptxas).
            auto runs = [&](auto r) {
              constexpr int R = decltype(r)::value;
              for (; kb + R - 1 < tile.kb_end; kb += R) {
                int s_even = wait_issue(acc), s_odd = 0;
#pragma unroll
                for (int j = 0; j < R / 2 - 1; ++j) {
                  s_odd = wait_issue(acc2);
                  finish(acc, s_even, true);
                  s_even = wait_issue(acc);
                  finish(acc2, s_odd, true);
                }
                s_odd = wait_issue(acc2);
                finish(acc, s_even, true);
                finish(acc2, s_odd, false);
              }
            };
            if (p.double_acc_run == 8) runs(std::integral_constant<int, 8>{});
            runs(std::integral_constant<int, 4>{});
            for (; kb < tile.kb_end; ++kb) finish(acc, wait_issue(acc), false);
          }
        }
        bool looked_ahead = false;
        // NOTE: not in the kernels with two accumulator sets (128x128, 128x64): with both loops their promotion was
        // called, not inlined, and ptxas serialised every wgmma of the kernel (C7510). Not in 128x192 either: with it
        // that kernel (96 + 96 accumulators) spilled 120 bytes; 192x128 spills 88-104 bytes with it (0 without) and
        // still measured 2-4% faster (stop 34). Not in the grouped (MoE) kernels: they spill as much with it, and their
        // speed with it is not measured yet (Scheduler::kSmemBytes: the grouped scheduler's tables).
        if constexpr (kSubs == 1 && kNChunks == 1 && !kFold && kPromoteK == 128 && !kFp4B && !kDoubleAcc && BLOCK_N <= 128 &&
                      Scheduler::kSmemBytes == 0) {
          if (!double_acc && (p.lookahead > 0 || (p.lookahead < 0 && (kNumConsumers == 3 || kOneAcc)))) {
            // Lookahead (GemmParams::lookahead): wait for K block kb's stage while kb-1's wgmma group still runs, then
            // wait for that group, promote it and issue kb (cuBLASLt's order): the stage wait leaves the warpgroup's
            // chain between two of its groups. With defer_release the stage of kb-1 goes back after kb's issue.
            // NOTE: in straight-line runs of four K blocks, the last group of a run completed before the back edge
            // (a group pending across a loop's back edge made ptxas serialise every wgmma of the kernel: C7514).
            looked_ahead = true;
            int kb = tile.kb_begin;
            auto runs = [&](auto r) {
              constexpr int R = decltype(r)::value;
              for (; kb + R - 1 < tile.kb_end; kb += R) {
                int prev = 0;
#pragma unroll
                for (int j = 0; j < R; ++j) {
                  ptx::mbar_wait_shared(full_addr + stage * 8, phase);
                  bool prev_released = false;
                  if (j > 0) {
                    prev_released = promote_slice(acc, prev, 0, 0, split, false, p.early_release);
                    if (!prev_released && !p.defer_release) release(prev);
                  }
                  const uint32_t desc_a = desc_a0 + stage * (Smem::kStageA >> 4);
                  const uint32_t desc_b = desc_b0 + stage * (Smem::kStageB >> 4);
                  order_before_issue();
                  ptx::fence_operands(acc);
                  ptx::wgmma_fence();
#pragma unroll
                  for (int s = 0; s < kGemmBlockK / 32; ++s)
                    Mma::mma(ptx::desc_from_words(desc_a + (s * 32 >> 4), kDescHi),
                             ptx::desc_from_words(desc_b + (s * 32 >> 4), kDescHi), acc, s > 0);
                  ptx::wgmma_commit();
                  order_after_issue();
                  if (j > 0 && !prev_released && p.defer_release) release(prev);
                  prev = stage;
                  advance();
                }
                if (!promote_slice(acc, prev, 0, 0, split, false, p.early_release)) release(prev);
              }
            };
            runs(std::integral_constant<int, 4>{});
            runs(std::integral_constant<int, 1>{});
          }
        }
        if (!double_acc && !looked_ahead) {
          for (int kb = tile.kb_begin; kb < tile.kb_end; ++kb, advance()) {
            FG_TRACE(0);
            FG_TRACE_V(7, kb == tile.kb_begin ? static_cast<uint32_t>(t) : ~0u);
            // Wait for the stage's TMA loads and scales.
            ptx::mbar_wait_shared(full_addr + stage * 8, phase);
            FG_TRACE(1);
            const uint32_t desc_a = desc_a0 + stage * (Smem::kStageA >> 4);
            const uint32_t desc_b = desc_b0 + stage * (Smem::kStageB >> 4);
            bool released = false;
            // kSlices promotion slices of this K block, each of 4 / kSlices wgmma k32 steps.
            auto mma_promote = [&](auto slices) {
              constexpr int kSlices = decltype(slices)::value;
              constexpr int kSteps = kGemmBlockK / 32 / kSlices;
#pragma unroll
              for (int sub = 0; sub < kSlices; ++sub) {
#pragma unroll
                for (int ch = 0; ch < kNChunks; ++ch) {
                  order_before_issue();
                  FG_TRACE(2);
                  ptx::fence_operands(acc);
                  ptx::wgmma_fence();
#pragma unroll
                  for (int s = 0; s < kSteps; ++s) {
                    const uint32_t chunk = static_cast<uint32_t>((ch * WGMMA_N * kGemmBlockK) >> 4);
                    const uint32_t k_off = static_cast<uint32_t>((sub * kSteps * 32 + s * 32) >> 4);
                    Mma::mma(ptx::desc_from_words(desc_a + k_off, kDescHi),
                             ptx::desc_from_words(desc_b + chunk + k_off, kDescHi), acc, s > 0);
                  }
                  ptx::wgmma_commit();
                  order_after_issue();
                  FG_TRACE(3);
                  // Early release only where this group is the stage's last (one slice, one chunk).
#if FINEGEMM_GEMM_TRACE
                  // The trace's e4 (the group complete), at the cost of the scale loads' latency after it.
                  // NOTE: not inside promote_slice: the bigger lambda was called, not inlined, which serialised every
                  // wgmma of the kernel (ptxas C7510).
                  ptx::wgmma_wait<0>();
                  FG_TRACE(4);
#endif
                  released = promote_slice(acc, stage, sub, ch, split, false,
                                           kSlices == 1 && kNChunks == 1 && p.early_release);
                  FG_TRACE(5);
                }
              }
            };
            if constexpr (kFold) {
              if (fold_flags[stage]) mma_promote(std::integral_constant<int, 1>{});
              else mma_promote(std::integral_constant<int, 4>{});
            } else {
              mma_promote(std::integral_constant<int, kSubs>{});
            }
            // Release the stage to the producer (unless the promotion did already).
            if (!released) {
              release(stage);
            }
            FG_TRACE(6);
            FG_TRACE_NEXT_ISSUE();
            FG_TRACE_NEXT_FINISH();
          }
        }
      };
      if constexpr (kPromote) {
        if constexpr (kPromoteK == 128 && !kFp4B) {
          // 192-wide tiles with 128-column B blocks always hold two B scales, changing at chunk 16 (even column
          // blocks) or 8 (odd ones): those get their own loops too. Only there: each loop is ~2K instructions.
          if (p.hoist_split && b_split == kSplitNone) {
            promoted_k_loop(std::integral_constant<int, kSplitNone>{});
          } else if constexpr (BLOCK_N == 192) {
            if (p.hoist_split && b_split == 16) promoted_k_loop(std::integral_constant<int, 16>{});
            else if (p.hoist_split && b_split == 8) promoted_k_loop(std::integral_constant<int, 8>{});
            else promoted_k_loop(std::integral_constant<int, kSplitRuntime>{});
          } else {
            promoted_k_loop(std::integral_constant<int, kSplitRuntime>{});
          }
        } else {
          promoted_k_loop(std::integral_constant<int, kSplitRuntime>{});
        }
      } else if constexpr (!kPromote) {
        // No promotion: the wgmma of K-block kb runs while the stage of kb-1 is released.
        int prev_stage = -1;
#pragma unroll
        for (int i = 0; i < kNumAcc; ++i) acc[i] = 0.0f;
        for (int kb = tile.kb_begin; kb < tile.kb_end; ++kb, advance()) {
          ptx::mbar_wait_shared(full_addr + stage * 8, phase);
          const uint32_t desc_a = desc_a0 + stage * (Smem::kStageA >> 4);
          const uint32_t desc_b = desc_b0 + stage * (Smem::kStageB >> 4);
          ptx::fence_operands(acc);
          ptx::wgmma_fence();
#pragma unroll
          for (int s = 0; s < kGemmBlockK / 32; ++s)
            Mma::mma(ptx::desc_from_words(desc_a + (s * 32 >> 4), kDescHi), ptx::desc_from_words(desc_b + (s * 32 >> 4), kDescHi),
                     acc, true);
          ptx::wgmma_commit();
          ptx::wgmma_wait<1>();
          ptx::fence_operands(acc);
          if (prev_stage >= 0) {
            release(prev_stage);
          }
          prev_stage = stage;
        }
        ptx::wgmma_wait<0>();
        ptx::fence_operands(acc);
        if (prev_stage >= 0) {
          release(prev_stage);
        }
      }

      // Epilogue. NOTE: a lambda over a reference to the register array keeps it in registers (a pointer would
      // spill it).
      const float* col_scale = p.col_scale ? p.col_scale + tile.group * p.col_group_stride : nullptr;
      const int64_t bias_base = tile.group * p.bias_group_stride;
      // Column i of the tile before the activation: scales and bias applied.
      auto finish = [&](float v, float rs, int i) {
        // Columns past the group's rows (a partial last tile) are computed and dropped: clamp their reads.
        const int b_row = min(tile_b_row<BLOCK_N>(p, tile.n_block, i), p.n - 1);
        return v * rs * load_vec(p.col_mode, col_scale, b_row) + load_bias(p, bias_base + b_row);
      };
      auto epilogue = [&](float(&result)[kNumTotal]) {
        // A grouped tile's warpgroup whose 64 rows run into the next group's (an expert's last tile) takes the lean
        // store below: TMA clips rows at M only. Dense tiles end at M (m_end == M).
        if constexpr (kTmaStore) {
          if (tile.m_end == p.m || tile.m_row0 + warpgroup * 64 + 64 <= tile.m_end) {
            // Through shared memory: the warpgroup's 64 x BLOCK_N outputs as 64 x 64 boxes (128-byte rows,
            // 16-byte chunk c of row r at c ^ (r % 8)), written by stmatrix in the accumulator layout, then stored by
            // one thread. The same values as the lean store: (v · rs + 0) · w, rounded to the output type.
            const int wtid = threadIdx.x % 128;
            uint8_t* out_tile = smem_out + warpgroup * kOutTileBytes;
            // The previous tile's stores have read this buffer (issued a whole K loop ago).
            // Barrier 8 + warpgroup over the warpgroup's 128 threads (ids 1-3 order the wgmma issue).
            auto wg_bar = [&]() {
              if (warpgroup == 0) ptx::named_bar_sync<8, 128>();
              else if (warpgroup == 1) ptx::named_bar_sync<9, 128>();
              else ptx::named_bar_sync<10, 128>();
            };
            if (wtid == 0) ptx::bulk_wait_group_read<0>();
            wg_bar();
            const float w0 = (p.row_weight && row0 < tile.m_end) ? p.row_weight[row0] : 1.0f;
            const float w1 = (p.row_weight && row1 < tile.m_end) ? p.row_weight[row1] : 1.0f;
            const int mat = lane >> 3, mat_row = (wtid >> 5) * 16 + ((mat & 1) << 3) + (lane & 7);
            const uint32_t row_addr = ptx::smem_addr(out_tile) + static_cast<uint32_t>(mat_row * 128);
            auto store_tile = [&](auto tag) {
              using T = decltype(tag);
#pragma unroll
              for (int c = 0; c < BLOCK_N / 8; c += 2) {
                uint32_t r[4];
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                  const float* v = result + (c + h) * 4;
                  r[2 * h] = pack_pair<T>(__fmul_rn(__fadd_rn(__fmul_rn(v[0], rs0), 0.0f), w0),
                                          __fmul_rn(__fadd_rn(__fmul_rn(v[1], rs0), 0.0f), w0));
                  r[2 * h + 1] = pack_pair<T>(__fmul_rn(__fadd_rn(__fmul_rn(v[2], rs1), 0.0f), w1),
                                              __fmul_rn(__fadd_rn(__fmul_rn(v[3], rs1), 0.0f), w1));
                }
                const int chunk = c + (mat >> 1);  // box chunk / 8, chunk % 8 inside it
                const uint32_t addr = row_addr + static_cast<uint32_t>((chunk >> 3) * (64 * 128)) +
                                      static_cast<uint32_t>((((chunk & 7) ^ (mat_row & 7)) << 4));
                ptx::stmatrix_x4(addr, r[0], r[1], r[2], r[3]);
              }
            };
            if (p.out_dtype == OutDType::F16) store_tile(__half{});
            else store_tile(__nv_bfloat16{});
            ptx::fence_proxy_async_shared();
            wg_bar();
            if (wtid == 0) {
              const int col_bytes = tile.n_block * BLOCK_N * 2, row = tile.m_row0 + warpgroup * 64;
#pragma unroll
              for (int box = 0; box < BLOCK_N / 64; ++box)
                ptx::tma_store_2d(&tma_out, out_tile + box * (64 * 128), col_bytes + box * 128, row);
              ptx::bulk_commit_group();
            }
            return;
          }
        }
        if constexpr (kEpilogue == Epilogue::Store) {
          if (p.workspace) {
            // Split-K partial: promotion applied, epilogue scales left to the reduction.
            float* part = p.workspace + static_cast<int64_t>(tile.split) * p.m * p.n;
#pragma unroll
            for (int c = 0; c < BLOCK_N / 8; ++c) {
              const int col = tile.n_block * BLOCK_N + c * 8 + col_in_chunk;
              if (col >= p.n) continue;
              if (row0 < tile.m_end)
                *reinterpret_cast<float2*>(part + static_cast<int64_t>(row0) * p.n + col) = make_float2(result[c * 4], result[c * 4 + 1]);
              if (row1 < tile.m_end)
                *reinterpret_cast<float2*>(part + static_cast<int64_t>(row1) * p.n + col) = make_float2(result[c * 4 + 2], result[c * 4 + 3]);
            }
            return;
          }
          const float w0 = (p.row_weight && row0 < tile.m_end) ? p.row_weight[row0] : 1.0f;
          const float w1 = (p.row_weight && row1 < tile.m_end) ? p.row_weight[row1] : 1.0f;
          // p.lean_epilogue (on unless FINEGEMM_GEMM_LEAN_EPILOGUE=0): no column scale and no bias (the block and
          // group recipes, and the MoE down GEMM with its routing weights) take a loop per output dtype without the
          // per-element mode, dtype and bias switches. Same arithmetic as the general loop below: (v · rs + 0) · w,
          // the column scale being 1 and w 1 without row weights.
          // NOTE: measured on the H200 at M = 4096 (192x128, BF16 out): K = 512 291 -> 448 TFLOP/s, K = 1536
          // 613 -> 806, K = 2048 622 -> 747, K = 16384 957 -> 977 (bench/results/epilogue_2026-12-01_303b74c.json).
          // NOTE: not for 256-wide tiles, where it made the dense 128x256 kernels spill (the heuristic never picks
          // them; FINEGEMM_GEMM_CONFIG and 2-CTA clusters do).
          if (BLOCK_N <= 192 && p.lean_epilogue && p.col_mode == VecMode::None && p.bias_dtype < 0) {
            const int col_base = tile.n_block * BLOCK_N + col_in_chunk;
            const int cols_left = p.n - col_base;  // chunk offsets below this are in range (N is even)
            const int64_t off0 = static_cast<int64_t>(row0) * p.ldo + col_base;
            const int64_t off1 = static_cast<int64_t>(row1) * p.ldo + col_base;
            const bool in0 = row0 < tile.m_end, in1 = row1 < tile.m_end;
            auto lean_store = [&](auto* out) {
              using T = std::remove_pointer_t<decltype(out)>;
              if (p.wide_stores) {
                // Per group of four chunks and per row, the quad's 4 x 4 words (word j of lane t: columns 2t, 2t + 1
                // of chunk j) transposed (quad_transpose), so that lane t holds chunk t's eight columns: one 16-byte
                // store (two for F32) per group and row. Same values as below.
                const int tile_col0 = tile.n_block * BLOCK_N;
#pragma unroll
                for (int g = 0; g < BLOCK_N / 32; ++g) {
                  const int col = tile_col0 + (4 * g + quad) * 8;
#pragma unroll
                  for (int r = 0; r < 2; ++r) {
                    const float rs = r ? rs1 : rs0, w = r ? w1 : w0;
                    float v[8];
#pragma unroll
                    for (int j = 0; j < 4; ++j) {
                      v[2 * j] = __fmul_rn(__fadd_rn(__fmul_rn(result[(4 * g + j) * 4 + 2 * r], rs), 0.0f), w);
                      v[2 * j + 1] = __fmul_rn(__fadd_rn(__fmul_rn(result[(4 * g + j) * 4 + 2 * r + 1], rs), 0.0f), w);
                    }
                    const bool in = (r ? in1 : in0) && col < p.n;  // N % 8 == 0: the whole chunk is in range
                    T* dst = out + (r ? off1 : off0) - col_in_chunk + (4 * g + quad) * 8;  // row r, column col
                    if constexpr (std::is_same_v<T, float>) {
                      uint2 words[4];
#pragma unroll
                      for (int j = 0; j < 4; ++j) words[j] = make_uint2(__float_as_uint(v[2 * j]), __float_as_uint(v[2 * j + 1]));
                      quad_transpose(words, lane);
                      if (in) {
                        reinterpret_cast<uint4*>(dst)[0] = make_uint4(words[0].x, words[0].y, words[1].x, words[1].y);
                        reinterpret_cast<uint4*>(dst)[1] = make_uint4(words[2].x, words[2].y, words[3].x, words[3].y);
                      }
                    } else {
                      uint32_t words[4];
#pragma unroll
                      for (int j = 0; j < 4; ++j) words[j] = pack_pair<T>(v[2 * j], v[2 * j + 1]);
                      quad_transpose(words, lane);
                      if (in) *reinterpret_cast<uint4*>(dst) = make_uint4(words[0], words[1], words[2], words[3]);
                    }
                  }
                }
                return;
              }
#pragma unroll
              for (int c = 0; c < BLOCK_N / 8; ++c) {
                if (c * 8 >= cols_left) continue;
                const float v0 = __fmul_rn(__fadd_rn(__fmul_rn(result[c * 4], rs0), 0.0f), w0);
                const float v1 = __fmul_rn(__fadd_rn(__fmul_rn(result[c * 4 + 1], rs0), 0.0f), w0);
                const float v2 = __fmul_rn(__fadd_rn(__fmul_rn(result[c * 4 + 2], rs1), 0.0f), w1);
                const float v3 = __fmul_rn(__fadd_rn(__fmul_rn(result[c * 4 + 3], rs1), 0.0f), w1);
                if (in0) store_out_pair(out + off0 + c * 8, v0, v1);
                if (in1) store_out_pair(out + off1 + c * 8, v2, v3);
              }
            };
            if (p.out_dtype == OutDType::BF16) lean_store(static_cast<__nv_bfloat16*>(p.out));
            else if (p.out_dtype == OutDType::F16) lean_store(static_cast<__half*>(p.out));
            else lean_store(static_cast<float*>(p.out));
            return;
          }
#pragma unroll
          for (int c = 0; c < BLOCK_N / 8; ++c) {
            const int i = c * 8 + col_in_chunk;
            const int col = tile.n_block * BLOCK_N + i;
            if (col >= p.n) continue;  // N is even, so col + 1 < N too
            if (row0 < tile.m_end)
              store_pair(p, row0, col, finish(result[c * 4], rs0, i) * w0, finish(result[c * 4 + 1], rs0, i + 1) * w0);
            if (row1 < tile.m_end)
              store_pair(p, row1, col, finish(result[c * 4 + 2], rs1, i) * w1, finish(result[c * 4 + 3], rs1, i + 1) * w1);
          }
        } else {
          // ---- Fused activation: h = act(gate, up) in place, then E4M3 with per-(row, group) scales.
          constexpr int kHalfChunks = BLOCK_N / 16;
          const bool halves = p.b_layout == BLayout::GateUpHalves;
          const bool interleaved = p.b_layout == BLayout::Interleaved;
          // Intermediate columns of this tile, and the first one.
          const int tile_cols = (halves || interleaved) ? BLOCK_N / 2 : BLOCK_N;
          const int col0 = tile.n_block * tile_cols;
          if (halves) {
#pragma unroll
            for (int c = 0; c < kHalfChunks; ++c)
#pragma unroll
              for (int r = 0; r < 2; ++r)
#pragma unroll
                for (int j = 0; j < 2; ++j) {
                  const int i = c * 8 + col_in_chunk + j;
                  const float rs = r ? rs1 : rs0;
                  const float gate = finish(result[c * 4 + r * 2 + j], rs, i);
                  const float up = finish(result[(c + kHalfChunks) * 4 + r * 2 + j], rs, i + BLOCK_N / 2);
                  result[c * 4 + r * 2 + j] = gated_act(p, gate, up);
                }
          } else if (interleaved) {
#pragma unroll
            for (int c = 0; c < BLOCK_N / 8; ++c)
#pragma unroll
              for (int r = 0; r < 2; ++r) {
                const int i = c * 8 + col_in_chunk;
                const float rs = r ? rs1 : rs0;
                result[c * 4 + r * 2] = gated_act(p, finish(result[c * 4 + r * 2], rs, i), finish(result[c * 4 + r * 2 + 1], rs, i + 1));
              }
          } else {
#pragma unroll
            for (int c = 0; c < BLOCK_N / 8; ++c)
#pragma unroll
              for (int r = 0; r < 2; ++r)
#pragma unroll
                for (int j = 0; j < 2; ++j)
                  result[c * 4 + r * 2 + j] = plain_act(p, finish(result[c * 4 + r * 2 + j], r ? rs1 : rs0, c * 8 + col_in_chunk + j));
          }
          // Chunk c's first intermediate column within the tile: 4c when interleaved (one pair per lane), else 8c.
          const int chunk_cols = interleaved ? 4 : 8;
          const int num_chunks = halves ? kHalfChunks : BLOCK_N / 8;
          const int group = p.requant_group > 0 ? p.requant_group : tile_cols;
          const float static_scale = p.requant_group > 0 ? 0.0f : p.requant_static[tile.group];
          for (int gi = 0; gi < tile_cols / group; ++gi) {
            float amax0 = 0.0f, amax1 = 0.0f;
#pragma unroll
            for (int c = 0; c < BLOCK_N / 8; ++c) {
              if (c >= num_chunks || (c * chunk_cols) / group != gi) continue;
              amax0 = fmaxf(amax0, fabsf(result[c * 4 + 0]));
              amax1 = fmaxf(amax1, fabsf(result[c * 4 + 2]));
              if (!interleaved) {
                amax0 = fmaxf(amax0, fabsf(result[c * 4 + 1]));
                amax1 = fmaxf(amax1, fabsf(result[c * 4 + 3]));
              }
            }
            // The four lanes of a quad hold one row's columns.
            amax0 = fmaxf(amax0, __shfl_xor_sync(0xFFFFFFFFu, amax0, 1));
            amax0 = fmaxf(amax0, __shfl_xor_sync(0xFFFFFFFFu, amax0, 2));
            amax1 = fmaxf(amax1, __shfl_xor_sync(0xFFFFFFFFu, amax1, 1));
            amax1 = fmaxf(amax1, __shfl_xor_sync(0xFFFFFFFFu, amax1, 2));
            float s0 = static_scale, s1 = static_scale;
            if (p.requant_group > 0) {
              s0 = fmaxf(amax0, kMinAmax) / kE4M3MaxF;
              s1 = fmaxf(amax1, kMinAmax) / kE4M3MaxF;
              if (p.requant_pow2) {
                s0 = pow2_ceil_device(s0);
                s1 = pow2_ceil_device(s1);
              }
            }
#pragma unroll
            for (int c = 0; c < BLOCK_N / 8; ++c) {
              if (c >= num_chunks || (c * chunk_cols) / group != gi) continue;
#pragma unroll
              for (int r = 0; r < 2; ++r) {
                const int row = r ? row1 : row0;
                // Rows of other experts, and intermediate columns past I (a partial last tile), are not written.
                if (row >= tile.m_end || col0 + c * chunk_cols >= p.out_cols) continue;
                const float s = r ? s1 : s0;
                uint8_t* dst = p.out_q + static_cast<int64_t>(row) * p.ld_q + col0;
                if (interleaved) {
                  dst[c * 4 + quad] = __nv_cvt_float_to_fp8(result[c * 4 + r * 2] / s, __NV_SATFINITE, __NV_E4M3);
                } else {
                  const uint16_t lo = __nv_cvt_float_to_fp8(result[c * 4 + r * 2] / s, __NV_SATFINITE, __NV_E4M3);
                  const uint16_t hi = __nv_cvt_float_to_fp8(result[c * 4 + r * 2 + 1] / s, __NV_SATFINITE, __NV_E4M3);
                  *reinterpret_cast<uint16_t*>(dst + c * 8 + col_in_chunk) = static_cast<uint16_t>(lo | (hi << 8));
                }
              }
            }
            if (p.requant_group > 0 && quad == 0 && col0 + gi * group < p.out_cols) {
              const int scale_col = (col0 + gi * group) / group;
              if (row0 < tile.m_end) p.out_q_scale[static_cast<int64_t>(row0) * p.ld_q_scale + scale_col] = s0;
              if (row1 < tile.m_end) p.out_q_scale[static_cast<int64_t>(row1) * p.ld_q_scale + scale_col] = s1;
            }
          }
        }
      };
      if constexpr (kPromote) {
        epilogue(total);
      } else {
        epilogue(acc);
      }
    }
    // Warpgroup 0 takes the last warpgroup's last arrival, so that no barrier is left half passed.
    if (ordered && warpgroup == 0 && issued_before) ptx::named_bar_sync<kNumConsumers == 3 ? 3 : 2, 256>();
    // The last tile's stores have completed before the CTA (and its shared memory) goes.
    if constexpr (kTmaStore) {
      if (threadIdx.x % 128 == 0) ptx::bulk_wait_group<0>();
    }
  }
  // No CTA leaves while its peer may still multicast into it or arrive on its barriers.
  if constexpr (kCluster > 1) {
    __syncwarp();
    ptx::cluster_sync();
  }
#else
  if (threadIdx.x == 0) printf("finegemm: sm90_fp8_gemm_kernel needs an sm_90a GPU\n");
  __trap();
#endif
}
#undef FG_TRACE
#undef FG_TRACE_V
#undef FG_TRACE_NEXT_ISSUE
#undef FG_TRACE_NEXT_FINISH

}  // namespace finegemm::cuda
