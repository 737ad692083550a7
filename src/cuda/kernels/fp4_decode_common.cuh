// Helpers the FP4 decode kernels share (sm90_fp4_decode.cuh, sm90_fp4_decode_ldg.cuh): the fold table's rows, UE8M0
// bits as floats, one output store with the call's type, the epilogue's store of one total, a register fence and the
// per-group chain of a block that does not fold.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/kernels/fp4_expand.hpp"
#include "cuda/kernels/gemm_params.cuh"
#include "cuda/kernels/sm90_fp8_gemm.cuh"
#include "cuda/ptx/ptx.cuh"
#include "cuda/ptx/wgmma_fp8.cuh"

namespace finegemm::cuda {

// Row d of the fold table (fp4_fold_table_word): x holds codes 0-3, y codes 4-7.
__device__ __forceinline__ uint2 fp4_fold_table_row(int d) {
  return make_uint2(fp4_fold_table_word(d, 0), fp4_fold_table_word(d, 1));
}

// fmt::ue8m0_to_float without branches: 2^(e - 127), e = 0 → 2^-127 (a float subnormal), e = 255 → NaN.
__device__ __forceinline__ float ue8m0_bits_to_float(uint32_t e) {
  const uint32_t bits = e == 0u ? 0x00400000u : (e == 255u ? 0x7FC00000u : e << 23);
  return __uint_as_float(bits);
}

__device__ __forceinline__ void store_one(const GemmParams& p, int row, int col, float v) {
  const int64_t offset = static_cast<int64_t>(row) * p.ldo + col;
  switch (p.out_dtype) {
    case OutDType::F32: static_cast<float*>(p.out)[offset] = v; break;
    case OutDType::BF16: static_cast<__nv_bfloat16*>(p.out)[offset] = __float2bfloat16_rn(v); break;
    case OutDType::F16: static_cast<__half*>(p.out)[offset] = __float2half_rn(v); break;
  }
}

// One total (row `row` of x, column n) at the end of a decode CTA. Dense: with split-K the raw partial to
// p.workspace[split][M][N] (splitk_reduce_kernel applies the epilogue), else y with the row/col scales and bias.
// Grouped (expert `group`): the expert's scales, its bias (split 0 only) and the row's routing weight apply here, to
// the partial or to y (the reduce then only sums).
template <bool kGrouped>
__device__ __forceinline__ void decode_store(const GemmParams& p, int group, int split, int row, int n, float total) {
  if constexpr (!kGrouped) {
    if (p.workspace) {
      p.workspace[(static_cast<int64_t>(split) * p.m + row) * p.n + n] = total;
    } else {
      store_one(p, row, n,
                total * load_vec(p.row_mode, p.row_scale, row) * load_vec(p.col_mode, p.col_scale, n) +
                    load_bias(p, n));
    }
  } else {
    const float* row_scale =
        p.row_mode == VecMode::Scalar ? p.row_scale + group * p.row_scale_group_stride : p.row_scale;
    const float rs = load_vec(p.row_mode, row_scale, row);
    const float cs = load_vec(p.col_mode, p.col_scale + group * p.col_group_stride, n);
    const float rw = p.row_weight ? p.row_weight[row] : 1.0f;
    const bool bias = !p.workspace || split == 0;
    const float v = (total * rs * cs + (bias ? load_bias(p, group * p.bias_group_stride + n) : 0.0f)) * rw;
    if (p.workspace) p.workspace[(static_cast<int64_t>(split) * p.m + row) * p.n + n] = v;
    else store_one(p, row, n, v);
  }
}


template <int N>
__device__ __forceinline__ void fence_regs(uint32_t (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

// Chain g of a 128-wide K block that does not fold, on permuted activations (both FP4 decode kernels' per-group
// path): the lanes of MX group g (t == g) feed their codes through the plain table, the others zeros; the block's four
// k32 steps into acc (B: the block's activation tile at descriptor word desc_x), waited for. The caller promotes acc
// with group g's scales.
template <int WN>
__device__ __forceinline__ void fp4_perm_group_chain(const Chunk16& codes0, const Chunk16& codes1, uint2 plain, int t,
                                                     int g, uint32_t desc_x, float (&acc)[WN / 2]) {
  uint32_t kept[4][4];
  fp4_perm_fragments(codes0, codes1, plain.x, plain.y, plain.x, plain.y, kept);
#pragma unroll
  for (int s = 0; s < 4; ++s)
#pragma unroll
    for (int r = 0; r < 4; ++r) kept[s][r] = t == g ? kept[s][r] : 0u;
  ptx::wgmma_fence();
#pragma unroll
  for (int s = 0; s < 4; ++s)
    ptx::WgmmaFp8RegA<WN>::mma(kept[s], ptx::desc_from_words(desc_x + static_cast<uint32_t>((s * 32) >> 4),
                                                              ptx::kDescHiKMajorSw128),
                               acc, s > 0);
  ptx::wgmma_commit();
  ptx::wgmma_wait<0>();
  ptx::fence_operands(acc);
#pragma unroll
  for (int s = 0; s < 4; ++s) fence_regs(kept[s]);
}

}  // namespace finegemm::cuda
