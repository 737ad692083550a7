// The direct-copy FP4 decode kernel's copies alone (sm90_fp4_decode_ldg.cuh, stop 60), without its expansion or
// wgmma: how fast can its pattern stream the weights? With bench/micro/wgmma_small_n.cu (its tensor side alone) this
// splits the kernel's ~40 µs at M = 1 N = 7168 K = 16384 (H100, stop 60) into the part the copies need and the part
// the arithmetic needs.
// The same grid and shared memory as the kernel at 8 tokens: CTAs of one warpgroup per (64-row tile, K split of whole
// 512-K chunks), a ring of three chunk slots (73.5 KB: three CTAs per SM), per chunk and thread eight 16-byte copies
// of its rows' codes, one of their scale bytes per row, and two 16-byte pieces of the activation tile; wait_group 1,
// one __syncthreads per chunk, and one shared load per copy so that the data is read. Prints µs (events, median of
// 20) and TB/s of packed weights for N = 7168 K = 16384 and N = 4096 K = 7168 at splits 2..8.
// Build: nvcc -O3 -std=c++20 -gencode arch=compute_90a,code=sm_90a bench/micro/ldg_decode_stream.cu -o
// ldg_decode_stream (or the micro_ldg_decode_stream target).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

constexpr int kThreads = 128, kRing = 3, kBlocks = 4;
constexpr int kX = kBlocks * 8 * 128;                   // activation tile of 8 tokens
constexpr int kRest = kBlocks * 2 * kThreads * 16 + 2 * kThreads * 16 + kBlocks * 8 * 4;
constexpr int kSmem = kRing * (kX + kRest) + 128 + 1024;  // as Fp4LdgSmem<8>

__device__ __forceinline__ void cp16(void* dst, const void* src) {
  const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src) : "memory");
}

__global__ void __launch_bounds__(kThreads, 3) stream(const uint8_t* w, const uint8_t* scales, const uint8_t* x, int n,
                                                     int k, int split_k, int chunks_per_split, unsigned* sink) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw)) & 1023)) & 1023);
  uint8_t* rest = smem + kRing * kX;
  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32, g = lane >> 2, t = lane & 3;
  const int split = static_cast<int>(blockIdx.x) % split_k, tile = static_cast<int>(blockIdx.x) / split_k;
  const int num_chunks = k / 512, c_begin = split * chunks_per_split;
  const int c_end = min(num_chunks, c_begin + chunks_per_split);
  const int64_t ldw = k / 2, lds = k / 32;
  const uint8_t* w_row[2];
  const uint8_t* s_row[2];
  for (int h = 0; h < 2; ++h) {
    const int row = min(tile * 64 + warp * 16 + g + 8 * h, n - 1);
    w_row[h] = w + row * ldw + 16 * t;
    s_row[h] = scales + row * lds;
  }
  auto issue = [&](int c) {
    if (c < c_end) {
      uint8_t* sx = smem + (c % kRing) * kX;
      uint8_t* sw = rest + (c % kRing) * kRest;
      for (int jb = 0; jb < kBlocks; ++jb)
        for (int h = 0; h < 2; ++h) cp16(sw + ((jb * 2 + h) * kThreads + tid) * 16, w_row[h] + (c * kBlocks + jb) * 64);
      for (int h = 0; h < 2; ++h) cp16(sw + kBlocks * 2 * kThreads * 16 + (h * kThreads + tid) * 16, s_row[h] + 16 * c);
      for (int e = tid; e < kBlocks * 8 * 8; e += kThreads) {
        const int q = e & 7, r = (e >> 3) & 7, jb = e >> 6;
        cp16(sx + jb * 1024 + r * 128 + ((q ^ r) << 4), x + (c * kBlocks + jb) * 128 + 16 * q);  // token 0's row
      }
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
  };
  for (int s = 0; s < kRing - 1; ++s) issue(c_begin + s);
  unsigned acc = 0;
  for (int c = c_begin; c < c_end; ++c) {
    asm volatile("cp.async.wait_group 1;\n" ::: "memory");
    __syncthreads();
    issue(c + kRing - 1);
    const uint8_t* sw = rest + (c % kRing) * kRest;
    for (int i = 0; i < kBlocks * 2 + 2; ++i) acc += reinterpret_cast<const uint4*>(sw)[i * kThreads + tid].x;
  }
  asm volatile("cp.async.wait_all;\n" ::: "memory");
  if (acc == 0x12345678u) sink[0] = acc;
}

int main() {
  cudaFuncSetAttribute(stream, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  int sms = 0, per_sm = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, stream, kThreads, kSmem);
  std::printf("%d SMs, %d CTAs per SM fit (%d bytes of shared memory each)\n", sms, per_sm, kSmem);
  const int shapes[2][2] = {{7168, 16384}, {4096, 7168}};
  // Three weight copies of the larger shape's bytes and more, rotated, so that L2 (50-60 MB) does not serve them.
  const int copies = 4;
  const size_t w_bytes = size_t{7168} * 16384 / 2, s_bytes = size_t{7168} * 16384 / 32;
  uint8_t *w = nullptr, *s = nullptr, *x = nullptr;
  unsigned* sink = nullptr;
  cudaMalloc(&w, w_bytes * copies);
  cudaMalloc(&s, s_bytes * copies);
  cudaMalloc(&x, 16384);
  cudaMalloc(&sink, 4);
  cudaMemset(w, 0x11, w_bytes * copies);
  cudaMemset(s, 0x7f, s_bytes * copies);
  cudaMemset(x, 0x38, 16384);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  for (const auto& shape : shapes) {
    const int n = shape[0], k = shape[1], tiles = (n + 63) / 64, chunks = k / 512;
    for (int split = 2; split <= 8; ++split) {
      const int cps = (chunks + split - 1) / split, sk = (chunks + cps - 1) / cps;
      std::vector<float> ts;
      for (int rep = 0; rep < 20; ++rep) {
        const int cp = rep % copies;
        cudaEventRecord(e0);
        stream<<<tiles * sk, kThreads, kSmem>>>(w + cp * w_bytes, s + cp * s_bytes, x, n, k, sk, cps, sink);
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        ts.push_back(ms * 1000);
      }
      if (cudaGetLastError() != cudaSuccess) {
        std::printf("launch failed\n");
        return 1;
      }
      std::nth_element(ts.begin(), ts.begin() + ts.size() / 2, ts.end());
      const double us = ts[ts.size() / 2], bytes = double(n) * k / 2;
      std::printf("N=%-5d K=%-5d split %d (%4d CTAs, %.2f per SM): %7.2f us, %.2f TB/s of packed weights\n", n, k, sk,
                  tiles * sk, double(tiles * sk) / sms, us, bytes / us / 1e6);
    }
  }
  return 0;
}
