// Launch of the lean GEMM (sm90_fp8_gemm_lean.cuh): the default for the recipes it serves at prefill sizes since stop 36
// (lean_gemm_block_m picks the tile height); FINEGEMM_GEMM_LEAN=0 turns it off, =1 forces 128x128 tiles, =192
// 192x128 (not yet measured), =256 256x128. Also the grouped mode's launch (FINEGEMM_GROUPED_LEAN, off).
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "cuda/kernels/sm90_fp8_gemm_lean.cuh"
#include "cuda/runtime/gemm_args.hpp"
#include "cuda/runtime/gemm_launch.cuh"
#include "cuda/runtime/sm90_fp8_gemm.hpp"

namespace finegemm::cuda {
namespace {

std::atomic<long long> lean_launch_count{0};
// Launches of the paired kernels: [0] sharing B, [1] sharing A (a pair that fits no SM pair runs unpaired, uncounted).
std::atomic<long long> lean_pair_launch_count[2] = {};


// Launches of the kernel whose B scales come from the scale warp (kSfbWarp, FINEGEMM_GEMM_LEAN_SFB_WARP=1).
std::atomic<long long> lean_sfb_warp_launch_count{0};
// Launches with a stream-K tail (kStreamK, FINEGEMM_GEMM_LEAN_STREAMK=1).
std::atomic<long long> lean_stream_k_launch_count{0};

// FINEGEMM_GEMM_LEAN_TRACE_FILE (diagnostics, stream-K kernels only): launch number FINEGEMM_GEMM_LEAN_TRACE_CALL
// (default 20) of the process's uncaptured stream-K launches stamps its items (LeanTrace) and appends them to the file
// after the launch (the stream is synchronised: a traced run times nothing). scripts/lean-trace summarises them.
LeanTrace* lean_trace_begin(int sms, cudaStream_t stream) {
  static int calls = 0;
  static void* buf = nullptr;
  static size_t capacity = 0;
  void* traced = diagnostic_trace_buffer("FINEGEMM_GEMM_LEAN_TRACE_FILE", "FINEGEMM_GEMM_LEAN_TRACE_CALL", 20,
                                         calls, buf, capacity, sizeof(LeanTrace) * kLeanTraceItems * sms, stream);
  return static_cast<LeanTrace*>(traced);
}

// One line per traced item: cta item t kb0 kb1, then each stamp's globaltimer and clock64 (-1 where not stamped).
void lean_trace_end(LeanTrace* trace, const GemmParams& p, int block_m, int grid, int dp_tiles, int sms,
                    cudaStream_t stream) {
  if (trace == nullptr) return;
  std::vector<LeanTrace> host(static_cast<size_t>(kLeanTraceItems) * sms);
  FG_CUDA_CHECK(cudaStreamSynchronize(stream));
  FG_CUDA_CHECK(cudaMemcpy(host.data(), trace, sizeof(LeanTrace) * host.size(), cudaMemcpyDeviceToHost));
  FILE* f = std::fopen(std::getenv("FINEGEMM_GEMM_LEAN_TRACE_FILE"), "a");
  if (f == nullptr) return;
  std::fprintf(f, "# lean trace m=%d n=%d k=%d block_m=%d grid=%d dp_tiles=%d mode=%d\n", p.m, p.n, p.k, block_m, grid,
               dp_tiles, lean_stream_k_mode());
  for (int c = 0; c < grid; ++c)
    for (int i = 0; i < kLeanTraceItems; ++i) {
      const LeanTrace& e = host[static_cast<size_t>(c) * kLeanTraceItems + i];
      if (e.item[0] == -1) continue;
      std::fprintf(f, "%d %d %d %d %d", c, i, e.item[0], e.item[1], e.item[2]);
      for (int s = 0; s < kLeanTraceStamps; ++s)
        for (int w = 0; w < 2; ++w)
          std::fprintf(f, " %lld", e.stamp[s][w] == ~0ull ? -1ll : static_cast<long long>(e.stamp[s][w]));
      std::fprintf(f, "\n");
    }
  std::fclose(f);
}

template <int BLOCK_M, int kStages>
int lean_smem(int num_kb, bool sfb_warp) {
  return LeanGemm<BLOCK_M, kStages>::smem_bytes(num_kb, sfb_warp);
}

int lean_smem_bytes(int block_m, int stages, int num_kb, bool sfb_warp) {
  if (block_m == 128) return stages == 5 ? lean_smem<128, 5>(num_kb, sfb_warp) : lean_smem<128, 4>(num_kb, sfb_warp);
  if (block_m == 192) return lean_smem<192, 4>(num_kb, sfb_warp);
  return lean_smem<256, 3>(num_kb, sfb_warp);
}



template <int BLOCK_M, int kStages, bool kAScale, bool kPair, bool kGated = false, bool kShareA = false,
          bool kSfbWarp = false, bool kStreamK = false>
void launch_lean(const void* a, int64_t lda, const void* b, int64_t ldb, const GemmParams& p, int device,
                 cudaStream_t stream) {
  using L = LeanGemm<BLOCK_M, kStages>;
  auto kernel = sm90_fp8_gemm_lean_kernel<BLOCK_M, kStages, kAScale, kPair, kGated, kShareA, kSfbWarp, kStreamK>;
  static std::atomic<bool> attribute_set[kMaxDevices] = {};
  allow_max_smem_once(kernel, attribute_set, device);
  // kPair: each CTA of a pair loads one 64-row half of the B tile; kShareA: one BLOCK_M / 2-row half of the A tile.
  const CUtensorMap tma_a = make_tma_2d(a, p.m, p.k, lda, kShareA ? BLOCK_M / 2 : BLOCK_M);
  const CUtensorMap tma_b = make_tma_2d(b, p.n, p.k, ldb, kPair && !kShareA ? kLeanBlockN / 2 : kLeanBlockN);
  const CUtensorMap tma_out = make_tma_2d(p.out, p.m, 2 * int64_t{p.n}, 2 * p.ldo, 64);
  const int num_m_blocks = ceil_div(p.m, BLOCK_M);
  // kPair: the pairs' tiles (row-block pairs by column blocks; kShareA: row blocks by column-block pairs).
  const int64_t tiles = kShareA ? int64_t{num_m_blocks} * ceil_div(ceil_div(p.n, kLeanBlockN), 2)
                                : int64_t{kPair ? (num_m_blocks + 1) / 2 : num_m_blocks} * ceil_div(p.n, kLeanBlockN);
  if (tiles > INT32_MAX) throw Error("lean gemm: " + std::to_string(tiles) + " tiles, more than one grid takes");
  const int smem = L::smem_bytes(p.k / kGemmBlockK, kSfbWarp);
  if constexpr (kPair) {
    // As many clusters as fit at once (an SM pair must sit in one GPC; gemm_launch.cuh's launch_kernel), never more
    // than the tiles: the kernel is persistent.
    static std::atomic<int> max_clusters[kMaxDevices] = {};
    const int slot = device < kMaxDevices ? device : 0;
    int clusters = max_clusters[slot].load(std::memory_order_relaxed);
    if (clusters == 0) {
      cudaLaunchAttribute attr[1];
      attr[0].id = cudaLaunchAttributeClusterDimension;
      attr[0].val.clusterDim.x = 2;
      attr[0].val.clusterDim.y = 1;
      attr[0].val.clusterDim.z = 1;
      cudaLaunchConfig_t config{};
      config.gridDim = dim3(2 * (num_sms_of_device(device) / 2));
      config.blockDim = dim3(L::kThreads);
      config.dynamicSmemBytes = static_cast<size_t>(smem);
      config.attrs = attr;
      config.numAttrs = 1;
      FG_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, kernel, &config));
      if (clusters <= 0) clusters = -1;  // none fits: remembered, and the unpaired kernel runs
      max_clusters[slot].store(clusters);
    }
    if (clusters < 0) {
      launch_lean<BLOCK_M, kStages, kAScale, false, kGated, false, kSfbWarp>(a, lda, b, ldb, p, device, stream);
      return;
    }
    const int grid_clusters = static_cast<int>(std::min<int64_t>(tiles, clusters));
    launch_ex(false, 2, kernel, dim3(2 * grid_clusters), dim3(L::kThreads), static_cast<size_t>(smem), stream, tma_a,
              tma_b, tma_out, p, num_m_blocks, static_cast<int>(tiles), LeanStreamK{});
    lean_pair_launch_count[kShareA ? 1 : 0].fetch_add(1, std::memory_order_relaxed);
  } else if constexpr (kStreamK) {
    // The whole waves' tiles run whole; the last partial wave's K blocks split evenly over one CTA per SM (fewer where
    // there is no whole wave and the tail has fewer K blocks than SMs). None where the waves are whole, or no flags are
    // left (claim_split_counters): the plain kernel runs. Mode 2 (diagnostics): this kernel with every tile whole.
    const int mode = lean_stream_k_mode();
    const int sms = num_sms_of_device(device);
    const int64_t tail = mode == 2 ? 0 : tiles % sms;
    const int64_t units = tail * (p.k / kGemmBlockK);
    const int grid = tail == 0 || tiles > tail ? static_cast<int>(std::min<int64_t>(tiles, sms))
                                               : static_cast<int>(std::min<int64_t>(sms, units));
    int* flags = tail > 0 ? claim_split_counters(device, stream, grid) : nullptr;
    if (mode != 2 && flags == nullptr) {
      launch_lean<BLOCK_M, kStages, kAScale, false, false, false, false, false>(a, lda, b, ldb, p, device, stream);
      return;
    }
    const size_t bytes = tail > 0 ? sizeof(float) * static_cast<size_t>(grid) * BLOCK_M * kLeanBlockN : 0;
    std::optional<StreamScratch> owned;  // under capture: a stream-ordered allocation, freed after the launch
    float* partials = bytes > 0 ? cached_split_workspace(device, stream, bytes) : nullptr;
    if (bytes > 0 && partials == nullptr) {
      owned.emplace(bytes, stream);
      partials = owned->as<float>();
    }
    LeanStreamK sk;
    sk.dp_tiles = static_cast<int>(tiles - tail);
    sk.partials = partials;
    sk.flags = flags;
    LeanTrace* trace = lean_trace_begin(sms, stream);
    sk.trace = trace;
    kernel<<<grid, L::kThreads, smem, stream>>>(tma_a, tma_b, tma_out, p, num_m_blocks, static_cast<int>(tiles), sk);
    FG_CUDA_CHECK(cudaGetLastError());
    lean_trace_end(trace, p, BLOCK_M, grid, sk.dp_tiles, sms, stream);
    lean_stream_k_launch_count.fetch_add(1, std::memory_order_relaxed);
  } else {
    const int grid = static_cast<int>(std::min<int64_t>(tiles, num_sms_of_device(device)));
    kernel<<<grid, L::kThreads, smem, stream>>>(tma_a, tma_b, tma_out, p, num_m_blocks, static_cast<int>(tiles),
                                                LeanStreamK{});
  }
  FG_CUDA_CHECK(cudaGetLastError());
  lean_launch_count.fetch_add(1, std::memory_order_relaxed);
  if constexpr (kSfbWarp) lean_sfb_warp_launch_count.fetch_add(1, std::memory_order_relaxed);
}

std::atomic<long long> grouped_lean_launch_count{0};

template <int BLOCK_M, int kStages, bool kAScale>
void launch_grouped_lean(const void* a, int64_t lda, const void* b, int64_t ldb, const GroupedLayout& layout,
                         const GemmParams& p, int device, cudaStream_t stream) {
  using L = LeanGemm<BLOCK_M, kStages>;
  auto kernel = sm90_fp8_grouped_lean_kernel<BLOCK_M, kStages, kAScale>;
  static std::atomic<bool> attribute_set[kMaxDevices] = {};
  allow_max_smem_once(kernel, attribute_set, device);
  const CUtensorMap tma_a = make_tma_2d(a, p.m, p.k, lda, BLOCK_M);
  const CUtensorMap tma_b = make_tma_2d(b, int64_t{layout.num_groups} * p.n, p.k, ldb, kLeanBlockN);
  typename L::Sched sched;
  sched.offsets = layout.offsets;
  sched.counts = layout.counts;
  sched.max_rows = layout.max_rows;
  sched.num_groups = layout.num_groups;
  sched.num_n_blocks = ceil_div(p.n, kLeanBlockN);
  sched.num_k_blocks = p.k / kGemmBlockK;
  // The tile count lives on the device (the experts' rows): a persistent grid of one CTA per SM.
  kernel<<<num_sms_of_device(device), L::kThreads, L::grouped_smem_bytes(p.k / kGemmBlockK), stream>>>(tma_a, tma_b, p,
                                                                                                      sched);
  FG_CUDA_CHECK(cudaGetLastError());
  grouped_lean_launch_count.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

// Stages for num_kb K blocks: 128-row tiles take 4 or 5, whichever pads fewer stages in a tile's last lap (a pad stage
// keeps the next tile's loads waiting), 5 on a tie; 192-row tiles take 4 (five do not fit beside the staging tiles);
// 256-row tiles take 3 (a 2-stage build spilled 128 bytes).
int lean_stages(int block_m, int num_kb) {
  if (block_m == 192) return 4;
  if (block_m != 128) return 3;
  auto pads = [&](int s) { return (s - num_kb % s) % s; };
  return pads(4) < pads(5) ? 4 : 5;
}

bool grouped_lean_ok(const GemmParams& p, int block_m, int num_groups, int device) {
  if (block_m != 128 && block_m != 192 && block_m != 256) return false;
  if (p.m <= 0 || p.n <= 0 || p.k <= 0 || p.k % kGemmBlockK != 0 || num_groups <= 0 ||
      num_groups > kMaxGroupedLeanExperts)
    return false;
  const int num_kb = p.k / kGemmBlockK;
  if (p.b_fp4 || p.b_layout != BLayout::Plain || p.promote_k % kGemmBlockK != 0) return false;
  // 1x128 A scales (row-major or any strides: read per thread) or none (static / per-token: the row scale).
  if (p.a_scale != nullptr && (p.a_group != 128 || p.a_scale_cols != num_kb)) return false;
  // The kernel indexes them with 32-bit offsets (row · stride_m + kb · stride_k).
  if (p.a_scale != nullptr && (p.a_scale_stride_m < 0 || p.a_scale_stride_k < 0 ||
                               (int64_t{p.m} - 1) * p.a_scale_stride_m + (num_kb - 1) * p.a_scale_stride_k >= INT32_MAX))
    return false;
  if (p.b_scale == nullptr || p.b_block_n != kLeanBlockN || p.b_block_k != kGemmBlockK || p.b_scale_cols < num_kb)
    return false;
  // An expert bias (load_bias's dtypes) is added as the general kernel's Store epilogue adds it; a column scale is not
  // (set_weight_scales gives one only to per-tensor and per-channel weights, which have no block scales).
  // A gate (the expanded FP4 experts' tile-scale launch, Fp4Expansion::launch_e4m3) is read at the kernel's start.
  // (Not one chained by programmatic dependent launch: this kernel does not wait for the launch ahead.)
  if (p.gate_wait || p.workspace != nullptr || p.col_mode != VecMode::None) return false;
  // Two outputs per store: even N and leading dimension, the output aligned to a pair.
  const size_t elem = p.out_dtype == OutDType::F32 ? 4 : 2;
  if (p.n % 2 != 0 || p.ldo % 2 != 0 || reinterpret_cast<uintptr_t>(p.out) % (2 * elem) != 0) return false;
  int max_smem = 0;
  FG_CUDA_CHECK(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  const int stages = lean_stages(block_m, num_kb);
  const int bytes = block_m == 128   ? (stages == 5 ? LeanGemm<128, 5>::grouped_smem_bytes(num_kb)
                                                    : LeanGemm<128, 4>::grouped_smem_bytes(num_kb))
                    : block_m == 192 ? LeanGemm<192, 4>::grouped_smem_bytes(num_kb)
                                     : LeanGemm<256, 3>::grouped_smem_bytes(num_kb);
  return bytes <= max_smem;
}

void launch_sm90_fp8_grouped_lean(const void* a, int64_t lda, const void* b, int64_t ldb, const GroupedLayout& layout,
                                  const GemmParams& p, int block_m, int device, cudaStream_t stream) {
  const int stages = lean_stages(block_m, p.k / kGemmBlockK);
  auto launch = [&](auto a_scale) {
    constexpr bool kA = decltype(a_scale)::value;
    if (block_m == 256) launch_grouped_lean<256, 3, kA>(a, lda, b, ldb, layout, p, device, stream);
    else if (block_m == 192) launch_grouped_lean<192, 4, kA>(a, lda, b, ldb, layout, p, device, stream);
    else if (stages == 5) launch_grouped_lean<128, 5, kA>(a, lda, b, ldb, layout, p, device, stream);
    else launch_grouped_lean<128, 4, kA>(a, lda, b, ldb, layout, p, device, stream);
  };
  if (p.a_scale != nullptr) launch(std::true_type{});
  else launch(std::false_type{});
}

namespace {
// A 0/1 switch: unset `fallback`, "0" off, "1" on, anything else an error naming the variable, what it does and the
// value.
bool strict_env_bool(const char* name, const char* what, bool fallback) {
  const char* env = std::getenv(name);
  const std::string v = env ? env : "";
  if (v.empty()) return fallback;
  if (v == "0") return false;
  if (v == "1") return true;
  throw Error(std::string(name) + ": expected 0 or 1 (" + what + "), got '" + v + "'");
}
}  // namespace

// FINEGEMM_GEMM_LEAN_PAIR: 1 runs the dense lean kernel in 2-CTA clusters sharing B (lean_gemm_body's kPair, stop 40),
// a in clusters sharing A (kShareA, stop 42), both not yet measured; unset or 0 neither.
int lean_pair_mode() {
  const char* env = std::getenv("FINEGEMM_GEMM_LEAN_PAIR");
  const std::string v = env ? env : "";
  if (v.empty()) return -1;
  if (v == "0") return 0;
  if (v == "1") return 1;
  if (v == "a") return 2;
  throw Error("FINEGEMM_GEMM_LEAN_PAIR: expected 0, 1 (2-CTA clusters sharing B in the lean kernel) or a (sharing A), got '" +
              v + "'");
}

// FINEGEMM_FP4_EXPAND_LEAN: unset or 1 lets the lean kernel (gated, kGated) serve the expanded FP4 prefill's E4M3
// GEMM with tile scales; 0 leaves it to the general kernel. On by default since stop 43 (H200, graph replay, M = 4096
// N = 4096 K = 7168 mxfp4-group128: 205.6 µs against 247.2 with the general kernel, the FP8 GEMM 173.9; exact:
// bench/results/stop43_call2_2026-12-05_06500c5.json).
bool fp4_expand_lean_wanted() {
  return strict_env_bool("FINEGEMM_FP4_EXPAND_LEAN", "the lean kernel for the expanded FP4 prefill", true);
}

long long grouped_lean_launches() { return grouped_lean_launch_count.load(std::memory_order_relaxed); }

int lean_sfb_warp_mode() {
  const char* env = std::getenv("FINEGEMM_GEMM_LEAN_SFB_WARP");
  const std::string v = env ? env : "";
  if (v.empty()) return -1;
  if (v == "0") return 0;
  if (v == "1") return 1;
  throw Error("FINEGEMM_GEMM_LEAN_SFB_WARP: expected 0 (the consumers load the lean kernel's B scales) or 1 (a scale "
              "warp loads them a tile ahead), got '" + v + "'");
}

// Unset FINEGEMM_GEMM_LEAN_SFB_WARP (mode -1): the scale warp at short K. Stop 45 (H100 80GB HBM3, bench_cuda_linear
// graph replay, block-fp32-dynamic, default against =1 in one process; bench/results/stop45_call2_*): it wins where a
// tile has few K blocks: K = 512 N = 32768 M = 4096 / 2048 / 512 160.8 -> 141.6, 92.3 -> 74.3, 27.9 -> 26.2 µs;
// K = 1536 N = 24576 260.1 -> 257.3, 132.6 -> 129.9, 37.1 -> 36.5; K = 2048 N = 7168 100.6 -> 99.1, 52.8 -> 50.4 at
// M = 4096 / 2048 but 16.75 -> 16.95 at M = 512. From K = 7168 it loses or ties (N = 4096 K = 7168 M = 4096
// 178.5 / 179.3 / 179.2 -> 182.4 / 183.0 / 182.8 in three runs; N = 7168 K = 16384 692 -> 720 in one call and
// 758 -> 732 in the next; M = 2048 360.8 -> 389.3), so longer K keeps the consumers' loads.
bool lean_sfb_warp_default(const GemmParams& p, int mode) {
  if (mode >= 0) return mode == 1;
  return p.k <= kLeanSfbWarpMaxK || (p.k <= kLeanSfbWarpMaxKLargeM && p.m >= kLeanSfbWarpMinMLargeK);
}

long long lean_sfb_warp_launches() { return lean_sfb_warp_launch_count.load(std::memory_order_relaxed); }

// Unset FINEGEMM_GEMM_LEAN_PAIR (mode -1): pairs sharing A where K <= kLeanPairAMaxK and M >= kLeanPairAMinM, else
// none. Stop 44 (H100 80GB HBM3, graph replay, bench/linear.py M = 4096, the same run as cuBLASLt): N = 32768 K = 512
// 166.0 -> 159.8 µs (cuBLASLt 172.3), N = 24576 K = 1536 259.6 -> 256.3 (267.8); at K = 7168 they tie (N = 4096:
// 1362-1382 against 1379-1383 TFLOP/s, stop 43, H200), so longer K keeps single CTAs. Below M = 2048 not measured.
int lean_pair_default(const GemmParams& p, int mode) {
  if (mode >= 0) return mode;
  return p.k <= kLeanPairAMaxK && p.m >= kLeanPairAMinM ? 2 : 0;
}

bool lean_gemm_ok(const GemmParams& p, int block_m, int device) {
  if (block_m != 128 && block_m != 192 && block_m != 256) return false;
  if (p.m <= 0 || p.n <= 0 || p.k <= 0 || p.k % kGemmBlockK != 0) return false;
  const int num_kb = p.k / kGemmBlockK;
  // The A scales by the bulk copy (FINEGEMM_GEMM_SCALE_BULK=0 turns that off here too), one per K block, or none
  // (static per-tensor and per-token activations: a row scale in the epilogue); the B scales' rows reach every K block.
  if (p.a_scale != nullptr &&
      (p.a_group != 128 || !a_scale_bulk_wanted() || !a_scale_bulk_ok(p) || p.a_scale_cols != num_kb))
    return false;
  if (p.b_scale == nullptr || p.b_block_n != kLeanBlockN || p.b_block_k != kGemmBlockK || p.b_fp4 ||
      p.b_scale_cols < num_kb)
    return false;
  // A gated call (the expanded FP4 prefill's E4M3 GEMM with tile scales) only with FINEGEMM_FP4_EXPAND_LEAN=1.
  if ((p.gate != nullptr && !fp4_expand_lean_wanted()) || p.row_weight != nullptr || p.workspace != nullptr ||
      !tma_store_output_ok(p))
    return false;
  int max_smem = 0;
  FG_CUDA_CHECK(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  return lean_smem_bytes(block_m, lean_stages(block_m, num_kb), num_kb, lean_sfb_warp_default(p, lean_sfb_warp_mode())) <= max_smem;
}

int lean_stream_k_mode() {
  const char* env = std::getenv("FINEGEMM_GEMM_LEAN_STREAMK");
  const std::string v = env ? env : "";
  if (v.empty() || v == "0") return 0;
  if (v == "1") return 1;
  if (v == "2") return 2;
  throw Error("FINEGEMM_GEMM_LEAN_STREAMK: expected 0, 1 (a stream-K tail in the dense lean kernel) or 2 (its kernel "
              "with every tile whole, for its trace), got '" + v + "'");
}

long long lean_stream_k_launches() { return lean_stream_k_launch_count.load(std::memory_order_relaxed); }

bool lean_unit_epilogue_wanted() {
  return strict_env_bool("FINEGEMM_GEMM_LEAN_UNIT_EPILOGUE", "the lean epilogue's one addition without a row scale",
                         true);
}

void launch_sm90_fp8_gemm_lean(const void* a, int64_t lda, const void* b, int64_t ldb, const GemmParams& params,
                               int block_m, int device, cudaStream_t stream) {
  GemmParams p = params;
  p.lean_unit_epilogue = lean_unit_epilogue_wanted();
  const int stages = lean_stages(block_m, p.k / kGemmBlockK);
  // A gated call (lean_gemm_ok admits one with FINEGEMM_FP4_EXPAND_LEAN=1) takes the gated kernel, never paired.
  // FINEGEMM_GEMM_LEAN_STREAMK=1: unset pair and scale-warp modes resolve to neither, for the stream-K tail.
  const bool stream_k = p.gate == nullptr && lean_stream_k_mode() > 0;
  const int sfb_mode = lean_sfb_warp_mode(), pair_mode = lean_pair_mode();
  const bool sfb_warp = stream_k && sfb_mode < 0 ? false : lean_sfb_warp_default(p, sfb_mode);
  auto launch = [&](auto a_scale, auto pair, auto gated, auto share_a) {
    constexpr bool kA = decltype(a_scale)::value, kP = decltype(pair)::value, kG = decltype(gated)::value,
                   kS = decltype(share_a)::value;
    auto heights = [&](auto sfb) {
      constexpr bool kW = decltype(sfb)::value;
      if (block_m == 256) launch_lean<256, 3, kA, kP, kG, kS, kW>(a, lda, b, ldb, p, device, stream);
      else if (block_m == 192) launch_lean<192, 4, kA, kP, kG, kS, kW>(a, lda, b, ldb, p, device, stream);
      else if (stages == 5) launch_lean<128, 5, kA, kP, kG, kS, kW>(a, lda, b, ldb, p, device, stream);
      else launch_lean<128, 4, kA, kP, kG, kS, kW>(a, lda, b, ldb, p, device, stream);
    };
    if (sfb_warp) heights(std::true_type{});
    else heights(std::false_type{});
  };
  using F = std::false_type;
  using T = std::true_type;
  if (p.gate != nullptr) {
    if (p.a_scale != nullptr) launch(T{}, F{}, T{}, F{});
    else launch(F{}, F{}, T{}, F{});
    return;
  }
  const int pair = stream_k && pair_mode < 0 ? 0 : lean_pair_default(p, pair_mode);
  if (stream_k && pair == 0 && !sfb_warp) {
    auto heights = [&](auto a_scale) {
      constexpr bool kA = decltype(a_scale)::value;
      if (block_m == 256) launch_lean<256, 3, kA, false, false, false, false, true>(a, lda, b, ldb, p, device, stream);
      else if (block_m == 192) launch_lean<192, 4, kA, false, false, false, false, true>(a, lda, b, ldb, p, device, stream);
      else if (stages == 5) launch_lean<128, 5, kA, false, false, false, false, true>(a, lda, b, ldb, p, device, stream);
      else launch_lean<128, 4, kA, false, false, false, false, true>(a, lda, b, ldb, p, device, stream);
    };
    if (p.a_scale != nullptr) heights(T{});
    else heights(F{});
    return;
  }
  if (p.a_scale != nullptr) {
    if (pair == 1) launch(T{}, T{}, F{}, F{});
    else if (pair == 2) launch(T{}, T{}, F{}, T{});
    else launch(T{}, F{}, F{}, F{});
  } else {
    if (pair == 1) launch(F{}, T{}, F{}, F{});
    else if (pair == 2) launch(F{}, T{}, F{}, T{});
    else launch(F{}, F{}, F{}, F{});
  }
}

// A cost model fitted to stop 36's A/B (H200, 21 prefill shapes, M = 128/512/4096, FINEGEMM_GEMM_LEAN=0/1/256): each
// kernel's run costs waves x tile area / efficiency, a partial wave counting whole (persistent grids take their units
// round robin). Efficiencies per unit of area, relative to the lean 128x128 tile: lean 256x128 and 192x128 1.1 (192
// from stop 39's A/B, the seven bar shapes at M = 512 and 4096: 1.04 to 1.15; where both take the same wave area the
// taller wins, see below); the general
// kernel's 192x128 0.95, 128x128 0.82, 128x192 0.80, 64x128 0.53, 128x64 0.45 (split-K units count their share of
// K). Short K costs the lean kernel a K block's time per tile (its epilogue does not overlap the next tile's wgmma)
// and the general kernel half of one. It picks the measured winner at 20 of the 21 shapes; the miss (M = 4096,
// N = 32768, K = 512: lean 168.8 µs vs general 163.7) is within 3%. With 192 rows (stop 39, graph replay, general /
// lean 128 / 192 / 256): M = 4096 N = 2112 K = 7168 112.8 / 114.9 / 97.6 / 125.6 µs, N = 576 K = 7168 35.4 / 48.1 /
// 31.5 / 41.1, both now 192. Where 192 and 256 rows tie in the model, 256: at N = 24576 K = 1536 192 rows took
// 255 / 260 / 254 / 268 µs in four runs against 253 / 253 at 256; at N = 32768 K = 512 the other way (166 / 158 / 167
// against 171 / 169), which the pad stages' cost (below) now settles for 192. At M = 512 192 rows never won.
int lean_gemm_block_m(const GemmParams& p, int num_sms) {
  if (p.m < kLeanMinM || num_sms <= 0 || p.k < kGemmBlockK) return 0;
  const double kb = static_cast<double>(p.k) / kGemmBlockK;
  const int64_t col_blocks = ceil_div(p.n, kLeanBlockN);
  // A tile's pad stages (its last lap's stages past K, lean_stages) count a quarter of a K block each: at M = 4096
  // N = 32768 K = 512 (four K blocks: two pad stages at 256 rows' three stages, none at 192 rows' four) the model tied
  // 256 and 192 rows, and 192 measured faster (stop 39, H200 graph replay: 166.4 vs 170.7 µs; other calls 158-167 vs
  // 169-171). Elsewhere among issue 3's shapes a pad stage or two weigh too little against K to change a pick.
  const int num_kb = p.k / kGemmBlockK;
  auto lean_cost = [&](int block_m) {
    const int64_t waves = ceil_div(int64_t{ceil_div(p.m, block_m)} * col_blocks, int64_t{num_sms});
    const int stages = lean_stages(block_m, num_kb);
    const int pads = (stages - num_kb % stages) % stages;
    const double eff = (block_m == 128 ? 1.0 : 1.1) * kb / (kb + 1.0 + 0.25 * pads);
    return static_cast<double>(waves) * block_m * kLeanBlockN / eff;
  };
  const GemmConfig c = choose_gemm_config(p.m, p.n, p.k, kGemmBlockK, num_sms);
  double g_eff = 0.8;
  if (c.block_m == 192 && c.block_n == 128) g_eff = 0.95;
  else if (c.block_m == 128 && c.block_n == 128) g_eff = 0.82;
  else if (c.block_m == 64 && c.block_n == 128) g_eff = 0.53;
  else if (c.block_m == 128 && c.block_n == 64) g_eff = 0.45;
  else if (c.block_n == 64) g_eff = 0.4;
  const int split = std::max(1, c.split_k);
  const int64_t units = int64_t{ceil_div(p.m, c.block_m)} * ceil_div(p.n, c.block_n) * split;
  const int64_t ctas = std::max<int64_t>(1, int64_t{c.grid} * std::max(1, c.cluster));
  const double g_kb = kb / split;
  const double general = static_cast<double>(ceil_div(units, ctas)) * c.block_m * c.block_n / split /
                         (g_eff * g_kb / (g_kb + 0.5));
  // Ties go to the taller tile (256, then 192).
  int block_m = 256;
  double best = lean_cost(256);
  for (const int h : {192, 128}) {
    const double cost = lean_cost(h);
    if (cost < best) block_m = h, best = cost;
  }
  return best < general ? block_m : 0;
}

long long lean_gemm_launches() { return lean_launch_count.load(std::memory_order_relaxed); }
long long lean_pair_launches(bool share_a) { return lean_pair_launch_count[share_a ? 1 : 0].load(std::memory_order_relaxed); }

}  // namespace finegemm::cuda
