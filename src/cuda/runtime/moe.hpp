// The parts of the GPU MoE block (moe.cu) that the expert-parallel layer (ep.cu) shares with it.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "cuda/kernels/gemm_params.cuh"
#include "cuda/runtime/gemm_args.hpp"
#include "finegemm/moe.hpp"

namespace finegemm::cuda {

enum class MoeGateLayout : int;  // cuda/kernels/moe_activation.cuh

// Empty when the sm_90a kernels serve `args` (moe_experts runs them); else why not, naming the argument
// (moe_experts then runs the block on the host; the EP layer refuses it with this message).
// allow_per_token: per-token activations on the GPU (moe_experts, with FINEGEMM_MOE_PER_TOKEN_GPU=1); the EP layer
// leaves it false.
std::string moe_gpu_path_refusal(const MoeArgs& args, bool allow_per_token = false);
// FINEGEMM_MOE_PER_TOKEN_GPU=1: moe_experts runs per-token activations on the GPU (off until measured on the H200).
bool moe_per_token_gpu_enabled();
// Whether the grouped path runs gate_up unfused (the default while its F32 output, rows x gate_up_cols, stays within
// 4 GiB; FINEGEMM_MOE_UNFUSED=0 always fuses the activation and requantization into gate_up's epilogue): gate_up
// stores F32, then one pass applies the activation and requantizes.
bool moe_gate_up_unfused(int64_t rows, int64_t gate_up_cols);
// Whether moe_expert_gemms runs `rows` routed rows on the decode kernel (sm90_fp4_decode.cuh) over the experts that
// have rows: few rows per expert (at most 32 on average) and both GEMMs' recipes served by it. FINEGEMM_MOE_DECODE=0
// turns it off, =1 takes it to any row count.
bool moe_decode_path(const MoeArgs& args, int64_t rows);
// Whether moe_experts quantizes the rows (and the decode path its intermediate) in the FP4 decode kernel's permuted K
// order (GemmParams::a_perm_k): unless FINEGEMM_FP4_DECODE_PERM=0 (on by default since stop 43; FINEGEMM_FP4_DECODE=0
// also turns it off), the decode path, FP4 experts and both GEMMs served by the permuted kernel (fp4_decode_perm_ok: UE8M0 scales,
// H and I multiples of 128, activations in groups of 128, per token or static).
bool moe_decode_perm_wanted(const MoeArgs& args, int64_t rows);

// Rows already routed, permuted (expert-major) and quantized: the input of the experts' GEMMs.
struct PermutedRows {
  const uint8_t* x_q = nullptr;          // [rows, H] E4M3
  const float* x_scale = nullptr;        // dynamic: [rows, H/group]; static: unused
  const float* row_weight = nullptr;     // [rows]: routing weight of each row
  const int32_t* expert_offsets = nullptr;  // [E + 1] on the device: rows of expert e are [offsets[e], offsets[e+1])
  int64_t rows = 0;                      // an upper bound of offsets[E] (buffers are sized for it)
  int num_experts = 0;                   // E: the experts of args.gate_up / args.down
  const float* gate_up_act_scale = nullptr;  // static: [E], the scale rows of expert e were quantized with
  const float* down_act_scale = nullptr;     // static: [E]
  bool perm_k = false;  // x_q in the FP4 decode kernel's K order (moe_decode_perm_wanted): the decode path only
};

// The experts' two grouped GEMMs: gate_up with the activation and its requantization fused, then down with the
// routing weight in its epilogue: y [rows, H] (F32 or BF16, rows scaled by their routing weight), in the rows'
// order. Weights, scales, biases and the activation come from `args`; its hidden/top_k/out are not read.
// decode_scratch / chain: passed on to moe_expert_gemms_decode on the decode path. weights_constant:
// RunOptions::weights_constant (GemmParams::weights_constant of the grouped GEMMs).
void moe_expert_gemms(const MoeArgs& args, const PermutedRows& in, void* y, bool y_f32, cudaStream_t stream,
                      const struct MoeDecodeScratch* decode_scratch = nullptr, bool chain = false,
                      bool weights_constant = false);
// The expert GEMMs' common parameters: shapes, promotion, weight scales and bias (gate_up: K = H; down: K = I),
// a_group for group activation scales; the callers add the activation scales and the output.
GemmParams moe_expert_gemm_params(const MoeArgs& args, bool gate_up, int64_t rows);
// Where a row's gate and up columns lie in the gate_up output (halves, interleaved, or no gate).
MoeGateLayout moe_gate_layout(const MoeArgs& args);

// The decode path's scratch (the expert list, gate_up's F32 output, the intermediate's codes and scales) for `rows`
// routed rows. moe_experts allocates it before the block's first kernel: an allocation between two programmatic
// launches (a graph memory node under capture) would keep the second from starting early.
struct MoeDecodeScratch {
  MoeDecodeScratch(const MoeArgs& args, int64_t rows, int num_experts, cudaStream_t stream);
  StreamScratch list, count, y_gu, h_q, h_scale;
};
// Whether the MoE decode path launches its small kernels (routing, permutation, expert list, activation, combine)
// programmatically, each resident before the one ahead completes (FINEGEMM_MOE_PDL_CHAIN=0 turns it off).
bool moe_decode_pdl_chain();
// The same on the decode path (moe_decode.cu); moe_expert_gemms calls it where moe_decode_path says so. Without
// `scratch` it allocates its own; `chain`: the expert list and activation kernels launch programmatically.
void moe_expert_gemms_decode(const MoeArgs& args, const PermutedRows& in, void* y, bool y_f32, cudaStream_t stream,
                             const MoeDecodeScratch* scratch = nullptr, bool chain = false);

}  // namespace finegemm::cuda
