// FP4 weights expanded into E4M3 scratch for the E4M3 GEMM (src/cuda/kernels/fp4_expand_weights.cuh): the prefill
// path of dense FP4 layers (launch_sm90_fp8_gemm) and, where switched on, of FP4 experts (the grouped GEMM).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/kernels/gemm_params.cuh"
#include "cuda/runtime/gemm_args.hpp"

namespace finegemm::cuda {

class Fp4Expansion {
 public:
  // b: packed E2M1 [groups · p.n, K / 2], rows ldb bytes apart; p: the FP4 call (its MX 1x32 scales). offsets / counts
  // (a grouped layout's, on the device; null for a dense layer): experts without rows are not expanded. Everything
  // is enqueued on `stream`; the scratch is freed on it when this object goes. Without memory for the scratch
  // (groups · N · K bytes) nothing is enqueued and ready() is false: the caller runs the FP4 kernel as it is.
  // ScanOnly (byte UE8M0 scales; the lean kernels that expand in-kernel, FINEGEMM_FP4_LEAN): the fold scan alone,
  // no E4M3 scratch: tile_params, lean_view and gate_unfoldable serve the launches.
  // ScanKept: ScanOnly in memory of its own (cudaMalloc, freed by cudaFree when the object goes) rather than the
  // stream's scratch, for the scans kept per weight (fp4_scan_kept).
  enum class Mode { Expand, ScanOnly, ScanKept };
  Fp4Expansion(const void* b, int64_t ldb, const GemmParams& p, int groups, const int32_t* offsets,
               const int32_t* counts, cudaStream_t stream, Mode mode = Mode::Expand);
  ~Fp4Expansion();
  Fp4Expansion(const Fp4Expansion&) = delete;
  Fp4Expansion& operator=(const Fp4Expansion&) = delete;
  bool ready() const { return base_ != nullptr; }

  // Enqueues the E4M3 GEMM on the expanded weights ([groups · p.n, K], rows K bytes apart) through
  // gemm(weights, params). FP32 and packed scales do not fold: one launch with p's own scales (promotion every 32),
  // and false (the call is done). Byte UE8M0 scales fold: the launch with one scale per 128x128 tile and the one with
  // one scale per row and 128 of K, each gated on the scan's flags; p is gated to run only where some row block would
  // not fold, and true says the caller still launches the FP4 kernel with it.
  // ScanOnly: p's E4M3 view with one scale per 128x128 tile (2^emax), gated to run where every tile folds.
  GemmParams tile_params(const GemmParams& p) const { return e4m3_params(p, Path::Tile); }
  // ScanOnly: the original scales and the scan's largest exponents, for the lean kernels' producers.
  LeanFp4B lean_view(const GemmParams& p) const;
  // ScanOnly: p gated to run where some tile does not fold (the FP4 kernel, promoting every 32 where needed).
  void gate_unfoldable(GemmParams& p) const;

  // chain (dense calls under FINEGEMM_FP4_GATE_PDL=1, fp4_gate_pdl_wanted): the three gated launches chained by
  // programmatic dependent launch (GemmParams::gate_trigger / gate_wait), so that the two that exit at their gate do
  // so while the GEMM ahead of them runs.
  template <typename Gemm>
  bool launch_e4m3(GemmParams& p, Gemm&& gemm, bool chain = false) const {
    GemmParams tile = e4m3_params(p, Path::Tile);
    if (!fold_) {
      gemm(static_cast<const void*>(weights_), tile);
      return false;
    }
    GemmParams row = e4m3_params(p, Path::Row);
    gate_fp4(p);
    if (chain) {
      tile.gate_trigger = true;
      row.gate_wait = row.gate_trigger = true;
      p.gate_wait = true;
      count_gate_chain();
    }
    gemm(static_cast<const void*>(weights_), tile);
    gemm(static_cast<const void*>(weights_), row);
    return true;
  }

 private:
  enum class Path { Tile, Row };
  GemmParams e4m3_params(const GemmParams& p, Path path) const;
  void gate_fp4(GemmParams& p) const;
  static void count_gate_chain();

  cudaStream_t stream_;
  bool fold_ = false;
  bool kept_ = false;  // ScanKept
  int blocks_ = 0, tiles_ = 0;
  void* base_ = nullptr;        // the one scratch allocation
  uint8_t* weights_ = nullptr;  // Expand mode
  int* tile_emax_ = nullptr;
  float* row_scale_ = nullptr;
  float* tile_scale_ = nullptr;
  int* flags_ = nullptr;
};

// Dense FP4 calls expand at M ≥ FINEGEMM_FP4_EXPAND_M (default 256; 0: never). Grouped FP4 calls expand when the
// experts average at least FINEGEMM_FP4_EXPAND_GROUPED_ROWS rows (default 64; 0: never). Measured on the H200 (stop
// 25, DeepSeek-V3 FP4 experts, layer µs, in-kernel expansion -> expanded first): T=4096 (128 rows per expert) 13117 ->
// 12534, T=2048 (64 rows) 11762 -> 11053.
bool fp4_expand_wanted(const GemmParams& p);
// FINEGEMM_FP4_EXPAND_WIDE: 1 expands with fp4_expand_weights_wide_kernel (a warp per row and 128 groups of K, the
// row arithmetic once per warp), 2 also scans with fp4_fold_scan_wide_kernel (a CTA per tile and 8 K blocks; the lean
// kernels' scan-only calls too); 0 neither; unset (-1) the wide scan on the lean kernels' scan-only calls only (the
// default since stop 44: DeepSeek-V3 FP4 layer at T = 4096 8661 -> 8455 µs on an H100, stop 44 call 1; the dense
// expansion no faster with either mode: 201.1 / 202.1 / 202.4 µs at M = 4096 N = 4096 K = 7168). Anything else is an
// error naming the variable. 3 runs the fold scan and the expansion in one kernel (fp4_scan_expand_kernel), which is
// also the default (unset) for dense expansions since stop 51 (0 gives the two kernels back). The counters give the
// wide and fused kernels' launches (tests). Unset, grouped expansions and the lean kernels' scan-only calls scan along
// the scale rows (fp4_fold_scan_rows_kernel, stop 52; counted by fp4_scan_rows_launches); 0, 1 and 3 give them their
// earlier scans (the scan-only calls the tiles scan), 2 the wide scan.
int fp4_expand_wide_mode();
long long fp4_expand_wide_launches();
long long fp4_scan_wide_launches();
long long fp4_scan_rows_launches();
// FINEGEMM_FP4_SCAN_STAGED (stop 53): the fold scan with each tile's scales staged in shared memory by one bulk copy
// (fp4_fold_scan_staged_kernel) where the scales allow it (16-byte aligned rows, K a multiple of 512), in place of
// the scan along the scale rows; counted by fp4_scan_staged_launches. Unset (-1): for rows of 32 K blocks or more
// (H100 ncu, DeepSeek-V3 FP4 at T = 4096: gate_up, 56 blocks, 159.4 -> 114.2 µs; down, 16 blocks, 81.0 -> 102.1, so
// not there); 0 never; 1 wherever allowed. Anything else throws.
int fp4_scan_staged_mode();
bool fp4_scan_staged_for(int mode, int blocks);
long long fp4_scan_staged_launches();
long long fp4_expand_fused_launches();
// FINEGEMM_FP4_GATE_PDL=1: the dense FP4 prefill's gated launches chained programmatically (Fp4Expansion::launch_e4m3);
// off by default until measured. fp4_gate_chains() counts the chained calls (tests).
bool fp4_gate_pdl_wanted();
long long fp4_gate_chains();
bool fp4_expand_grouped_wanted(const GemmParams& p, int64_t expected_rows_per_group);

// FINEGEMM_FP4_SCAN_CACHE=1 (stop 59, off until measured): the FP4 lean kernels' grouped (MoE) calls take the fold
// scan of their weight scales from a scan kept per weight scale tensor (fp4_scan_kept) instead of scanning the
// experts' scales on every call (DeepSeek-V3's gate_up: 235 MB of scales, ~114 µs on an H100 at T = 4096). The switch
// is a promise, as FINEGEMM_FP4_DECODE_FOLD_CACHE's is: the weight scales at an address never change while the
// process runs (a weight freed and another of the same shape put at the same address would reuse the old scan).
// Anything but 0 or 1 throws, naming the variable.
bool fp4_scan_cache_wanted();
// The kept scan of every group's tiles for the call's weight scales (p: the FP4 call; groups: experts), made on the
// first eager call (enqueued on `stream`, which is then synchronized once so that any stream may read it) and kept for
// the process; nullptr where none can be made now (under stream capture nothing is enqueued into a graph; or no
// memory). It scans unrouted experts too, so a tile of such an expert that does not fold sends the call to the FP4
// kernel (the gate), as a routed one does.
const Fp4Expansion* fp4_scan_kept(const void* b, int64_t ldb, const GemmParams& p, int groups, cudaStream_t stream);
long long fp4_scan_cache_hits();    // calls served by a kept scan (tests)
long long fp4_scan_cache_scans();   // kept scans made
void fp4_scan_cache_clear();        // frees every kept scan (synchronizes the devices that hold one)

}  // namespace finegemm::cuda
