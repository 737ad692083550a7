// Helpers the FP4 decode kernels share (sm90_fp4_decode.cuh, sm90_fp4_decode_ldg.cuh): the fold table's rows, UE8M0
// bits as floats, one output store with the call's type, the epilogue's store of one total, and a register fence.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/kernels/fp4_expand.hpp"
#include "cuda/kernels/gemm_params.cuh"
#include "cuda/kernels/sm90_fp8_gemm.cuh"

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

}  // namespace finegemm::cuda
