// Host side of src/cuda/kernels/sm90_fp4_decode.cuh: the FP4-weight decode kernels (M ≤ 64), one per token width.
#include <atomic>

#include "cuda/kernels/sm90_fp4_decode.cuh"
#include "cuda/runtime/gemm_launch.cuh"
#include "cuda/runtime/sm90_fp8_gemm.hpp"

namespace finegemm::cuda {
namespace {

// Stages: 8 K blocks in flight per CTA at WN ≤ 16 (about 50 KB, four CTAs per SM), 6 at 32 and 64.
template <int WN>
constexpr int kFp4DecodeStages = WN <= 16 ? 8 : 6;

template <int WN>
auto fp4_decode_kernel() {
  return sm90_fp4_decode_kernel<WN, kFp4DecodeStages<WN>>;
}

template <int WN>
constexpr int fp4_decode_smem() {
  return Fp4DecodeSmem<WN, kFp4DecodeStages<WN>>::kBytes;
}

// Sets the kernel's shared-memory attribute once per device; returns the CTAs per SM it reaches.
template <int WN>
int prepare_kernel(int device) {
  static std::atomic<int> ctas_per_sm[kMaxDevices] = {};
  const int slot = device < kMaxDevices ? device : 0;
  int ctas = ctas_per_sm[slot].load(std::memory_order_relaxed);
  if (ctas == 0 || device >= kMaxDevices) {
    auto kernel = fp4_decode_kernel<WN>();
    FG_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, fp4_decode_smem<WN>()));
    FG_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, kernel, 160, fp4_decode_smem<WN>()));
    if (ctas <= 0) throw Error(ErrorKind::Runtime, "fp4 decode gemm: no CTA of the kernel fits on an SM");
    ctas_per_sm[slot].store(ctas);
  }
  return ctas;
}

int prepare(int wn, int device) {
  switch (wn) {
    case 8: return prepare_kernel<8>(device);
    case 16: return prepare_kernel<16>(device);
    case 32: return prepare_kernel<32>(device);
    default: return prepare_kernel<64>(device);
  }
}

}  // namespace

int fp4_decode_width(int m) { return m <= 8 ? 8 : (m <= 16 ? 16 : (m <= 32 ? 32 : 64)); }

Fp4DecodeConfig choose_fp4_decode_config(int m, int n, int k, int num_sms, int device) {
  Fp4DecodeConfig c;
  c.wn = fp4_decode_width(m);
  c.tiles = ceil_div(n, kFp4DecodeRows);
  const int num_kb = std::max(1, ceil_div(k, kGemmBlockK));
  // Split K until every SM holds as many CTAs as fit at once (the weights stream from all of them together), keeping
  // at least 4 K blocks per split: each split costs M × N floats of partials.
  const int resident = prepare(c.wn, device) * num_sms;
  int split = std::max(1, resident / c.tiles);
  split = std::min(split, std::max(1, num_kb / 4));
  if (const char* forced = std::getenv("FINEGEMM_FP4_DECODE_SPLIT")) {
    const int v = std::atoi(forced);
    if (v < 1) throw Error(std::string("FINEGEMM_FP4_DECODE_SPLIT: expected a split count >= 1, got '") + forced + "'");
    split = v;
  }
  split = std::min(split, num_kb);
  c.kb_per_split = ceil_div(num_kb, split);
  c.split_k = ceil_div(num_kb, c.kb_per_split);
  c.swizzle = env_switch("FINEGEMM_FP4_DECODE_SWIZZLE", true);
  if (const char* print = std::getenv("FINEGEMM_PRINT_CONFIG"); print && *print == '1')
    std::fprintf(stderr, "finegemm: fp4 decode M=%d N=%d K=%d -> WN=%d tiles=%d split_k=%d kb_per_split=%d swizzle=%d\n", m,
                 n, k, c.wn, c.tiles, c.split_k, c.kb_per_split, c.swizzle ? 1 : 0);
  return c;
}

void launch_sm90_fp4_decode(const void* a, int64_t lda, const void* b, int64_t ldb, const GemmParams& p,
                            const Fp4DecodeConfig& c, cudaStream_t stream) {
  int device = 0;
  FG_CUDA_CHECK(cudaGetDevice(&device));
  prepare(c.wn, device);
  const CUtensorMap tma_x = make_tma_2d(a, p.m, p.k, lda, c.wn);
  const CUtensorMap tma_w = make_tma_2d(b, p.n, p.k / 2, ldb, kFp4DecodeRows, kGemmBlockK / 2, c.swizzle);
  const dim3 grid(c.tiles * c.split_k);
  switch (c.wn) {
    case 8: fp4_decode_kernel<8>()<<<grid, 160, fp4_decode_smem<8>(), stream>>>(tma_x, tma_w, p, c.split_k, c.kb_per_split, c.swizzle); break;
    case 16: fp4_decode_kernel<16>()<<<grid, 160, fp4_decode_smem<16>(), stream>>>(tma_x, tma_w, p, c.split_k, c.kb_per_split, c.swizzle); break;
    case 32: fp4_decode_kernel<32>()<<<grid, 160, fp4_decode_smem<32>(), stream>>>(tma_x, tma_w, p, c.split_k, c.kb_per_split, c.swizzle); break;
    default: fp4_decode_kernel<64>()<<<grid, 160, fp4_decode_smem<64>(), stream>>>(tma_x, tma_w, p, c.split_k, c.kb_per_split, c.swizzle); break;
  }
  FG_CUDA_CHECK(cudaGetLastError());
}

}  // namespace finegemm::cuda
