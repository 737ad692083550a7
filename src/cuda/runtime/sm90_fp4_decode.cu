// Host side of src/cuda/kernels/sm90_fp4_decode.cuh: the FP4-weight decode kernels (M ≤ 64; MoE experts in chunks of
// token columns), one per token width.
#include <algorithm>
#include <atomic>
#include <climits>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "cuda/kernels/sm90_fp4_decode.cuh"
#include "cuda/runtime/gemm_args.hpp"
#include "cuda/runtime/gemm_launch.cuh"
#include "cuda/runtime/sm90_fp8_gemm.hpp"

namespace finegemm::cuda {
namespace {

std::atomic<long long> split_finishes{0};  // decode launches that finish their split-K themselves
std::atomic<long long> perm_launches{0};   // decode launches on permuted activations (kPermK)
std::atomic<long long> perm_wide_launches{0};  // of those, with 128-token tiles
std::atomic<long long> pipe_launches{0};  // dense FP4 decode launches with pipelined consumers (kPipe)
std::atomic<long long> fold_cache_launches{0};  // dense FP4 decode launches on prepared fold words

// Prepared fold words (FINEGEMM_FP4_DECODE_FOLD_CACHE=1, off until measured): one allocation per weight scale tensor,
// made and filled by fp4_fold_words_kernel on the first eager call that may use it and kept for the process. The
// switch is a promise that the weight scales at an address never change while the process runs (a weight freed and
// another put at the same address with the same shape would reuse the old words). Under stream capture a weight
// not yet prepared takes the preparer warp (no allocation is enqueued into a graph).
struct FoldWords {
  uint32_t* words = nullptr;  // [n][blocks]
  uint32_t* flags = nullptr;  // [tiles][blocks]
};
// device, scales, format, n, scale columns, row stride, group stride, groups
using FoldKey = std::tuple<int, const void*, int, int, int, int64_t, int64_t, int>;
std::mutex fold_mutex;
std::map<FoldKey, FoldWords>& fold_cache() {
  static auto* cache = new std::map<FoldKey, FoldWords>;  // never destroyed: the words live as long as the process
  return *cache;
}

// The prepared words for this call's weight scales, or {} where the call does not qualify or cannot prepare them now.
// Grouped weights (MoE experts, `groups` > 1) get every group's words at once.
FoldWords prepared_fold_words(const GemmParams& p, int groups, int device, cudaStream_t stream) {
  const int blocks = ceil_div(p.k, kGemmBlockK);
  const int tiles = ceil_div(p.n, kFp4DecodeRows);
  const int64_t group_stride = groups > 1 ? p.b_scale_group_stride : 0;
  const FoldKey key{device, p.b_scale, static_cast<int>(p.b_scale_fmt), p.n, p.b_scale_cols, p.b_scale_stride_n,
                    group_stride, groups};
  std::lock_guard<std::mutex> lock(fold_mutex);
  auto& cache = fold_cache();
  if (const auto it = cache.find(key); it != cache.end()) return it->second;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  FG_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  if (status != cudaStreamCaptureStatusNone) return {};
  const size_t word_count = static_cast<size_t>(groups) * p.n * blocks;
  const size_t flag_count = static_cast<size_t>(groups) * tiles * blocks;
  void* base = nullptr;
  if (cudaMalloc(&base, sizeof(uint32_t) * (word_count + flag_count)) != cudaSuccess) {
    (void)cudaGetLastError();
    return {};
  }
  FoldWords f{static_cast<uint32_t*>(base), static_cast<uint32_t*>(base) + word_count};
  const int word_bytes = p.b_scale_fmt == ScaleFmt::UE8M0 ? 1 : 4;
  fp4_fold_words_kernel<<<dim3(tiles, blocks, groups), 32, 0, stream>>>(static_cast<const uint8_t*>(p.b_scale),
                                                                       word_bytes, p.b_scale_stride_n, group_stride, p.n,
                                                                       p.b_scale_cols, blocks, f.words, f.flags);
  FG_CUDA_CHECK(cudaGetLastError());
  cache.emplace(key, f);
  return f;
}

// Stages (kStageK of K each; FP4 weights take about 7.7 KB per 128 of K at WN = 8 with the prepared scales): about
// 50 KB (128) or 60 KB (256) per CTA at WN ≤ 16, so that three or four CTAs share an SM; 2 CTAs at WN = 64 (its
// __launch_bounds__).
// E4M3 weights (8 KB per stage): 6 stages at WN ≤ 16, 4 at 32 and 64.
// Half the stages (twice the CTAs per SM) measured the same (51.8 vs 51.2 µs at M = 1, N = 7168, K = 16384).
// 128-row CTAs (E4M3 weights; one CTA per SM, registers): as many stages as fit in about 216 KB, at most 10: with 4
// (64 KB of weights in flight on the SM) M = 64 took 66.9 µs against the 64-row kernel's 56.6 (N = 7168, K = 16384).
// Permuted activations (kPermK, no fold area: about 5.4 KB per stage at WN = 8): 8 stages, and 5 at WN = 128
// (22.25 KB a stage, ~115 KB a CTA: two CTAs per SM); not measured yet.
// Prepared fold words without a preparer (kNoFold: ~5.4 KB a stage at WN = 8): 7 stages, five CTAs per SM at WN = 8.
template <int WN, int kStageK, bool kFp8W, int kRows = kFp4DecodeRows, bool kPermK = false, bool kNoFold = false>
constexpr int kFp4DecodeStages =
    kNoFold ? 7
    : kPermK ? (WN == 128 ? 5 : 8)
    : kRows == 128 ? std::min(10, 216 * 1024 / (WN * 128 + kRows * 128 + 16 * WN + 24))
                   : (kFp8W ? (WN <= 16 ? 6 : 4) : (kStageK == 128 ? 6 : (WN <= 32 ? 4 : 3)));

// kSplitFinish: the instantiation that finishes its split-K itself (split_finish_in_kernel; one preparer only).
// kPermK: the kernel on permuted activations (GemmParams::a_perm_k; dense or grouped).
template <int WN, int kStageK, bool kFp8W, int kRows, bool kGrouped, int kPreparers = 1, bool kSplitFinish = false,
          bool kPermK = false, bool kPipe = false>
auto fp4_decode_kernel() {
  return sm90_fp4_decode_kernel<WN, kFp4DecodeStages<WN, kStageK, kFp8W, kRows, kPermK, kPreparers == 0>, kStageK,
                                kFp8W, kRows, kGrouped, kPreparers, kSplitFinish, kPermK, kPipe>;
}

template <int WN, int kStageK, bool kFp8W, int kRows, bool kPermK = false, bool kNoFold = false>
constexpr int fp4_decode_smem() {
  return Fp4DecodeSmem<WN, kFp4DecodeStages<WN, kStageK, kFp8W, kRows, kPermK, kNoFold>, kStageK, kFp8W, kRows, kPermK,
                       kNoFold>::kBytes;
}

// Sets the kernel's shared-memory attribute once per device; returns the CTAs per SM it reaches.
template <int WN, int kStageK, bool kFp8W, int kRows, int kPreparers = 1, bool kPermK = false, bool kPipe = false>
int prepare_kernel(int device) {
  static std::atomic<int> ctas_per_sm[kMaxDevices] = {};
  const int slot = device < kMaxDevices ? device : 0;
  int ctas = ctas_per_sm[slot].load(std::memory_order_relaxed);
  if (ctas == 0 || device >= kMaxDevices) {
    auto kernel = fp4_decode_kernel<WN, kStageK, kFp8W, kRows, false, kPreparers, false, kPermK, kPipe>();
    constexpr int kSmem = fp4_decode_smem<WN, kStageK, kFp8W, kRows, kPermK, kPreparers == 0>();
    FG_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
    // The grouped kernel (MoE experts): 128 of K per stage, 64 rows and one preparer (none with kPermK;
    // choose_fp4_decode_config).
    if constexpr (kStageK == 128 && kRows == kFp4DecodeRows && kPreparers == 1) {
      FG_CUDA_CHECK(cudaFuncSetAttribute(fp4_decode_kernel<WN, kStageK, kFp8W, kRows, true, 1, false, kPermK>(),
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
      FG_CUDA_CHECK(cudaFuncSetAttribute(fp4_decode_kernel<WN, kStageK, kFp8W, kRows, true, 1, true, kPermK>(),
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
    }
    if constexpr (kPreparers == 1)
      FG_CUDA_CHECK(cudaFuncSetAttribute(fp4_decode_kernel<WN, kStageK, kFp8W, kRows, false, 1, true, kPermK>(),
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
    FG_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &ctas, kernel, kFp4DecodeThreads<kFp8W, kRows, kPreparers, kPermK>, kSmem));
    if (ctas <= 0) throw Error(ErrorKind::Runtime, "fp4 decode gemm: no CTA of the kernel fits on an SM");
    ctas_per_sm[slot].store(ctas);
  }
  return ctas;
}

template <int kStageK, bool kFp8W, int kRows, int kPreparers = 1, bool kPermK = false, bool kPipe = false>
int prepare(int wn, int device) {
  if constexpr (kPermK) {
    if (wn == 128) return prepare_kernel<128, kStageK, kFp8W, kRows, kPreparers, kPermK>(device);
  }
  switch (wn) {
    case 8: return prepare_kernel<8, kStageK, kFp8W, kRows, kPreparers, kPermK, kPipe>(device);
    case 16: return prepare_kernel<16, kStageK, kFp8W, kRows, kPreparers, kPermK, kPipe>(device);
    case 32: return prepare_kernel<32, kStageK, kFp8W, kRows, kPreparers, kPermK, kPipe>(device);
    default: return prepare_kernel<64, kStageK, kFp8W, kRows, kPreparers, kPermK, kPipe>(device);
  }
}

int prepare(const Fp4DecodeConfig& c, int device) {
  if (c.perm_k) return prepare<128, false, 64, 1, true>(c.wn, device);
  if (c.fp8_weights) return c.rows == 128 ? prepare<128, true, 128>(c.wn, device) : prepare<128, true, 64>(c.wn, device);
  if (c.stage_k == 256) return prepare<256, false, 64>(c.wn, device);
  if (c.pipe) return prepare<128, false, 64, 1, false, true>(c.wn, device);
  if (c.preparers == 0) return prepare<128, false, 64, 0>(c.wn, device);
  return c.preparers == 2 ? prepare<128, false, 64, 2>(c.wn, device) : prepare<128, false, 64>(c.wn, device);
}

template <int WN, int kStageK, bool kFp8W, int kRows, int kPreparers = 1, bool kPermK = false, bool kPipe = false>
void launch(const CUtensorMap& x, const CUtensorMap& w, const GemmParams& p, const Fp4DecodeConfig& c,
            const DecodeGroups& groups, int* split_counters, cudaStream_t stream) {
  const int64_t ctas = int64_t{c.tiles} * c.split_k * std::max(1, groups.slots);
  if (ctas > INT32_MAX) throw Error("fp4 decode gemm: " + std::to_string(ctas) + " CTAs, more than one grid takes");
  const unsigned grid = static_cast<unsigned>(ctas);
  constexpr int kThreads = kFp4DecodeThreads<kFp8W, kRows, kPreparers, kPermK>;
  constexpr int kSmem = fp4_decode_smem<WN, kStageK, kFp8W, kRows, kPermK, kPreparers == 0>();
  if (split_counters != nullptr && kPreparers != 1)
    throw Error("fp4 decode gemm: the split-K finish in the kernel takes one preparer warp, got " +
                std::to_string(kPreparers));
  if (groups.slots == 0) {
    // With the in-kernel split-K reduction, a tile's split_k CTAs (consecutive along x) form one cluster.
    const auto kernel = split_counters != nullptr
                            ? fp4_decode_kernel<WN, kStageK, kFp8W, kRows, false, 1, true, kPermK>()
                            : fp4_decode_kernel<WN, kStageK, kFp8W, kRows, false, kPreparers, false, kPermK, kPipe>();
    launch_ex(p.pdl, p.decode_cluster_reduce ? c.split_k : 1, kernel, grid, kThreads, kSmem, stream, x, w, p, c.split_k,
              c.kb_per_split, c.swizzle, groups, c.tiles, split_counters);
  } else if constexpr (kStageK == 128 && kRows == kFp4DecodeRows && kPreparers == 1) {
    const auto kernel = split_counters != nullptr
                            ? fp4_decode_kernel<WN, kStageK, kFp8W, kRows, true, 1, true, kPermK>()
                            : fp4_decode_kernel<WN, kStageK, kFp8W, kRows, true, 1, false, kPermK>();
    launch_programmatic(p.pdl, kernel, grid, kThreads, kSmem, stream, x, w, p, c.split_k, c.kb_per_split, c.swizzle,
                        groups, c.tiles, split_counters);
  } else {
    throw Error("fp4 decode gemm: grouped (MoE) launches take 128 of K per stage and 64-row CTAs, got stage_k=" +
                std::to_string(kStageK) + " rows=" + std::to_string(kRows));
  }
}

template <int kStageK, bool kFp8W, int kRows = kFp4DecodeRows, int kPreparers = 1, bool kPermK = false,
          bool kPipe = false>
void launch_for_width(const CUtensorMap& x, const CUtensorMap& w, const GemmParams& p, const Fp4DecodeConfig& c,
                      const DecodeGroups& groups, int* split_counters, cudaStream_t stream) {
  if constexpr (kPermK) {
    if (c.wn == 128) return launch<128, kStageK, kFp8W, kRows, kPreparers, kPermK>(x, w, p, c, groups, split_counters, stream);
  }
  switch (c.wn) {
    case 8: return launch<8, kStageK, kFp8W, kRows, kPreparers, kPermK, kPipe>(x, w, p, c, groups, split_counters, stream);
    case 16: return launch<16, kStageK, kFp8W, kRows, kPreparers, kPermK, kPipe>(x, w, p, c, groups, split_counters, stream);
    case 32: return launch<32, kStageK, kFp8W, kRows, kPreparers, kPermK, kPipe>(x, w, p, c, groups, split_counters, stream);
    default: return launch<64, kStageK, kFp8W, kRows, kPreparers, kPermK, kPipe>(x, w, p, c, groups, split_counters, stream);
  }
}

// The tile counters of the in-kernel split-K finish (split_finish_in_kernel): one int per (slot, tile) of a call, zero
// between calls. They live in this module's device memory (zero at load, 4 MB per device), so that no allocation or
// memset is ever enqueued, which keeps a captured decode call one kernel node. Regions of them go to one (device,
// stream) for its eager calls, whose kernels run in stream order (kept for the process), or to one (device, stream,
// capture sequence) under capture, whose nodes run in that stream's order in the graph. The graph owns its regions
// (a user object): when the graph and its executable are gone, they return to a free list. A graph holding them also
// holds a memory node (the partials' scratch), so it has one executable at a time, and an executable's launches do not
// overlap. A call that finds no room, or runs on cudaStreamPerThread outside capture (one handle for every host
// thread's stream), gets none: the reduce kernel finishes it.
// NOTE: a stream destroyed with work pending and a new one given the same handle at once would share the eager region
// while the old work runs (as the split-K workspace cached per stream would).
constexpr int64_t kSplitCounters = int64_t{1} << 20;
__device__ int g_split_counters[kSplitCounters];

struct CounterRegion {
  int64_t offset = 0, size = 0;
};
using CounterKey = std::tuple<int, cudaStream_t, bool, unsigned long long>;  // device, stream, capturing, capture id
struct Counters {
  std::mutex mutex;
  std::map<CounterKey, CounterRegion> regions;
  std::vector<CounterRegion> free[kMaxDevices];
  int64_t used[kMaxDevices] = {};
  int* base[kMaxDevices] = {};
};
Counters& counters() {
  static Counters* c = new Counters;  // never destroyed: a graph may release its regions during exit
  return *c;
}

// A captured region's owner (the graph's user object): back to the free list when the graph lets it go. Runs on a
// CUDA thread: no CUDA calls.
struct RegionOwner {
  int device;
  CounterKey key;
  CounterRegion region;
};
void release_region(void* owner_ptr) {
  const auto* owner = static_cast<RegionOwner*>(owner_ptr);
  Counters& c = counters();
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    c.free[owner->device].push_back(owner->region);
    const auto it = c.regions.find(owner->key);
    if (it != c.regions.end() && it->second.offset == owner->region.offset) c.regions.erase(it);
  }
  delete owner;
}

}  // namespace

int* claim_split_counters(int device, cudaStream_t stream, int64_t count) {
  if (device < 0 || device >= kMaxDevices || count <= 0) return nullptr;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long capture = 0;
  cudaGraph_t graph = nullptr;
  FG_CUDA_CHECK(cudaStreamGetCaptureInfo(stream, &status, &capture, &graph));
  if (status == cudaStreamCaptureStatusInvalidated) return nullptr;
  const bool capturing = status == cudaStreamCaptureStatusActive;
  if (!capturing && stream == cudaStreamPerThread) return nullptr;
  Counters& c = counters();
  std::lock_guard<std::mutex> lock(c.mutex);
  if (c.base[device] == nullptr) {
    // May load the module: allowed while a stream captures once this thread's capture mode is relaxed.
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    FG_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    void* base = nullptr;
    const cudaError_t got = cudaGetSymbolAddress(&base, g_split_counters);
    FG_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    FG_CUDA_CHECK(got);
    c.base[device] = static_cast<int*>(base);
  }
  const CounterKey key{device, stream, capturing, capturing ? capture : 0ull};
  CounterRegion& region = c.regions[key];
  if (region.size < count) {
    // A larger region for this stream (or capture). The smaller one keeps its owner: an eager stream's stays unused
    // (zero), a capture's returns to the free list with its graph.
    std::vector<CounterRegion>& free = c.free[device];
    auto best = free.end();
    for (auto it = free.begin(); it != free.end(); ++it)
      if (it->size >= count && (best == free.end() || it->size < best->size)) best = it;
    CounterRegion got;
    if (best != free.end()) {
      got = *best;
      free.erase(best);
    } else {
      if (c.used[device] + count > kSplitCounters) return nullptr;
      got = {c.used[device], count};
      c.used[device] += count;
    }
    if (capturing) {
      auto* owner = new RegionOwner{device, key, got};
      cudaUserObject_t object = nullptr;
      cudaError_t e = cudaUserObjectCreate(&object, owner, release_region, 1, cudaUserObjectNoDestructorSync);
      if (e == cudaSuccess) e = cudaGraphRetainUserObject(graph, object, 1, cudaGraphUserObjectMove);
      if (e != cudaSuccess) {
        // The reduce kernel instead. An object the graph did not take keeps its region (releasing it here could run
        // release_region under this lock).
        if (object == nullptr) {
          delete owner;
          free.push_back(got);
        }
        (void)cudaGetLastError();
        return nullptr;
      }
    }
    region = got;
  }
  return c.base[device] + region.offset;
}

void count_split_finish() { ++split_finishes; }
long long decode_split_finishes() { return split_finishes.load(); }
long long fp4_decode_perm_launches() { return perm_launches.load(); }
long long fp4_decode_pipe_launches() { return pipe_launches.load(); }
long long fp4_decode_fold_cache_launches() { return fold_cache_launches.load(); }
void fp4_decode_fold_cache_clear() {
  std::lock_guard<std::mutex> lock(fold_mutex);
  if (fold_cache().empty()) return;
  int current = 0;
  FG_CUDA_CHECK(cudaGetDevice(&current));
  for (auto& [key, f] : fold_cache()) {  // cudaFree waits for the device's work that may still read the words
    FG_CUDA_CHECK(cudaSetDevice(std::get<0>(key)));
    FG_CUDA_CHECK(cudaFree(f.words));
  }
  FG_CUDA_CHECK(cudaSetDevice(current));
  fold_cache().clear();
}
long long fp4_decode_perm_wide_launches() { return perm_wide_launches.load(); }

int fp4_decode_fold_cache_mode() {
  const char* v = std::getenv("FINEGEMM_FP4_DECODE_FOLD_CACHE");
  if (v == nullptr || *v == '\0' || std::string(v) == "0") return 0;
  if (std::string(v) == "1") return 1;
  if (std::string(v) == "2") return 2;
  throw Error(std::string("FINEGEMM_FP4_DECODE_FOLD_CACHE: expected 0 (off), 1 (prepared words, the preparer warp "
                          "idle) or 2 (prepared words, no preparer warp), got '") + v + "'");
}

int fp4_decode_width(int m) { return m <= 8 ? 8 : (m <= 16 ? 16 : (m <= 32 ? 32 : 64)); }

Fp4DecodeConfig choose_fp4_decode_config(int m, int n, int k, int num_sms, int device, bool fp8_weights, int slots,
                                         bool perm_k) {
  if (perm_k && fp8_weights) throw Error("fp4 decode gemm: permuted activations take FP4 weights, got E4M3 weights");
  Fp4DecodeConfig c;
  c.fp8_weights = fp8_weights;
  c.perm_k = perm_k;
  // Permuted activations also take chunks of 128 tokens (grouped launches sized for more than 64 rows per expert:
  // decode_rows_per_expert, twice the mean).
  c.wn = perm_k && m > 64 ? 128 : fp4_decode_width(m);
  c.rows = kFp4DecodeRows;
  // The grouped kernel (slots > 0) exists for 64 rows and 128 of K per stage only: the switches below are dense-only.
  if (const char* forced = std::getenv("FINEGEMM_DECODE_ROWS"); forced && *forced && fp8_weights && slots == 0) {
    c.rows = std::atoi(forced);
    if (c.rows != 64 && c.rows != 128)
      throw Error(std::string("FINEGEMM_DECODE_ROWS: expected 64 or 128, got '") + forced + "'");
  }
  c.tiles = ceil_div(n, c.rows);
  c.slots = slots;
  c.stage_k = 128;
  if (const char* forced = std::getenv("FINEGEMM_FP4_DECODE_STAGE_K"); forced && *forced && !fp8_weights && slots == 0 && !perm_k) {
    c.stage_k = std::atoi(forced);
    if (c.stage_k != 128 && c.stage_k != 256)
      throw Error(std::string("FINEGEMM_FP4_DECODE_STAGE_K: expected 128 or 256, got '") + forced + "'");
  }
  // Two preparer warps taking alternate stages (FINEGEMM_FP4_DECODE_PREPARERS=2): dense FP4 launches with 128 of K per
  // stage only.
  if (const char* forced = std::getenv("FINEGEMM_FP4_DECODE_PREPARERS"); forced && *forced) {
    const int v = std::atoi(forced);
    if (v != 1 && v != 2)
      throw Error(std::string("FINEGEMM_FP4_DECODE_PREPARERS: expected 1 or 2, got '") + forced + "'");
    if (!fp8_weights && slots == 0 && c.stage_k == 128 && !perm_k) c.preparers = v;
  }
  // Prepared fold words without a preparer warp (FINEGEMM_FP4_DECODE_FOLD_CACHE=2): dense FP4, 128 of K per stage;
  // launch_sm90_fp4_decode falls back to one preparer where the call's recipe does not qualify.
  if (!fp8_weights && slots == 0 && c.stage_k == 128 && !perm_k && c.preparers == 1 && fp4_decode_fold_cache_mode() == 2)
    c.preparers = 0;
  // The consumers software-pipelined over two stages (FINEGEMM_FP4_DECODE_PIPE=1, stop 45, off until measured): dense
  // FP4 launches with 128 of K per stage and one preparer, up to 32 tokens (at WN = 64 the two register sets spill
  // 552 bytes).
  c.pipe = !fp8_weights && slots == 0 && c.stage_k == 128 && !perm_k && c.preparers == 1 && c.wn <= 32 &&
           env_switch("FINEGEMM_FP4_DECODE_PIPE", false);
  const int num_kb = std::max(1, ceil_div(k, c.stage_k));
  // Split K until every SM holds as many CTAs as fit at once (the weights stream from all of them together), keeping
  // at least 512 of K per split: each split costs M × N floats of partials.
  const int resident = prepare(c, device) * num_sms;
  int split = std::max(1, resident / (c.tiles * std::max(1, slots)));
  // Dense E4M3 weights: two CTAs per SM beat the three that fit unless a split would then take more than 4096 of K
  // (stop 22, graph replay, µs for split 3-per-SM → 2-per-SM: N = 4096 K = 7168 M = 1 13.8 → 12.8, M = 64 18.8 →
  // 17.1; N = 2112 K = 7168 M = 64 14.2 → 12.2; N = 7168 K = 2048 M = 64 13.9 → 13.0; N = 7168 K = 16384 M = 64 kept
  // at three per SM: 42.9 against 47.8 with two).
  if (fp8_weights && slots == 0) {
    const int two_per_sm = std::max(1, 2 * num_sms / c.tiles);
    if (two_per_sm < split && ceil_div(num_kb, two_per_sm) <= 4096 / c.stage_k) split = two_per_sm;
  }
  split = std::min(split, std::max(1, num_kb / (512 / c.stage_k)));
  if (const char* forced = std::getenv("FINEGEMM_FP4_DECODE_SPLIT"); forced && *forced) {
    const int v = std::atoi(forced);
    if (v < 1) throw Error(std::string("FINEGEMM_FP4_DECODE_SPLIT: expected a split count >= 1, got '") + forced + "'");
    split = v;
  }
  split = std::min(split, num_kb);
  c.kb_per_split = ceil_div(num_kb, split);
  c.split_k = ceil_div(num_kb, c.kb_per_split);
  c.swizzle = env_switch("FINEGEMM_FP4_DECODE_SWIZZLE", true);
  if (const char* print = std::getenv("FINEGEMM_PRINT_CONFIG"); print && *print == '1')
    std::fprintf(stderr, "finegemm: %s decode M=%d N=%d K=%d slots=%d -> WN=%d tiles=%d split_k=%d stage_k=%d kb_per_split=%d swizzle=%d rows=%d preparers=%d perm_k=%d pipe=%d\n",
                 fp8_weights ? "fp8" : "fp4", m, n, k, slots, c.wn, c.tiles, c.split_k, c.stage_k, c.kb_per_split,
                 c.swizzle ? 1 : 0, c.rows, c.preparers, c.perm_k ? 1 : 0, c.pipe ? 1 : 0);
  return c;
}

bool launch_sm90_fp4_decode(const void* a, int64_t lda, const void* b, int64_t ldb, const GemmParams& params,
                            const Fp4DecodeConfig& config, cudaStream_t stream, const DecodeGroups& groups) {
  int device = 0;
  FG_CUDA_CHECK(cudaGetDevice(&device));
  Fp4DecodeConfig c = config;
  GemmParams p = params;
  p.fp4_decode_direct = env_switch("FINEGEMM_FP4_DECODE_DIRECT", false);
  // Prepared fold words (fp4_decode_fold_cache_mode): dense FP4 weights with UE8M0 scales (bytes or packed), 128 of K
  // per stage, one preparer (mode 1) or none (mode 2, the config's preparers = 0), one activation scale per 128 of K
  // (the fold's condition), not pipelined; and the permuted kernel, dense or grouped (its recipe qualifies by
  // construction: fp4_decode_perm_ok). A call that does not qualify, or whose words cannot be made now (stream
  // capture before the first eager call), runs as it would without them.
  const bool plain_ok = !c.fp8_weights && !c.perm_k && !c.pipe && c.stage_k == 128 && c.preparers <= 1 &&
                        groups.slots == 0 && !p.fp4_decode_direct && p.b_scale_fmt != ScaleFmt::F32 &&
                        (p.a_scale == nullptr || p.a_group % kGemmBlockK == 0);
  const bool perm_ok = c.perm_k && p.a_perm_k && p.b_scale_fmt != ScaleFmt::F32;
  if ((plain_ok || perm_ok) && fp4_decode_fold_cache_mode() != 0) {
    const FoldWords f = prepared_fold_words(p, groups.slots > 0 ? std::max(1, groups.num_groups) : 1, device, stream);
    if (f.words != nullptr) {
      p.fp4_fold_words = f.words;
      p.fp4_fold_flags = f.flags;
      p.fp4_fold_blocks = ceil_div(p.k, kGemmBlockK);
      ++fold_cache_launches;
    }
  }
  if (c.preparers == 0 && p.fp4_fold_words == nullptr) c.preparers = 1;
  prepare(c, device);
  // The split-K finished by the tile's last CTA (FINEGEMM_DECODE_SPLIT_FINISH=1, off until measured) instead of the
  // reduce kernel: where there are partials, no cluster reduce, no gate (the reduce kernel's early exit), and counters.
  int* counters = nullptr;
  if (c.split_k > 1 && p.workspace != nullptr && !p.decode_cluster_reduce && p.gate == nullptr && c.preparers == 1 &&
      env_switch("FINEGEMM_DECODE_SPLIT_FINISH", false))
    counters = claim_split_counters(device, stream, int64_t{c.tiles} * std::max(1, groups.slots));
  int* const split_counters = counters;
  p.decode_thread_release = env_switch("FINEGEMM_DECODE_THREAD_RELEASE", true);
  if (const char* v = std::getenv("FINEGEMM_DECODE_LOAD_BATCH"); v && *v) {
    const int batch = std::atoi(v);
    if (batch < 1 || batch > 4)
      throw Error(std::string("FINEGEMM_DECODE_LOAD_BATCH: expected 1 to 4 stages, got '") + v + "'");
    p.decode_load_batch = batch;
  }
  const CUtensorMap tma_x = make_tma_2d(a, p.m, p.k, lda, c.wn);
  const int64_t w_rows = int64_t{p.n} * (groups.slots > 0 ? groups.num_groups : 1);
  // Weight rows of stage_k / 2 bytes: 64 (64-byte swizzle) or 128 (128-byte swizzle).
  if (c.fp8_weights) {
    const CUtensorMap tma_w = make_tma_2d(b, w_rows, p.k, ldb, c.rows);
    if (c.rows == 128) launch_for_width<128, true, 128>(tma_x, tma_w, p, c, groups, split_counters, stream);
    else launch_for_width<128, true>(tma_x, tma_w, p, c, groups, split_counters, stream);
    FG_CUDA_CHECK(cudaGetLastError());
    if (split_counters) ++split_finishes;
    return split_counters != nullptr;
  }
  const CUtensorMap tma_w = c.stage_k == 128
                                ? make_tma_2d(b, w_rows, p.k / 2, ldb, kFp4DecodeRows, 64, c.swizzle)
                                : make_tma_2d(b, w_rows, p.k / 2, ldb, kFp4DecodeRows, 128, false, !c.swizzle);
  if (c.perm_k) {
    if (!p.a_perm_k || !fp4_decode_perm_ok(p, groups.slots > 0))
      throw Error("fp4 decode gemm: the permuted kernel takes activations in its order (a_perm_k) for FP4 weights "
                  "with UE8M0 scales, K % 128 == 0 and one activation scale per 128 of K, dense (M <= 64, no row "
                  "weight) or grouped; got M=" + std::to_string(p.m) + " K=" + std::to_string(p.k) +
                  " a_perm_k=" + std::to_string(p.a_perm_k) + " a_group=" + std::to_string(p.a_group) +
                  " slots=" + std::to_string(groups.slots));
    launch_for_width<128, false, kFp4DecodeRows, 1, true>(tma_x, tma_w, p, c, groups, split_counters, stream);
    ++perm_launches;
    if (c.wn == 128) ++perm_wide_launches;
  } else if (c.stage_k == 256) launch_for_width<256, false>(tma_x, tma_w, p, c, groups, split_counters, stream);
  else if (c.pipe) {
    launch_for_width<128, false, kFp4DecodeRows, 1, false, true>(tma_x, tma_w, p, c, groups, split_counters, stream);
    ++pipe_launches;
  }
  else if (c.preparers == 0) launch_for_width<128, false, kFp4DecodeRows, 0>(tma_x, tma_w, p, c, groups, split_counters, stream);
  else if (c.preparers == 2) launch_for_width<128, false, kFp4DecodeRows, 2>(tma_x, tma_w, p, c, groups, split_counters, stream);
  else launch_for_width<128, false>(tma_x, tma_w, p, c, groups, split_counters, stream);
  FG_CUDA_CHECK(cudaGetLastError());
  if (split_counters) ++split_finishes;
  return split_counters != nullptr;
}

DecodeKind decode_kernel_kind(const GemmParams& p) {
  if (p.b_scale == nullptr || p.k > INT32_MAX - 1024) return DecodeKind::None;  // stage offsets are int
  if (p.b_fp4) {
    // The loader copies the weight scales four UE8M0 bytes at a time: 4-byte aligned rows of a multiple of 4 groups.
    // Packed UE8M0 words are aligned by construction; the consumers ignore a word's bytes past K.
    const bool scales_ok =
        p.b_scale_fmt == ScaleFmt::F32 || p.b_scale_fmt == ScaleFmt::UE8M0_PACKED ||
        (reinterpret_cast<uintptr_t>(p.b_scale) % 4 == 0 && p.b_scale_stride_n % 4 == 0 && p.b_scale_cols % 4 == 0 &&
         p.b_scale_group_stride % 4 == 0);
    // 32-wide steps: MX 1x32 weight scales; activation groups of 32, 64 or multiples of 128 (a_group stays 128
    // without group scales).
    const bool groups_ok = p.a_group % 128 == 0 || p.a_group == 32 || p.a_group == 64;
    return p.b_block_n == 1 && p.b_block_k == 32 && scales_ok && groups_ok ? DecodeKind::Fp4 : DecodeKind::None;
  }
  return p.b_block_n % 64 == 0 && p.b_block_k % 128 == 0 && p.a_group % 128 == 0
             ? DecodeKind::Fp8
             : DecodeKind::None;
}

void launch_sm90_decode_grouped(const void* a, int64_t lda, const void* b, int64_t ldb, const DecodeGroups& groups,
                                int wn_rows, GemmParams p, cudaStream_t stream) {
  if (p.m == 0 || groups.slots == 0) return;
  const DecodeKind kind = decode_kernel_kind(p);
  if (kind == DecodeKind::None) throw Error("decode grouped gemm: the recipe is not one the decode kernel serves");
  int device = 0;
  FG_CUDA_CHECK(cudaGetDevice(&device));
  // The kernel whose threads copy their own weights (FINEGEMM_FP4_DECODE_LDG=1), up to 64 rows per chunk.
  if (p.a_perm_k && wn_rows <= 64 && fp4_decode_ldg_wanted() && fp4_decode_ldg_ok(p, a, lda, b, ldb, true)) {
    const Fp4LdgConfig c = choose_fp4_decode_ldg_config(std::max(1, wn_rows), p.n, p.k, num_sms_of_device(device),
                                                        device, groups.slots);
    std::optional<StreamScratch> workspace;
    if (c.split_k > 1) {
      workspace.emplace(sizeof(float) * static_cast<size_t>(c.split_k) * p.m * p.n, stream);
      p.workspace = workspace->as<float>();
    }
    launch_sm90_fp4_decode_ldg(a, lda, b, ldb, p, c, stream, groups);
    if (p.workspace) {
      GemmParams sum = p;  // the partials hold the whole epilogue (per expert): the reduce only sums them
      sum.row_mode = VecMode::None;
      sum.col_mode = VecMode::None;
      sum.bias_dtype = -1;
      launch_splitk_reduce(sum, c.split_k, stream);
    }
    return;
  }
  const Fp4DecodeConfig c = choose_fp4_decode_config(std::clamp(wn_rows, 1, p.a_perm_k ? 128 : 64), p.n, p.k,
                                                     num_sms_of_device(device), device, kind == DecodeKind::Fp8,
                                                     groups.slots, p.a_perm_k);
  std::optional<StreamScratch> workspace;
  if (c.split_k > 1) {
    workspace.emplace(sizeof(float) * static_cast<size_t>(c.split_k) * p.m * p.n, stream);
    p.workspace = workspace->as<float>();
  }
  const bool finished = launch_sm90_fp4_decode(a, lda, b, ldb, p, c, stream, groups);
  if (p.workspace && !finished) {
    // The partials hold the whole epilogue (per expert): the reduce only sums them, in split order.
    GemmParams sum = p;
    sum.row_mode = VecMode::None;
    sum.col_mode = VecMode::None;
    sum.bias_dtype = -1;
    launch_splitk_reduce(sum, c.split_k, stream);
  }
}

}  // namespace finegemm::cuda
