// Arguments of the sm_90 FP8 GEMM family, shared by host and device code.
#pragma once
#include <cstdint>

namespace finegemm::cuda {

enum class ScaleFmt : int { F32 = 0, UE8M0 = 1, UE8M0_PACKED = 2 };
enum class OutDType : int { F32 = 0, BF16 = 1, F16 = 2 };
enum class VecMode : int { None = 0, PerIndex = 1, Scalar = 2 };  // epilogue row/col scale, bias

// y[m, n] = row_scale[m] · col_scale[n] · Σ_kb (a_scale[m, kb] · b_scale[n, kb] · Σ_{k in kb} A[m,k]·B[n,k]) + bias[n]
struct GemmParams {
  int m = 0, n = 0, k = 0;

  // Promotion (K-granular scales), applied every `promote_k` elements of K (32, 64 or 128).
  int promote_k = 128;
  const float* a_scale = nullptr;  // per (row, K group); nullptr: 1
  int64_t a_scale_stride_m = 0, a_scale_stride_k = 0;
  int a_group = 128;
  int a_scale_cols = 1;  // groups along K (the last one is clamped to for the zero-filled K tail)
  const void* b_scale = nullptr;  // per (block row, K block); nullptr: 1
  ScaleFmt b_scale_fmt = ScaleFmt::F32;
  int64_t b_scale_stride_n = 0;  // elements (F32/UE8M0) or int32 words (packed) per scale row
  int b_block_n = 128, b_block_k = 128;
  int b_scale_cols = 0;  // scales along K (unpacked count)

  // Epilogue.
  VecMode row_mode = VecMode::None;
  const float* row_scale = nullptr;
  VecMode col_mode = VecMode::None;
  const float* col_scale = nullptr;
  int bias_dtype = -1;  // -1 none, else OutDType numbering
  const void* bias = nullptr;
  OutDType out_dtype = OutDType::BF16;
  void* out = nullptr;
  int64_t ldo = 0;

  // Split-K: partial sums (promotion applied, epilogue not) go to workspace[split][m][n].
  float* workspace = nullptr;
};

}  // namespace finegemm::cuda
