// Host side of src/cuda/kernels/fp4_expand_weights.cuh.
#include <atomic>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>

#include "cuda/kernels/fp4_expand_weights.cuh"
#include "cuda/kernels/sm90_fp8_gemm.cuh"
#include "cuda/runtime/check.hpp"
#include "cuda/runtime/fp4_expand.hpp"
#include "cuda/runtime/gemm_launch.cuh"

namespace finegemm::cuda {
namespace {

bool expandable(const GemmParams& p) {
  return p.b_fp4 && p.b_block_n == 1 && p.b_block_k == 32 && p.gate == nullptr && p.b_scale != nullptr;
}

std::atomic<long long> expand_wide_launch_count{0};
std::atomic<long long> scan_wide_launch_count{0};
std::atomic<long long> scan_rows_launch_count{0};
std::atomic<long long> scan_staged_launch_count{0};
std::atomic<long long> expand_fused_launch_count{0};
std::atomic<long long> gate_chain_count{0};

long env_long(const char* name, long fallback) {
  const char* env = std::getenv(name);
  return env && *env ? std::strtol(env, nullptr, 10) : fallback;
}

size_t round_up(size_t bytes) { return (bytes + 255) / 256 * 256; }

}  // namespace

int fp4_expand_wide_mode() {
  const char* env = std::getenv("FINEGEMM_FP4_EXPAND_WIDE");
  const std::string v = env ? env : "";
  if (v.empty()) return -1;
  if (v == "0") return 0;
  if (v == "1") return 1;
  if (v == "2") return 2;
  if (v == "3") return 3;
  throw Error("FINEGEMM_FP4_EXPAND_WIDE: expected 0, 1 (the FP4 expansion with 128 groups per warp), 2 (that and the "
              "fold scan with 8 K blocks per CTA) or 3 (the fold scan and the expansion in one kernel), got '" + v + "'");
}

long long fp4_expand_wide_launches() { return expand_wide_launch_count.load(std::memory_order_relaxed); }
long long fp4_scan_wide_launches() { return scan_wide_launch_count.load(std::memory_order_relaxed); }
long long fp4_scan_rows_launches() { return scan_rows_launch_count.load(std::memory_order_relaxed); }
long long fp4_scan_staged_launches() { return scan_staged_launch_count.load(std::memory_order_relaxed); }

int fp4_scan_staged_mode() {
  const char* env = std::getenv("FINEGEMM_FP4_SCAN_STAGED");
  const std::string v = env ? env : "";
  if (v.empty()) return -1;
  if (v == "0") return 0;
  if (v == "1") return 1;
  throw Error("FINEGEMM_FP4_SCAN_STAGED: expected 0 (the fold scan along the scale rows) or 1 (each tile's scales "
              "staged in shared memory by one bulk copy), got '" + v + "'");
}

bool fp4_scan_staged_for(int mode, int blocks) { return mode == 1 || (mode == -1 && blocks >= 32); }
long long fp4_expand_fused_launches() { return expand_fused_launch_count.load(std::memory_order_relaxed); }
long long fp4_gate_chains() { return gate_chain_count.load(std::memory_order_relaxed); }
void Fp4Expansion::count_gate_chain() { gate_chain_count.fetch_add(1, std::memory_order_relaxed); }

bool fp4_gate_pdl_wanted() {
  const char* env = std::getenv("FINEGEMM_FP4_GATE_PDL");
  const std::string v = env ? env : "";
  if (v.empty() || v == "0") return false;
  if (v == "1") return true;
  throw Error("FINEGEMM_FP4_GATE_PDL: expected 0 (the gated FP4 prefill launches one after another) or 1 (chained by "
              "programmatic dependent launch), got '" + v + "'");
}

bool fp4_expand_wanted(const GemmParams& p) {
  const long min_m = env_long("FINEGEMM_FP4_EXPAND_M", 256);
  return expandable(p) && p.b_layout == BLayout::Plain && min_m > 0 && p.m >= min_m;
}

bool fp4_expand_grouped_wanted(const GemmParams& p, int64_t expected_rows_per_group) {
  const long min_rows = env_long("FINEGEMM_FP4_EXPAND_GROUPED_ROWS", 64);
  return expandable(p) && min_rows > 0 && expected_rows_per_group >= min_rows;
}

Fp4Expansion::Fp4Expansion(const void* b, int64_t ldb, const GemmParams& p, int groups, const int32_t* offsets,
                           const int32_t* counts, cudaStream_t stream, Mode mode)
    : stream_(stream), fold_(p.b_scale_fmt == ScaleFmt::UE8M0) {
  const bool scan_only = mode != Mode::Expand;
  kept_ = mode == Mode::ScanKept;
  if (scan_only && !fold_)
    throw Error(ErrorKind::Runtime, "Fp4Expansion: the scan alone needs byte UE8M0 weight scales");
  // Read before the scratch is allocated: a bad value throws here, where nothing is held yet. ScanOnly calls take the
  // wide scan with mode 2 (no expansion to widen).
  const int wide_mode = fp4_expand_wide_mode();
  blocks_ = (p.k + kGemmBlockK - 1) / kGemmBlockK;
  tiles_ = (p.n + 127) / 128;
  const int64_t rows = static_cast<int64_t>(groups) * p.n;
  const size_t weight_bytes = scan_only ? 0 : round_up(static_cast<size_t>(rows) * p.k);
  const size_t row_scale_bytes = fold_ && !scan_only ? round_up(sizeof(float) * static_cast<size_t>(rows) * blocks_) : 0;
  const size_t tile_bytes = fold_ ? round_up(sizeof(float) * static_cast<size_t>(groups) * tiles_ * blocks_) : 0;
  const size_t total_bytes = weight_bytes + row_scale_bytes + 2 * tile_bytes + 16;
  uint8_t* base = nullptr;
  if (kept_) {
    if (cudaMalloc(reinterpret_cast<void**>(&base), total_bytes) != cudaSuccess) {
      (void)cudaGetLastError();
      return;
    }
  } else {
    base = static_cast<uint8_t*>(scratch_try_alloc(total_bytes, stream));
  }
  if (base == nullptr) return;
  base_ = base;
  weights_ = scan_only ? nullptr : base;
  row_scale_ = reinterpret_cast<float*>(base + weight_bytes);
  tile_scale_ = reinterpret_cast<float*>(base + weight_bytes + row_scale_bytes);
  auto* tile_emax = reinterpret_cast<int*>(base + weight_bytes + row_scale_bytes + tile_bytes);
  tile_emax_ = tile_emax;
  flags_ = reinterpret_cast<int*>(base + weight_bytes + row_scale_bytes + 2 * tile_bytes);

  const Fp4ScaleView view{static_cast<const uint8_t*>(p.b_scale), p.b_scale_stride_n, p.b_scale_group_stride, p.n,
                          offsets, counts};
  // A warp per row and 32 groups of K, or per row and kFp4ExpandGroupsPerWarp groups (FINEGEMM_FP4_EXPAND_WIDE=1 or
  // 2; with 2 the fold scan below runs wide too).
  const bool wide = !scan_only && (wide_mode == 1 || wide_mode == 2);  // only where set (-1, 0: the default kernel)
  const int groups_per_warp = wide ? kFp4ExpandGroupsPerWarp : 32;
  const int64_t warps = rows * ((p.k / 32 + groups_per_warp - 1) / groups_per_warp);
  const auto grid = static_cast<unsigned>((warps * 32 + kFp4ExpandThreads - 1) / kFp4ExpandThreads);
  const auto* packed = static_cast<const uint8_t*>(b);
  auto expand = [&](auto fold, const int* tile_emax_arg, float* row_scale_arg, const int* flags_arg) {
    constexpr bool kFold = decltype(fold)::value;
    if (wide) {
      fp4_expand_weights_wide_kernel<kFold><<<grid, kFp4ExpandThreads, 0, stream>>>(
          packed, ldb, view, rows, p.k, weights_, tile_emax_arg, row_scale_arg, flags_arg);
      expand_wide_launch_count.fetch_add(1, std::memory_order_relaxed);
    } else {
      fp4_expand_weights_kernel<kFold><<<grid, kFp4ExpandThreads, 0, stream>>>(packed, ldb, view, rows, p.k, weights_,
                                                                               tile_emax_arg, row_scale_arg, flags_arg);
    }
  };
  if (fold_) {
    FG_CUDA_CHECK(cudaMemsetAsync(flags_, 0, sizeof(int), stream));
    // The scan and the expansion in one kernel (fp4_scan_expand_kernel): with mode 3, and by default (-1) on dense
    // calls (stop 51, H100, M = 4096 N = 4096 K = 7168: 17.5-17.9 µs under ncu against 5.7-6.4 + 19.4-20.1 for the
    // scan and the expansion; the dense FP4 prefill 194.7 against 201.4 µs by graph replay, median of four rounds).
    // Grouped expansions keep two kernels: the fused one measured no faster there (stop 52, H100, DeepSeek-V3 FP4
    // T = 16384: 24082 against 24104 µs with the scan and expansion of then).
    if (!scan_only && (wide_mode == 3 || (wide_mode == -1 && groups == 1))) {
      const auto fused_y = static_cast<unsigned>((blocks_ + kFp4FusedBlocks - 1) / kFp4FusedBlocks);
      fp4_scan_expand_kernel<<<dim3(static_cast<unsigned>(groups * tiles_), fused_y), kFp4FusedThreads, 0, stream>>>(
          packed, ldb, view, p.k, weights_, tile_emax, tile_scale_, row_scale_, flags_);
      FG_CUDA_CHECK(cudaGetLastError());
      expand_fused_launch_count.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    // By default (-1; here: scan-only calls and grouped expansions) the scan along the scale rows
    // (fp4_fold_scan_rows_kernel, stop 52).
    // Each tile's scales staged by one bulk copy (fp4_fold_scan_staged_kernel), where the rows are 16-byte aligned
    // and end at a multiple of 16 bytes: by default for rows of 32 K blocks or more (fp4_scan_staged_for).
    const int64_t staged_bytes = (int64_t{127} * p.b_scale_stride_n + p.k / 32 + 15) / 16 * 16;
    const bool staged = wide_mode == -1 && fp4_scan_staged_for(fp4_scan_staged_mode(), blocks_) &&
                        reinterpret_cast<uintptr_t>(p.b_scale) % 16 == 0 && p.b_scale_stride_n % 16 == 0 &&
                        p.b_scale_group_stride % 16 == 0 && (p.k / 32) % 16 == 0 && p.k % 128 == 0 &&
                        staged_bytes <= 160 * 1024;
    if (staged) {
      // The attribute is the device's: set once per device (a process may drive several, as the EP layer does).
      static std::atomic<bool> attribute_set[kMaxDevices] = {};
      int device = 0;
      FG_CUDA_CHECK(cudaGetDevice(&device));
      allow_max_smem_once(fp4_fold_scan_staged_kernel, attribute_set, device);
      fp4_fold_scan_staged_kernel<<<static_cast<unsigned>(groups * tiles_), kFp4ScanStagedThreads,
                                    static_cast<size_t>(staged_bytes), stream>>>(view, p.k, tile_emax, tile_scale_,
                                                                                 flags_);
      scan_staged_launch_count.fetch_add(1, std::memory_order_relaxed);
      if (scan_only) {
        FG_CUDA_CHECK(cudaGetLastError());
        return;
      }
      expand(std::true_type{}, tile_emax, row_scale_, flags_);
      FG_CUDA_CHECK(cudaGetLastError());
      return;
    }
    if (wide_mode == -1) {
      if (fp4_scan_rows_unroll(blocks_) == 8)
        fp4_fold_scan_rows_kernel<8><<<static_cast<unsigned>(groups * tiles_), 128, 0, stream>>>(view, p.k, tile_emax,
                                                                                                tile_scale_, flags_);
      else
        fp4_fold_scan_rows_kernel<16><<<static_cast<unsigned>(groups * tiles_), 128, 0, stream>>>(view, p.k, tile_emax,
                                                                                                 tile_scale_, flags_);
      scan_rows_launch_count.fetch_add(1, std::memory_order_relaxed);
      if (scan_only) {
        FG_CUDA_CHECK(cudaGetLastError());
        return;
      }
      expand(std::true_type{}, tile_emax, row_scale_, flags_);
      FG_CUDA_CHECK(cudaGetLastError());
      return;
    }
    // The wide scan: with mode 2 (scan-only calls took it by default from stop 44 to stop 51).
    const bool wide_scan = wide_mode == 2;
    if (scan_only && !wide_scan) {
      // One CTA per tile walking its K blocks (fp4_fold_scan_tiles_kernel): the per-(tile, K block) grid below takes
      // 458752 CTAs for DeepSeek-V3's gate_up experts. The expansion's own scan is left as measured.
      // NOTE: each of its threads walks the tile's K blocks with four byte loads at a time (a load latency per block);
      // only FINEGEMM_FP4_EXPAND_WIDE=0 and 1 keep scan-only calls here. The wide scan below (57344 CTAs for
      // DeepSeek-V3's gate_up experts, up to 32 loads in flight per thread) takes them by default since stop 44.
      fp4_fold_scan_tiles_kernel<<<static_cast<unsigned>(groups * tiles_), 128, 0, stream>>>(view, p.k, tile_emax,
                                                                                            tile_scale_, flags_);
      FG_CUDA_CHECK(cudaGetLastError());
      return;
    }
    if (wide_scan) {
      const auto scan_y = static_cast<unsigned>((blocks_ + kFp4ScanWideBlocks - 1) / kFp4ScanWideBlocks);
      fp4_fold_scan_wide_kernel<<<dim3(groups * tiles_, scan_y), 128, 0, stream>>>(view, p.k, tile_emax, tile_scale_,
                                                                                 flags_);
      scan_wide_launch_count.fetch_add(1, std::memory_order_relaxed);
      if (scan_only) {
        FG_CUDA_CHECK(cudaGetLastError());
        return;
      }
    } else {
      fp4_fold_scan_kernel<<<dim3(groups * tiles_, blocks_), 128, 0, stream>>>(view, p.k, tile_emax, tile_scale_,
                                                                            flags_);
    }
    expand(std::true_type{}, tile_emax, row_scale_, flags_);
  } else {
    expand(std::false_type{}, nullptr, nullptr, nullptr);
  }
  FG_CUDA_CHECK(cudaGetLastError());
}

Fp4Expansion::~Fp4Expansion() {
  if (base_ == nullptr) return;
  if (kept_)
    (void)cudaFree(base_);  // waits for the device's work that may still read it
  else
    (void)cudaFreeAsync(base_, stream_);
}

namespace {
std::atomic<long long> scan_cache_hit_count{0};
std::atomic<long long> scan_cache_scan_count{0};
// device, scales, n, k, row stride, group stride, groups
using ScanKey = std::tuple<int, const void*, int, int, int64_t, int64_t, int>;
std::mutex scan_cache_mutex;
std::map<ScanKey, std::unique_ptr<Fp4Expansion>>& scan_cache() {
  static auto* cache = new std::map<ScanKey, std::unique_ptr<Fp4Expansion>>;  // kept for the process
  return *cache;
}
}  // namespace

bool fp4_scan_cache_wanted() {
  const char* env = std::getenv("FINEGEMM_FP4_SCAN_CACHE");
  const std::string v = env ? env : "";
  if (v.empty() || v == "0") return false;
  if (v == "1") return true;
  throw Error("FINEGEMM_FP4_SCAN_CACHE: expected 0 (the FP4 lean kernels' grouped calls scan their weight scales on "
              "every call) or 1 (a scan kept per weight scale tensor: a promise that the scales never change), got '" +
              v + "'");
}

const Fp4Expansion* fp4_scan_kept(const void* b, int64_t ldb, const GemmParams& p, int groups, cudaStream_t stream) {
  int device = 0;
  FG_CUDA_CHECK(cudaGetDevice(&device));
  const ScanKey key{device, p.b_scale, p.n, p.k, p.b_scale_stride_n, p.b_scale_group_stride, groups};
  std::lock_guard<std::mutex> lock(scan_cache_mutex);
  auto& cache = scan_cache();
  if (const auto it = cache.find(key); it != cache.end()) {
    scan_cache_hit_count.fetch_add(1, std::memory_order_relaxed);
    return it->second.get();
  }
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  FG_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  if (status != cudaStreamCaptureStatusNone) return nullptr;
  auto scan = std::make_unique<Fp4Expansion>(b, ldb, p, groups, nullptr, nullptr, stream, Fp4Expansion::Mode::ScanKept);
  if (!scan->ready()) return nullptr;
  FG_CUDA_CHECK(cudaStreamSynchronize(stream));  // once per weight: readable from every stream from now on
  scan_cache_scan_count.fetch_add(1, std::memory_order_relaxed);
  scan_cache_hit_count.fetch_add(1, std::memory_order_relaxed);
  return cache.emplace(key, std::move(scan)).first->second.get();
}

long long fp4_scan_cache_hits() { return scan_cache_hit_count.load(std::memory_order_relaxed); }
long long fp4_scan_cache_scans() { return scan_cache_scan_count.load(std::memory_order_relaxed); }

void fp4_scan_cache_clear() {
  std::lock_guard<std::mutex> lock(scan_cache_mutex);
  if (scan_cache().empty()) return;
  int current = 0;
  FG_CUDA_CHECK(cudaGetDevice(&current));
  for (auto& [key, scan] : scan_cache()) {
    FG_CUDA_CHECK(cudaSetDevice(std::get<0>(key)));
    scan.reset();
  }
  FG_CUDA_CHECK(cudaSetDevice(current));
  scan_cache().clear();
}

GemmParams Fp4Expansion::e4m3_params(const GemmParams& p, Path path) const {
  GemmParams q = p;
  q.b_fp4 = false;
  if (!fold_) return q;  // the original MX 1x32 scales, promoted every 32
  q.b_scale_fmt = ScaleFmt::F32;
  q.b_block_k = kGemmBlockK;
  q.b_scale_cols = blocks_;
  q.b_scale_stride_n = blocks_;
  q.promote_k = p.a_scale == nullptr || p.a_group % kGemmBlockK == 0 ? kGemmBlockK : 32;
  q.gate = flags_;
  q.gate_mask = kFp4TileUnfoldable | kFp4RowUnfoldable;
  if (path == Path::Tile) {  // every tile folds: one scale per 128x128 block
    q.b_scale = tile_scale_;
    q.b_block_n = 128;
    q.b_scale_group_stride = static_cast<int64_t>(tiles_) * blocks_;
    q.gate_value = 0;
  } else {  // every row block folds: one scale per row and 128 of K
    q.b_scale = row_scale_;
    q.b_block_n = 1;
    q.b_scale_group_stride = static_cast<int64_t>(p.n) * blocks_;
    q.gate_value = kFp4TileUnfoldable;
  }
  return q;
}

LeanFp4B Fp4Expansion::lean_view(const GemmParams& p) const {
  LeanFp4B v;
  v.scale = static_cast<const uint8_t*>(p.b_scale);
  v.scale_stride_n = p.b_scale_stride_n;
  v.scale_group_stride = p.b_scale_group_stride;
  v.tile_emax = tile_emax_;
  v.tiles_per_group = tiles_;
  v.blocks = blocks_;
  return v;
}

void Fp4Expansion::gate_unfoldable(GemmParams& p) const {
  p.gate = flags_;
  p.gate_mask = kFp4TileUnfoldable;  // a row block that does not fold is in a tile that does not
  p.gate_value = kFp4TileUnfoldable;
}

void Fp4Expansion::gate_fp4(GemmParams& p) const {
  p.gate = flags_;
  p.gate_mask = kFp4RowUnfoldable;
  p.gate_value = kFp4RowUnfoldable;
}

}  // namespace finegemm::cuda
