// Host side of src/cuda/kernels/sm90_fp4_decode_ldg.cuh: the FP4 decode kernel whose threads copy their own weights
// (FINEGEMM_FP4_DECODE_LDG=1).
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "cuda/kernels/sm90_fp4_decode_ldg.cuh"
#include "cuda/runtime/gemm_args.hpp"
#include "cuda/runtime/gemm_launch.cuh"
#include "cuda/runtime/sm90_fp8_gemm.hpp"

namespace finegemm::cuda {
namespace {

std::atomic<long long> ldg_launches{0};

// Sets the kernel's shared-memory attribute once per device; returns the CTAs per SM it reaches.
template <int WN>
int ldg_prepare(int device) {
  static std::atomic<int> cached[kMaxDevices] = {};
  const int slot = device < kMaxDevices ? device : 0;
  int ctas = cached[slot].load(std::memory_order_relaxed);
  if (ctas == 0 || device >= kMaxDevices) {
    constexpr int kSmem = Fp4LdgSmem<WN>::kBytes;
    FG_CUDA_CHECK(cudaFuncSetAttribute(sm90_fp4_decode_ldg_kernel<WN>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       kSmem));
    FG_CUDA_CHECK(cudaFuncSetAttribute(sm90_fp4_decode_ldg_kernel<WN, true>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
    FG_CUDA_CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, sm90_fp4_decode_ldg_kernel<WN>, kFp4LdgThreads, kSmem));
    if (ctas <= 0) throw Error(ErrorKind::Runtime, "fp4 decode (ldg): no CTA of the kernel fits on an SM");
    cached[slot].store(ctas);
  }
  return ctas;
}

int ldg_ctas_per_sm(int wn, int device) {
  switch (wn) {
    case 8: return ldg_prepare<8>(device);
    case 16: return ldg_prepare<16>(device);
    case 32: return ldg_prepare<32>(device);
    default: return ldg_prepare<64>(device);
  }
}

template <int WN>
void ldg_launch(const Fp4LdgConfig& c, const uint8_t* x, int64_t lda, const uint8_t* w, int64_t ldw,
                const GemmParams& p, const DecodeGroups& groups, cudaStream_t stream) {
  const bool words16 = reinterpret_cast<uintptr_t>(p.b_scale) % 16 == 0 && p.b_scale_stride_n % 16 == 0 &&
                       p.b_scale_group_stride % 16 == 0;
  const int slots = std::max(1, groups.slots);
  const auto kernel = groups.slots > 0 ? sm90_fp4_decode_ldg_kernel<WN, true> : sm90_fp4_decode_ldg_kernel<WN>;
  launch_programmatic(p.pdl, kernel, slots * c.tiles * c.split_k, kFp4LdgThreads, Fp4LdgSmem<WN>::kBytes, stream, x,
                      lda, w, ldw, p, c.split_k, c.chunks_per_split, words16, groups, c.tiles);
}

}  // namespace

bool fp4_decode_ldg_wanted() { return env_switch("FINEGEMM_FP4_DECODE_LDG", false); }

long long fp4_decode_ldg_launches() { return ldg_launches.load(); }

bool fp4_decode_ldg_ok(const GemmParams& p, const void* a, int64_t lda, const void* b, int64_t ldb, bool grouped) {
  // The permuted kernel's recipes (fp4_decode_perm_ok), with UE8M0 bytes only (packed words and FP32 scales take the
  // permuted kernel) and 16-byte copies of the codes and activations, 4-byte copies of the scales.
  if (!p.a_perm_k || !fp4_decode_perm_ok(p, grouped) || p.m < 1 || p.n < 1) return false;
  if (grouped && (p.b_scale_group_stride % 4 != 0 || (int64_t{p.n} * ldb) % 16 != 0)) return false;
  if (p.b_scale_fmt != ScaleFmt::UE8M0 || p.gate != nullptr || p.b_scale_cols < p.k / 32) return false;
  if (reinterpret_cast<uintptr_t>(a) % 16 != 0 || lda % 16 != 0) return false;
  if (reinterpret_cast<uintptr_t>(b) % 16 != 0 || ldb % 16 != 0) return false;
  if (reinterpret_cast<uintptr_t>(p.b_scale) % 4 != 0 || p.b_scale_stride_n % 4 != 0) return false;
  return p.a_scale == nullptr || reinterpret_cast<uintptr_t>(p.a_scale) % 4 == 0;
}

Fp4LdgConfig choose_fp4_decode_ldg_config(int m, int n, int k, int num_sms, int device, int slots) {
  Fp4LdgConfig c;
  c.wn = fp4_decode_width(m);
  c.tiles = ceil_div(n, kFp4LdgRows);
  const int chunks = std::max(1, ceil_div(k, 128 * kFp4LdgBlocks));
  // One wave: as many CTAs as are resident at once (each streams its weights from the first chunk; a second wave
  // would start late), at least one chunk (512 of K) per split. Grouped: over the expert slots' tiles.
  const int resident = std::max(1, ldg_ctas_per_sm(c.wn, device) * num_sms);
  int split = std::max(1, resident / (c.tiles * std::max(1, slots)));
  if (const char* forced = std::getenv("FINEGEMM_FP4_DECODE_SPLIT"); forced && *forced) {
    const int v = std::atoi(forced);
    if (v < 1) throw Error(std::string("FINEGEMM_FP4_DECODE_SPLIT: expected a split count >= 1, got '") + forced + "'");
    split = v;
  }
  split = std::min(split, chunks);
  c.chunks_per_split = ceil_div(chunks, split);
  c.split_k = ceil_div(chunks, c.chunks_per_split);
  if (const char* print = std::getenv("FINEGEMM_PRINT_CONFIG"); print && *print == '1')
    std::fprintf(stderr, "finegemm: fp4 decode (ldg) M=%d N=%d K=%d slots=%d -> WN=%d tiles=%d split_k=%d "
                 "chunks_per_split=%d\n", m, n, k, slots, c.wn, c.tiles, c.split_k, c.chunks_per_split);
  return c;
}

void launch_sm90_fp4_decode_ldg(const void* a, int64_t lda, const void* b, int64_t ldb, const GemmParams& p,
                                const Fp4LdgConfig& c, cudaStream_t stream, const DecodeGroups& groups) {
  if (c.split_k > 1 && p.workspace == nullptr) throw Error("fp4 decode (ldg): a split launch needs the workspace");
  int device = 0;
  FG_CUDA_CHECK(cudaGetDevice(&device));
  ldg_ctas_per_sm(c.wn, device);  // the shared-memory attribute, set once per device
  const auto* x = static_cast<const uint8_t*>(a);
  const auto* w = static_cast<const uint8_t*>(b);
  switch (c.wn) {
    case 8: ldg_launch<8>(c, x, lda, w, ldb, p, groups, stream); break;
    case 16: ldg_launch<16>(c, x, lda, w, ldb, p, groups, stream); break;
    case 32: ldg_launch<32>(c, x, lda, w, ldb, p, groups, stream); break;
    default: ldg_launch<64>(c, x, lda, w, ldb, p, groups, stream); break;
  }
  FG_CUDA_CHECK(cudaGetLastError());
  ++ldg_launches;
}

}  // namespace finegemm::cuda
