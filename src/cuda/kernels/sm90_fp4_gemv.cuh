// The FP4-weight GEMV for the smallest decode batches (M ≤ 64 tokens, MT = ⌈M / 8⌉ token tiles of 8): y[M, N] =
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
//   - Weights: each lane copies 16 bytes of rows g and g + 8 (g = lane / 4, t = lane % 4: the mma fragment's row
//     group and thread in group) per step with cp.async into its warp's ring (rows padded to 80 bytes), then reads,
//     for each 32-wide MX group j of the step, the 4 bytes at j·16 + t·4 of both rows: the quad's transposition, so
//     that every mma.sync m16n8k32 covers one scale group of every row.
//   - Expansion: 8 codes per 32-bit word in five integer instructions, with no table: E2M1 (s e1 e0 m) placed at
//     E4M3 bits 7 and 4..2 is exactly the code's value · 2^-6 (exponent e, mantissa m·4; e = 0 is E4M3's subnormal
//     m·2^-7), low nibbles (even K) into one register and high nibbles (odd K) into another. K is permuted the same
//     way on the activation side (two byte permutes of the 8 bytes a lane reads), which leaves the dot product as it
//     is.
//   - Promotion per group of 32: acc · w_scale[row, j], then · x_scale[token] · 2^6 per step of 128 (or per group
//     where the activation groups are 32 or 64 wide): exact for any spread of the weight scales (no fold decision).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/kernels/gemm_params.cuh"

namespace finegemm::cuda {

inline constexpr int kGemvWarps = 4;       // warps per CTA, each over its own run of K
inline constexpr int kGemvRows = 16;       // weight rows per CTA (the mma's M)
inline constexpr int kGemvStepK = 128;     // K per step: 64 bytes of each row
inline constexpr int kGemvRowStride = 80;  // bytes per row in the ring: 64 + 16, so the transposed 4-byte reads of a
                                           // warp hit 32 distinct banks (row g at g·20 words)
inline constexpr int kGemvStages = 6;      // steps in flight per warp
inline constexpr int kGemvStageBytes = kGemvRows * kGemvRowStride;

// E2M1 codes → E4M3 (value · 2^-6): the low nibbles of w's four bytes (even K) and the high nibbles (odd K).
__device__ __forceinline__ uint32_t gemv_e2m1_lo(uint32_t w) { return ((w << 4) & 0x80808080u) | ((w << 2) & 0x1C1C1C1Cu); }
__device__ __forceinline__ uint32_t gemv_e2m1_hi(uint32_t w) { return (w & 0x80808080u) | ((w >> 2) & 0x1C1C1C1Cu); }

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

// fmt::ue8m0_to_float without branches: 2^(e - 127); e = 0 the subnormal 2^-127, e = 255 NaN.
__device__ __forceinline__ float gemv_ue8m0(uint32_t e) {
  return __uint_as_float(max(e << 23, 0x00400000u) | (e == 255u ? 0x00400000u : 0u));
}

// The four weight scales of one row over the step starting at group q (groups past b_scale_cols: 0, never used).
__device__ __forceinline__ void gemv_row_scales(const GemmParams& p, int row, int q, float (&s)[4]) {
  const int64_t base = row * p.b_scale_stride_n;
  if (p.b_scale_fmt == ScaleFmt::F32) {
    const float* f = static_cast<const float*>(p.b_scale) + base;
#pragma unroll
    for (int j = 0; j < 4; ++j) s[j] = q + j < p.b_scale_cols ? __ldg(f + q + j) : 0.0f;
    return;
  }
  uint32_t word;
  if (p.b_scale_fmt == ScaleFmt::UE8M0_PACKED) {
    word = static_cast<uint32_t>(__ldg(static_cast<const int32_t*>(p.b_scale) + base + q / 4));
  } else if (q + 3 < p.b_scale_cols) {  // 4-byte aligned (gemv_kernel_ok)
    word = __ldg(reinterpret_cast<const uint32_t*>(static_cast<const uint8_t*>(p.b_scale) + base + q));
  } else {
    const uint8_t* e = static_cast<const uint8_t*>(p.b_scale) + base;
    word = 0;
    for (int j = 0; j < 4 && q + j < p.b_scale_cols; ++j) word |= static_cast<uint32_t>(__ldg(e + q + j)) << (8 * j);
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) s[j] = gemv_ue8m0(static_cast<uint32_t>((word >> (8 * j)) & 0xFFu));
}

// Grid: (⌈N / 16⌉, split); each warp takes `steps_per_warp` steps of 128 of K from (split · 4 + warp) · steps_per_warp.
// Partials: p.workspace[split][M][N] (the promotion applied, the epilogue not).
template <int MT>
__global__ void __launch_bounds__(kGemvWarps * 32) sm90_fp4_gemv_kernel(const uint8_t* __restrict__ x, int64_t lda,
                                                                         const uint8_t* __restrict__ w, int64_t ldb,
                                                                         const GemmParams p, int steps_per_warp) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  __shared__ __align__(16) uint8_t ring[kGemvWarps][kGemvStages][kGemvStageBytes];
  __shared__ float sums[kGemvWarps - 1][4 * MT][32];
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane >> 2, t = lane & 3;
  const int row0 = static_cast<int>(blockIdx.x) * kGemvRows;
  const int split = static_cast<int>(blockIdx.y);
  const int num_steps = (p.k + kGemvStepK - 1) / kGemvStepK;
  const int step0 = (split * kGemvWarps + warp) * steps_per_warp;
  const int steps = max(0, min(num_steps - step0, steps_per_warp));
  // Rows past N read row N - 1 (never stored).
  const int row_a = min(row0 + g, p.n - 1), row_b = min(row0 + g + 8, p.n - 1);
  const uint8_t* src_a = w + row_a * ldb + t * 16;
  const uint8_t* src_b = w + row_b * ldb + t * 16;
  const int row_bytes = p.k / 2;  // a multiple of 16 (K % 32 == 0): a lane's 16 bytes are all in K or all past it
  const uint32_t ring_base = static_cast<uint32_t>(__cvta_generic_to_shared(&ring[warp][0][0]));
  const uint32_t dst_a = ring_base + g * kGemvRowStride + t * 16, dst_b = dst_a + 8 * kGemvRowStride;
  auto issue = [&](int i) {  // step i of this warp into stage i % kGemvStages
    if (i < steps) {
      const int off = (step0 + i) * (kGemvStepK / 2);
      const bool in_k = off + t * 16 < row_bytes;
      const uint32_t stage = static_cast<uint32_t>((i % kGemvStages) * kGemvStageBytes);
      gemv_cp_async_16(dst_a + stage, in_k ? src_a + off : src_a, in_k ? 16u : 0u);
      gemv_cp_async_16(dst_b + stage, in_k ? src_b + off : src_b, in_k ? 16u : 0u);
    }
    gemv_cp_async_commit();
  };
#pragma unroll
  for (int i = 0; i < kGemvStages - 1; ++i) issue(i);
  // The weights never depend on the kernel ahead (the activation quantization): only x and its scales wait for it.
  cudaGridDependencySynchronize();

  float total[MT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int i = 0; i < 4; ++i) total[mt][i] = 0.0f;
  // This lane's activation rows (the B fragment's column g of each token tile) and output tokens (2t, 2t + 1).
  const uint8_t* x_row[MT];
  int tok[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    x_row[mt] = x + min(mt * 8 + g, p.m - 1) * lda + t * 8;
    tok[mt][0] = min(mt * 8 + 2 * t, p.m - 1);
    tok[mt][1] = min(mt * 8 + 2 * t + 1, p.m - 1);
  }
  const uint32_t lane_a = static_cast<uint32_t>(g * kGemvRowStride + t * 4);
  const uint8_t* ring_warp = &ring[warp][0][0];
  // One activation scale per step (no group scales, or groups of a multiple of 128), else one per block of 32.
  const bool x_step_scale = p.a_scale == nullptr || p.a_group % kGemvStepK == 0;

  for (int i = 0; i < steps; ++i) {
    gemv_cp_async_wait<kGemvStages - 2>();
    __syncwarp();
    issue(i + kGemvStages - 1);  // into the stage read at step i - 1 (every lane is past it: the __syncwarp above)
    const int step = step0 + i;
    const int k0 = step * kGemvStepK;
    float ws_a[4], ws_b[4];
    gemv_row_scales(p, row_a, step * 4, ws_a);
    gemv_row_scales(p, row_b, step * 4, ws_b);
    const uint8_t* stage = ring_warp + (i % kGemvStages) * kGemvStageBytes + lane_a;
    // The step's K blocks of 32: the weight words of rows g and g + 8, expanded (a0..a3), and per token tile the
    // activation fragment and the product. With one activation scale over the step (groups of 128 or more, or none)
    // the products sum into `step_acc` by the weight scale and the step's total takes the activation scale once.
    float step_acc[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int e = 0; e < 4; ++e) step_acc[mt][e] = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int kj = k0 + j * 32;
      if (kj >= p.k) break;  // the K tail (warp-uniform)
      const uint32_t wa = *reinterpret_cast<const uint32_t*>(stage + j * 16);
      const uint32_t wb = *reinterpret_cast<const uint32_t*>(stage + 8 * kGemvRowStride + j * 16);
      const uint32_t a0 = gemv_e2m1_lo(wa), a1 = gemv_e2m1_lo(wb), a2 = gemv_e2m1_hi(wa), a3 = gemv_e2m1_hi(wb);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const uint2 xv = __ldg(reinterpret_cast<const uint2*>(x_row[mt] + kj));
        const uint32_t b0 = __byte_perm(xv.x, xv.y, 0x6420), b1 = __byte_perm(xv.x, xv.y, 0x7531);
        float d[4];
        gemv_mma(d, a0, a1, a2, a3, b0, b1);
        if (x_step_scale) {
          step_acc[mt][0] = fmaf(d[0], ws_a[j], step_acc[mt][0]);
          step_acc[mt][1] = fmaf(d[1], ws_a[j], step_acc[mt][1]);
          step_acc[mt][2] = fmaf(d[2], ws_b[j], step_acc[mt][2]);
          step_acc[mt][3] = fmaf(d[3], ws_b[j], step_acc[mt][3]);
        } else {
          // Activation groups of 32 or 64: the scale of this block of 32.
          const int xg = min(kj / p.a_group, p.a_scale_cols - 1);
          const float xs0 = 64.0f * __ldg(p.a_scale + tok[mt][0] * p.a_scale_stride_m + xg * p.a_scale_stride_k);
          const float xs1 = 64.0f * __ldg(p.a_scale + tok[mt][1] * p.a_scale_stride_m + xg * p.a_scale_stride_k);
          total[mt][0] = fmaf(d[0], ws_a[j] * xs0, total[mt][0]);
          total[mt][1] = fmaf(d[1], ws_a[j] * xs1, total[mt][1]);
          total[mt][2] = fmaf(d[2], ws_b[j] * xs0, total[mt][2]);
          total[mt][3] = fmaf(d[3], ws_b[j] * xs1, total[mt][3]);
        }
      }
    }
    if (x_step_scale) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        float xs0 = 64.0f, xs1 = 64.0f;  // 2^6: the expansion's scale
        if (p.a_scale) {
          const int xg = min(k0 / p.a_group, p.a_scale_cols - 1);
          xs0 *= __ldg(p.a_scale + tok[mt][0] * p.a_scale_stride_m + xg * p.a_scale_stride_k);
          xs1 *= __ldg(p.a_scale + tok[mt][1] * p.a_scale_stride_m + xg * p.a_scale_stride_k);
        }
        total[mt][0] = fmaf(step_acc[mt][0], xs0, total[mt][0]);
        total[mt][1] = fmaf(step_acc[mt][1], xs1, total[mt][1]);
        total[mt][2] = fmaf(step_acc[mt][2], xs0, total[mt][2]);
        total[mt][3] = fmaf(step_acc[mt][3], xs1, total[mt][3]);
      }
    }
  }
  gemv_cp_async_wait<0>();

  // The warps' sums in warp order (deterministic), then warp 0 stores the CTA's partials.
  if (warp > 0) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int i = 0; i < 4; ++i) sums[warp - 1][mt * 4 + i][lane] = total[mt][i];
  }
  __syncthreads();
  if (warp != 0) return;
#pragma unroll
  for (int wi = 0; wi < kGemvWarps - 1; ++wi)
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int i = 0; i < 4; ++i) total[mt][i] += sums[wi][mt * 4 + i][lane];
  float* part = p.workspace + static_cast<int64_t>(split) * p.m * p.n;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int token = mt * 8 + 2 * t + (i & 1);
      const int row = row0 + g + (i >= 2 ? 8 : 0);
      if (token < p.m && row < p.n) part[static_cast<int64_t>(token) * p.n + row] = total[mt][i];
    }
  }
#endif
}

}  // namespace finegemm::cuda
