#include <algorithm>
#include <climits>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>

#include "cuda/kernels/splitk_reduce.cuh"
#include "cuda/runtime/fp4_expand.hpp"
#include "cuda/runtime/gemm_launch.cuh"
#include "cuda/runtime/gemm_args.hpp"
#include "cuda/runtime/sm90_fp8_gemm.hpp"

namespace finegemm::cuda {
namespace {

// Split-K partials: a buffer per (device, stream), grown outside graph capture and reused, so that decode-sized
// calls make no allocation. NOTE: while a stream is being captured and the buffer is too small, the call falls
// back to a stream-ordered allocation (a graph memory node).
struct SplitWorkspace {
  float* ptr = nullptr;
  size_t bytes = 0;
};
std::mutex workspace_mutex;
std::map<std::pair<int, cudaStream_t>, SplitWorkspace> workspaces;

float* cached_workspace(int device, cudaStream_t stream, size_t bytes) {
  // NOTE: a graph never gets the cached buffer: a later eager call may regrow (free) it, and two replays of graphs
  // captured on one stream may run at once. Under capture the caller takes a stream-ordered allocation instead.
  // NOTE: nor does cudaStreamPerThread: one handle for every host thread's own stream, so two threads' calls could run
  // at once on one cached buffer.
  if (stream == cudaStreamPerThread) return nullptr;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  FG_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  if (capture != cudaStreamCaptureStatusNone) return nullptr;
  std::lock_guard<std::mutex> lock(workspace_mutex);
  SplitWorkspace& w = workspaces[{device, stream}];
  if (w.bytes >= bytes) return w.ptr;
  if (w.ptr) {
    FG_CUDA_CHECK(cudaStreamSynchronize(stream));
    FG_CUDA_CHECK(cudaFree(w.ptr));
  }
  const size_t grown = std::max(bytes, size_t(32) << 20);
  FG_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&w.ptr), grown));
  w.bytes = grown;
  return w.ptr;
}

}  // namespace

float* cached_split_workspace(int device, cudaStream_t stream, size_t bytes) {
  return cached_workspace(device, stream, bytes);
}

namespace {

// The schedulers of the shared-A pairs (column blocks counted in pairs) and of the 2x2 blocks (row and column blocks
// counted in pairs).
struct SharedASchedulers {
  NormalScheduler<128> s128;
  NormalScheduler<192> s192;
  NormalScheduler<256> s256_2x2;
  NormalScheduler<384> s384_2x2;
};

// The compiled dense tile configs. Each (BLOCK_M, BLOCK_N) has one stage count that fills the shared memory.
template <int kPromoteK>
void dispatch_dense(const GemmConfig& c, const CUtensorMap& a, const CUtensorMap& b, const GemmParams& p,
                    const NormalScheduler<64>& s64, const NormalScheduler<128>& s128, const NormalScheduler<192>& s192,
                    const NormalScheduler<256>& s256, const NormalScheduler<384>& s384, const SharedASchedulers& shared_a,
                    cudaStream_t stream) {
  constexpr auto kStore = Epilogue::Store;
  using S256 = NormalScheduler<256>;
  if (c.cluster == 4) {
    // 2x2 clusters: A shared along each row block pair's rows, B along each column block pair's columns.
    if constexpr (kPromoteK != 32) {
      if (c.block_m == 128 && c.block_n == 128)
        return launch_kernel<128, 128, 6, kPromoteK, kStore, S256, false, 4>(a, b, p, shared_a.s256_2x2, c.grid, stream);
      if (c.block_m == 192 && c.block_n == 128)
        return launch_kernel<192, 128, 5, kPromoteK, kStore, NormalScheduler<384>, false, 4>(a, b, p, shared_a.s384_2x2, c.grid, stream);
    }
    throw Error("gemm config: no compiled 2x2 cluster kernel for " + c.describe());
  }
  if (c.cluster == 2 && c.share_a) {
    // 2-CTA clusters over adjacent column blocks of one row block: A is multicast, each CTA loads its own B.
    if constexpr (kPromoteK != 32) {
      if (c.block_m == 128 && c.block_n == 128)
        return launch_kernel<128, 128, 6, kPromoteK, kStore, NormalScheduler<128>, false, 2, true>(a, b, p, shared_a.s128, c.grid, stream);
      if (c.block_m == 192 && c.block_n == 128)
        return launch_kernel<192, 128, 5, kPromoteK, kStore, NormalScheduler<192>, false, 2, true>(a, b, p, shared_a.s192, c.grid, stream);
    }
    throw Error("gemm config: no compiled shared-A cluster kernel for " + c.describe());
  }
  if (c.cluster == 2) {
    // 2-CTA clusters: the scheduler hands out pairs of 128- or 192-row tiles (256 or 384 rows); B is multicast.
    if constexpr (kPromoteK != 32) {
      if (c.block_m == 192 && c.block_n == 128)
        return launch_kernel<192, 128, 5, kPromoteK, kStore, NormalScheduler<384>, false, 2>(a, b, p, s384, c.grid, stream);
      if (c.block_m == 128 && c.block_n == 128) {
        if constexpr (kPromoteK == 128)
          if (p.one_acc)
            return launch_kernel<128, 128, 6, 128, kStore, S256, false, 2, false, false, true>(a, b, p, s256, c.grid, stream);
        return launch_kernel<128, 128, 6, kPromoteK, kStore, S256, false, 2>(a, b, p, s256, c.grid, stream);
      }
      if (c.block_m == 128 && c.block_n == 192) return launch_kernel<128, 192, 5, kPromoteK, kStore, S256, false, 2>(a, b, p, s256, c.grid, stream);
      if (c.block_m == 128 && c.block_n == 256) return launch_kernel<128, 256, 4, kPromoteK, kStore, S256, false, 2>(a, b, p, s256, c.grid, stream);
    }
    throw Error("gemm config: no compiled 2-CTA cluster kernel for " + c.describe());
  }
  if (c.block_m == 64 && c.block_n == 64) return launch_kernel<64, 64, 12, kPromoteK, kStore>(a, b, p, s64, c.grid, stream);
  if (c.block_m == 64 && c.block_n == 128) return launch_kernel<64, 128, 8, kPromoteK, kStore>(a, b, p, s64, c.grid, stream);
  if (c.block_m == 128 && c.block_n == 64) return launch_kernel<128, 64, 8, kPromoteK, kStore>(a, b, p, s128, c.grid, stream);
  // 192x128: three consumer warpgroups, so that two wgmma groups are queued while one warpgroup promotes.
  if constexpr (kPromoteK != 32) {
    if (c.block_m == 192 && c.block_n == 128) return launch_kernel<192, 128, 5, kPromoteK, kStore>(a, b, p, s192, c.grid, stream);
  }
  if (c.block_m == 128 && c.block_n == 128) {
    if constexpr (kPromoteK == 128)
      if (p.one_acc)
        return launch_kernel<128, 128, 6, 128, kStore, NormalScheduler<128>, false, 1, false, false, true>(a, b, p, s128, c.grid, stream);
    return launch_kernel<128, 128, 6, kPromoteK, kStore>(a, b, p, s128, c.grid, stream);
  }
  if (c.block_m == 128 && c.block_n == 192) return launch_kernel<128, 192, 5, kPromoteK, kStore>(a, b, p, s128, c.grid, stream);
  // 128x256: no 32-wide promotion (two n128 halves with four slices each would spill).
  if constexpr (kPromoteK != 32) {
    if (c.block_m == 128 && c.block_n == 256) return launch_kernel<128, 256, 4, kPromoteK, kStore>(a, b, p, s128, c.grid, stream);
  }
  throw Error("gemm config: no compiled kernel for " + c.describe());
}

// FP4 B: MX scales promote every 32. Stage counts fill the shared memory with the packed staging buffer added.
void dispatch_dense_fp4(const GemmConfig& c, const CUtensorMap& a, const CUtensorMap& b, const GemmParams& p,
                        const NormalScheduler<64>& s64, const NormalScheduler<128>& s128, cudaStream_t stream) {
  constexpr auto kStore = Epilogue::Store;
  using S64 = NormalScheduler<64>;
  using S128 = NormalScheduler<128>;
  if (fp4_fold(p)) {
    if (c.block_m == 64 && c.block_n == 64) return launch_kernel<64, 64, 9, 128, kStore, S64, true>(a, b, p, s64, c.grid, stream);
    if (c.block_m == 64 && c.block_n == 128) return launch_kernel<64, 128, 6, 128, kStore, S64, true>(a, b, p, s64, c.grid, stream);
    if (c.block_m == 128 && c.block_n == 64) return launch_kernel<128, 64, 7, 128, kStore, S128, true>(a, b, p, s128, c.grid, stream);
    if (c.block_m == 128 && c.block_n == 128) return launch_kernel<128, 128, 5, 128, kStore, S128, true>(a, b, p, s128, c.grid, stream);
    throw Error("gemm config: no compiled FP4 kernel for " + c.describe());
  }
  if (c.block_m == 64 && c.block_n == 64) return launch_kernel<64, 64, 9, 32, kStore, S64, true>(a, b, p, s64, c.grid, stream);
  if (c.block_m == 64 && c.block_n == 128) return launch_kernel<64, 128, 6, 32, kStore, S64, true>(a, b, p, s64, c.grid, stream);
  if (c.block_m == 128 && c.block_n == 64) return launch_kernel<128, 64, 7, 32, kStore, S128, true>(a, b, p, s128, c.grid, stream);
  if (c.block_m == 128 && c.block_n == 128) return launch_kernel<128, 128, 5, 32, kStore, S128, true>(a, b, p, s128, c.grid, stream);
  throw Error("gemm config: no compiled FP4 kernel for " + c.describe());
}

}  // namespace

std::string GemmConfig::describe() const {
  return std::to_string(block_m) + "x" + std::to_string(block_n) + " stages=" + std::to_string(stages) +
         " split_k=" + std::to_string(split_k) + " cluster=" + std::to_string(cluster) + (share_a ? " (shared A)" : "") +
         " grid=" + std::to_string(grid);
}

GemmConfig choose_gemm_config(int m, int n, int k, int promote_k, int num_sms) {
  GemmConfig c;
  const int num_kb = std::max(1, ceil_div(k, kGemmBlockK));
  c.block_m = m <= 64 ? 64 : 128;
  if (m <= 64) {
    // Decode is bound by streaming B: pick the tile width and split-K that minimise the bytes the busiest SM moves,
    // waves × BLOCK_N × (K blocks per split × 128 bytes of B per row, plus with split-K the F32 partial of each of the
    // M rows, written and read back by the reduce: 8 bytes), each split 1% more.
    // NOTE: until stop 25 the partials were left out of the cost, which took 8 splits of 64x64 tiles at M = 64
    // N = 7168 K = 2048: 16.4 µs (graph replay, H200) against 13.5 with 4 splits, 12.2 with 2 and 11.2 with 64x128
    // tiles and 2 splits; the 8 splits wrote as many bytes of partials as the weights hold.
    double best = 1e300;
    for (int bn : {64, 128}) {
      const int tiles = ceil_div(n, bn);
      for (int split = 1; split <= std::min(16, num_kb); ++split) {
        const int kbps = ceil_div(num_kb, split);
        if (ceil_div(num_kb, kbps) != split) continue;
        const int waves = ceil_div(static_cast<int64_t>(tiles) * split, num_sms);
        const double bytes_per_col = kbps * 128.0 + (split > 1 ? 8.0 * m : 0.0);
        const double cost = static_cast<double>(waves) * bn * bytes_per_col * (1.0 + 0.01 * split) + (bn == 64 ? 1.0 : 0.0);
        if (cost < best) {
          best = cost;
          c.block_n = bn;
          c.split_k = split;
        }
      }
    }
    // Several waves of 64x64 tiles without split-K where 64x128 tiles take fewer waves: the wider tiles. The byte count
    // above favours the 64-wide tiles' balance, but each tile costs its own fill and epilogue. Measured on the H200
    // (graph replay, stop 31): M = 64 N = 24576 K = 1536 (three waves of 64x64 against two of 64x128) 17.05 vs
    // 16.14 us, M = 48 16.43 vs 15.90, M = 40 N = 24576 K = 2048 19.80 vs 19.57; where the pick was already 64x128
    // (N = 32768 K = 512, N = 16384 K = 1536) both measured the same.
    if (c.block_n == 64 && c.split_k == 1) {
      const int64_t waves64 = ceil_div(static_cast<int64_t>(ceil_div(n, 64)), num_sms);
      const int64_t waves128 = ceil_div(static_cast<int64_t>(ceil_div(n, 128)), num_sms);
      if (waves64 > 1 && waves128 < waves64) c.block_n = 128;
    }
  } else {
    // Prefill: cost = waves × tile area / efficiency of the tile shape.
    // NOTE: measured on the H200, block 128x128 dynamic, M = 4096 (bench/results/configs_2026-12-01_4d33aed.json):
    // 192x128 (three consumer warpgroups) beats 128x128 on every shape: N=7168 K=16384 933 vs 867 TFLOP/s, N=4096
    // K=7168 790 vs 752, N=24576 K=1536 607 vs 477, N=2112 K=7168 821 vs 618; 128x128 beat 128x192 on all of them
    // (867/752/477/618 vs 814/629/382/630, and M=512 702 vs 442 at 48fe691). 192x128 is compiled for 128-wide
    // promotion and none; it is chosen for 128-wide promotion, where it was measured.
    double best = 1e300;
    struct Shape {
      int bm, bn;
      double efficiency;
    };
    // NOTE: 128x128 with 128-wide promotion runs two accumulator sets (GemmParams::double_acc), measured 2-9% faster
    // than one (stop 23): 1.05 picks it where it measured faster than 192x128 (M=4096 N=4096 K=7168 923/908 vs
    // 882/893 TFLOP/s, M=512) and keeps 192x128 where that stayed ahead (N=7168 K=16384 998/1009 vs 979/994,
    // N=24576 K=1536, N=2112 K=7168, N=7168 K=2048).
    const double e128 = promote_k == 128 ? 1.05 : 1.0;
    for (const Shape t : {Shape{128, 64, 0.69}, Shape{128, 128, e128}, Shape{128, 192, 0.85}, Shape{192, 128, 1.15}}) {
      if (t.bn == 192 && promote_k == 32) continue;  // NOTE: 128x192 with 32-wide promotion spilled registers
      if (t.bm == 192 && promote_k != 128) continue;
      const int tiles = ceil_div(m, t.bm) * ceil_div(n, t.bn);
      const double cost = static_cast<double>(ceil_div(tiles, num_sms)) * t.bm * t.bn / t.efficiency;
      if (cost < best) {
        best = cost;
        c.block_m = t.bm;
        c.block_n = t.bn;
      }
    }
    // Four K blocks or fewer (K <= 512) at M > 256: 192x128 over 128x128, whose cost above weighs the 192-row tiles'
    // unused rows (M = 512: the third row block is two-thirds full) as if they ran. With so short a K loop the fixed
    // cost per tile (its first stage's load, the epilogue) dominates, and fewer, taller tiles pay it less often.
    // Measured on the H200 (M = 512 N = 32768 K = 512, graph replay, same data): 192x128 28.9 us alone (stop 28) and
    // in pairs sharing A (stop 29) against 33.3 for 128x128.
    if (promote_k == 128 && num_kb <= 4 && m > 256 && c.block_m == 128 && c.block_n == 128) c.block_m = 192;
    const int tiles = ceil_div(m, c.block_m) * ceil_div(n, c.block_n);
    // Split-K when the tiles fill under 3/4 of the SMs: the split count whose busiest SM runs the fewest K blocks
    // (waves x K blocks per split), each split costing 2% more (its partial write and the reduce). NOTE: until stop 24
    // this was ceil(SMs / tiles), which overfills one wave: M = 128 N = 7168 (56 tiles) took 3 splits, 168 units on
    // 132 SMs, two waves of 6 K blocks where 2 splits run one wave of 8. Not yet measured on the GPU.
    if (tiles < num_sms * 3 / 4 && num_kb >= 4) {
      double best_split = 1e300;
      for (int split = 1; split <= std::min(num_kb / 2, 16); ++split) {
        const int64_t waves = ceil_div(static_cast<int64_t>(tiles) * split, num_sms);
        const double cost = static_cast<double>(waves * ceil_div(num_kb, split)) * (1.0 + 0.02 * (split - 1));
        if (cost < best_split) {
          best_split = cost;
          c.split_k = split;
        }
      }
    }
    // M = 65..128 where one row of 128x64 tiles fills a wave without split-K: two rows of 64x128 tiles instead (the
    // same tile count; one consumer warpgroup issuing n128 wgmma where two issued n64). Measured on the H200 (stop 28,
    // graph replay, M = 128, same data): N = 7168 K = 16384 48.2 vs 53.6 us, N = 7168 K = 2048 9.8 vs 10.8; with
    // split-K (N = 4096 K = 7168, 2112, 576) 128x64 stayed ahead (18.7 vs 19.3 at N = 4096).
    if (promote_k == 128 && m > 64 && m <= 128 && c.block_m == 128 && c.block_n == 64 && c.split_k == 1 &&
        static_cast<int64_t>(ceil_div(m, 64)) * ceil_div(n, 128) <= tiles) {
      c.block_m = 64;
      c.block_n = 128;
    }
  }
  // 2-CTA clusters. NOTE: measured on the H200 after dde513b (no membar before the remote stage release), M = 4096,
  // bench/results/stop24_clusters_2026-12-02_ab42b19.json: 192x128 pairs sharing B (c2, the pair takes two row
  // blocks) N=7168 K=16384 1030 vs 971 TFLOP/s, N=24576 K=1536 811 vs 800, N=2112 K=7168 852 vs 834; at M = 2048
  // (11 row blocks: the last pair half idle) c2 fell to 863 vs 996, pairs sharing A (c2a, two column blocks) 1011.
  // 128x128 pairs were no faster than 128x128 with two accumulator sets (N=4096 K=7168 931 vs 937). So 192x128
  // takes c2 where the row blocks pair up, else c2a where the column blocks do. FINEGEMM_GEMM_CLUSTER=1 turns
  // clusters off; =2 also pairs 128-row tiles (B shared); =4 takes 2x2 blocks of 192x128 or 128x128 tiles (A and B
  // shared; not yet measured on the GPU) where a wave of them fills the SMs.
  const char* cluster_env = std::getenv("FINEGEMM_GEMM_CLUSTER");
  const int cluster_mode = cluster_env && *cluster_env ? std::atoi(cluster_env) : 0;  // 0: the heuristic
  c.cluster = 1;
  if (cluster_mode != 1 && promote_k != 32 && c.split_k == 1) {
    const int64_t row_blocks = ceil_div(m, c.block_m), col_blocks = ceil_div(n, c.block_n);
    // 2x2 only where the row and column blocks both pair up (an odd count leaves whole CTAs idle, as c2 at M = 2048).
    if (cluster_mode == 4 && c.block_n == 128 && (c.block_m == 192 || c.block_m == 128) && row_blocks % 2 == 0 &&
        col_blocks % 2 == 0 && (row_blocks / 2) * (col_blocks / 2) >= num_sms / 4) {
      c.cluster = 4;
    } else if (c.block_m == 192 && row_blocks * col_blocks >= num_sms) {
      if (row_blocks % 2 == 0) {
        c.cluster = 2;
      } else if (col_blocks % 2 == 0) {
        c.cluster = 2;
        c.share_a = true;
      }
    } else if (cluster_mode == 2 && c.block_m == 128 && c.block_n >= 128 &&
               static_cast<int64_t>(ceil_div(m, 256)) * col_blocks >= num_sms / 2) {
      c.cluster = 2;
    }
  }
  if (const char* forced = std::getenv("FINEGEMM_GEMM_CONFIG")) {
    int bm = 0, bn = 0, split = 0, cluster = 1;
    char shared = 0;
    const int got = std::sscanf(forced, "%dx%d:%dc%d%c", &bm, &bn, &split, &cluster, &shared);
    // "c2a": the pair shares A (adjacent column blocks); 128x128 and 192x128 tiles. "c4": 2x2 blocks sharing A and
    // B; 128x128 and 192x128 tiles.
    const bool share_a = got == 5 && shared == 'a';
    const bool valid = got >= 2 && (bm == 64 || bm == 128 || bm == 192) && (bn == 64 || bn == 128 || bn == 192 || bn == 256) &&
                       (bn != 256 || (bm == 128 && promote_k != 32)) && (bm != 192 || (bn == 128 && promote_k != 32)) &&
                       (cluster == 1 || (cluster == 2 && (bm == 128 || (bm == 192 && bn == 128)) && bn >= 128 && promote_k != 32) ||
                        (cluster == 4 && (bm == 128 || bm == 192) && bn == 128 && promote_k != 32)) &&
                       (got < 5 || (share_a && bn == 128 && cluster == 2));
    if (!valid)
      throw Error(std::string("FINEGEMM_GEMM_CONFIG: expected BMxBN[:split[c2|c2a|c4]] with BM in {64, 128, 192}, BN in {64, 128, "
                              "192, 256} (256: BM 128, no 32-wide promotion; BM 192: BN 128, no 32-wide promotion; c2: 2-CTA "
                              "clusters, BM 128 with BN >= 128 or 192x128, no 32-wide promotion; c2a: the pair shares A, "
                              "128x128 or 192x128; c4: 2x2 clusters, 128x128 or 192x128, no 32-wide promotion), got '") +
                  forced + "'");
    c.block_m = bm;
    c.block_n = bn;
    c.cluster = cluster;
    c.share_a = share_a;
    if (got >= 3) c.split_k = split;
  }
  c.stages = c.block_m == 192 ? 5
             : c.block_m == 64 ? (c.block_n == 64 ? 12 : 8)
                               : (c.block_n == 64 ? 8 : (c.block_n == 128 ? 6 : (c.block_n == 192 ? 5 : 4)));
  c.split_k = std::max(1, std::min(c.split_k, num_kb));
  c.k_blocks_per_split = ceil_div(num_kb, c.split_k);
  c.split_k = ceil_div(num_kb, c.k_blocks_per_split);
  // With clusters, grid counts tile pairs or 2x2 blocks (the launcher turns it into CTAs).
  const int tiles = c.cluster == 4 ? ceil_div(m, 2 * c.block_m) * ceil_div(n, 2 * c.block_n)
                    : c.share_a    ? ceil_div(m, c.block_m) * ceil_div(n, 2 * c.block_n)
                                   : ceil_div(m, c.block_m * c.cluster) * ceil_div(n, c.block_n);
  c.grid = std::min(num_sms / c.cluster, tiles * c.split_k);
  if (const char* print = std::getenv("FINEGEMM_PRINT_CONFIG"); print && *print == '1')
    std::fprintf(stderr, "finegemm: gemm M=%d N=%d K=%d promote_k=%d -> %s\n", m, n, k, promote_k, c.describe().c_str());
  return c;
}

namespace {
// shared_a: the column blocks counted in pairs (2-CTA clusters sharing A; each CTA takes one of the pair's blocks).
template <int kRowsPerTile>
NormalScheduler<kRowsPerTile> normal_scheduler(const GemmParams& p, const GemmConfig& c, bool shared_a = false) {
  return NormalScheduler<kRowsPerTile>::make(p.m, ceil_div(p.m, kRowsPerTile), ceil_div(p.n, (shared_a ? 2 : 1) * c.block_n),
                                              ceil_div(p.k, kGemmBlockK), c.split_k, c.k_blocks_per_split);
}
}  // namespace

// The TMA-store epilogue (on unless FINEGEMM_GEMM_TMA_STORE=0). Its instantiations serve: 192x128 tiles alone and in
// pairs sharing B (c2) or A (c2a); 128x64, 128x128 (with two accumulator sets, or one) and 128x192 tiles without
// clusters; in the lean epilogue's case (no split-K workspace, no column scale, no bias), with 16-bit output in plain
// column order, y 16-byte aligned with rows a multiple of 16 bytes apart (TMA's global address and stride rules).
// NOTE: measured on the H200 (stop 33, graph replay, same data, BF16 out, block FP32 scales; off -> on, µs):
// M = 4096 N = 32768 K = 512 180.3 / 189.5 -> 160.7 / 163.5, M = 4096 N = 7168 K = 2048 122.9 / 122.6 -> 114.0 /
// 113.5, M = 512 N = 24576 K = 1536 45.6 -> 41.6, M = 512 N = 32768 K = 512 28.6 -> 25.2, M = 512 N = 7168 K = 2048
// 21.0 -> 19.0, M = 512 N = 4096 K = 7168 31.7 -> 29.9, M = 4096 N = 7168 K = 16384 958.6 / 924.0 -> 919.5 / 926.7
// (bench/results/stop33_call2_2026-12-03_7a01248.json; 192x128 pairs and 128x128 only).
bool tma_store_ok(const GemmParams& p, const GemmConfig& c) {
  const bool config = (c.block_m == 192 && c.block_n == 128 && c.cluster <= 2) ||
                      (c.block_m == 128 && c.cluster == 1 && (c.block_n == 64 || c.block_n == 128 || c.block_n == 192));
  return env_switch("FINEGEMM_GEMM_TMA_STORE", true) && config && c.split_k == 1 && p.workspace == nullptr &&
         !p.b_fp4 && tma_store_output_ok(p);
}

bool a_scale_bulk_wanted() { return env_switch("FINEGEMM_GEMM_SCALE_BULK", true); }

bool a_scale_bulk_ok(const GemmParams& p) {
  return p.a_scale != nullptr && p.a_group == 128 && p.a_scale_stride_m == 1 && p.a_scale_stride_k % 4 == 0 &&
         p.a_scale_stride_k >= (int64_t{p.m} + 3) / 4 * 4 && reinterpret_cast<uintptr_t>(p.a_scale) % 16 == 0 &&
         (p.a_scale_padded || p.m % 4 == 0);
}

bool fp4_decode_perm_ok(const GemmParams& p, bool grouped) {
  const bool dense_ok = p.m <= 64 && p.row_weight == nullptr;  // grouped launches run chunks of rows per expert
  return p.b_fp4 && (grouped || dense_ok) && p.k % 128 == 0 && p.b_layout == BLayout::Plain &&
         p.b_scale_fmt != ScaleFmt::F32 && p.a_group % 128 == 0 && decode_kernel_kind(p) == DecodeKind::Fp4;
}

bool fp4_decode_perm_wanted(const GemmParams& p) {
  // The direct-copy kernel (FINEGEMM_FP4_DECODE_LDG=1) takes the same order.
  return fp4_decode_perm_ok(p, false) &&
         (env_switch("FINEGEMM_FP4_DECODE_PERM", false) || fp4_decode_ldg_wanted()) &&
         env_switch("FINEGEMM_FP4_DECODE", true);
}

void launch_sm90_fp8_gemm(const void* a, int64_t lda, const void* b, int64_t ldb, GemmParams p, cudaStream_t stream) {
  if (p.m == 0 || p.n == 0) return;
  const bool promote = p.a_scale != nullptr || p.b_scale != nullptr || fp32_accum_wanted(p.k);
  apply_env_switches(p);
  int device = 0;
  FG_CUDA_CHECK(cudaGetDevice(&device));
  const int promote_k = !promote ? 0 : (p.promote_k % 128 == 0 ? 128 : 32);
  // FP4 weights at decode sizes: the swap-AB kernel that expands the weights in registers.
  const DecodeKind decode_kind = p.m <= 64 && p.row_weight == nullptr && p.b_layout == BLayout::Plain
                                     ? decode_kernel_kind(p)
                                     : DecodeKind::None;
  // Activations permuted for the decode kernel (linear(), fp4_decode_perm_wanted) go nowhere else.
  const bool fp4_decode = decode_kind == DecodeKind::Fp4 && (p.a_perm_k || env_switch("FINEGEMM_FP4_DECODE", true));
  if (p.a_perm_k && !fp4_decode)
    throw Error("fp4 gemm: activations permuted for the FP4 decode kernel reached a call it does not serve (M=" +
                std::to_string(p.m) + " N=" + std::to_string(p.n) + " K=" + std::to_string(p.k) + ")");
  // The FP4 GEMV (sm90_fp4_gemv.cuh) where it serves the recipe: FINEGEMM_FP4_GEMV=1 up to M = 16, =0 never; by
  // default where it measured faster (fp4_gemv_default: M ≤ 8 at N ≤ 768).
  const bool fp4_gemv = fp4_decode && !p.a_perm_k && fp4_gemv_ok(p, a, lda, b, ldb) &&
                        env_switch("FINEGEMM_FP4_GEMV", fp4_gemv_default(p.m, p.n));
  const Fp4GemvConfig gemv = fp4_gemv ? choose_fp4_gemv_config(p.m, p.n, p.k, p.b_scale_fmt, num_sms_of_device(device), device)
                                      : Fp4GemvConfig{};
  // E4M3 weights in the same decode kernel: block scales constant over its 64-row tiles and 128 of K, activation
  // scales constant over 128 of K. On by default at M ≤ 32, and up to M = 64 at K ≥ 8192: measured against the general
  // kernel on the H200 (N = 7168, K = 16384: 35.9 vs 51.9 µs at M = 1, 39.0 vs 47.1 at M = 32, 41.4 vs 46.5 at M = 48,
  // 42.7 vs 48.1 at M = 64; but at M = 64 N = 4096 K = 7168 17.5 vs 15.1 and N = 24576 K = 1536 20.1 vs 17.2:
  // bench/results/decode_m64_2026-12-02_a5506f9.json). FINEGEMM_FP8_DECODE=1 takes it up to M = 64 at any K, =0 turns
  // it off.
  // At K ≤ 512 only below M = 8: at N = 32768 K = 512 the tiles took 8.96 / 9.04 / 9.10 µs at M = 8 / 16 / 32
  // against the decode kernel's 9.91 / 11.58 / 10.28 (stop 25, graph replay); at M = 1 the decode kernel's 9.0 beat
  // cuBLASLt's 10.9.
  const bool fp8_decode_default = (p.m <= 32 && (p.k > 512 || p.m < 8)) || (p.m <= 64 && p.k >= 8192);
  const bool fp8_decode = decode_kind == DecodeKind::Fp8 && env_switch("FINEGEMM_FP8_DECODE", fp8_decode_default);
  // The FP4 decode kernel whose threads copy their own weights (FINEGEMM_FP4_DECODE_LDG=1; the permuted kernel
  // where it does not serve the call).
  const bool fp4_ldg = fp4_decode && p.a_perm_k && fp4_decode_ldg_wanted() && fp4_decode_ldg_ok(p, a, lda, b, ldb);
  const Fp4LdgConfig ldg = fp4_ldg ? choose_fp4_decode_ldg_config(p.m, p.n, p.k, num_sms_of_device(device), device)
                                   : Fp4LdgConfig{};
  const Fp4DecodeConfig decode = (fp4_decode && !fp4_gemv && !fp4_ldg) || fp8_decode
                                     ? choose_fp4_decode_config(p.m, p.n, p.k, num_sms_of_device(device), device,
                                                                fp8_decode, 0, p.a_perm_k)
                                     : Fp4DecodeConfig{};
  // FP4 prefill: the weights expanded once into E4M3 (fp4_expand_weights.cuh), then the E4M3 GEMM. Byte UE8M0 scales
  // fold into one float scale per 128x128 tile where every tile's scales spread ≤ 8 binades, else per row and 128 of
  // K where every row block's do; the scan writes which on the device, and of three gated launches (the E4M3 GEMM
  // with tile scales, with row scales, the FP4 kernel promoting every 32) that flag runs one. FP32 and packed scales
  // expand unfolded and promote every 32.
  std::optional<Fp4Expansion> expanded;
  // FINEGEMM_FP4_LEAN (off until measured on the GPU): byte UE8M0 scales through the lean kernel that expands each
  // packed K block in its producer warpgroup (no E4M3 scratch): the fold scan, the lean kernel gated to run where every
  // 128x128 tile folds, and the FP4 kernel below gated to run where one does not.
  std::optional<Fp4Expansion> scanned;
  if (!fp4_decode && p.b_fp4 && fp4_lean_block_m(false, 0) != 0 && lean_fp4_ok(p, 128, false, 1, device)) {
    scanned.emplace(b, ldb, p, 1, nullptr, nullptr, stream, Fp4Expansion::Mode::ScanOnly);
    if (scanned->ready()) {
      launch_sm90_fp4_gemm_lean(a, lda, b, ldb, scanned->tile_params(p), scanned->lean_view(p), device, stream);
      scanned->gate_unfoldable(p);
    } else {
      scanned.reset();
    }
  }
  if (!scanned && !fp4_decode && fp4_expand_wanted(p)) {
    expanded.emplace(b, ldb, p, 1, nullptr, nullptr, stream);
    if (!expanded->ready()) expanded.reset();  // no memory for the scratch: the FP4 kernel as it is
  }
  // With a fold, the FP4 kernel below runs too, gated to where some row block would not fold.
  if (expanded && !expanded->launch_e4m3(p, [&](const void* w, const GemmParams& q) {
        launch_sm90_fp8_gemm(a, lda, w, q.k, q, stream);
      }, fp4_gate_pdl_wanted()))
    return;
  // The lean kernel (sm90_fp8_gemm_lean.cuh) for the recipes it serves: by default at the tile height
  // lean_gemm_block_m picks (none where FINEGEMM_GEMM_CONFIG forces a general config); FINEGEMM_GEMM_LEAN=0 off, =1
  // 128x128 tiles, =192 192x128, =256 256x128. H200, stop 36, M = 4096 N = 7168 K = 16384: 677 µs at 256 rows, 747 at 128, 835 the
  // general kernel's default; M = 512 N = 4096 K = 7168: 24.1 µs (128 rows) vs 29.9 (general).
  if (!(fp4_decode || fp8_decode) && !p.b_fp4 && promote_k == 128) {
    const char* lean = std::getenv("FINEGEMM_GEMM_LEAN");
    const std::string forced = lean ? lean : "";
    int block_m = 0;
    if (forced.empty()) {
      const char* config = std::getenv("FINEGEMM_GEMM_CONFIG");
      if (!(config && *config)) block_m = lean_gemm_block_m(p, num_sms_of_device(device));
    } else if (forced == "1") {
      block_m = 128;
    } else if (forced == "192" || forced == "256") {
      block_m = std::stoi(forced);
    } else if (forced != "0") {
      throw Error("FINEGEMM_GEMM_LEAN: expected 0 (off), 1 (128x128 tiles), 192 (192x128) or 256 (256x128), got '" +
                  forced + "'");
    }
    if (block_m != 0 && lean_gemm_ok(p, block_m, device)) {
      launch_sm90_fp8_gemm_lean(a, lda, b, ldb, p, block_m, device, stream);
      return;
    }
  }
  GemmConfig c = choose_gemm_config(p.m, p.n, p.k, promote_k, num_sms_of_device(device));
  if (fp4_decode || fp8_decode) c.split_k = fp4_gemv ? gemv.split_k : (fp4_ldg ? ldg.split_k : decode.split_k);
  // The A scales by one bulk copy per stage (the E4M3 kernels promoting every 128 of K).
  p.a_scale_bulk = !(fp4_decode || fp8_decode) && !p.b_fp4 && promote_k == 128 && a_scale_bulk_wanted() && a_scale_bulk_ok(p);
  // Double accumulators: 128x128 tiles by default; 128x64 ones only when asked for (mixed results, gemm_launch.cuh).
  if (c.block_n == 64) p.double_acc = p.double_acc && std::getenv("FINEGEMM_GEMM_DOUBLE_ACC") != nullptr;
  // Programmatic dependent launch of the decode kernel and its split-K reduce (GemmParams::pdl): the kernel is resident
  // and requests its first weight tiles before the kernel ahead of it (the activation quantization, or the previous
  // call) completes. On for E4M3 weights: H200 graph replay, M = 1, FINEGEMM_PDL=0 vs 1: N = 24576 K = 1536 13.65 vs
  // 12.18 µs, N = 4096 K = 7168 14.09 vs 13.17, N = 7168 K = 16384 35.89 vs 35.02 (stop 20). FP4 weights: off until
  // measured again (M = 1, N = 7168, K = 16384: 38.0 vs 36.7 µs without, stop 19).
  p.pdl = (fp4_decode || fp8_decode) && env_switch("FINEGEMM_PDL", fp8_decode);
  if (p.b_fp4) {
    c.stages = 0;  // set by the FP4 dispatch
    // FP4 kernels: 64 or 128 rows and columns, no clusters.
    if (c.cluster != 1 || c.block_m > 128 || c.block_n > 128) {
      c.cluster = 1;
      c.share_a = false;
      c.block_m = std::min(c.block_m, 128);
      c.block_n = std::min(c.block_n, 128);
      c.grid = std::min(num_sms_of_device(device), ceil_div(p.m, c.block_m) * ceil_div(p.n, c.block_n) * c.split_k);
    }
  }
  const CUtensorMap tma_a = fp4_decode || fp8_decode ? CUtensorMap{} : make_tma_2d(a, p.m, p.k, lda, c.share_a || c.cluster == 4 ? c.block_m / 2 : c.block_m);
  // GemmParams::b_box_full: one B copy per stage where the CTA loads its whole B tile (no B multicast).
  p.b_box_full = !p.b_fp4 && !fp4_decode && !fp8_decode && p.b_layout == BLayout::Plain && (c.cluster == 1 || c.share_a) &&
                 env_switch("FINEGEMM_GEMM_B_ONE_BOX", true);
  const CUtensorMap tma_b = fp4_decode || fp8_decode ? CUtensorMap{} : p.b_fp4 ? make_tma_2d(b, p.n, p.k / 2, ldb, c.block_n / 2, kGemmBlockK / 2)
                                    : make_tma_2d(b, p.n, p.k, ldb, p.b_box_full ? c.block_n : c.block_n / 2);
  // One scheduler per compiled tile height; each kernel takes the one of its BLOCK_M (256: 2-CTA cluster pairs).
  const auto s64 = normal_scheduler<64>(p, c);
  const auto s128 = normal_scheduler<128>(p, c);
  const auto s192 = normal_scheduler<192>(p, c);
  const auto s256 = normal_scheduler<256>(p, c);
  const auto s384 = normal_scheduler<384>(p, c);
  const SharedASchedulers shared_a{normal_scheduler<128>(p, c, true), normal_scheduler<192>(p, c, true),
                                   normal_scheduler<256>(p, c, true), normal_scheduler<384>(p, c, true)};

  // A stream-ordered workspace (under graph capture) is freed on the stream whatever happens below.
  struct OwnedWorkspace {
    float* ptr = nullptr;
    cudaStream_t stream = nullptr;
    ~OwnedWorkspace() {
      if (ptr) (void)cudaFreeAsync(ptr, stream);
    }
  } owned{nullptr, stream};
  // The dense decode kernel may reduce its splits inside a cluster instead (GemmParams::decode_cluster_reduce).
  p.decode_cluster_reduce = (fp4_decode || fp8_decode) && !fp4_gemv && !fp4_ldg && c.split_k > 1 && c.split_k <= 8 &&
                            env_switch("FINEGEMM_DECODE_CLUSTER_REDUCE", false);
  // The GEMV always writes partials (the reduce applies the epilogue), even unsplit.
  if ((c.split_k > 1 || fp4_gemv) && !p.decode_cluster_reduce) {
    const size_t bytes = sizeof(float) * static_cast<size_t>(c.split_k) * p.m * p.n;
    p.workspace = cached_workspace(device, stream, bytes);
    if (!p.workspace) {
      owned.ptr = static_cast<float*>(scratch_alloc(bytes, stream));
      p.workspace = owned.ptr;
    }
  }
  // Scales constant over 128 (DeepSeek's block 128x128 with 1x128 groups) promote once per K block; finer recipes
  // (group 32, block 32x32, MX 1x32) promote every 32.
  bool finished = false;  // the decode kernel summed its own splits (FINEGEMM_DECODE_SPLIT_FINISH)
  if (fp4_gemv) finished = launch_sm90_fp4_gemv(a, lda, b, ldb, p, gemv, stream);
  else if (fp4_ldg) launch_sm90_fp4_decode_ldg(a, lda, b, ldb, p, ldg, stream);
  else if (fp4_decode || fp8_decode) finished = launch_sm90_fp4_decode(a, lda, b, ldb, p, decode, stream);
  else if (p.b_fp4) dispatch_dense_fp4(c, tma_a, tma_b, p, s64, s128, stream);
  else if (!promote) dispatch_dense<0>(c, tma_a, tma_b, p, s64, s128, s192, s256, s384, shared_a, stream);
  else if (p.promote_k % 128 == 0 && tma_store_ok(p, c)) {
    // The epilogue through shared memory and TMA stores (tma_store_ok), one stage fewer than the lean-store kernels
    // where the staging tiles take its place (128x64 keeps its eight).
    const CUtensorMap tma_out = make_tma_2d(p.out, p.m, 2 * int64_t{p.n}, 2 * p.ldo, 64);
    constexpr auto kStore = Epilogue::Store;
    using S128 = NormalScheduler<128>;
    if (c.block_m == 128 && c.block_n == 64)
      launch_kernel<128, 64, 8, 128, kStore, S128, false, 1, false, true>(tma_a, tma_b, p, s128, c.grid, stream, tma_out);
    else if (c.block_m == 128 && c.block_n == 128 && p.one_acc)
      launch_kernel<128, 128, 5, 128, kStore, S128, false, 1, false, true, true>(tma_a, tma_b, p, s128, c.grid, stream, tma_out);
    else if (c.block_m == 128 && c.block_n == 128)
      launch_kernel<128, 128, 5, 128, kStore, S128, false, 1, false, true>(tma_a, tma_b, p, s128, c.grid, stream, tma_out);
    else if (c.block_m == 128)
      launch_kernel<128, 192, 4, 128, kStore, S128, false, 1, false, true>(tma_a, tma_b, p, s128, c.grid, stream, tma_out);
    else if (c.cluster == 1)
      launch_kernel<192, 128, 4, 128, kStore, NormalScheduler<192>, false, 1, false, true>(tma_a, tma_b, p, s192, c.grid,
                                                                                          stream, tma_out);
    else if (c.share_a)
      launch_kernel<192, 128, 4, 128, kStore, NormalScheduler<192>, false, 2, true, true>(tma_a, tma_b, p, shared_a.s192,
                                                                                         c.grid, stream, tma_out);
    else
      launch_kernel<192, 128, 4, 128, kStore, NormalScheduler<384>, false, 2, false, true>(tma_a, tma_b, p, s384, c.grid,
                                                                                          stream, tma_out);
  }
  else if (p.promote_k % 128 == 0) dispatch_dense<128>(c, tma_a, tma_b, p, s64, s128, s192, s256, s384, shared_a, stream);
  else dispatch_dense<32>(c, tma_a, tma_b, p, s64, s128, s192, s256, s384, shared_a, stream);
  if (p.workspace && !finished) launch_splitk_reduce(p, c.split_k, stream);
}

void launch_splitk_reduce(const GemmParams& p, int split_k, cudaStream_t stream) {
  const int64_t pairs = static_cast<int64_t>(p.m) * p.n / 2;
  const int blocks = static_cast<int>(std::min<int64_t>((pairs + 255) / 256, 132 * 8));
  launch_programmatic(p.pdl, splitk_reduce_kernel, blocks, 256, 0, stream, p, split_k);
  FG_CUDA_CHECK(cudaGetLastError());
}

}  // namespace finegemm::cuda
