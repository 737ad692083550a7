// Weight-streaming patterns (bench/dram_pattern_kernels.cu) for bench_cuda_dram_pattern.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace finegemm::bench {

// A [rows, row_bytes] byte matrix read as the decode kernels read weights: CTAs of tile_rows rows, each over its
// split's run of K chunks (box_bytes × boxes_per_chunk bytes of every row of the tile, one TMA box of tile_rows ×
// box_bytes per part), `chunks_per_stage` chunks per ring stage, `stages` stages.
struct TmaPattern {
  int tile_rows = 64;
  int box_bytes = 128;      // 64 and 256: no swizzle; 128: 128-byte swizzle (the kernels' layout)
  int boxes_per_chunk = 1;  // boxes side by side along K per chunk
  int chunks_per_stage = 1;
  int stages = 6;
  int splits = 1;
  int l2_promotion = 3;  // 0 none, 1 64 B, 2 128 B, 3 256 B (the library's tensor maps)
  int smem_pad = 0;      // extra dynamic shared memory per CTA: fewer CTAs per SM
  bool packed = false;   // each stage one contiguous block (cp.async.bulk): a weight layout repacked at load time
};

int tma_pattern_smem(const TmaPattern& t);
int tma_pattern_ctas_per_sm(const TmaPattern& t);
void launch_tma_pattern(const void* weights, int64_t rows, int64_t row_bytes, const TmaPattern& t, unsigned* sink,
                        cudaStream_t stream);
// The sequential baseline: 16-byte streaming loads over `bytes`, grid-stride.
void launch_ldg_pattern(const void* data, int64_t bytes, int blocks, unsigned* sink, cudaStream_t stream);

}  // namespace finegemm::bench
