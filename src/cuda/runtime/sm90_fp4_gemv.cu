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

template <int MT, ScaleFmt kFmt>
int gemv_prepare(int device) {
  static std::atomic<int> cached[kMaxDevices] = {};
  const int slot = device < kMaxDevices ? device : 0;
  int ctas = cached[slot].load(std::memory_order_relaxed);
  if (ctas == 0 || device >= kMaxDevices) {
    FG_CUDA_CHECK(cudaFuncSetAttribute(sm90_fp4_gemv_kernel<MT, kFmt>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       kGemvSmemBytes<MT>));
    FG_CUDA_CHECK(cudaFuncSetAttribute(sm90_fp4_gemv_kernel<MT, kFmt, true>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, kGemvSmemBytes<MT>));
    FG_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, sm90_fp4_gemv_kernel<MT, kFmt>, kGemvWarps * 32,
                                                                kGemvSmemBytes<MT>));
    if (ctas <= 0) throw Error(ErrorKind::Runtime, "fp4 gemv: no CTA of the kernel fits on an SM");
    cached[slot].store(ctas);
  }
  return ctas;
}

template <int MT>
int gemv_prepare(ScaleFmt fmt, int device) {
  if (fmt == ScaleFmt::F32) return gemv_prepare<MT, ScaleFmt::F32>(device);
  if (fmt == ScaleFmt::UE8M0_PACKED) return gemv_prepare<MT, ScaleFmt::UE8M0_PACKED>(device);
  return gemv_prepare<MT, ScaleFmt::UE8M0>(device);
}

// Sets the kernel's shared-memory attribute once per device; returns the CTAs per SM it reaches.
int ctas_per_sm(int mt, ScaleFmt fmt, int device) {
  return mt == 1 ? gemv_prepare<1>(fmt, device) : gemv_prepare<2>(fmt, device);
}

template <int MT, ScaleFmt kFmt>
void gemv_launch(dim3 grid, const uint8_t* x, int64_t lda, const uint8_t* w, int64_t ldb, const GemmParams& p,
                 int steps_per_warp, int* split_counters, cudaStream_t stream) {
  const auto kernel = split_counters != nullptr ? sm90_fp4_gemv_kernel<MT, kFmt, true> : sm90_fp4_gemv_kernel<MT, kFmt>;
  launch_programmatic(p.pdl, kernel, grid, kGemvWarps * 32, kGemvSmemBytes<MT>, stream, x, lda, w, ldb, p,
                      steps_per_warp, split_counters);
}

template <int MT>
void gemv_launch(dim3 grid, const uint8_t* x, int64_t lda, const uint8_t* w, int64_t ldb, const GemmParams& p,
                 int steps_per_warp, int* split_counters, cudaStream_t stream) {
  if (p.b_scale_fmt == ScaleFmt::F32)
    gemv_launch<MT, ScaleFmt::F32>(grid, x, lda, w, ldb, p, steps_per_warp, split_counters, stream);
  else if (p.b_scale_fmt == ScaleFmt::UE8M0_PACKED)
    gemv_launch<MT, ScaleFmt::UE8M0_PACKED>(grid, x, lda, w, ldb, p, steps_per_warp, split_counters, stream);
  else gemv_launch<MT, ScaleFmt::UE8M0>(grid, x, lda, w, ldb, p, steps_per_warp, split_counters, stream);
}

}  // namespace

bool fp4_gemv_default(int m, int n) {
  // Measured on the H200 against the wgmma decode kernel (stop 30, graph replay, mxfp4-group128, same data): ahead at
  // N = 576 for M = 1..8 (K = 7168: 7.5 vs 8.5 us at M = 1, 7.4 vs 8.9 at M = 8; K = 2048: 5.0 vs 7.2, 4.6 vs 7.5);
  // mixed at N = 1024 (10.2 vs 9.3 at M = 1, 9.1 vs 9.5 at M = 8); behind from N = 1536 (N = 7168 K = 16384 M = 1:
  // 60.9 vs 37.0) and at M = 16. Small N is where its 16-row tiles give the grid CTAs the 64-row decode tiles do not.
  return m <= 8 && n <= 768;
}

bool fp4_gemv_ok(const GemmParams& p, const void* a, int64_t lda, const void* b, int64_t ldb) {
  if (!p.b_fp4 || p.m < 1 || p.m > 16 || p.n < 1 || p.k < 32 || p.k % 32 != 0) return false;
  if (p.b_scale == nullptr || p.b_block_n != 1 || p.b_block_k != 32 || p.b_layout != BLayout::Plain) return false;
  if (p.row_weight != nullptr || p.gate != nullptr || p.b_scale_cols < p.k / 32) return false;
  // 16-byte activation and weight copies, 4-byte scale copies.
  if (reinterpret_cast<uintptr_t>(a) % 16 != 0 || lda % 16 != 0) return false;
  if (reinterpret_cast<uintptr_t>(b) % 16 != 0 || ldb % 16 != 0) return false;
  if (p.b_scale_fmt == ScaleFmt::UE8M0 &&
      (reinterpret_cast<uintptr_t>(p.b_scale) % 4 != 0 || p.b_scale_stride_n % 4 != 0))
    return false;
  if (p.b_scale_fmt != ScaleFmt::UE8M0 && reinterpret_cast<uintptr_t>(p.b_scale) % 4 != 0) return false;
  if (p.a_scale != nullptr && reinterpret_cast<uintptr_t>(p.a_scale) % 4 != 0) return false;
  return p.a_scale == nullptr || p.a_group % 32 == 0;
}

Fp4GemvConfig choose_fp4_gemv_config(int m, int n, int k, ScaleFmt fmt, int num_sms, int device) {
  Fp4GemvConfig c;
  c.mt = m <= 8 ? 1 : 2;
  c.tiles = ceil_div(n, kGemvRows);
  const int steps = ceil_div(k, kGemvStepK);
  const int resident = std::max(1, ctas_per_sm(c.mt, fmt, device) * num_sms);
  // About four waves of CTAs (the last wave's idle SMs then cost ~1/8 of the time), each warp taking at least one
  // step: split = 4 · resident / tiles, rounded.
  const int want = std::max(1, static_cast<int>((4.0 * resident / c.tiles) + 0.5));
  c.steps_per_warp = ceil_div(steps, std::min(want, steps) * kGemvWarps);
  c.split_k = ceil_div(steps, c.steps_per_warp * kGemvWarps);
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

bool launch_sm90_fp4_gemv(const void* a, int64_t lda, const void* b, int64_t ldb, const GemmParams& p,
                          const Fp4GemvConfig& c, cudaStream_t stream) {
  if (p.workspace == nullptr) throw Error("fp4 gemv: needs the split-K workspace");
  int device = 0;
  FG_CUDA_CHECK(cudaGetDevice(&device));
  ctas_per_sm(c.mt, p.b_scale_fmt, device);  // the shared-memory attribute, set once per device
  const dim3 grid(static_cast<unsigned>(c.tiles), static_cast<unsigned>(c.split_k));
  const auto* x = static_cast<const uint8_t*>(a);
  const auto* w = static_cast<const uint8_t*>(b);
  // The epilogue in the kernel (FINEGEMM_DECODE_SPLIT_FINISH=1, off until measured): even unsplit, no reduce kernel.
  int* counters = env_switch("FINEGEMM_DECODE_SPLIT_FINISH", false) ? claim_split_counters(device, stream, c.tiles)
                                                                    : nullptr;
  if (c.mt == 1) gemv_launch<1>(grid, x, lda, w, ldb, p, c.steps_per_warp, counters, stream);
  else gemv_launch<2>(grid, x, lda, w, ldb, p, c.steps_per_warp, counters, stream);
  FG_CUDA_CHECK(cudaGetLastError());
  if (counters) count_split_finish();
  return counters != nullptr;
}

}  // namespace finegemm::cuda
