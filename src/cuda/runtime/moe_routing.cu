// Host launchers of the MoE routing, permutation and combine kernels (see moe_routing.hpp). Arguments are checked
// before anything is launched; every launch is stream-ordered, with no host synchronisation.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>

#include "cuda/kernels/moe_combine.cuh"
#include "cuda/kernels/moe_permute.cuh"
#include "cuda/kernels/moe_routing.cuh"
#include "cuda/runtime/check.hpp"
#include "cuda/runtime/gemm_launch.cuh"
#include "cuda/runtime/moe_routing.hpp"
#include "cuda/runtime/quant_activations.hpp"

namespace finegemm::cuda {
namespace {

std::string str(int64_t v) { return std::to_string(v); }

// Where a launch goes: the stream, and whether the kernel may start before the one ahead of it completes
// (programmatic stream serialization; the kernels wait for it before they touch memory: wait_for_prior_grids).
struct StreamLaunch {
  cudaStream_t stream;
  bool programmatic;
};

int64_t route_chunks(int64_t num_tokens, int top_k) { return (num_tokens * top_k + kRouteChunk - 1) / kRouteChunk; }

void check_routing_sizes(int64_t num_tokens, int top_k, const char* where) {
  if (num_tokens < 0) throw Error(std::string(where) + ": num_tokens: expected ≥ 0, got " + str(num_tokens));
  if (top_k < 1) throw Error(std::string(where) + ": top_k: expected ≥ 1, got " + str(top_k));
  if (num_tokens * top_k > std::numeric_limits<int32_t>::max())
    throw Error(std::string(where) + ": num_tokens·top_k: expected < 2^31 routed slots, got " +
                str(num_tokens * top_k));
}

void check_aligned(const void* p, size_t alignment, const char* name) {
  if (reinterpret_cast<uintptr_t>(p) % alignment != 0)
    throw Error(std::string(name) + ": expected a " + str(static_cast<int64_t>(alignment)) +
                "-byte aligned device pointer");
}

void check_routing_pointers(const MoeRouting& r, const char* where) {
  const std::pair<const void*, const char*> fields[] = {
      {r.expert_offsets, "expert_offsets"}, {r.row_token, "row_token"},   {r.row_expert, "row_expert"},
      {r.row_weight, "row_weight"},         {r.slot_row, "slot_row"},     {r.error_count, "error_count"}};
  for (const auto& [p, name] : fields)
    if (!p) throw Error(std::string(where) + ": routing." + name + ": expected a device pointer, got null");
}

template <typename index_t, typename weight_t>
void launch_route_typed(const index_t* top_k_index, const weight_t* top_k_weights, int num_slots, int top_k,
                        int num_experts, const MoeRouting& routing, void* workspace, StreamLaunch stream) {
  const int num_chunks = (num_slots + kRouteChunk - 1) / kRouteChunk;
  if (num_chunks <= 1) {
    // NOTE: decode (T·k ≤ 1024): one launch instead of three; the workspace is not touched.
    launch_programmatic(stream.programmatic, moe_route_one_chunk_kernel<index_t, weight_t>, 1, kRouteThreads, 0,
                        stream.stream, top_k_index, top_k_weights, num_slots, top_k, num_experts, routing);
    FG_CUDA_CHECK(cudaGetLastError());
    return;
  }
  // Chunked path: count per chunk, scan (one block), place per chunk
  int* chunk_counts = static_cast<int*>(workspace);                                   // [chunks, E]
  int* chunk_errors = chunk_counts + static_cast<int64_t>(num_chunks) * num_experts;  // [chunks]
  moe_count_kernel<index_t><<<num_chunks, kRouteThreads, 0, stream.stream>>>(top_k_index, num_slots, num_experts,
                                                                       chunk_counts, chunk_errors);
  FG_CUDA_CHECK(cudaGetLastError());
  moe_scan_kernel<<<1, kScanThreads, 0, stream.stream>>>(chunk_counts, chunk_errors, num_chunks, num_experts,
                                                  routing.expert_offsets, routing.error_count);
  FG_CUDA_CHECK(cudaGetLastError());
  moe_place_kernel<index_t, weight_t><<<num_chunks, kRouteThreads, 0, stream.stream>>>(
      top_k_index, top_k_weights, num_slots, top_k, num_experts, chunk_counts, routing.expert_offsets, routing);
  FG_CUDA_CHECK(cudaGetLastError());
}

template <typename index_t>
void launch_route_weights(const index_t* top_k_index, const void* top_k_weights, DType weight_dtype, int num_slots,
                          int top_k, int num_experts, const MoeRouting& routing, void* workspace, StreamLaunch stream) {
  switch (weight_dtype) {
    case DType::F32:
      return launch_route_typed(top_k_index, static_cast<const float*>(top_k_weights), num_slots, top_k, num_experts,
                                routing, workspace, stream);
    case DType::BF16:
      return launch_route_typed(top_k_index, static_cast<const __nv_bfloat16*>(top_k_weights), num_slots, top_k,
                                num_experts, routing, workspace, stream);
    case DType::F16:
      return launch_route_typed(top_k_index, static_cast<const __half*>(top_k_weights), num_slots, top_k,
                                num_experts, routing, workspace, stream);
    default:
      throw Error(ErrorKind::Type,
                  std::string("top_k_weights: expected float32, bfloat16 or float16, got ") + dtype_name(weight_dtype));
  }
}

// ---- permute + quantize

// The fewest vectors per thread (1, 2, 4 or 8) that cover the row with at most kPermuteMaxThreads threads.
constexpr int kPermuteMaxThreads = 512;

template <typename T, int kVecs, PermuteQuant kQuant, bool kPermK>
void launch_permute_vecs(const T* hidden, int64_t num_tokens, int hidden_size, int top_k, const MoeRouting& routing,
                         const float* static_scales, bool pow2, uint8_t* x_q, float* x_scale, StreamLaunch stream) {
  const int num_vectors = hidden_size / 8;
  const int threads = ((num_vectors + kVecs - 1) / kVecs + 31) / 32 * 32;
  launch_programmatic(stream.programmatic, moe_permute_quantize_kernel<T, kVecs, kQuant, kPermK>,
                      static_cast<unsigned>(num_tokens), threads, 0, stream.stream, hidden, hidden_size, top_k,
                      routing.slot_row, routing.row_expert, static_scales, pow2, x_q, x_scale);
  FG_CUDA_CHECK(cudaGetLastError());
}

template <typename T, PermuteQuant kQuant, bool kPermK = false>
void launch_permute_quant(const T* hidden, int64_t num_tokens, int hidden_size, int top_k, const MoeRouting& routing,
                          const float* static_scales, bool pow2, uint8_t* x_q, float* x_scale, StreamLaunch stream) {
  const int num_vectors = hidden_size / 8;
  if (num_vectors <= kPermuteMaxThreads)
    launch_permute_vecs<T, 1, kQuant, kPermK>(hidden, num_tokens, hidden_size, top_k, routing, static_scales, pow2, x_q,
                                      x_scale, stream);
  else if (num_vectors <= 2 * kPermuteMaxThreads)
    launch_permute_vecs<T, 2, kQuant, kPermK>(hidden, num_tokens, hidden_size, top_k, routing, static_scales, pow2, x_q,
                                      x_scale, stream);
  else if (num_vectors <= 4 * kPermuteMaxThreads)
    launch_permute_vecs<T, 4, kQuant, kPermK>(hidden, num_tokens, hidden_size, top_k, routing, static_scales, pow2, x_q,
                                      x_scale, stream);
  else
    launch_permute_vecs<T, 8, kQuant, kPermK>(hidden, num_tokens, hidden_size, top_k, routing, static_scales, pow2, x_q,
                                      x_scale, stream);
}

// perm_k: the FP4 decode kernel's K order (groups of 128, per token or static only: the caller checks).
template <typename T>
void launch_permute_typed(const T* hidden, int64_t num_tokens, int hidden_size, int top_k, const MoeRouting& routing,
                          const ActivationRecipe& recipe, const float* static_scales, uint8_t* x_q, float* x_scale,
                          StreamLaunch stream, bool perm_k) {
  const bool pow2 = recipe.pow2_scale;
  if (perm_k) {
    switch (recipe.granularity) {
      case ActGranularity::PerTokenGroup:
        return launch_permute_quant<T, PermuteQuant::Group128, true>(hidden, num_tokens, hidden_size, top_k, routing,
                                                                     static_scales, pow2, x_q, x_scale, stream);
      case ActGranularity::PerToken:
        return launch_permute_quant<T, PermuteQuant::Token, true>(hidden, num_tokens, hidden_size, top_k, routing,
                                                                  static_scales, pow2, x_q, x_scale, stream);
      case ActGranularity::StaticPerTensor:
        return launch_permute_quant<T, PermuteQuant::Static, true>(hidden, num_tokens, hidden_size, top_k, routing,
                                                                   static_scales, pow2, x_q, x_scale, stream);
    }
  }
  switch (recipe.granularity) {
    case ActGranularity::PerTokenGroup:
      if (recipe.group_size == 128)
        return launch_permute_quant<T, PermuteQuant::Group128>(hidden, num_tokens, hidden_size, top_k, routing,
                                                               static_scales, pow2, x_q, x_scale, stream);
      return launch_permute_quant<T, PermuteQuant::Group32>(hidden, num_tokens, hidden_size, top_k, routing,
                                                            static_scales, pow2, x_q, x_scale, stream);
    case ActGranularity::PerToken:
      return launch_permute_quant<T, PermuteQuant::Token>(hidden, num_tokens, hidden_size, top_k, routing,
                                                          static_scales, pow2, x_q, x_scale, stream);
    case ActGranularity::StaticPerTensor:
      return launch_permute_quant<T, PermuteQuant::Static>(hidden, num_tokens, hidden_size, top_k, routing,
                                                           static_scales, pow2, x_q, x_scale, stream);
  }
}

// ---- combine

template <typename y_t, typename out_t>
void launch_combine_typed(const y_t* y, const int* slot_row, int64_t num_tokens, int top_k, int hidden_size,
                          out_t* out, StreamLaunch stream) {
  const int num_vectors = hidden_size / 8;
  const int threads = std::min(kCombineMaxThreads, (num_vectors + 31) / 32 * 32);
  const dim3 grid(static_cast<unsigned>(num_tokens), static_cast<unsigned>((num_vectors + threads - 1) / threads));
  launch_programmatic(stream.programmatic, moe_combine_kernel<y_t, out_t>, grid, threads, 0, stream.stream, y, slot_row,
                      top_k, hidden_size, out);
  FG_CUDA_CHECK(cudaGetLastError());
}

template <typename y_t>
void launch_combine_out(const y_t* y, const int* slot_row, int64_t num_tokens, int top_k, int hidden_size, void* out,
                        DType out_dtype, StreamLaunch stream) {
  switch (out_dtype) {
    case DType::F32:
      return launch_combine_typed(y, slot_row, num_tokens, top_k, hidden_size, static_cast<float*>(out), stream);
    case DType::BF16:
      return launch_combine_typed(y, slot_row, num_tokens, top_k, hidden_size, static_cast<__nv_bfloat16*>(out),
                                  stream);
    case DType::F16:
      return launch_combine_typed(y, slot_row, num_tokens, top_k, hidden_size, static_cast<__half*>(out), stream);
    default:
      throw Error(ErrorKind::Type,
                  std::string("out: expected float32, bfloat16 or float16, got ") + dtype_name(out_dtype));
  }
}

}  // namespace

size_t moe_route_workspace_bytes(int64_t num_tokens, int top_k, int num_experts) {
  const int64_t chunks = route_chunks(std::max<int64_t>(num_tokens, 0), std::max(top_k, 0));
  const int64_t ints = chunks * (std::max(num_experts, 0) + 1);  // chunk_counts [chunks, E] + chunk_errors [chunks]
  return static_cast<size_t>((ints * 4 + 255) / 256 * 256);
}

void launch_moe_route(const void* top_k_index, DType index_dtype, const void* top_k_weights, DType weight_dtype,
                      int64_t num_tokens, int top_k, int num_experts, const MoeRouting& routing, void* workspace,
                      cudaStream_t stream, bool programmatic) {
  check_routing_sizes(num_tokens, top_k, "moe_route");
  if (num_experts < 1 || num_experts > kMaxRouteExperts)
    throw Error("moe_route: num_experts: expected 1 to " + str(kMaxRouteExperts) + ", got " + str(num_experts));
  if (index_dtype != DType::I32 && index_dtype != DType::I64)
    throw Error(ErrorKind::Type, std::string("top_k_index: expected int32 or int64, got ") + dtype_name(index_dtype));
  if (weight_dtype != DType::F32 && weight_dtype != DType::BF16 && weight_dtype != DType::F16)
    throw Error(ErrorKind::Type,
                std::string("top_k_weights: expected float32, bfloat16 or float16, got ") + dtype_name(weight_dtype));
  check_routing_pointers(routing, "moe_route");
  if (num_tokens > 0) {
    if (!top_k_index) throw Error("top_k_index: expected a device pointer, got null");
    if (!top_k_weights) throw Error("top_k_weights: expected a device pointer, got null");
    if (!workspace)
      throw Error("workspace: expected " + str(static_cast<int64_t>(moe_route_workspace_bytes(num_tokens, top_k,
                                                                                              num_experts))) +
                  " bytes of device memory (moe_route_workspace_bytes), got null");
    check_aligned(workspace, 4, "workspace");
  }

  const int num_slots = static_cast<int>(num_tokens * top_k);
  if (index_dtype == DType::I32)
    launch_route_weights(static_cast<const int32_t*>(top_k_index), top_k_weights, weight_dtype, num_slots, top_k,
                         num_experts, routing, workspace, StreamLaunch{stream, programmatic});
  else
    launch_route_weights(static_cast<const int64_t*>(top_k_index), top_k_weights, weight_dtype, num_slots, top_k,
                         num_experts, routing, workspace, StreamLaunch{stream, programmatic});
}

void launch_moe_permute_quantize(const void* hidden, DType hidden_dtype, int64_t num_tokens, int64_t hidden_size,
                                 int top_k, const MoeRouting& routing, const ActivationRecipe& recipe,
                                 const float* static_scales, uint8_t* x_q, float* x_scale, cudaStream_t stream,
                                 bool programmatic, bool perm_k) {
  check_routing_sizes(num_tokens, top_k, "moe_permute_quantize");
  if (perm_k && !quantize_perm_k_ok(recipe, hidden_size))
    throw Error("x_q: permuted K (the FP4 decode order) needs H % 128 == 0 and, for group scales, groups of 128, got H=" +
                str(hidden_size) + " for " + recipe.name());
  constexpr int64_t kMaxHidden = 8 * 8 * kPermuteMaxThreads;  // 8 vectors of 8 per thread, 512 threads
  if (hidden_size <= 0 || hidden_size % 16 != 0 || hidden_size > kMaxHidden)
    throw Error("hidden: expected a hidden size that is a positive multiple of 16 and at most " + str(kMaxHidden) +
                ", got H=" + str(hidden_size));
  switch (recipe.granularity) {
    case ActGranularity::PerTokenGroup:
      if (recipe.group_size != 32 && recipe.group_size != 128)
        throw Error("activation.group_size: expected 32 or 128, got " + str(recipe.group_size));
      if (hidden_size % recipe.group_size != 0)
        throw Error("hidden: expected H to be a multiple of the activation group " + str(recipe.group_size) +
                    ", got H=" + str(hidden_size));
      if (!x_scale && num_tokens > 0) throw Error("x_scale: expected a device pointer for the dynamic scales, got null");
      break;
    case ActGranularity::PerToken:
      if (!x_scale && num_tokens > 0) throw Error("x_scale: expected a device pointer for the dynamic scales, got null");
      break;
    case ActGranularity::StaticPerTensor:
      if (!static_scales && num_tokens > 0)
        throw Error("static_scales: expected the [E] per-expert static activation scales, got null");
      break;
  }
  if (hidden_dtype != DType::F32 && hidden_dtype != DType::BF16 && hidden_dtype != DType::F16)
    throw Error(ErrorKind::Type,
                std::string("hidden: expected float32, bfloat16 or float16, got ") + dtype_name(hidden_dtype));
  if (num_tokens == 0) return;
  if (!hidden) throw Error("hidden: expected a device pointer, got null");
  if (!x_q) throw Error("x_q: expected a device pointer, got null");
  if (!routing.slot_row || !routing.row_expert)
    throw Error("moe_permute_quantize: routing.slot_row and routing.row_expert: expected device pointers, got null");
  check_aligned(hidden, 16, "hidden");
  check_aligned(x_q, 8, "x_q");
  if (x_scale) check_aligned(x_scale, 4, "x_scale");

  const int h = static_cast<int>(hidden_size);
  switch (hidden_dtype) {
    case DType::F32:
      return launch_permute_typed(static_cast<const float*>(hidden), num_tokens, h, top_k, routing, recipe,
                                  static_scales, x_q, x_scale, StreamLaunch{stream, programmatic}, perm_k);
    case DType::BF16:
      return launch_permute_typed(static_cast<const __nv_bfloat16*>(hidden), num_tokens, h, top_k, routing, recipe,
                                  static_scales, x_q, x_scale, StreamLaunch{stream, programmatic}, perm_k);
    default:
      return launch_permute_typed(static_cast<const __half*>(hidden), num_tokens, h, top_k, routing, recipe,
                                  static_scales, x_q, x_scale, StreamLaunch{stream, programmatic}, perm_k);
  }
}

void launch_moe_combine(const void* y, DType y_dtype, const MoeRouting& routing, int64_t num_tokens, int top_k,
                        int64_t hidden_size, void* out, DType out_dtype, cudaStream_t stream, bool programmatic) {
  check_routing_sizes(num_tokens, top_k, "moe_combine");
  if (hidden_size <= 0 || hidden_size % 8 != 0 || hidden_size > std::numeric_limits<int32_t>::max())
    throw Error("y: expected a hidden size that is a positive multiple of 8, got H=" + str(hidden_size));
  if (y_dtype != DType::F32 && y_dtype != DType::BF16 && y_dtype != DType::F16)
    throw Error(ErrorKind::Type, std::string("y: expected float32, bfloat16 or float16, got ") + dtype_name(y_dtype));
  if (out_dtype != DType::F32 && out_dtype != DType::BF16 && out_dtype != DType::F16)
    throw Error(ErrorKind::Type,
                std::string("out: expected float32, bfloat16 or float16, got ") + dtype_name(out_dtype));
  if (num_tokens == 0) return;
  if (!y) throw Error("y: expected a device pointer, got null");
  if (!out) throw Error("out: expected a device pointer, got null");
  if (!routing.slot_row) throw Error("moe_combine: routing.slot_row: expected a device pointer, got null");
  check_aligned(y, 16, "y");
  check_aligned(out, 16, "out");

  const int h = static_cast<int>(hidden_size);
  switch (y_dtype) {
    case DType::F32:
      return launch_combine_out(static_cast<const float*>(y), routing.slot_row, num_tokens, top_k, h, out, out_dtype,
                                StreamLaunch{stream, programmatic});
    case DType::BF16:
      return launch_combine_out(static_cast<const __nv_bfloat16*>(y), routing.slot_row, num_tokens, top_k, h, out,
                                out_dtype, StreamLaunch{stream, programmatic});
    default:
      return launch_combine_out(static_cast<const __half*>(y), routing.slot_row, num_tokens, top_k, h, out, out_dtype,
                                StreamLaunch{stream, programmatic});
  }
}

}  // namespace finegemm::cuda
