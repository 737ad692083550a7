// The FP4-weight GEMV for the smallest decode batches (M ≤ 16 tokens, MT = ⌈M / 8⌉ token tiles of 8): y[M, N] =
// x[M, K] · W[N, K]ᵀ with E4M3 x (group, per-token or static scales) and packed E2M1 W (two per byte, low nibble
// first; rows of K/2 bytes, the checkpoint's own layout) with MX 1x32 scales (UE8M0, packed UE8M0 or FP32).
//
// Why a second FP4 decode kernel: the wgmma decode kernel (sm90_fp4_decode.cuh) is bound by instruction issue (stop
// 28's profile: ~1180 warp instructions per 64 x 128 weight tile across its consumer, loader and preparer warps; 36.6
// µs at M = 1, N = 7168, K = 16384 against 35.1 for E4M3 weights). This kernel has no producer warps, no mbarriers and
// no fold tables:
//   - CTA: 16 weight rows (one m16 tile) and four warps, each over its own run of K (128 per step); the warps' sums
//     meet in shared memory at the end, and each CTA (one K split of the grid) writes its partials for
//     splitk_reduce_kernel, which applies the epilogue.
//   - Each warp streams its steps through its own ring of cp.async stages (no barrier but the warp's own
//     cp.async.wait_group and __syncwarp): 16 bytes of weight rows g and g + 8 per lane (g = lane / 4, t = lane % 4,
//     the mma fragment's row group and thread in group; rows padded to 80 bytes), the 8·MT token rows of x, the 16
//     rows' weight scales and the tokens' activation scales.
//   - For each 32-wide MX group j of a step a lane reads the 4 bytes at j·16 + t·4 of both rows: the quad's
//     transposition, so that every mma.sync m16n8k32 covers one scale group of every row.
//   - Expansion: 8 codes per 32-bit word in five integer instructions, with no table: E2M1 (s e1 e0 m) placed at
//     E4M3 bits 7 and 4..2 is exactly the code's value · 2^-6 (exponent e, mantissa m·4; e = 0 is E4M3's subnormal
//     m·2^-7), low nibbles (even K) into one register and high nibbles (odd K) into another. K is permuted the same
//     way on the activation side (two byte permutes of the 8 bytes a lane reads), which leaves the dot product as it
//     is. (ptxas lowers the E4M3 mma.sync on sm_90 to F16 HMMA with F2FP unpacks of both operands.)
//   - Promotion per group of 32: acc · w_scale[row, j], then · x_scale[token] · 2^6 per step of 128 (or per group
//     where the activation groups are 32 or 64 wide): exact for any spread of the weight scales (no fold decision).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/kernels/fp4_expand.hpp"
#include "cuda/kernels/gemm_params.cuh"
#include "cuda/kernels/split_finish.cuh"

namespace finegemm::cuda {

inline constexpr int kGemvWarps = 4;       // warps per CTA, each over its own run of K
inline constexpr int kGemvRows = 16;       // weight rows per CTA (the mma's M)
inline constexpr int kGemvStepK = 128;     // K per step: 64 bytes of each row
inline constexpr int kGemvRowStride = 80;  // bytes per row in the ring: 64 + 16, so the transposed 4-byte reads of a
                                           // warp hit 32 distinct banks (row g at g·20 words)
inline constexpr int kGemvStages = 4;      // steps in flight per warp
inline constexpr int kGemvStageBytes = kGemvRows * kGemvRowStride;

// E2M1 codes → E4M3 (value · 2^-6): the low nibbles of w's four bytes (even K) and the high nibbles (odd K)
// (fp4_expand.hpp, proved on every input by tests/test_fp4_expand.cpp).
__device__ __forceinline__ uint32_t gemv_e2m1_lo(uint32_t w) { return e2m1_lo_to_e4m3_2m6(w); }
__device__ __forceinline__ uint32_t gemv_e2m1_hi(uint32_t w) { return e2m1_hi_to_e4m3_2m6(w); }

__device__ __forceinline__ void gemv_cp_async_16(uint32_t smem_dst, const void* src, uint32_t src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void gemv_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void gemv_cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// d = A · B (m16n8k32, E4M3 inputs, f32 accumulator starting at zero).
__device__ __forceinline__ void gemv_mma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
  asm(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %10, %10, %10};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(0.0f));
}

// fmt::ue8m0_to_float without branches (ue8m0_float_bits).
__device__ __forceinline__ float gemv_ue8m0(uint32_t e) { return __uint_as_float(ue8m0_float_bits(e)); }

__device__ __forceinline__ void gemv_cp_async_4(uint32_t smem_dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem_dst), "l"(src) : "memory");
}

// One warp's ring stage: the weight rows, the activation tile, the weight scales and the activation scales of a step.
template <int MT>
struct GemvStage {
  static constexpr int kXStride = 160;                     // bytes per token row: 128 + 32, so that a warp's 8-byte
                                                           // fragment reads take the minimum two wavefronts
  static constexpr int kW = 0;                             // [16 rows][80 bytes], packed E2M1
  static constexpr int kX = kW + kGemvRows * kGemvRowStride;  // [8·MT tokens][160 bytes], E4M3
  static constexpr int kWs = kX + 8 * MT * kXStride;       // [16 rows][16 bytes]: the UE8M0 word or four floats
  static constexpr int kXs = kWs + kGemvRows * 16;         // [4 blocks of 32][8·MT tokens] float
  static constexpr int kBytes = kXs + 4 * 8 * MT * 4;
};
template <int MT>
inline constexpr int kGemvSmemBytes = kGemvWarps * kGemvStages * GemvStage<MT>::kBytes + (kGemvWarps - 1) * 4 * MT * 32 * 4;

// Grid: (⌈N / 16⌉, split); each warp takes `steps_per_warp` steps of 128 of K from (split · 4 + warp) · steps_per_warp.
// Partials: p.workspace[split][M][N] (the promotion applied, the epilogue not). MT: 1 or 2 (M ≤ 16). kFmt: the weight
// scales' format (p.b_scale_fmt). kSplitFinish (split_counters: FINEGEMM_DECODE_SPLIT_FINISH=1, not yet run on a GPU):
// warp 0 of the tile's last CTA applies the epilogue itself (split_finish_in_kernel), even unsplit, and no reduce
// kernel runs.
template <int MT, ScaleFmt kFmt, bool kSplitFinish = false>
__global__ void __launch_bounds__(kGemvWarps * 32) sm90_fp4_gemv_kernel(const uint8_t* __restrict__ x, int64_t lda,
                                                                         const uint8_t* __restrict__ w, int64_t ldb,
                                                                         const GemmParams p, int steps_per_warp,
                                                                         int* split_counters) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using St = GemvStage<MT>;
  extern __shared__ __align__(16) uint8_t gemv_smem[];
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane >> 2, t = lane & 3;
  const int row0 = static_cast<int>(blockIdx.x) * kGemvRows;
  const int split = static_cast<int>(blockIdx.y);
  const int num_steps = (p.k + kGemvStepK - 1) / kGemvStepK;
  const int step0 = (split * kGemvWarps + warp) * steps_per_warp;
  const int steps = max(0, min(num_steps - step0, steps_per_warp));
  // One activation scale per step (no group scales, or groups of a multiple of 128), else one per block of 32.
  const bool x_step_scale = p.a_scale == nullptr || p.a_group % kGemvStepK == 0;
  uint8_t* ring = gemv_smem + warp * kGemvStages * St::kBytes;
  const uint32_t ring_base = static_cast<uint32_t>(__cvta_generic_to_shared(ring));
  // Rows past N read row N - 1 and tokens past M token M - 1 (never stored).
  const int row_a = min(row0 + g, p.n - 1), row_b = min(row0 + g + 8, p.n - 1);
  const uint8_t* src_a = w + row_a * ldb + t * 16;
  const uint8_t* src_b = w + row_b * ldb + t * 16;
  const int row_bytes = p.k / 2;  // a multiple of 16 (K % 32 == 0): a 16-byte copy is all in K or all past it
  const int scale_row = min(row0 + lane, p.n - 1);  // lanes 0..15: the weight scales of row row0 + lane
  auto issue = [&](int i) {  // step i of this warp into stage i % kGemvStages; always commits a group
    if (i < steps) {
      const int step = step0 + i;
      const int k0 = step * kGemvStepK;
      const uint32_t st = ring_base + static_cast<uint32_t>((i % kGemvStages) * St::kBytes);
      uint8_t* st_ptr = ring + (i % kGemvStages) * St::kBytes;
      // Weights: 16 bytes of rows g and g + 8.
      const int off = step * (kGemvStepK / 2);
      const bool in_k = off + t * 16 < row_bytes;
      const uint32_t dst_w = st + St::kW + g * kGemvRowStride + t * 16;
      gemv_cp_async_16(dst_w, in_k ? src_a + off : src_a, in_k ? 16u : 0u);
      gemv_cp_async_16(dst_w + 8 * kGemvRowStride, in_k ? src_b + off : src_b, in_k ? 16u : 0u);
      // Activations: 8·MT token rows of 128 bytes, 16 bytes per copy (zero past K).
#pragma unroll
      for (int r = 0; r < 2 * MT; ++r) {
        const int c = lane + 32 * r;
        const int tr = c >> 3, col = (c & 7) * 16;
        const bool ok = k0 + col < p.k;
        const uint8_t* src = x + static_cast<int64_t>(min(tr, p.m - 1)) * lda + (ok ? k0 + col : 0);
        gemv_cp_async_16(st + St::kX + tr * St::kXStride + col, src, ok ? 16u : 0u);
      }
      // Weight scales: row row0 + lane's four groups of the step.
      if (lane < kGemvRows) {
        const int q = step * 4;
        const uint32_t dst = st + St::kWs + lane * 16;
        if constexpr (kFmt == ScaleFmt::F32) {
          const float* f = static_cast<const float*>(p.b_scale) + scale_row * p.b_scale_stride_n;
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            if (q + j < p.b_scale_cols) gemv_cp_async_4(dst + 4 * j, f + q + j);
            else reinterpret_cast<float*>(st_ptr + St::kWs + lane * 16)[j] = 0.0f;
          }
        } else if constexpr (kFmt == ScaleFmt::UE8M0_PACKED) {
          gemv_cp_async_4(dst, static_cast<const int32_t*>(p.b_scale) + scale_row * p.b_scale_stride_n + step);
        } else {
          const uint8_t* e = static_cast<const uint8_t*>(p.b_scale) + scale_row * p.b_scale_stride_n;
          if (q + 3 < p.b_scale_cols) {
            gemv_cp_async_4(dst, e + q);  // 4-byte aligned (fp4_gemv_ok)
          } else {  // the K tail: the groups in K only (never read past the row)
            uint32_t word = 0;
            for (int j = 0; q + j < p.b_scale_cols && j < 4; ++j) word |= static_cast<uint32_t>(e[q + j]) << (8 * j);
            *reinterpret_cast<uint32_t*>(st_ptr + St::kWs + lane * 16) = word;
          }
        }
      }
      // Activation scales: per token, of the step (x_step_scale) or of each block of 32.
      if (p.a_scale) {
        const int entries = (x_step_scale ? 1 : 4) * 8 * MT;
#pragma unroll
        for (int r = 0; r < MT; ++r) {
          const int e = lane + 32 * r;
          if (e >= entries) break;
          const int jj = e / (8 * MT), tr = e % (8 * MT);
          const int grp = min((k0 + 32 * jj) / p.a_group, p.a_scale_cols - 1);
          gemv_cp_async_4(st + St::kXs + 4 * e,
                          p.a_scale + static_cast<int64_t>(min(tr, p.m - 1)) * p.a_scale_stride_m + grp * p.a_scale_stride_k);
        }
      }
    }
    gemv_cp_async_commit();
  };
  // x and its scales may come from the kernel ahead (the activation quantization, under programmatic launch).
  cudaGridDependencySynchronize();
#pragma unroll
  for (int i = 0; i < kGemvStages - 1; ++i) issue(i);

  float total[MT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int e = 0; e < 4; ++e) total[mt][e] = 0.0f;
  const int lane_w = St::kW + g * kGemvRowStride + t * 4;
  const int lane_x = St::kX + g * St::kXStride + t * 8;

  for (int i = 0; i < steps; ++i) {
    gemv_cp_async_wait<kGemvStages - 2>();
    __syncwarp();
    issue(i + kGemvStages - 1);  // into the stage read at step i - 1 (every lane is past it: the __syncwarp above)
    const int k0 = (step0 + i) * kGemvStepK;
    const uint8_t* st = ring + (i % kGemvStages) * St::kBytes;
    float w_scale_a[4], w_scale_b[4];
    {
      // Rows g and g + 8: four floats, or one UE8M0 word (group j in byte j).
      const uint4 raw_a = *reinterpret_cast<const uint4*>(st + St::kWs + g * 16);
      const uint4 raw_b = *reinterpret_cast<const uint4*>(st + St::kWs + (g + 8) * 16);
      const uint32_t words_a[4] = {raw_a.x, raw_a.y, raw_a.z, raw_a.w}, words_b[4] = {raw_b.x, raw_b.y, raw_b.z, raw_b.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if constexpr (kFmt == ScaleFmt::F32) {
          w_scale_a[j] = __uint_as_float(words_a[j]);
          w_scale_b[j] = __uint_as_float(words_b[j]);
        } else {
          w_scale_a[j] = gemv_ue8m0((raw_a.x >> (8 * j)) & 0xFFu);
          w_scale_b[j] = gemv_ue8m0((raw_b.x >> (8 * j)) & 0xFFu);
        }
      }
    }
    const float* x_scales = reinterpret_cast<const float*>(st + St::kXs);
    // The step's K blocks of 32: the weight words of rows g and g + 8, expanded (a0..a3), and per token tile the
    // activation fragment and the product. With one activation scale over the step the products sum into
    // `step_acc` by the weight scale and the step's total takes the activation scale once.
    float step_acc[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int e = 0; e < 4; ++e) step_acc[mt][e] = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (k0 + j * 32 >= p.k) break;  // the K tail (warp-uniform)
      const uint32_t wa = *reinterpret_cast<const uint32_t*>(st + lane_w + j * 16);
      const uint32_t wb = *reinterpret_cast<const uint32_t*>(st + lane_w + 8 * kGemvRowStride + j * 16);
      const uint32_t a0 = gemv_e2m1_lo(wa), a1 = gemv_e2m1_lo(wb), a2 = gemv_e2m1_hi(wa), a3 = gemv_e2m1_hi(wb);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const uint2 xv = *reinterpret_cast<const uint2*>(st + lane_x + mt * 8 * St::kXStride + j * 32);
        const uint32_t b0 = __byte_perm(xv.x, xv.y, 0x6420), b1 = __byte_perm(xv.x, xv.y, 0x7531);
        float d[4];
        gemv_mma(d, a0, a1, a2, a3, b0, b1);
        if (x_step_scale) {
          step_acc[mt][0] = fmaf(d[0], w_scale_a[j], step_acc[mt][0]);
          step_acc[mt][1] = fmaf(d[1], w_scale_a[j], step_acc[mt][1]);
          step_acc[mt][2] = fmaf(d[2], w_scale_b[j], step_acc[mt][2]);
          step_acc[mt][3] = fmaf(d[3], w_scale_b[j], step_acc[mt][3]);
        } else {
          // Activation groups of 32 or 64: the scales of this block of 32, tokens 2t and 2t + 1.
          const float2 x_pair = *reinterpret_cast<const float2*>(x_scales + j * 8 * MT + mt * 8 + 2 * t);
          const float x_scale0 = 64.0f * x_pair.x, x_scale1 = 64.0f * x_pair.y;
          total[mt][0] = fmaf(d[0], w_scale_a[j] * x_scale0, total[mt][0]);
          total[mt][1] = fmaf(d[1], w_scale_a[j] * x_scale1, total[mt][1]);
          total[mt][2] = fmaf(d[2], w_scale_b[j] * x_scale0, total[mt][2]);
          total[mt][3] = fmaf(d[3], w_scale_b[j] * x_scale1, total[mt][3]);
        }
      }
    }
    if (x_step_scale) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        float x_scale0 = 64.0f, x_scale1 = 64.0f;  // 2^6: the expansion's scale
        if (p.a_scale) {
          const float2 x_pair = *reinterpret_cast<const float2*>(x_scales + mt * 8 + 2 * t);
          x_scale0 *= x_pair.x;
          x_scale1 *= x_pair.y;
        }
        total[mt][0] = fmaf(step_acc[mt][0], x_scale0, total[mt][0]);
        total[mt][1] = fmaf(step_acc[mt][1], x_scale1, total[mt][1]);
        total[mt][2] = fmaf(step_acc[mt][2], x_scale0, total[mt][2]);
        total[mt][3] = fmaf(step_acc[mt][3], x_scale1, total[mt][3]);
      }
    }
  }
  gemv_cp_async_wait<0>();

  // The warps' sums in warp order (deterministic), then warp 0 stores the CTA's partials.
  float* sums = reinterpret_cast<float*>(gemv_smem + kGemvWarps * kGemvStages * St::kBytes);  // [3][4·MT][32]
  if (warp > 0) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int e = 0; e < 4; ++e) sums[((warp - 1) * 4 * MT + mt * 4 + e) * 32 + lane] = total[mt][e];
  }
  __syncthreads();
  if (warp != 0) return;
#pragma unroll
  for (int wi = 0; wi < kGemvWarps - 1; ++wi)
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int e = 0; e < 4; ++e) total[mt][e] += sums[(wi * 4 * MT + mt * 4 + e) * 32 + lane];
  float* part = p.workspace + static_cast<int64_t>(split) * p.m * p.n;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int token = mt * 8 + 2 * t + (e & 1);
      const int row = row0 + g + (e >= 2 ? 8 : 0);
      if (token < p.m && row < p.n) part[static_cast<int64_t>(token) * p.n + row] = total[mt][e];
    }
  }
  // Warp 0 alone from here (the stages are quiescent: every cp.async waited for, the sums read).
  if constexpr (kSplitFinish)
    split_finish_in_kernel<kGemvRows, 32>(p, true, split_counters + blockIdx.x, static_cast<int>(gridDim.y), 0, p.m,
                                          row0, reinterpret_cast<volatile int*>(gemv_smem));
#endif
}

}  // namespace finegemm::cuda
