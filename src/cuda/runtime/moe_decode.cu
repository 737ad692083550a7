// The MoE block at decode sizes (src/cuda/kernels/moe_decode.cuh): which calls take it, and its sequence of
// launches (expert list, gate_up on the grouped decode kernel, activation + quantization per row, down).
#include <algorithm>
#include <cstdlib>
#include <optional>

#include "cuda/cuda_backend.hpp"
#include "cuda/kernels/moe_decode.cuh"
#include "cuda/runtime/check.hpp"
#include "cuda/runtime/gemm_args.hpp"
#include "cuda/runtime/gemm_launch.cuh"
#include "cuda/runtime/moe.hpp"
#include "cuda/runtime/quant_activations.hpp"
#include "cuda/runtime/sm90_fp8_gemm.hpp"

namespace finegemm::cuda {

namespace {

// Rows per expert the decode path sizes its token tiles for (twice the mean over the experts that can have rows): up to
// 64, or 128 on permuted activations (its kernel's widest token tile).
int decode_rows_per_expert(int64_t rows, int num_experts, bool perm_k) {
  const int64_t experts = std::max<int64_t>(1, std::min<int64_t>(num_experts, rows));
  return static_cast<int>(std::clamp<int64_t>(2 * ((rows + experts - 1) / experts), 1, perm_k ? 128 : 64));
}

}  // namespace

bool moe_decode_path(const MoeArgs& args, int64_t rows) {
  const int num_experts = static_cast<int>(args.gate_up.shape[0]);
  const char* env = std::getenv("FINEGEMM_MOE_DECODE");
  if (env && *env == '0') return false;
  // Up to 16 rows per expert on average for E4M3 experts, 32 for FP4 ones. Measured on the H200 (docs/gpu-log.md), layer
  // time decode vs grouped path: DeepSeek-V3 T = 1 131 vs 185 µs, T = 128 2728 vs 4900 (grouped fused); since the
  // grouped gate_up runs unfused (stop 24, bench/results/stop24_moe_decode_edge_2026-12-02_d161a6a.json):
  // DeepSeek-V3 T = 512 (16 rows per expert) 2862 vs 2865, T = 1024 (32) 3832 vs 2959; Qwen3-30B-A3B T = 512 (32)
  // 385 vs 255. FP4 experts keep 32 (their grouped GEMM expands the weights in its loader warps; not re-measured).
  const bool fp4 = args.weight_recipe.element == ElementType::FP4_E2M1;
  const bool few_rows = rows <= (fp4 ? 32 : 16) * int64_t{num_experts};
  if (!(few_rows || (env && *env == '1'))) return false;
  return decode_kernel_kind(moe_expert_gemm_params(args, true, rows)) != DecodeKind::None &&
         decode_kernel_kind(moe_expert_gemm_params(args, false, rows)) != DecodeKind::None;
}

namespace {

// Sizes of the decode path's buffers: the intermediate's width I, and its dynamic scales per row (group recipes).
int64_t moe_inter(const MoeArgs& args) {
  return args.down.shape[2] * (args.weight_recipe.element == ElementType::FP4_E2M1 ? 2 : 1);
}
int64_t moe_h_scale_cols(const MoeArgs& args) {
  const auto& act = args.activation_recipe;
  return !act.is_static() && act.granularity != ActGranularity::PerToken ? moe_inter(args) / act.group_size : 0;
}
size_t moe_h_scale_bytes(const MoeArgs& args, int64_t rows) {
  const auto& act = args.activation_recipe;
  if (act.granularity == ActGranularity::PerToken) return static_cast<size_t>(rows * 4);
  return act.is_static() ? 16 : static_cast<size_t>(rows * moe_h_scale_cols(args) * 4);
}

}  // namespace

// FP4 experts on the decode path take the permuted decode kernel (kPermK) where it serves the recipe, unless
// FINEGEMM_FP4_DECODE_PERM=0. On by default since stop 43 (H200, DeepSeek-V3 layer, graph replay: T = 1 109.7 µs
// against 118.7 plain, T = 16 973.5 against 1095.2; bench/results/stop43_call1_2026-12-05_06500c5.json). Dense FP4
// decode keeps the plain kernel by default (fp4_decode_perm_wanted: M = 1 N = 7168 K = 16384 41.4 µs permuted against
// 38.4 plain in the same call). At prefill sizes (the decode path forced, 128-token tiles) it lost: T = 4096 15342 µs
// against 8814 on the grouped path.
bool moe_decode_perm_wanted(const MoeArgs& args, int64_t rows) {
  if (rows <= 0 || args.weight_recipe.element != ElementType::FP4_E2M1 ||
      !env_switch("FINEGEMM_FP4_DECODE_PERM", true) || !env_switch("FINEGEMM_FP4_DECODE", true) ||
      !moe_decode_path(args, rows))
    return false;
  const auto& act = args.activation_recipe;
  if (!quantize_perm_k_ok(act, args.down.shape[1]) || !quantize_perm_k_ok(act, moe_inter(args))) return false;
  for (const bool gate_up : {true, false}) {
    // The GEMMs' own parameters (moe_expert_gemms_decode adds the activation scales and outputs, which the check
    // does not read).
    if (!fp4_decode_perm_ok(moe_expert_gemm_params(args, gate_up, rows), true)) return false;
  }
  return true;
}

MoeDecodeScratch::MoeDecodeScratch(const MoeArgs& args, int64_t rows, int num_experts, cudaStream_t stream)
    : list(static_cast<size_t>(num_experts) * 4, stream),
      count(4, stream),
      y_gu(static_cast<size_t>(rows * args.gate_up.shape[1] * 4), stream),
      h_q(static_cast<size_t>(rows * moe_inter(args)), stream),
      h_scale(moe_h_scale_bytes(args, rows), stream) {}

// NOTE: on by default: H200 graph replay, chain off vs on, three alternated runs (stop 20,
// bench/results/moe_pdl_chain_2026-12-02_6dd8120.json): Qwen3-30B-A3B T = 1 FP8 32.2 vs 31.4 µs, FP4 35.5 vs 34.6,
// T = 16 FP4 146.6 vs 144.4; DeepSeek-V3 T = 1 FP8 124.5 vs 123.5, T = 16 FP4 1092.6 vs 1089.6; slower only at
// DeepSeek-V3 T = 1 FP4 (116.3 vs 118.3).
bool moe_decode_pdl_chain() { return env_switch("FINEGEMM_MOE_PDL_CHAIN", true); }

// The decode path: gate_up on the decode kernel over the experts with rows (F32 out, scales and bias applied), one
// block per row for the activation and the intermediate's quantization (any activation recipe: per group, per row,
// static per expert), then down with the routing weight, also on the decode kernel.
void moe_expert_gemms_decode(const MoeArgs& args, const PermutedRows& in, void* y, bool y_f32, cudaStream_t stream,
                             const MoeDecodeScratch* scratch, bool chain) {
  const int64_t hidden = args.down.shape[1], inter = moe_inter(args);
  const int64_t gate_up_rows = args.gate_up.shape[1];
  const auto& act = args.activation_recipe;
  const bool dynamic = !act.is_static(), per_token = act.granularity == ActGranularity::PerToken;
  const int64_t rows = in.rows;
  const int wn_rows = decode_rows_per_expert(rows, in.num_experts, in.perm_k);
  // Programmatic dependent launch of gate_up and down (FINEGEMM_PDL=0 turns it off). DeepSeek-V3 T = 1 on the H200:
  // FP8 125.7 vs 129.0 µs, FP4 117.8 vs 123.1 (bench/results/decode_pdl_2026-12-02_1a01a29.json).
  const bool pdl = env_switch("FINEGEMM_PDL", true);

  // Every buffer before the first kernel (MoeDecodeScratch): no allocation stands between the launches.
  std::optional<MoeDecodeScratch> own;
  if (!scratch) scratch = &own.emplace(args, rows, in.num_experts, stream);
  const StreamScratch &list = scratch->list, &count = scratch->count, &y_gu = scratch->y_gu, &h_q = scratch->h_q,
                      &h_scale = scratch->h_scale;
  launch_programmatic(chain, moe_active_experts_kernel, 1, kActiveExpertThreads, 0, stream, in.expert_offsets,
                      in.num_experts, list.as<int32_t>(), count.as<int32_t>());
  FG_CUDA_CHECK(cudaGetLastError());
  DecodeGroups groups;
  groups.list = list.as<int32_t>();
  groups.list_count = count.as<int32_t>();
  groups.offsets = in.expert_offsets;
  groups.slots = static_cast<int>(std::min<int64_t>(in.num_experts, rows));
  groups.num_groups = in.num_experts;

  // gate_up: y_gu [rows, 2I] F32.
  {
    GemmParams p = moe_expert_gemm_params(args, true, rows);
    set_activation_scales(p, act, in.x_scale, per_token ? 1 : (dynamic ? hidden / act.group_size : 0), 1, hidden,
                          in.gate_up_act_scale);
    p.out = y_gu.as<void>();
    p.out_dtype = OutDType::F32;
    p.ldo = gate_up_rows;
    // Programmatic launch after the list kernel (FINEGEMM_PDL=1): it waits for the list before reading it.
    p.pdl = pdl;
    p.a_perm_k = in.perm_k;
    launch_sm90_decode_grouped(in.x_q, hidden, args.gate_up.data, args.gate_up.strides[1], groups, wn_rows, p, stream);
  }
  // The activation and the intermediate's E4M3 codes and scales.
  const int64_t h_scale_cols = moe_h_scale_cols(args);
  {
    const MoeGateLayout layout = moe_gate_layout(args);
    // With permuted rows (in.perm_k) the intermediate goes in the same order for down.
    launch_programmatic(chain, in.perm_k ? moe_act_quant_rows_kernel<true> : moe_act_quant_rows_kernel<false>,
                        static_cast<unsigned>(rows), kActQuantThreads, 0, stream,
                        y_gu.as<float>(), gate_up_rows, inter, layout, static_cast<int>(args.activation),
                        args.swiglu_limit, args.swiglu_alpha, in.expert_offsets, in.num_experts,
                        dynamic && !per_token ? act.group_size : 0, act.pow2_scale,
                        dynamic ? nullptr : in.down_act_scale, h_q.as<uint8_t>(), h_scale.as<float>());
    FG_CUDA_CHECK(cudaGetLastError());
  }
  // down, times the routing weight: y [rows, H].
  {
    GemmParams p = moe_expert_gemm_params(args, false, rows);
    set_activation_scales(p, act, h_scale.as<float>(), per_token ? 1 : h_scale_cols, 1, inter, in.down_act_scale);
    p.row_weight = in.row_weight;
    // Programmatic launch after the activation kernel (FINEGEMM_PDL=1): the list, offsets and row weights are older,
    // so it reads them and requests its first weight tiles before it waits for the intermediate.
    p.pdl = pdl;
    p.pdl_groups_ready = true;
    p.a_perm_k = in.perm_k;
    p.out = y;
    p.out_dtype = y_f32 ? OutDType::F32 : OutDType::BF16;
    p.ldo = hidden;
    launch_sm90_decode_grouped(h_q.as<void>(), inter, args.down.data, args.down.strides[1], groups, wn_rows, p, stream);
  }
}

}  // namespace finegemm::cuda
