// Activation quantization: F32/BF16/F16 → E4M3, with scales in the layout the GEMM reads ([M, K/group] row-major).
// Bandwidth-bound: every thread moves 8 elements with 16-byte (BF16/F16) or 2×16-byte (F32) accesses.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace finegemm::cuda {

inline constexpr float kE4M3MaxF = 448.0f;
inline constexpr float kMinAmax = 1e-4f;

template <typename T>
struct Vec8;
template <>
struct Vec8<float> {
  float4 lo, hi;
  __device__ __forceinline__ void load(const float* p) {
    lo = reinterpret_cast<const float4*>(p)[0];
    hi = reinterpret_cast<const float4*>(p)[1];
  }
  __device__ __forceinline__ void to_float(float (&v)[8]) const {
    v[0] = lo.x; v[1] = lo.y; v[2] = lo.z; v[3] = lo.w; v[4] = hi.x; v[5] = hi.y; v[6] = hi.z; v[7] = hi.w;
  }
};
template <>
struct Vec8<__nv_bfloat16> {
  uint4 raw;
  __device__ __forceinline__ void load(const __nv_bfloat16* p) { raw = *reinterpret_cast<const uint4*>(p); }
  __device__ __forceinline__ void to_float(float (&v)[8]) const {
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __bfloat1622float2(h[i]);
      v[2 * i] = f.x;
      v[2 * i + 1] = f.y;
    }
  }
};
template <>
struct Vec8<__half> {
  uint4 raw;
  __device__ __forceinline__ void load(const __half* p) { raw = *reinterpret_cast<const uint4*>(p); }
  __device__ __forceinline__ void to_float(float (&v)[8]) const {
    const __half2* h = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __half22float2(h[i]);
      v[2 * i] = f.x;
      v[2 * i + 1] = f.y;
    }
  }
};

// Smallest power of two ≥ s (UE8M0 scales), for positive finite s.
__device__ __forceinline__ float pow2_ceil_device(float s) {
  uint32_t b = __float_as_uint(s);
  if (b & 0x7FFFFFu) b = (b & 0xFF800000u) + 0x800000u;
  return __uint_as_float(b & 0xFF800000u);
}

// Eight values / s → eight E4M3 bytes (round to nearest even, saturating; NaN stays NaN).
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

// Dynamic per-(row, group) scales. One thread: kVecs vectors of 8 elements, blockDim.x vectors apart, all loaded
// before the first reduction (bytes in flight: one 16-byte load per thread left group-128 at 75% of the copy
// bandwidth); a group of G elements: G/8 consecutive lanes.
template <typename T, int kGroup, int kVecs = 2>
__global__ void quant_per_token_group_kernel(const T* __restrict__ x, uint8_t* __restrict__ x_q,
                                             float* __restrict__ x_scale, int64_t num_vectors, bool pow2) {
  static_assert(kGroup == 32 || kGroup == 64 || kGroup == 128, "kGroup: 32, 64 or 128");
  constexpr int kLanes = kGroup / 8;
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) * kVecs + threadIdx.x;
  float v[kVecs][8];
#pragma unroll
  for (int u = 0; u < kVecs; ++u) {
    const int64_t vec = first + static_cast<int64_t>(u) * blockDim.x;
#pragma unroll
    for (int i = 0; i < 8; ++i) v[u][i] = 0.0f;
    if (vec < num_vectors) {
      Vec8<T> in;
      in.load(x + vec * 8);
      in.to_float(v[u]);
    }
  }
#pragma unroll
  for (int u = 0; u < kVecs; ++u) {
    const int64_t vec = first + static_cast<int64_t>(u) * blockDim.x;
    // Threads past the end still join the shuffles (whole groups are never split: blockDim is a multiple of kLanes).
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(v[u][i]));
#pragma unroll
    for (int offset = kLanes / 2; offset > 0; offset /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, offset));
    float s = fmaxf(amax, kMinAmax) / kE4M3MaxF;
    if (pow2) s = pow2_ceil_device(s);
    if (vec < num_vectors) {
      reinterpret_cast<uint2*>(x_q)[vec] = quantize8(v[u], s);
      if (threadIdx.x % kLanes == 0) x_scale[vec / kLanes] = s;
    }
  }
}

// Dynamic per-row scale: one block per row, two passes over the row (the second hits L1/L2).
template <typename T>
__global__ void quant_per_token_kernel(const T* __restrict__ x, uint8_t* __restrict__ x_q, float* __restrict__ x_scale,
                                       int k, bool pow2) {
  const int64_t row = blockIdx.x;
  const T* xr = x + row * k;
  const int vecs = k / 8;
  float amax = 0.0f;
  for (int i = threadIdx.x; i < vecs; i += blockDim.x) {
    Vec8<T> in;
    in.load(xr + i * 8);
    float v[8];
    in.to_float(v);
#pragma unroll
    for (int j = 0; j < 8; ++j) amax = fmaxf(amax, fabsf(v[j]));
  }
  __shared__ float warp_max[32];
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, offset));
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = amax;
  __syncthreads();
  amax = 0.0f;
  for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) amax = fmaxf(amax, warp_max[w]);
  float s = fmaxf(amax, kMinAmax) / kE4M3MaxF;
  if (pow2) s = pow2_ceil_device(s);
  for (int i = threadIdx.x; i < vecs; i += blockDim.x) {
    Vec8<T> in;
    in.load(xr + i * 8);
    float v[8];
    in.to_float(v);
    reinterpret_cast<uint2*>(x_q + row * k)[i] = quantize8(v, s);
  }
  if (threadIdx.x == 0) x_scale[row] = s;
}

// Static per-tensor scale from the checkpoint (a device scalar): q = sat(x / s).
template <typename T>
__global__ void quant_static_kernel(const T* __restrict__ x, uint8_t* __restrict__ x_q, const float* __restrict__ scale,
                                    int64_t num_vectors) {
  const float s = *scale;
  for (int64_t vec = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; vec < num_vectors;
       vec += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    Vec8<T> in;
    in.load(x + vec * 8);
    float v[8];
    in.to_float(v);
    reinterpret_cast<uint2*>(x_q)[vec] = quantize8(v, s);
  }
}

}  // namespace finegemm::cuda
