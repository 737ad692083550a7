// Thin wrappers over the sm_90 instructions the kernels use. TMA and mbarrier go through CCCL's cuda::ptx;
// wgmma (not covered there) and setmaxnreg are inline PTX.
#pragma once
#include <cuda.h>  // CUtensorMap (types only: the driver is reached through the runtime's entry points)
#include <cuda/ptx>

#include <cstdint>

namespace finegemm::cuda::ptx {
namespace cp = ::cuda::ptx;

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---- mbarrier
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) { cp::mbarrier_init(bar, count); }
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  while (!cp::mbarrier_try_wait_parity(bar, parity)) {
  }
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) { (void)cp::mbarrier_arrive(bar); }
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  (void)cp::mbarrier_arrive_expect_tx(cp::sem_release, cp::scope_cta, cp::space_shared, bar, bytes);
}
// Adds expected transaction bytes without arriving (the arrivals come later, after the thread's own shared writes).
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  cp::mbarrier_expect_tx(cp::sem_relaxed, cp::scope_cta, cp::space_shared, bar, bytes);
}
// Make freshly initialised barriers visible to the async proxy (TMA) before first use.
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Generic-proxy shared-memory writes that TMA or wgmma read next need this before the barrier.
__device__ __forceinline__ void fence_proxy_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// ---- cp.async (4-byte global → shared copies), completion tracked by an mbarrier
__device__ __forceinline__ void cp_async_4(void* smem_dst, const void* gmem_src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem_addr(smem_dst)), "l"(gmem_src) : "memory");
}
// One arrival on `bar` once this thread's earlier cp.async copies have landed. .noinc: the arrival counts toward the
// barrier's expected count (set at init), as a normal arrive would.
__device__ __forceinline__ void cp_async_mbar_arrive_noinc(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}

// Waits until this thread's cp.async copies have landed.
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

// ---- TMA
__device__ __forceinline__ void prefetch_tensor_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1) {
  const int32_t coords[2] = {c0, c1};
  cp::cp_async_bulk_tensor(cp::space_cluster, cp::space_global, dst, map, coords, bar);
}
// The tile at (c0, c1) into L2 only (no shared memory, no barrier): cp.async.bulk.prefetch.tensor, which CCCL's
// cuda::ptx does not wrap in CUDA 13.0.
__device__ __forceinline__ void tma_prefetch_l2_2d(const CUtensorMap* map, int c0, int c1) {
  asm volatile("cp.async.bulk.prefetch.tensor.2d.L2.global.tile [%0, {%1, %2}];\n" ::"l"(reinterpret_cast<uint64_t>(map)),
               "r"(c0), "r"(c1)
               : "memory");
}
// The box at (c0, c1) of `map` from shared memory (`src`, laid out as the map's box and swizzle) to global memory,
// in this thread's current bulk group (bulk_commit_group closes it). Rows and columns past the tensor are not written.
__device__ __forceinline__ void tma_store_2d(const CUtensorMap* map, const void* src, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(smem_addr(src)), "r"(c0), "r"(c1)
               : "memory");
}
__device__ __forceinline__ void bulk_commit_group() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Until at most kPending of this thread's bulk groups are still reading their shared-memory sources.
template <int kPending>
__device__ __forceinline__ void bulk_wait_group_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
}
// Until at most kPending of this thread's bulk groups are incomplete (their writes done).
template <int kPending>
__device__ __forceinline__ void bulk_wait_group() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(kPending) : "memory");
}
// Four 8x8 matrices of 16-bit values to shared memory: lanes 8j..8j+7 give the row addresses of matrix j (16 bytes
// each), and register j of lane l holds row l / 4, elements 2 (l % 4) and 2 (l % 4) + 1 of matrix j (the mma
// accumulator fragment's layout).
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3)
               : "memory");
}
__device__ __forceinline__ void tma_load_3d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1, int c2) {
  const int32_t coords[3] = {c0, c1, c2};
  cp::cp_async_bulk_tensor(cp::space_cluster, cp::space_global, dst, map, coords, bar);
}

// A contiguous global → shared copy by the async proxy (cp.async.bulk), completing `bytes` on `bar`. Source and
// destination 16-byte aligned, bytes a multiple of 16.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  cp::cp_async_bulk(cp::space_cluster, cp::space_global, dst, src, bytes, bar);
}

// ---- clusters (2-CTA clusters sharing B tiles through TMA multicast)
__device__ __forceinline__ uint32_t cluster_ctarank() { return cp::get_sreg_cluster_ctarank(); }
// Every thread of every CTA of the cluster: arrive (release), then wait (acquire).
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\n" ::: "memory");
  asm volatile("barrier.cluster.wait.acquire;\n" ::: "memory");
}
// The same barrier with a relaxed arrival (no release fence: the thread publishes no writes through it, e.g. when it
// only keeps its CTA's shared memory alive until the cluster's reads of it are done).
__device__ __forceinline__ void cluster_sync_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed;\n" ::: "memory");
  asm volatile("barrier.cluster.wait;\n" ::: "memory");
}
// Arrive on the barrier at the same shared-memory offset in CTA `rank` of the cluster (the consumers' stage release:
// their reads of the stage are complete, so the default release.cta semantics order everything that matters).
// NOTE: with `.release.cluster` ptxas put MEMBAR.ALL.CTA, MEMBAR.ALL.GPU and two error barriers before every arrive:
// ~25% of the 2-CTA cluster GEMM's warp samples stalled on them (ncu, stop 23; 515 TFLOP/s against 948 without
// clusters at M=4096 N=4096 K=7168).
__device__ __forceinline__ void mbar_arrive_cluster(uint64_t* bar, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(smem_addr(bar)), "r"(rank));
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(remote) : "memory");
}
// A float at the same shared-memory offset as `local` in CTA `rank` of the cluster (distributed shared memory).
__device__ __forceinline__ float ld_shared_cluster_f32(const float* local, uint32_t rank) {
  uint32_t remote;
  float v;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(smem_addr(local)), "r"(rank));
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(remote) : "memory");
  return v;
}
// TMA 2-D load written to the same offset in every CTA of cta_mask, completing bytes on each one's barrier there.
__device__ __forceinline__ void tma_load_2d_multicast(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1,
                                                      uint16_t cta_mask) {
  const int32_t coords[2] = {c0, c1};
  cp::cp_async_bulk_tensor(cp::space_cluster, cp::space_global, dst, map, coords, bar, cta_mask);
}

// ---- wgmma
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  static_assert(kPending >= 0 && kPending <= 7, "wgmma.wait_group takes 0..7");
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// Keeps the compiler from moving accumulator accesses across wgmma fences/waits.
template <int N>
__device__ __forceinline__ void fence_operands(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// Shared-memory matrix descriptor: K-major operand, 128-byte swizzle, rows of 128 bytes, 8-row groups 1024 B apart;
// the tile base must be 1024-byte aligned. Built in two 32-bit halves for hot loops: the low word (start address
// >> 4, leading byte offset 1, unused for swizzled K-major) of the buffer at shared address `addr`, and the constant
// high word (stride byte offset 1024 >> 4, 128B swizzle in bit 62). A byte offset `off` (a multiple of 16) within
// the buffer adds off >> 4 to the low word: shared addresses stay below 256 KB, so the 14-bit start field never
// carries into the next field.
__device__ __forceinline__ uint32_t desc_lo_k_major_sw128(uint32_t addr) { return ((addr & 0x3FFFFu) >> 4) | (1u << 16); }
constexpr uint32_t kDescHiKMajorSw128 = (1024u >> 4) | (1u << 30);
__device__ __forceinline__ uint64_t desc_from_words(uint32_t lo, uint32_t hi) {
  return (static_cast<uint64_t>(hi) << 32) | lo;
}
// mbarrier parity wait on a barrier given by its shared address (no generic-to-shared conversion in the loop).
__device__ __forceinline__ void mbar_wait_shared(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}

// ---- named barriers (0 is __syncthreads): `kThreads` arrive, a multiple of 32; arrive does not wait.
// NOTE: the id is an immediate: passed in a register, ptxas reserved all 16 barriers for the kernel.
template <int kId, int kThreads>
__device__ __forceinline__ void named_bar_sync() {
  static_assert(kId > 0 && kId < 16 && kThreads % 32 == 0, "named barrier: id 1..15, a multiple of 32 threads");
  asm volatile("bar.sync %0, %1;\n" ::"n"(kId), "n"(kThreads) : "memory");
}
template <int kId, int kThreads>
__device__ __forceinline__ void named_bar_arrive() {
  static_assert(kId > 0 && kId < 16 && kThreads % 32 == 0, "named barrier: id 1..15, a multiple of 32 threads");
  asm volatile("bar.arrive %0, %1;\n" ::"n"(kId), "n"(kThreads) : "memory");
}

// bar.red.and over `kThreads` threads: waits as named_bar_sync does and returns whether `pred` held in all of them.
template <int kId, int kThreads>
__device__ __forceinline__ bool named_bar_red_and(bool pred) {
  static_assert(kId > 0 && kId < 16 && kThreads % 32 == 0, "named barrier: id 1..15, a multiple of 32 threads");
  uint32_t all;
  asm volatile(
      "{\n.reg .pred p, q;\nsetp.ne.u32 p, %1, 0;\nbar.red.and.pred q, %2, %3, p;\nselp.u32 %0, 1, 0, q;\n}\n"
      : "=r"(all)
      : "r"(static_cast<uint32_t>(pred)), "n"(kId), "n"(kThreads)
      : "memory");
  return all != 0u;
}

// ---- flags between CTAs of one grid (the lean kernel's stream-K fixup): a GPU-scope acquire load and release store.
__device__ __forceinline__ int ld_acquire_gpu(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release_gpu(int* p, int v) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

// ---- register reallocation between warpgroups
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

}  // namespace finegemm::cuda::ptx
