// Host side of the MoE routing, permutation and combine kernels (src/cuda/kernels/moe_routing.cuh,
// moe_permute.cuh, moe_combine.cuh). Every launch is stream-ordered with no host synchronisation, so the whole
// MoE block can be captured in one CUDA graph.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "finegemm/recipe.hpp"
#include "finegemm/tensor.hpp"

namespace finegemm::cuda {

// Device buffers describing one routing, sized for T·k routed rows ("permuted rows").
// Rows of expert e are [expert_offsets[e], expert_offsets[e+1]) in the contiguous layout; within an expert,
// rows are ordered by (token, slot) ascending, so the layout is deterministic.
struct MoeRouting {
  int32_t* expert_offsets = nullptr;  // [E + 1]; expert_offsets[E] = number of routed rows
  int32_t* row_token = nullptr;       // [T·k]: source token of each permuted row (entries ≥ routed rows unused)
  int32_t* row_expert = nullptr;      // [T·k]: expert of each permuted row
  float* row_weight = nullptr;        // [T·k]: routing weight of each permuted row (as float)
  int32_t* slot_row = nullptr;        // [T·k]: permuted row of slot (t, j), or -1 when the slot is skipped
  int32_t* error_count = nullptr;     // [1]: slots whose index was neither -1 nor in [0, E) (skipped, counted)
};

// Scratch the routing kernels need (in bytes), for T tokens, k slots and E experts.
size_t moe_route_workspace_bytes(int64_t num_tokens, int top_k, int num_experts);

// `programmatic` (the MoE decode path): the kernel is launched with programmatic stream serialization, so that it is
// resident before the kernel ahead of it completes; it waits for that kernel (griddepcontrol.wait) before it touches
// memory, and lets the next kernel launch at once. (The routing's chunked path, T·k > 1024, launches the ordinary way.)

// top_k_index [T, k] I32/I64 (-1 = skip), top_k_weights [T, k] F32/BF16/F16 → routing (all of it written,
// error_count included: it is zeroed by the launch).
void launch_moe_route(const void* top_k_index, DType index_dtype, const void* top_k_weights, DType weight_dtype,
                      int64_t num_tokens, int top_k, int num_experts, const MoeRouting& routing, void* workspace,
                      cudaStream_t stream, bool programmatic = false);

// Each token row of hidden [T, H] (F32/BF16/F16) is read once, quantized per `recipe`, and written to every permuted
// row it routes to: x_q [T·k, H] E4M3, x_scale [T·k, H/group] (group) or [T·k] (token). Static recipe: the scale of
// permuted row r is static_scales[row_expert[r]] (x_scale unused). Rows past expert_offsets[E] are not written.
// perm_k: each row's codes in the FP4 decode kernel's K order within each 128 of H (GemmParams::a_perm_k;
// quantize_perm_k_ok: H % 128 == 0, groups of 128).
void launch_moe_permute_quantize(const void* hidden, DType hidden_dtype, int64_t num_tokens, int64_t hidden_size,
                                 int top_k, const MoeRouting& routing, const ActivationRecipe& recipe,
                                 const float* static_scales, uint8_t* x_q, float* x_scale, cudaStream_t stream,
                                 bool programmatic = false, bool perm_k = false);

// out[t] = Σ_{j = 0..k-1, slot_row[t,j] ≥ 0} y[slot_row[t, j]] in slot order (deterministic, no atomics).
// y [T·k, H] is F32 or BF16 (rows already scaled by their routing weight); out [T, H] F32/BF16/F16.
// Tokens with no routed slot get zeros.
void launch_moe_combine(const void* y, DType y_dtype, const MoeRouting& routing, int64_t num_tokens, int top_k,
                        int64_t hidden_size, void* out, DType out_dtype, cudaStream_t stream,
                        bool programmatic = false);

}  // namespace finegemm::cuda
