// Does `fence.proxy.async.shared::cta` (ptxas: MEMBAR.ALL.CTA + FENCE.VIEW.ASYNC.S) wait for the thread's global
// loads still in flight? The FP4 lean kernel's producers prefetch the next K block's scale word with __ldg and then,
// after their shared-memory stores, run this fence before arriving on the stage's full barrier (stop 53's question).
// Each thread issues one global load of a cold line (a 1 GiB buffer, a fresh line per thread and round), stores to
// shared memory, runs the fence (or not), and reads %clock64 before and after; the loaded value is used only after the
// second read. Prints the median cycles of the fence region with and without the fence, and of the load's full latency.
// Build: nvcc -O3 -arch=sm_90a bench/micro/membar_ldg.cu -o membar_ldg
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>

template <int kMode>  // 0: no fence; 1: fence.proxy.async.shared::cta; 2: no load in flight, fence
__global__ void probe(const unsigned* __restrict__ buf, size_t words, unsigned long long* out, unsigned* sink, int round) {
  __shared__ unsigned sm[1024];
  const unsigned tid = threadIdx.x + blockIdx.x * blockDim.x;
  size_t idx = (static_cast<size_t>(tid) * 977 + static_cast<size_t>(round) * 7919 * 1024) * 32 % words;
  unsigned v = 0;
  long long t0, t1, t2;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(t0)::"memory");
  if (kMode != 2) asm volatile("ld.global.nc.u32 %0, [%1];" : "=r"(v) : "l"(buf + idx) : "memory");
  sm[threadIdx.x] = threadIdx.x * 3u + 1u;
  if (kMode != 0) asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(t1)::"memory");
  v += sm[threadIdx.x ^ 1];
  asm volatile("add.u32 %0, %0, 1;" : "+r"(v));
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(t2)::"memory");
  out[2 * tid] = static_cast<unsigned long long>(t1 - t0);
  out[2 * tid + 1] = static_cast<unsigned long long>(t2 - t0);
  if (v == 0xFFFFFFFFu) sink[0] = v;
}

template <int kMode>
void run(const unsigned* buf, size_t words, const char* name) {
  const int blocks = 132, threads = 128, n = blocks * threads;
  unsigned long long* d_out;
  unsigned* sink;
  cudaMalloc(&d_out, 2 * n * sizeof(unsigned long long));
  cudaMalloc(&sink, 4);
  std::vector<unsigned long long> h(2 * n), a, b;
  for (int round = 0; round < 8; ++round) {
    probe<kMode><<<blocks, threads>>>(buf, words, d_out, sink, round);
    cudaMemcpy(h.data(), d_out, h.size() * 8, cudaMemcpyDeviceToHost);
    if (round == 0) continue;
    for (int i = 0; i < n; ++i) a.push_back(h[2 * i]), b.push_back(h[2 * i + 1]);
  }
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  printf("%-34s fence region median %6llu p10 %6llu p90 %6llu cycles; load-to-use median %6llu\n", name,
         a[a.size() / 2], a[a.size() / 10], a[a.size() * 9 / 10], b[b.size() / 2]);
  cudaFree(d_out);
  cudaFree(sink);
}

int main() {
  const size_t bytes = size_t{1} << 30, words = bytes / 4;
  unsigned* buf;
  if (cudaMalloc(&buf, bytes) != cudaSuccess) return 1;
  cudaMemset(buf, 1, bytes);
  run<0>(buf, words, "ldg, st.shared, no fence");
  run<1>(buf, words, "ldg, st.shared, fence.proxy.async");
  run<2>(buf, words, "st.shared, fence.proxy.async");
  cudaError_t e = cudaDeviceSynchronize();
  printf("status: %s\n", cudaGetErrorString(e));
  return e == cudaSuccess ? 0 : 1;
}
