// moe_experts on the GPU: route → permute + quantize → grouped gate_up GEMM with the activation and the
// requantization fused in its epilogue → grouped down GEMM with the routing weight in its epilogue → combine.
// Every step is stream-ordered with no host synchronisation: the whole block can be captured in one CUDA graph.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <optional>

#include "cuda/cuda_backend.hpp"
#include "cuda/kernels/moe_activation_kernel.cuh"
#include "cuda/runtime/check.hpp"
#include "cuda/runtime/gemm_args.hpp"
#include "cuda/runtime/host_fallback.hpp"
#include "cuda/runtime/moe.hpp"
#include "cuda/runtime/moe_routing.hpp"
#include "cuda/runtime/quant_activations.hpp"
#include "cuda/runtime/sm90_fp8_gemm.hpp"

namespace finegemm::cuda {

bool moe_per_token_gpu_enabled() {
  const char* env = std::getenv("FINEGEMM_MOE_PER_TOKEN_GPU");
  return env && *env == '1';
}

// NOTE: measured on the H200 (stop 24: bench/results/stop24_call2_2026-12-02.json and
// stop24_moe_unfused_2026-12-02_d161a6a.json), T = 4096, dynamic group 128: DeepSeek-V3 layer 7909-8076 -> 5577-5657 us,
// Qwen3-30B-A3B 1431-1443 -> 697-705 us, Qwen3 T = 1024 958 -> 322 us with the unfused gate_up: the fused epilogue
// needs whole 128-column requantization groups in a tile (128x256, one accumulator set), the Store path runs 128x128
// tiles with two accumulator sets; the F32 round trip of the gate_up output costs less than that difference.
bool moe_gate_up_unfused(int64_t rows, int64_t gate_up_cols) {
  const char* env = std::getenv("FINEGEMM_MOE_UNFUSED");
  if (env && *env == '0') return false;
  // NOTE: the F32 gate_up output is scratch of rows x 2I x 4 bytes (DeepSeek-V3: 537 MB at T = 4096); past 4 GiB
  // (T > 32768 there) the fused path, which needs none, takes over.
  return rows * gate_up_cols * 4 <= (int64_t{4} << 30);
}

namespace {

// A dtype switch for a scratch buffer (FINEGEMM_MOE_Y): true for "bf16", false for "f32",
// nothing when unset; any other value is an error that names the variable.
std::optional<bool> forced_bf16(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  if (std::strcmp(v, "bf16") == 0) return true;
  if (std::strcmp(v, "f32") == 0) return false;
  throw Error(std::string(name) + ": expected bf16 or f32, got '" + v + "'");
}

// The one-pass activation + requantization for group sizes 32, 64, 128 and 256 and static scales (one per expert);
// false (nothing launched) for other groups.
template <typename T>
bool launch_moe_activation_quantize(const T* y, int64_t ld, int64_t rows, int64_t inter, MoeGateLayout layout,
                                    const MoeArgs& args, const ActivationRecipe& act, const int32_t* offsets,
                                    int num_experts, const float* static_scale, uint8_t* h_q, float* h_scale, cudaStream_t stream) {
  const int64_t threads = rows * inter / 8;
  const int blocks = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>((threads + 255) / 256, 132 * 16)));
  const int act_kind = static_cast<int>(args.activation);
  const auto go = [&](auto kernel) {
    kernel<<<blocks, 256, 0, stream>>>(y, ld, rows, inter, layout, act_kind, args.swiglu_limit, args.swiglu_alpha,
                                       offsets, num_experts, static_scale, h_q, h_scale);
    FG_CUDA_CHECK(cudaGetLastError());
    return true;
  };
  if (act.is_static()) {
    if (static_scale == nullptr)
      throw Error("down_act_scale: a static activation recipe needs the intermediate's per-expert scales, got none");
    return go(moe_activation_quantize_kernel<0, false, T>);
  }
  const bool pow2 = act.pow2_scale;
  if (act.group_size <= 0 || inter % act.group_size != 0) return false;  // the quantizer's fallback names the error
  switch (act.group_size) {
    case 32: return pow2 ? go(moe_activation_quantize_kernel<32, true, T>) : go(moe_activation_quantize_kernel<32, false, T>);
    case 64: return pow2 ? go(moe_activation_quantize_kernel<64, true, T>) : go(moe_activation_quantize_kernel<64, false, T>);
    case 128: return pow2 ? go(moe_activation_quantize_kernel<128, true, T>) : go(moe_activation_quantize_kernel<128, false, T>);
    case 256: return pow2 ? go(moe_activation_quantize_kernel<256, true, T>) : go(moe_activation_quantize_kernel<256, false, T>);
    default: return false;
  }
}

}  // namespace

std::string moe_gpu_path_refusal(const MoeArgs& args, bool allow_per_token) {
  const int64_t num_tokens = args.hidden.shape[0], hidden = args.hidden.shape[1];
  const int top_k = static_cast<int>(args.top_k_index.shape[1]);
  const int num_experts = static_cast<int>(args.gate_up.shape[0]);
  const bool fp4 = args.weight_recipe.element == ElementType::FP4_E2M1;
  const int64_t inter = args.down.shape[2] * (fp4 ? 2 : 1);
  const auto& act = args.activation_recipe;
  const int promote_k = promotion_k(args.weight_recipe, act);
  const auto str = [](int64_t v) { return std::to_string(v); };
  // What the grouped sm_90a path serves. NOTE: per-token requantization of the intermediate needs the amax of a
  // whole row of I, across tiles: it and odd shapes take the host path for now. FP4 experts (MX 1x32 scales) are
  // expanded to E4M3 in shared memory by the same kernels.
  if (fp4 && !(args.weight_recipe.granularity == WeightGranularity::MX && promote_k == 32))
    return "weight_recipe: FP4 experts run on the GPU with MX 1x32 scales and 1x32 (or 1x128) activation groups, got " +
           args.weight_recipe.name() + " with activations " + act.name();
  if (act.granularity == ActGranularity::PerToken && !allow_per_token)
    return "activation_recipe: per-token activation scales are not served by the GPU MoE kernels (the intermediate's "
           "per-row amax spans tiles); use per-token-group or static scales";
  if (num_experts > kMaxGroupedExperts)
    return "gate_up: the grouped GEMM takes at most " + str(kMaxGroupedExperts) + " experts, got " + str(num_experts);
  if (num_experts <= 0) return "gate_up: expected at least one expert, got 0";
  if (hidden % 128 != 0 || hidden > 32768)
    return "hidden: the GPU kernels take H a multiple of 128 and at most 32768, got H=" + str(hidden);
  if (inter % 128 != 0) return "down: the GPU kernels take I a multiple of 128, got I=" + str(inter);
  if (promote_k != 0 && promote_k % 32 != 0)
    return "weight_recipe: the GPU kernels promote every 32 or 128 elements of K; " + args.weight_recipe.name() +
           " with activations " + act.name() + " needs every " + str(promote_k);
  if (!aligned16(args.hidden.data)) return "hidden: expected a 16-byte aligned device pointer";
  if (!aligned16(args.gate_up.data)) return "gate_up: expected a 16-byte aligned device pointer";
  if (!aligned16(args.down.data)) return "down: expected a 16-byte aligned device pointer";
  if (!aligned16(args.out.data)) return "out: expected a 16-byte aligned device pointer";
  if (top_k <= 0) return "top_k_index: expected k >= 1 slots per token, got 0";
  if (num_tokens * top_k > INT32_MAX / 2)
    return "hidden: T·k = " + str(num_tokens * top_k) + " routed rows, the GPU kernels take at most 2^30";
  return {};
}


// The expert GEMMs' common parameters (shapes, promotion, weight scales, bias; a_group for group scales):
// gate_up: K = H, B rows 2I (or I without a gate); down: K = I, B rows H.
GemmParams moe_expert_gemm_params(const MoeArgs& args, bool gate_up, int64_t rows) {
  const bool fp4 = args.weight_recipe.element == ElementType::FP4_E2M1;
  const int64_t hidden = args.down.shape[1], inter = args.down.shape[2] * (fp4 ? 2 : 1);
  const int64_t n = gate_up ? args.gate_up.shape[1] : hidden, k = gate_up ? hidden : inter;
  const int promote_k = promotion_k(args.weight_recipe, args.activation_recipe);
  GemmParams p;
  p.m = static_cast<int>(rows);
  p.n = static_cast<int>(n);
  p.k = static_cast<int>(k);
  p.promote_k = promote_k == 0 ? 128 : promote_k;
  p.b_fp4 = fp4;
  set_weight_scales(p, args.weight_recipe, gate_up ? args.gate_up_scale : args.down_scale, n, k);
  set_bias(p, gate_up ? args.gate_up_bias : args.down_bias, n);
  if (args.activation_recipe.granularity == ActGranularity::PerTokenGroup) p.a_group = args.activation_recipe.group_size;
  return p;
}

MoeGateLayout moe_gate_layout(const MoeArgs& args) {
  if (!moe_activation_has_gate(args.activation)) return MoeGateLayout::NoGate;
  return args.interleaved_gate_up ? MoeGateLayout::Interleaved : MoeGateLayout::Halves;
}

void moe_expert_gemms(const MoeArgs& args, const PermutedRows& in, void* y, bool y_f32, cudaStream_t stream,
                      const MoeDecodeScratch* decode_scratch, bool chain, bool weights_constant) {
  if (in.rows > 0 && moe_decode_path(args, in.rows))
    return moe_expert_gemms_decode(args, in, y, y_f32, stream, decode_scratch, chain);
  if (in.perm_k)
    throw Error("moe experts: rows quantized in the FP4 decode kernel's order reached the grouped path (rows=" +
                std::to_string(in.rows) + ")");
  const int64_t hidden = args.down.shape[1];
  const bool gated = moe_activation_has_gate(args.activation);
  const bool fp4 = args.weight_recipe.element == ElementType::FP4_E2M1;
  const int64_t inter = args.down.shape[2] * (fp4 ? 2 : 1);
  const int64_t gate_up_rows = args.gate_up.shape[1];
  const auto& act = args.activation_recipe;
  const bool dynamic = !act.is_static();
  const int64_t rows = in.rows;
  if (rows == 0) return;
  const bool per_token = act.granularity == ActGranularity::PerToken;

  GroupedLayout layout;
  layout.offsets = in.expert_offsets;
  layout.num_groups = in.num_experts;
  layout.expected_rows_per_group = rows / std::max(1, in.num_experts);

  // gate_up with the activation and the requantization fused: h [rows, I] E4M3.
  const int64_t x_scale_cols = dynamic && !per_token ? hidden / act.group_size : 0;
  const int64_t h_scale_cols = dynamic && !per_token ? inter / act.group_size : 0;
  StreamScratch h_q(rows * inter, stream), h_scale(per_token ? rows * 4 : (dynamic ? rows * h_scale_cols * 4 : 16), stream);
  if (per_token || moe_gate_up_unfused(rows, gate_up_rows)) {
    // Per-token: one scale per row of I, whose amax spans every column tile. gate_up stores F32 (scales and bias
    // applied), one kernel applies the activation, and the activation quantizer takes each row's amax.
    // Unfused group and static recipes (FINEGEMM_MOE_UNFUSED): gate_up on the Store path's 128x128 tiles (two
    // accumulator sets), then one pass applies the activation and requantizes (moe_activation_quantize_kernel).
    // NOTE: the intermediate reaches memory in F32 on these paths only (the fused path keeps it in registers).
    // NOTE: BF16 scratch here (stop 25's FINEGEMM_MOE_SCRATCH=bf16) halved these bytes but missed the 1e-2 bar:
    // rel 1.1-1.4e-2 on every recipe, as BF16-rounded gate and up values flip FP8 roundings of the requantized h.
    StreamScratch y_gu(rows * gate_up_rows * 4, stream);
    GemmParams p = moe_expert_gemm_params(args, true, rows);
    p.weights_constant = weights_constant;
    if (per_token)
      set_activation_scales(p, act, in.x_scale, 1, 1, hidden, nullptr);
    else
      set_activation_scales(p, act, in.x_scale, x_scale_cols, 1, hidden, in.gate_up_act_scale);
    p.out = y_gu.as<void>();
    p.out_dtype = OutDType::F32;
    p.ldo = gate_up_rows;
    launch_sm90_fp8_grouped_gemm(in.x_q, hidden, args.gate_up.data, args.gate_up.strides[1], layout, Epilogue::Store,
                                 p, stream);
    const MoeGateLayout gate_layout = moe_gate_layout(args);
    const int32_t* routed = in.expert_offsets + in.num_experts;
    const int blocks = static_cast<int>(std::min<int64_t>((rows * inter + 255) / 256, 132 * 16));
    if (!per_token && launch_moe_activation_quantize(y_gu.as<float>(), gate_up_rows, rows, inter, gate_layout,
                                                            args, act, in.expert_offsets, in.num_experts,
                                                            in.down_act_scale, h_q.as<uint8_t>(), h_scale.as<float>(),
                                                            stream)) {
      // done in one pass
    } else {
      StreamScratch h(rows * inter * 4, stream);
      moe_activation_kernel<<<blocks, 256, 0, stream>>>(y_gu.as<float>(), gate_up_rows, rows, inter, gate_layout,
                                                        static_cast<int>(args.activation), args.swiglu_limit,
                                                        args.swiglu_alpha, routed, h.as<float>());
      FG_CUDA_CHECK(cudaGetLastError());
      // Per-token, and groups the one-pass kernel has no instance for (static recipes always take it).
      launch_quantize_activations(h.as<void>(), DType::F32, rows, inter, act, h_q.as<uint8_t>(), h_scale.as<float>(),
                                  stream);
    }
  } else {
    GemmParams p = moe_expert_gemm_params(args, true, rows);
    p.weights_constant = weights_constant;
    set_activation_scales(p, act, in.x_scale, x_scale_cols, 1, hidden, in.gate_up_act_scale);
    p.b_layout = !gated ? BLayout::Plain : (args.interleaved_gate_up ? BLayout::Interleaved : BLayout::GateUpHalves);
    p.gate_up_split = static_cast<int>(inter);
    p.act_kind = static_cast<int>(args.activation);
    p.swiglu_limit = args.swiglu_limit;
    p.swiglu_alpha = args.swiglu_alpha;
    p.requant_group = dynamic ? act.group_size : 0;
    p.requant_pow2 = act.pow2_scale;
    p.requant_static = dynamic ? nullptr : in.down_act_scale;
    p.out_q = h_q.as<uint8_t>();
    p.out_q_scale = h_scale.as<float>();
    p.ld_q = inter;
    p.ld_q_scale = h_scale_cols;
    p.out_cols = static_cast<int>(inter);
    launch_sm90_fp8_grouped_gemm(in.x_q, hidden, args.gate_up.data, args.gate_up.strides[1], layout,
                                 Epilogue::ActRequant, p, stream);
  }

  // down, times the routing weight: y [rows, H].
  {
    GemmParams p = moe_expert_gemm_params(args, false, rows);
    p.weights_constant = weights_constant;
    set_activation_scales(p, act, h_scale.as<float>(), h_scale_cols, 1, inter, in.down_act_scale);
    p.row_weight = in.row_weight;
    p.out = y;
    p.out_dtype = y_f32 ? OutDType::F32 : OutDType::BF16;
    p.ldo = hidden;
    launch_sm90_fp8_grouped_gemm(h_q.as<void>(), inter, args.down.data, args.down.strides[1], layout, Epilogue::Store,
                                 p, stream);
  }
}

void moe_experts(const MoeArgs& args, void* stream_handle, bool weights_constant) {
  const DeviceGuard guard(args.hidden.device.index);
  const auto stream = static_cast<cudaStream_t>(stream_handle);
  const int64_t num_tokens = args.hidden.shape[0], hidden = args.hidden.shape[1];
  const int top_k = static_cast<int>(args.top_k_index.shape[1]);
  // Per-token activations take the general GPU path only with FINEGEMM_MOE_PER_TOKEN_GPU=1 until it has run on the
  // H200; the decode path serves them (one block quantizes each intermediate row).
  const bool per_token_ok = moe_per_token_gpu_enabled() || moe_decode_path(args, num_tokens * top_k);
  if (!moe_gpu_path_refusal(args, per_token_ok).empty()) return moe_on_host(args, stream);
  const int num_experts = static_cast<int>(args.gate_up.shape[0]);
  const auto& act = args.activation_recipe;
  if (num_tokens == 0) return;
  const int64_t rows = num_tokens * top_k;

  // Every scratch buffer is allocated before the first kernel: on the decode path the kernels are launched
  // programmatically (moe_decode_pdl_chain), and an allocation between two of them (a graph memory node under capture)
  // would keep the second from starting before the first completes.
  const bool decode = moe_decode_path(args, rows);
  const bool chain = decode && moe_decode_pdl_chain();
  StreamScratch offsets((num_experts + 1) * 4, stream), row_token(rows * 4, stream), row_expert(rows * 4, stream),
      row_weight(rows * 4, stream), slot_row(rows * 4, stream), error_count(4, stream),
      route_ws(moe_route_workspace_bytes(num_tokens, top_k, num_experts), stream);
  const bool dynamic = !act.is_static();
  const bool per_token = act.granularity == ActGranularity::PerToken;
  const int64_t x_scale_cols = dynamic && !per_token ? hidden / act.group_size : 0;
  StreamScratch x_q(rows * hidden, stream),
      x_scale(per_token ? rows * 4 : (dynamic ? rows * x_scale_cols * 4 : 16), stream);
  // NOTE: y is FP32 while it stays under 1 GiB (exact sums in the combine), BF16 beyond (T·k·H large prefill).
  // FINEGEMM_MOE_Y=bf16 / f32 forces either (comparisons: at DeepSeek-V3 T = 4096 the FP32 y is 940 MB, written by
  // down and read by the combine; not yet measured on the GPU).
  const bool y_f32 = !forced_bf16("FINEGEMM_MOE_Y").value_or(rows * hidden * 4 > (int64_t(1) << 30));
  StreamScratch y(rows * hidden * (y_f32 ? 4 : 2), stream);
  std::optional<MoeDecodeScratch> decode_scratch;
  if (decode) decode_scratch.emplace(args, rows, num_experts, stream);

  // 1. Routing.
  MoeRouting routing;
  routing.expert_offsets = offsets.as<int32_t>();
  routing.row_token = row_token.as<int32_t>();
  routing.row_expert = row_expert.as<int32_t>();
  routing.row_weight = row_weight.as<float>();
  routing.slot_row = slot_row.as<int32_t>();
  routing.error_count = error_count.as<int32_t>();
  launch_moe_route(args.top_k_index.data, args.top_k_index.dtype, args.top_k_weights.data, args.top_k_weights.dtype,
                   num_tokens, top_k, num_experts, routing, route_ws.as<void>(), stream, chain);

  // 2. Each token row read once, quantized, written to its experts' segments.
  const float* gate_up_act_scale = args.gate_up_act_scale.defined() ? args.gate_up_act_scale.ptr<float>() : nullptr;
  // On the decode path with FP4 experts, in the permuted order of the decode kernel (moe_decode_perm_wanted: by
  // default since stop 43).
  const bool perm_k = decode && moe_decode_perm_wanted(args, rows);
  launch_moe_permute_quantize(args.hidden.data, args.hidden.dtype, num_tokens, hidden, top_k, routing, act,
                              gate_up_act_scale, x_q.as<uint8_t>(), x_scale.as<float>(), stream, chain, perm_k);

  // 3-4. gate_up (activation and requantization fused), then down times the routing weight: y [rows, H].
  PermutedRows in;
  in.x_q = x_q.as<uint8_t>();
  in.x_scale = x_scale.as<float>();
  in.row_weight = routing.row_weight;
  in.expert_offsets = routing.expert_offsets;
  in.rows = rows;
  in.num_experts = num_experts;
  in.gate_up_act_scale = gate_up_act_scale;
  in.down_act_scale = args.down_act_scale.defined() ? args.down_act_scale.ptr<float>() : nullptr;
  in.perm_k = perm_k;
  moe_expert_gemms(args, in, y.as<void>(), y_f32, stream, decode_scratch ? &*decode_scratch : nullptr, chain,
                   weights_constant);

  // 5. Combine: one gather per token, slots summed in order.
  launch_moe_combine(y.as<void>(), y_f32 ? DType::F32 : DType::BF16, routing, num_tokens, top_k, hidden, args.out.data,
                     args.out.dtype, stream, chain);
}

}  // namespace finegemm::cuda
