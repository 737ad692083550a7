// Arguments of the sm_90 FP8 GEMM family, shared by host and device code.
#pragma once
#include <cstdint>

namespace finegemm::cuda {

enum class ScaleFmt : int { F32 = 0, UE8M0 = 1, UE8M0_PACKED = 2 };
enum class OutDType : int { F32 = 0, BF16 = 1, F16 = 2 };
enum class VecMode : int { None = 0, PerIndex = 1, Scalar = 2 };  // epilogue row/col scale, bias

// How a tile's B rows map to its columns.
enum class BLayout : int {
  Plain = 0,        // tile columns are consecutive B rows
  GateUpHalves = 1, // first half of the tile: gate rows [0, I); second half: the same rows of up, [I, 2I)
  Interleaved = 2,  // consecutive B rows, gate = even, up = odd (GPT-OSS native)
};

// Epilogue kinds (template parameter of the kernel).
enum class Epilogue : int {
  Store = 0,       // y = scales · acc + bias (· row_weight), stored as F32/BF16/F16 (or split-K partials)
  ActRequant = 1,  // h = act(gate, up) from the tile's own columns, requantized to E4M3 with its scales
};

// y[m, n] = row_scale[m] · col_scale[n] · Σ_kb (a_scale[m, kb] · b_scale[n, kb] · Σ_{k in kb} A[m,k]·B[n,k]) + bias[n]
struct GemmParams {
  int m = 0, n = 0, k = 0;  // m: rows of A (all groups); n: B rows per group (the output columns of Store)
  bool b_fp4 = false;       // host-side choice: B is packed E2M1 [rows, K/2] (kernels expand it to E4M3 in smem)

  // Promotion (K-granular scales), applied every `promote_k` elements of K (32, 64 or 128).
  int promote_k = 128;
  // Two consumer warpgroups issue their wgmma in turn (see sm90_fp8_gemm.cuh); FINEGEMM_GEMM_PINGPONG=0 turns it off.
  bool pingpong = true;
  // Three consumer warpgroups (192-row tiles) issue their wgmma groups in turn, in a ring of named barriers 1..3
  // (FINEGEMM_GEMM_ROTATE_ISSUE=1; off: slower on the H200 at stop 28). Not with skip_idle's idle-warpgroup loop.
  bool rotate_issue = false;
  // The scale loader warps load one B scale per 8-column chunk where the scale blocks allow it (the consumers read
  // only each chunk's first column), not one per column. On unless FINEGEMM_GEMM_CHUNK_SCALES=0.
  bool chunk_scales = true;
  // The Store epilogue's lean loop for outputs without column scale or bias (sm90_fp8_gemm.cuh). On unless
  // FINEGEMM_GEMM_LEAN_EPILOGUE=0.
  bool lean_epilogue = true;
  // The lean loop's stores 16 bytes wide: each quad of lanes transposes its four 8-column chunks by shuffles, so that
  // a lane writes eight consecutive columns (one store per chunk group and row, whole 32-byte sectors) where it wrote
  // two. Same values. Set by apply_env_switches where FINEGEMM_GEMM_WIDE_STORES=1 and the output allows it (16-byte
  // aligned rows, N a multiple of 8). Dense on, grouped off (gemm_launch.cuh).
  bool wide_stores = false;
  // With 128-wide promotion and the B scales in registers: a consumer warp releases the stage as soon as its wgmma
  // group has completed, before the promotion's FMAs (the stage's shared memory is no longer read by then), so that
  // the producer refills it ~100-200 cycles sooner. FINEGEMM_GEMM_EARLY_RELEASE=1; off until measured on the H200.
  bool early_release = false;
  // Every consumer thread arrives on its CTA's empty barrier (128 per warpgroup and stage), not lane 0 of each warp
  // after __syncwarp (4): the order racecheck can follow (stop 27's ring probe: clean with one arrival per thread,
  // 31248 hazards reported with one per warp). Peers of a cluster still get one arrival per warp.
  // On by default since stop 32 (the same speed as one per warp on the H200; racecheck clean on the cluster kernels);
  // FINEGEMM_GEMM_THREAD_RELEASE=0 restores one arrival per warp.
  bool thread_release = true;
  // The TMA thread also requests B's tile `l2_prefetch` K blocks ahead of the one it loads into L2
  // (cp.async.bulk.prefetch.tensor; across tile ends in the scheduler's order), so that the ring's loads find the
  // weights in L2 where they would wait for DRAM: a one-wave GEMM (M = 512) runs ~535 ns per K block with ~4 stages in
  // flight, i.e. ~2 us per load. The dense decode kernel likewise requests its weight tile D stages ahead. 0: off.
  // FINEGEMM_GEMM_L2_PREFETCH=D (E4M3 B in the GEMM, any weights in decode; off: slower everywhere on the H200 at
  // stop 29, e.g. M = 512 N = 4096 K = 7168 31.6 -> 35.7 us at D = 4).
  int l2_prefetch = 0;
  // B's tile by one TMA copy of BLOCK_N rows instead of two of BLOCK_N / 2 (the gate and up halves' scheme), where a
  // CTA loads its whole B tile from consecutive rows (plain layout, E4M3, no B multicast): the tensor map's box is
  // then BLOCK_N rows (set by the launcher with it). Stop 29: requesting two more tiles per stage into L2 (l2_prefetch)
  // cost 10-15% where the data was already in L2, as if the copies' count, not their bytes, were the price; one copy
  // fewer measured 1.5-5% faster (M = 512 N = 7168 K = 16384 132.1 -> 125.6 us, N = 4096 K = 7168 32.1 -> 30.8;
  // M = 4096 N = 4096 K = 7168 231.9 -> 223.5; the DeepSeek-V3 MoE layer at T = 4096 4936 -> 4836). On by default
  // since stop 29; FINEGEMM_GEMM_B_ONE_BOX=0 turns it off.
  bool b_box_full = false;
  // A scales copied per stage by the TMA thread (cp.async.bulk of the tile's rows, one contiguous run of M-major scales
  // [K/128][a_scale_stride_k]) instead of gathered row by row by the scale-loader warps, which then stage the B scales
  // only: cuBLASLt's kernel reads its A scales as one 512-byte block per stage (stop 26). Set by
  // launch_sm90_fp8_gemm where the scales allow it (a_scale_bulk_ok; on by default since stop 27, 4-8% at M = 4096;
  // FINEGEMM_GEMM_SCALE_BULK=0 turns it off). linear() has its quantizer write the scales M-major, and takes M-major
  // scales of a pre-quantized x as they come.
  bool a_scale_bulk = false;
  // The A scales' rows up to M rounded up to 4 are readable in every group (linear()'s own M-major buffer, whose
  // padding rows the quantizer fills); without it the bulk copy needs M % 4 == 0 (a caller's tensor may end at row M).
  bool a_scale_padded = false;
  // A tile with one B scale (block 128 B scales on a 128-wide tile) runs a K loop compiled for that case, so that no
  // K block tests which promotion variant applies (sm90_fp8_gemm.cuh, promoted_k_loop); 192-wide tiles likewise for
  // their two-scale patterns. On by default since stop 27 (5-7% at M = 4096); FINEGEMM_GEMM_HOIST_SPLIT=0 turns it off.
  bool hoist_split = true;
  // Single-accumulator K loops with 128-wide promotion (192x128, 64-row tiles, the one-set 128x128 kernels; not the
  // kernels that also hold a two-accumulator loop, where the added loop made ptxas serialise the wgmma, nor 128x192,
  // which it made spill):
  // the wait for K block kb's stage comes before the wait for kb-1's wgmma group, whose promotion then runs right
  // before kb's issue (cuBLASLt's order), in straight-line runs of four K blocks (sm90_fp8_gemm.cuh). Stop 34's trace
  // (scripts/gemm-trace) had a consumer warpgroup's own chain per K block (stage wait, issue, group wait, promotion,
  // release) at twice the tensor work it feeds. -1 (the default since stop 34): 192-row tiles only (three consumer
  // warpgroups: 2-4% faster at M = 4096, e.g. N = 7168 K = 16384 872 -> 843 us, N = 24576 K = 1536 289 -> 281); 1
  // (FINEGEMM_GEMM_LOOKAHEAD=1): every kernel it serves (64-row tiles measured 5-13% slower at short K; 128x192, at
  // M = 128 N = 24576 K = 1536 15.9 -> 20.5 us, no longer compiles it); 0 (=0): none.
  int lookahead = -1;
  // Dense 128x128 tiles (alone, in pairs sharing B, and the TMA-store kernel) from kernels compiled with one
  // accumulator set only (kOneAcc), which take the lookahead by default (unless FINEGEMM_GEMM_LOOKAHEAD=0), with
  // pingpong issue: cuBLASLt's loop. FINEGEMM_GEMM_ONE_ACC=1 (off; written at stop 34, not yet run on the H200).
  bool one_acc = false;
  // With lookahead: K block kb-1's stage is released after kb's issue instead of before it, off the warpgroup's
  // chain (the cluster kernels' remote arrival cost ~100 cycles there). FINEGEMM_GEMM_DEFER_RELEASE=1 (off).
  bool defer_release = false;
  // FINEGEMM_GEMM_TRACE builds only (sm90_fp8_gemm.cuh): per-K-block clock stamps of CTA 0's consumer warpgroups and
  // TMA thread, written here by the launcher's trace hook (gemm_launch.cuh). Null otherwise.
  uint32_t* trace = nullptr;
  // Warpgroups whose rows all lie past a tile's end skip its wgmma (not with pingpong ordering).
  bool skip_idle = true;
  // The lean kernels (FINEGEMM_LEAN_SCALE_PREFETCH=1, stop 59, off until measured): the thread that issues a tile's
  // copies requests into L2, by one bulk prefetch each, the tile's FP4 B scale words (kFp4B) and its rows' A scales
  // (grouped, row-major), ahead of the threads that load them one K block at a time (lean_prefetch_scales).
  bool lean_scale_prefetch = false;
  // Host side only (RunOptions::weights_constant, MoE calls): the caller promises B and its scales never change, so
  // the FP4 lean kernels' fold scan is kept per weight (fp4_scan_kept).
  bool weights_constant = false;
  // 128-wide promotion in 128x64 / 128x128 tiles: two accumulator sets, the wgmma of the next K block running while
  // the previous one is promoted (sm90_fp8_gemm.cuh). On (FINEGEMM_GEMM_DOUBLE_ACC=0 turns it off); dense 128x64
  // tiles take it only with FINEGEMM_GEMM_DOUBLE_ACC=1 (gemm_launch.cuh has the measurements).
  bool double_acc = true;
  // Its K blocks in runs of 8 (FINEGEMM_GEMM_DOUBLE_RUN=8: one block in eight promoted without a wgmma running) or 4.
  int double_acc_run = 4;
  // FP4 B: the loader warps expand four items per lane per round, all loads before any store
  // (FINEGEMM_FP4_BATCHED_EXPAND=1; off until run on the H200).
  bool fp4_batched_expand = false;
  // The lean kernel's TMA-store epilogue without a row scale (row_mode None): one FADD per value (v + 0, the same bits
  // as (v · 1 + 0) · 1) instead of three operations; FINEGEMM_GEMM_LEAN_UNIT_EPILOGUE=0 turns it off (comparisons).
  bool lean_unit_epilogue = true;
  // The decode kernel (sm90_fp4_decode.cuh): every consumer thread releases a stage itself (128 arrivals), not one
  // lane per warp after __syncwarp (4); FINEGEMM_DECODE_THREAD_RELEASE=0 turns it off (comparisons).
  bool decode_thread_release = true;
  // The decode kernel with FP4 weights: no preparer warp; the consumers decode the weight scales themselves and run
  // every 32 of K as its own wgmma, promoted with its group's scale (FINEGEMM_FP4_DECODE_DIRECT=1; off until measured).
  bool fp4_decode_direct = false;
  // The decode kernel with FP4 weights and UE8M0 scales: per (row, 128 of K) words prepared once per weight
  // (fp4_fold_words_kernel, FINEGEMM_FP4_DECODE_FOLD_CACHE=1, off until measured): where the row's 64-row tile folds,
  // the four groups' distances e_max - e (4 bits each, bits 0-15) and e_max (bits 16-23); elsewhere the row's scale
  // word as stored. fp4_fold_flags: per (64-row tile, 128 of K) whether the tile folds. The loader copies them in
  // place of the scale words and the flags, and no preparer warp runs. [n][fp4_fold_blocks] and [tiles][blocks].
  const uint32_t* fp4_fold_words = nullptr;
  const uint32_t* fp4_fold_flags = nullptr;
  int fp4_fold_blocks = 0;
  // The decode kernel's loader requests the weight tiles of this many consecutive stages back to back (it waits for
  // all of their slots first), so that each weight row's adjacent K chunks reach DRAM together
  // (FINEGEMM_DECODE_LOAD_BATCH=2 or 3; 1 = one stage at a time; a batch that does not divide the ring's stage count
  // runs as 1).
  int decode_load_batch = 1;
  // Programmatic dependent launch (FINEGEMM_PDL; on for E4M3 weights and on the MoE decode path, off for dense FP4
  // weights, as measured on the H200: launch_sm90_fp8_gemm): the dense decode kernel was launched with
  // programmatic stream serialization, so its loader streams the first stages' weights (which no earlier kernel
  // writes) before griddepcontrol.wait; everything else waits for the previous kernel (the activation quantization)
  // to complete. The split-K reduce is then launched the same way.
  bool pdl = false;
  // Grouped decode launches under pdl: the expert list, offsets and row weights were written before the previous
  // kernel started (the down GEMM, after the activation kernel), so the kernel reads them and requests its first
  // stages' weights before the wait. Without it a grouped kernel waits before reading anything.
  bool pdl_groups_ready = false;
  // Dense decode launches under pdl: the kernel ahead in the stream is finegemm's own activation quantization (linear()
  // launched it just before), which writes no weights, so the loader requests the first stages' weights before
  // griddepcontrol.wait. Without it (E4M3 activations: the kernel ahead is the caller's, and may have written the
  // weights, whose stores are visible only after the wait) the kernel still starts early, but loads nothing before it.
  bool pdl_weights_ready = false;
  // The dense decode kernel's split-K inside the kernel (FINEGEMM_DECODE_CLUSTER_REDUCE=1; off: correct and slower on
  // the H200, N = 4096 K = 7168 16.9 vs 14.0 µs at M = 1 and 28.4 vs 17.5 at M = 64, stop 20): the
  // split_k CTAs of a weight tile form one thread-block cluster, each leaves its partial totals in its shared memory,
  // and each sums one slice of the tile's rows over all of them (split order, as splitk_reduce_kernel) and stores y:
  // no workspace and no reduce kernel. Needs split_k <= 8 (a portable cluster).
  bool decode_cluster_reduce = false;
  // A gated launch: with `gate` set, the GEMM kernel and its split-K reduce run only when (*gate & gate_mask) ==
  // gate_value and otherwise exit at once. FP4 prefill launches three paths after the weight expansion
  // (launch_sm90_fp8_gemm) and the flags the expansion wrote on the device pick the one that runs: no host sync,
  // capturable.
  const int* gate = nullptr;
  int gate_mask = 0, gate_value = 0;
  // The gated launches chained programmatically (FINEGEMM_FP4_GATE_PDL=1, Fp4Expansion::launch_e4m3): a gated kernel
  // with gate_trigger lets the next gated launch start at once (griddepcontrol.launch_dependents at its top), and one
  // with gate_wait, launched with programmatic stream serialization, waits for the kernel ahead (griddepcontrol.wait)
  // before it reads its gate or anything else. So a launch that exits at its gate exits while the GEMM ahead still
  // runs (on SMs that GEMM has left) and completes only after it: the stream's next kernel still sees the GEMM's
  // output, without relying on more than griddepcontrol.wait's guarantee.
  bool gate_trigger = false, gate_wait = false;
  const float* a_scale = nullptr;  // per (row, K group); nullptr: 1
  int64_t a_scale_stride_m = 0, a_scale_stride_k = 0;
  int a_group = 128;
  int a_scale_cols = 1;  // groups along K (the last one is clamped to for the zero-filled K tail)
  const void* b_scale = nullptr;  // per (block row, K block); nullptr: 1
  ScaleFmt b_scale_fmt = ScaleFmt::F32;
  int64_t b_scale_stride_n = 0;  // elements (F32/UE8M0) or int32 words (packed) per scale row
  int b_block_n = 128, b_block_k = 128;
  int b_scale_cols = 0;  // scales along K (unpacked count)

  // Groups (MoE experts): B is [groups · n, K]; scales and vectors move by these strides per group.
  int64_t b_scale_group_stride = 0;   // scale elements (or packed words) per group
  int64_t row_scale_group_stride = 0; // Scalar row scale: offset per group (static per-expert activation scale)
  int64_t col_group_stride = 0;       // per-channel col_scale / per-tensor col scale: offset per group
  int64_t bias_group_stride = 0;      // bias: offset per group
  BLayout b_layout = BLayout::Plain;
  int gate_up_split = 0;              // GateUpHalves: first row of up (I)

  // Epilogue (Store).
  VecMode row_mode = VecMode::None;
  const float* row_scale = nullptr;
  VecMode col_mode = VecMode::None;
  const float* col_scale = nullptr;
  int bias_dtype = -1;  // -1 none, else OutDType numbering
  const void* bias = nullptr;
  const float* row_weight = nullptr;  // optional per-row multiplier after the bias (MoE routing weights)
  OutDType out_dtype = OutDType::BF16;
  void* out = nullptr;
  int64_t ldo = 0;

  // Epilogue (ActRequant): h [m, I] E4M3 with scales, I = output columns.
  int act_kind = 0;  // MoeActivation numbering: 0 SwiGLU, 1 SwiGLUOai, 2 Silu, 3 Gelu, 4 Relu2
  float swiglu_limit = 0.0f, swiglu_alpha = 1.702f;
  int requant_group = 128;            // dynamic group along I; 0: static per-group scale
  bool requant_pow2 = false;
  const float* requant_static = nullptr;  // [groups]: static scale of each group (expert)
  uint8_t* out_q = nullptr;
  float* out_q_scale = nullptr;       // [m, I / requant_group]
  int64_t ld_q = 0, ld_q_scale = 0;
  int out_cols = 0;                   // I

  // Split-K: partial sums (promotion applied, epilogue not) go to workspace[split][m][n].
  float* workspace = nullptr;

  // A (E4M3 activations) holds each 128 of K permuted for the FP4 decode kernel (fp4_perm_k_logical: thread t's
  // columns of a block's four steps are MX group t's codes, one 16-byte chunk per row): no preparer warp, the
  // consumers fold each row block themselves (FINEGEMM_FP4_DECODE_PERM=1, linear() quantizes the activations so;
  // off until measured). Only the decode kernel reads such A. (Last, so that the fields before keep their offsets.)
  bool a_perm_k = false;
};

// The FP4 weights' view the lean kernels with FP4 weights (sm90_fp8_gemm_lean.cuh, kFp4B) read beside GemmParams (whose B scales are the scan's tile scales):
// the original UE8M0 bytes (expert g's row r, group q at scale + g · group_stride + r · stride_n + q; rows and experts
// 4-byte aligned), and the scan's largest exponent per 128x128 tile ([experts · tiles_per_group, blocks]).
// The FP4 lean kernel's ring trace (FINEGEMM_FP4_LEAN_TRACE_FILE, diagnostics; the kRingTrace build of the grouped
// 192-row kernel): per CTA and K block item (the CTA's K blocks in order, pad stages not counted), clock64 at
// stamps kRingStamp*. Every stamp is taken by one thread: producer thread 0 (which also issues the TMA loads), the
// producer warpgroup's last thread, consumer thread 0 (warpgroup 0, never idle) and warpgroup 2's thread 0.
inline constexpr int kLeanRingItems = 160;
inline constexpr int kLeanRingStamps = 14;
enum LeanRingStamp : int {
  kRingP0EmptyWait = 0,   // producer 0: before the stage's empty wait
  kRingP0Free = 1,        // producer 0: the stage is free (after the wait)
  kRingP0Issued = 2,      // producer 0: A's TMA and the next packed tile issued, the next scale words requested
  kRingP0Packed = 3,      // producer 0: its packed tile has landed (after the wait)
  kRingP0Arrive = 4,      // producer 0: its row expanded, before its full arrival
  kRingPLastArrive = 5,   // the last producer thread, before its full arrival
  kRingC0FullWait = 6,    // consumer 0: before the stage's full wait
  kRingC0Full = 7,        // consumer 0: the stage is full
  kRingC0Release = 8,     // consumer 0: its wgmma done, the stage released
  kRingC2Full = 9,        // warpgroup 2's thread 0: the stage is full (idle or not)
  kRingP0AIssued = 10,    // producer 0: after A's TMA
  kRingP0PackedIssued = 11,  // producer 0: after issue_packed (the next packed tile's TMA)
  kRingP0PackedFree = 12,    // producer 0, in issue_packed: the packed slot is free (after its empty wait)
  kRingP0PackedRow = 13,     // producer 0, in issue_packed: past the tile's B row lookup (tile_of, once per tile)
};
struct LeanRingStamps {
  unsigned long long t[kLeanRingStamps];
};

struct LeanFp4B {
  const uint8_t* scale = nullptr;
  int64_t scale_stride_n = 0, scale_group_stride = 0;
  const int* tile_emax = nullptr;
  int tiles_per_group = 0, blocks = 0;
  LeanRingStamps* ring_trace = nullptr;  // the kRingTrace build only
};

// The dense lean kernel's stream-K tail (sm90_fp8_gemm_lean.cuh, kStreamK): tiles [0, dp_tiles) run whole, round
// robin; the K blocks of the others, laid end to end, are split into gridDim.x equal contiguous ranges, one per CTA.
// partials: gridDim.x slots of BLOCK_M x 128 floats (the CTA's one unfinished tile, in fragment order); flags:
// gridDim.x ints, zero when the launch starts and when it ends (claim_split_counters).
// trace (FINEGEMM_GEMM_LEAN_TRACE_FILE, diagnostics): consumer thread 0 of each CTA stamps its first kLeanTraceItems
// items (LeanTrace), or nullptr.
inline constexpr int kLeanTraceItems = 8;
inline constexpr int kLeanTraceStamps = 6;
struct LeanTrace {
  // Per CTA and item: the item (t, kb0, kb1) and, each as %globaltimer (ns) then clock64, at the item's start, after
  // its B scales, after its K loop, after the partial's store (a tile left to its owner) or the owner's last flag,
  // after the partials' adds, and at its end.
  int item[3];
  int pad;
  unsigned long long stamp[kLeanTraceStamps][2];
};
struct LeanStreamK {
  int dp_tiles = 0;
  float* partials = nullptr;
  int* flags = nullptr;
  LeanTrace* trace = nullptr;
};

// The decode kernel (sm90_fp4_decode.cuh) over groups (MoE experts at decode sizes): one CTA per (slot, 64-row weight
// tile, K split); slot s < *list_count takes expert list[s] (moe_active_experts_kernel lists the experts with rows),
// the CTAs of the other slots exit. The expert's rows are [offsets[e], offsets[e+1]) of A and of the output; its
// weights are rows [e·n, (e+1)·n) of B. slots == 0: no groups (a dense linear, rows [0, m)).
struct DecodeGroups {
  const int32_t* list = nullptr;
  const int32_t* list_count = nullptr;
  const int32_t* offsets = nullptr;
  int slots = 0;
  int num_groups = 1;  // host side: B holds num_groups · n rows
};

}  // namespace finegemm::cuda
