// Launch of the lean 128x128 GEMM (sm90_fp8_gemm_lean.cuh; FINEGEMM_GEMM_LEAN=1, off until measured on the H200).
#include "cuda/kernels/sm90_fp8_gemm_lean.cuh"
#include "cuda/runtime/gemm_launch.cuh"
#include "cuda/runtime/sm90_fp8_gemm.hpp"

namespace finegemm::cuda {

bool lean_gemm_ok(const GemmParams& p, int device) {
  if (p.m <= 0 || p.n <= 0 || p.k <= 0 || p.k % kGemmBlockK != 0) return false;
  if (p.a_scale == nullptr || p.a_group != 128 || !a_scale_bulk_ok(p)) return false;
  if (p.b_scale == nullptr || p.b_block_n != kLeanBlockN || p.b_block_k != kGemmBlockK || p.b_fp4) return false;
  if (p.gate != nullptr || p.row_weight != nullptr || p.workspace != nullptr || !tma_store_output_ok(p)) return false;
  int max_smem = 0;
  FG_CUDA_CHECK(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  return lean_gemm_smem_bytes(p.k / kGemmBlockK) <= max_smem;
}

void launch_sm90_fp8_gemm_lean(const void* a, int64_t lda, const void* b, int64_t ldb, const GemmParams& p, int device,
                               cudaStream_t stream) {
  const CUtensorMap tma_a = make_tma_2d(a, p.m, p.k, lda, kLeanBlockM);
  const CUtensorMap tma_b = make_tma_2d(b, p.n, p.k, ldb, kLeanBlockN);
  const CUtensorMap tma_out = make_tma_2d(p.out, p.m, 2 * int64_t{p.n}, 2 * p.ldo, 64);
  const int num_m_blocks = ceil_div(p.m, kLeanBlockM);
  const int64_t tiles = int64_t{num_m_blocks} * ceil_div(p.n, kLeanBlockN);
  if (tiles > INT32_MAX) throw Error("lean gemm: " + std::to_string(tiles) + " tiles, more than one grid takes");
  const int smem = lean_gemm_smem_bytes(p.k / kGemmBlockK);
  FG_CUDA_CHECK(cudaFuncSetAttribute(sm90_fp8_gemm_lean_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const int grid = static_cast<int>(std::min<int64_t>(tiles, num_sms_of_device(device)));
  sm90_fp8_gemm_lean_kernel<<<grid, 384, smem, stream>>>(tma_a, tma_b, tma_out, p, num_m_blocks,
                                                         static_cast<int>(tiles));
  FG_CUDA_CHECK(cudaGetLastError());
}

}  // namespace finegemm::cuda
