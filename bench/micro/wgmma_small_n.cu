// How many small-N FP8 wgmma (m64nNk32) can an SM retire per microsecond, with A from registers (the FP4 decode
// kernels' expanded weights) or from shared memory, and how long is one chain of four? Stop 60's question: every FP4
// decode kernel variant, including one with a third fewer instructions (sm90_fp4_decode_ldg.cuh), ran at ~3 blocks of
// 64 weight rows x 128 of K per µs per SM (four chained m64n8k32 each), which is also the FP8 decode kernel's stage
// rate. If the tensor pipe or the chain latency of small-N wgmma sets that rate, this probe shows it without any
// memory traffic.
// Each CTA is one warpgroup over a shared-memory A tile (64 x 128 bytes) and B tile (N x 128 bytes, 128-byte swizzle);
// per iteration it issues `steps` wgmma into one accumulator (a chain: the decode kernels' four k32 steps per 128 of
// K), or into `steps` separate accumulators (independent), commits, and waits for the group. Grids of 1..4 CTAs per
// SM. Prints cycles per iteration (the median CTA, %clock64) and wgmma per µs per SM at the measured clock.
// Build: nvcc -O3 -std=c++20 -gencode arch=compute_90a,code=sm_90a -I src bench/micro/wgmma_small_n.cu -o wgmma_small_n
// (or the micro_wgmma_small_n target). Run: ./wgmma_small_n [iters]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda/ptx/ptx.cuh"
#include "cuda/ptx/wgmma_fp8.cuh"

namespace ptx = finegemm::cuda::ptx;

constexpr int kSmemBytes = 1024 + 64 * 128 + 256 * 128;

// kRegA: A from registers (WgmmaFp8RegA) or shared memory (WgmmaFp8). kChain: the steps accumulate into one
// accumulator; else each step has its own.
template <int N, bool kRegA, bool kChain, int kSteps>
__global__ void __launch_bounds__(128) probe(int iters, float* sink, long long* cycles) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (ptx::smem_addr(smem_raw) & 1023)) & 1023);
  // 0.5 in every E4M3 byte of both tiles (no overflow over any number of iterations' sums).
  for (int i = static_cast<int>(threadIdx.x); i < (64 * 128 + N * 128) / 4; i += 128)
    reinterpret_cast<uint32_t*>(smem)[i] = 0x30303030u;
  __syncthreads();
  const uint32_t desc_a = ptx::desc_lo_k_major_sw128(ptx::smem_addr(smem));
  const uint32_t desc_b = ptx::desc_lo_k_major_sw128(ptx::smem_addr(smem + 64 * 128));
  constexpr uint32_t kHi = ptx::kDescHiKMajorSw128;
  uint32_t a[4] = {0x30303030u, 0x30303030u, 0x30303030u, 0x30303030u};
  constexpr int kAcc = N / 2;
  constexpr int kSets = kChain ? 1 : kSteps;
  float acc[kSets][kAcc];
#pragma unroll
  for (int c = 0; c < kSets; ++c)
#pragma unroll
    for (int i = 0; i < kAcc; ++i) acc[c][i] = 0.0f;
  long long t0 = 0;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(t0)::"memory");
  for (int it = 0; it < iters; ++it) {
    ptx::wgmma_fence();
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      float(&d)[kAcc] = acc[kChain ? 0 : s];
      const uint64_t b = ptx::desc_from_words(desc_b + static_cast<uint32_t>((s % 4) * 2), kHi);
      if constexpr (kRegA) {
        ptx::WgmmaFp8RegA<N>::mma(a, b, d, true);
      } else {
        ptx::WgmmaFp8<N>::mma(ptx::desc_from_words(desc_a + static_cast<uint32_t>((s % 4) * 2), kHi), b, d, true);
      }
    }
    ptx::wgmma_commit();
    ptx::wgmma_wait<0>();
#pragma unroll
    for (int c = 0; c < kSets; ++c) ptx::fence_operands(acc[c]);
  }
  long long t1 = 0;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(t1)::"memory");
  float v = 0.0f;
#pragma unroll
  for (int c = 0; c < kSets; ++c)
#pragma unroll
    for (int i = 0; i < kAcc; ++i) v += acc[c][i];
  if (v == -1.0f) sink[0] = v;  // never: keeps the accumulators live
  if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
#endif
}

template <int N, bool kRegA, bool kChain, int kSteps>
void run(int iters, int sms, float* sink, long long* d_cycles, double clock_ghz) {
  const auto kernel = probe<N, kRegA, kChain, kSteps>;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  for (int per_sm = 1; per_sm <= 4; ++per_sm) {
    const int grid = sms * per_sm;
    kernel<<<grid, 128, kSmemBytes>>>(iters, sink, d_cycles);  // warm-up
    kernel<<<grid, 128, kSmemBytes>>>(iters, sink, d_cycles);
    if (cudaDeviceSynchronize() != cudaSuccess) {
      std::printf("launch failed: %s\n", cudaGetErrorString(cudaGetLastError()));
      std::exit(1);
    }
    std::vector<long long> c(static_cast<size_t>(grid));
    cudaMemcpy(c.data(), d_cycles, sizeof(long long) * grid, cudaMemcpyDeviceToHost);
    std::nth_element(c.begin(), c.begin() + grid / 2, c.end());
    const double per_iter = static_cast<double>(c[grid / 2]) / iters;
    const double wgmma_per_us_sm = per_sm * kSteps / per_iter * clock_ghz * 1e3;
    std::printf("N=%-3d A=%-4s %-11s steps=%d CTAs/SM=%d: %7.1f cycles/iter, %6.1f wgmma/us/SM, "
                "%5.2f x4-chains/us/SM\n", N, kRegA ? "regs" : "smem", kChain ? "chain" : "independent", kSteps,
                per_sm, per_iter, wgmma_per_us_sm, wgmma_per_us_sm / 4);
  }
}

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 2000;
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  int clock_khz = 0;
  cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0);
  const double ghz = clock_khz / 1e6;  // the boost clock: the rates assume the SMs ran at it
  std::printf("%s, %d SMs, clock %.2f GHz, %d iterations\n", prop.name, prop.multiProcessorCount, ghz, iters);
  float* sink = nullptr;
  long long* d_cycles = nullptr;
  cudaMalloc(&sink, 4);
  cudaMalloc(&d_cycles, sizeof(long long) * prop.multiProcessorCount * 4);
  const int sms = prop.multiProcessorCount;
  run<8, true, true, 4>(iters, sms, sink, d_cycles, ghz);
  run<8, false, true, 4>(iters, sms, sink, d_cycles, ghz);
  run<8, true, false, 4>(iters, sms, sink, d_cycles, ghz);
  run<8, true, true, 16>(iters, sms, sink, d_cycles, ghz);
  run<64, true, true, 4>(iters, sms, sink, d_cycles, ghz);
  run<64, false, true, 4>(iters, sms, sink, d_cycles, ghz);
  run<256, false, true, 4>(iters, sms, sink, d_cycles, ghz);
  cudaFree(sink);
  cudaFree(d_cycles);
  return 0;
}
