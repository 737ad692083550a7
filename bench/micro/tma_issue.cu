// How long does one `cp.async.bulk.tensor.2d` take to *issue* (clock64 around the instruction), for the FP4 lean
// kernel's two boxes, alone and one after the other? Stop 54's ring trace had the kernel's issuing producer thread
// spend ~640 cycles per K block in the packed tile's copy issued right after A's (A's own issue: ~117), and ~1200
// when the packed copy was issued elsewhere in the K block; a packed ring of 5 instead of 7 did not change it.
// Written at stop 54 without a device: not yet run.
//
// One CTA per SM, thread 0 issuing, the kernel's rings: A (192 rows x 128 bytes, 128-byte swizzle) into 4 stages of
// 24 KB, the packed tile (128 rows x 64 bytes, 64-byte swizzle) into 7 of 8 KB, a slot reused once its previous copy
// has landed (that wait is not timed). Per iteration it records the cycles of each copy's issue (expect_tx and the
// copy). Modes:
//   0: A, then the packed tile (the kernel's order)       1: the packed tile, then A
//   2: the packed tile alone                               3: A alone
//   4: A, then the packed K blocks as a 64-row x 128-byte box (two K blocks of 64 rows per copy, 128-byte swizzle)
//   5: A by thread 0 and the packed tile by thread 32 (another warp), at the same time
//   6: A, then two packed K blocks per copy as a 3-D box {64 bytes, 128 rows, 2 K blocks} (64-byte swizzle): 16 KB
//      landing as two of the kernel's 8 KB slots, unchanged (stop 56: one copy per two K blocks, same rows of 64 B)
//   7: A, then two packed K blocks per copy as a 128 rows x 128-byte box (128-byte swizzle): 16 KB, half the rows
//      of mode 6 (is a copy's cost per copy, per row or per byte?)
// Prints, per mode, the median and 90th percentile of each issue over iterations 16.. of every CTA, and the second
// run's time and bytes per second (A's and the packed tiles' bytes over all CTAs; modes 6 and 7 move twice the
// packed bytes per iteration).
// Build (on the device): nvcc -O3 -std=c++17 -arch=sm_90a bench/micro/tma_issue.cu -o tma_issue && ./tma_issue
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#define CHECK(x)                                                                                     \
  do {                                                                                               \
    cudaError_t e_ = (x);                                                                            \
    if (e_ != cudaSuccess) {                                                                         \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));        \
      std::exit(1);                                                                                  \
    }                                                                                                \
  } while (0)

constexpr int kIters = 256, kStagesA = 4, kStagesP = 7;
constexpr int kBoxARows = 192, kBoxPRows = 128;
constexpr int kStageA = kBoxARows * 128, kStageP = kBoxPRows * 64;
constexpr int kK = 7168, kKBlocks = kK / 128;
constexpr int64_t kRowsA = 32768, kRowsP = 65536;

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void bar_init(uint64_t* b, uint32_t n) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(b)), "r"(n) : "memory");
}
__device__ __forceinline__ void bar_arrive_tx(uint64_t* b, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(b)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bar_wait(uint64_t* b, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}"
                 : "=r"(done)
                 : "r"(smem_u32(b)), "r"(parity)
                 : "memory");
  } while (!done);
}
__device__ __forceinline__ void tma2d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];" ::"r"(
          smem_u32(dst)),
      "l"(map), "r"(smem_u32(bar)), "r"(c0), "r"(c1)
      : "memory");
}
__device__ __forceinline__ void tma3d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];" ::"r"(
          smem_u32(dst)),
      "l"(map), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}
__device__ __forceinline__ long long clk() {
  long long t;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(t)::"memory");
  return t;
}

__global__ void __launch_bounds__(128, 1) probe(const __grid_constant__ CUtensorMap map_a,
                                                 const __grid_constant__ CUtensorMap map_p,
                                                 const __grid_constant__ CUtensorMap map_p128,
                                                 const __grid_constant__ CUtensorMap map_p3d,
                                                 const __grid_constant__ CUtensorMap map_pw, int mode, unsigned* out) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  uint8_t* sa = smem;
  uint8_t* sp = sa + kStagesA * kStageA;
  uint64_t* bar_a = reinterpret_cast<uint64_t*>(sp + kStagesP * kStageP);
  uint64_t* bar_p = bar_a + kStagesA;
  if (threadIdx.x == 0) {
    for (int i = 0; i < kStagesA; ++i) bar_init(&bar_a[i], 1);
    for (int i = 0; i < kStagesP; ++i) bar_init(&bar_p[i], 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("prefetch.tensormap [%0];" ::"l"(&map_a) : "memory");
    asm volatile("prefetch.tensormap [%0];" ::"l"(&map_p) : "memory");
    asm volatile("prefetch.tensormap [%0];" ::"l"(&map_p128) : "memory");
    asm volatile("prefetch.tensormap [%0];" ::"l"(&map_p3d) : "memory");
    asm volatile("prefetch.tensormap [%0];" ::"l"(&map_pw) : "memory");
  }
  __syncthreads();
  const bool a_thread = threadIdx.x == 0, p_thread = threadIdx.x == (mode == 5 ? 32 : 0);
  const bool use_a = mode != 2, use_p = mode != 3;
  const int cta = static_cast<int>(blockIdx.x);
  const bool wide = mode >= 6;  // 16 KB packed copies into 3 slots of the same 56 KB
  const int stages_p = wide ? 3 : kStagesP, stage_p = wide ? 2 * kStageP : kStageP;
  for (int i = 0; i < kIters; ++i) {
    const int sa_slot = i % kStagesA, sp_slot = i % stages_p;
    const int kb = i % kKBlocks, tile = i / kKBlocks;
    const int a_row = static_cast<int>((int64_t{cta} * 248 + int64_t{tile} * kBoxARows) % (kRowsA - kBoxARows));
    const int p_kb = (i + 5) % kKBlocks, p_tile = (i + 5) / kKBlocks;
    const int p_row = static_cast<int>((int64_t{cta} * 512 + int64_t{p_tile} * kBoxPRows) % (kRowsP - kBoxPRows));
    // The slots' previous copies have landed (not timed).
    if (a_thread && use_a && i >= kStagesA) bar_wait(&bar_a[sa_slot], ((i / kStagesA) - 1) & 1);
    if (p_thread && use_p && i >= stages_p) bar_wait(&bar_p[sp_slot], ((i / stages_p) - 1) & 1);
    __syncwarp();
    __syncthreads();  // mode 5: the two issuing warps start each iteration together
    long long ta = 0, tp = 0;
    auto issue_a = [&] {
      const long long t0 = clk();
      bar_arrive_tx(&bar_a[sa_slot], kStageA);
      tma2d(sa + sa_slot * kStageA, &map_a, &bar_a[sa_slot], kb * 128, a_row);
      ta = clk() - t0;
    };
    auto issue_p = [&] {
      const long long t0 = clk();
      bar_arrive_tx(&bar_p[sp_slot], stage_p);
      if (mode == 4)  // 64 rows x 128 bytes: the same 8 KB as two K blocks of 64 rows
        tma2d(sp + sp_slot * kStageP, &map_p128, &bar_p[sp_slot], (p_kb / 2) * 128, p_row / 2);
      else if (mode == 6)  // {64 B, 128 rows, 2 K blocks}: two slots of the kernel's layout
        tma3d(sp + sp_slot * stage_p, &map_p3d, &bar_p[sp_slot], 0, p_row, p_kb & ~1);
      else if (mode == 7)  // 128 rows x 128 B: K blocks 2j and 2j + 1 side by side in each row
        tma2d(sp + sp_slot * stage_p, &map_pw, &bar_p[sp_slot], (p_kb & ~1) * 64, p_row);
      else
        tma2d(sp + sp_slot * kStageP, &map_p, &bar_p[sp_slot], p_kb * 64, p_row);
      tp = clk() - t0;
    };
    if (mode == 1) {
      if (p_thread) issue_p();
      if (a_thread) issue_a();
    } else {
      if (a_thread && use_a) issue_a();
      if (p_thread && use_p) issue_p();
    }
    unsigned* o = out + (static_cast<size_t>(cta) * kIters + i) * 2;
    if (a_thread) o[0] = static_cast<unsigned>(ta);
    if (p_thread) o[1] = static_cast<unsigned>(tp);
  }
  // Drain: every copy has landed before the CTA leaves.
  if (a_thread && use_a)
    for (int i = kIters - kStagesA; i < kIters; ++i) bar_wait(&bar_a[i % kStagesA], (i / kStagesA) & 1);
  if (p_thread && use_p)
    for (int i = kIters - stages_p; i < kIters; ++i) bar_wait(&bar_p[i % stages_p], (i / stages_p) & 1);
  __syncthreads();
}

using Encode = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*, const cuuint64_t*,
                            const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                            CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

CUtensorMap map2d(Encode enc, void* ptr, int64_t rows, int64_t cols, int box_rows, int box_cols, CUtensorMapSwizzle sw) {
  CUtensorMap m{};
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(cols)};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_cols), static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t es[2] = {1, 1};
  const CUresult r = enc(&m, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, ptr, dims, strides, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
                         sw, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    std::fprintf(stderr, "cuTensorMapEncodeTiled: %d\n", static_cast<int>(r));
    std::exit(1);
  }
  return m;
}

// The packed weights [rows, K / 2 bytes] seen as {64 bytes, rows, K blocks}: strides K / 2 (a row) and 64 (a K block).
// Returns false where the driver refuses the map (the mode is then skipped).
bool map3d(Encode enc, void* ptr, int64_t rows, int64_t row_bytes, CUtensorMap* m) {
  const cuuint64_t dims[3] = {64, static_cast<cuuint64_t>(rows), static_cast<cuuint64_t>(row_bytes / 64)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(row_bytes), 64};
  const cuuint32_t box[3] = {64, static_cast<cuuint32_t>(kBoxPRows), 2};
  const cuuint32_t es[3] = {1, 1, 1};
  const CUresult r = enc(m, CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, ptr, dims, strides, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
                         CU_TENSOR_MAP_SWIZZLE_64B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) std::printf("mode 6: cuTensorMapEncodeTiled refused the 3-D map (%d); skipped\n", static_cast<int>(r));
  return r == CUDA_SUCCESS;
}

int main() {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q{};
  CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q));
  const Encode enc = reinterpret_cast<Encode>(fn);
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  uint8_t *a = nullptr, *p = nullptr;
  CHECK(cudaMalloc(&a, kRowsA * kK));
  CHECK(cudaMalloc(&p, kRowsP * (kK / 2)));
  CHECK(cudaMemset(a, 1, kRowsA * kK));
  CHECK(cudaMemset(p, 2, kRowsP * (kK / 2)));
  const CUtensorMap ma = map2d(enc, a, kRowsA, kK, kBoxARows, 128, CU_TENSOR_MAP_SWIZZLE_128B);
  const CUtensorMap mp = map2d(enc, p, kRowsP, kK / 2, kBoxPRows, 64, CU_TENSOR_MAP_SWIZZLE_64B);
  const CUtensorMap mp128 = map2d(enc, p, kRowsP / 2, kK, kBoxPRows / 2, 128, CU_TENSOR_MAP_SWIZZLE_128B);
  const CUtensorMap mpw = map2d(enc, p, kRowsP, kK / 2, kBoxPRows, 128, CU_TENSOR_MAP_SWIZZLE_128B);
  CUtensorMap mp3{};
  const bool have3d = map3d(enc, p, kRowsP, kK / 2, &mp3);
  const size_t smem = 1024 + kStagesA * kStageA + kStagesP * kStageP + 16 * 8;
  CHECK(cudaFuncSetAttribute(probe, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  unsigned* out = nullptr;
  const size_t n = static_cast<size_t>(sms) * kIters * 2;
  CHECK(cudaMalloc(&out, n * sizeof(unsigned)));
  const char* names[] = {"A then packed (the kernel)", "packed then A", "packed alone", "A alone",
                         "A then packed as 64 x 128 B", "A (warp 0) and packed (warp 1)",
                         "A then 2 packed K blocks, 3-D box", "A then 2 packed K blocks, 128 x 128 B"};
  std::vector<unsigned> host(n);
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  for (int mode = 0; mode < 8; ++mode) {
    if (mode == 6 && !have3d) continue;
    float ms = 0;
    for (int rep = 0; rep < 2; ++rep) {  // the first run warms up
      CHECK(cudaMemset(out, 0, n * sizeof(unsigned)));
      CHECK(cudaEventRecord(e0));
      probe<<<sms, 128, smem>>>(ma, mp, mp128, mp3, mpw, mode, out);
      CHECK(cudaEventRecord(e1));
      CHECK(cudaGetLastError());
      CHECK(cudaDeviceSynchronize());
      CHECK(cudaEventElapsedTime(&ms, e0, e1));
    }
    const double bytes_iter = (mode != 2 ? double(kStageA) : 0.0) + (mode != 3 ? double(mode >= 6 ? 2 * kStageP : kStageP) : 0.0);
    const double gbs = bytes_iter * kIters * sms / (ms * 1e-3) / 1e9;
    CHECK(cudaMemcpy(host.data(), out, n * sizeof(unsigned), cudaMemcpyDeviceToHost));
    std::vector<unsigned> ta, tp;
    for (int c = 0; c < sms; ++c)
      for (int i = 16; i < kIters; ++i) {
        const unsigned* o = host.data() + (static_cast<size_t>(c) * kIters + i) * 2;
        if (mode != 2) ta.push_back(o[0]);
        if (mode != 3) tp.push_back(o[1]);
      }
    auto q50 = [](std::vector<unsigned> v, double f) {
      if (v.empty()) return 0u;
      std::sort(v.begin(), v.end());
      return v[static_cast<size_t>(f * (v.size() - 1))];
    };
    std::printf("mode %d %-38s A issue median %5u p90 %5u | packed issue median %5u p90 %5u cycles | %8.1f us %7.0f GB/s\n",
                mode, names[mode], q50(ta, 0.5), q50(ta, 0.9), q50(tp, 0.5), q50(tp, 0.9), ms * 1e3, gbs);
  }
  CHECK(cudaFree(out));
  CHECK(cudaFree(a));
  CHECK(cudaFree(p));
  return 0;
}
