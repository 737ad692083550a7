// Launch of the lean GEMM (sm90_fp8_gemm_lean.cuh; FINEGEMM_GEMM_LEAN=1 for 128x128 tiles, =256 for 256x128; off until
// measured on the H200).
#include "cuda/kernels/sm90_fp8_gemm_lean.cuh"
#include "cuda/runtime/gemm_launch.cuh"
#include "cuda/runtime/sm90_fp8_gemm.hpp"

namespace finegemm::cuda {
namespace {

template <int BLOCK_M>
void launch_lean(const void* a, int64_t lda, const void* b, int64_t ldb, const GemmParams& p, int device,
                 cudaStream_t stream) {
  using L = LeanGemm<BLOCK_M>;
  const CUtensorMap tma_a = make_tma_2d(a, p.m, p.k, lda, BLOCK_M);
  const CUtensorMap tma_b = make_tma_2d(b, p.n, p.k, ldb, kLeanBlockN);
  const CUtensorMap tma_out = make_tma_2d(p.out, p.m, 2 * int64_t{p.n}, 2 * p.ldo, 64);
  const int num_m_blocks = ceil_div(p.m, BLOCK_M);
  const int64_t tiles = int64_t{num_m_blocks} * ceil_div(p.n, kLeanBlockN);
  if (tiles > INT32_MAX) throw Error("lean gemm: " + std::to_string(tiles) + " tiles, more than one grid takes");
  const int smem = L::smem_bytes(p.k / kGemmBlockK);
  FG_CUDA_CHECK(cudaFuncSetAttribute(sm90_fp8_gemm_lean_kernel<BLOCK_M>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const int grid = static_cast<int>(std::min<int64_t>(tiles, num_sms_of_device(device)));
  sm90_fp8_gemm_lean_kernel<BLOCK_M><<<grid, 384, smem, stream>>>(tma_a, tma_b, tma_out, p, num_m_blocks,
                                                                  static_cast<int>(tiles));
  FG_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

bool lean_gemm_ok(const GemmParams& p, int block_m, int device) {
  if (block_m != 128 && block_m != 256) return false;
  if (p.m <= 0 || p.n <= 0 || p.k <= 0 || p.k % kGemmBlockK != 0) return false;
  if (p.a_scale == nullptr || p.a_group != 128 || !a_scale_bulk_ok(p)) return false;
  if (p.b_scale == nullptr || p.b_block_n != kLeanBlockN || p.b_block_k != kGemmBlockK || p.b_fp4) return false;
  if (p.gate != nullptr || p.row_weight != nullptr || p.workspace != nullptr || !tma_store_output_ok(p)) return false;
  int max_smem = 0;
  FG_CUDA_CHECK(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  const int num_kb = p.k / kGemmBlockK;
  // The kernel's static shared memory (1 KB) comes on top of the dynamic bytes.
  const int need = (block_m == 128 ? LeanGemm<128>::smem_bytes(num_kb) : LeanGemm<256>::smem_bytes(num_kb)) + 1024;
  return need <= max_smem;
}

void launch_sm90_fp8_gemm_lean(const void* a, int64_t lda, const void* b, int64_t ldb, const GemmParams& p, int block_m,
                               int device, cudaStream_t stream) {
  if (block_m == 256) launch_lean<256>(a, lda, b, ldb, p, device, stream);
  else launch_lean<128>(a, lda, b, ldb, p, device, stream);
}

}  // namespace finegemm::cuda
