// Host side of src/cuda/kernels/sm90_fp4_gemv.cuh: the FP4-weight GEMV for the smallest decode batches.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "cuda/kernels/sm90_fp4_gemv.cuh"
#include "cuda/runtime/gemm_args.hpp"
#include "cuda/runtime/gemm_launch.cuh"
#include "cuda/runtime/sm90_fp8_gemm.hpp"

namespace finegemm::cuda {
namespace {

template <int MT>
int gemv_ctas_per_sm(int device) {
  static std::atomic<int> cached[kMaxDevices] = {};
  const int slot = device < kMaxDevices ? device : 0;
  int ctas = cached[slot].load(std::memory_order_relaxed);
  if (ctas == 0 || device >= kMaxDevices) {
    FG_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, sm90_fp4_gemv_kernel<MT>, kGemvWarps * 32, 0));
    if (ctas <= 0) throw Error(ErrorKind::Runtime, "fp4 gemv: no CTA of the kernel fits on an SM");
    cached[slot].store(ctas);
  }
  return ctas;
}

int ctas_per_sm(int mt, int device) {
  switch (mt) {
    case 1: return gemv_ctas_per_sm<1>(device);
    case 2: return gemv_ctas_per_sm<2>(device);
    case 4: return gemv_ctas_per_sm<4>(device);
    default: return gemv_ctas_per_sm<8>(device);
  }
}

}  // namespace

int fp4_gemv_default_max_m() {
  // FINEGEMM_FP4_GEMV=1 takes the GEMV up to M = 64, =0 turns it off; otherwise it serves M ≤ this.
  return 0;
}

bool fp4_gemv_ok(const GemmParams& p, const void* a, int64_t lda, const void* b, int64_t ldb) {
  if (!p.b_fp4 || p.m < 1 || p.m > 64 || p.n < 1 || p.k < 32 || p.k % 32 != 0) return false;
  if (p.b_scale == nullptr || p.b_block_n != 1 || p.b_block_k != 32 || p.b_layout != BLayout::Plain) return false;
  if (p.row_weight != nullptr || p.gate != nullptr || p.b_scale_cols < p.k / 32) return false;
  // 8-byte activation reads, 16-byte weight copies, 4-byte UE8M0 words.
  if (reinterpret_cast<uintptr_t>(a) % 8 != 0 || lda % 8 != 0) return false;
  if (reinterpret_cast<uintptr_t>(b) % 16 != 0 || ldb % 16 != 0) return false;
  if (p.b_scale_fmt == ScaleFmt::UE8M0 &&
      (reinterpret_cast<uintptr_t>(p.b_scale) % 4 != 0 || p.b_scale_stride_n % 4 != 0))
    return false;
  return p.a_scale == nullptr || p.a_group % 32 == 0;
}

Fp4GemvConfig choose_fp4_gemv_config(int m, int n, int k, int num_sms, int device) {
  Fp4GemvConfig c;
  c.mt = m <= 8 ? 1 : (m <= 16 ? 2 : (m <= 32 ? 4 : 8));
  c.tiles = ceil_div(n, kGemvRows);
  const int steps = ceil_div(k, kGemvStepK);
  const int resident = std::max(1, ctas_per_sm(c.mt, device) * num_sms);
  // The fewest step-times: waves of CTAs × steps per warp (each warp streams one 16 x 128 weight block per step), with
  // fewer splits on a tie (each split writes M x N partials).
  int best = -1;
  for (int per_warp = 1; per_warp <= steps; ++per_warp) {
    const int split = ceil_div(steps, kGemvWarps * per_warp);
    const int per = ceil_div(steps, split * kGemvWarps);
    if (per != per_warp) continue;  // the same split as a smaller per_warp
    const int64_t waves = (int64_t{c.tiles} * split + resident - 1) / resident;
    const int cost = static_cast<int>(std::min<int64_t>(waves * per_warp, INT32_MAX));
    if (best < 0 || cost < best || (cost == best && split < c.split_k)) {
      best = cost;
      c.split_k = split;
      c.steps_per_warp = per_warp;
    }
  }
  if (const char* forced = std::getenv("FINEGEMM_FP4_DECODE_SPLIT"); forced && *forced) {
    const int v = std::atoi(forced);
    if (v < 1) throw Error(std::string("FINEGEMM_FP4_DECODE_SPLIT: expected a split count >= 1, got '") + forced + "'");
    c.steps_per_warp = ceil_div(steps, std::min(v, steps) * kGemvWarps);
    c.split_k = ceil_div(steps, c.steps_per_warp * kGemvWarps);
  }
  if (const char* print = std::getenv("FINEGEMM_PRINT_CONFIG"); print && *print == '1')
    std::fprintf(stderr, "finegemm: fp4 gemv M=%d N=%d K=%d -> MT=%d tiles=%d split_k=%d steps_per_warp=%d\n", m, n, k,
                 c.mt, c.tiles, c.split_k, c.steps_per_warp);
  return c;
}

void launch_sm90_fp4_gemv(const void* a, int64_t lda, const void* b, int64_t ldb, const GemmParams& p,
                          const Fp4GemvConfig& c, cudaStream_t stream) {
  if (p.workspace == nullptr) throw Error("fp4 gemv: needs the split-K workspace");
  const dim3 grid(static_cast<unsigned>(c.tiles), static_cast<unsigned>(c.split_k));
  const auto* x = static_cast<const uint8_t*>(a);
  const auto* w = static_cast<const uint8_t*>(b);
  switch (c.mt) {
    case 1: launch_programmatic(p.pdl, sm90_fp4_gemv_kernel<1>, grid, kGemvWarps * 32, 0, stream, x, lda, w, ldb, p, c.steps_per_warp); break;
    case 2: launch_programmatic(p.pdl, sm90_fp4_gemv_kernel<2>, grid, kGemvWarps * 32, 0, stream, x, lda, w, ldb, p, c.steps_per_warp); break;
    case 4: launch_programmatic(p.pdl, sm90_fp4_gemv_kernel<4>, grid, kGemvWarps * 32, 0, stream, x, lda, w, ldb, p, c.steps_per_warp); break;
    default: launch_programmatic(p.pdl, sm90_fp4_gemv_kernel<8>, grid, kGemvWarps * 32, 0, stream, x, lda, w, ldb, p, c.steps_per_warp); break;
  }
  FG_CUDA_CHECK(cudaGetLastError());
}

}  // namespace finegemm::cuda
