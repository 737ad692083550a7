// Host side of src/cuda/kernels/sm90_fp8_gemm.cuh: tile-config heuristic, tensor maps, launch.
#pragma once
#include <cuda_runtime.h>

#include <string>

#include "cuda/kernels/gemm_params.cuh"

namespace finegemm::cuda {

struct GemmConfig {
  int block_m = 128;
  int block_n = 128;
  int stages = 6;
  int split_k = 1;
  int k_blocks_per_split = 0;
  int grid = 0;     // CTAs, or CTA pairs when cluster == 2, or 2x2 blocks when cluster == 4
  int cluster = 1;  // 2: two CTAs share B tiles through TMA multicast; 4: 2x2 CTAs share A and B ("c4")
  bool share_a = false;  // with cluster 2: the pair shares A tiles instead (adjacent column blocks; "c2a")
  std::string describe() const;
};

// Pure function from the problem to a tile config (FINEGEMM_PRINT_CONFIG=1 prints each choice).
// FINEGEMM_GEMM_CONFIG="BMxBN[:split[c2[a]]]" forces one, for benchmarks and tests.
// promote_k: 0 (no promotion), 32 or 128.
GemmConfig choose_gemm_config(int m, int n, int k, int promote_k, int num_sms);

// a [M, K] and b [N, K] E4M3, row-major with leading dimensions lda/ldb (bytes, multiples of 16), 16-byte aligned.
// Dense E4M3 GEMMs with groups of 128 copy each stage's A scales with one cp.async.bulk where the scales are M-major
// (GemmParams::a_scale_bulk); linear() then quantizes to that layout at prefill sizes. On by default since stop 27
// (H200, M = 4096, TFLOP/s, loaders -> bulk: N=7168 K=16384 1002 -> 1081, N=4096 K=7168 962 -> 1000, N=24576 K=1536
// 967 -> 1006, N=7168 K=2048 904 -> 940); FINEGEMM_GEMM_SCALE_BULK=0 turns it off.
bool a_scale_bulk_wanted();
// Whether the bulk copy can read p's A scales: groups of 128, M-major (stride 1 along M) with a leading dimension of
// at least M rounded up to 4 and a multiple of 4, 16-byte aligned, and the rows up to M rounded up to 4 readable
// (GemmParams::a_scale_padded, or M % 4 == 0).
bool a_scale_bulk_ok(const GemmParams& p);

void launch_sm90_fp8_gemm(const void* a, int64_t lda, const void* b, int64_t ldb, GemmParams params,
                          cudaStream_t stream);

// The lean kernel (sm90_fp8_gemm_lean.cuh): 128x128, 192x128 or 256x128 tiles for E4M3 weights with 128x128 block scales and
// 1x128 A scales that the bulk copy reads or none (static per-tensor, per-token), K % 128 == 0, 16-bit output through
// TMA stores, no bias, column scale, row weight or split-K. launch_sm90_fp8_gemm takes it where lean_gemm_ok holds
// and lean_gemm_block_m picks a height (FINEGEMM_GEMM_LEAN unset and no FINEGEMM_GEMM_CONFIG), or as forced:
// FINEGEMM_GEMM_LEAN=0 off, =1 128-row tiles, =192 192-row tiles (three consumer warpgroups; not yet measured, so
// not in the default's choice), =256 256-row tiles.
bool lean_gemm_ok(const GemmParams& p, int block_m, int device);
void launch_sm90_fp8_gemm_lean(const void* a, int64_t lda, const void* b, int64_t ldb, const GemmParams& p, int block_m,
                               int device, cudaStream_t stream);
// The lean kernel's tile height for p on num_sms SMs by default: 0 (the general kernel) below kLeanMinM rows or where
// a cost model (waves x tile area / measured efficiency, sm90_fp8_gemm_lean.cu) expects the general kernel's choice
// (choose_gemm_config) to be faster, else 128 or 256, whichever it expects faster.
inline constexpr int kLeanMinM = 128;
int lean_gemm_block_m(const GemmParams& p, int num_sms);
// FINEGEMM_GEMM_LEAN_PAIR: whether the dense lean kernel runs in 2-CTA clusters: 1 sharing B ("1"), 2 sharing A ("a"),
// 0 not ("0"), -1 by shape (unset: lean_pair_default). Anything else throws, naming the variable and the value.
int lean_pair_mode();
// The pair mode a dense lean launch of p takes under lean_pair_mode() == mode: mode itself where set, else 2 (pairs
// sharing A) for short K at large M (K <= kLeanPairAMaxK, M >= kLeanPairAMinM) and 0 elsewhere.
inline constexpr int64_t kLeanPairAMaxK = 1536;
inline constexpr int64_t kLeanPairAMinM = 2048;
int lean_pair_default(const GemmParams& p, int mode);
// FINEGEMM_GEMM_LEAN_SFB_WARP: whether the dense lean kernel's B scales come from the producer warpgroup's second warp,
// a tile ahead ("1"), or the consumers load them at each tile's start ("0"); unset (-1) by shape:
// lean_sfb_warp_default. Anything else throws, naming the variable and the value. The counter gives that kernel's
// launches (tests).
int lean_sfb_warp_mode();
// Whether a dense lean launch of p takes the scale warp under lean_sfb_warp_mode() == mode: mode itself where set, else
// at short K (K <= kLeanSfbWarpMaxK, or K <= kLeanSfbWarpMaxKLargeM at M >= kLeanSfbWarpMinMLargeK), where a tile
// has few K blocks to hide its scale loads behind.
inline constexpr int64_t kLeanSfbWarpMaxK = 1536;
inline constexpr int64_t kLeanSfbWarpMaxKLargeM = 2048;
inline constexpr int64_t kLeanSfbWarpMinMLargeK = 2048;
bool lean_sfb_warp_default(const GemmParams& p, int mode);
// FINEGEMM_GEMM_LEAN_UNIT_EPILOGUE: whether the lean kernel's TMA-store epilogue takes one addition per value where
// there is no row scale (GemmParams::lean_unit_epilogue; unset or "1": yes, "0": the three operations). Anything else
// throws, naming the variable and the value.
bool lean_unit_epilogue_wanted();
long long lean_sfb_warp_launches();
// FINEGEMM_FP4_EXPAND_LEAN: whether the gated lean kernel serves the expanded FP4 prefill's E4M3 GEMM ("1"; unset or
// "0": the general kernel). Anything else throws, naming the variable and the value.
bool fp4_expand_lean_wanted();
// How many lean-kernel launches this process has made (tests check that the switch took the lean kernel).
long long lean_gemm_launches();
// How many of them ran in 2-CTA pairs sharing A (share_a) or B (FINEGEMM_GEMM_LEAN_PAIR).
long long lean_pair_launches(bool share_a);
// FINEGEMM_GEMM_LEAN_STREAMK: 1 ("1") gives the dense lean kernel a stream-K tail where its tiles leave the last wave
// partial (the tail's K blocks split evenly over every SM; lean_gemm_body's kStreamK), 0 ("0" or unset) not, 2 ("2",
// diagnostics) runs its kernel with every tile whole (the baseline of its trace, FINEGEMM_GEMM_LEAN_TRACE_FILE). Only
// unpaired, ungated launches with the consumers loading the B scales take it (set, the unset pair and scale-warp
// modes resolve to those; set explicitly, they win). Anything else throws, naming the variable and the value. The
// counter gives its launches (tests).
int lean_stream_k_mode();
long long lean_stream_k_launches();
// The split-K partials' buffer cached per (device, stream), `bytes` or more; nullptr under graph capture or on
// cudaStreamPerThread (the caller then takes a stream-ordered allocation).
float* cached_split_workspace(int device, cudaStream_t stream, size_t bytes);

// Split-K finish (splitk_reduce_kernel): p.out = Σ_split p.workspace[split] (in order) with p's epilogue.
void launch_splitk_reduce(const GemmParams& p, int split_k, cudaStream_t stream);

// FP4 weights at M ≤ 64 (sm90_fp4_decode.cuh): swap AB, weights expanded in registers. FINEGEMM_FP4_DECODE=0 sends
// them to the general kernel instead; FINEGEMM_FP4_DECODE_SPLIT=n forces the split.
struct Fp4DecodeConfig {
  int wn = 8;  // token columns of the wgmma (M rounded up to 8, 16, 32 or 64; 128 for wide grouped permuted launches)
  int tiles = 0;  // 64-row weight tiles (of each group)
  int slots = 0;  // groups: expert slots (DecodeGroups::slots); 0 without groups
  int split_k = 1;
  int kb_per_split = 0;
  bool fp8_weights = false;  // E4M3 weights (FINEGEMM_FP8_DECODE=1)
  int stage_k = 128;  // K per pipeline stage: 128 or 256 (FINEGEMM_FP4_DECODE_STAGE_K)
  int rows = 64;  // weight rows per CTA: 64, or 128 for E4M3 weights (FINEGEMM_DECODE_ROWS=128: two warpgroups)
  bool swizzle = true;  // swizzled weight tiles (FINEGEMM_FP4_DECODE_SWIZZLE=0: plain, for comparisons)
  int preparers = 1;  // FP4 scale-preparer warps: 1, 2 (FINEGEMM_FP4_DECODE_PREPARERS=2; dense, 128 of K per stage) or 0
                      // (prepared fold words, FINEGEMM_FP4_DECODE_FOLD_CACHE=2)
  bool perm_k = false;  // FP4 on permuted activations (GemmParams::a_perm_k): no preparer, 128 of K per stage
  bool pipe = false;  // FP4 consumers pipelined over two stages (FINEGEMM_FP4_DECODE_PIPE=1; dense, 128 of K, 1 preparer)
};
int fp4_decode_width(int m);
// fp8_weights: the same kernel on E4M3 weights with 64x128-constant block scales (FINEGEMM_FP8_DECODE=1, off).
// slots: expert slots of a grouped launch (0: none); the split fills the GPU with slots × tiles CTAs.
// perm_k: FP4 weights on permuted activations (GemmParams::a_perm_k: fp4_decode_perm_wanted, moe_decode_perm_wanted).
Fp4DecodeConfig choose_fp4_decode_config(int m, int n, int k, int num_sms, int device, bool fp8_weights = false,
                                         int slots = 0, bool perm_k = false);
// p.workspace set: partials for splitk_reduce_kernel (c.split_k > 1), unless the kernel finished the split-K itself
// (FINEGEMM_DECODE_SPLIT_FINISH=1: the tile's last CTA sums the partials, the same bits): then it returns true and the
// caller launches no reduce.
bool launch_sm90_fp4_decode(const void* a, int64_t lda, const void* b, int64_t ldb, const GemmParams& p,
                            const Fp4DecodeConfig& c, cudaStream_t stream, const DecodeGroups& groups = {});

// The FP4 GEMV (sm90_fp4_gemv.cuh): dense FP4 weights at M ≤ 16 with mma.sync, no producer warps. fp4_gemv_ok: the
// recipe and alignment it serves (else the decode kernel runs). Its partials always go to p.workspace
// ([split_k][M][N]); splitk_reduce_kernel applies the epilogue.
struct Fp4GemvConfig {
  int mt = 1;              // token tiles of 8 (M ≤ 8 · mt): 1 or 2
  int tiles = 0;           // 16-row weight tiles
  int split_k = 1;         // CTAs along K
  int steps_per_warp = 1;  // 128s of K per warp
};
bool fp4_gemv_default(int m, int n);  // where it measured faster than the decode kernel
bool fp4_gemv_ok(const GemmParams& p, const void* a, int64_t lda, const void* b, int64_t ldb);
Fp4GemvConfig choose_fp4_gemv_config(int m, int n, int k, ScaleFmt fmt, int num_sms, int device);
// Returns true when the kernel applied the epilogue itself (FINEGEMM_DECODE_SPLIT_FINISH=1): no reduce to launch.
bool launch_sm90_fp4_gemv(const void* a, int64_t lda, const void* b, int64_t ldb, const GemmParams& p,
                          const Fp4GemvConfig& c, cudaStream_t stream);

// The FP4 decode kernel whose threads copy their own weights (sm90_fp4_decode_ldg.cuh; FINEGEMM_FP4_DECODE_LDG=1, off
// until measured): dense calls and the MoE decode path's grouped ones on permuted activations (GemmParams::a_perm_k)
// with UE8M0 byte scales and the 16-byte alignment fp4_decode_ldg_ok checks (else the permuted kernel runs), up to
// 64 tokens per chunk. Split-K partials go to p.workspace
// ([split_k][M][N]) for splitk_reduce_kernel; unsplit, the kernel applies the epilogue.
struct Fp4LdgConfig {
  int wn = 8;                // token columns of the wgmma: 8, 16, 32 or 64
  int tiles = 0;             // 64-row weight tiles
  int split_k = 1;           // CTAs along K
  int chunks_per_split = 1;  // 512s of K per CTA
};
bool fp4_decode_ldg_wanted();
bool fp4_decode_ldg_ok(const GemmParams& p, const void* a, int64_t lda, const void* b, int64_t ldb,
                       bool grouped = false);
// slots: the grouped launch's expert slots (0: dense).
Fp4LdgConfig choose_fp4_decode_ldg_config(int m, int n, int k, int num_sms, int device, int slots = 0);
void launch_sm90_fp4_decode_ldg(const void* a, int64_t lda, const void* b, int64_t ldb, const GemmParams& p,
                                const Fp4LdgConfig& c, cudaStream_t stream, const DecodeGroups& groups = {});
long long fp4_decode_ldg_launches();  // launches of that kernel in this process (tests)

// The decode kernel's recipes (any M: callers choose by M): FP4 weights with MX 1x32 scales, or E4M3 weights with
// block scales constant over 64 rows and 128 of K (activation scales constant over 128 of K); activation groups of
// 32, 64 or multiples of 128 (FP4), per-token or static scales. None, Fp4 or Fp8.
enum class DecodeKind { None, Fp4, Fp8 };
DecodeKind decode_kernel_kind(const GemmParams& p);
// Whether linear() quantizes the activations in the FP4 decode kernel's permuted K order (GemmParams::a_perm_k):
// FINEGEMM_FP4_DECODE_PERM=1 (off until measured on the GPU) and a dense FP4 call that kernel serves with the fold:
// M ≤ 64, K % 128 == 0, UE8M0 byte or packed scales, one activation scale per 128 of K. p: weights, their scales and
// the activation group set (the activations themselves not yet). launch_sm90_fp8_gemm then takes that kernel.
bool fp4_decode_perm_wanted(const GemmParams& p);
// The recipe side of it (no switches): what the permuted kernel serves, dense (M ≤ 64, no row weight) or grouped (MoE
// experts on the decode path, moe_decode_perm_wanted); launch_sm90_fp4_decode refuses anything else.
bool fp4_decode_perm_ok(const GemmParams& p, bool grouped);

// How many decode launches finished their split-K in the kernel (tests check that the switch took effect), and the
// count's increment (the launchers, once per launch that takes it).
long long decode_split_finishes();
// FP4 decode launches (dense and grouped) on permuted activations (GemmParams::a_perm_k), and those with 128-token
// tiles, for tests.
long long fp4_decode_perm_launches();
// Dense FP4 decode launches with the pipelined consumers (FINEGEMM_FP4_DECODE_PIPE=1; tests).
long long fp4_decode_pipe_launches();
long long fp4_decode_perm_wide_launches();
// Dense FP4 decode launches that took prepared fold words (FINEGEMM_FP4_DECODE_FOLD_CACHE=1).
long long fp4_decode_fold_cache_launches();
// Frees every prepared fold word allocation (tests: a new weight may take a freed one's address).
void fp4_decode_fold_cache_clear();
// FINEGEMM_FP4_DECODE_FOLD_CACHE: 0 off (unset), 1 prepared words with the preparer warp idle, 2 without it; anything
// else is an error naming the variable.
int fp4_decode_fold_cache_mode();
void count_split_finish();
// Tile counters for the split-K finish inside a decode kernel (split_finish_in_kernel): `count` ints, zero, for a call
// on `stream` (eager or captured; sm90_fp4_decode.cu says how they are shared), or nullptr: none left, or an eager
// call on cudaStreamPerThread (the reduce kernel then finishes the call).
int* claim_split_counters(int device, cudaStream_t stream, int64_t count);

// MoE experts at decode sizes: the decode kernel over the experts that groups.list names (rows per expert usually
// ≤ wn_rows; more run in chunks), p.m rows in all. The epilogue applies p's scales, bias and row weight per expert
// (Store to p.out); split-K partials are summed by splitk_reduce_kernel. Needs decode_kernel_kind(p) != None.
void launch_sm90_decode_grouped(const void* a, int64_t lda, const void* b, int64_t ldb, const DecodeGroups& groups,
                                int wn_rows, GemmParams p, cudaStream_t stream);

// Grouped GEMM (MoE experts), rows per expert read on the device (graph-capturable, no host sync).
struct GroupedLayout {
  const int32_t* offsets = nullptr;  // contiguous: [groups + 1] row offsets (device)
  const int32_t* counts = nullptr;   // masked: [groups] rows used of each group's max_rows (device)
  int max_rows = 0;                  // masked: rows per group in A and the output
  int num_groups = 0;
  int64_t expected_rows_per_group = 0;  // host estimate, for the tile heuristic
};
inline constexpr int kMaxGroupedExperts = 1024;

// The lean kernel's grouped mode (sm90_fp8_gemm_lean.cuh) for the Store GEMM of E4M3 experts with 128x128 block
// scales and 1x128 activation scales (any strides) or none, an expert bias (F32, BF16 or F16) or none, no column
// scale, plain B layout, any output type, the routing weights as p.row_weight: 128-, 192- or 256-row tiles.
// FINEGEMM_GROUPED_LEAN=128 / 192 / 256 takes it (off until measured on the GPU). The same bits as the general grouped
// kernel.
bool grouped_lean_ok(const GemmParams& p, int block_m, int num_groups, int device);
void launch_sm90_fp8_grouped_lean(const void* a, int64_t lda, const void* b, int64_t ldb, const GroupedLayout& layout,
                                  const GemmParams& p, int block_m, int device, cudaStream_t stream);
long long grouped_lean_launches();

// Stages of a lean kernel at block_m rows for num_kb K blocks (sm90_fp8_gemm_lean.cu).
int lean_stages(int block_m, int num_kb);

// The lean kernels with FP4 weights expanded by their producer warpgroup (sm90_fp8_gemm_lean.cuh, kFp4B;
// FINEGEMM_FP4_LEAN, off until measured on the GPU; sm90_fp8_gemm_lean_fp4.cu). `p` is the FP4 call: packed E2M1 B
// with MX 1x32 UE8M0 byte scales whose rows (and experts) are 4-byte aligned, the activations as the E4M3 lean kernel
// takes them (1x128 scales, or none: static or per-token), K % 128 == 0. `view` is the call's E4M3 view from the fold
// scan (Fp4Expansion::tile_params: the tiles' 2^emax as 128x128 block scales, gated on the scan's flags), `fp4` the
// original scales and the scan's exponents (Fp4Expansion::lean_view). Dense: 128-row tiles, 16-bit output through
// TMA stores (the dense lean kernel's epilogue). Grouped: the Store GEMM, 128-, 192- or 256-row tiles.
bool lean_fp4_ok(const GemmParams& p, int block_m, bool grouped, int num_groups, int device);
void launch_sm90_fp4_gemm_lean(const void* a, int64_t lda, const void* b, int64_t ldb, const GemmParams& view,
                               const LeanFp4B& fp4, int device, cudaStream_t stream);
void launch_sm90_fp4_grouped_lean(const void* a, int64_t lda, const void* b, int64_t ldb, const GroupedLayout& layout,
                                  const GemmParams& view, const LeanFp4B& fp4, int block_m, int device,
                                  cudaStream_t stream);
// The tile height FINEGEMM_FP4_LEAN asks for: unset, grouped calls from 64 to 255 rows per expert take 128 below 96
// rows and 192 from 96, the rest 0 (off); 0 off; dense calls take 128 for any other value; grouped calls take 128,
// 192 or 256 as given, and for 1 192 where the experts average 96 rows or more, else 128.
int fp4_lean_block_m(bool grouped, int64_t expected_rows_per_group);
// FINEGEMM_FP4_LEAN_EXPAND: the FP4 lean kernel's expansion: -1 unset (by height, fp4_lean_expand_for), 0 "serial",
// 1 "batched", 2 "split" (two producer warpgroups), 3 "consumers". Anything else throws, naming the variable and the
// value.
int fp4_lean_expand_mode();
// The expansion a launch takes under fp4_lean_expand_mode() == mode: mode itself where set, else the consumers (3) for
// grouped 128-row tiles and the batched producers (1) elsewhere.
int fp4_lean_expand_for(int mode, int block_m, bool grouped);
// FINEGEMM_FP4_LEAN_PACKED_ISSUER (an experiment, off): the producer thread that issues the grouped 192-row FP4 lean
// kernel's packed tile loads with the batched expansion and A scales (the DeepSeek-V3 FP4 experts' kernel from 96 rows
// per expert): unset or "0" thread 0 (which issues A's too), "32" warp 1's first thread. Other values throw, naming
// the switch. Other kernels ignore it.
int fp4_lean_packed_issuer();
// Launches of the kernel that FINEGEMM_FP4_LEAN_PACKED_ISSUER=32 selects, since the process started.
long long lean_fp4_packed_issuer_launches();
// FINEGEMM_FP4_LEAN_PACKED_PAIRS (an experiment, off): "1" loads the same kernel's packed weights two K blocks per
// copy (128 rows x 128 bytes) where the call's K blocks are even in number (the issuer's cost per copy, stop 54);
// unset or "0" one per K block. Other values throw, naming the switch. FINEGEMM_FP4_LEAN_PACKED_ISSUER=32 wins over it.
bool fp4_lean_packed_pairs();
// Launches of the kernel that FINEGEMM_FP4_LEAN_PACKED_PAIRS=1 selects, since the process started.
long long lean_fp4_packed_pairs_launches();
// FINEGEMM_FP4_LEAN_ISSUER (an experiment, off): in the same kernel, where thread 0 issues A's and the packed copies on
// top of its row's expansion (stop 57's ring trace): "light" (1) has its warp expand one MX group per lane and the
// other three producer warps five; "rotate" (2) has warp i % 4's first thread issue K block i's copies; unset or "0"
// (0) thread 0 issues them all. Other values throw, naming the switch. The packed-copy experiments above win over it.
int fp4_lean_issuer_share();
// Launches of the kernels that FINEGEMM_FP4_LEAN_ISSUER selects, since the process started.
long long lean_fp4_issuer_share_launches();
// How many FP4 lean launches this process has made (dense and grouped; tests check that the switch took them).
long long lean_fp4_launches();

// a [p.m, K] E4M3 (all groups' rows), b [groups · p.n, K] E4M3. kEpilogue Store writes p.out [p.m, p.n];
// ActRequant writes p.out_q / p.out_q_scale (b_layout and act fields of p say how).
void launch_sm90_fp8_grouped_gemm(const void* a, int64_t lda, const void* b, int64_t ldb, const GroupedLayout& layout,
                                  Epilogue epilogue, GemmParams params, cudaStream_t stream);

}  // namespace finegemm::cuda
