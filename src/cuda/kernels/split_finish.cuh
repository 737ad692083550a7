// The split-K finish inside a kernel: the last CTA of a tile to count itself sums the tile's partials (see below).
#pragma once
#include "cuda/kernels/sm90_fp8_gemm.cuh"

namespace finegemm::cuda {

// The split-K finish inside the decode kernels (split_counters, FINEGEMM_DECODE_SPLIT_FINISH=1: the wgmma decode kernel
// of sm90_fp4_decode.cuh and the FP4 GEMV of sm90_fp4_gemv.cuh): every CTA of a tile stores its partials to
// p.workspace as with the reduce kernel, then counts itself on the tile's counter; the CTA that counts last sums the
// tile's partials of every split, in split order, and stores y, as splitk_reduce_kernel does (the same bits: `finish`
// says whether p's row and column scales and bias apply, the dense case, or the partials already hold the whole
// epilogue, the grouped case), and sets the counter back to zero for the next call. Rows
// [row0, row0 + rows) of the workspace and y, columns [n0, min(n0 + kRows, N)). Called by the kThreads threads that
// stored the partials (threads 0 .. kThreads - 1 of the CTA, through named barrier 1), once they have read the stages
// for the last time (`flag`: a word of the stage memory).
// NOTE: the counters are zero when a call starts because every call leaves them so and the calls that share a counter
// run one after another (host side: a region per stream, and per stream and capture under graph capture); a reader of
// y after the kernel (the next kernel, or one waiting in griddepcontrol.wait) sees the finisher's stores, which are
// part of this grid.
template <int kRows, int kThreads>
__device__ __forceinline__ void split_finish_in_kernel(const GemmParams& p, bool finish, int* counter, int split_k,
                                                       int row0, int rows, int n0, volatile int* flag) {
  __threadfence();  // this thread's partials, visible on the device before the tile's count
  ptx::named_bar_sync<1, kThreads>();
  if (threadIdx.x == 0) {
    __threadfence();  // and, cumulatively, every other thread's (ordered before it by the barrier)
    const bool last = atomicAdd(counter, 1) == split_k - 1;
    if (last) {
      __threadfence();  // the other CTAs' partials, counted before this CTA's, are read after the count
      atomicExch(counter, 0);  // every CTA of the tile has counted: the next call starts from zero
    }
    *flag = last ? 1 : 0;
  }
  ptx::named_bar_sync<1, kThreads>();
  if (*flag == 0) return;
  __threadfence();
  const int half = min(kRows, p.n - n0) / 2;  // column pairs (N is even: linear() sends odd N to the host)
  for (int e = static_cast<int>(threadIdx.x); e < rows * half; e += kThreads) {
    const int row = row0 + e / half, col = n0 + 2 * (e % half);
    const float* at = p.workspace + static_cast<int64_t>(row) * p.n + col;
    float v0 = 0.0f, v1 = 0.0f;
    for (int s = 0; s < split_k; ++s) {
      // L2, not L1: the other CTAs wrote these after this SM may have cached the lines (an earlier call's).
      const float2 v = __ldcg(reinterpret_cast<const float2*>(at + static_cast<int64_t>(s) * p.m * p.n));
      v0 += v.x;
      v1 += v.y;
    }
    if (finish) {
      const float rs = load_vec(p.row_mode, p.row_scale, row);
      store_pair(p, row, col, splitk_finish(v0, rs, load_vec(p.col_mode, p.col_scale, col), load_bias(p, col)),
                 splitk_finish(v1, rs, load_vec(p.col_mode, p.col_scale, col + 1), load_bias(p, col + 1)));
    } else {
      store_pair(p, row, col, splitk_finish(v0, 1.0f, 1.0f, 0.0f), splitk_finish(v1, 1.0f, 1.0f, 0.0f));
    }
  }
}

}  // namespace finegemm::cuda
