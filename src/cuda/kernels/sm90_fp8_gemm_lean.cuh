// A lean dense FP8 GEMM for the block-128 weight recipes (written at stop 35, first run and made the default at stop 36;
// FINEGEMM_GEMM_LEAN picks or turns it off): 128x128, 192x128 or 256x128 tiles, two or three consumer warpgroups and one TMA thread, E4M3 A
// with 1x128 scales copied M-major in bulk (kAScale) or with no K-granular scale (static per-tensor or per-token
// activations: their scale is the epilogue's row scale), E4M3 B with 128x128 block scales (any scale format
// load_b_scale reads), K a multiple of 128, 16-bit output through shared memory and TMA stores, no bias, column scale
// or split-K.
//
// Why it exists: the general kernel (sm90_fp8_gemm.cuh) keeps its ring position in registers across tiles, so each K
// block rebuilds its stage's barrier and descriptor addresses; stop 35 counted ~135 executed instructions per K block
// and consumer warp in its hottest loop, 64 of them the promotion's FMAs. Here every tile starts at stage 0 and the
// K loop runs in laps of kStages K blocks (4 or 5 at 128 rows, 4 at 192, 3 at 256) with the stage index a compile-time constant inside a lap (the last lap
// of a tile pads its unused stages: the TMA thread arrives on their full barriers without data and the consumers pass
// them), so stage addresses, barrier addresses and descriptor words fold into constants. The arithmetic is the
// general kernel's in the same order (four k32 wgmma steps per K block from zero, total = fma(acc, a_scale · b_scale,
// total), the TMA-store epilogue's rounding), so its results are the same bits (test LeanKernelSameBits).
//
// kFp4B (FINEGEMM_FP4_LEAN, stop 38, off until measured; written without a GPU): FP4 weights (packed E2M1, MX 1x32 UE8M0
// byte scales) expanded inside the kernel. The producer warpgroup's four warps expand, the TMA thread being lane 0 of
// the first: per K block, the packed 128 x 64-byte tile comes by TMA into a ring of its own (kRawStages, 64-byte
// swizzle) ahead of the stages, and each producer thread turns one row of it into E4M3 in the stage's B tile, in the
// layout a TMA load of E4M3 would have left (128-byte swizzle), each MX group's codes through the fold table row
// 2^-(emax - e) (exact for emax - e <= 8), with emax the 128x128 tile's largest exponent from fp4_fold_scan_kernel
// (fp4_expand_weights.cuh). The consumers are unchanged: their B scale per K block is 2^emax (the scan's tile scales).
// The kernel runs only where the scan flagged no tile that spreads wider (GemmParams::gate); the FP4 kernel runs the
// other case. So each packed weight is read once per tile and never written back expanded.
#pragma once
#include "cuda/kernels/fp4_expand.hpp"
#include "cuda/kernels/sm90_fp8_gemm.cuh"
#include "cuda/scheduler/gemm_scheduler.cuh"

namespace finegemm::cuda {

// BLOCK_M = 128: two consumer warpgroups of 64 rows each; 192: three (FINEGEMM_GEMM_LEAN=192, since stop 36, not yet
// measured; 512 threads, 152 registers per consumer thread); 256: two, each taking two 64-row halves (rows 64·wg and
// 128 + 64·wg) through one accumulator set in turn, promoting each into its own total (128 + 64 accumulator
// registers), so that a stage's B tile serves twice the rows.
inline constexpr int kLeanBlockN = 128;
// Experts the grouped lean kernel's scheduler holds (kMaxGroupedExperts, sm90_fp8_gemm.hpp).
inline constexpr int kMaxGroupedLeanExperts = 1024;
// kStages: 4 or 5 at 128 rows, 4 at 192, 3 at 256 (what fits beside the staging tiles); at 128 rows the launcher takes the count
// that leaves the fewest pad stages in a tile's last lap, since those keep the next tile's first loads waiting.
template <int BLOCK_M, int kStagesT>
struct LeanGemm {
  static_assert(BLOCK_M == 128 || BLOCK_M == 192 || BLOCK_M == 256, "lean GEMM: 128-, 192- or 256-row tiles");
  static_assert(kStagesT >= 2 && kStagesT <= (BLOCK_M == 128 ? 5 : (BLOCK_M == 192 ? 4 : 3)),
                "lean GEMM: stages that fit in 227 KB");
  static constexpr int kWGs = BLOCK_M == 192 ? 3 : 2;          // consumer warpgroups
  static constexpr int kHalves = BLOCK_M == 256 ? 2 : 1;       // 64-row passes per consumer warpgroup
  static constexpr int kPassRows = 64 * kWGs;                  // rows of one pass of all consumer warpgroups
  static constexpr int kConsumerThreads = 128 * kWGs;
  static constexpr int kThreads = kConsumerThreads + 128;      // and one TMA warpgroup (one thread works)
  // setmaxnreg: the launch allocates 65536 / kThreads per thread (168 at 384 threads, 128 at 512); 40 + 2 x 232 = 504
  // = 3 x 168, and 56 + 3 x 152 = 512 = 4 x 128 (the general kernel's split for three consumers).
  static constexpr int kProducerRegs = kWGs == 2 ? 40 : 56;
  static constexpr int kConsumerRegs = kWGs == 2 ? 232 : 152;
  // setmaxnreg.inc waits for registers the launch's pool does not hold: the general kernel hung on the H200 with a
  // split over its pool (sm90_fp8_gemm.cuh).
  static_assert(kProducerRegs + kWGs * kConsumerRegs <= (65536 / kThreads) / 8 * 8 * (kWGs + 1),
                "setmaxnreg: the warpgroups ask for more registers than the launch allocated");
  static constexpr int kStages = kStagesT;
  static constexpr int kStageA = BLOCK_M * kGemmBlockK;        // 16, 24 or 32 KB
  static constexpr int kStageB = kLeanBlockN * kGemmBlockK;    // 16 KB
  static constexpr int kStaging = BLOCK_M * kLeanBlockN * 2;   // the tile's 16-bit outputs, 64 x 128 per box pair
  // Dynamic shared memory for K / 128 = num_kb K blocks (1024-byte aligned base): A stages, B stages, the staging
  // tiles, A scales per stage, the tile's B scales for every K block, then the barriers.
  // kSfbWarp: the B scales' second buffer and its two barrier pairs after the stages' barriers.
  static int smem_bytes(int num_kb, bool sfb_warp = false) {
    return 1024 + kStages * (kStageA + kStageB) + kStaging + kStages * BLOCK_M * 4 + (num_kb * 4 + 15) / 16 * 16 +
           2 * kStages * 8 + (sfb_warp ? 4 * 8 + (num_kb * 4 + 15) / 16 * 16 : 0);
  }
  // The grouped kernel: no staging tiles (its epilogue stores from registers), the scheduler's per-expert prefix after
  // the barriers.
  using Sched = GroupedScheduler<BLOCK_M, kMaxGroupedLeanExperts>;
  static int grouped_smem_bytes(int num_kb) { return smem_bytes(num_kb) - kStaging + Sched::kSmemBytes; }
  // kFp4B: the packed ring (kRawStages K blocks of 128 rows x 64 bytes) after the staging tiles, then its barriers
  // (full, empty), the nine fold-table rows and the issuing thread's B row, before the A scales.
  // Seven (four until stop 39; seven fit beside every height's stages: 225 KB at 128 rows, four stages, with the staging
  // tiles). ncu at M = 4096 N = 4096 K = 7168 with four: ~1 µs per K block against the E4M3 lean kernel's 0.43, a
  // fifth of the producers' warp samples at the packed ring's full barrier. Seven did not change the time (458 vs
  // 441 µs): the producers are latency-bound in the expansion itself, one warp per scheduler (their samples: 29%
  // long scoreboard, 27% fixed-latency waits, 17% shared-load waits, 16% issuing). The MoE layers were measured with
  // seven.
  // Stop 54 (call 6, H100): a ring of 5 (3 items ahead) left the packed tiles' TMA issue as stalled (~630 cycles per
  // K block) and the layers as fast (DeepSeek-V3 FP4 at T = 4096 6035-6116 µs against 6049-6134 at 7), so 7 stays.
  static constexpr int kRawStages = 7;
  static constexpr int kStageRaw = kLeanBlockN * kGemmBlockK / 2;
  static constexpr int kFp4Extra = kRawStages * kStageRaw + 256;
  static_assert(2 * kRawStages * 8 + 9 * 8 + 4 <= 256, "the packed ring's barriers, the fold table and the B row fit");
};


// 16-byte shared loads and stores at 32-bit shared addresses (the kFp4B producers' expansion; lean_fp4_expand_group
// is its host-tested form over pointers).
__device__ __forceinline__ void lean_lds128(uint32_t addr, uint32_t (&v)[4]) {
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3]) : "r"(addr) : "memory");
}
__device__ __forceinline__ void lean_sts128(uint32_t addr, const uint32_t (&v)[4]) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(v[0]), "r"(v[1]), "r"(v[2]), "r"(v[3]) : "memory");
}

// One MX group j of a producer's row: its loaded chunk `in` through the table row `tab` into E4M3 chunks 2j and 2j + 1
// of the row at `e4m3_at` (lean_fp4_e4m3_row's term plus the stage's base).
__device__ __forceinline__ void lean_fp4_expand_store(const uint32_t (&in)[4], uint2 tab, uint32_t e4m3_at, int j) {
  uint32_t lo[4], hi[4];
  e2m1x8_to_e4m3x8(in[0], tab.x, tab.y, lo[0], lo[1]);
  e2m1x8_to_e4m3x8(in[1], tab.x, tab.y, lo[2], lo[3]);
  e2m1x8_to_e4m3x8(in[2], tab.x, tab.y, hi[0], hi[1]);
  e2m1x8_to_e4m3x8(in[3], tab.x, tab.y, hi[2], hi[3]);
  lean_sts128(e4m3_at ^ static_cast<uint32_t>((2 * j) << 4), lo);
  lean_sts128(e4m3_at ^ static_cast<uint32_t>((2 * j + 1) << 4), hi);
}

// GemmParams::lean_scale_prefetch: bytes [begin, end) requested into L2: the 16-byte aligned middle by one bulk
// prefetch (its alignment), the partial chunks at either end by a line prefetch of their own byte, so that nothing
// outside [begin, end) is named.
__device__ __forceinline__ void lean_l2_prefetch(uintptr_t begin, uintptr_t end) {
  if (end <= begin) return;
  const uintptr_t from = (begin + 15) & ~uintptr_t{15}, to = end & ~uintptr_t{15};
  if (to > from)
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(from), "r"(static_cast<uint32_t>(to - from))
                 : "memory");
  if (begin < from) asm volatile("prefetch.global.L2 [%0];\n" ::"l"(begin) : "memory");
  if (to < end && to >= from) asm volatile("prefetch.global.L2 [%0];\n" ::"l"(end - 1) : "memory");
}
// The scales of one tile, by the thread that issues its copies, ahead of the threads that load them: the consumers
// their B scales at the tile's start and their A scales one K block ahead, the FP4 producers their rows' words and the
// tile's largest exponents one K block ahead, so each misses L2 at the tile's start and then once per 32-byte sector
// (every eight K blocks): the MoE GEMMs' scales are not in L2 when a tile starts, since the weight stream (and, for
// FP4, the fold scan over every expert's scales) passed through it after they were written.
// - B's block scales of the tile's column block (p's view: the FP4 kernels' tile scales), every K block.
// - FP4 B (fp4 non-null): the UE8M0 words of the tile's rows n0 .. n0 + 127, every K block: rows scale_stride_n bytes
//   apart, one run of (rows - 1) · stride + K / 32 bytes (28 KB for DeepSeek-V3's gate_up), and the tile's largest
//   exponents.
// - Grouped, row-major A scales (stride_k 1): the tile's rows [m0, m_end) of every K block, one run.
__device__ __forceinline__ void lean_prefetch_scales(const GemmParams& p, const LeanFp4B* fp4, int group, int n0,
                                                     int m0, int m_end) {
  const int kbs = (p.k + kGemmBlockK - 1) / kGemmBlockK;
  if (p.b_scale != nullptr) {
    const int64_t base = group * p.b_scale_group_stride + static_cast<int64_t>(n0 / p.b_block_n) * p.b_scale_stride_n;
    const bool bytes = p.b_scale_fmt == ScaleFmt::UE8M0;
    const int64_t first = bytes ? base : 4 * base;
    const int64_t length = bytes ? kbs : p.b_scale_fmt == ScaleFmt::F32 ? 4 * kbs : 4 * ((kbs + 3) / 4);
    const uintptr_t at = reinterpret_cast<uintptr_t>(p.b_scale) + static_cast<uintptr_t>(first);
    lean_l2_prefetch(at, at + static_cast<uintptr_t>(length));
  }
  if (fp4 != nullptr) {
    const int rows = min(kLeanBlockN, p.n - n0);
    const uintptr_t begin = reinterpret_cast<uintptr_t>(fp4->scale) +
                            static_cast<uintptr_t>(group * fp4->scale_group_stride +
                                                   static_cast<int64_t>(n0) * fp4->scale_stride_n);
    lean_l2_prefetch(begin, begin + static_cast<uintptr_t>(static_cast<int64_t>(rows - 1) * fp4->scale_stride_n +
                                                           4 * fp4->blocks));
    const int* emax = fp4->tile_emax + (group * fp4->tiles_per_group + n0 / kLeanBlockN) * fp4->blocks;
    lean_l2_prefetch(reinterpret_cast<uintptr_t>(emax), reinterpret_cast<uintptr_t>(emax + fp4->blocks));
  }
  const int rows_end = min(m_end, p.m);
  if (p.a_scale != nullptr && p.a_scale_stride_k == 1 && rows_end > m0) {
    const float* first = p.a_scale + static_cast<int64_t>(m0) * p.a_scale_stride_m;
    const float* last = p.a_scale + static_cast<int64_t>(rows_end - 1) * p.a_scale_stride_m + kbs;
    lean_l2_prefetch(reinterpret_cast<uintptr_t>(first), reinterpret_cast<uintptr_t>(last));
  }
}

// kStreamK's walk over a CTA's work: tiles blockIdx.x, + gridDim.x, ... below dp_tiles whole, then its range of the
// tail's K blocks (tiles dp_tiles .. num_tiles - 1 end to end, [begin(c), begin(c + 1)) for CTA c) as items of one tile
// each, from the range's end down: its last item first, the one it may leave unfinished for a CTA above it, so that
// the partial is ready long before that CTA needs it; its first item last, the one whose other K blocks come from the
// CTAs below it.
struct LeanItem {
  int t = 0, kb0 = 0, kb1 = 0;
};
// kStreamK's trace (LeanStreamK::trace): stamp `which` of item `n` of this CTA, by the calling thread.
__device__ __forceinline__ void lean_trace_stamp(LeanTrace* trace, int n, int which) {
  if (trace == nullptr || n >= kLeanTraceItems) return;
  unsigned long long g;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g));
  LeanTrace& e = trace[blockIdx.x * kLeanTraceItems + n];
  e.stamp[which][0] = g;
  e.stamp[which][1] = static_cast<unsigned long long>(clock64());
}
// kRingTrace (FINEGEMM_FP4_LEAN_TRACE_FILE): stamp `which` (LeanRingStamp) of this CTA's K block item `item`.
template <bool kOn>
__device__ __forceinline__ void lean_ring_stamp(LeanRingStamps* trace, uint32_t item, int which) {
  if constexpr (kOn) {
    if (item < static_cast<uint32_t>(kLeanRingItems))
      trace[blockIdx.x * kLeanRingItems + item].t[which] = static_cast<unsigned long long>(clock64());
  }
}
struct LeanStreamWalk {
  int num_tiles, num_kb, dp_tiles;
  int next_dp;
  int64_t lo, hi;  // the range's items not yet walked: [lo, hi)
  __device__ __forceinline__ LeanStreamWalk(int tiles, int kbs, int dp)
      : num_tiles(tiles), num_kb(kbs), dp_tiles(dp), next_dp(static_cast<int>(blockIdx.x)),
        lo(begin(static_cast<int>(blockIdx.x))), hi(begin(static_cast<int>(blockIdx.x) + 1)) {}
  __device__ __forceinline__ int64_t begin(int c) const {
    return static_cast<int64_t>(num_tiles - dp_tiles) * num_kb * c / static_cast<int>(gridDim.x);
  }
  __device__ __forceinline__ bool next(LeanItem& it) {
    if (next_dp < dp_tiles) {
      it = LeanItem{next_dp, 0, num_kb};
      next_dp += static_cast<int>(gridDim.x);
      return true;
    }
    if (hi <= lo) return false;
    const int j = static_cast<int>((hi - 1) / num_kb);
    const int64_t tile_begin = static_cast<int64_t>(j) * num_kb;
    const int64_t from = lo > tile_begin ? lo : tile_begin;
    it = LeanItem{dp_tiles + j, static_cast<int>(from - tile_begin), static_cast<int>(hi - tile_begin)};
    hi = from;
    return true;
  }
};

// The body of both lean kernels. Dense (kGrouped false): tiles t = blockIdx.x, + gridDim.x, ...: row block
// t % num_m_blocks, column block t / num_m_blocks; A scales M-major by the bulk copy; the epilogue through shared memory
// and TMA stores. Grouped (the MoE Store GEMM): the GroupedScheduler's tiles over each expert's rows (a tile's rows past
// its expert's end are computed and dropped), the expert's B rows and scales, A scales row-major read by each consumer
// thread for its two rows, and the epilogue stored from registers with the expert's bias, the row mask and the routing
// weights.
// kExpand (kFp4B only): the producers' expansion. 0: serial (below); 1, kBatched (FINEGEMM_FP4_LEAN_EXPAND=batched,
// stop 40, written without a GPU, off until measured): each
// producer thread loads its row's four fold-table rows and four packed chunks before it expands any, so that their
// shared-memory latencies overlap (the serial order waits out one load per group: ncu had 17% of the producers' samples
// on shared loads and 27% on fixed-latency dependencies), and the TMA thread keeps the packed ring kRawStages - 2
// items ahead instead of kRawStages - 1, so that its wait for a free slot is for the item before last, which every
// producer thread has usually left (at one ahead more, warp 0 waited for the slowest warp's previous item). 2 (split,
// FINEGEMM_FP4_LEAN_EXPAND=split, 128-row tiles only; stop 40, not yet run): two producer warpgroups (512 threads),
// thread e expanding row e % 128's MX groups 2·(e / 128) and 2·(e / 128) + 1, batched: two warps per scheduler instead
// of one and half the work per thread, for the latency the serial producers could not hide; the consumers keep 200
// registers and the producers 56 (2 x 200 + 2 x 56 = 512 = 4 x 128).
// kPair (dense E4M3 only; FINEGEMM_GEMM_LEAN_PAIR=1, stop 40; same bits on the H200, no faster, off): 2-CTA
// clusters over vertically adjacent tiles of one column block, sharing B: each CTA loads its A tile and one 64-row half
// of the B tile, multicast into both CTAs (the general kernel's kCluster = 2). The pair walks its tiles in lockstep
// (tile t of the cluster: row blocks 2·(t % pairs) + rank, column block t / pairs, where pairs = ceil(row blocks / 2);
// a rank-1 tile past M loads zeros and stores nothing), each stage's empty barrier takes the peer's consumer warps too
// (their lane 0 arrives remotely once the warp is done with the stage), and every thread of both CTAs passes a cluster
// barrier after the barriers' initialisation and before it leaves. Per 256x128 tile and K block: 32 KB of A and 8 KB
// of B from L2 instead of 16 KB (M = 4096 N = 4096 K = 7168: 1382 TFLOP/s, ~48 KB per 8.4 MFLOP, near the L2's rate).
// kShareA (with kPair; FINEGEMM_GEMM_LEAN_PAIR=a, stop 42; the default at K <= 1536 and M >= 2048 since stop 44,
// lean_pair_default): the pair shares
// A instead: horizontally adjacent tiles of one row block (tile t of the cluster: row block t % row blocks, column
// block 2·(t / row blocks) + rank; a rank-1 tile past N loads zeros, reads the last column block's B scales and stores
// nothing), each CTA loading its own B tile and one BLOCK_M / 2-row half of the A tile into both CTAs. Per 256x128
// tile and K block: 16 KB of A and 16 KB of B from L2 instead of 32 + 16 (the general kernel's c2a: 1216 vs 1128
// TFLOP/s unpromoted at M = 4096 N = 7168 K = 16384, stop 25). Meant for short K, where the tiles' feed is the
// largest share (M = 4096 N = 32768 K = 512: 0.96x cuBLASLt, stop 39; stop 44 on an H100, graph replay: 166.0 ->
// 159.8 µs, cuBLASLt 172.3; N = 24576 K = 1536 259.6 -> 256.3).
// kSfbWarp (dense E4M3, any pair mode or gate; FINEGEMM_GEMM_LEAN_SFB_WARP=1, stop 44, written without a GPU, off
// until measured): the tile's B scales come from the producer warpgroup's second warp, into two buffers, one tile
// ahead, handed over by barriers (full: the warp's 32 lanes after their stores; empty: every consumer thread after
// its tile's K loop). Without it the consumers load them at the start of every tile between two named barriers, a
// global load's latency (and the slowest warpgroup's epilogue) with the tensor cores idle, once per tile: at
// M = 4096 N = 4096 K = 7168 (four tiles per CTA) a per-tile cost of ~3.5 K blocks would explain the gap between
// its 1383 TFLOP/s and K = 16384's 1430 (stop 44's reading of stop 39's numbers).
// kGated (dense E4M3, not paired; stop 40, written without a GPU): the launch runs only where *p.gate matches (the
// E4M3 GEMM on FP4 weights expanded with one scale per 128x128 tile, which the fold scan gates; see Fp4Expansion):
// elsewhere the whole CTA leaves at once, as the kFp4B kernels do. FINEGEMM_FP4_EXPAND_LEAN=1 sends the expanded FP4
// prefill there instead of the general kernel (off until measured).
template <int BLOCK_M, int kStages, bool kAScale, bool kGrouped, bool kFp4B = false, int kExpand = 0,
          bool kPair = false, bool kGated = false, bool kShareA = false, bool kSfbWarp = false, bool kStreamK = false,
          bool kRingTrace = false, int kPackedIssuer = 0, int kPackedKb = 1, int kIssuer = 0>
__device__ __forceinline__ void lean_gemm_body(const CUtensorMap& tma_a, const CUtensorMap& tma_b,
                                               const CUtensorMap& tma_out, const GemmParams& p, int num_m_blocks,
                                               int num_tiles_dense,
                                               typename LeanGemm<BLOCK_M, kStages>::Sched sched,
                                               const LeanFp4B& fp4, const LeanStreamK& sk = LeanStreamK{}) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using L = LeanGemm<BLOCK_M, kStages>;
  constexpr int S = L::kStages;
  // kFp4B at 128 rows: 56 registers for the expanding producers (at 40 they spilled), 224 for the consumers, whose
  // one 64-row pass needs far fewer (kExpand 1: 64 / 216, kExpand 2: 56 / 200, below); 256-row consumers need their
  // 232 (228 used), so the producers keep 40 there.
  constexpr bool kBatched = kExpand == 1 || kExpand == 2;
  // kExpand 3 (FINEGEMM_FP4_LEAN_EXPAND=consumers, 128-row tiles): the consumer warpgroups expand, one stage ahead of
  // their wgmma (see kConsumerExpand below); the producer warpgroup keeps one TMA thread.
  constexpr bool kConsumerExpand = kExpand == 3;
  constexpr int kProducerWGs = kExpand == 2 ? 2 : 1;
  constexpr int kThreadsTotal = L::kThreads + 128 * (kProducerWGs - 1);
  static_assert(kExpand == 0 || kFp4B, "kExpand: FP4 weights only");
  static_assert(kExpand != 2 || BLOCK_M == 128, "kExpand 2 (two producer warpgroups): 128-row tiles only");
  // kConsumerExpand: the first two consumer warpgroups' threads expand two MX groups of one row each; a stage's B tile
  // is free when a consumer expands into it (see expand_next below) with three or more stages at 128 rows and four
  // at 192.
  static_assert(!kConsumerExpand || (BLOCK_M == 128 && S >= 3) || (BLOCK_M == 192 && S >= 4),
                "kExpand 3 (consumers expand): 128-row tiles with >= 3 stages or 192-row tiles with >= 4");
  // kBatched at 128 rows: 64 and 216 (at 56 the batch spilled: 24 bytes of stores, 60 of loads, dense with A scales);
  // two producer warpgroups: 56 and 200.
  // kConsumerExpand at 192 rows: the TMA thread alone in its warpgroup at 24, the consumers at 160 (24 + 3 x 160 = 504).
  constexpr int kProducerRegs =
      kConsumerExpand ? (BLOCK_M == 192 ? 24 : L::kProducerRegs)
      : kFp4B && BLOCK_M == 128 ? (kExpand == 2 ? 56 : kBatched ? 64 : 56) : L::kProducerRegs;
  constexpr int kConsumerRegs =
      kConsumerExpand ? (BLOCK_M == 192 ? 160 : L::kConsumerRegs)
      : kFp4B && BLOCK_M == 128 ? (kExpand == 2 ? 200 : kBatched ? 216 : 224) : L::kConsumerRegs;
  static_assert(kProducerWGs * kProducerRegs + L::kWGs * kConsumerRegs <=
                    (65536 / kThreadsTotal) / 8 * 8 * (L::kWGs + kProducerWGs),
                "setmaxnreg: the warpgroups ask for more registers than the launch allocated");
  static_assert(!kPair || (!kGrouped && !kFp4B), "kPair: the dense E4M3 lean kernel only");
  static_assert(!kGated || (!kGrouped && !kFp4B && !kPair), "kGated: the dense E4M3 lean kernel, not paired");
  static_assert(!kShareA || kPair, "kShareA: a mode of the pairs");
  static_assert(!kSfbWarp || (!kGrouped && !kFp4B), "kSfbWarp: the dense E4M3 lean kernel");
  static_assert(!kStreamK || (!kGrouped && !kFp4B && !kPair && !kGated && !kSfbWarp),
                "kStreamK: the dense E4M3 lean kernel, unpaired, ungated, the consumers loading the B scales");
  static_assert(!kRingTrace || (kFp4B && !kConsumerExpand && kProducerWGs == 1 && L::kWGs == 3),
                "kRingTrace: the 192-row FP4 lean kernel with one expanding producer warpgroup");
  static_assert(kPackedKb == 1 || (kPackedKb == 2 && kFp4B && kBatched && !kConsumerExpand && !kRingTrace &&
                                   kPackedIssuer == 0 && kProducerWGs == 1),
                "kPackedKb 2: the batched FP4 producers, thread 0 issuing, untraced");
  static_assert(kIssuer == 0 || ((kIssuer == 1 || kIssuer == 2) && kFp4B && kExpand == 1 && kProducerWGs == 1 &&
                                  kPackedIssuer == 0 && kPackedKb == 1),
                "kIssuer 1 / 2: the batched FP4 producers, one warpgroup, one thread issuing both copies");
  constexpr bool kLightIssuer = kIssuer == 1, kRotateIssuer = kIssuer == 2;
  LeanRingStamps* const ring = kRingTrace ? fp4.ring_trace : nullptr;
  if constexpr (kFp4B || kGated || kGrouped) {
    // The other path of the gated pair runs (the scan flagged a tile that does not fold): the whole CTA leaves. The
    // grouped E4M3 kernel reads the gate where it is given (the MoE's FP4 experts expanded, stop 52).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (p.gate != nullptr && p.gate_trigger) cudaTriggerProgrammaticLaunchCompletion();  // GemmParams::gate_trigger
#endif
    if (p.gate != nullptr && (*p.gate & p.gate_mask) != p.gate_value) return;
  }
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (ptx::smem_addr(smem_raw) & 1023)) & 1023);
  uint8_t* smem_a = smem;
  uint8_t* smem_b = smem_a + S * L::kStageA;
  uint8_t* smem_out = smem_b + S * L::kStageB;
  uint8_t* smem_packed = smem_out + (kGrouped ? 0 : L::kStaging);  // kFp4B
  float* smem_sfa = reinterpret_cast<float*>(smem_packed + (kFp4B ? L::kFp4Extra : 0));
  uint64_t* packed_full = reinterpret_cast<uint64_t*>(smem_packed + L::kRawStages * L::kStageRaw);
  uint64_t* packed_empty = packed_full + L::kRawStages;
  uint2* fold_tab = reinterpret_cast<uint2*>(packed_empty + L::kRawStages);
  // kFp4B: the B row of the tile whose packed K blocks the issuing thread loads (written and read by it alone).
  volatile int* packed_b_row = reinterpret_cast<volatile int*>(fold_tab + 9);
  float* smem_sfb = smem_sfa + S * BLOCK_M;
  const int num_kb = p.k / kGemmBlockK;
  uint64_t* full = reinterpret_cast<uint64_t*>(reinterpret_cast<uint8_t*>(smem_sfb) + (num_kb * 4 + 15) / 16 * 16);
  uint64_t* empty = full + S;
  // kSfbWarp: the B scales' barriers (full, empty; per buffer) and second buffer (L::smem_bytes(num_kb, true)).
  uint64_t* sfb_full = empty + S;
  uint64_t* sfb_empty = sfb_full + 2;
  float* smem_sfb1 = reinterpret_cast<float*>(sfb_empty + 2);
  const int lane = threadIdx.x % 32;
  const int laps = (num_kb + S - 1) / S;
  int num_tiles = num_tiles_dense;
  // kPair: the cluster's tiles (num_tiles counts the pairs' tiles) and this CTA's rank in the pair. Read where used,
  // as before kPair, so that the other builds compile as they did.
  auto first_tile = [] { return kPair ? static_cast<int>(blockIdx.x) / 2 : static_cast<int>(blockIdx.x); };
  auto tile_stride = [] { return kPair ? static_cast<int>(gridDim.x) / 2 : static_cast<int>(gridDim.x); };
  auto cta_rank = [] { return kPair ? ptx::cluster_ctarank() : 0u; };
  if constexpr (kGrouped) {
    sched.prepare(empty + S, kThreadsTotal);  // its __syncthreads comes below
    __syncthreads();
    num_tiles = sched.num_tiles();
  }
  // This tile's first row, one past its last row to store, expert and first column.
  struct Tile {
    int m0, m_end, group, n0;
  };
  auto tile_of = [&](int t) {
    if constexpr (kGrouped) {
      const TileInfo info = sched.tile(t);
      return Tile{info.m_row0, info.m_end, info.group, info.n_block * kLeanBlockN};
    } else if constexpr (kShareA) {
      return Tile{t % num_m_blocks * BLOCK_M, p.m, 0, (2 * (t / num_m_blocks) + static_cast<int>(cta_rank())) * kLeanBlockN};
    } else if constexpr (kPair) {
      const int pairs = (num_m_blocks + 1) / 2;
      return Tile{(2 * (t % pairs) + static_cast<int>(cta_rank())) * BLOCK_M, p.m, 0, t / pairs * kLeanBlockN};
    } else {
      return Tile{t % num_m_blocks * BLOCK_M, p.m, 0, t / num_m_blocks * kLeanBlockN};
    }
  };

  if (threadIdx.x == 0) {
    for (int s = 0; s < S; ++s) {
      // kFp4B: every producer thread, after its row of the expanded B tile (the TMA thread adds A's bytes first).
      // kConsumerExpand: the TMA thread's arrival with A's bytes, and every consumer thread after its part of B.
      ptx::mbar_init(&full[s], kConsumerExpand ? 1 + L::kConsumerThreads : kFp4B ? 128 * kProducerWGs : 1);
      // Every consumer thread, after its last read of the stage; kPair: and the peer's consumer warps (lane 0 each).
      ptx::mbar_init(&empty[s], L::kConsumerThreads + (kPair ? L::kConsumerThreads / 32 : 0));
    }
    if constexpr (kSfbWarp) {
      for (int b = 0; b < 2; ++b) {
        ptx::mbar_init(&sfb_full[b], 32);                     // the scale warp's lanes, after their stores
        ptx::mbar_init(&sfb_empty[b], L::kConsumerThreads);  // every consumer thread, after its tile's K loop
      }
    }
    if constexpr (kFp4B) {
      for (int r = 0; r < L::kRawStages; ++r) {
        ptx::mbar_init(&packed_full[r], 1);      // the TMA thread's expect_tx and the packed tile's bytes
        // Every expanding thread (producer, or kConsumerExpand consumer), after its reads of the tile.
        ptx::mbar_init(&packed_empty[r], kConsumerExpand ? L::kConsumerThreads : 128 * kProducerWGs);
      }
    }
    ptx::fence_barrier_init();
  }
  if constexpr (kFp4B) {
    if (threadIdx.x < 9) fold_tab[threadIdx.x] = make_uint2(fp4_fold_table_word(threadIdx.x, 0), fp4_fold_table_word(threadIdx.x, 1));
  }
  // A scales of rows past M (the last row block's copy is shorter) read zeros, or an earlier tile's finite values.
  for (int i = threadIdx.x; i < S * BLOCK_M; i += blockDim.x) smem_sfa[i] = 0.0f;
  ptx::fence_proxy_async_shared();
  __syncthreads();
  if constexpr (kPair) ptx::cluster_sync();  // the peer's barriers are initialised before any multicast or remote arrive

  if (threadIdx.x >= L::kConsumerThreads) {
    // ---------------- TMA thread (the last warpgroup, thread 0).
    ptx::setmaxnreg_dec<kProducerRegs>();
    if constexpr (kConsumerExpand) {
      // ---------------- kConsumerExpand: one TMA thread, A per stage (with its scales) and the packed tiles in their
      // ring, kRawStages - 2 K blocks ahead (item i: the CTA's (i / num_kb)-th tile's K block i % num_kb), so that its
      // wait for a free slot is for the item before last, which the consumers expanded one stage before they used it.
      if (threadIdx.x == L::kConsumerThreads) {
        constexpr int R = L::kRawStages;
        constexpr bool kBulkA = kAScale && !kGrouped;
        ptx::prefetch_tensor_map(&tma_a);
        ptx::prefetch_tensor_map(&tma_b);
        // The kFp4B producers' issue_packed, repeated here: one lambda hoisted for both branches left the SASS's
        // instruction counts alone but moved registers and scheduling in every measured FP4 lean kernel (cuobjdump,
        // stop 47), which no device run has checked.
        uint32_t issued = 0;
        int load_t = static_cast<int>(blockIdx.x), load_kb = 0;
        auto issue_packed = [&]() {
          if (load_t >= num_tiles) return;
          const uint32_t slot = issued % R;
          if (issued >= R) ptx::mbar_wait(&packed_empty[slot], (issued / R - 1) & 1u);
          if (load_kb == 0) {  // the tile's B row, once per tile (see the kFp4B producers' issue_packed)
            const Tile lt = tile_of(load_t);
            *packed_b_row = lt.group * p.n + lt.n0;
          }
          ptx::mbar_arrive_expect_tx(&packed_full[slot], L::kStageRaw);
          ptx::tma_load_2d(smem_packed + slot * L::kStageRaw, &tma_b, &packed_full[slot], load_kb * (kGemmBlockK / 2),
                           *packed_b_row);
          ++issued;
          if (++load_kb == num_kb) {
            load_kb = 0;
            load_t += static_cast<int>(gridDim.x);
          }
        };
        for (int i = 0; i < R - 2; ++i) issue_packed();
        uint32_t lap_count = 0;
        for (int t = blockIdx.x; t < num_tiles; t += gridDim.x) {
          const Tile tile = tile_of(t);
          const int m0 = tile.m0;
          const uint32_t sfa_bytes = kBulkA ? static_cast<uint32_t>((min(BLOCK_M, p.m - m0) + 3) / 4 * 16) : 0u;
          for (int lap = 0; lap < laps; ++lap, ++lap_count) {
            const uint32_t free_parity = (lap_count & 1u) ^ 1u;
#pragma unroll
            for (int s = 0; s < S; ++s) {
              const int kb = lap * S + s;
              ptx::mbar_wait(&empty[s], free_parity);
              if (kb < num_kb) {
                ptx::mbar_arrive_expect_tx(&full[s], L::kStageA + sfa_bytes);
                ptx::tma_load_2d(smem_a + s * L::kStageA, &tma_a, &full[s], kb * kGemmBlockK, m0);
                if constexpr (kBulkA)
                  ptx::bulk_load(smem_sfa + s * BLOCK_M, p.a_scale + kb * p.a_scale_stride_k + m0, sfa_bytes, &full[s]);
                issue_packed();
              } else {
                ptx::mbar_arrive(&full[s]);  // a pad stage of the tile's last lap: no data
              }
            }
          }
        }
      }
    } else if constexpr (kFp4B) {
      // ---------------- kFp4B: the whole warpgroup expands (thread e: row e of the B tile); thread 0 also issues the
      // TMA loads: A per stage, and the packed tiles in their own ring, kAhead K blocks ahead of the expansion
      // (across tiles: item i is the CTA's (i / num_kb)-th tile's K block i % num_kb).
      constexpr int R = L::kRawStages;
      // kPackedKb 2 (FINEGEMM_FP4_LEAN_PACKED_PAIRS, an experiment): one copy brings two K blocks, a 128-row x
      // 128-byte box (128-byte swizzle, K blocks 2i and 2i + 1 side by side in each row) into a slot of 16 KB; RP such
      // slots of the ring's 7 x 8 KB. The host takes it only where every tile has an even number of K blocks, so that
      // item 2i and 2i + 1 share copy i. kAhead in K blocks: copy i (positions 2i, 2i + 1) is issued at position 2i,
      // kAhead items ahead of the expansion, and reuses copy i - RP's slot, whose last item 2i - 2 RP + 1 must already
      // be expanded by the issuer itself: kAhead <= 2 RP - 2.
      constexpr int RP = kPackedKb == 2 ? R / 2 : R;
      constexpr int kAhead = kPackedKb == 2 ? 2 * RP - 2 : kBatched ? R - 2 : R - 1;  // ahead of the expansion
      constexpr bool kBulkA = kAScale && !kGrouped;
      // Thread e's row of the B tile (e itself with one producer warpgroup) and, with two, its half of the row's groups.
      const int e_all = static_cast<int>(threadIdx.x) - L::kConsumerThreads;
      const int e = kProducerWGs == 2 ? e_all & 127 : e_all;
      const int half = kProducerWGs == 2 ? e_all >> 7 : 0;
      const bool issuer = e_all == 0;
      // kPackedIssuer (FINEGEMM_FP4_LEAN_PACKED_ISSUER, an experiment): that producer thread issues the packed tiles'
      // loads; 0 (the default): thread 0 issues A's and the packed tile's back to back.
      static_assert(kPackedIssuer == 0 || (kPackedIssuer > 0 && kPackedIssuer < 128 && !kRingTrace),
                    "kPackedIssuer: a producer thread of the first warpgroup, not with kRingTrace");
      const bool packed_issuer = kPackedIssuer == 0 ? issuer : e_all == kPackedIssuer;
      if (issuer) {
        ptx::prefetch_tensor_map(&tma_a);
        ptx::prefetch_tensor_map(&tma_b);
      }
      // Counts as unsigned: the ring slot and phase by mask and shift.
      uint32_t issued = 0;
      int load_t = static_cast<int>(blockIdx.x), load_kb = 0;
      // kLightIssuer (kIssuer 1, FINEGEMM_FP4_LEAN_ISSUER=light, an experiment): warp 0, whose thread 0 issues the copies, expands
      // one MX group per lane instead of four: rows 0-95 go whole to warps 1-3 (thread e: row e - 32), and each of
      // rows 96-127 (lane l: row 96 + l) is shared by the four warps, group (warp + 3) % 4 each: warps 1-3 expand five
      // groups, warp 0 one. The ring trace (stop 57, H100) had thread 0 ~3.5 K blocks behind its warpgroup, each K
      // block's issue ~940 cycles on top of its row's ~450 of expansion, and the stages waiting on it.
      // Warp 0's own row (row_main) is its shared row, which it does not expand whole. Both row terms are linear in
      // the row over rows of the same lane (the swizzles take the row's low three bits), so the shared row's
      // addresses are the thread's own plus (row_x - row_main) rows, a warp-uniform step: two registers fewer (the
      // 56-register producers spilled 56 bytes with them).
      const int warp_e = e >> 5;
      const int row_main = kLightIssuer ? (e + 96) & 127 : e;
      const int row_x = 96 + (e & 31);
      const int group_x = (warp_e + 3) & 3;
      const uint32_t packed_row = ptx::smem_addr(smem_packed) +
                                  static_cast<uint32_t>(kPackedKb == 2 ? lean_fp4_e4m3_row(row_main) : lean_fp4_packed_row(row_main));
      const uint32_t e4m3_row = ptx::smem_addr(smem_b) + static_cast<uint32_t>(lean_fp4_e4m3_row(row_main));
      // kRotateIssuer (kIssuer 2, FINEGEMM_FP4_LEAN_ISSUER=rotate, an experiment): item i's copies (A's, and the packed
      // tile kAhead items on) are issued by warp i % 4's first thread, so that each warp carries a quarter of the issue.
      // Every warp's first thread (lead) keeps the packed ring's counts and its own copy of the tile's B row.
      const bool lead = (e & 31) == 0;
      auto issues = [&](uint32_t at) { return kRotateIssuer ? lead && (at & 3u) == static_cast<uint32_t>(warp_e) : issuer; };
      // The next packed tile into its ring slot, once every producer thread has read that slot's previous tile (item
      // issued - R: with kAhead = R - 1 the one being expanded before this one, with R - 2 the one before that).
      // at (kRingTrace): the item whose stamps take issue_packed's inner steps (kRingP0PackedFree, kRingP0PackedRow).
      // go false (kRotateIssuer): count the copy another warp issues.
      auto issue_packed = [&](uint32_t at = ~0u, bool go = true) {
        if (load_t >= num_tiles) return;
        // kPackedKb 2: the second K block of a copy comes with the first (no copy of its own).
        if (kPackedKb == 1 || (load_kb & 1) == 0) {
          const uint32_t slot = issued % RP;
          volatile int* const b_row = packed_b_row + (kRotateIssuer ? warp_e : 0);
          if (kRotateIssuer && load_kb == 0) {
            const Tile lt = tile_of(load_t);
            *b_row = lt.group * p.n + lt.n0;
          }
          if (kRotateIssuer && !go) {
            ++issued;
          } else {
          if (issued >= RP) ptx::mbar_wait(&packed_empty[slot], (issued / RP - 1) & 1u);
          if (kRingTrace && at != ~0u) lean_ring_stamp<kRingTrace>(ring, at, kRingP0PackedFree);
          // The tile's B row once per tile, not per K block: for the grouped kernels tile_of is the scheduler's binary
          // search over the experts (eight dependent shared loads at 256 experts) and a division, and the issuing
          // thread expands a row too, so every K block of the stage waited for it. ncu at stop 53 (H100, DeepSeek-V3
          // FP4 gate_up, T = 4096): the issuing warp spent two thirds of its samples in that code and the other three
          // producer warps waited on the stages' empty barriers, the consumers on their full barriers. The row is kept
          // in shared memory (packed_b_row): one more register spilled the 56-register producers.
          if (!kRotateIssuer && load_kb == 0) {
            const Tile lt = tile_of(load_t);
            *b_row = lt.group * p.n + lt.n0;
          }
          if (kRingTrace && at != ~0u) lean_ring_stamp<kRingTrace>(ring, at, kRingP0PackedRow);
          ptx::mbar_arrive_expect_tx(&packed_full[slot], kPackedKb * L::kStageRaw);
          ptx::tma_load_2d(smem_packed + slot * (kPackedKb * L::kStageRaw), &tma_b, &packed_full[slot],
                           load_kb * (kGemmBlockK / 2), *b_row);
          ++issued;
          }
        }
        if (++load_kb == num_kb) {
          load_kb = 0;
          load_t += static_cast<int>(gridDim.x);
        }
      };
      if (kRotateIssuer ? lead : packed_issuer)
        for (int i = 0; i < kAhead; ++i) issue_packed(~0u, !kRotateIssuer || warp_e == 0);
      uint32_t lap_count = 0, item = 0;
      for (int t = blockIdx.x; t < num_tiles; t += gridDim.x) {
        const Tile tile = tile_of(t);
        const int m0 = tile.m0;
        const uint32_t sfa_bytes = kBulkA ? static_cast<uint32_t>((min(BLOCK_M, p.m - m0) + 3) / 4 * 16) : 0u;
        // This row's scales, a word of four UE8M0 bytes per K block (rows past the expert's N read its last row: their
        // columns are computed and dropped), and the tile's largest exponent per K block; the next K block's loaded
        // while this one expands. As 32-bit word offsets from the parameters' pointers (lean_fp4_ok bounds them): two
        // 64-bit pointers spilled the 40 registers of the 128-row producer.
        const uint32_t s_off = static_cast<uint32_t>(
            (tile.group * fp4.scale_group_stride + static_cast<int64_t>(min(tile.n0 + row_main, p.n - 1)) * fp4.scale_stride_n) / 4);
        // kLightIssuer: the shared row's word (its byte group_x is this thread's).
        const uint32_t s_off_x = kLightIssuer ? static_cast<uint32_t>((tile.group * fp4.scale_group_stride +
                                                                       static_cast<int64_t>(min(tile.n0 + row_x, p.n - 1)) *
                                                                           fp4.scale_stride_n) / 4)
                                              : 0u;
        const uint32_t e_off =
            static_cast<uint32_t>((tile.group * fp4.tiles_per_group + tile.n0 / kLeanBlockN) * fp4.blocks);
        const uint32_t* scale_words = reinterpret_cast<const uint32_t*>(fp4.scale);
        uint32_t w_next = __ldg(scale_words + s_off);
        int emax_next = __ldg(fp4.tile_emax + e_off);
        for (int lap = 0; lap < laps; ++lap, ++lap_count) {
          const uint32_t free_parity = (lap_count & 1u) ^ 1u;
#pragma unroll
          for (int s = 0; s < S; ++s) {
            const int kb = lap * S + s;
            const bool iss = issues(item);  // this item's issuing thread (thread 0 unless kRotateIssuer)
            if (iss && kb < num_kb) lean_ring_stamp<kRingTrace>(ring, item, kRingP0EmptyWait);
            ptx::mbar_wait(&empty[s], free_parity);
            if (kb < num_kb) {
              if (iss) lean_ring_stamp<kRingTrace>(ring, item, kRingP0Free);
              // kLightIssuer: the shared row's scale word, loaded here so that its latency hides behind the issue and
              // the packed tile's wait (prefetched a K block ahead like w, it cost the kernel 56 bytes of spills).
              const uint32_t wx = kLightIssuer ? __ldg(scale_words + (s_off_x + kb)) : 0u;
              if (kRotateIssuer ? lead : issuer) {
                if (iss) {
                  ptx::mbar_expect_tx(&full[s], L::kStageA + sfa_bytes);
                  ptx::tma_load_2d(smem_a + s * L::kStageA, &tma_a, &full[s], kb * kGemmBlockK, m0);
                  if constexpr (kBulkA)
                    ptx::bulk_load(smem_sfa + s * BLOCK_M, p.a_scale + kb * p.a_scale_stride_k + m0, sfa_bytes, &full[s]);
                  lean_ring_stamp<kRingTrace>(ring, item, kRingP0AIssued);
                }
                if constexpr (kPackedIssuer == 0) issue_packed(item, iss);
                if (iss) lean_ring_stamp<kRingTrace>(ring, item, kRingP0PackedIssued);
              }
              if constexpr (kPackedIssuer != 0)
                if (packed_issuer) issue_packed();
              const uint32_t w = w_next;
              const int emax = emax_next;
              if (kb + 1 < num_kb) {
                w_next = __ldg(scale_words + (s_off + kb + 1));
                emax_next = __ldg(fp4.tile_emax + (e_off + kb + 1));
              }
              const uint32_t copy = kPackedKb == 2 ? item >> 1 : item;  // the packed copy holding this K block
              const uint32_t slot = copy % RP;
              if (iss) lean_ring_stamp<kRingTrace>(ring, item, kRingP0Issued);
              ptx::mbar_wait(&packed_full[slot], (copy / RP) & 1u);
              if (iss) lean_ring_stamp<kRingTrace>(ring, item, kRingP0Packed);
              // Shared addresses of this row's chunks: the row's term plus the slot's and stage's bases, each chunk one
              // XOR on (lean_fp4_packed_row, lean_fp4_e4m3_row). Opaque to ptxas: with the chunk offsets in sight it
              // kept all twelve per row in registers across the loop and spilled the 40-register producer.
              // kPackedKb 2: the row's 128 bytes hold K block 2i's chunks (0-3) and 2i + 1's (4-7), 128-byte swizzle.
              uint32_t packed_at = kPackedKb == 2 ? (packed_row + slot * (2 * L::kStageRaw)) ^ ((item & 1u) << 6)
                                                  : packed_row + slot * L::kStageRaw;
              uint32_t e4m3_at = e4m3_row + static_cast<uint32_t>(s * L::kStageB);
              asm volatile("" : "+r"(packed_at), "+r"(e4m3_at));
              // The batched expansion of this thread's row: every load first (the tables: plain shared loads; the
              // chunks: four volatile loads in a row), then each group's expansion and its two stores.
              auto expand_batched = [&]() {
                uint2 tab[4];
                uint32_t in[4][4];
#pragma unroll
                for (int j = 0; j < 4; ++j) tab[j] = fold_tab[min(max(emax - static_cast<int>((w >> (8 * j)) & 0xFFu), 0), 8)];
#pragma unroll
                for (int j = 0; j < 4; ++j) lean_lds128(packed_at ^ static_cast<uint32_t>(j << 4), in[j]);
#pragma unroll
                for (int j = 0; j < 4; ++j) lean_fp4_expand_store(in[j], tab[j], e4m3_at, j);
              };
              if constexpr (kExpand == 2) {
                // This thread's two groups of the row (2·half and 2·half + 1), loads first.
                uint2 tab[2];
                uint32_t in[2][4];
#pragma unroll
                for (int i = 0; i < 2; ++i) {
                  const int j = 2 * half + i;
                  tab[i] = fold_tab[min(max(emax - static_cast<int>((w >> (8 * j)) & 0xFFu), 0), 8)];
                }
#pragma unroll
                for (int i = 0; i < 2; ++i) lean_lds128(packed_at ^ static_cast<uint32_t>((2 * half + i) << 4), in[i]);
#pragma unroll
                for (int i = 0; i < 2; ++i) lean_fp4_expand_store(in[i], tab[i], e4m3_at, 2 * half + i);
              } else if constexpr (kLightIssuer) {
                // The shared row's group first (every warp), then warps 1-3 their whole row, batched as below.
                const uint32_t rows_x = static_cast<uint32_t>(row_x - row_main);
                const uint32_t packed_x = packed_at + rows_x * 64u, e4m3_x = e4m3_at + rows_x * 128u;
                {
                  const uint2 tab = fold_tab[min(max(emax - static_cast<int>((wx >> (8 * group_x)) & 0xFFu), 0), 8)];
                  uint32_t in[4];
                  lean_lds128(packed_x ^ static_cast<uint32_t>(group_x << 4), in);
                  lean_fp4_expand_store(in, tab, e4m3_x, group_x);
                }
                if (warp_e != 0) expand_batched();
              } else if constexpr (kBatched) {
                expand_batched();
              } else {
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                  const int d = min(max(emax - static_cast<int>((w >> (8 * j)) & 0xFFu), 0), 8);
                  const uint2 tab = fold_tab[d];
                  uint32_t in[4];
                  lean_lds128(packed_at ^ static_cast<uint32_t>(j << 4), in);
                  lean_fp4_expand_store(in, tab, e4m3_at, j);
                }
              }
              ptx::fence_proxy_async_shared();  // the expanded row, written by the generic proxy, for the wgmma
              if (iss) lean_ring_stamp<kRingTrace>(ring, item, kRingP0Arrive);
              if (kRingTrace && e_all == 127) lean_ring_stamp<kRingTrace>(ring, item, kRingPLastArrive);
              ptx::mbar_arrive(&full[s]);
              if (kPackedKb == 1 || (item & 1u) != 0) ptx::mbar_arrive(&packed_empty[slot]);
              ++item;
            } else {
              ptx::mbar_arrive(&full[s]);  // a pad stage of the tile's last lap: no data
            }
          }
        }
      }
    } else if (threadIdx.x == L::kConsumerThreads) {
      ptx::prefetch_tensor_map(&tma_a);
      ptx::prefetch_tensor_map(&tma_b);
      uint32_t lap_count = 0;
      // Tile t's K blocks [kb0, kb1) (a whole tile but in kStreamK's tail), as the consumers walk them.
      LeanStreamWalk walk(num_tiles, num_kb, sk.dp_tiles);
      LeanItem item{first_tile(), 0, num_kb};
      for (bool more = kStreamK ? walk.next(item) : item.t < num_tiles; more;
           more = kStreamK ? walk.next(item) : (item.t += tile_stride()) < num_tiles) {
        const int t = item.t, kb0 = item.kb0, kb1 = item.kb1;
        const int item_laps = kStreamK ? (kb1 - kb0 + S - 1) / S : laps;
        const Tile tile = tile_of(t);
        const int m0 = tile.m0, b_row0 = tile.group * p.n + tile.n0;
        constexpr bool kBulkA = kAScale && !kGrouped;
        // The tile's B and (grouped) A scales into L2, up to S K blocks before its consumers load them
        // (lean_prefetch_scales).
        if constexpr (kGrouped)
          if (p.lean_scale_prefetch && kb0 == 0)
            lean_prefetch_scales(p, nullptr, tile.group, tile.n0, m0, min(tile.m_end, m0 + BLOCK_M));
        // kPair: a rank-1 tile past M has no A scales to copy.
        const uint32_t sfa_bytes = !kBulkA || (kPair && m0 >= p.m)
                                       ? 0u
                                       : static_cast<uint32_t>((min(BLOCK_M, p.m - m0) + 3) / 4 * 16);
        for (int lap = 0; lap < item_laps; ++lap, ++lap_count) {
          const uint32_t free_parity = (lap_count & 1u) ^ 1u;
#pragma unroll
          for (int s = 0; s < S; ++s) {
            const int kb = kb0 + lap * S + s;
            ptx::mbar_wait(&empty[s], free_parity);
            if (kb < (kStreamK ? kb1 : num_kb)) {
              ptx::mbar_arrive_expect_tx(&full[s], L::kStageA + L::kStageB + sfa_bytes);
              if constexpr (kShareA) {
                // This CTA's BLOCK_M / 2-row half of A into both CTAs (tma_a's box: BLOCK_M / 2 rows), its own B.
                constexpr int kHalfA = BLOCK_M / 2;
                const int rank = static_cast<int>(cta_rank());
                ptx::tma_load_2d_multicast(smem_a + s * L::kStageA + rank * kHalfA * kGemmBlockK, &tma_a, &full[s],
                                           kb * kGemmBlockK, m0 + rank * kHalfA, 0x3);
                ptx::tma_load_2d(smem_b + s * L::kStageB, &tma_b, &full[s], kb * kGemmBlockK, b_row0);
              } else if constexpr (kPair) {
                // Its A tile, and this CTA's 64-row half of B into both CTAs (tma_b's box: 64 rows); the peer loads
                // the other half.
                constexpr int kHalfB = kLeanBlockN / 2;
                const int rank = static_cast<int>(cta_rank());
                ptx::tma_load_2d(smem_a + s * L::kStageA, &tma_a, &full[s], kb * kGemmBlockK, m0);
                ptx::tma_load_2d_multicast(smem_b + s * L::kStageB + rank * kHalfB * kGemmBlockK, &tma_b, &full[s],
                                           kb * kGemmBlockK, b_row0 + rank * kHalfB, 0x3);
              } else {
                ptx::tma_load_2d(smem_a + s * L::kStageA, &tma_a, &full[s], kb * kGemmBlockK, m0);
                ptx::tma_load_2d(smem_b + s * L::kStageB, &tma_b, &full[s], kb * kGemmBlockK, b_row0);
              }
              if constexpr (kBulkA)
                if (!kPair || sfa_bytes > 0)
                  ptx::bulk_load(smem_sfa + s * BLOCK_M, p.a_scale + kb * p.a_scale_stride_k + m0, sfa_bytes, &full[s]);
            } else {
              ptx::mbar_arrive(&full[s]);  // a pad stage of the tile's last lap: no data
            }
          }
        }
      }
    } else if (kStreamK && threadIdx.x / 32 == L::kConsumerThreads / 32 + 1) {
      // ---------------- kStreamK: the producer warpgroup's second warp publishes the CTA's partial (its range ends
      // inside a tile): once every consumer thread has stored its part and arrived on barrier 5, a GPU-scope fence
      // (cumulative over the stores the barrier ordered before it) and the flag, so that the consumers go on to their
      // next item without waiting for their stores to reach L2.
      const LeanStreamWalk w(num_tiles, num_kb, sk.dp_tiles);
      const int64_t hi = w.begin(static_cast<int>(blockIdx.x) + 1);
      if (hi > w.begin(static_cast<int>(blockIdx.x)) && hi % num_kb != 0) {
        ptx::named_bar_sync<5, L::kConsumerThreads + 32>();
        if (lane == 0) {
          __threadfence();
          ptx::st_release_gpu(sk.flags + blockIdx.x, 1);
        }
      }
    } else if (kSfbWarp && threadIdx.x / 32 == L::kConsumerThreads / 32 + 1) {
      // ---------------- kSfbWarp: the producer warpgroup's second warp loads each tile's B scales for every K block
      // into buffer (tile count) % 2, once the consumers have left that buffer's tile before last.
      uint32_t it = 0;
      for (int t = first_tile(); t < num_tiles; t += tile_stride(), ++it) {
        const Tile tile = tile_of(t);
        const uint32_t buf = it & 1u;
        if (it >= 2) ptx::mbar_wait(&sfb_empty[buf], ((it >> 1) - 1u) & 1u);
        float* dst = buf ? smem_sfb1 : smem_sfb;
        const int block_row = (kShareA ? min(tile.n0, p.n - 1) : tile.n0) / p.b_block_n;
        for (int i = lane; i < num_kb; i += 32) dst[i] = load_b_scale(p, tile.group, block_row, i);
        ptx::mbar_arrive(&sfb_full[buf]);
      }
    }
    if constexpr (kPair) {
      __syncwarp();  // the TMA thread's warp reconverges first, as the consumers' warps do
      ptx::cluster_sync();  // with every thread of both CTAs, before this one leaves
    }
    return;
  }

  // ---------------- Consumer warpgroups (warpgroup wg: rows 64·wg .. 64·wg + 63 of the tile, and with 256-row tiles
  // also 128 + 64·wg ..).
  ptx::setmaxnreg_inc<kConsumerRegs>();
  using Mma = ptx::WgmmaFp8<kLeanBlockN>;
  // The warpgroup index through a shuffle from lane 0: ptxas then keeps it, and the descriptors built from it, in
  // uniform registers (computed from threadIdx.x they went through R2UR before every wgmma).
  const int wg = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / 128, 0);
  const int wtid = threadIdx.x % 128, cwarp = wtid / 32;
  // This thread's rows of the tile: r0 and r0 + 8 (+ kPassRows · half).
  const int r0 = wg * 64 + cwarp * 16 + lane / 4;
  const uint32_t desc_a0 = ptx::desc_lo_k_major_sw128(ptx::smem_addr(smem_a) + wg * 64 * kGemmBlockK);
  const uint32_t desc_b0 = ptx::desc_lo_k_major_sw128(ptx::smem_addr(smem_b));
  constexpr uint32_t kHi = ptx::kDescHiKMajorSw128;
  auto wg_bar = [&]() {
    if (wg == 0) ptx::named_bar_sync<2, 128>();
    else if (L::kWGs == 2 || wg == 1) ptx::named_bar_sync<3, 128>();
    else ptx::named_bar_sync<4, 128>();
  };
  float acc[64];
  float total[64 * L::kHalves];
  uint32_t lap_count = 0;
  // A stage's release: this thread's arrival, and with kPair the warp's on the peer's barrier (after every lane's).
  auto release = [empty, lane, cta_rank](int s) {
    ptx::mbar_arrive(&empty[s]);
    if constexpr (kPair) {
      __syncwarp();
      if (lane == 0) ptx::mbar_arrive_cluster(&empty[s], cta_rank() ^ 1u);
    }
  };
  uint32_t sfb_it = 0;  // kSfbWarp: this CTA's tiles so far (the B scales' buffer and phase)
  // kConsumerExpand: the consumers expand the packed B tiles themselves, each thread of the first two warpgroups two MX
  // groups (2·x_half and 2·x_half + 1) of row x_row of every K block, as the producers do (the fold table row of each
  // group's distance below the tile's largest exponent); a third warpgroup (192-row tiles) expands nothing. expand_next()
  // takes the next stage of the CTA's sequence (tile, lap, stage, pad stages included), kXAhead stages ahead of the K
  // loop. Every consumer thread arrives on each stage's full barrier (pad stages too), so the wgmma of a stage starts
  // once all have expanded it.
  // - 128 rows, one ahead: a K block's wgmma are issued, the next stage is expanded while they run, then they are
  //   waited for. The B tile expanded into stage s at sequence position q was last read at q - S; a thread at q - 1 has
  //   passed the full barrier of q - 1, so every consumer has expanded q - 1, at its own position q - 2 >= q - S + 1
  //   (S >= 3), after it waited for the wgmma of q - S and released it: the tile is free.
  // - 192 rows, two ahead: the stage after next is expanded once the K block's wgmma are waited for, released and
  //   promoted (the accumulators free: three warpgroups' 152 registers hold no more), while the other warpgroups' wgmma
  //   run. A thread at q - 2 has passed the full barrier of q - 2, which every consumer expanded at its position
  //   q - 4 = q - S (S = 4) after releasing that position's stage: the tile is free.
  constexpr int kXAhead = BLOCK_M == 192 ? 2 : 1;
  int x_t = first_tile(), x_pos = 0;  // the expansion's tile and position in it (laps · S stages, pads included)
  uint32_t x_item = 0;                // real K blocks expanded so far: the packed ring's slot and phase
  uint32_t x_soff = 0, x_eoff = 0, x_w = 0;
  int x_emax = 0;
  const int x_row = static_cast<int>(threadIdx.x) & 127, x_half = static_cast<int>(threadIdx.x) >> 7;
  const uint32_t x_packed_row = ptx::smem_addr(smem_packed) + static_cast<uint32_t>(lean_fp4_packed_row(x_row));
  const uint32_t x_e4m3_row = ptx::smem_addr(smem_b) + static_cast<uint32_t>(lean_fp4_e4m3_row(x_row));
  // The row's scale words and the tile's largest exponents, as 32-bit word offsets (lean_fp4_ok bounds them); the
  // next position's loaded when a stage is done, so that their latency hides behind a K block.
  auto x_tile = [&]() {
    if (x_t >= num_tiles) return;
    const Tile xt = tile_of(x_t);
    x_soff = static_cast<uint32_t>(
        (xt.group * fp4.scale_group_stride + static_cast<int64_t>(min(xt.n0 + x_row, p.n - 1)) * fp4.scale_stride_n) / 4);
    x_eoff = static_cast<uint32_t>((xt.group * fp4.tiles_per_group + xt.n0 / kLeanBlockN) * fp4.blocks);
  };
  auto x_load = [&]() {
    if (x_t < num_tiles && x_pos < num_kb && x_half < 2) {
      x_w = __ldg(reinterpret_cast<const uint32_t*>(fp4.scale) + (x_soff + static_cast<uint32_t>(x_pos)));
      x_emax = __ldg(fp4.tile_emax + (x_eoff + static_cast<uint32_t>(x_pos)));
    }
  };
  auto expand_next = [&]() {
    if constexpr (kConsumerExpand) {
      if (x_t >= num_tiles) return;
      const int s = x_pos % S;
      if (x_pos < num_kb && x_half < 2) {
        constexpr int R = L::kRawStages;
        const uint32_t slot = x_item % R;
        ptx::mbar_wait(&packed_full[slot], (x_item / R) & 1u);
        uint32_t packed_at = x_packed_row + slot * L::kStageRaw;
        uint32_t e4m3_at = x_e4m3_row + static_cast<uint32_t>(s * L::kStageB);
        asm volatile("" : "+r"(packed_at), "+r"(e4m3_at));
        if constexpr (BLOCK_M == 128) {
          // Both groups' loads first (registers to spare beside the accumulators).
          uint2 tab[2];
#pragma unroll
          for (int i = 0; i < 2; ++i)
            tab[i] = fold_tab[min(max(x_emax - static_cast<int>((x_w >> (8 * (2 * x_half + i))) & 0xFFu), 0), 8)];
          uint32_t in[2][4];
#pragma unroll
          for (int i = 0; i < 2; ++i) lean_lds128(packed_at ^ static_cast<uint32_t>((2 * x_half + i) << 4), in[i]);
#pragma unroll
          for (int i = 0; i < 2; ++i) lean_fp4_expand_store(in[i], tab[i], e4m3_at, 2 * x_half + i);
        } else {
          // One group at a time (160 registers, 128 of them the accumulators and totals).
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            const int j = 2 * x_half + i;
            const uint2 tab = fold_tab[min(max(x_emax - static_cast<int>((x_w >> (8 * j)) & 0xFFu), 0), 8)];
            uint32_t in[4];
            lean_lds128(packed_at ^ static_cast<uint32_t>(j << 4), in);
            lean_fp4_expand_store(in, tab, e4m3_at, j);
          }
        }
        ptx::fence_proxy_async_shared();  // the expanded rows, written by the generic proxy, for the wgmma
      }
      if (x_pos < num_kb) {
        ptx::mbar_arrive(&packed_empty[x_item % L::kRawStages]);  // every consumer thread, expanding or not
        ++x_item;
      }
      ptx::mbar_arrive(&full[s]);
      if (++x_pos == laps * S) {
        x_pos = 0;
        x_t += tile_stride();
        x_tile();
      }
      x_load();
    }
  };
  if constexpr (kConsumerExpand) {
    x_tile();
    x_load();
    for (int i = 0; i < kXAhead; ++i) expand_next();  // the first stages
  }
  // Tile t's K blocks [kb0, kb1): a whole tile, but in kStreamK's tail (the walk's items; without kStreamK the loop
  // and its code are those of the kernels before it).
  LeanStreamWalk walk(num_tiles, num_kb, sk.dp_tiles);
  LeanItem item{first_tile(), 0, num_kb};
  int item_n = -1;  // kStreamK's trace: this CTA's items so far
  uint32_t ring_item = 0;  // kRingTrace: this thread's K blocks so far (pad stages not counted)
  LeanTrace* const trace = kStreamK && threadIdx.x == 0 ? sk.trace : nullptr;
  for (bool more = kStreamK ? walk.next(item) : item.t < num_tiles; more;
       more = kStreamK ? walk.next(item) : (item.t += tile_stride()) < num_tiles) {
    const int t = item.t, kb0 = item.kb0, kb1 = item.kb1;
    if constexpr (kStreamK) {
      ++item_n;
      if (trace != nullptr && item_n < kLeanTraceItems) {
        LeanTrace& e = trace[blockIdx.x * kLeanTraceItems + item_n];
        e.item[0] = t, e.item[1] = kb0, e.item[2] = kb1;
      }
      lean_trace_stamp(trace, item_n, 0);
    }
    const Tile tile = tile_of(t);
    const int m0 = tile.m0, n0 = tile.n0;
    // GemmParams::lean_scale_prefetch, kFp4B: consumer thread 0 requests the scales of the CTA's next tile into L2 (at
    // its first tile, that tile's own too), a tile ahead of the producers' loads of its words and exponents and of the
    // consumers' loads of its B and A scales (lean_prefetch_scales). Here, where the accumulators are free: in the
    // producers (56 registers) the 192-row batched kernel's stack went from 0 to 56 bytes.
    if constexpr (kFp4B && !kStreamK) {
      if (p.lean_scale_prefetch && threadIdx.x == 0) {
        auto one = [&](const Tile& x) {
          lean_prefetch_scales(p, &fp4, x.group, x.n0, kGrouped ? x.m0 : 0,
                               kGrouped ? min(x.m_end, x.m0 + BLOCK_M) : 0);
        };
        if (t == first_tile()) one(tile);
        if (t + tile_stride() < num_tiles) one(tile_of(t + tile_stride()));
      }
    }
    // The tile's B scales for every K block (its column block is one scale block row): once the previous tile's
    // last reads of them are done. kSfbWarp: from the scale warp's buffer for this tile.
    const float* sfb = smem_sfb;
    if constexpr (kSfbWarp) {
      if (sfb_it & 1u) sfb = smem_sfb1;
      ptx::mbar_wait(&sfb_full[sfb_it & 1u], (sfb_it >> 1) & 1u);
    } else {
      ptx::named_bar_sync<1, L::kConsumerThreads>();
      for (int i = threadIdx.x; i < num_kb; i += L::kConsumerThreads)
        smem_sfb[i] = load_b_scale(p, tile.group, (kShareA ? min(n0, p.n - 1) : n0) / p.b_block_n, i);
      ptx::named_bar_sync<1, L::kConsumerThreads>();
    }
    if constexpr (kStreamK) lean_trace_stamp(trace, item_n, 1);
    if constexpr (kGrouped) {
      // A warpgroup whose rows all lie past the expert's end (its first pass's first row, so every pass's) only waits
      // for and releases the tile's stages: no wgmma, promotion or stores, so that the tensor cores run the other
      // warpgroups alone (the general kernel's skip_idle, FINEGEMM_GEMM_SKIP_IDLE=0 turns both off). An expert of
      // 140 rows in a 192-row tile leaves none idle; in two 128-row tiles, the second tile's second warpgroup.
      if (p.skip_idle && m0 + wg * 64 >= tile.m_end) {
        for (int lap = 0; lap < laps; ++lap, ++lap_count) {
          const uint32_t parity = lap_count & 1u;
#pragma unroll
          for (int s = 0; s < S; ++s) {
            ptx::mbar_wait(&full[s], parity);
            if (kRingTrace && lap * S + s < num_kb) {
              if (threadIdx.x == 256) lean_ring_stamp<kRingTrace>(ring, ring_item, kRingC2Full);
              ++ring_item;
            }
            ptx::mbar_arrive(&empty[s]);
            expand_next();
          }
        }
        continue;
      }
    }
#pragma unroll
    for (int i = 0; i < 64 * L::kHalves; ++i) total[i] = 0.0f;
    // Grouped, row-major A scales: this thread's rows' scale offsets, once per tile (rows past the tile's last routed
    // row clamped to it: computed, never stored; clamped to M - 1 they read scales of slots no routed row wrote, which
    // compute-sanitizer's initcheck reported), 32-bit (grouped_lean_ok bounds them); the K loop adds kb · stride_k.
    // 64-bit addresses rebuilt per K block, or kept as pointers, spilled the 192-row build (152 registers).
    // The scales themselves are loaded one K block ahead (a_next): loaded after the stage's full-barrier wait, their
    // L2 latency showed past the K block's four wgmma (a helper's reading of the code; not yet measured).
    int a_rows[2 * L::kHalves];
    float a_next[2 * L::kHalves];
    auto load_a_scales = [&](int kb) {
      const int k_off = kb * static_cast<int>(p.a_scale_stride_k);
#pragma unroll
      for (int i = 0; i < 2 * L::kHalves; ++i) a_next[i] = p.a_scale[a_rows[i] + k_off];
    };
    if constexpr (kAScale && kGrouped) {
#pragma unroll
      for (int i = 0; i < 2 * L::kHalves; ++i)
        a_rows[i] = min(m0 + r0 + L::kPassRows * (i / 2) + 8 * (i % 2), max(min(tile.m_end, p.m) - 1, 0)) *
                    static_cast<int>(p.a_scale_stride_m);
      load_a_scales(0);
    }
    // K block kb in stage s: wait; per half, the four k32 steps from zero and the promotion into that half's total;
    // the release after the last half's wgmma.
    auto k_block = [&](int s, int kb, uint32_t parity) {
      if (threadIdx.x == 0) lean_ring_stamp<kRingTrace>(ring, ring_item, kRingC0FullWait);
      const float sb = sfb[kb];
      float a_cur[2 * L::kHalves];
      if constexpr (kAScale && kGrouped) {
#pragma unroll
        for (int i = 0; i < 2 * L::kHalves; ++i) a_cur[i] = a_next[i];
        if (kb + 1 < num_kb) load_a_scales(kb + 1);
      }
      ptx::mbar_wait(&full[s], parity);
      if (threadIdx.x == 0) lean_ring_stamp<kRingTrace>(ring, ring_item, kRingC0Full);
      if (threadIdx.x == 256) lean_ring_stamp<kRingTrace>(ring, ring_item, kRingC2Full);
      const float* sa = smem_sfa + s * BLOCK_M;
#pragma unroll
      for (int half = 0; half < L::kHalves; ++half) {
        // Without A scales the general kernel multiplies by 1.0f: the same bits as sb itself.
        const int rh = r0 + L::kPassRows * half;
        float lo0 = sb, lo1 = sb;
        if constexpr (kAScale && kGrouped) {
          lo0 = a_cur[2 * half] * sb;
          lo1 = a_cur[2 * half + 1] * sb;
        } else if constexpr (kAScale) {
          lo0 = sa[rh] * sb;
          lo1 = sa[rh + 8] * sb;
        }
        ptx::fence_operands(acc);
        ptx::wgmma_fence();
#pragma unroll
        for (int k = 0; k < kGemmBlockK / 32; ++k)
          Mma::mma(ptx::desc_from_words(
                       desc_a0 + static_cast<uint32_t>((s * L::kStageA + half * L::kPassRows * kGemmBlockK + k * 32) >> 4), kHi),
                   ptx::desc_from_words(desc_b0 + static_cast<uint32_t>((s * L::kStageB + k * 32) >> 4), kHi), acc,
                   k > 0);
        ptx::wgmma_commit();
        // kConsumerExpand at 128 rows: the next stage, while these wgmma run.
        if (kXAhead == 1 && half == L::kHalves - 1) expand_next();
        ptx::wgmma_wait<0>();
        ptx::fence_operands(acc);
        if (half == L::kHalves - 1) release(s);
        if (half == L::kHalves - 1 && threadIdx.x == 0) lean_ring_stamp<kRingTrace>(ring, ring_item, kRingC0Release);
        float* tot = total + 64 * half;
#pragma unroll
        for (int c = 0; c < kLeanBlockN / 8; ++c) {
          tot[c * 4 + 0] = fmaf(acc[c * 4 + 0], lo0, tot[c * 4 + 0]);
          tot[c * 4 + 1] = fmaf(acc[c * 4 + 1], lo0, tot[c * 4 + 1]);
          tot[c * 4 + 2] = fmaf(acc[c * 4 + 2], lo1, tot[c * 4 + 2]);
          tot[c * 4 + 3] = fmaf(acc[c * 4 + 3], lo1, tot[c * 4 + 3]);
        }
      }
      if (kXAhead == 2) expand_next();  // kConsumerExpand at 192 rows: the stage after next, the accumulators free
      if constexpr (kRingTrace) ++ring_item;
    };
    const int item_laps = kStreamK ? (kb1 - kb0 + S - 1) / S : laps;
    for (int lap = 0; lap < item_laps; ++lap, ++lap_count) {
      const uint32_t parity = lap_count & 1u;
      const int left = (kStreamK ? kb1 - kb0 : num_kb) - lap * S;
      if (left >= S) {
#pragma unroll
        for (int s = 0; s < S; ++s) k_block(s, kb0 + lap * S + s, parity);
      } else {
        for (int s = 0; s < left; ++s) k_block(s, kb0 + lap * S + s, parity);
        for (int s = left; s < S; ++s) {  // the pad stages
          ptx::mbar_wait(&full[s], parity);
          release(s);
          expand_next();
        }
      }
    }
    if constexpr (kSfbWarp) {
      ptx::mbar_arrive(&sfb_empty[sfb_it & 1u]);  // the K loop's reads of this tile's B scales are done
      ++sfb_it;
    }
    if constexpr (kStreamK) lean_trace_stamp(trace, item_n, 2);
    if constexpr (kStreamK) {
      // A tile of the tail whose K blocks span several CTAs: the CTA holding its last K block (kb1 == num_kb) stores
      // it, after adding the partial totals of the CTAs below it that hold its other K blocks (each CTA's range is
      // contiguous, so they are the CTAs just below, each at most one such partial: its range's last item, which it
      // computed first). Their partials: slot c of sk.partials, 128-bit stores in fragment order (float4 i of thread
      // x at i · kConsumerThreads + x), published by flag c (release), which the storing CTA waits for (acquire) and
      // sets back to zero; the producer warpgroup's second warp sets it (above). A CTA waits only on CTAs of lower
      // index, which the GPU starts no later than it.
      constexpr int kVecs = 64 * L::kHalves / 4;
      if (kb1 < num_kb) {
        float4* slot = reinterpret_cast<float4*>(sk.partials) +
                       static_cast<int64_t>(blockIdx.x) * (kVecs * L::kConsumerThreads) + threadIdx.x;
#pragma unroll
        for (int i = 0; i < kVecs; ++i)
          slot[i * L::kConsumerThreads] = make_float4(total[4 * i], total[4 * i + 1], total[4 * i + 2], total[4 * i + 3]);
        ptx::named_bar_arrive<5, L::kConsumerThreads + 32>();  // the publishing warp sets the flag
        lean_trace_stamp(trace, item_n, 3);
        continue;  // the owner stores the tile
      }
      if (kb0 > 0) {
        const LeanStreamWalk w(num_tiles, num_kb, sk.dp_tiles);
        const int64_t tile_begin = static_cast<int64_t>(t - sk.dp_tiles) * num_kb;
        for (int c = static_cast<int>(blockIdx.x) - 1; c >= 0; --c) {
          const int64_t c_begin = w.begin(c), c_end = w.begin(c + 1);
          if (c_end <= tile_begin) break;  // CTA c's range ends before this tile
          if (c_begin == c_end) continue;  // an empty range (fewer units than CTAs)
          if (threadIdx.x == 0) {
            while (ptx::ld_acquire_gpu(sk.flags + c) != 1) __nanosleep(64);
            sk.flags[c] = 0;  // for the next launch (none reads it again in this one)
            lean_trace_stamp(trace, item_n, 3);
          }
          ptx::named_bar_sync<1, L::kConsumerThreads>();
          const float4* slot = reinterpret_cast<const float4*>(sk.partials) +
                               static_cast<int64_t>(c) * (kVecs * L::kConsumerThreads) + threadIdx.x;
#pragma unroll
          for (int i = 0; i < kVecs; ++i) {
            // L2, not L1: written by another SM during this launch.
            const float4 v = __ldcg(slot + i * L::kConsumerThreads);
            total[4 * i] += v.x;
            total[4 * i + 1] += v.y;
            total[4 * i + 2] += v.z;
            total[4 * i + 3] += v.w;
          }
        }
        lean_trace_stamp(trace, item_n, 4);
      }
    }
    if constexpr (kGrouped) {
      // From registers: (v · rs + bias) · w, each step rounded, then to the output type; rows past the expert's end
      // and columns past N dropped; w the row's routing weight, 1 without. The general kernel's Store epilogue: its
      // lean store adds 0 (no bias), and its general loop (with a bias) computes ((v · rs) · 1 + bias) · w, the unit
      // column scale an exact step (the SASS of its 19 grouped Store kernels at 9178208: FMUL, FMUL, FADD, FMUL, no
      // FFMA contraction), so the same bits.
      // The tile looked up again: nothing of it stays live through the K loop (the 192-row build's registers).
      const Tile et = tile_of(t);
      const float* row_scale = p.row_scale + (p.row_mode == VecMode::Scalar ? et.group * p.row_scale_group_stride : 0);
      const int col_base = et.n0 + (lane % 4) * 2;
      // The expert's bias at this thread's columns (col_base + 8c and the next), once per tile for every half:
      // load_bias (F32, BF16 or F16), 0 without a bias. Columns past N read column N - 2 (computed, never stored).
      float bias[kLeanBlockN / 4];
      const int64_t bias_base = et.group * p.bias_group_stride;
      auto load_biases = [&]() {
#pragma unroll
        for (int c = 0; c < kLeanBlockN / 8; ++c) {
          const int64_t col = bias_base + min(col_base + c * 8, p.n - 2);
          bias[2 * c] = load_bias(p, col);
          bias[2 * c + 1] = load_bias(p, col + 1);
        }
      };
      // One dispatch on the dtype per tile, inside which load_bias's own switch folds.
      // NOTE: load_bias called bare kept its switch at each of the 32 columns (the SASS: a compare-and-branch chain
      // per column, with or without a bias).
      switch (p.bias_dtype) {
        case static_cast<int>(OutDType::F32): load_biases(); break;
        case static_cast<int>(OutDType::BF16): load_biases(); break;
        case static_cast<int>(OutDType::F16): load_biases(); break;
        default:
#pragma unroll
          for (int i = 0; i < kLeanBlockN / 4; ++i) bias[i] = 0.0f;
      }
#pragma unroll
      for (int half = 0; half < L::kHalves; ++half) {
        const int row0 = et.m0 + r0 + L::kPassRows * half, row1 = row0 + 8;
        const float rs0 = load_vec(p.row_mode, row_scale, min(row0, p.m - 1));
        const float rs1 = load_vec(p.row_mode, row_scale, min(row1, p.m - 1));
        const bool in0 = row0 < et.m_end, in1 = row1 < et.m_end;
        const float w0 = (p.row_weight && in0) ? p.row_weight[row0] : 1.0f;
        const float w1 = (p.row_weight && in1) ? p.row_weight[row1] : 1.0f;
        const float* tot = total + 64 * half;
        const int64_t off0 = static_cast<int64_t>(row0) * p.ldo + col_base, off1 = static_cast<int64_t>(row1) * p.ldo + col_base;
        auto store = [&](auto* out) {
#pragma unroll
          for (int c = 0; c < kLeanBlockN / 8; ++c) {
            if (col_base + c * 8 >= p.n) continue;
            const float v0 = __fmul_rn(__fadd_rn(__fmul_rn(tot[c * 4], rs0), bias[2 * c]), w0);
            const float v1 = __fmul_rn(__fadd_rn(__fmul_rn(tot[c * 4 + 1], rs0), bias[2 * c + 1]), w0);
            const float v2 = __fmul_rn(__fadd_rn(__fmul_rn(tot[c * 4 + 2], rs1), bias[2 * c]), w1);
            const float v3 = __fmul_rn(__fadd_rn(__fmul_rn(tot[c * 4 + 3], rs1), bias[2 * c + 1]), w1);
            if (in0) store_out_pair(out + off0 + c * 8, v0, v1);
            if (in1) store_out_pair(out + off1 + c * 8, v2, v3);
          }
        };
        if (p.out_dtype == OutDType::BF16) store(static_cast<__nv_bfloat16*>(p.out));
        else if (p.out_dtype == OutDType::F16) store(static_cast<__half*>(p.out));
        else store(static_cast<float*>(p.out));
      }
      continue;
    }
    // Epilogue: (v · rs + 0) · 1 rounded to the output type (the general kernel's TMA-store epilogue), written by
    // stmatrix as two 64 x 64 boxes per 64-row half (128-byte rows, 16-byte chunk c of row r at c ^ (r % 8)), stored
    // by one thread.
    if (wtid == 0) ptx::bulk_wait_group_read<0>();  // the previous tile's stores have read the staging tiles
    wg_bar();
    const int mat = lane >> 3, mat_row = cwarp * 16 + ((mat & 1) << 3) + (lane & 7);
#pragma unroll
    for (int half = 0; half < L::kHalves; ++half) {
      const int row0 = m0 + r0 + L::kPassRows * half, row1 = row0 + 8;
      const float rs0 = load_vec(p.row_mode, p.row_scale, min(row0, p.m - 1));
      const float rs1 = load_vec(p.row_mode, p.row_scale, min(row1, p.m - 1));
      uint8_t* out_tile = smem_out + (wg + L::kWGs * half) * (64 * kLeanBlockN * 2);
      const uint32_t row_addr = ptx::smem_addr(out_tile) + static_cast<uint32_t>(mat_row * 128);
      const float* tot = total + 64 * half;
      // Without a row scale (p.row_mode None: rs = 1) v · 1 + 0 and (v + 0) · 1 are v + 0 in every bit (NaNs leave
      // each operation canonical, -0 becomes +0 in the addition, subnormals pass FMUL by 1 unflushed): one FADD per
      // value instead of three operations, about half the epilogue's instructions (p.lean_unit_epilogue, stop 45).
      auto store_tile = [&](auto tag, auto unit_scale) {
        using T = decltype(tag);
        constexpr bool kUnit = decltype(unit_scale)::value;
        auto round = [&](float v, float rs) {
          return kUnit ? __fadd_rn(v, 0.0f) : __fmul_rn(__fadd_rn(__fmul_rn(v, rs), 0.0f), 1.0f);
        };
#pragma unroll
        for (int c = 0; c < kLeanBlockN / 8; c += 2) {
          uint32_t r[4];
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const float* v = tot + (c + h) * 4;
            r[2 * h] = pack_pair<T>(round(v[0], rs0), round(v[1], rs0));
            r[2 * h + 1] = pack_pair<T>(round(v[2], rs1), round(v[3], rs1));
          }
          const int chunk = c + (mat >> 1);
          const uint32_t addr = row_addr + static_cast<uint32_t>((chunk >> 3) * (64 * 128)) +
                                static_cast<uint32_t>((((chunk & 7) ^ (mat_row & 7)) << 4));
          ptx::stmatrix_x4(addr, r[0], r[1], r[2], r[3]);
        }
      };
      if (p.row_mode == VecMode::None && p.lean_unit_epilogue) {
        if (p.out_dtype == OutDType::F16) store_tile(__half{}, std::true_type{});
        else store_tile(__nv_bfloat16{}, std::true_type{});
      } else {
        if (p.out_dtype == OutDType::F16) store_tile(__half{}, std::false_type{});
        else store_tile(__nv_bfloat16{}, std::false_type{});
      }
    }
    ptx::fence_proxy_async_shared();
    wg_bar();
    if (wtid == 0 && (!kShareA || n0 < p.n)) {  // kShareA: a rank-1 tile past N stores nothing
#pragma unroll
      for (int half = 0; half < L::kHalves; ++half)
#pragma unroll
        for (int box = 0; box < kLeanBlockN / 64; ++box)
          ptx::tma_store_2d(&tma_out, smem_out + (wg + L::kWGs * half) * (64 * kLeanBlockN * 2) + box * (64 * 128),
                            n0 * 2 + box * 128, m0 + wg * 64 + L::kPassRows * half);
      ptx::bulk_commit_group();
    }
    if constexpr (kStreamK) lean_trace_stamp(trace, item_n, 5);
  }
  if constexpr (!kGrouped)
    if (wtid == 0) ptx::bulk_wait_group<0>();  // the last stores have read shared memory before the CTA leaves
  if constexpr (kPair) {
    __syncwarp();
    ptx::cluster_sync();  // no CTA leaves while its peer may still multicast into it or arrive on its barriers
  }
#else
  if (threadIdx.x == 0) printf("finegemm: the lean GEMM kernels need an sm_90a GPU\n");
  __trap();
#endif
}

// The dense lean kernel: tiles t = blockIdx.x, + gridDim.x, ...: row block t % num_m_blocks, column block
// t / num_m_blocks.
// kPair: 2-CTA clusters sharing B, or with kShareA sharing A (lean_gemm_body); num_tiles then counts the pairs' tiles.
// kGated: the launch runs only where *p.gate matches.
// kStreamK: tiles [0, sk.dp_tiles) whole, the rest's K blocks split evenly over the CTAs (LeanStreamWalk).
template <int BLOCK_M, int kStages, bool kAScale, bool kPair = false, bool kGated = false, bool kShareA = false,
          bool kSfbWarp = false, bool kStreamK = false>
__global__ void __launch_bounds__(LeanGemm<BLOCK_M, kStages>::kThreads, 1)
    sm90_fp8_gemm_lean_kernel(const __grid_constant__ CUtensorMap tma_a, const __grid_constant__ CUtensorMap tma_b,
                              const __grid_constant__ CUtensorMap tma_out, const GemmParams p, int num_m_blocks,
                              int num_tiles, const LeanStreamK sk) {
  lean_gemm_body<BLOCK_M, kStages, kAScale, false, false, 0, kPair, kGated, kShareA, kSfbWarp, kStreamK>(
      tma_a, tma_b, tma_out, p, num_m_blocks, num_tiles, {}, LeanFp4B{}, sk);
}

// The grouped lean kernel (the MoE Store GEMM; FINEGEMM_GROUPED_LEAN, off until measured): the scheduler's tiles over
// each expert's rows; b is every expert's [N, K] weights stacked ([E·N, K]).
template <int BLOCK_M, int kStages, bool kAScale>
__global__ void __launch_bounds__(LeanGemm<BLOCK_M, kStages>::kThreads, 1)
    sm90_fp8_grouped_lean_kernel(const __grid_constant__ CUtensorMap tma_a, const __grid_constant__ CUtensorMap tma_b,
                                 const GemmParams p, const typename LeanGemm<BLOCK_M, kStages>::Sched sched) {
  lean_gemm_body<BLOCK_M, kStages, kAScale, true>(tma_a, tma_b, tma_b, p, 0, 0, sched, LeanFp4B{});
}

// kFp4B (FINEGEMM_FP4_LEAN, off until measured): tma_b maps the packed weights ([rows, K / 2] bytes, 128 x 64-byte
// boxes, 64-byte swizzle); p is the E4M3 view of the call (Fp4Expansion's tile scales as B scales, gated on the scan's
// flags), fp4 the original scales and the scan's exponents.
// kExpand: the expansion (lean_gemm_body): 0 serial, 1 batched, 2 two producer warpgroups (their launch takes
// lean_fp4_threads(BLOCK_M, 2) threads), 3 the consumer warpgroups (128-row tiles).
template <int BLOCK_M, int kStages>
constexpr int lean_fp4_threads(int expand) {
  return LeanGemm<BLOCK_M, kStages>::kThreads + (expand == 2 ? 128 : 0);
}

template <int BLOCK_M, int kStages, bool kAScale, int kExpand = 0>
__global__ void __launch_bounds__(lean_fp4_threads<BLOCK_M, kStages>(kExpand), 1)
    sm90_fp4_gemm_lean_kernel(const __grid_constant__ CUtensorMap tma_a, const __grid_constant__ CUtensorMap tma_b,
                              const __grid_constant__ CUtensorMap tma_out, const GemmParams p, int num_m_blocks,
                              int num_tiles, const LeanFp4B fp4) {
  lean_gemm_body<BLOCK_M, kStages, kAScale, false, true, kExpand>(tma_a, tma_b, tma_out, p, num_m_blocks, num_tiles, {},
                                                                  fp4);
}

// kRingTrace: the diagnostic build that stamps its ring (LeanFp4B::ring_trace; FINEGEMM_FP4_LEAN_TRACE_FILE).
// kPackedIssuer: the producer thread that issues the packed tiles (FINEGEMM_FP4_LEAN_PACKED_ISSUER; 0: thread 0).
// kPackedKb: K blocks per packed copy (FINEGEMM_FP4_LEAN_PACKED_PAIRS; 2: tma_b in 128 x 128-byte boxes, 128-byte
// swizzle, and every tile an even number of K blocks). kIssuer (FINEGEMM_FP4_LEAN_ISSUER): 1 the issuing warp expands
// one MX group per lane, 2 the copies' issue rotates over the producer warps.
template <int BLOCK_M, int kStages, bool kAScale, int kExpand = 0, bool kRingTrace = false, int kPackedIssuer = 0,
          int kPackedKb = 1, int kIssuer = 0>
__global__ void __launch_bounds__(lean_fp4_threads<BLOCK_M, kStages>(kExpand), 1)
    sm90_fp4_grouped_lean_kernel(const __grid_constant__ CUtensorMap tma_a, const __grid_constant__ CUtensorMap tma_b,
                                 const GemmParams p, const typename LeanGemm<BLOCK_M, kStages>::Sched sched,
                                 const LeanFp4B fp4) {
  lean_gemm_body<BLOCK_M, kStages, kAScale, true, true, kExpand, false, false, false, false, false, kRingTrace,
                 kPackedIssuer, kPackedKb, kIssuer>(tma_a, tma_b, tma_b, p, 0, 0, sched, fp4);
}

}  // namespace finegemm::cuda
