// MoE routing: top_k_index [T, k] → per-expert contiguous rows, in a deterministic order (rows of expert e ordered
// by slot i = t·k + j), with no host synchronisation. Three launches:
//   1. moe_count_kernel: per chunk of kRouteChunk slots, a per-expert histogram (shared-memory atomics: only the
//      counts matter, not their order) and the number of invalid entries.
//   2. moe_scan_kernel (one block): per expert, an exclusive prefix over the chunks (in place: counts become chunk
//      bases) and over the experts (expert_offsets); the sum of the invalid entries (error_count).
//   3. moe_place_kernel: per chunk, each slot's rank among the chunk's earlier slots of the same expert. Each warp
//      owns kRouteSlotsPerWarp consecutive slots; a warp first counts its slots per expert, one scan over the warps
//      turns the counts into bases, then the warp walks its slots again in order, 32 at a time, ranking equal experts
//      by lane with __match_any_sync. row = expert_offsets[e] + chunk_base[chunk][e] + warp base + rank.
// When every slot fits in one chunk (decode), moe_route_one_chunk_kernel does the three steps in one block and one
// launch.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/kernels/quant_activations.cuh"
#include "cuda/runtime/moe_routing.hpp"

namespace finegemm::cuda {

inline constexpr int kRouteChunk = 1024;                               // slots per chunk (one block)
inline constexpr int kRouteThreads = 256;                              // threads of the count and place kernels
inline constexpr int kRouteWarps = kRouteThreads / 32;
inline constexpr int kRouteSlotsPerWarp = kRouteChunk / kRouteWarps;  // 128 consecutive slots per warp
inline constexpr int kRouteRounds = kRouteSlotsPerWarp / 32;          // 32 slots per round
inline constexpr int kMaxRouteExperts = 1024;
inline constexpr int kScanThreads = 1024;  // one thread per expert
static_assert(kRouteChunk % kRouteThreads == 0 && kRouteSlotsPerWarp % 32 == 0, "chunk: whole warps and rounds");
static_assert(kScanThreads >= kMaxRouteExperts && kScanThreads == 32 * 32, "scan: one thread per expert, 32 warps");

// The expert of slot i, or -1 when the slot is skipped (-1) or invalid (anything else outside [0, E); `invalid` set).
// NOTE: the range check runs on the stored type, so an int64 index of 2^32 never wraps into a valid expert.
template <typename index_t>
__device__ __forceinline__ int routed_expert(const index_t* __restrict__ top_k_index, int i, int num_experts,
                                             bool& invalid) {
  const int64_t v = static_cast<int64_t>(top_k_index[i]);
  invalid = v < -1 || v >= num_experts;
  return v >= 0 && v < num_experts ? static_cast<int>(v) : -1;
}

__device__ __forceinline__ float weight_to_float(float w) { return w; }
__device__ __forceinline__ float weight_to_float(__nv_bfloat16 w) { return __bfloat162float(w); }
__device__ __forceinline__ float weight_to_float(__half w) { return __half2float(w); }

// Step 1: chunk_counts[chunk][e] = slots of the chunk routed to e; chunk_errors[chunk] = invalid slots of the chunk.
template <typename index_t>
__global__ void __launch_bounds__(kRouteThreads)
    moe_count_kernel(const index_t* __restrict__ top_k_index, int num_slots, int num_experts,
                     int* __restrict__ chunk_counts, int* __restrict__ chunk_errors) {
  __shared__ int counts[kMaxRouteExperts];
  __shared__ int errors;
  for (int e = threadIdx.x; e < num_experts; e += blockDim.x) counts[e] = 0;
  if (threadIdx.x == 0) errors = 0;
  __syncthreads();

  // Histogram of the chunk (integer atomics: the totals do not depend on their order)
  const int begin = blockIdx.x * kRouteChunk;
  const int end = min(begin + kRouteChunk, num_slots);
  int my_errors = 0;
  for (int i = begin + threadIdx.x; i < end; i += blockDim.x) {
    bool invalid;
    const int e = routed_expert(top_k_index, i, num_experts, invalid);
    if (e >= 0) atomicAdd(&counts[e], 1);
    my_errors += invalid ? 1 : 0;
  }
  if (my_errors) atomicAdd(&errors, my_errors);
  __syncthreads();

  int* out = chunk_counts + static_cast<int64_t>(blockIdx.x) * num_experts;
  for (int e = threadIdx.x; e < num_experts; e += blockDim.x) out[e] = counts[e];
  if (threadIdx.x == 0) chunk_errors[blockIdx.x] = errors;
}

// Step 2 (one block of kScanThreads): chunk_counts become chunk bases (exclusive prefix over chunks, per expert),
// expert_offsets[e] = exclusive prefix over experts of the totals, expert_offsets[E] = routed rows,
// error_count = sum of chunk_errors.
__global__ void __launch_bounds__(kScanThreads)
    moe_scan_kernel(int* __restrict__ chunk_counts, const int* __restrict__ chunk_errors, int num_chunks,
                    int num_experts, int* __restrict__ expert_offsets, int* __restrict__ error_count) {
  const int e = threadIdx.x;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;

  // Prefix over the chunks of expert e (loads batched by 8 so that they overlap)
  int total = 0;
  if (e < num_experts) {
    int* column = chunk_counts + e;
    int c = 0;
    for (; c + 8 <= num_chunks; c += 8) {
      int counts[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) counts[u] = column[static_cast<int64_t>(c + u) * num_experts];
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        column[static_cast<int64_t>(c + u) * num_experts] = total;
        total += counts[u];
      }
    }
    for (; c < num_chunks; ++c) {
      const int count = column[static_cast<int64_t>(c) * num_experts];
      column[static_cast<int64_t>(c) * num_experts] = total;
      total += count;
    }
  }

  // Exclusive prefix over the experts: inclusive scan in each warp, then over the 32 warp sums
  int inclusive = total;
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const int other = __shfl_up_sync(0xFFFFFFFFu, inclusive, d);
    if (lane >= d) inclusive += other;
  }
  __shared__ int warp_base[32];
  if (lane == 31) warp_base[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    const int sum = warp_base[lane];
    int warp_inclusive = sum;
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const int other = __shfl_up_sync(0xFFFFFFFFu, warp_inclusive, d);
      if (lane >= d) warp_inclusive += other;
    }
    __syncwarp();
    warp_base[lane] = warp_inclusive - sum;
  }
  __syncthreads();
  const int exclusive = warp_base[warp] + inclusive - total;
  if (e < num_experts) expert_offsets[e] = exclusive;
  if (e == num_experts - 1) expert_offsets[num_experts] = exclusive + total;

  // Invalid entries of all chunks
  if (warp == 0) {
    int errors = 0;
    for (int c = lane; c < num_chunks; c += 32) errors += chunk_errors[c];
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) errors += __shfl_xor_sync(0xFFFFFFFFu, errors, offset);
    if (lane == 0) *error_count = errors;
  }
}

// ---- Steps a and c of the placement, one warp's kRouteSlotsPerWarp consecutive slots [warp_begin, warp_end).

// a. Counts the warp's slots per expert into counts[e] (lanes holding the same expert add once, from the lowest of
// them); experts[r] keeps each lane's expert of round r (-1: skipped). Returns the lane's number of invalid entries.
template <typename index_t>
__device__ __forceinline__ int count_warp_slots(const index_t* __restrict__ top_k_index, int warp_begin, int warp_end,
                                                int num_experts, int (&experts)[kRouteRounds], int* counts) {
  const int lane = threadIdx.x % 32;
  int invalid_entries = 0;
#pragma unroll
  for (int r = 0; r < kRouteRounds; ++r) {
    const int i = warp_begin + r * 32 + lane;
    bool invalid = false;
    experts[r] = i < warp_end ? routed_expert(top_k_index, i, num_experts, invalid) : -1;
    invalid_entries += invalid ? 1 : 0;
    const unsigned peers = __match_any_sync(0xFFFFFFFFu, experts[r]);
    if (experts[r] >= 0 && lane == __ffs(peers) - 1) counts[experts[r]] += __popc(peers);
    __syncwarp();
  }
  return invalid_entries;
}

// c. Places the warp's slots in order: bases[e] is the row of the warp's first slot of expert e; a slot's row adds its
// rank among the lanes below with the same expert, then the lowest of those lanes advances bases[e].
template <typename weight_t>
__device__ __forceinline__ void place_warp_slots(const weight_t* __restrict__ top_k_weights, int warp_begin,
                                                 int warp_end, int top_k, const int (&experts)[kRouteRounds],
                                                 int* bases, const MoeRouting& routing) {
  const int lane = threadIdx.x % 32;
  const unsigned lanes_below = (1u << lane) - 1u;
#pragma unroll
  for (int r = 0; r < kRouteRounds; ++r) {
    const int i = warp_begin + r * 32 + lane;
    const int e = experts[r];
    const unsigned peers = __match_any_sync(0xFFFFFFFFu, e);
    const int row = e >= 0 ? bases[e] + __popc(peers & lanes_below) : -1;
    __syncwarp();  // every lane has read its base before the lowest lane advances it
    if (e >= 0 && lane == __ffs(peers) - 1) bases[e] += __popc(peers);
    __syncwarp();
    if (i < warp_end) {
      routing.slot_row[i] = row;
      if (row >= 0) {
        routing.row_token[row] = i / top_k;
        routing.row_expert[row] = e;
        routing.row_weight[row] = weight_to_float(top_k_weights[i]);
      }
    }
  }
}

// Step 3: every slot of the chunk gets its row; slot_row, row_token, row_expert and row_weight are written.
template <typename index_t, typename weight_t>
__global__ void __launch_bounds__(kRouteThreads)
    moe_place_kernel(const index_t* __restrict__ top_k_index, const weight_t* __restrict__ top_k_weights,
                     int num_slots, int top_k, int num_experts, const int* __restrict__ chunk_base,
                     const int* __restrict__ expert_offsets, MoeRouting routing) {
  // warp_base[w][e]: warp w's count of expert e, then (after b) the row of its first slot of expert e
  __shared__ int warp_base[kRouteWarps][kMaxRouteExperts];
  const int warp = threadIdx.x / 32;
  for (int e = threadIdx.x; e < num_experts; e += blockDim.x)
#pragma unroll
    for (int w = 0; w < kRouteWarps; ++w) warp_base[w][e] = 0;
  __syncthreads();

  // a. Count each warp's slots per expert
  const int warp_begin = blockIdx.x * kRouteChunk + warp * kRouteSlotsPerWarp;
  const int warp_end = min(warp_begin + kRouteSlotsPerWarp, num_slots);
  int experts[kRouteRounds];
  count_warp_slots(top_k_index, warp_begin, warp_end, num_experts, experts, warp_base[warp]);
  __syncthreads();

  // b. Counts → bases: prefix over the warps, on top of the expert's offset and the chunk's base
  const int* chunk_base_row = chunk_base + static_cast<int64_t>(blockIdx.x) * num_experts;
  for (int e = threadIdx.x; e < num_experts; e += blockDim.x) {
    int run = expert_offsets[e] + chunk_base_row[e];
#pragma unroll
    for (int w = 0; w < kRouteWarps; ++w) {
      const int count = warp_base[w][e];
      warp_base[w][e] = run;
      run += count;
    }
  }
  __syncthreads();

  // c. Place the slots in order
  place_warp_slots(top_k_weights, warp_begin, warp_end, top_k, experts, warp_base[warp], routing);
}

// Decode path: all slots fit in one chunk (T·k ≤ kRouteChunk, T = 0 included), so one block does the three steps
// in one launch: count per warp, scan over the warps and the experts (expert_offsets, error_count), place.
template <typename index_t, typename weight_t>
__global__ void __launch_bounds__(kRouteThreads)
    moe_route_one_chunk_kernel(const index_t* __restrict__ top_k_index, const weight_t* __restrict__ top_k_weights,
                               int num_slots, int top_k, int num_experts, MoeRouting routing) {
  constexpr int kExpertsPerThread = kMaxRouteExperts / kRouteThreads;
  static_assert(kMaxRouteExperts % kRouteThreads == 0, "experts: a whole number per thread");
  __shared__ int warp_base[kRouteWarps][kMaxRouteExperts];
  __shared__ int warp_sums[kRouteWarps];
  __shared__ int errors;
  // The MoE decode path's chain of programmatic launches: wait for the kernel ahead (the caller's, which wrote
  // top_k_index), then let the next one (the permutation) start.
  wait_for_prior_grids();
  allow_dependent_launch();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int e = threadIdx.x; e < num_experts; e += blockDim.x)
#pragma unroll
    for (int w = 0; w < kRouteWarps; ++w) warp_base[w][e] = 0;
  if (threadIdx.x == 0) errors = 0;
  __syncthreads();

  // a. Count each warp's slots per expert, and the invalid entries
  const int warp_begin = warp * kRouteSlotsPerWarp;
  const int warp_end = min(warp_begin + kRouteSlotsPerWarp, num_slots);
  int experts[kRouteRounds];
  const int invalid_entries = count_warp_slots(top_k_index, warp_begin, warp_end, num_experts, experts,
                                               warp_base[warp]);
  if (invalid_entries) atomicAdd(&errors, invalid_entries);  // an integer sum: its order does not matter
  __syncthreads();

  // b. Thread `tid` owns experts [tid·kExpertsPerThread, +kExpertsPerThread): warp counts → bases relative to the
  // expert's first row, then an exclusive prefix over all experts' totals gives expert_offsets.
  const int first_expert = threadIdx.x * kExpertsPerThread;
  int totals[kExpertsPerThread];
  int my_total = 0;
#pragma unroll
  for (int q = 0; q < kExpertsPerThread; ++q) {
    const int e = first_expert + q;
    int run = 0;
    if (e < num_experts) {
#pragma unroll
      for (int w = 0; w < kRouteWarps; ++w) {
        const int count = warp_base[w][e];
        warp_base[w][e] = run;
        run += count;
      }
    }
    totals[q] = run;
    my_total += run;
  }
  int inclusive = my_total;
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const int other = __shfl_up_sync(0xFFFFFFFFu, inclusive, d);
    if (lane >= d) inclusive += other;
  }
  if (lane == 31) warp_sums[warp] = inclusive;
  __syncthreads();
  int offset = inclusive - my_total;
  for (int w = 0; w < warp; ++w) offset += warp_sums[w];
#pragma unroll
  for (int q = 0; q < kExpertsPerThread; ++q) {
    const int e = first_expert + q;
    if (e < num_experts) {
      routing.expert_offsets[e] = offset;
#pragma unroll
      for (int w = 0; w < kRouteWarps; ++w) warp_base[w][e] += offset;
    }
    offset += totals[q];
  }
  if (threadIdx.x == blockDim.x - 1) {
    routing.expert_offsets[num_experts] = offset;  // the last thread's running offset is the number of routed rows
    *routing.error_count = errors;
  }
  __syncthreads();

  // c. Place the slots in order
  place_warp_slots(top_k_weights, warp_begin, warp_end, top_k, experts, warp_base[warp], routing);
}

}  // namespace finegemm::cuda
