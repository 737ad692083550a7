// Launch of the lean kernels with FP4 weights expanded in their producer warpgroup (sm90_fp8_gemm_lean.cuh, kFp4B;
// FINEGEMM_FP4_LEAN: by default the MoE Store GEMMs from 64 to 255 rows per expert, see fp4_lean_block_m). Its own translation unit, so that these kernels compile beside
// the E4M3 lean ones.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cuda/kernels/sm90_fp8_gemm_lean.cuh"
#include "cuda/runtime/gemm_launch.cuh"
#include "cuda/runtime/sm90_fp8_gemm.hpp"

namespace finegemm::cuda {
namespace {

std::atomic<long long> lean_fp4_launch_count{0};
std::atomic<long long> lean_fp4_packed_issuer_count{0};
std::atomic<long long> lean_fp4_packed_pairs_count{0};
std::atomic<long long> lean_fp4_issuer_share_count{0};

// Dense calls take 128-row tiles at four stages: the packed ring (57 KB) beside five stages and the staging tiles
// would pass the 227 KB of shared memory, as would 256-row tiles at three.
constexpr int kDenseFp4Stages = 4;

// The E4M3 lean kernels' view of an FP4 call's shape and activations (lean_gemm_ok / grouped_lean_ok check the rest):
// 128x128 B blocks of F32 scales, promoted once per K block.
GemmParams e4m3_shape(const GemmParams& p) {
  GemmParams q = p;
  q.b_fp4 = false;
  q.b_scale_fmt = ScaleFmt::F32;
  q.b_block_n = kLeanBlockN;
  q.b_block_k = kGemmBlockK;
  q.b_scale_cols = p.k / kGemmBlockK;
  q.promote_k = kGemmBlockK;
  return q;
}

template <int BLOCK_M, int kStages>
int fp4_smem(bool grouped, int num_kb) {
  using L = LeanGemm<BLOCK_M, kStages>;
  return (grouped ? L::grouped_smem_bytes(num_kb) : L::smem_bytes(num_kb)) + L::kFp4Extra;
}

int lean_fp4_smem_bytes(int block_m, bool grouped, int num_kb) {
  if (!grouped) return fp4_smem<128, kDenseFp4Stages>(false, num_kb);
  const int stages = lean_stages(block_m, num_kb);
  if (block_m == 128) return stages == 5 ? fp4_smem<128, 5>(true, num_kb) : fp4_smem<128, 4>(true, num_kb);
  if (block_m == 192) return fp4_smem<192, 4>(true, num_kb);
  return fp4_smem<256, 3>(true, num_kb);
}

// The packed weights: [rows, K / 2] bytes, boxes of 128 rows by 64 bytes (one K block) in the 64-byte swizzle.
CUtensorMap packed_map(const void* b, int64_t rows, int k, int64_t ldb) {
  return make_tma_2d(b, rows, k / 2, ldb, kLeanBlockN, kGemmBlockK / 2, /*swizzle64=*/true);
}


template <int BLOCK_M, int kStages, bool kAScale, int kExpand>
void launch_dense(const void* a, int64_t lda, const void* b, int64_t ldb, const GemmParams& q, const LeanFp4B& fp4,
                  int device, cudaStream_t stream) {
  auto kernel = sm90_fp4_gemm_lean_kernel<BLOCK_M, kStages, kAScale, kExpand>;
  static std::atomic<bool> attribute_set[kMaxDevices] = {};
  allow_max_smem_once(kernel, attribute_set, device);
  const CUtensorMap tma_a = make_tma_2d(a, q.m, q.k, lda, BLOCK_M);
  const CUtensorMap tma_b = packed_map(b, q.n, q.k, ldb);
  const CUtensorMap tma_out = make_tma_2d(q.out, q.m, 2 * int64_t{q.n}, 2 * q.ldo, 64);
  const int num_m_blocks = ceil_div(q.m, BLOCK_M);
  const int64_t tiles = int64_t{num_m_blocks} * ceil_div(q.n, kLeanBlockN);
  if (tiles > INT32_MAX) throw Error("lean fp4 gemm: " + std::to_string(tiles) + " tiles, more than one grid takes");
  const int grid = static_cast<int>(std::min<int64_t>(tiles, num_sms_of_device(device)));
  kernel<<<grid, lean_fp4_threads<BLOCK_M, kStages>(kExpand), fp4_smem<BLOCK_M, kStages>(false, q.k / kGemmBlockK),
           stream>>>(tma_a, tma_b, tma_out, q, num_m_blocks, static_cast<int>(tiles), fp4);
  FG_CUDA_CHECK(cudaGetLastError());
  lean_fp4_launch_count.fetch_add(1, std::memory_order_relaxed);
}

// FINEGEMM_FP4_LEAN_TRACE_FILE (diagnostics): launch number FINEGEMM_FP4_LEAN_TRACE_CALL (default 4) of the
// process's uncaptured grouped 192-row batched launches with A scales runs the kRingTrace build, which stamps each
// CTA's first kLeanRingItems K blocks (LeanRingStamps), and appends the stamps to the file (the stream is
// synchronised: a traced run times nothing). scripts/fp4-lean-ring summarises them.
LeanRingStamps* ring_trace_begin(int grid, cudaStream_t stream) {
  static int calls = 0;
  static void* buf = nullptr;
  static size_t capacity = 0;
  void* traced = diagnostic_trace_buffer("FINEGEMM_FP4_LEAN_TRACE_FILE", "FINEGEMM_FP4_LEAN_TRACE_CALL", 4,
                                         calls, buf, capacity, sizeof(LeanRingStamps) * kLeanRingItems * grid, stream);
  return static_cast<LeanRingStamps*>(traced);
}

// One line per stamped item: cta item, then the kLeanRingStamps clock64 values (-1 where not stamped).
void ring_trace_end(LeanRingStamps* ring, const GemmParams& p, int grid, cudaStream_t stream) {
  std::vector<LeanRingStamps> host(static_cast<size_t>(kLeanRingItems) * grid);
  FG_CUDA_CHECK(cudaStreamSynchronize(stream));
  FG_CUDA_CHECK(cudaMemcpy(host.data(), ring, sizeof(LeanRingStamps) * host.size(), cudaMemcpyDeviceToHost));
  FILE* f = std::fopen(std::getenv("FINEGEMM_FP4_LEAN_TRACE_FILE"), "a");
  if (f == nullptr) return;
  std::fprintf(f, "# fp4 lean ring m=%d n=%d k=%d grid=%d items=%d\n", p.m, p.n, p.k, grid, kLeanRingItems);
  for (int c = 0; c < grid; ++c)
    for (int i = 0; i < kLeanRingItems; ++i) {
      const LeanRingStamps& e = host[static_cast<size_t>(c) * kLeanRingItems + i];
      bool any = false;
      for (unsigned long long v : e.t) any = any || v != ~0ull;
      if (!any) continue;
      std::fprintf(f, "%d %d", c, i);
      for (unsigned long long v : e.t) std::fprintf(f, " %lld", v == ~0ull ? -1ll : static_cast<long long>(v));
      std::fprintf(f, "\n");
    }
  std::fclose(f);
}

template <int BLOCK_M, int kStages, bool kAScale, int kExpand>
void launch_grouped(const void* a, int64_t lda, const void* b, int64_t ldb, const GroupedLayout& layout,
                    const GemmParams& q, const LeanFp4B& fp4, int device, cudaStream_t stream) {
  using L = LeanGemm<BLOCK_M, kStages>;
  const CUtensorMap tma_a = make_tma_2d(a, q.m, q.k, lda, BLOCK_M);
  const CUtensorMap tma_b = packed_map(b, int64_t{layout.num_groups} * q.n, q.k, ldb);
  typename L::Sched sched;
  sched.offsets = layout.offsets;
  sched.counts = layout.counts;
  sched.max_rows = layout.max_rows;
  sched.num_groups = layout.num_groups;
  sched.num_n_blocks = ceil_div(q.n, kLeanBlockN);
  sched.num_k_blocks = q.k / kGemmBlockK;
  const int grid = num_sms_of_device(device);
  // One build of the kernel (the default, the traced one, the moved packed issuer, the packed pairs), each with its
  // own attribute flags.
  auto run = [&](auto build, std::atomic<bool> (&attribute_flags)[kMaxDevices], const LeanFp4B& args,
                 const CUtensorMap& packed) {
    allow_max_smem_once(build, attribute_flags, device);
    build<<<grid, lean_fp4_threads<BLOCK_M, kStages>(kExpand), fp4_smem<BLOCK_M, kStages>(true, q.k / kGemmBlockK),
            stream>>>(tma_a, packed, q, sched, args);
    FG_CUDA_CHECK(cudaGetLastError());
    lean_fp4_launch_count.fetch_add(1, std::memory_order_relaxed);
  };
  if constexpr (BLOCK_M == 192 && kAScale && kExpand == 1) {
    if (LeanRingStamps* ring = ring_trace_begin(grid, stream)) {
      static std::atomic<bool> traced_attribute_set[kMaxDevices] = {};
      LeanFp4B stamped = fp4;
      stamped.ring_trace = ring;
      const int share = fp4_lean_issuer_share();
      if (share == 1) {
        static std::atomic<bool> traced_light_attribute_set[kMaxDevices] = {};
        run(sm90_fp4_grouped_lean_kernel<BLOCK_M, kStages, kAScale, kExpand, true, 0, 1, 1>, traced_light_attribute_set,
            stamped, tma_b);
      } else if (share == 2) {
        static std::atomic<bool> traced_rotate_attribute_set[kMaxDevices] = {};
        run(sm90_fp4_grouped_lean_kernel<BLOCK_M, kStages, kAScale, kExpand, true, 0, 1, 2>, traced_rotate_attribute_set,
            stamped, tma_b);
      } else {
        run(sm90_fp4_grouped_lean_kernel<BLOCK_M, kStages, kAScale, kExpand, true>, traced_attribute_set, stamped, tma_b);
      }
      ring_trace_end(ring, q, grid, stream);
      return;
    }
    // FINEGEMM_FP4_LEAN_PACKED_ISSUER=32 (an experiment): warp 1's first thread issues the packed tiles, thread 0 A's.
    // Stop 54's ring trace had thread 0's packed copy, issued right after A's, stall ~640 cycles every K block, with
    // thread 0 about three K blocks behind the other producers.
    if (fp4_lean_packed_issuer() == 32) {
      static std::atomic<bool> moved_attribute_set[kMaxDevices] = {};
      run(sm90_fp4_grouped_lean_kernel<BLOCK_M, kStages, kAScale, kExpand, false, 32>, moved_attribute_set, fp4, tma_b);
      lean_fp4_packed_issuer_count.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    // FINEGEMM_FP4_LEAN_PACKED_PAIRS=1 (an experiment): one packed copy per two K blocks, a 128 x 128-byte box (the
    // rows' 64 bytes of K blocks 2i and 2i + 1 side by side), where every tile has an even number of K blocks. If a
    // copy's issue costs per copy or per 64-byte row (stop 54's ~640 cycles per K block), this halves it.
    if (fp4_lean_packed_pairs() && (q.k / kGemmBlockK) % 2 == 0) {
      static std::atomic<bool> pairs_attribute_set[kMaxDevices] = {};
      const CUtensorMap pairs = make_tma_2d(b, int64_t{layout.num_groups} * q.n, q.k / 2, ldb, kLeanBlockN, 128);
      run(sm90_fp4_grouped_lean_kernel<BLOCK_M, kStages, kAScale, kExpand, false, 0, 2>, pairs_attribute_set, fp4, pairs);
      lean_fp4_packed_pairs_count.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    // FINEGEMM_FP4_LEAN_ISSUER (an experiment; stop 57's ring trace: thread 0 ~3.5 K blocks behind the rest of its
    // warpgroup, its issue ~940 cycles a K block on top of its row's expansion, the stages waiting on it): "light"
    // warp 0 expands one MX group per lane and warps 1-3 five; "rotate" warp i % 4's first thread issues item i's
    // copies.
    if (const int share = fp4_lean_issuer_share(); share != 0) {
      static std::atomic<bool> light_attribute_set[kMaxDevices] = {}, rotate_attribute_set[kMaxDevices] = {};
      if (share == 1)
        run(sm90_fp4_grouped_lean_kernel<BLOCK_M, kStages, kAScale, kExpand, false, 0, 1, 1>, light_attribute_set, fp4,
            tma_b);
      else
        run(sm90_fp4_grouped_lean_kernel<BLOCK_M, kStages, kAScale, kExpand, false, 0, 1, 2>, rotate_attribute_set, fp4,
            tma_b);
      lean_fp4_issuer_share_count.fetch_add(1, std::memory_order_relaxed);
      return;
    }
  }
  static std::atomic<bool> attribute_set[kMaxDevices] = {};
  run(sm90_fp4_grouped_lean_kernel<BLOCK_M, kStages, kAScale, kExpand>, attribute_set, fp4, tma_b);
}

}  // namespace

bool lean_fp4_ok(const GemmParams& p, int block_m, bool grouped, int num_groups, int device) {
  if (grouped ? (block_m != 128 && block_m != 192 && block_m != 256) : block_m != 128) return false;
  if (!p.b_fp4 || p.b_scale == nullptr || p.b_scale_fmt != ScaleFmt::UE8M0 || p.b_block_n != 1 || p.b_block_k != 32 ||
      p.gate != nullptr || p.b_layout != BLayout::Plain)
    return false;
  if (p.m <= 0 || p.n <= 0 || p.k <= 0 || p.k % kGemmBlockK != 0 || p.b_scale_cols < p.k / 32) return false;
  // The producers read a word of four scales per row and K block.
  if (reinterpret_cast<uintptr_t>(p.b_scale) % 4 != 0 || p.b_scale_stride_n % 4 != 0 || p.b_scale_group_stride % 4 != 0)
    return false;
  // The producers index the scales and the scan's exponents with 32-bit word offsets.
  const int64_t groups = grouped ? num_groups : 1;
  if ((groups - 1) * p.b_scale_group_stride + (int64_t{p.n} - 1) * p.b_scale_stride_n + p.k / 32 >= INT32_MAX ||
      groups * ceil_div(p.n, kLeanBlockN) * (p.k / kGemmBlockK) >= INT32_MAX)
    return false;
  const GemmParams q = e4m3_shape(p);
  if (grouped ? !grouped_lean_ok(q, block_m, num_groups, device) : !lean_gemm_ok(q, block_m, device)) return false;
  int max_smem = 0;
  FG_CUDA_CHECK(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  return lean_fp4_smem_bytes(block_m, grouped, p.k / kGemmBlockK) <= max_smem;
}

void launch_sm90_fp4_gemm_lean(const void* a, int64_t lda, const void* b, int64_t ldb, const GemmParams& view,
                               const LeanFp4B& fp4, int device, cudaStream_t stream) {
  auto launch = [&](auto a_scale) {
    constexpr bool kA = decltype(a_scale)::value;
    switch (fp4_lean_expand_for(fp4_lean_expand_mode(), 128, false)) {
      case 3: launch_dense<128, kDenseFp4Stages, kA, 3>(a, lda, b, ldb, view, fp4, device, stream); break;
      case 2: launch_dense<128, kDenseFp4Stages, kA, 2>(a, lda, b, ldb, view, fp4, device, stream); break;
      case 1: launch_dense<128, kDenseFp4Stages, kA, 1>(a, lda, b, ldb, view, fp4, device, stream); break;
      default: launch_dense<128, kDenseFp4Stages, kA, 0>(a, lda, b, ldb, view, fp4, device, stream);
    }
  };
  if (view.a_scale != nullptr) launch(std::true_type{});
  else launch(std::false_type{});
}

void launch_sm90_fp4_grouped_lean(const void* a, int64_t lda, const void* b, int64_t ldb, const GroupedLayout& layout,
                                  const GemmParams& view, const LeanFp4B& fp4, int block_m, int device,
                                  cudaStream_t stream) {
  const int stages = lean_stages(block_m, view.k / kGemmBlockK);
  // The expansion mode per height: 128 rows any; 192 rows batched when batched or split is asked and the call has A
  // scales (without them the batch spilled: 4 bytes of stores, 52 of loads), else serial (split, two producer
  // warpgroups, is 128 rows only); the consumers' expansion at 128 and 192 rows; 256 rows serial.
  auto launch = [&](auto a_scale, auto expand) {
    constexpr bool kA = decltype(a_scale)::value;
    constexpr int kE = decltype(expand)::value;
    constexpr int kE192 = kE == 3 ? 3 : kA && kE >= 1 ? 1 : 0;
    if (block_m == 256) launch_grouped<256, 3, kA, 0>(a, lda, b, ldb, layout, view, fp4, device, stream);
    else if (block_m == 192) launch_grouped<192, 4, kA, kE192>(a, lda, b, ldb, layout, view, fp4, device, stream);
    else if (stages == 5) launch_grouped<128, 5, kA, kE>(a, lda, b, ldb, layout, view, fp4, device, stream);
    else launch_grouped<128, 4, kA, kE>(a, lda, b, ldb, layout, view, fp4, device, stream);
  };
  const int mode = fp4_lean_expand_for(fp4_lean_expand_mode(), block_m, true);
  auto with_mode = [&](auto a_scale) {
    switch (mode) {
      case 3: launch(a_scale, std::integral_constant<int, 3>{}); break;
      case 2: launch(a_scale, std::integral_constant<int, 2>{}); break;
      case 1: launch(a_scale, std::integral_constant<int, 1>{}); break;
      default: launch(a_scale, std::integral_constant<int, 0>{});
    }
  };
  if (view.a_scale != nullptr) with_mode(std::true_type{});
  else with_mode(std::false_type{});
}

int fp4_lean_block_m(bool grouped, int64_t expected_rows_per_group) {
  const char* env = std::getenv("FINEGEMM_FP4_LEAN");
  const std::string v = env ? env : "";
  // Unset: the grouped Store GEMMs from 64 to 255 rows per expert, where it measured faster than the expanded path
  // (stop 39, H200, DeepSeek-V3 layer with FP4 experts: T = 2048 (64 rows per expert) 10917 -> 7866 µs, T = 4096 (128)
  // 11618 -> 8737): at 128 rows below 96 rows per expert (with the consumers' expansion, fp4_lean_expand_for), at 192
  // rows from 96. Stop 49 (H200, event-timed, the layer checked against the CPU reference): T = 2048 7412 µs at 192
  // rows batched, 6417 at 128 rows with the consumers, 7263 at 192 with the consumers; T = 4096 8273 / 9433 / 8396
  // (stop 47 on an H100: 7403 / 6456 at T = 2048, 8490 / 9594 at 4096). Stop 53 (H100, with the issuing thread's B
  // row once per tile): T = 4096 6045-6128 µs at 192 rows batched, 7995-8013 at 128 rows with the consumers,
  // 8109-8152 at 192 with the consumers (FP8 5332-5337). From 256 rows per expert the expansion's cost
  // is shared by more rows and the lean kernel is expected to lose: not measured there. Dense FP4 prefill keeps the
  // expanded path (M = 4096 N = 4096 K = 7168, H200 stop 49: 197.9 µs expanded, 353.3 lean with the consumers).
  if (v.empty()) {
    if (!grouped || expected_rows_per_group < 64 || expected_rows_per_group >= 256) return 0;
    return expected_rows_per_group < 96 ? 128 : 192;
  }
  if (v == "0") return 0;
  if (v != "1" && v != "128" && v != "192" && v != "256")
    throw Error("FINEGEMM_FP4_LEAN: expected 0 (off), 1, 128, 192 or 256 (the grouped tile height), got '" + v + "'");
  if (!grouped) return 128;
  if (v == "1") return expected_rows_per_group >= 96 ? 192 : 128;
  return std::stoi(v);
}

// FINEGEMM_FP4_LEAN_EXPAND: the producers' expansion. "serial": one MX group at a time (the kernel of stop 39), 0;
// unset or "batched": every load of a row's K block first (lean_gemm_body's kExpand 1), 1; "split": two producer
// warpgroups, each thread two groups of a row (kExpand 2; 128-row tiles: with FINEGEMM_FP4_LEAN=1 or 128), 2. Heights
// that cannot take a mode fall back (launch_sm90_fp4_grouped_lean). Batched by default since stop 43 (H200,
// bench/results/stop43_call2_2026-12-05_06500c5.json): the DeepSeek-V3 FP4 layer at T = 4096 (192-row tiles) 8588 µs
// against 8887 serial; dense M = 4096 N = 4096 K = 7168 on the lean FP4 kernel 447.9 against 463.4 serial, 424.3 split;
// split at 128 rows took the layer to 10530. "consumers" (stop 47; the default at 128-row grouped tiles since stop 49,
// fp4_lean_expand_for): the consumer warpgroups expand
// (kExpand 3), each thread of the first two two groups of a row: at 128 rows one stage ahead, while their wgmma run;
// at 192 two stages ahead, after their promotion (256-row tiles keep the serial producers), 3.
int fp4_lean_expand_mode() {
  const char* env = std::getenv("FINEGEMM_FP4_LEAN_EXPAND");
  const std::string v = env ? env : "";
  if (v.empty()) return -1;
  if (v == "serial") return 0;
  if (v == "batched") return 1;
  if (v == "split") return 2;
  if (v == "consumers") return 3;
  throw Error("FINEGEMM_FP4_LEAN_EXPAND: expected serial, batched, split or consumers (who expands the FP4 weights), got '" +
              v + "'");
}

// Unset (-1): the consumers at 128-row grouped tiles (stop 49's default for 64-95 rows per expert, fp4_lean_block_m),
// the batched producers elsewhere.
int fp4_lean_expand_for(int mode, int block_m, bool grouped) {
  if (mode >= 0) return mode;
  return grouped && block_m == 128 ? 3 : 1;
}

int fp4_lean_packed_issuer() {
  const char* env = std::getenv("FINEGEMM_FP4_LEAN_PACKED_ISSUER");
  const std::string v = env ? env : "";
  if (v.empty() || v == "0") return 0;
  if (v == "32") return 32;
  throw Error("FINEGEMM_FP4_LEAN_PACKED_ISSUER: expected 0 (thread 0, the default) or 32 (warp 1's first thread), got '" +
              v + "'");
}

bool fp4_lean_packed_pairs() {
  const char* env = std::getenv("FINEGEMM_FP4_LEAN_PACKED_PAIRS");
  const std::string v = env ? env : "";
  if (v.empty() || v == "0") return false;
  if (v == "1") return true;
  throw Error("FINEGEMM_FP4_LEAN_PACKED_PAIRS: expected 0 (one packed copy per K block, the default) or 1 (one per two "
              "K blocks), got '" + v + "'");
}

int fp4_lean_issuer_share() {
  const char* env = std::getenv("FINEGEMM_FP4_LEAN_ISSUER");
  const std::string v = env ? env : "";
  if (v.empty() || v == "0") return 0;
  if (v == "light") return 1;
  if (v == "rotate") return 2;
  throw Error("FINEGEMM_FP4_LEAN_ISSUER: expected 0 (thread 0 issues every copy and expands a row, the default), light "
              "(its warp expands one MX group per lane) or rotate (the producer warps take turns), got '" + v + "'");
}

long long lean_fp4_issuer_share_launches() { return lean_fp4_issuer_share_count.load(std::memory_order_relaxed); }

long long lean_fp4_packed_pairs_launches() { return lean_fp4_packed_pairs_count.load(std::memory_order_relaxed); }

long long lean_fp4_packed_issuer_launches() { return lean_fp4_packed_issuer_count.load(std::memory_order_relaxed); }

long long lean_fp4_launches() { return lean_fp4_launch_count.load(std::memory_order_relaxed); }

}  // namespace finegemm::cuda
