// Host helpers shared by the GEMM launchers (dense and grouped): tensor maps, device facts, the launch itself.
#pragma once
#include <cudaTypedefs.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "cuda/kernels/sm90_fp8_gemm.cuh"
#include "cuda/runtime/check.hpp"

namespace finegemm::cuda {

inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult status{};
    FG_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &status));
    if (status != cudaDriverEntryPointSuccess || !fn)
      throw Error(ErrorKind::Runtime, "CUDA driver: cuTensorMapEncodeTiled is not available");
    encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  });
  return encode;
}

// A 2-D byte tensor [rows, cols] with row stride `ld` bytes, loaded in boxes of box_rows × 128 bytes, 128B swizzle.
// box_cols bytes per row: 128 (E4M3 K blocks, 128-byte swizzle) or 64 (packed FP4 K blocks: no swizzle, the loader
// warps expand and swizzle them; or, with swizzle64, the 64-byte swizzle the FP4 decode kernel reads). plain128: 128
// bytes unswizzled (the FP4 decode kernel's comparison switch).
inline CUtensorMap make_tma_2d(const void* ptr, int64_t rows, int64_t cols, int64_t ld, int box_rows, int box_cols = 128,
                               bool swizzle64 = false, bool plain128 = false) {
  CUtensorMap map{};
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(ld)};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_cols), static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r = tensor_map_encoder()(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(ptr), dims, strides,
                                          box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                          box_cols == 128 ? (plain128 ? CU_TENSOR_MAP_SWIZZLE_NONE : CU_TENSOR_MAP_SWIZZLE_128B)
                                          : (swizzle64 ? CU_TENSOR_MAP_SWIZZLE_64B : CU_TENSOR_MAP_SWIZZLE_NONE),
                                          CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw Error(ErrorKind::Runtime, "cuTensorMapEncodeTiled failed (" + std::to_string(static_cast<int>(r)) +
                                        ") for a [" + std::to_string(rows) + ", " + std::to_string(cols) + "] tensor");
  return map;
}

// kernel<<<grid, block, smem, stream>>>(args...), with programmatic stream serialization when `programmatic` (the
// kernel may start before the previous one in the stream completes, and must griddepcontrol.wait before it reads that
// kernel's output), in thread-block clusters of `cluster_x` consecutive CTAs along x when it is more than 1.
template <typename... Params, typename... Args>
inline void launch_ex(bool programmatic, int cluster_x, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                      cudaStream_t stream, Args&&... args) {
  if (!programmatic && cluster_x <= 1) {
    kernel<<<grid, block, smem, stream>>>(std::forward<Args>(args)...);
    return;
  }
  cudaLaunchAttribute attrs[2]{};
  unsigned n = 0;
  if (programmatic) {
    attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster_x > 1) {
    attrs[n].id = cudaLaunchAttributeClusterDimension;
    attrs[n].val.clusterDim.x = static_cast<unsigned>(cluster_x);
    attrs[n].val.clusterDim.y = 1;
    attrs[n++].val.clusterDim.z = 1;
  }
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = attrs;
  config.numAttrs = n;
  FG_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

template <typename... Params, typename... Args>
inline void launch_programmatic(bool programmatic, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                                cudaStream_t stream, Args&&... args) {
  launch_ex(programmatic, 1, kernel, grid, block, smem, stream, std::forward<Args>(args)...);
}

// A comparison switch: the variable's value '1' or '0' turns the feature on or off; unset (or anything else) keeps
// its default.
inline bool env_switch(const char* name, bool default_on) {
  const char* env = std::getenv(name);
  if (env && *env == '1') return true;
  if (env && *env == '0') return false;
  return default_on;
}

// FP4 B with byte UE8M0 1x32 scales and A constant over each 128 of K: the fold kernels (GemmSmem), which promote
// once per 128 where a K block's scales spread ≤ 8 binades. FINEGEMM_FP4_FOLD=0 turns them off (comparisons).
inline bool fp4_fold(const GemmParams& p) {
  if (!env_switch("FINEGEMM_FP4_FOLD", true)) return false;
  return p.b_fp4 && p.b_scale_fmt == ScaleFmt::UE8M0 && p.b_block_k == 32 && p.b_block_n == 1 &&
         (p.a_scale == nullptr || p.a_group % 128 == 0);
}

// The kernel switches of GemmParams, from the environment (dense and grouped launches alike):
// - pingpong (on; FINEGEMM_GEMM_PINGPONG=0): the two consumer warpgroups issue their wgmma in turns.
// - rotate_issue (off; FINEGEMM_GEMM_ROTATE_ISSUE=1): three consumer warpgroups likewise, in a ring.
// - chunk_scales (on; FINEGEMM_GEMM_CHUNK_SCALES=0): one B scale per 8-column chunk. M=4096 N=7168 K=16384 812 vs
//   766 TFLOP/s, N=4096 K=7168 623 vs 589 on the H200 (gpu-check bench-accum, 48fe691).
// - lean_epilogue (on; FINEGEMM_GEMM_LEAN_EPILOGUE=0): measured faster on the H200, same bits.
// - skip_idle (on; FINEGEMM_GEMM_SKIP_IDLE=0): warpgroups with no rows in a tile skip its wgmma.
// - lean_scale_prefetch (off until measured; FINEGEMM_LEAN_SCALE_PREFETCH=1): GemmParams::lean_scale_prefetch.
// - double_acc (on; FINEGEMM_GEMM_DOUBLE_ACC=0): two accumulator sets in 128x128 tiles with 128-wide promotion, the
//   next K block's wgmma overlapping the promotion (dense 128x64 tiles only with FINEGEMM_GEMM_DOUBLE_ACC=1).
//   Measured on the H200 (stop 23, 128x128, one set -> two, TFLOP/s at M = 4096): N=7168 K=16384 955 -> 979/994,
//   N=4096 K=7168 860 -> 923/908, N=24576 K=1536 696 -> 759, N=2112 K=7168 698 -> 740, N=7168 K=2048 662 -> 707;
//   M=512 N=7168 K=16384 749 -> 788; the MoE down GEMM (DeepSeek-V3, T=4096) 1823 -> 1698 us. 128x64: M=4096
//   N=2112 K=7168 628 -> 664, M=512 569 -> 575, M=128 575 -> 569.
// - fp4_batched_expand (off until run on the H200; FINEGEMM_FP4_BATCHED_EXPAND=1).
// - early_release (off; FINEGEMM_GEMM_EARLY_RELEASE=1): GemmParams::early_release; within noise on the H200 (stop 26).
// - thread_release (on since stop 32; FINEGEMM_GEMM_THREAD_RELEASE=0 turns it off): GemmParams::thread_release (every
//   consumer thread arrives; the same speed, racecheck clean on the cluster kernels).
// - l2_prefetch (off; FINEGEMM_GEMM_L2_PREFETCH=D, 1..64): B's tile D K blocks ahead requested into L2. Slower on
//   the H200 everywhere (stop 29: M = 512 N = 4096 K = 7168 31.6 -> 35.7 us at D = 4).
// - hoist_split (on; FINEGEMM_GEMM_HOIST_SPLIT=0): GemmParams::hoist_split. Measured on the H200 (stop 27, M = 4096,
//   TFLOP/s, off -> on): N=7168 K=16384 1002 -> 1071 (192x128 pairs), 992 -> 1044 (128x128 pairs); N=4096 K=7168
//   996 -> 1045, 987 -> 1056.
// - wide_stores (dense on, grouped off; FINEGEMM_GEMM_WIDE_STORES=1 / 0 forces it, where the output's alignment
//   allows it): 16-byte stores from the lean epilogue. Measured on the H200 (stop 25, M = 4096, TFLOP/s, off -> on):
//   N=32768 K=512 417 -> 709, N=24576 K=1536 814 -> 941, N=7168 K=2048 755 -> 879, N=7168 K=16384 1054 -> 1086; the
//   MoE layer (grouped, DeepSeek-V3 T=4096) 5427 -> 5682 us with 128-row tiles, 4700 -> 4844 with 192-row ones.
inline void apply_env_switches(GemmParams& p, bool grouped = false) {
  p.pingpong = env_switch("FINEGEMM_GEMM_PINGPONG", true);
  p.rotate_issue = env_switch("FINEGEMM_GEMM_ROTATE_ISSUE", false);
  p.chunk_scales = env_switch("FINEGEMM_GEMM_CHUNK_SCALES", true);
  p.lean_epilogue = env_switch("FINEGEMM_GEMM_LEAN_EPILOGUE", true);
  p.skip_idle = env_switch("FINEGEMM_GEMM_SKIP_IDLE", true);
  p.lean_scale_prefetch = env_switch("FINEGEMM_LEAN_SCALE_PREFETCH", false);
  p.double_acc = env_switch("FINEGEMM_GEMM_DOUBLE_ACC", true);
  if (const char* run = std::getenv("FINEGEMM_GEMM_DOUBLE_RUN"); run && std::strcmp(run, "8") == 0) p.double_acc_run = 8;
  p.fp4_batched_expand = env_switch("FINEGEMM_FP4_BATCHED_EXPAND", false);
  p.early_release = env_switch("FINEGEMM_GEMM_EARLY_RELEASE", false);
  p.thread_release = env_switch("FINEGEMM_GEMM_THREAD_RELEASE", true);
  p.hoist_split = env_switch("FINEGEMM_GEMM_HOIST_SPLIT", true);
  p.one_acc = env_switch("FINEGEMM_GEMM_ONE_ACC", false);
  {  // -1 (unset): 192-row tiles only
    const char* la = std::getenv("FINEGEMM_GEMM_LOOKAHEAD");
    p.lookahead = la && (*la == '0' || *la == '1') ? *la - '0' : -1;
  }
  p.defer_release = env_switch("FINEGEMM_GEMM_DEFER_RELEASE", false);
  if (const char* d = std::getenv("FINEGEMM_GEMM_L2_PREFETCH"); d && *d) p.l2_prefetch = std::max(0, std::min(64, std::atoi(d)));
  const int64_t out_elem = p.out_dtype == OutDType::F32 ? 4 : 2;
  p.wide_stores = env_switch("FINEGEMM_GEMM_WIDE_STORES", !grouped) && p.out != nullptr &&
                  reinterpret_cast<uintptr_t>(p.out) % 16 == 0 && (p.ldo * out_elem) % 16 == 0 && p.n % 8 == 0;
}

// Recipes without K-granular scales (per-tensor, per-channel, per-token) run the promoting kernels with unit scales
// when K > kFp32AccumMinK, so that the wgmma accumulator moves into FP32 registers every 128 of K, as for the block
// recipes. Hopper's FP8 wgmma accumulates with fewer bits than FP32 (the DeepSeek-V3 report: about 14), and the error
// grows with K.
// NOTE: measured on the H200 (CudaTest.Fp32AccumulationOfUnscaledRecipes, F32 out, M=300, K=16384): rel 1.02e-3
// with the wgmma accumulator alone, over RECIPES.md's 1e-3, and 1.26e-4 promoted. Promotion costs speed (M=4096,
// N=7168, K=16384 per-channel: 845 vs 1160 TFLOP/s), so K ≤ 4096 keeps the plain kernels (there the error is about
// a quarter of the K=16384 one). FINEGEMM_GEMM_FP32_ACCUM=1 / 0 forces it on / off (comparisons).
// The grouped (MoE) GEMMs keep the plain kernels unless forced: their bar is 1e-2, and their unit-scale promoting path
// has not run on the H200 yet (grouped = true).
inline constexpr int kFp32AccumMinK = 4096;
// The output side of the TMA-store epilogue: the lean epilogue's case (no column scale, no bias), 16-bit output in
// plain column order, y 16-byte aligned with rows a multiple of 16 bytes apart (TMA's global address and stride rules).
inline bool tma_store_output_ok(const GemmParams& p) {
  return p.lean_epilogue && p.col_mode == VecMode::None && p.bias_dtype < 0 &&
         (p.out_dtype == OutDType::BF16 || p.out_dtype == OutDType::F16) && p.b_layout == BLayout::Plain &&
         reinterpret_cast<uintptr_t>(p.out) % 16 == 0 && (2 * p.ldo) % 16 == 0;
}

inline bool fp32_accum_wanted(int k, bool grouped = false) {
  return env_switch("FINEGEMM_GEMM_FP32_ACCUM", !grouped && k > kFp32AccumMinK);
}

inline constexpr int kMaxDevices = 64;

inline int num_sms_of_device(int device) {
  static std::atomic<int> cache[kMaxDevices] = {};
  int sms = device < kMaxDevices ? cache[device].load(std::memory_order_relaxed) : 0;
  if (sms == 0) {
    FG_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    if (device < kMaxDevices) cache[device].store(sms);
  }
  return sms;
}

// The shared-memory attribute of a kernel with dynamic shared memory: the opt-in maximum less the kernel's static
// shared memory (asking for more is an invalid argument), once per device (launches pass what their K needs).
template <typename Kernel>
inline void allow_max_smem_once(Kernel kernel, std::atomic<bool> (&attribute_set)[kMaxDevices], int device) {
  if (device >= kMaxDevices || !attribute_set[device].load(std::memory_order_acquire)) {
    int max_smem = 0;
    FG_CUDA_CHECK(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    cudaFuncAttributes attributes{};
    FG_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
    max_smem -= static_cast<int>(attributes.sharedSizeBytes);
    FG_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, max_smem));
    if (device < kMaxDevices) attribute_set[device].store(true, std::memory_order_release);
  }
}

// The diagnostic traces' launch choice (FINEGEMM_GEMM_LEAN_TRACE_FILE, FINEGEMM_FP4_LEAN_TRACE_FILE): when the file
// variable `file_env` is set and `stream` is not capturing, launch number `call_env` (default `default_call`) of the
// caller's launches, counted in `calls`, gets the caller's buffer `buf`, grown to `bytes` (capacity in `capacity`)
// and filled with 0xFF bytes; every other launch gets nullptr.
inline void* diagnostic_trace_buffer(const char* file_env, const char* call_env, int default_call, int& calls, void*& buf,
                                     size_t& capacity, size_t bytes, cudaStream_t stream) {
  const char* file = std::getenv(file_env);
  if (file == nullptr || *file == 0) return nullptr;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  FG_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  if (capture != cudaStreamCaptureStatusNone) return nullptr;
  const char* which = std::getenv(call_env);
  if (calls++ != (which && *which ? std::atoi(which) : default_call)) return nullptr;
  if (capacity < bytes) {
    if (buf) FG_CUDA_CHECK(cudaFree(buf));
    FG_CUDA_CHECK(cudaMalloc(&buf, bytes));
    capacity = bytes;
  }
  FG_CUDA_CHECK(cudaMemsetAsync(buf, 0xFF, bytes, stream));
  return buf;
}

inline int ceil_div(int64_t a, int64_t b) { return static_cast<int>((a + b - 1) / b); }

#if FINEGEMM_GEMM_TRACE
// The trace hook of FINEGEMM_GEMM_TRACE builds (sm90_fp8_gemm.cuh): with FINEGEMM_GEMM_TRACE_FILE set, launch number
// FINEGEMM_GEMM_TRACE_CALL (default 20, counted over the process's non-captured GEMM launches) gets a stamp buffer,
// and its stamps are appended to the file after the launch (the stream is synchronised: a trace build times nothing).
struct GemmTrace {
  uint32_t* buf = nullptr;
  bool active = false;
};
inline GemmTrace trace_begin(GemmParams& p, cudaStream_t stream) {
  GemmTrace tr;
  const char* file = std::getenv("FINEGEMM_GEMM_TRACE_FILE");
  if (!file || !*file) return tr;
  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  FG_CUDA_CHECK(cudaStreamIsCapturing(stream, &cap));
  if (cap != cudaStreamCaptureStatusNone) return tr;
  static int calls = 0;
  const char* which = std::getenv("FINEGEMM_GEMM_TRACE_CALL");
  const int want = which && *which ? std::atoi(which) : 20;
  if (calls++ != want) return tr;
  static uint32_t* buf = nullptr;
  if (!buf) FG_CUDA_CHECK(cudaMalloc(&buf, kGemmTraceWords * sizeof(uint32_t)));
  FG_CUDA_CHECK(cudaMemsetAsync(buf, 0xFF, kGemmTraceWords * sizeof(uint32_t), stream));
  p.trace = buf;
  tr.buf = buf;
  tr.active = true;
  return tr;
}
inline void trace_end(const GemmTrace& tr, const GemmParams& p, cudaStream_t stream, int block_m, int block_n, int stages,
                      int cluster, int grid) {
  if (!tr.active) return;
  std::vector<uint32_t> host(kGemmTraceWords);
  FG_CUDA_CHECK(cudaStreamSynchronize(stream));
  FG_CUDA_CHECK(cudaMemcpy(host.data(), tr.buf, host.size() * sizeof(uint32_t), cudaMemcpyDeviceToHost));
  FILE* f = std::fopen(std::getenv("FINEGEMM_GEMM_TRACE_FILE"), "a");
  if (!f) return;
  std::fprintf(f, "# trace m=%d n=%d k=%d tile=%dx%d stages=%d cluster=%d grid=%d\n", p.m, p.n, p.k, block_m, block_n,
               stages, cluster, grid);
  for (int role = 0; role < 4; ++role)
    for (int i = 0; i < kGemmTraceIters; ++i) {
      const uint32_t* e = host.data() + (role * kGemmTraceIters + i) * 8;
      if (e[0] == ~0u && e[1] == ~0u) continue;
      std::fprintf(f, "%d %d", role, i);
      for (int j = 0; j < 8; ++j) std::fprintf(f, " %lld", e[j] == ~0u ? -1ll : static_cast<long long>(e[j]));
      std::fprintf(f, "\n");
    }
  std::fclose(f);
}
#endif

// kCluster = 2: clusters of two CTAs sharing B through TMA multicast. The grid is then as many clusters as fit on
// the device at once (cudaOccupancyMaxActiveClusters: an SM pair must sit in one GPC), never more: the kernel is
// persistent, and a second wave of clusters would double the time.
// kShareA: the pair shares A instead (sm90_fp8_gemm.cuh), and `grid` counts column-block pairs. kCluster = 4: 2x2
// blocks sharing A and B, `grid` counts them (four SMs of one GPC each).
// kTmaStore: the TMA-store epilogue (tma_out: y as bytes, make_tma_2d(out, M, 2N, 2 ldo, 64)).
template <int BLOCK_M, int BLOCK_N, int kStages, int kPromoteK, Epilogue kEpilogue, typename Scheduler, bool kFp4B = false,
          int kCluster = 1, bool kShareA = false, bool kTmaStore = false, bool kOneAcc = false>
inline void launch_kernel(const CUtensorMap& tma_a, const CUtensorMap& tma_b, const GemmParams& p_in, const Scheduler& sched,
                   int grid, cudaStream_t stream, const CUtensorMap& tma_out = CUtensorMap{}) {
#if FINEGEMM_GEMM_TRACE
  GemmParams p = p_in;
  const GemmTrace trace = trace_begin(p, stream);
#else
  const GemmParams& p = p_in;
#endif
  auto kernel = sm90_fp8_gemm_kernel<BLOCK_M, BLOCK_N, kStages, kPromoteK, kEpilogue, Scheduler, kFp4B, kCluster, kShareA,
                                     kTmaStore, kOneAcc>;
  constexpr int kSmem = GemmSmem<BLOCK_M, BLOCK_N, kStages, kPromoteK, Scheduler::kSmemBytes, kFp4B,
                                 kTmaStore ? kTmaStoreStagingBytes<BLOCK_M, BLOCK_N> : 0>::kBytes;
  constexpr int kThreads = 128 * (BLOCK_M / 64 + 1);
  static_assert(kSmem <= 232448, "shared memory: a tile config exceeds the 227 KB an sm_90 block can have");
  // The shared-memory attribute is per device: set it once on each device this process launches on.
  static std::atomic<uint64_t> devices_set{0};
  static std::atomic<int> max_clusters[kMaxDevices] = {};
  int device = 0;
  FG_CUDA_CHECK(cudaGetDevice(&device));
  const uint64_t bit = 1ull << (device & 63);
  if (!(devices_set.load(std::memory_order_relaxed) & bit)) {
    FG_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
    devices_set.fetch_or(bit);
  }
  // GemmParams::gate_wait: a gated launch chained programmatically to the gated launch ahead of it.
  const bool programmatic = p.gate != nullptr && p.gate_wait;
  if constexpr (kCluster == 1) {
    launch_ex(programmatic, 1, kernel, dim3(grid), dim3(kThreads), kSmem, stream, tma_a, tma_b, tma_out, p, sched);
  } else {
    cudaLaunchAttribute attr[2];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = kCluster;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[1].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t config{};
    config.blockDim = dim3(kThreads);
    config.dynamicSmemBytes = kSmem;
    config.stream = stream;
    config.attrs = attr;
    config.numAttrs = 1;
    const int slot = device < kMaxDevices ? device : 0;
    int clusters = max_clusters[slot].load(std::memory_order_relaxed);
    if (clusters == 0) {
      config.gridDim = dim3(kCluster * 66);
      FG_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, kernel, &config));
      if (clusters <= 0) throw Error(ErrorKind::Runtime, "gemm: no cluster of " + std::to_string(kCluster) + " CTAs fits on this device");
      max_clusters[slot].store(clusters);
    }
    config.gridDim = dim3(kCluster * std::max(1, std::min(clusters, grid)));  // grid: the tile pairs (2x2 blocks) here
    if (const char* print = std::getenv("FINEGEMM_PRINT_CONFIG"); print && *print == '1')
      std::fprintf(stderr, "finegemm: cluster launch: %d clusters of %d fit at once, %d launched\n", clusters, kCluster,
                   static_cast<int>(config.gridDim.x) / kCluster);
    config.numAttrs = programmatic ? 2 : 1;
    FG_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, tma_a, tma_b, tma_out, p, sched));
  }
  FG_CUDA_CHECK(cudaGetLastError());
#if FINEGEMM_GEMM_TRACE
  trace_end(trace, p, stream, BLOCK_M, BLOCK_N, kStages, kCluster, grid);
#endif
}

}  // namespace finegemm::cuda
