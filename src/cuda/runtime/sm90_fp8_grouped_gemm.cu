// Host side of the grouped (MoE) GEMM: the GroupedScheduler over per-expert row ranges read on the device.
// NOTE: its own translation unit so that the dense and grouped kernels compile in parallel.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

#include "cuda/runtime/fp4_expand.hpp"
#include "cuda/runtime/gemm_launch.cuh"
#include "cuda/runtime/sm90_fp8_gemm.hpp"

namespace finegemm::cuda {
namespace {

// kSharedA: 2-CTA clusters over adjacent column blocks of one expert's rows, A multicast (the dense "c2a";
// FINEGEMM_GROUPED_CLUSTER=1): the scheduler counts column-block pairs and `grid` counts clusters.
// kTmaStore: the TMA-store epilogue (tma_store_output_ok; one stage fewer, tma_out over y), where a warpgroup's rows
// stay inside its expert's (the kernel falls back to the lean store where they run into the next expert's).
template <int BLOCK_M, int BLOCK_N, int kStages, Epilogue kEpilogue, bool kSharedA = false, bool kTmaStore = false>
void launch_grouped_config(const CUtensorMap& a, const CUtensorMap& b, const GemmParams& p, const GroupedLayout& layout,
                           int grid, cudaStream_t stream, const CUtensorMap& tma_out = CUtensorMap{}) {
  GroupedScheduler<BLOCK_M, kMaxGroupedExperts> sched;
  sched.offsets = layout.offsets;
  sched.counts = layout.counts;
  sched.max_rows = layout.max_rows;
  sched.num_groups = layout.num_groups;
  const int tile_cols = kEpilogue == Epilogue::ActRequant && p.b_layout != BLayout::Plain ? BLOCK_N / 2 : BLOCK_N;
  sched.num_n_blocks = ceil_div(kEpilogue == Epilogue::ActRequant ? p.out_cols : p.n, (kSharedA ? 2 : 1) * tile_cols);
  sched.num_k_blocks = ceil_div(p.k, kGemmBlockK);
  // FINEGEMM_GROUPED_ORDER=n: each expert's tiles n-block major (GroupedScheduler; not yet measured on the GPU).
  if (const char* order = std::getenv("FINEGEMM_GROUPED_ORDER"); order && *order) {
    if (std::strcmp(order, "m") != 0 && std::strcmp(order, "n") != 0)
      throw Error(std::string("FINEGEMM_GROUPED_ORDER: expected m or n, got '") + order + "'");
    sched.n_major = *order == 'n';
  }
  const bool promote = p.a_scale != nullptr || p.b_scale != nullptr || fp32_accum_wanted(p.k, /*grouped=*/true);
  if constexpr (BLOCK_M == 192) {
    // Three consumer warpgroups: E4M3 experts with 128-wide promotion or none (the host picks 192 only for those).
    if (p.b_fp4 || (promote && p.promote_k % 128 != 0))
      throw Error(ErrorKind::Runtime, "grouped gemm: 192-row tiles take E4M3 experts with 128-wide promotion or none");
    using S = decltype(sched);
    if constexpr (kTmaStore) {
      return launch_kernel<BLOCK_M, BLOCK_N, kStages, 128, kEpilogue, S, false, 1, false, true>(a, b, p, sched, grid,
                                                                                             stream, tma_out);
    } else if constexpr (kSharedA) {
      if (!promote) return launch_kernel<BLOCK_M, BLOCK_N, kStages, 0, kEpilogue, S, false, 2, true>(a, b, p, sched, grid, stream);
      return launch_kernel<BLOCK_M, BLOCK_N, kStages, 128, kEpilogue, S, false, 2, true>(a, b, p, sched, grid, stream);
    } else {
      if (!promote) return launch_kernel<BLOCK_M, BLOCK_N, kStages, 0, kEpilogue>(a, b, p, sched, grid, stream);
      return launch_kernel<BLOCK_M, BLOCK_N, kStages, 128, kEpilogue>(a, b, p, sched, grid, stream);
    }
  } else {
    static_assert(!kSharedA, "grouped 2-CTA clusters: 192-row tiles only");
    if constexpr (kTmaStore) {
      return launch_kernel<BLOCK_M, BLOCK_N, kStages, 128, kEpilogue, decltype(sched), false, 1, false, true>(
          a, b, p, sched, grid, stream, tma_out);
    }
    if (p.b_fp4) {
      // FP4 experts: 32-wide promotion, fewer stages (the packed staging buffer shares the shared memory).
      constexpr int kFp4Stages = BLOCK_N == 256 ? 3 : (BLOCK_M == 128 ? 4 : 6);
      if (fp4_fold(p))  // one promotion per 128 where the K block's scales allow it
        return launch_kernel<BLOCK_M, BLOCK_N, kFp4Stages, 128, kEpilogue, decltype(sched), true>(a, b, p, sched, grid, stream);
      return launch_kernel<BLOCK_M, BLOCK_N, kFp4Stages, 32, kEpilogue, decltype(sched), true>(a, b, p, sched, grid, stream);
    }
    if (!promote) return launch_kernel<BLOCK_M, BLOCK_N, kStages, 0, kEpilogue>(a, b, p, sched, grid, stream);
    if (p.promote_k % 128 == 0) return launch_kernel<BLOCK_M, BLOCK_N, kStages, 128, kEpilogue>(a, b, p, sched, grid, stream);
    return launch_kernel<BLOCK_M, BLOCK_N, kStages, 32, kEpilogue>(a, b, p, sched, grid, stream);
  }
}

// The grouped lean kernel's tile height for the Store GEMMs, 0 for the general kernel. FINEGEMM_GROUPED_LEAN=0 / 128 /
// 192 / 256 forces it; unset, 192 from 256 rows per expert on average or from 96 where K or N >= 4096, 128 from 48
// to 95 at K >= 4096 (below). Measured
// (stop 52, H100, bench_cuda_moe, layer µs, three rounds each, general / lean 192 / lean 256): DeepSeek-V3 FP8 T =
// 16384 (512 rows per expert) 16.3-17.3k / 14.7-15.4k / 16.0-16.7k on the FP32, UE8M0 and static recipes; T = 8192 (256
// rows) 9.9-10.3k / 9.6-9.9k / 9.2-9.6k; Qwen3-30B-A3B T = 16384 (1024 rows) 2584-2629 / 2551-2564 / 2546-2592, T =
// 4096 (256 rows) 777-809 / 791-794 / 784-813. At stop 39 (H200) it was no faster at T = 2048 and 4096 (64 and 128 rows
// per expert). A setting of the general kernel's (FINEGEMM_GROUPED_BLOCK_M, _CLUSTER, _TMA_STORE, _ORDER) keeps the
// general kernel unless FINEGEMM_GROUPED_LEAN is set too.
// Stop 54 (H100, calls 1-2): at 64 rows per expert (DeepSeek-V3 T = 2048) 128-row lean tiles took the FP8 layer to
// 4582-4599 µs against the general kernel's 192-row tiles at 4798-4839 (stop 39 on the H200: 3557 against 3860); at
// 48 rows (T = 1536) 4363 / 4383 against 4608 / 4610, at 80 (T = 2560) 4793 / 4794 against 4902 / 4902; at 128 rows
// (T = 4096) they lost (6365-6438 against 5397-5419: half the experts need a second tile). Qwen3-30B-A3B at 64 rows
// (T = 1024, K = 2048 and 768) lost 1.8% (380.2 / 381.3 against 373.4 / 375.1 µs). Hence 128-row lean tiles from 48
// to 95 rows per expert, at K >= kGroupedLean128MinK.
// Stop 58 (H200, call 4, three interleaved rounds, layer µs and the GEMMs' TFLOP/s, default /
// FINEGEMM_GROUPED_LEAN=192): DeepSeek-V3 FP8 T = 3072 (96 rows per expert) 4328-4590 / 4132-4247 (499-500 / 523-530
// TFLOP/s), T = 4096 (128) 4786-4857 / 4538-4706 (591-592 / 627-628), T = 6144 (192) 7097-7450 / 6511-6885 (583-590 /
// 620-633); the UE8M0 and static recipes at T = 4096 598 / 626 -> 636 / 669 TFLOP/s. Qwen3-30B-A3B T = 2048 (128 rows,
// K = 2048 and 768) lost (408-411 / 423-428 µs). Under the H200's 700 W cap (call 1's ncu: the SM clock at 1.44-1.52
// GHz in the FP8 expert GEMMs) the lean tiles' fewer instructions per K block may count more than on the H100 (not
// measured there). Hence 192-row lean tiles from 96 rows per expert where K or N reaches kGroupedLean192MinKN: both of
// DeepSeek-V3's Store GEMMs (gate_up K = 7168, down N = 7168), the configuration measured, and neither of
// Qwen3-30B-A3B's.
constexpr int64_t kGroupedLean128From = 48, kGroupedLean128Below = 96;
constexpr int kGroupedLean128MinK = 4096;
constexpr int kGroupedLean192MinKN = 4096;

int grouped_lean_block_m(int64_t expected_rows_per_group, int k, int n) {
  const char* lean = std::getenv("FINEGEMM_GROUPED_LEAN");
  if (lean == nullptr || *lean == '\0') {
    for (const char* general : {"FINEGEMM_GROUPED_BLOCK_M", "FINEGEMM_GROUPED_CLUSTER", "FINEGEMM_GROUPED_TMA_STORE",
                                "FINEGEMM_GROUPED_ORDER"})
      if (const char* v = std::getenv(general); v != nullptr && *v != '\0') return 0;
    if (expected_rows_per_group >= 256) return 192;
    if (expected_rows_per_group >= kGroupedLean128Below && std::max(k, n) >= kGroupedLean192MinKN) return 192;
    return expected_rows_per_group >= kGroupedLean128From && expected_rows_per_group < kGroupedLean128Below &&
                   k >= kGroupedLean128MinK
               ? 128
               : 0;
  }
  const std::string v = lean;
  if (v != "0" && v != "128" && v != "192" && v != "256")
    throw Error("FINEGEMM_GROUPED_LEAN: expected 0 (off), 128, 192 or 256 (the tile height), got '" + v + "'");
  return std::stoi(v);
}

}  // namespace

void launch_sm90_fp8_grouped_gemm(const void* a, int64_t lda, const void* b, int64_t ldb, const GroupedLayout& layout,
                                  Epilogue epilogue, GemmParams p, cudaStream_t stream) {
  if (p.m == 0 || layout.num_groups == 0) return;
  apply_env_switches(p, /*grouped=*/true);
  if (layout.num_groups > kMaxGroupedExperts)
    throw Error("num_experts: the grouped GEMM takes at most " + std::to_string(kMaxGroupedExperts) + " experts, got " +
                std::to_string(layout.num_groups));
  // FP4 experts at prefill sizes, where switched on (fp4_expand_grouped_wanted): the touched experts' weights expanded
  // into E4M3 scratch (fp4_expand.hpp) and the E4M3 grouped GEMM, gated as in the dense case (launch_sm90_fp8_gemm).
  int device = 0;
  FG_CUDA_CHECK(cudaGetDevice(&device));
  // FINEGEMM_FP4_LEAN (by default from 64 to 255 rows per expert, fp4_lean_block_m): FP4 experts with byte UE8M0 scales in the Store GEMM through the
  // grouped lean kernel, which expands each packed K block in its producer warpgroup: no E4M3 scratch, each expert's
  // weights read packed. The fold scan, the lean kernel gated to run where every 128x128 tile folds, and the FP4
  // kernel below gated to run where one does not.
  // RunOptions::weights_constant or FINEGEMM_FP4_SCAN_CACHE=1: the scan kept for these weight scales (fp4_scan_kept),
  // made on the first call.
  std::optional<Fp4Expansion> scanned;
  const Fp4Expansion* scan = nullptr;
  if (const int fp4_lean_m = p.b_fp4 && epilogue == Epilogue::Store
                                 ? fp4_lean_block_m(true, layout.expected_rows_per_group)
                                 : 0;
      fp4_lean_m != 0 && lean_fp4_ok(p, fp4_lean_m, true, layout.num_groups, device)) {
    if (p.weights_constant || fp4_scan_cache_wanted()) scan = fp4_scan_kept(b, ldb, p, layout.num_groups, stream);
    if (scan == nullptr) {
      scanned.emplace(b, ldb, p, layout.num_groups, layout.offsets, layout.offsets ? nullptr : layout.counts, stream,
                      Fp4Expansion::Mode::ScanOnly);
      if (scanned->ready())
        scan = &*scanned;
      else
        scanned.reset();
    }
    if (scan != nullptr) {
      GemmParams view = scan->tile_params(p);
      view.workspace = nullptr;
      launch_sm90_fp4_grouped_lean(a, lda, b, ldb, layout, view, scan->lean_view(p), fp4_lean_m, device, stream);
      scan->gate_unfoldable(p);
    }
  }
  std::optional<Fp4Expansion> expanded;
  if (scan == nullptr && fp4_expand_grouped_wanted(p, layout.expected_rows_per_group)) {
    expanded.emplace(b, ldb, p, layout.num_groups, layout.offsets, layout.offsets ? nullptr : layout.counts, stream);
    if (!expanded->ready()) expanded.reset();  // no memory for the scratch: the FP4 kernel as it is
  }
  // With a fold, the FP4 kernel below runs too, gated to where some row block would not fold.
  if (expanded && !expanded->launch_e4m3(p, [&](const void* w, const GemmParams& q) {
        launch_sm90_fp8_grouped_gemm(a, lda, w, q.k, layout, epilogue, q, stream);
      }))
    return;
  const int num_sms = num_sms_of_device(device);
  // The lean kernel's grouped mode for the Store GEMMs where it serves the call (grouped_lean_ok), elsewhere the
  // general kernel below. By default 192-row tiles once the experts average 256 rows or more, or 96 where K or N >= 4096,
  // 128-row tiles from 48 to 95 rows at K >= 4096 (grouped_lean_block_m);
  // FINEGEMM_GROUPED_LEAN=0 turns it off, =128 / 192 / 256 takes that height at every size.
  if (const int lean_m = grouped_lean_block_m(layout.expected_rows_per_group, p.k, p.n);
      lean_m != 0 && epilogue == Epilogue::Store) {
    GemmParams q = p;
    q.workspace = nullptr;
    if (grouped_lean_ok(q, lean_m, layout.num_groups, device)) {
      launch_sm90_fp8_grouped_lean(a, lda, b, ldb, layout, q, lean_m, device, stream);
      return;
    }
  }
  // Tile height. 192-row tiles (three consumer warpgroups, an idle one skipping its wgmma) where they serve the call:
  // the Store epilogue, E4M3 experts, 128-wide promotion or none. They hold an expert of up to 192 rows in one tile,
  // so each expert's weights stream once where 128-row tiles would stream them twice for 129..256 rows. Measured on
  // the H200 (stop 25, bench_cuda_moe, layer µs, 64 / 128 / 192-row tiles): DeepSeek-V3 T=2048 (64 rows per expert)
  // 4319 / - / 3740, T=4096 7072 / 5427 / 4700; Qwen3-30B-A3B T=2048 508 / 457 / 407, T=4096 869 / 730 / 671.
  // Elsewhere 128-row tiles once experts average a full tile of rows (prefill), 64 below.
  const bool promote = p.a_scale != nullptr || p.b_scale != nullptr || fp32_accum_wanted(p.k, /*grouped=*/true);
  const bool fits_192 = epilogue == Epilogue::Store && !p.b_fp4 && (!promote || p.promote_k % 128 == 0);
  int block_m = fits_192 && layout.expected_rows_per_group >= 48 ? 192 : layout.expected_rows_per_group >= 96 ? 128 : 64;
  // FINEGEMM_GROUPED_BLOCK_M=64 / 128 / 192 forces the tile height (comparisons); 192 falls back to 128 where it does
  // not serve the call.
  if (const char* forced = std::getenv("FINEGEMM_GROUPED_BLOCK_M"); forced && *forced) {
    const int v = std::atoi(forced);
    if (v != 64 && v != 128 && v != 192)
      throw Error(std::string("FINEGEMM_GROUPED_BLOCK_M: expected 64, 128 or 192, got '") + forced + "'");
    block_m = v == 192 && !fits_192 ? 128 : v;
  }
  // The fused activation needs whole requantization groups (128 intermediate columns) in one tile: 256 B rows.
  const int block_n = epilogue == Epilogue::ActRequant ? 256 : 128;
  if (const char* print = std::getenv("FINEGEMM_PRINT_CONFIG"); print && *print == '1')
    std::fprintf(stderr, "finegemm: grouped gemm rows=%d N=%d K=%d experts=%d epilogue=%d -> %dx%d grid=%d\n", p.m, p.n,
                 p.k, layout.num_groups, static_cast<int>(epilogue), block_m, block_n, num_sms);
  // FINEGEMM_GROUPED_CLUSTER=1: 192-row tiles in 2-CTA clusters sharing A (not yet measured on the GPU; off).
  const bool shared_a = block_m == 192 && env_switch("FINEGEMM_GROUPED_CLUSTER", false);
  const CUtensorMap tma_a = make_tma_2d(a, p.m, p.k, lda, shared_a ? block_m / 2 : block_m);
  const int64_t b_rows = static_cast<int64_t>(layout.num_groups) * p.n;
  // GemmParams::b_box_full: one B copy per stage (plain layout: each expert's tile rows are consecutive).
  p.b_box_full = !p.b_fp4 && p.b_layout == BLayout::Plain && env_switch("FINEGEMM_GEMM_B_ONE_BOX", true);
  const CUtensorMap tma_b = p.b_fp4 ? make_tma_2d(b, b_rows, p.k / 2, ldb, block_n / 2, kGemmBlockK / 2)
                                    : make_tma_2d(b, b_rows, p.k, ldb, p.b_box_full ? block_n : block_n / 2);
  p.workspace = nullptr;
  // FINEGEMM_GROUPED_TMA_STORE=1 (an experiment, off): the TMA-store epilogue of the dense GEMMs (tma_store_ok's
  // conditions, 128-wide promotion) for 128- and 192-row Store tiles; the MoE down GEMM with BF16 y takes it.
  const bool tma_store = epilogue == Epilogue::Store && block_m >= 128 && !shared_a && promote && p.promote_k % 128 == 0 &&
                         !p.b_fp4 && env_switch("FINEGEMM_GROUPED_TMA_STORE", false) && tma_store_output_ok(p);
  if (tma_store) {
    const CUtensorMap tma_out = make_tma_2d(p.out, p.m, 2 * int64_t{p.n}, 2 * p.ldo, 64);
    if (block_m == 192)
      return launch_grouped_config<192, 128, 4, Epilogue::Store, false, true>(tma_a, tma_b, p, layout, num_sms, stream,
                                                                             tma_out);
    return launch_grouped_config<128, 128, 5, Epilogue::Store, false, true>(tma_a, tma_b, p, layout, num_sms, stream,
                                                                           tma_out);
  }
  if (epilogue == Epilogue::Store) {
    if (block_m == 64) return launch_grouped_config<64, 128, 8, Epilogue::Store>(tma_a, tma_b, p, layout, num_sms, stream);
    if (block_m == 192 && shared_a)
      return launch_grouped_config<192, 128, 5, Epilogue::Store, true>(tma_a, tma_b, p, layout, num_sms / 2, stream);
    if (block_m == 192) return launch_grouped_config<192, 128, 5, Epilogue::Store>(tma_a, tma_b, p, layout, num_sms, stream);
    return launch_grouped_config<128, 128, 6, Epilogue::Store>(tma_a, tma_b, p, layout, num_sms, stream);
  }
  if (block_m == 64) return launch_grouped_config<64, 256, 4, Epilogue::ActRequant>(tma_a, tma_b, p, layout, num_sms, stream);
  return launch_grouped_config<128, 256, 4, Epilogue::ActRequant>(tma_a, tma_b, p, layout, num_sms, stream);
}

}  // namespace finegemm::cuda
