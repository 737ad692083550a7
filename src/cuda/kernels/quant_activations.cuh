// Activation quantization: F32/BF16/F16 → E4M3, with scales in the layout the GEMM reads ([M, K/group] row-major).
//
// Bandwidth-bound, and at H200 bandwidth close to issue-bound too: a thread moves vectors of 8 elements with 16-byte
// (BF16/F16) or 2×16-byte (F32) streaming loads, issued all before the first use. What keeps it fast:
//  - No division per element. The reference computes q = e4m3(x / s) with an IEEE division (about ten instructions
//    and a branch each). Here each scale gives two floats lo ≤ 1/s ≤ hi, and a vector's codes are e4m3(x·lo); they
//    are provably the codes of x / s whenever e4m3(x·lo) == e4m3(x·hi) (quantize8_fast says why). Power-of-two
//    scales have lo = hi = 1/s exactly. The few vectors near an E4M3 rounding boundary, NaN inputs and scales out of
//    range take the exact division (quantize8): either way the bytes are those of x / s, the CPU reference's.
//  - Group kernel: grid-stride over the tensor with a resident grid; each thread holds 2 vectors of one group, the
//    group's vectors kLanes apart so that each load instruction of a warp reads whole 32-byte sectors.
//  - Per-token kernel: one pass. A row's threads hold the whole row in registers (up to kTokenVecs vectors each,
//    K ≤ 32768), reduce the row maximum, and quantize from registers; longer rows take a two-pass fallback.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "cuda/kernels/fp4_expand.hpp"

namespace finegemm::cuda {

inline constexpr float kE4M3MaxF = 448.0f;
inline constexpr float kMinAmax = 1e-4f;
inline constexpr int kQuantThreads = 256;  // group and static kernels
inline constexpr int kTokenVecs = 4;       // per-token kernel: vectors of 8 elements each thread holds
inline constexpr int kTokenMaxThreads = 1024;

// 16 bytes from memory read once: not kept in L1; the L2 fetches the surrounding 256 bytes at once.
__device__ __forceinline__ uint4 load_streaming(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

template <typename T>
struct Vec8;
template <>
struct Vec8<float> {
  uint4 lo, hi;
  __device__ __forceinline__ void load(const float* p) {
    lo = reinterpret_cast<const uint4*>(p)[0];
    hi = reinterpret_cast<const uint4*>(p)[1];
  }
  __device__ __forceinline__ void load_streaming(const float* p) {
    lo = cuda::load_streaming(p);
    hi = cuda::load_streaming(p + 4);
  }
  __device__ __forceinline__ void zero() { lo = hi = make_uint4(0, 0, 0, 0); }
  __device__ __forceinline__ void to_float(float (&v)[8]) const {
    const uint32_t w[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = __uint_as_float(w[i]);
  }
  // max(amax, |v[0]|, ..., |v[7]|), NaN ignored as fmaxf does.
  __device__ __forceinline__ float max_abs(float amax) const {
    float v[8];
    to_float(v);
#pragma unroll
    for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(v[i]));
    return amax;
  }
};
template <>
struct Vec8<__nv_bfloat16> {
  uint4 raw;
  __device__ __forceinline__ void load(const __nv_bfloat16* p) { raw = *reinterpret_cast<const uint4*>(p); }
  __device__ __forceinline__ void load_streaming(const __nv_bfloat16* p) { raw = cuda::load_streaming(p); }
  __device__ __forceinline__ void zero() { raw = make_uint4(0, 0, 0, 0); }
  // A BF16 is the top half of the float it widens to: one shift or mask per element.
  __device__ __forceinline__ void to_float(float (&v)[8]) const {
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      v[2 * i] = __uint_as_float(w[i] << 16);
      v[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
    }
  }
  // max(amax, |v[0]|, ..., |v[7]|) on the packed pairs (exact; __hmax2 ignores NaN as fmaxf does). Not widening
  // first keeps the per-token kernel from holding a widened copy of its row.
  __device__ __forceinline__ float max_abs(float amax) const {
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
    __nv_bfloat162 m = __habs2(h[0]);
#pragma unroll
    for (int i = 1; i < 4; ++i) m = __hmax2(m, __habs2(h[i]));
    const float2 f = __bfloat1622float2(m);
    return fmaxf(amax, fmaxf(f.x, f.y));
  }
};
template <>
struct Vec8<__half> {
  uint4 raw;
  __device__ __forceinline__ void load(const __half* p) { raw = *reinterpret_cast<const uint4*>(p); }
  __device__ __forceinline__ void load_streaming(const __half* p) { raw = cuda::load_streaming(p); }
  __device__ __forceinline__ void zero() { raw = make_uint4(0, 0, 0, 0); }
  __device__ __forceinline__ void to_float(float (&v)[8]) const {
    const __half2* h = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __half22float2(h[i]);
      v[2 * i] = f.x;
      v[2 * i + 1] = f.y;
    }
  }
  // As Vec8<__nv_bfloat16>::max_abs.
  __device__ __forceinline__ float max_abs(float amax) const {
    const __half2* h = reinterpret_cast<const __half2*>(&raw);
    __half2 m = __habs2(h[0]);
#pragma unroll
    for (int i = 1; i < 4; ++i) m = __hmax2(m, __habs2(h[i]));
    const float2 f = __half22float2(m);
    return fmaxf(amax, fmaxf(f.x, f.y));
  }
};

// Smallest power of two ≥ s (UE8M0 scales) for positive s, at most 2^127 (UE8M0's largest, byte 254): s = inf
// (a group holding an infinity) gives 2^127, as fmt::pow2_ceil does.
__device__ __forceinline__ float pow2_ceil_device(float s) {
  uint32_t b = __float_as_uint(s);
  if (b & 0x7FFFFFu) b = (b & 0xFF800000u) + 0x800000u;
  return __uint_as_float(min(b & 0xFF800000u, 0x7F000000u));
}

// The dynamic scale of a group (or row) with maximum magnitude amax, exactly as the CPU reference makes it.
__device__ __forceinline__ float dynamic_scale(float amax, bool pow2) {
  const float s = fmaxf(amax, kMinAmax) / kE4M3MaxF;
  return pow2 ? pow2_ceil_device(s) : s;
}

// Eight values / s → eight E4M3 bytes (round to nearest even, saturating; NaN stays NaN). The definition: every
// other path must give these bytes.
__device__ __forceinline__ uint2 quantize8(const float (&v)[8], float s) {
  uint32_t words[2];
#pragma unroll
  for (int w = 0; w < 2; ++w) {
    uint32_t word = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const __nv_fp8_storage_t q = __nv_cvt_float_to_fp8(v[w * 4 + i] / s, __NV_SATFINITE, __NV_E4M3);
      word |= static_cast<uint32_t>(q) << (8 * i);
    }
    words[w] = word;
  }
  return make_uint2(words[0], words[1]);
}

// The reciprocal r = RN(1/s) for quantize8_fast, or NaN where it does not apply (then every code is NaN and
// quantize8_fast sends every vector to the exact division):
//  - power-of-two s (kExact) in [2^-125, 2^125]: 1/s is a float, and x·r = x/s exactly;
//  - any other s in [2^-90, 2^125] (see quantize8_fast for the lower end);
//  - anything else (0, inf, NaN, a static scale beyond the range).
template <bool kExact>
__device__ __forceinline__ float reciprocal_of_scale(float s) {
  const bool in_range = s >= (kExact ? 0x1p-125f : 0x1p-90f) && s <= 0x1p125f;  // false for NaN
  return in_range ? 1.0f / s : __uint_as_float(0x7FFFFFFFu);
}

// Four floats → four E4M3 bytes (byte i = value i), the conversion quantize8 uses.
__device__ __forceinline__ uint32_t e4m3x4(float a, float b, float c, float d) {
  const uint32_t low = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
  const uint32_t high = __nv_cvt_float2_to_fp8x2(make_float2(c, d), __NV_SATFINITE, __NV_E4M3);
  return low | (high << 16);
}

// RN(x / s) without a division, for r = reciprocal_of_scale(s) (Markstein's correction): q0 = RN(x·r) lies within
// an ulp of x/s, the residual e = x − q0·s is exact (one fma), and RN(q0 + e·r) = RN(x/s). What it needs: r the
// correctly rounded 1/s, and an exact residual, i.e. no underflow in it: for s ≥ 2^-90 that holds wherever
// |x/s| ≥ 2^-12; below, the result stays within a few ulps of x/s, far under E4M3's smallest rounding boundary
// (2^-10), so the code (±0) is the same. Overflow of x·r (|x/s| near 2^128) or an infinite or NaN x gives NaN.
// NOTE: the first fast path multiplied by bounds lo ≤ 1/s ≤ hi and kept codes equal at both ends: bf16 inputs put
// x/s exactly on an E4M3 rounding boundary (a tie) for ~0.5% of the values, which sent ~4% of the vectors (most
// warps) to the division: group 32 and per-token quantization ran at 0.73-0.78 of the copy bandwidth.
template <bool kExact>
__device__ __forceinline__ float quotient(float x, float s, float r) {
  const float q0 = x * r;
  if constexpr (kExact) return q0;
  // The sign of x/s is that of x (and of q0, zeros included); copysign keeps it where the correction of a zero
  // would not: x = -0 gives e = +0 and +0 + (-0) = +0, where x / s is -0 (code 0x80).
  return copysignf(fmaf(fmaf(-q0, s, x), r, q0), x);
}

// Division-free quantization of eight values: true when `codes` are exactly quantize8(v, s); false (codes unusable)
// when the caller must take quantize8. The quotients are exact (see quotient), so the codes are those of x / s; a
// NaN code (0x7F/0xFF, the only bytes whose low seven bits are all set: finite and infinite values saturate to at
// most 0x7E) marks a NaN or infinite input, an overflow, or an unusable scale: that vector takes the division.
// tests/test_quant_fast_path.cpp runs this on the host against x / s: every boundary and its neighbours, every float
// over the E4M3 range of three scales, every bf16 over a sweep of dynamic scales, random bits.
template <bool kExact>
__device__ __forceinline__ bool quantize8_fast(const float (&v)[8], float s, float r, uint2& codes) {
  float q[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) q[i] = quotient<kExact>(v[i], s, r);
  const uint32_t c0 = e4m3x4(q[0], q[1], q[2], q[3]);
  const uint32_t c1 = e4m3x4(q[4], q[5], q[6], q[7]);
  // Adding 1 to each byte's low seven bits carries into its bit 7 exactly when they were all set (a NaN code).
  const uint32_t nan = (((c0 & 0x7F7F7F7Fu) + 0x01010101u) | ((c1 & 0x7F7F7F7Fu) + 0x01010101u)) & 0x80808080u;
  codes = make_uint2(c0, c1);
  return nan == 0;
}

// The codes of eight values for scale s (r = reciprocal_of_scale(s)): the fast path, or the exact division when it
// declines.
template <bool kExact>
__device__ __forceinline__ uint2 quantize8_by_reciprocal(const float (&v)[8], float s, float r) {
  uint2 codes;
  if (!quantize8_fast<kExact>(v, s, r, codes)) codes = quantize8(v, s);
  return codes;
}

// The codes of vector `vec` (elements 8·vec..8·vec+7 of the flat [M, K] x_q) into x_q: in K order, or (kPermK) in
// the order of the FP4 decode kernel on permuted activations (GemmParams::a_perm_k: each 128 of K permuted,
// fp4_perm_vector_offset; K % 128 == 0, so blocks never straddle rows).
// (The index keeps its caller's type: the group kernel's 32-bit indices hold its registers down.)
template <bool kPermK, typename Index>
__device__ __forceinline__ void store_codes(uint8_t* x_q, Index vec, uint2 codes) {
  if constexpr (kPermK) {
    // The block's start by pointer arithmetic (as the plain store's), not an int byte offset that could overflow.
    uint8_t* at = reinterpret_cast<uint8_t*>(reinterpret_cast<uint2*>(x_q) + (vec & ~Index{15})) +
                  fp4_perm_vector_offset(static_cast<int>(vec & 15));
    *reinterpret_cast<uint32_t*>(at) = codes.x;
    *reinterpret_cast<uint32_t*>(at + 16) = codes.y;
  } else {
    reinterpret_cast<uint2*>(x_q)[vec] = codes;
  }
}

// Dynamic per-(row, group) scales, kPow2: rounded up to powers of two. Grid-stride over chunks of 2·blockDim
// vectors (a resident grid: the host sizes it to fill the GPU once). In a chunk, a group of G elements (G/8
// vectors) belongs to kLanes = G/16 consecutive lanes; lane j holds the group's vectors j and j + kLanes, so each of
// a warp's two loads covers whole 32-byte sectors. Both loads are issued before the first use.
// NOTE: a single 16-byte load per thread left group-128 at 75% of the copy bandwidth; 4 vectors per thread (32
// floats held) measured 0.70.
// Every quantization kernel lets a kernel launched after it with programmatic stream serialization (the decode GEMM
// under FINEGEMM_PDL=1) start at once: that kernel waits (griddepcontrol.wait) for this one to complete before it
// reads the activations; without such a launch this is a no-op.
__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cudaTriggerProgrammaticLaunchCompletion();
#endif
}

// A kernel launched with programmatic stream serialization may start before the kernel ahead of it in the stream has
// completed: it waits here (griddepcontrol.wait) before it reads that kernel's outputs or writes anything an earlier
// kernel may still read. A no-op for a kernel launched the ordinary way.
__device__ __forceinline__ void wait_for_prior_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cudaGridDependencySynchronize();
#endif
}

// scale_ld > 0: the scales M-major, scale (row, group) at group · scale_ld + row, with `scale_cols` groups per row (the
// layout the GEMM's bulk scale copies read, GemmParams::a_scale_bulk), rows M..scale_ld-1 set to 1; 0: row-major
// [M, K / kGroup].
template <typename T, int kGroup, bool kPow2, bool kPermK = false>
__global__ void __launch_bounds__(kQuantThreads, 8) quant_per_token_group_kernel(const T* __restrict__ x,
                                                                                 uint8_t* __restrict__ x_q,
                                                                                 float* __restrict__ x_scale,
                                                                                 int num_vectors, int scale_cols = 0,
                                                                                 int scale_ld = 0) {
  allow_dependent_launch();
  static_assert(kGroup == 32 || kGroup == 64 || kGroup == 128, "kGroup: 32, 64 or 128");
  constexpr int kLanes = kGroup / 16;
  const int lane_in_group = threadIdx.x % kLanes;
  const int offset = (threadIdx.x / kLanes) * (2 * kLanes) + lane_in_group;  // vector 0's place in a chunk
  const int chunk = 2 * blockDim.x;
  // NOTE: 32-bit indices (the host splits larger tensors): 64-bit ones took the registers past 32 (8 blocks/SM).
  for (int base = blockIdx.x * chunk; base < num_vectors; base += gridDim.x * chunk) {
    const int vec0 = base + offset, vec1 = vec0 + kLanes;
    // K % G == 0, so a group lies wholly before or wholly past the end; every lane still joins the shuffles.
    const bool valid = vec0 < num_vectors;
    Vec8<T> in[2];
    if (valid) {
      in[0].load_streaming(x + static_cast<int64_t>(vec0) * 8);
      in[1].load_streaming(x + static_cast<int64_t>(vec1) * 8);
    } else {
      in[0].zero();
      in[1].zero();
    }
    float v[2][8];
    in[0].to_float(v[0]);
    in[1].to_float(v[1]);
    // The group's maximum magnitude: the lane's 16 values, then across the group's lanes.
    float amax = 0.0f;
#pragma unroll
    for (int u = 0; u < 2; ++u)
#pragma unroll
      for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(v[u][i]));
#pragma unroll
    for (int lanes = kLanes / 2; lanes > 0; lanes /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, lanes));
    if (valid) {
      const float s = dynamic_scale(amax, kPow2);
      const float r = reciprocal_of_scale<kPow2>(s);
      store_codes<kPermK>(x_q, vec0, quantize8_by_reciprocal<kPow2>(v[0], s, r));
      store_codes<kPermK>(x_q, vec1, quantize8_by_reciprocal<kPow2>(v[1], s, r));
      if (lane_in_group == 0) {
        const int flat = vec0 / (kGroup / 8);  // row · scale_cols + group
        if (scale_ld > 0) {
          const int row = flat / scale_cols, g = flat - row * scale_cols;
          x_scale[g * scale_ld + row] = s;
          // The last row also fills the padding rows up to scale_ld (the GEMM's bulk copies read them; their
          // products are never stored), so that no copy reads uninitialized memory.
          const int rows = num_vectors / (kGroup / 8) / scale_cols;
          if (row == rows - 1)
            for (int r = rows; r < scale_ld; ++r) x_scale[g * scale_ld + r] = 1.0f;
        } else {
          x_scale[flat] = s;
        }
      }
    }
  }
}

// Dynamic per-row scale, one pass. A row belongs to threads_per_row threads: a power of two up to 32 (several rows
// per block, reduced with shuffles) or the whole block (a multiple of 32; shuffles, then shared memory). Lane j
// holds the row's vectors j, j + threads_per_row, ... (at most kTokenVecs), loaded before the first use, so a row
// costs one trip to memory; the host launches this for K ≤ 8·kTokenVecs·kTokenMaxThreads.
template <typename T, bool kPow2, bool kPermK = false>
__global__ void __launch_bounds__(kTokenMaxThreads) quant_per_token_kernel(const T* __restrict__ x,
                                                                           uint8_t* __restrict__ x_q,
                                                                           float* __restrict__ x_scale, int64_t m,
                                                                           int k, int threads_per_row) {
  allow_dependent_launch();
  const int vecs = k / 8;
  const int lane = threadIdx.x % threads_per_row;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / threads_per_row) + threadIdx.x / threads_per_row;
  const bool row_valid = row < m;
  const T* xr = x + row * k;
  Vec8<T> in[kTokenVecs];
#pragma unroll
  for (int j = 0; j < kTokenVecs; ++j) {
    const int i = lane + j * threads_per_row;
    if (row_valid && i < vecs) in[j].load_streaming(xr + i * 8);
    else in[j].zero();  // zeros leave the maximum as it is
  }
  float amax = 0.0f;
#pragma unroll
  for (int j = 0; j < kTokenVecs; ++j) amax = in[j].max_abs(amax);
  // The row's maximum: within the warp, then (a row per block) across the block's warps.
  for (int lanes = min(threads_per_row, 32) / 2; lanes > 0; lanes /= 2)
    amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, lanes));
  if (threads_per_row > 32) {
    __shared__ float warp_max[kTokenMaxThreads / 32];
    if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = amax;
    __syncthreads();
    amax = warp_max[0];
    for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w) amax = fmaxf(amax, warp_max[w]);
  }
  if (!row_valid) return;
  const float s = dynamic_scale(amax, kPow2);
  const float r = reciprocal_of_scale<kPow2>(s);
  uint8_t* qr = x_q + row * k;
#pragma unroll
  for (int j = 0; j < kTokenVecs; ++j) {
    const int i = lane + j * threads_per_row;
    if (i < vecs) {
      float v[8];
      in[j].to_float(v);
      store_codes<kPermK>(qr, i, quantize8_by_reciprocal<kPow2>(v, s, r));
    }
  }
  if (lane == 0) x_scale[row] = s;
}

// Dynamic per-row scale for rows too long to hold (K > 8·kTokenVecs·kTokenMaxThreads): one block per row, two
// passes over the row (the second mostly from L2).
template <typename T, bool kPow2, bool kPermK = false>
__global__ void quant_per_token_two_pass_kernel(const T* __restrict__ x, uint8_t* __restrict__ x_q,
                                                float* __restrict__ x_scale, int k) {
  allow_dependent_launch();
  const int64_t row = blockIdx.x;
  const T* xr = x + row * k;
  const int vecs = k / 8;
  float amax = 0.0f;
  for (int i = threadIdx.x; i < vecs; i += blockDim.x) {
    Vec8<T> in;
    in.load_streaming(xr + i * 8);
    float v[8];
    in.to_float(v);
#pragma unroll
    for (int j = 0; j < 8; ++j) amax = fmaxf(amax, fabsf(v[j]));
  }
  __shared__ float warp_max[32];
#pragma unroll
  for (int lanes = 16; lanes > 0; lanes /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, lanes));
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = amax;
  __syncthreads();
  amax = 0.0f;
  for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) amax = fmaxf(amax, warp_max[w]);
  const float s = dynamic_scale(amax, kPow2);
  const float r = reciprocal_of_scale<kPow2>(s);
  for (int i = threadIdx.x; i < vecs; i += blockDim.x) {
    Vec8<T> in;
    in.load(xr + i * 8);
    float v[8];
    in.to_float(v);
    store_codes<kPermK>(x_q + row * k, i, quantize8_by_reciprocal<kPow2>(v, s, r));
  }
  if (threadIdx.x == 0) x_scale[row] = s;
}

// Static per-tensor scale from the checkpoint (a device scalar): q = sat(x / s). Grid-stride (a resident grid)
// over chunks of 2·blockDim vectors, two per thread, blockDim apart, both loaded before the first use.
template <typename T, bool kPermK = false>
__global__ void __launch_bounds__(kQuantThreads, 8) quant_static_kernel(const T* __restrict__ x,
                                                                        uint8_t* __restrict__ x_q,
                                                                        const float* __restrict__ scale,
                                                                        int num_vectors) {
  allow_dependent_launch();
  const float s = *scale;
  const float r = reciprocal_of_scale<false>(s);
  const int chunk = 2 * blockDim.x;
  for (int vec0 = blockIdx.x * chunk + threadIdx.x; vec0 < num_vectors; vec0 += gridDim.x * chunk) {
    const int vec1 = vec0 + blockDim.x;
    const bool second = vec1 < num_vectors;
    Vec8<T> in[2];
    in[0].load_streaming(x + static_cast<int64_t>(vec0) * 8);
    if (second) in[1].load_streaming(x + static_cast<int64_t>(vec1) * 8);
    else in[1].zero();
    float v[2][8];
    in[0].to_float(v[0]);
    in[1].to_float(v[1]);
    store_codes<kPermK>(x_q, vec0, quantize8_by_reciprocal<false>(v[0], s, r));
    if (second) store_codes<kPermK>(x_q, vec1, quantize8_by_reciprocal<false>(v[1], s, r));
  }
}

}  // namespace finegemm::cuda
