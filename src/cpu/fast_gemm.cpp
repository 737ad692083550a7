// The CPU fast path's engine (see fast_gemm.hpp): weight tiles dequantized on the fly into fp32 scratch,
// multiplied with OpenBLAS sgemm (when built with it) or with our own micro-kernel.
#include "cpu/fast_gemm.hpp"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/formats.hpp"
#include "cpu/cpu_backend.hpp"
#include "finegemm/error.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define FG_HAVE_AVX512_KERNELS 1
// NOTE: GCC 12's _mm512_undefined_ps (inside _mm512_cvtph_ps, _mm512_reduce_add_ps) trips -Wuninitialized
// once inlined; the value is never read.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
// Only the functions marked with this attribute use AVX-512; the library is built for x86-64-v2 and picks
// these at run time when the CPU has them.
#define FG_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#else
#define FG_HAVE_AVX512_KERNELS 0
#endif

#if FINEGEMM_WITH_BLAS
#include <cblas.h>
// Declared again here so that a generic (non-OpenBLAS) cblas.h on the include path still compiles; the library
// we link is OpenBLAS (CMake asks FindBLAS for that vendor).
extern "C" void openblas_set_num_threads(int num_threads);
extern "C" int openblas_get_num_threads(void);
extern "C" char* openblas_get_corename(void);
#endif

namespace finegemm::cpu::fast {
namespace {

// NOTE: tile sizes measured on 2 Sapphire Rapids cores (bench_cpu_linear): 64 weight rows x 512 K per tile.
constexpr double kParallelMinMacs = 4.0e6;  // below this a gemm runs on the calling thread

// ---- Decode tables.
struct Tables {
  float e4m3[256];
  float e2m1[16];
  Tables() {
    for (int i = 0; i < 256; ++i) e4m3[i] = fmt::e4m3_to_float(static_cast<uint8_t>(i));
    for (int i = 0; i < 16; ++i) e2m1[i] = fmt::e2m1_to_float(static_cast<uint8_t>(i));
  }
};
const Tables& tables() {
  static const Tables t;
  return t;
}

// ---- Kernel choice.
bool cpu_has_avx512() {
#if FG_HAVE_AVX512_KERNELS
  // Every AVX-512 CPU also has F16C (which clang 14's __builtin_cpu_supports cannot name).
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                          __builtin_cpu_supports("fma");
  return has;
#else
  return false;
#endif
}

std::atomic<Kernel> g_kernel{Kernel::Auto};

// Whether OpenBLAS runs its AVX-512 sgemm. NOTE: OpenBLAS 0.3.21 (Debian 12) does not know Emerald Rapids
// (family 6 model 207) and falls back to its Prescott (SSE3) kernels: sgemm at 7-15 GFLOPS on 2 cores instead
// of ~110, slower than our own AVX-512 micro-kernel. OPENBLAS_CORETYPE=SkylakeX fixes it from outside.
bool blas_is_avx512() {
#if FINEGEMM_WITH_BLAS
  static const bool is = [] {
    const char* name = openblas_get_corename();
    if (name == nullptr) return false;
    std::string core(name);
    for (char& c : core) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return core == "skylakex" || core == "cooperlake" || core == "sapphirerapids";
  }();
  return is;
#else
  return false;
#endif
}

// FINEGEMM_CPU_KERNEL=blas|avx512|portable overrides the automatic choice.
Kernel kernel_from_env() {
  static const Kernel k = [] {
    const char* v = std::getenv("FINEGEMM_CPU_KERNEL");
    if (v == nullptr || *v == 0) return Kernel::Auto;
    const std::string s(v);
    for (Kernel c : {Kernel::Blas, Kernel::Avx512, Kernel::Portable})
      if (s == kernel_name(c) || (s == "blas" && c == Kernel::Blas)) {
        if (!kernel_available(c))
          throw Error(ErrorKind::Runtime, "FINEGEMM_CPU_KERNEL: " + s + " is not available on this build/CPU");
        return c;
      }
    throw Error("FINEGEMM_CPU_KERNEL: expected blas, avx512 or portable, got '" + s + "'");
  }();
  return k;
}

// OpenBLAS sgemm on tiles pays for packing both operands on every call: below this many rows of x our
// AVX-512 kernel is as fast or faster.
// NOTE: 1 thread, CPU time, N=2112 K=7168: M=16 OpenBLAS tiles 8.2-13 ms, AVX-512 kernel 6.6 ms, sgemm 9.4 ms;
// M=128 OpenBLAS tiles 37 ms, AVX-512 kernel 40 ms, sgemm 31 ms.
constexpr int64_t kBlasMinRows = 64;
// From this many rows the AVX-512 kernel runs outer products on transposed x (no reductions) instead of
// 4x4 blocks of dot products.
constexpr int64_t kOuterMinRows = 16;

// The kernel for an m-row product: the one a test or FINEGEMM_CPU_KERNEL asked for, else OpenBLAS for large m
// when it runs a kernel as good as the CPU allows, else our AVX-512 micro-kernel, else portable C++.
Kernel resolve_kernel(int64_t m) {
  Kernel k = g_kernel.load(std::memory_order_relaxed);
  if (k != Kernel::Auto) return k;
  k = kernel_from_env();
  if (k != Kernel::Auto) return k;
  const bool avx512 = kernel_available(Kernel::Avx512);
  if (kernel_available(Kernel::Blas) && (!avx512 || (blas_is_avx512() && m >= kBlasMinRows))) return Kernel::Blas;
  if (avx512) return Kernel::Avx512;
  return Kernel::Portable;
}

// Tile shape: weight rows per task (NB) x K columns dequantized at once (KB, a multiple of 32 so that FP4
// bytes and MX groups line up). The scratch tile is NB x KB fp32 (512 KB for OpenBLAS: L2-resident).
// NOTE: 1 thread, M=128 N=2112 K=7168, OpenBLAS tiles: 64x512 43.0 ms, 128x1024 37.5 ms, 256x1024 36.7 ms
// (sgemm 31.6 ms); 128 rather than 256 keeps 2 threads balanced on N=2112 (17 tiles, not 9).
// The AVX-512 kernel measured best at 64x512.
struct TileConfig {
  Kernel kernel;
  int64_t nb, kb;
};
TileConfig choose_tiles(int64_t m, int64_t n, int64_t k) {
  TileConfig c{resolve_kernel(m), 64, 512};
  if (c.kernel == Kernel::Blas) c.nb = 128, c.kb = 1024;
  static const bool print = [] {
    const char* v = std::getenv("FINEGEMM_PRINT_CONFIG");
    return v && *v && std::string(v) != "0";
  }();
  if (print)
    std::fprintf(stderr, "finegemm cpu gemm M=%lld N=%lld K=%lld: kernel %s, tiles %lldx%lld\n",
                 static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k),
                 kernel_name(c.kernel), static_cast<long long>(c.nb), static_cast<long long>(c.kb));
  return c;
}

// ---- Weight scales: one value per (row group, K group).
struct ScaleReader {
  const void* ptr;
  WeightRecipe recipe;
  int64_t row_stride;
  int64_t group_k;  // K columns one scale covers

  float at(int64_t n, int64_t k) const {
    switch (recipe.granularity) {
      case WeightGranularity::PerTensor: return static_cast<const float*>(ptr)[0];
      case WeightGranularity::PerChannel: return static_cast<const float*>(ptr)[n];
      default: break;
    }
    const int64_t row = recipe.granularity == WeightGranularity::Block ? n / recipe.block_n : n;
    const int64_t col = k / group_k;
    switch (recipe.scale_format) {
      case ScaleFormat::FP32: return static_cast<const float*>(ptr)[row * row_stride + col];
      case ScaleFormat::UE8M0: return fmt::ue8m0_to_float(static_cast<const uint8_t*>(ptr)[row * row_stride + col]);
      case ScaleFormat::UE8M0_PACKED:
        return fmt::ue8m0_to_float(
            fmt::ue8m0_unpack(static_cast<const int32_t*>(ptr)[row * row_stride + col / 4], static_cast<int>(col % 4)));
    }
    return NAN;
  }
};

ScaleReader scale_reader(const QuantizedWeight& w) {
  int64_t group_k = w.k;
  if (w.recipe.granularity == WeightGranularity::Block) group_k = w.recipe.block_k;
  if (w.recipe.granularity == WeightGranularity::MX) group_k = 32;
  return {w.scale, w.recipe, w.scale_row_stride, std::max<int64_t>(group_k, 1)};
}

// ---- Decoders: count elements starting at element 0 of src, times scale s, into dst.
void decode_fp8_portable(const uint8_t* src, int64_t count, float s, float* dst) {
  const float* lut = tables().e4m3;
  for (int64_t i = 0; i < count; ++i) dst[i] = lut[src[i]] * s;
}

// src points at the byte holding element 0 (an even element); count is even.
void decode_fp4_portable(const uint8_t* src, int64_t count, float s, float* dst) {
  float lut[16];
  for (int i = 0; i < 16; ++i) lut[i] = tables().e2m1[i] * s;
  for (int64_t i = 0; i < count / 2; ++i) {
    dst[2 * i] = lut[src[i] & 0xF];
    dst[2 * i + 1] = lut[src[i] >> 4];
  }
}

#if FG_HAVE_AVX512_KERNELS
// E4M3 → f16 by moving the bits (exponent bias 7 → the f16 field read with bias 15, so the value is 2^-8 of
// the E4M3 one; subnormals map to f16 subnormals exactly), then vcvtph2ps. NaN codes are patched back in.
FG_AVX512 void decode_fp8_avx512(const uint8_t* src, int64_t count, float s, float* dst) {
  const __m512 scale = _mm512_set1_ps(s * 256.0f);  // the f16 reading is 2^-8 of the E4M3 value
  const __m512 nan = _mm512_set1_ps(NAN);
  const __m256i mag_mask = _mm256_set1_epi16(0x7F);
  const __m256i sign_mask = _mm256_set1_epi16(0x80);
  int64_t i = 0;
  for (; i + 16 <= count; i += 16) {
    const __m256i v = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
    const __m256i mag = _mm256_and_si256(v, mag_mask);
    const __m256i h = _mm256_or_si256(_mm256_slli_epi16(mag, 7), _mm256_slli_epi16(_mm256_and_si256(v, sign_mask), 8));
    __m512 f = _mm512_mul_ps(_mm512_cvtph_ps(h), scale);
    f = _mm512_mask_mov_ps(f, _mm256_cmpeq_epi16_mask(mag, mag_mask), nan);
    _mm512_storeu_ps(dst + i, f);
  }
  if (i < count) decode_fp8_portable(src + i, count - i, s, dst + i);
}

// 16 nibbles (8 bytes) at a time: the 16-entry table (already times the scale) is one register.
FG_AVX512 void decode_fp4_avx512(const uint8_t* src, int64_t count, float s, float* dst) {
  const __m512 lut = _mm512_mul_ps(_mm512_loadu_ps(tables().e2m1), _mm512_set1_ps(s));
  const __m512i shifts = _mm512_set_epi32(4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0);
  const __m512i nibble = _mm512_set1_epi32(0xF);
  int64_t i = 0;
  for (; i + 16 <= count; i += 16) {
    const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(src + i / 2));
    const __m128i twice = _mm_unpacklo_epi8(bytes, bytes);  // b0 b0 b1 b1 ... b7 b7
    const __m512i idx = _mm512_and_si512(_mm512_srlv_epi32(_mm512_cvtepu8_epi32(twice), shifts), nibble);
    _mm512_storeu_ps(dst + i, _mm512_permutexvar_ps(idx, lut));
  }
  if (i < count) decode_fp4_portable(src + i / 2, count - i, s, dst + i);
}
#endif

#if FG_HAVE_AVX512_KERNELS
// One row of F32/BF16/F16 activations as fp32.
FG_AVX512 void load_row_avx512(const void* src, DType dtype, int64_t count, float* dst) {
  int64_t i = 0;
  if (dtype == DType::F32) {
    std::memcpy(dst, src, static_cast<size_t>(count) * 4);
    return;
  }
  const uint16_t* h = static_cast<const uint16_t*>(src);
  for (; i + 16 <= count; i += 16) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(h + i));
    const __m512 f = dtype == DType::BF16 ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16))
                                          : _mm512_cvtph_ps(v);
    _mm512_storeu_ps(dst + i, f);
  }
  for (; i < count; ++i) dst[i] = dtype == DType::BF16 ? fmt::bf16_to_float(h[i]) : fmt::f16_to_float(h[i]);
}

FG_AVX512 float amax_avx512(const float* src, int64_t count) {
  __m512 m = _mm512_setzero_ps();
  const __m512i abs_mask = _mm512_set1_epi32(0x7FFFFFFF);
  int64_t i = 0;
  // max_ps returns its second operand when either is NaN: NaN inputs are skipped, like std::fmax.
  for (; i + 16 <= count; i += 16)
    m = _mm512_max_ps(_mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(_mm512_loadu_ps(src + i)), abs_mask)), m);
  float amax = _mm512_reduce_max_ps(m);
  for (; i < count; ++i) amax = std::fmax(amax, std::fabs(src[i]));
  return amax;
}

// dst = e4m3(src / s) · s, the value fmt::e4m3_from_float then e4m3_to_float give, computed in place of the
// code: round to nearest even at 3 mantissa bits (normals) or at 2^-9 (subnormals), saturate to 448, NaN stays.
FG_AVX512 void quantize_dequantize_avx512(const float* src, int64_t count, float s, float* dst) {
  const __m512 scale = _mm512_set1_ps(s);
  const __m512i abs_mask = _mm512_set1_epi32(0x7FFFFFFF), sign_mask = _mm512_set1_epi32(static_cast<int>(0x80000000u));
  const __m512i half_minus_one = _mm512_set1_epi32(0x7FFFF), one = _mm512_set1_epi32(1);
  const __m512i keep = _mm512_set1_epi32(static_cast<int>(0xFFF00000u));
  const __m512 min_normal = _mm512_set1_ps(0.015625f), max_value = _mm512_set1_ps(fmt::kE4M3Max);
  const __m512 sub_up = _mm512_set1_ps(512.0f), sub_down = _mm512_set1_ps(1.0f / 512.0f);
  const __m512 nan = _mm512_set1_ps(NAN);
  for (int64_t i = 0; i < count; i += 16) {
    const __mmask16 lanes = count - i >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (count - i)) - 1);
    const __m512 v = _mm512_div_ps(_mm512_maskz_loadu_ps(lanes, src + i), scale);
    const __m512i bits = _mm512_castps_si512(v);
    const __m512i abs_bits = _mm512_and_si512(bits, abs_mask);
    const __m512 a = _mm512_castsi512_ps(abs_bits);
    // Normals: add just under half an ulp of the 3-bit mantissa (plus the kept bit: ties to even), truncate.
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(abs_bits, 20), one);
    __m512 r = _mm512_castsi512_ps(_mm512_and_si512(_mm512_add_epi32(abs_bits, _mm512_add_epi32(half_minus_one, lsb)), keep));
    const __m512 sub = _mm512_mul_ps(
        _mm512_roundscale_ps(_mm512_mul_ps(a, sub_up), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), sub_down);
    r = _mm512_mask_mov_ps(r, _mm512_cmp_ps_mask(a, min_normal, _CMP_LT_OQ), sub);
    r = _mm512_mask_mov_ps(r, _mm512_cmp_ps_mask(a, max_value, _CMP_GE_OQ), max_value);
    r = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(r), _mm512_and_si512(bits, sign_mask)));
    r = _mm512_mask_mov_ps(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), nan);
    _mm512_mask_storeu_ps(dst + i, lanes, _mm512_mul_ps(r, scale));
  }
}
#endif

// Rows [n0, n0+nb) x columns [k0, k0+kb) of dequant(w) into tile[r * ld + c].
void dequantize_tile(const QuantizedWeight& w, const ScaleReader& scales, int64_t n0, int64_t nb, int64_t k0,
                     int64_t kb, float* tile, int64_t ld, bool avx512) {
  const bool fp4 = w.recipe.element == ElementType::FP4_E2M1;
  const int64_t row_bytes = fp4 ? w.k / 2 : w.k;
  for (int64_t r = 0; r < nb; ++r) {
    const int64_t n = n0 + r;
    const uint8_t* row = w.data + n * row_bytes;
    float* out = tile + r * ld;
    for (int64_t k = k0; k < k0 + kb;) {
      const int64_t end = std::min(k0 + kb, (k / scales.group_k + 1) * scales.group_k);
      const float s = scales.at(n, k);
#if FG_HAVE_AVX512_KERNELS
      if (avx512) {
        if (fp4) decode_fp4_avx512(row + k / 2, end - k, s, out + (k - k0));
        else decode_fp8_avx512(row + k, end - k, s, out + (k - k0));
        k = end;
        continue;
      }
#endif
      (void)avx512;
      if (fp4) decode_fp4_portable(row + k / 2, end - k, s, out + (k - k0));
      else decode_fp8_portable(row + k, end - k, s, out + (k - k0));
      k = end;
    }
  }
}

// ---- Micro-kernels: acc[i * ldc + j] += Σ_c x[i * lda + c] · tile[j * ldt + c], i < m, j < nb, c < kb.
void tile_gemm_portable(const float* x, int64_t m, int64_t lda, const float* tile, int64_t nb, int64_t kb,
                        int64_t ldt, float* acc, int64_t ldc) {
  constexpr int kLanes = 8;  // independent partial sums, so the compiler can vectorize without reassociating
  for (int64_t i = 0; i < m; ++i) {
    const float* a = x + i * lda;
    for (int64_t j = 0; j < nb; ++j) {
      const float* b = tile + j * ldt;
      float part[kLanes] = {};
      int64_t c = 0;
      for (; c + kLanes <= kb; c += kLanes)
        for (int l = 0; l < kLanes; ++l) part[l] += a[c + l] * b[c + l];
      float sum = 0.0f;
      for (; c < kb; ++c) sum += a[c] * b[c];
      for (int l = 0; l < kLanes; ++l) sum += part[l];
      acc[i * ldc + j] += sum;
    }
  }
}

#if FG_HAVE_AVX512_KERNELS
// A kMR x kNR block of dot products, vectorized along K (16 lanes), reduced once at the end of the panel.
template <int kMR, int kNR>
FG_AVX512 inline void micro_avx512(const float* x, int64_t lda, const float* tile, int64_t ldt, int64_t kb,
                                   float* acc, int64_t ldc) {
  static_assert(kMR >= 1 && kNR >= 1 && kMR * kNR <= 24, "the accumulators must fit in 32 zmm registers");
  __m512 sum[kMR][kNR];
  for (int i = 0; i < kMR; ++i)
    for (int j = 0; j < kNR; ++j) sum[i][j] = _mm512_setzero_ps();
  int64_t c = 0;
  for (; c + 16 <= kb; c += 16) {
    __m512 b[kNR];
    for (int j = 0; j < kNR; ++j) b[j] = _mm512_loadu_ps(tile + j * ldt + c);
    for (int i = 0; i < kMR; ++i) {
      const __m512 a = _mm512_loadu_ps(x + i * lda + c);
      for (int j = 0; j < kNR; ++j) sum[i][j] = _mm512_fmadd_ps(a, b[j], sum[i][j]);
    }
  }
  if (c < kb) {
    const __mmask16 tail = static_cast<__mmask16>((1u << (kb - c)) - 1);
    __m512 b[kNR];
    for (int j = 0; j < kNR; ++j) b[j] = _mm512_maskz_loadu_ps(tail, tile + j * ldt + c);
    for (int i = 0; i < kMR; ++i) {
      const __m512 a = _mm512_maskz_loadu_ps(tail, x + i * lda + c);
      for (int j = 0; j < kNR; ++j) sum[i][j] = _mm512_fmadd_ps(a, b[j], sum[i][j]);
    }
  }
  for (int i = 0; i < kMR; ++i)
    for (int j = 0; j < kNR; ++j) acc[i * ldc + j] += _mm512_reduce_add_ps(sum[i][j]);
}

template <int kMR>
FG_AVX512 void micro_rows_avx512(const float* x, int64_t lda, const float* tile, int64_t nb, int64_t kb, int64_t ldt,
                                 float* acc, int64_t ldc) {
  constexpr int kNR = 4;
  int64_t j = 0;
  for (; j + kNR <= nb; j += kNR) micro_avx512<kMR, kNR>(x, lda, tile + j * ldt, ldt, kb, acc + j, ldc);
  for (; j < nb; ++j) micro_avx512<kMR, 1>(x, lda, tile + j * ldt, ldt, kb, acc + j, ldc);
}

FG_AVX512 void tile_gemm_avx512(const float* x, int64_t m, int64_t lda, const float* tile, int64_t nb, int64_t kb,
                                int64_t ldt, float* acc, int64_t ldc) {
  constexpr int kMR = 4;
  int64_t i = 0;
  for (; i + kMR <= m; i += kMR) micro_rows_avx512<kMR>(x + i * lda, lda, tile, nb, kb, ldt, acc + i * ldc, ldc);
  switch (m - i) {
    case 3: micro_rows_avx512<3>(x + i * lda, lda, tile, nb, kb, ldt, acc + i * ldc, ldc); break;
    case 2: micro_rows_avx512<2>(x + i * lda, lda, tile, nb, kb, ldt, acc + i * ldc, ldc); break;
    case 1: micro_rows_avx512<1>(x + i * lda, lda, tile, nb, kb, ldt, acc + i * ldc, ldc); break;
    default: break;
  }
}

// Many rows: outer products. x is packed transposed and zero-padded to m16 rows (xt[k * m16 + i]), the
// accumulator is transposed too (acct[j * m16 + i]); each k step loads kMV vectors of 16 rows of x and
// broadcasts kNR weights, kMV x kNR FMAs with no reduction at all.
// NOTE: 1 thread, CPU time, N=2112 K=7168: M=128 54 ms with 4x4 dot products, 40 ms with 32x8 outer products
// (OpenBLAS sgemm on fp32 weights 31 ms); M=16 8.2 ms -> 6.6 ms (sgemm 9.4 ms).
template <int kMV, int kNR>
FG_AVX512 inline void outer_avx512(const float* xt, int64_t m16, const float* tile, int64_t ldt, int64_t kb,
                                   float* acct) {
  static_assert(kMV >= 1 && kNR >= 1 && kMV * kNR <= 24, "the accumulators must fit in 32 zmm registers");
  __m512 c[kNR][kMV];
  for (int j = 0; j < kNR; ++j)
    for (int v = 0; v < kMV; ++v) c[j][v] = _mm512_setzero_ps();
  for (int64_t k = 0; k < kb; ++k) {
    __m512 a[kMV];
    for (int v = 0; v < kMV; ++v) a[v] = _mm512_loadu_ps(xt + k * m16 + 16 * v);
    for (int j = 0; j < kNR; ++j) {
      const __m512 b = _mm512_set1_ps(tile[j * ldt + k]);
      for (int v = 0; v < kMV; ++v) c[j][v] = _mm512_fmadd_ps(a[v], b, c[j][v]);
    }
  }
  for (int j = 0; j < kNR; ++j)
    for (int v = 0; v < kMV; ++v) {
      float* dst = acct + j * m16 + 16 * v;
      _mm512_storeu_ps(dst, _mm512_add_ps(_mm512_loadu_ps(dst), c[j][v]));
    }
}

template <int kMV>
FG_AVX512 void outer_cols_avx512(const float* xt, int64_t m16, const float* tile, int64_t nb, int64_t kb, int64_t ldt,
                                 float* acct) {
  constexpr int kNR = 8;
  int64_t j = 0;
  for (; j + kNR <= nb; j += kNR) outer_avx512<kMV, kNR>(xt, m16, tile + j * ldt, ldt, kb, acct + j * m16);
  for (; j < nb; ++j) outer_avx512<kMV, 1>(xt, m16, tile + j * ldt, ldt, kb, acct + j * m16);
}

FG_AVX512 void tile_gemm_outer_avx512(const float* xt, int64_t m16, const float* tile, int64_t nb, int64_t kb,
                                      int64_t ldt, float* acct) {
  int64_t i = 0;
  for (; i + 32 <= m16; i += 32) outer_cols_avx512<2>(xt + i, m16, tile, nb, kb, ldt, acct + i);
  if (i < m16) outer_cols_avx512<1>(xt + i, m16, tile, nb, kb, ldt, acct + i);
}
#endif

void tile_gemm(Kernel kernel, const float* x, int64_t m, int64_t lda, const float* tile, int64_t nb, int64_t kb,
               int64_t ldt, float* acc, int64_t ldc) {
  switch (kernel) {
#if FINEGEMM_WITH_BLAS
    case Kernel::Blas:
      if (m == 1)
        cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(nb), static_cast<int>(kb), 1.0f, tile,
                    static_cast<int>(ldt), x, 1, 1.0f, acc, 1);
      else
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(nb),
                    static_cast<int>(kb), 1.0f, x, static_cast<int>(lda), tile, static_cast<int>(ldt), 1.0f, acc,
                    static_cast<int>(ldc));
      return;
#endif
#if FG_HAVE_AVX512_KERNELS
    case Kernel::Avx512: return tile_gemm_avx512(x, m, lda, tile, nb, kb, ldt, acc, ldc);
#endif
    default: return tile_gemm_portable(x, m, lda, tile, nb, kb, ldt, acc, ldc);
  }
}

#if FINEGEMM_WITH_BLAS
// OpenBLAS (the pthread build) would start its own threads inside each of our OpenMP threads: make it
// single-threaded for the duration of one gemm and put the caller's setting back.
struct BlasSingleThread {
  int saved = 0;
  bool active;
  explicit BlasSingleThread(bool on) : active(on) {
    if (!active) return;
    saved = openblas_get_num_threads();
    if (saved != 1) openblas_set_num_threads(1);
  }
  ~BlasSingleThread() {
    if (active && saved != 1) openblas_set_num_threads(saved);
  }
};
#endif

}  // namespace

void store_row(const Epilogue& ep, int64_t row, int64_t col0, const float* acc, int64_t count) {
  const float* bias = ep.bias ? ep.bias + col0 : nullptr;
  const int64_t offset = row * ep.ld + col0;
  switch (ep.dtype) {
    case DType::F32: {
      float* o = static_cast<float*>(ep.out) + offset;
      for (int64_t j = 0; j < count; ++j) o[j] = acc[j] + (bias ? bias[j] : 0.0f);
      return;
    }
    case DType::BF16: {
      uint16_t* o = static_cast<uint16_t*>(ep.out) + offset;
      for (int64_t j = 0; j < count; ++j) o[j] = fmt::bf16_from_float(acc[j] + (bias ? bias[j] : 0.0f));
      return;
    }
    case DType::F16: {
      uint16_t* o = static_cast<uint16_t*>(ep.out) + offset;
      for (int64_t j = 0; j < count; ++j) o[j] = fmt::f16_from_float(acc[j] + (bias ? bias[j] : 0.0f));
      return;
    }
    default: throw Error(ErrorKind::Runtime, std::string("out: unsupported dtype ") + dtype_name(ep.dtype));
  }
}

void set_kernel(Kernel kernel) {
  if (!kernel_available(kernel))
    throw Error(ErrorKind::Runtime, std::string("kernel: ") + kernel_name(kernel) + " is not available on this build/CPU");
  g_kernel.store(kernel);
}

Kernel active_kernel(int64_t m) { return resolve_kernel(m); }

const char* kernel_name(Kernel kernel) {
  switch (kernel) {
    case Kernel::Auto: return "auto";
    case Kernel::Blas: return "openblas";
    case Kernel::Avx512: return "avx512";
    case Kernel::Portable: return "portable";
  }
  return "?";
}

bool kernel_available(Kernel kernel) {
  switch (kernel) {
    case Kernel::Auto:
    case Kernel::Portable: return true;
    case Kernel::Blas: return FINEGEMM_WITH_BLAS != 0;
    case Kernel::Avx512: return cpu_has_avx512();
  }
  return false;
}

QuantizedWeight quantized_weight(const TensorView& weight, const TensorView& weight_scale, const WeightRecipe& recipe,
                                 int64_t k, int64_t expert) {
  QuantizedWeight w;
  const int lead = expert >= 0 ? 1 : 0;
  w.n = weight.shape[lead];
  w.k = k;
  w.recipe = recipe;
  const int64_t row_bytes = weight_storage_cols(recipe, k);
  w.data = weight.ptr<const uint8_t>() + (expert >= 0 ? expert * w.n * row_bytes : 0);
  const size_t scale_size = dtype_size(weight_scale.dtype);
  const uint8_t* scale = weight_scale.ptr<const uint8_t>();
  switch (recipe.granularity) {
    case WeightGranularity::PerTensor:
      // [] / [1], or [E] / [E, 1]
      w.scale = scale + (expert >= 0 ? expert * weight_scale.strides[0] * scale_size : 0);
      break;
    case WeightGranularity::PerChannel:
      // [n] / [n, 1], or [E, n] / [E, n, 1]
      w.scale = scale + (expert >= 0 ? expert * weight_scale.strides[0] * scale_size : 0);
      break;
    case WeightGranularity::Block:
    case WeightGranularity::MX:
      w.scale = scale + (expert >= 0 ? expert * weight_scale.strides[0] * scale_size : 0);
      w.scale_row_stride = weight_scale.shape[weight_scale.ndim - 1];
      break;
  }
  return w;
}

void gemm(const float* x, int64_t m, int64_t lda, const QuantizedWeight& w, const Epilogue& epilogue) {
  if (m <= 0 || w.n <= 0) return;
  const TileConfig config = choose_tiles(m, w.n, w.k);
  const Kernel kernel = config.kernel;
  const int64_t NB = config.nb, KB = config.kb;
  // The portable kernel also decodes without SIMD: it stands for CPUs without AVX-512 (and tests that path).
  const bool avx512 = kernel != Kernel::Portable && cpu_has_avx512();
  const ScaleReader scales = scale_reader(w);
  const int64_t n_tiles = (w.n + NB - 1) / NB;
#if FINEGEMM_WITH_BLAS
  BlasSingleThread blas_guard(kernel == Kernel::Blas);
#endif

  // NOTE: a parallel region costs 5-20 us, and far more when the cores are shared (a 2-core CI box running
  // tests side by side: the MoE tests ran 8x slower with 2 threads than with 1). Small products stay serial.
  const bool parallel = n_tiles > 1 && static_cast<double>(m) * w.n * w.k >= kParallelMinMacs;

  // Outer-product mode (AVX-512 kernel, many rows): x transposed once for all tiles, zero-padded to m16 rows.
  const bool outer = kernel == Kernel::Avx512 && m >= kOuterMinRows;
  const int64_t m16 = (m + 15) / 16 * 16;
  std::vector<float> xt;
  if (outer) {
    xt.assign(static_cast<size_t>(w.k * m16), 0.0f);
#pragma omp parallel for schedule(static) if (parallel)
    for (int64_t c0 = 0; c0 < w.k; c0 += 64)
      for (int64_t i = 0; i < m; ++i)
        for (int64_t c = c0; c < std::min(c0 + 64, w.k); ++c) xt[c * m16 + i] = x[i * lda + c];
  }

#pragma omp parallel if (parallel)
  {
    std::vector<float> tile(static_cast<size_t>(NB * KB));
    std::vector<float> acc(static_cast<size_t>((outer ? m16 : m) * NB));
    std::vector<float> row(static_cast<size_t>(outer ? NB : 0));
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < n_tiles; ++t) {
      const int64_t n0 = t * NB;
      const int64_t nb = std::min(NB, w.n - n0);
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t k0 = 0; k0 < w.k; k0 += KB) {
        const int64_t kb = std::min(KB, w.k - k0);
        dequantize_tile(w, scales, n0, nb, k0, kb, tile.data(), KB, avx512);
#if FG_HAVE_AVX512_KERNELS
        if (outer) {
          tile_gemm_outer_avx512(xt.data() + k0 * m16, m16, tile.data(), nb, kb, KB, acc.data());
          continue;
        }
#endif
        tile_gemm(kernel, x + k0, m, lda, tile.data(), nb, kb, KB, acc.data(), NB);
      }
      for (int64_t i = 0; i < m; ++i) {
        if (outer) {
          for (int64_t j = 0; j < nb; ++j) row[j] = acc[j * m16 + i];
          store_row(epilogue, i, n0, row.data(), nb);
        } else {
          store_row(epilogue, i, n0, acc.data() + i * NB, nb);
        }
      }
    }
  }
}

std::vector<float> to_float(const TensorView& t, int64_t offset, int64_t count) {
  std::vector<float> v(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    switch (t.dtype) {
      case DType::F32: v[i] = t.ptr<const float>()[offset + i]; break;
      case DType::BF16: v[i] = fmt::bf16_to_float(t.ptr<const uint16_t>()[offset + i]); break;
      case DType::F16: v[i] = fmt::f16_to_float(t.ptr<const uint16_t>()[offset + i]); break;
      default: throw Error(ErrorKind::Type, std::string("to_float: unsupported dtype ") + dtype_name(t.dtype));
    }
  }
  return v;
}

void quantize_dequantize_activations(const TensorView& x, const TensorView& x_scale, const ActivationRecipe& recipe,
                                     std::vector<float>& xf) {
  const int64_t m = x.shape[0], k = x.shape[1];
  xf.resize(static_cast<size_t>(m * k));
  if (m == 0 || k == 0) return;

  // Per-row scale layout: `cols` scales per row, each covering `group` K columns (static: one for all).
  int64_t cols = 1, group = k;
  if (recipe.granularity == ActGranularity::PerTokenGroup) {
    group = recipe.group_size;
    cols = k / group;
  }

  const bool prequantized = x.dtype == DType::F8_E4M3;
  const uint8_t* q = prequantized ? x.ptr<const uint8_t>() : nullptr;
  const float* s = prequantized ? x_scale.ptr<const float>() : nullptr;
  // Pre-quantized group scales: row-major or M-major (validate_linear), read through the strides.
  const bool strided = prequantized && recipe.granularity == ActGranularity::PerTokenGroup;
  const int64_t s_row = strided ? x_scale.strides[0] : cols, s_col = strided ? x_scale.strides[1] : 1;
  const float* lut = tables().e4m3;
  const bool is_static = recipe.is_static();
  const bool avx512 = resolve_kernel(m) != Kernel::Portable && cpu_has_avx512();

  // Row chunks in parallel; rows are independent, so the chunking changes nothing.
  const int threads = omp_get_max_threads();
  const int64_t chunk = std::max<int64_t>(1, (m + 4 * threads - 1) / (4 * threads));
  const int64_t n_chunks = (m + chunk - 1) / chunk;
#pragma omp parallel for schedule(static) if (n_chunks > 1 && m * k >= (1 << 17))
  for (int64_t c = 0; c < n_chunks; ++c) {
    std::vector<float> row(static_cast<size_t>(prequantized ? 0 : k));
    for (int64_t i = c * chunk; i < std::min(m, (c + 1) * chunk); ++i) {
      float* dst_row = xf.data() + i * k;
      if (prequantized) {
        for (int64_t g = 0; g < cols; ++g) {
          const float scale = is_static ? s[0] : s[i * s_row + g * s_col];
          for (int64_t e = g * group; e < (g + 1) * group; ++e) dst_row[e] = lut[q[i * k + e]] * scale;
        }
        continue;
      }
      // The reference's quantizer (reference.cpp, quantize_row), step for step so the FP8 codes and scales
      // are its own bit for bit: s = max(amax, 1e-4) / 448 in float (rounded up to a power of two for pow2
      // recipes), or the static scale; q = e4m3(x / s) with a float division.
#if FG_HAVE_AVX512_KERNELS
      if (avx512) {
        load_row_avx512(x.ptr<const uint8_t>() + i * k * dtype_size(x.dtype), x.dtype, k, row.data());
        for (int64_t g = 0; g < cols; ++g) {
          const float* src = row.data() + g * group;
          float scale = is_static ? x_scale.ptr<const float>()[0] : 0.0f;
          if (!is_static) {
            scale = std::max(amax_avx512(src, group), 1e-4f) / fmt::kE4M3Max;
            if (recipe.pow2_scale) scale = fmt::pow2_ceil(scale);
          }
          quantize_dequantize_avx512(src, group, scale, dst_row + g * group);
        }
        continue;
      }
#endif
      switch (x.dtype) {
        case DType::F32: std::copy_n(x.ptr<const float>() + i * k, k, row.data()); break;
        case DType::BF16:
          for (int64_t e = 0; e < k; ++e) row[e] = fmt::bf16_to_float(x.ptr<const uint16_t>()[i * k + e]);
          break;
        default:
          for (int64_t e = 0; e < k; ++e) row[e] = fmt::f16_to_float(x.ptr<const uint16_t>()[i * k + e]);
          break;
      }
      for (int64_t g = 0; g < cols; ++g) {
        const float* src = row.data() + g * group;
        float scale = is_static ? x_scale.ptr<const float>()[0] : 0.0f;
        if (!is_static) {
          float amax = 0.0f;
          for (int64_t e = 0; e < group; ++e) amax = std::fmax(amax, std::fabs(src[e]));
          scale = std::max(amax, 1e-4f) / fmt::kE4M3Max;
          if (recipe.pow2_scale) scale = fmt::pow2_ceil(scale);
        }
        float* dst = dst_row + g * group;
        for (int64_t e = 0; e < group; ++e) dst[e] = lut[fmt::e4m3_from_float(src[e] / scale)] * scale;
      }
    }
  }
}

}  // namespace finegemm::cpu::fast
