// Host side of src/cuda/kernels/sm90_fp8_gemm.cuh: tile-config heuristic, tensor maps, launch.
#pragma once
#include <cuda_runtime.h>

#include <string>

#include "cuda/kernels/gemm_params.cuh"

namespace finegemm::cuda {

struct GemmConfig {
  int block_m = 128;
  int block_n = 128;
  int stages = 6;
  int split_k = 1;
  int k_blocks_per_split = 0;
  int grid = 0;
  std::string describe() const;
};

// Pure function from the problem to a tile config (FINEGEMM_PRINT_CONFIG=1 prints each choice).
// FINEGEMM_GEMM_CONFIG="BMxBN[:split]" forces one, for benchmarks and tests.
GemmConfig choose_gemm_config(int m, int n, int k, bool promote, int num_sms);

// a [M, K] and b [N, K] E4M3, row-major with leading dimensions lda/ldb (bytes, multiples of 16), 16-byte aligned.
void launch_sm90_fp8_gemm(const void* a, int64_t lda, const void* b, int64_t ldb, GemmParams params,
                          cudaStream_t stream);

}  // namespace finegemm::cuda
