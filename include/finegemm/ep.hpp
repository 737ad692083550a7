// Expert parallelism over NCCL: each of W ranks (one GPU each) holds E/W of a Mixture-of-Experts layer's experts;
// tokens travel to the ranks that own their experts, FP8-quantized, and come back in their own order.
//
// Rank r owns the global experts [r·E/W, (r+1)·E/W). On every rank, moe_experts_ep takes:
//   - hidden, top_k_index, top_k_weights, out: the rank's own tokens; top_k_index holds GLOBAL expert ids
//     (-1 = skip the slot; other ids outside [0, E) are skipped too, like moe_experts on the GPU);
//   - gate_up, gate_up_scale, down, down_scale, gate_up_bias, down_bias: the rank's E/W LOCAL experts only;
//   - static recipes: gate_up_act_scale is per GLOBAL expert, [E], the same on every rank (the sender quantizes each
//     row with the scale of the expert it goes to); down_act_scale is [E/W] (the rank's experts) or [E] (global:
//     the rank's slice is used).
// out equals moe_experts on one GPU with all E experts bit for bit with wire_y = F32 (each row takes the same GEMM
// path, and the slots of a token are summed in the same order); wire_y = BF16 halves the combine's bytes and stays
// within RECIPES.md's tolerance. docs/ep.md has the wire format.
//
// Every rank of a group must call moe_experts_ep the same number of times, with the same E and options (it holds
// NCCL collectives). Several GPUs in one process: EpGroup::init_all, then each rank's calls from its own thread.
#pragma once
#include <array>
#include <memory>
#include <vector>

#include "finegemm/backend.hpp"
#include "finegemm/moe.hpp"
#include "finegemm/tensor.hpp"

namespace finegemm {

// The NCCL unique id (ncclUniqueId, 128 bytes): made by rank 0, handed to the others out of band
// (a file, an environment variable, torch.distributed).
using EpUniqueId = std::array<char, 128>;
EpUniqueId ep_unique_id();

// Built with NCCL (finegemm/ep.hpp works), else every EP call throws a Runtime Error saying so.
bool ep_available();

struct EpGroupState;

// One rank's communicator (an ncclComm_t on one device) and its per-device state. Movable, not copyable;
// destroying it destroys the communicator.
class EpGroup {
 public:
  // ncclCommInitRank on `device`: every rank of `world` calls it with the same id (collective, blocks until all
  // ranks have joined).
  static EpGroup init(int rank, int world, const EpUniqueId& id, int device);
  // ncclCommInitAll: one group per device, all in this process; rank i is on devices[i].
  static std::vector<EpGroup> init_all(const std::vector<int>& devices);

  EpGroup();
  ~EpGroup();
  EpGroup(EpGroup&&) noexcept;
  EpGroup& operator=(EpGroup&&) noexcept;
  EpGroup(const EpGroup&) = delete;
  EpGroup& operator=(const EpGroup&) = delete;

  int rank() const;
  int world() const;
  int device() const;
  bool valid() const { return state_ != nullptr; }
  EpGroupState& state() const;  // for the implementation

 private:
  explicit EpGroup(std::unique_ptr<EpGroupState> state);
  std::unique_ptr<EpGroupState> state_;
};

// Per-phase device time of one call (CUDA events; filling it synchronizes the stream at the end of the call).
struct EpTimings {
  float route_ms = 0;     // routing, permutation and FP8 quantization of the rank's tokens
  float counts_ms = 0;    // all-gather of the per-expert row counts, and the host synchronization it needs
  float dispatch_ms = 0;  // all-to-all-v of the FP8 rows, their scales and routing weights
  float compute_ms = 0;   // reorder to expert-major, grouped gate_up and down GEMMs, reorder back
  float combine_ms = 0;   // all-to-all-v of the expert outputs back to their tokens, and the slot sum
  float total_ms = 0;     // first event to last
};

struct EpMoeOptions {
  // The expert outputs' dtype on the way back: F32 (default: bit-exact with moe_experts on one GPU) or BF16 (half
  // the bytes of the combine, within RECIPES.md's tolerance).
  DType wire_y = DType::F32;
  // Tokens split into this many chunks, pipelined: the dispatch of chunk c+1 and the combine of chunk c-1 run (on
  // a second stream) while chunk c computes. Must be the same on every rank. 1: no pipeline.
  int chunks = 1;
  EpTimings* timings = nullptr;  // chunks = 1 only
};

// One EP MoE layer on this rank (see the top of this file). Runs on options.stream of the group's device; every
// tensor must be on that device. Arguments the GPU kernels do not serve (the ones moe_experts would run on the
// host: per-token activation scales, H or I not a multiple of 128, misaligned tensors, ...) throw an Error naming
// the argument.
void moe_experts_ep(const MoeArgs& args, int num_global_experts, EpGroup& group, const EpMoeOptions& ep_options = {},
                    const RunOptions& options = {});

// The checks moe_experts_ep makes before it communicates (no NCCL call, no device work).
void validate_moe_ep(const MoeArgs& args, int num_global_experts, int rank, int world, int device,
                     const EpMoeOptions& ep_options = {});

}  // namespace finegemm
