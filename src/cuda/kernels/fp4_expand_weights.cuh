// FP4 prefill: packed E2M1 weights with MX 1x32 scales expanded once per call into E4M3 rows, so that the E4M3 GEMM
// (sm90_fp8_gemm.cuh at its full speed) runs on them. At M = 4096 the GEMM reads each weight 32 times or more; the
// in-kernel expansion of the FP4 GEMM repeats the expansion for every 128-row tile and bounds it on its loader warps.
// Here each weight is expanded once: N·K/2 bytes read, N·K written (launch_sm90_fp8_gemm, sm90_fp8_gemm.cu).
//
// Folded (byte UE8M0 scales): each 128-wide K block of a row takes the largest of its four exponents, emax, as a
// float scale ([rows, ceil(K / 128)]), and each group of 32 expands as E2M1 · 2^-(emax - e): exact while
// emax - e ≤ 8 (fp4_fold_table_word). A block whose scales spread wider sets *unfoldable, and the caller's gated
// launches then run the FP4 kernel (promotion every 32) instead of the E4M3 GEMM on these rows.
// Not folded (FP32 or packed scales): plain E2M1 → E4M3; the E4M3 GEMM promotes every 32 with the original scales.
#pragma once
#include <cstdint>

#include "core/formats.hpp"
#include "cuda/kernels/fp4_expand.hpp"

namespace finegemm::cuda {

inline constexpr int kFp4ExpandThreads = 256;

// One warp per (row, 1024 codes of K): lane q takes the 32 codes of group q (16 packed bytes in, 32 bytes out).
// rows: all weight rows (groups · n for experts); the scale of row r, group g is
// scale[(r / n) · group_stride + (r % n) · stride_n + g] (bytes).
template <bool kFold>
__global__ void __launch_bounds__(kFp4ExpandThreads) fp4_expand_weights_kernel(
    const uint8_t* __restrict__ b, int64_t ldb, const uint8_t* __restrict__ scale, int64_t scale_stride_n,
    int64_t scale_group_stride, int n, int64_t rows, int k, uint8_t* __restrict__ out, float* __restrict__ out_scale,
    int* __restrict__ unfoldable) {
  __shared__ uint2 table[9];
  if (threadIdx.x < 9) table[threadIdx.x] = make_uint2(fp4_fold_table_word(threadIdx.x, 0), fp4_fold_table_word(threadIdx.x, 1));
  __syncthreads();
  const int groups = k / 32;
  const int chunks = (groups + 31) / 32;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * kFp4ExpandThreads + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (warp >= rows * chunks) return;  // whole warps: the shuffles below see every lane of the warp
  const int64_t row = warp / chunks;
  const int q = static_cast<int>(warp % chunks) * 32 + lane;
  const bool valid = q < groups;
  uint2 tab = table[0];
  int emax = 0;
  if constexpr (kFold) {
    const int e = valid ? scale[(row / n) * scale_group_stride + (row % n) * scale_stride_n + q] : -1;
    // The block of 128 is lanes 4j..4j+3 (q = 4·block + i); lanes past K take no part.
    int hi = e, lo = valid ? e : 255;
    hi = max(hi, __shfl_xor_sync(0xFFFFFFFFu, hi, 1));
    lo = min(lo, __shfl_xor_sync(0xFFFFFFFFu, lo, 1));
    hi = max(hi, __shfl_xor_sync(0xFFFFFFFFu, hi, 2));
    lo = min(lo, __shfl_xor_sync(0xFFFFFFFFu, lo, 2));
    emax = hi;
    if (valid && hi - lo > 8) *unfoldable = 1;
    if (valid) tab = table[min(hi - e, 8)];
  }
  if (!valid) return;
  const uint4 w = __ldg(reinterpret_cast<const uint4*>(b + row * ldb + static_cast<int64_t>(q) * 16));
  const uint32_t words[4] = {w.x, w.y, w.z, w.w};
  uint32_t o[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    o[2 * i] = e2m1x4_to_e4m3x4(words[i], tab.x, tab.y);
    o[2 * i + 1] = e2m1x4_to_e4m3x4(words[i] >> 16, tab.x, tab.y);
  }
  uint4* dst = reinterpret_cast<uint4*>(out + row * static_cast<int64_t>(k) + static_cast<int64_t>(q) * 32);
  dst[0] = make_uint4(o[0], o[1], o[2], o[3]);
  dst[1] = make_uint4(o[4], o[5], o[6], o[7]);
  if constexpr (kFold) {
    const int blocks = (k + 127) / 128;
    if (q % 4 == 0) out_scale[row * blocks + q / 4] = fmt::ue8m0_to_float(static_cast<uint8_t>(emax));
  }
}

}  // namespace finegemm::cuda
