// Expert parallelism over NCCL (finegemm/ep.hpp): one MoE layer whose E experts are spread over W ranks.
//
// On every rank, for its T tokens:
//   1. route over the E global experts, permute and quantize to E4M3 (the single-GPU kernels): the rows bound for
//      rank d are one contiguous segment, [offsets[d·E/W], offsets[(d+1)·E/W]);
//   2. all-gather every rank's offsets [E + 1] (one NCCL call) and copy them to the host (the one synchronization):
//      now every rank knows what every rank sends and receives;
//   3. dispatch: grouped ncclSend/ncclRecv of the FP8 rows, their scales and routing weights (all-to-all-v);
//   4. reorder the received rows to expert-major (ep_rows.cuh), run the grouped gate_up and down GEMMs over the
//      E/W local experts (moe_expert_gemms, shared with moe_experts), reorder y back to the received order;
//   5. combine: all-to-all-v of y back to the sources, which then hold y in exactly their own permuted order and
//      sum each token's slots in slot order (launch_moe_combine): the single-GPU layer's arithmetic, row for row.
// With chunks > 1 the tokens are split and steps 3-5 are pipelined over two streams.
#include <nccl.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/kernels/ep_rows.cuh"
#include "cuda/runtime/check.hpp"
#include "cuda/runtime/gemm_args.hpp"
#include "cuda/runtime/moe.hpp"
#include "cuda/runtime/moe_routing.hpp"
#include "finegemm/ep.hpp"
#include "finegemm/error.hpp"

namespace finegemm {

#define FG_NCCL_CHECK(expr)                                                                                      \
  do {                                                                                                           \
    const ncclResult_t fg_nccl_status_ = (expr);                                                                 \
    if (fg_nccl_status_ != ncclSuccess) ::finegemm::throw_nccl_error(fg_nccl_status_, #expr, __FILE__, __LINE__); \
  } while (0)

[[noreturn]] void throw_nccl_error(ncclResult_t status, const char* what, const char* file, int line) {
  std::string message = std::string("NCCL error in ") + what + " (" + file + ":" + std::to_string(line) +
                        "): " + ncclGetErrorString(status);
  if (const char* last = ncclGetLastError(nullptr); last && *last) message += std::string(" (") + last + ")";
  throw Error(ErrorKind::Runtime, message);
}

struct EpGroupState {
  ncclComm_t comm = nullptr;
  int rank = 0, world = 1, device = 0;
  cudaStream_t side_stream = nullptr;  // the chunked pipeline's communication stream (made on first use)

  ~EpGroupState() {
    int previous = -1;
    (void)cudaGetDevice(&previous);
    (void)cudaSetDevice(device);
    if (side_stream) (void)cudaStreamDestroy(side_stream);
    if (comm) (void)ncclCommDestroy(comm);
    if (previous >= 0) (void)cudaSetDevice(previous);
  }
  cudaStream_t comm_stream() {
    if (!side_stream) FG_CUDA_CHECK(cudaStreamCreateWithFlags(&side_stream, cudaStreamNonBlocking));
    return side_stream;
  }
};

namespace {

using cuda::DeviceGuard;
using cuda::StreamScratch;

std::string str(int64_t v) { return std::to_string(v); }
[[noreturn]] void fail(const std::string& message) { throw Error(message); }

int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

void check_device_index(int device, const char* name) {
  const int count = device_count();
  if (device < 0 || device >= count)
    fail(std::string(name) + ": expected a CUDA device index in [0, " + str(count) + "), got " + str(device));
}

TensorView slice_experts(TensorView t, int64_t first, int64_t count) {
  t.data = static_cast<char*>(t.data) + first * t.strides[0] * static_cast<int64_t>(dtype_size(t.dtype));
  t.shape[0] = count;
  return t;
}

// The rank's view of the layer: its local experts, with the static scales cut to them.
MoeArgs local_view(const MoeArgs& args, int num_global_experts, int rank, int world) {
  const int64_t local = num_global_experts / world;
  MoeArgs a = args;
  if (a.gate_up_act_scale.defined() && a.gate_up_act_scale.ndim == 1 && a.gate_up_act_scale.shape[0] == num_global_experts)
    a.gate_up_act_scale = slice_experts(a.gate_up_act_scale, rank * local, local);
  if (a.down_act_scale.defined() && a.down_act_scale.ndim == 1 && a.down_act_scale.shape[0] == num_global_experts &&
      local != num_global_experts)
    a.down_act_scale = slice_experts(a.down_act_scale, rank * local, local);
  return a;
}

// Per chunk of tokens: its routing (on the device), and what the all-gathered offsets say it sends and receives.
struct Chunk {
  int64_t first_token = 0, tokens = 0, rows = 0;  // rows: tokens·k (permuted rows, an upper bound of those routed)
  std::vector<std::unique_ptr<StreamScratch>> held;
  cuda::MoeRouting routing;
  uint8_t* x_q = nullptr;
  float* x_scale = nullptr;

  std::vector<int64_t> send_start, send_rows;  // per destination rank: rows of this rank's permuted order
  std::vector<int64_t> recv_start, recv_rows;  // per source rank: rows of the received (source-major) order
  int64_t received = 0;

  // Receiver side
  uint8_t *recv_x = nullptr, *local_x = nullptr;
  float *recv_scale = nullptr, *local_scale = nullptr, *recv_weight = nullptr, *local_weight = nullptr;
  int32_t *local_offsets = nullptr, *row_map = nullptr;
  void *y_local = nullptr, *y_received = nullptr;  // expert-major, then source-major (the wire's order)
  void* y_back = nullptr;                          // back at the source, in its permuted order

  template <typename T>
  T* alloc(int64_t bytes, cudaStream_t stream) {
    held.push_back(std::make_unique<StreamScratch>(static_cast<size_t>(std::max<int64_t>(bytes, 16)), stream));
    return held.back()->as<T>();
  }
};

struct Events {
  std::vector<cudaEvent_t> events;
  explicit Events(size_t n, bool timing) : events(n, nullptr) {
    for (auto& e : events) FG_CUDA_CHECK(cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming));
  }
  ~Events() {
    for (auto e : events)
      if (e) (void)cudaEventDestroy(e);
  }
  cudaEvent_t operator[](size_t i) const { return events[i]; }
};

}  // namespace

// ---------------------------------------------------------------- group

bool ep_available() { return true; }

EpUniqueId ep_unique_id() {
  ncclUniqueId id;
  FG_NCCL_CHECK(ncclGetUniqueId(&id));
  static_assert(sizeof(id.internal) == sizeof(EpUniqueId), "EpUniqueId: must hold an ncclUniqueId");
  EpUniqueId out;
  std::memcpy(out.data(), id.internal, out.size());
  return out;
}

EpGroup::EpGroup() = default;
EpGroup::EpGroup(std::unique_ptr<EpGroupState> state) : state_(std::move(state)) {}
EpGroup::~EpGroup() = default;
EpGroup::EpGroup(EpGroup&&) noexcept = default;
EpGroup& EpGroup::operator=(EpGroup&&) noexcept = default;

EpGroupState& EpGroup::state() const {
  if (!state_) throw Error("group: an empty EpGroup (moved from, or default-made); make one with EpGroup::init");
  return *state_;
}
int EpGroup::rank() const { return state().rank; }
int EpGroup::world() const { return state().world; }
int EpGroup::device() const { return state().device; }

EpGroup EpGroup::init(int rank, int world, const EpUniqueId& id, int device) {
  if (world < 1) fail("world: expected at least 1 rank, got " + str(world));
  if (rank < 0 || rank >= world) fail("rank: expected 0 <= rank < world = " + str(world) + ", got " + str(rank));
  check_device_index(device, "device");
  const DeviceGuard guard(device);
  auto state = std::make_unique<EpGroupState>();
  state->rank = rank;
  state->world = world;
  state->device = device;
  ncclUniqueId nccl_id;
  std::memcpy(nccl_id.internal, id.data(), id.size());
  FG_NCCL_CHECK(ncclCommInitRank(&state->comm, world, nccl_id, rank));
  return EpGroup(std::move(state));
}

std::vector<EpGroup> EpGroup::init_all(const std::vector<int>& devices) {
  if (devices.empty()) fail("devices: expected at least one CUDA device, got none");
  for (size_t i = 0; i < devices.size(); ++i) {
    check_device_index(devices[i], "devices");
    for (size_t j = 0; j < i; ++j)
      if (devices[j] == devices[i])
        fail("devices: expected distinct devices (one rank per GPU), got device " + str(devices[i]) + " twice");
  }
  const int world = static_cast<int>(devices.size());
  std::vector<ncclComm_t> comms(devices.size(), nullptr);
  {
    const DeviceGuard guard(devices[0]);
    FG_NCCL_CHECK(ncclCommInitAll(comms.data(), world, devices.data()));
  }
  std::vector<EpGroup> groups;
  for (int i = 0; i < world; ++i) {
    auto state = std::make_unique<EpGroupState>();
    state->comm = comms[i];
    state->rank = i;
    state->world = world;
    state->device = devices[i];
    groups.push_back(EpGroup(std::move(state)));
  }
  return groups;
}

// ---------------------------------------------------------------- validation

void validate_moe_ep(const MoeArgs& args, int num_global_experts, int rank, int world, int device,
                     const EpMoeOptions& ep_options) {
  if (world < 1) fail("world: expected at least 1 rank, got " + str(world));
  if (rank < 0 || rank >= world) fail("rank: expected 0 <= rank < world = " + str(world) + ", got " + str(rank));
  if (num_global_experts < 1) fail("num_global_experts: expected at least 1 expert, got " + str(num_global_experts));
  if (num_global_experts % world != 0)
    fail("num_global_experts: expected a multiple of the world size W = " + str(world) +
         " (each rank owns E/W experts), got E = " + str(num_global_experts));
  if (num_global_experts > cuda::kEpMaxExperts)
    fail("num_global_experts: the EP layer takes at most " + str(cuda::kEpMaxExperts) + " experts, got " +
         str(num_global_experts));
  if (ep_options.wire_y != DType::F32 && ep_options.wire_y != DType::BF16)
    throw Error(ErrorKind::Type,
                std::string("wire_y: expected float32 or bfloat16, got ") + dtype_name(ep_options.wire_y));
  if (ep_options.chunks < 1) fail("chunks: expected at least 1, got " + str(ep_options.chunks));
  if (ep_options.timings && ep_options.chunks != 1)
    fail("timings: per-phase timings need chunks = 1 (the pipeline overlaps the phases), got chunks = " +
         str(ep_options.chunks));

  const int64_t local = num_global_experts / world;
  if (args.gate_up.defined() && args.gate_up.ndim == 3 && args.gate_up.shape[0] != local)
    fail("gate_up: expected E/W = " + str(local) + " local experts in dim 0 (E = " + str(num_global_experts) +
         " global experts over W = " + str(world) + " ranks), got " + shape_string(args.gate_up));
  if (args.activation_recipe.is_static()) {
    const TensorView& s = args.gate_up_act_scale;
    if (s.defined() && !(s.ndim == 1 && s.shape[0] == num_global_experts))
      fail("gate_up_act_scale: expected shape [" + str(num_global_experts) +
           "], one scale per GLOBAL expert (each rank quantizes the rows it sends with their expert's scale), got " +
           shape_string(s));
    const TensorView& d = args.down_act_scale;
    if (d.defined() && !(d.ndim == 1 && (d.shape[0] == local || d.shape[0] == num_global_experts)))
      fail("down_act_scale: expected shape [" + str(local) + "] (the rank's experts) or [" + str(num_global_experts) +
           "] (all experts), got " + shape_string(d));
  }
  const std::pair<const TensorView*, const char*> tensors[] = {
      {&args.hidden, "hidden"},           {&args.top_k_index, "top_k_index"},
      {&args.top_k_weights, "top_k_weights"}, {&args.gate_up, "gate_up"},
      {&args.gate_up_scale, "gate_up_scale"}, {&args.down, "down"},
      {&args.down_scale, "down_scale"},   {&args.gate_up_act_scale, "gate_up_act_scale"},
      {&args.down_act_scale, "down_act_scale"}, {&args.gate_up_bias, "gate_up_bias"},
      {&args.down_bias, "down_bias"},     {&args.out, "out"}};
  const Device expected{DeviceType::CUDA, device};
  for (const auto& [t, name] : tensors)
    if (t->defined() && t->device != expected)
      fail(std::string(name) + ": expected a tensor on " + device_name(expected) + " (the EP group's device), got " +
           device_name(t->device));
  // NOTE: after the placement check: on CPU tensors validate_moe would read top_k_index and refuse the global ids.
  const MoeArgs local_args = local_view(args, num_global_experts, rank, world);
  validate_moe(local_args);
  if (const std::string refusal = cuda::moe_gpu_path_refusal(local_args); !refusal.empty())
    fail(refusal + " (moe_experts_ep runs on the GPU kernels only)");
}

// ---------------------------------------------------------------- the layer

namespace {

void launch_layout(const int32_t* gathered, int64_t source_stride, int world, int rank, int local_experts,
                   int64_t received, int32_t* local_offsets, int32_t* row_map, cudaStream_t stream) {
  const int blocks = static_cast<int>(std::max<int64_t>(1, (received + cuda::kEpLayoutRowsPerBlock - 1) /
                                                               cuda::kEpLayoutRowsPerBlock));
  const size_t smem = (2 * static_cast<size_t>(world) * local_experts + 1) * sizeof(int32_t);
  cuda::ep_layout_kernel<<<blocks, cuda::kEpLayoutThreads, smem, stream>>>(
      gathered, source_stride, world, rank, local_experts, static_cast<int>(received), local_offsets, row_map);
  FG_CUDA_CHECK(cudaGetLastError());
}

template <bool kScatter>
void launch_copy_rows(const cuda::EpRowPlanes& planes, const int32_t* row_map, int64_t rows, cudaStream_t stream) {
  if (rows == 0) return;
  cuda::ep_copy_rows_kernel<kScatter><<<static_cast<unsigned>(rows), 128, 0, stream>>>(planes, row_map);
  FG_CUDA_CHECK(cudaGetLastError());
}

// Grouped all-to-all-v of byte rows: to each rank d, rows [send_start[d], +send_rows[d]) of `send` (row_bytes each);
// from each rank s, recv_rows[s] rows into `recv` at recv_start[s]. The rank's own rows are a device copy.
struct Exchange {
  const uint8_t* send;
  uint8_t* recv;
  int64_t row_bytes;
};
void all_to_all_v(const std::vector<Exchange>& planes, const std::vector<int64_t>& send_start,
                  const std::vector<int64_t>& send_rows, const std::vector<int64_t>& recv_start,
                  const std::vector<int64_t>& recv_rows, int rank, ncclComm_t comm, cudaStream_t stream) {
  const int world = static_cast<int>(send_rows.size());
  FG_NCCL_CHECK(ncclGroupStart());
  for (int peer = 0; peer < world; ++peer) {
    if (peer == rank) continue;
    for (const Exchange& p : planes) {
      if (send_rows[peer] > 0)
        FG_NCCL_CHECK(ncclSend(p.send + send_start[peer] * p.row_bytes, static_cast<size_t>(send_rows[peer] * p.row_bytes),
                               ncclUint8, peer, comm, stream));
      if (recv_rows[peer] > 0)
        FG_NCCL_CHECK(ncclRecv(p.recv + recv_start[peer] * p.row_bytes, static_cast<size_t>(recv_rows[peer] * p.row_bytes),
                               ncclUint8, peer, comm, stream));
    }
  }
  FG_NCCL_CHECK(ncclGroupEnd());
  if (send_rows[rank] > 0)
    for (const Exchange& p : planes)
      FG_CUDA_CHECK(cudaMemcpyAsync(p.recv + recv_start[rank] * p.row_bytes, p.send + send_start[rank] * p.row_bytes,
                                    static_cast<size_t>(send_rows[rank] * p.row_bytes), cudaMemcpyDeviceToDevice,
                                    stream));
}

}  // namespace

void moe_experts_ep(const MoeArgs& args, int num_global_experts, EpGroup& group, const EpMoeOptions& ep_options,
                    const RunOptions& options) {
  EpGroupState& g = group.state();
  validate_moe_ep(args, num_global_experts, g.rank, g.world, g.device, ep_options);
  if (options.backend != Backend::Auto && options.backend != Backend::Cuda)
    fail(std::string("backend: moe_experts_ep runs on cuda, got ") + backend_name(options.backend));
  const DeviceGuard guard(g.device);
  const auto stream = static_cast<cudaStream_t>(options.stream);

  const int world = g.world, rank = g.rank;
  const int num_experts = num_global_experts, local_experts = num_global_experts / world;
  const int64_t num_tokens = args.hidden.shape[0], hidden = args.hidden.shape[1];
  const int top_k = static_cast<int>(args.top_k_index.shape[1]);
  const auto& act = args.activation_recipe;
  const bool dynamic = !act.is_static();
  const int64_t scale_cols = dynamic ? hidden / act.group_size : 0;
  const bool y_f32 = ep_options.wire_y == DType::F32;
  const int64_t y_row_bytes = hidden * (y_f32 ? 4 : 2);
  const int num_chunks = ep_options.chunks;
  const MoeArgs local = local_view(args, num_global_experts, rank, world);
  const float* gate_up_act_scale = args.gate_up_act_scale.defined() ? args.gate_up_act_scale.ptr<float>() : nullptr;

  EpTimings* timings = ep_options.timings;
  const Events phase(timings ? 6 : 0, true);
  if (timings) FG_CUDA_CHECK(cudaEventRecord(phase[0], stream));

  // 1. Route, permute and quantize each chunk; its offsets go straight into the all-gather's send buffer.
  const int64_t offsets_per_rank = static_cast<int64_t>(num_chunks) * (num_experts + 1);
  StreamScratch offsets_send(offsets_per_rank * 4, stream), offsets_all(world * offsets_per_rank * 4, stream);
  std::vector<Chunk> chunks(num_chunks);
  for (int c = 0; c < num_chunks; ++c) {
    Chunk& ch = chunks[c];
    ch.first_token = num_tokens * c / num_chunks;
    ch.tokens = num_tokens * (c + 1) / num_chunks - ch.first_token;
    ch.rows = ch.tokens * top_k;
    auto& r = ch.routing;
    r.expert_offsets = offsets_send.as<int32_t>() + c * (num_experts + 1);
    r.row_token = ch.alloc<int32_t>(ch.rows * 4, stream);
    r.row_expert = ch.alloc<int32_t>(ch.rows * 4, stream);
    r.row_weight = ch.alloc<float>(ch.rows * 4, stream);
    r.slot_row = ch.alloc<int32_t>(ch.rows * 4, stream);
    r.error_count = ch.alloc<int32_t>(4, stream);
    ch.x_q = ch.alloc<uint8_t>(ch.rows * hidden, stream);
    ch.x_scale = ch.alloc<float>(ch.rows * scale_cols * 4, stream);
    if (ch.tokens == 0) {
      FG_CUDA_CHECK(cudaMemsetAsync(r.expert_offsets, 0, (num_experts + 1) * 4, stream));
      continue;
    }
    void* workspace = ch.alloc<void>(cuda::moe_route_workspace_bytes(ch.tokens, top_k, num_experts), stream);
    const auto* index = static_cast<const char*>(args.top_k_index.data) +
                        ch.first_token * top_k * static_cast<int64_t>(dtype_size(args.top_k_index.dtype));
    const auto* weights = static_cast<const char*>(args.top_k_weights.data) +
                          ch.first_token * top_k * static_cast<int64_t>(dtype_size(args.top_k_weights.dtype));
    const auto* tokens = static_cast<const char*>(args.hidden.data) +
                         ch.first_token * hidden * static_cast<int64_t>(dtype_size(args.hidden.dtype));
    cuda::launch_moe_route(index, args.top_k_index.dtype, weights, args.top_k_weights.dtype, ch.tokens, top_k,
                           num_experts, r, workspace, stream);
    cuda::launch_moe_permute_quantize(tokens, args.hidden.dtype, ch.tokens, hidden, top_k, r, act, gate_up_act_scale,
                                      ch.x_q, ch.x_scale, stream);
  }
  if (timings) FG_CUDA_CHECK(cudaEventRecord(phase[1], stream));

  // 2. Every rank's offsets, everywhere; one synchronization to read them on the host.
  FG_NCCL_CHECK(ncclAllGather(offsets_send.as<void>(), offsets_all.as<void>(), static_cast<size_t>(offsets_per_rank),
                              ncclInt32, g.comm, stream));
  std::vector<int32_t> all(static_cast<size_t>(world * offsets_per_rank));
  FG_CUDA_CHECK(cudaMemcpyAsync(all.data(), offsets_all.as<void>(), all.size() * 4, cudaMemcpyDeviceToHost, stream));
  FG_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (timings) FG_CUDA_CHECK(cudaEventRecord(phase[2], stream));
  // offsets of rank s, chunk c, expert e
  const auto at = [&](int s, int c, int64_t e) { return static_cast<int64_t>(all[s * offsets_per_rank + c * (num_experts + 1) + e]); };

  // What each chunk sends and receives, and the most any rank receives (every rank checks every rank, so a
  // refusal is the same everywhere and nobody is left waiting in a collective).
  int64_t most_received = 0;
  for (int c = 0; c < num_chunks; ++c) {
    for (int dest = 0; dest < world; ++dest) {
      int64_t received = 0;
      for (int s = 0; s < world; ++s)
        received += at(s, c, static_cast<int64_t>(dest + 1) * local_experts) - at(s, c, static_cast<int64_t>(dest) * local_experts);
      most_received = std::max(most_received, received);
    }
  }
  if (most_received > INT32_MAX / 2)
    fail("hidden: a rank would receive " + str(most_received) + " routed rows in one chunk, the GPU kernels take at "
         "most 2^30: raise chunks");

  for (int c = 0; c < num_chunks; ++c) {
    Chunk& ch = chunks[c];
    ch.send_start.assign(world, 0);
    ch.send_rows.assign(world, 0);
    ch.recv_start.assign(world, 0);
    ch.recv_rows.assign(world, 0);
    for (int d = 0; d < world; ++d) {
      ch.send_start[d] = at(rank, c, static_cast<int64_t>(d) * local_experts);
      ch.send_rows[d] = at(rank, c, static_cast<int64_t>(d + 1) * local_experts) - ch.send_start[d];
      ch.recv_rows[d] = at(d, c, static_cast<int64_t>(rank + 1) * local_experts) - at(d, c, static_cast<int64_t>(rank) * local_experts);
      ch.recv_start[d] = ch.received;
      ch.received += ch.recv_rows[d];
    }
    const int64_t n = ch.received;
    ch.recv_x = ch.alloc<uint8_t>(n * hidden, stream);
    ch.local_x = ch.alloc<uint8_t>(n * hidden, stream);
    ch.recv_scale = ch.alloc<float>(n * scale_cols * 4, stream);
    ch.local_scale = ch.alloc<float>(n * scale_cols * 4, stream);
    ch.recv_weight = ch.alloc<float>(n * 4, stream);
    ch.local_weight = ch.alloc<float>(n * 4, stream);
    ch.local_offsets = ch.alloc<int32_t>((local_experts + 1) * 4, stream);
    ch.row_map = ch.alloc<int32_t>(n * 4, stream);
    ch.y_local = ch.alloc<void>(n * y_row_bytes, stream);
    ch.y_received = ch.alloc<void>(n * y_row_bytes, stream);
    ch.y_back = ch.alloc<void>(ch.rows * y_row_bytes, stream);
  }

  // Steps 3-5 of one chunk, as three stages.
  const auto dispatch = [&](Chunk& ch, cudaStream_t s) {
    std::vector<Exchange> planes{{ch.x_q, ch.recv_x, hidden},
                                 {reinterpret_cast<const uint8_t*>(ch.routing.row_weight),
                                  reinterpret_cast<uint8_t*>(ch.recv_weight), 4}};
    if (dynamic)
      planes.push_back({reinterpret_cast<const uint8_t*>(ch.x_scale), reinterpret_cast<uint8_t*>(ch.recv_scale),
                        scale_cols * 4});
    all_to_all_v(planes, ch.send_start, ch.send_rows, ch.recv_start, ch.recv_rows, rank, g.comm, s);
  };
  const auto compute = [&](Chunk& ch, int c, cudaStream_t s) {
    if (ch.received == 0) return;
    launch_layout(offsets_all.as<int32_t>() + c * (num_experts + 1), offsets_per_rank, world, rank, local_experts,
                  ch.received, ch.local_offsets, ch.row_map, s);
    cuda::EpRowPlanes in;
    in.plane[in.count++] = {ch.recv_x, ch.local_x, hidden};
    in.plane[in.count++] = {reinterpret_cast<const uint8_t*>(ch.recv_weight), reinterpret_cast<uint8_t*>(ch.local_weight), 4};
    if (dynamic)
      in.plane[in.count++] = {reinterpret_cast<const uint8_t*>(ch.recv_scale), reinterpret_cast<uint8_t*>(ch.local_scale),
                              scale_cols * 4};
    launch_copy_rows<false>(in, ch.row_map, ch.received, s);
    cuda::PermutedRows rows;
    rows.x_q = ch.local_x;
    rows.x_scale = ch.local_scale;
    rows.row_weight = ch.local_weight;
    rows.expert_offsets = ch.local_offsets;
    rows.rows = ch.received;
    rows.num_experts = local_experts;
    rows.gate_up_act_scale = gate_up_act_scale ? gate_up_act_scale + static_cast<int64_t>(rank) * local_experts : nullptr;
    rows.down_act_scale = local.down_act_scale.defined() ? local.down_act_scale.ptr<float>() : nullptr;
    cuda::moe_expert_gemms(local, rows, ch.y_local, y_f32, s);
    cuda::EpRowPlanes out;
    out.plane[out.count++] = {static_cast<const uint8_t*>(ch.y_local), static_cast<uint8_t*>(ch.y_received), y_row_bytes};
    launch_copy_rows<true>(out, ch.row_map, ch.received, s);
  };
  const auto combine = [&](Chunk& ch, cudaStream_t s) {
    // The reverse exchange: what this rank received from s goes back to s; what it sent to d comes back from d.
    all_to_all_v({{static_cast<const uint8_t*>(ch.y_received), static_cast<uint8_t*>(ch.y_back), y_row_bytes}},
                 ch.recv_start, ch.recv_rows, ch.send_start, ch.send_rows, rank, g.comm, s);
    if (ch.tokens == 0) return;
    auto* out = static_cast<char*>(args.out.data) + ch.first_token * hidden * static_cast<int64_t>(dtype_size(args.out.dtype));
    cuda::launch_moe_combine(ch.y_back, y_f32 ? DType::F32 : DType::BF16, ch.routing, ch.tokens, top_k, hidden, out,
                             args.out.dtype, s);
  };

  if (num_chunks == 1) {
    Chunk& ch = chunks[0];
    dispatch(ch, stream);
    if (timings) FG_CUDA_CHECK(cudaEventRecord(phase[3], stream));
    compute(ch, 0, stream);
    if (timings) FG_CUDA_CHECK(cudaEventRecord(phase[4], stream));
    combine(ch, stream);
    if (timings) {
      FG_CUDA_CHECK(cudaEventRecord(phase[5], stream));
      FG_CUDA_CHECK(cudaEventSynchronize(phase[5]));
      const auto ms = [&](int a, int b) {
        float v = 0;
        FG_CUDA_CHECK(cudaEventElapsedTime(&v, phase[a], phase[b]));
        return v;
      };
      timings->route_ms = ms(0, 1);
      timings->counts_ms = ms(1, 2);
      timings->dispatch_ms = ms(2, 3);
      timings->compute_ms = ms(3, 4);
      timings->combine_ms = ms(4, 5);
      timings->total_ms = ms(0, 5);
    }
    return;
  }

  // The pipeline: communication on the group's side stream, computation on the caller's. The side stream runs
  // dispatch(0), dispatch(1), combine(0), dispatch(2), combine(1), ...: the same order on every rank (NCCL needs it),
  // and chunk c+1's dispatch and chunk c-1's combine are in flight while chunk c computes.
  // NOTE: the buffers were allocated on `stream`: the side stream starts after that (allocated event).
  const cudaStream_t side = g.comm_stream();
  const Events sync(2 * num_chunks + 2, false);
  const cudaEvent_t allocated = sync[2 * num_chunks], side_done = sync[2 * num_chunks + 1];
  const auto dispatched = [&](int c) { return sync[2 * c]; };
  const auto computed = [&](int c) { return sync[2 * c + 1]; };
  FG_CUDA_CHECK(cudaEventRecord(allocated, stream));
  FG_CUDA_CHECK(cudaStreamWaitEvent(side, allocated, 0));
  dispatch(chunks[0], side);
  FG_CUDA_CHECK(cudaEventRecord(dispatched(0), side));
  for (int c = 0; c < num_chunks; ++c) {
    FG_CUDA_CHECK(cudaStreamWaitEvent(stream, dispatched(c), 0));
    compute(chunks[c], c, stream);
    FG_CUDA_CHECK(cudaEventRecord(computed(c), stream));
    if (c + 1 < num_chunks) {
      dispatch(chunks[c + 1], side);
      FG_CUDA_CHECK(cudaEventRecord(dispatched(c + 1), side));
    }
    FG_CUDA_CHECK(cudaStreamWaitEvent(side, computed(c), 0));
    combine(chunks[c], side);
  }
  // The caller's stream continues once the side stream is done (and the buffers are freed on it after that).
  FG_CUDA_CHECK(cudaEventRecord(side_done, side));
  FG_CUDA_CHECK(cudaStreamWaitEvent(stream, side_done, 0));
}

}  // namespace finegemm
