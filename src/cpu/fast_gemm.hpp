// The CPU fast path's engine, shared by fast_linear and fast_moe: out = x · dequant(W)ᵀ with W kept
// quantized in memory. Each OpenMP task owns NB output columns (NB weight rows); it dequantizes its rows one
// KB-wide K-panel at a time into an fp32 scratch tile and multiplies it with every row of x (OpenBLAS sgemm on the
// tile, or our own AVX-512 / portable micro-kernel). The arithmetic of one output element never depends on
// the thread count, so results are the same bits for any number of threads.
#pragma once
#include <cstdint>
#include <vector>

#include "finegemm/linear.hpp"
#include "finegemm/recipe.hpp"
#include "finegemm/tensor.hpp"

namespace finegemm::cpu::fast {

// One quantized [n, k] weight matrix (a whole linear weight, or one expert's slice).
struct QuantizedWeight {
  const uint8_t* data = nullptr;  // [n, storage_cols] row-major (FP8 bytes, or packed FP4 pairs)
  int64_t n = 0, k = 0;
  WeightRecipe recipe;
  const void* scale = nullptr;  // this matrix's scales, in recipe.scale_format
  int64_t scale_row_stride = 0;  // elements of the scale dtype between scale rows (block/MX)
};

// Builds the view of weight [n, k] (expert = -1) or of expert `expert` of a stacked [E, n, k] weight.
QuantizedWeight quantized_weight(const TensorView& weight, const TensorView& weight_scale, const WeightRecipe& recipe,
                                 int64_t k, int64_t expert = -1);

// Where the product goes: out[m, j] = convert(acc[m, j] + bias[j]).
struct Epilogue {
  void* out = nullptr;
  DType dtype = DType::F32;
  int64_t ld = 0;               // elements between output rows
  const float* bias = nullptr;  // [n] or null
};

// out[row, col0 + j] = convert(values[j] + bias[col0 + j]) for j < count.
void store_row(const Epilogue& epilogue, int64_t row, int64_t col0, const float* values, int64_t count);

// out = x · dequant(w)ᵀ (+ bias): x [m, k] fp32 with row stride lda. OpenMP-parallel over weight tiles.
void gemm(const float* x, int64_t m, int64_t lda, const QuantizedWeight& w, const Epilogue& epilogue);

// x [m, k] (F32/BF16/F16, quantized here per `recipe`, or F8_E4M3 with `x_scale`) → dequantized fp32
// [m, k]: the reference's FP8 codes and scales bit for bit (x_scale: the static scale, or the scales of an F8 x).
void quantize_dequantize_activations(const TensorView& x, const TensorView& x_scale, const ActivationRecipe& recipe,
                                     std::vector<float>& xf);

// A float-like vector (F32/BF16/F16) as fp32.
std::vector<float> to_float(const TensorView& t, int64_t offset, int64_t count);

// Test hooks: the micro-kernel the tiles use. Auto: OpenBLAS for 64+ rows when it runs an AVX-512 core (or
// the CPU has no AVX-512), else our AVX-512 kernel, else portable C++. FINEGEMM_CPU_KERNEL=blas|avx512|portable
// overrides; FINEGEMM_PRINT_CONFIG=1 prints each product's kernel and tile shape.
enum class Kernel { Auto, Blas, Avx512, Portable };
void set_kernel(Kernel kernel);
Kernel active_kernel(int64_t m);  // the kernel an m-row product runs with now
const char* kernel_name(Kernel kernel);
bool kernel_available(Kernel kernel);

}  // namespace finegemm::cpu::fast
