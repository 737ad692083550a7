// A minimal stage ring with the GEMM's release protocol, for compute-sanitizer racecheck: stop 26's racecheck of the
// cluster GEMM kernels (pairs sharing A, 2x2 blocks) reported hazards between the scale-loader warp's shared writes
// and the consumers' reads of the same stage, which the single-CTA kernels (same protocol, local arrivals only) never
// showed. This ring has nothing else: one loader warp fills a stage after its empty barrier completes, four consumer
// warps read it after its full barrier completes and release it in their own CTA and (in a cluster) in the peer, as
// the GEMM's consumers do. Racecheck clean here without a cluster and flagged with one would place the reports in how
// the tool follows remote mbarrier arrivals; flagged with the default (CTA-scope) remote arrival but clean with a
// cluster-scope release (and the loader's wait an acquire at cluster scope) would place them in the memory model,
// and the GEMM would need the stronger pair. As in the GEMM's reports, the data is local to each CTA: only the
// barrier's arrivals cross CTAs.
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "cuda/ptx/ptx.cuh"
#include "cluster_ring_probe.hpp"

namespace finegemm::testing {
namespace {

namespace ptx = finegemm::cuda::ptx;

constexpr int kStages = 4;
constexpr int kLaps = 64;
constexpr int kSlot = 128;  // ints per stage, one per consumer thread

// The waiting side of mode 2: an acquire at cluster scope, so that it pairs with the peer's cluster-scope release.
__device__ __forceinline__ void wait_acquire_cluster(uint64_t* bar, uint32_t parity) {
  while (!ptx::cp::mbarrier_try_wait_parity(ptx::cp::sem_acquire, ptx::cp::scope_cluster, bar, parity)) {
  }
}

__device__ __forceinline__ void arrive_remote_release_cluster(uint64_t* bar, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(ptx::smem_addr(bar)), "r"(rank));
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(remote) : "memory");
}

// Warp 0: loader; warps 1..4: consumers. mode: 0 one CTA, 1 a pair with the GEMM's remote arrival, 2 a pair with a
// cluster-scope release on the remote arrival, 3 one CTA where every consumer thread arrives (no __syncwarp).
// NOTE: stop 27's racecheck flagged mode 0 too (31248 hazards: consumer reads vs the loader's next-lap writes), so
// the reports do not come from the cluster. Mode 3 tells whether the tool follows a warp's reads through __syncwarp
// into lane 0's arrival (bar.warp.sync orders the warp's memory accesses, and the arrival is a release at CTA scope:
// the protocol is sound under the PTX memory model either way).
__global__ void __launch_bounds__(160) cluster_ring_probe_kernel(int mode, int* mismatches) {
  __shared__ int slots[kStages][kSlot];
  __shared__ alignas(8) uint64_t full[kStages];
  __shared__ alignas(8) uint64_t empty[kStages];
  const bool pair = mode == 1 || mode == 2;
  const bool thread_arrive = mode == 3;
  const uint32_t rank = pair ? ptx::cluster_ctarank() : 0u;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      ptx::mbar_init(&full[s], 32);
      ptx::mbar_init(&empty[s], thread_arrive ? 128 : 4 * (pair ? 2 : 1));
    }
    ptx::fence_barrier_init();
  }
  if (pair) ptx::cluster_sync();
  else __syncthreads();
  int bad = 0;
  for (int it = 0; it < kStages * kLaps; ++it) {
    const int s = it % kStages;
    const uint32_t lap = static_cast<uint32_t>(it / kStages);
    if (warp == 0) {
      if (mode == 2) wait_acquire_cluster(&empty[s], (lap & 1u) ^ 1u);
      else ptx::mbar_wait(&empty[s], (lap & 1u) ^ 1u);
#pragma unroll
      for (int j = 0; j < kSlot / 32; ++j) slots[s][lane + 32 * j] = it * 1000 + static_cast<int>(rank) * 500 + lane + 32 * j;
      ptx::mbar_arrive(&full[s]);
    } else {
      const int t = threadIdx.x - 32;
      ptx::mbar_wait(&full[s], lap & 1u);
      bad += slots[s][t] != it * 1000 + static_cast<int>(rank) * 500 + t;
      if (thread_arrive) {
        ptx::mbar_arrive(&empty[s]);
        continue;
      }
      __syncwarp();
      if (lane == 0) {
        ptx::mbar_arrive(&empty[s]);
        if (mode == 1) ptx::mbar_arrive_cluster(&empty[s], rank ^ 1u);
        if (mode == 2) arrive_remote_release_cluster(&empty[s], rank ^ 1u);
      }
    }
  }
  if (bad) atomicAdd(mismatches, bad);
  // No CTA leaves while its peer may still arrive on its barriers.
  if (pair) ptx::cluster_sync();
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

}  // namespace

int run_cluster_ring_probe(int mode) {
  if (mode < 0 || mode > 3) throw std::invalid_argument("run_cluster_ring_probe: mode must be 0, 1, 2 or 3, got " + std::to_string(mode));
  int* d = nullptr;
  check(cudaMalloc(&d, sizeof(int)), "cudaMalloc");
  check(cudaMemset(d, 0, sizeof(int)), "cudaMemset");
  cudaLaunchConfig_t cfg = {};
  const bool pair = mode == 1 || mode == 2;
  cfg.gridDim = dim3(pair ? 2 : 1);
  cfg.blockDim = dim3(160);
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = pair ? 2 : 1;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  check(cudaLaunchKernelEx(&cfg, cluster_ring_probe_kernel, mode, d), "cluster_ring_probe_kernel launch");
  check(cudaDeviceSynchronize(), "cluster_ring_probe_kernel");
  int h = -1;
  check(cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost), "cudaMemcpy");
  check(cudaFree(d), "cudaFree");
  return h;
}

}  // namespace finegemm::testing
