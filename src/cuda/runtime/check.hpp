// FG_CUDA_CHECK: every CUDA runtime call's status becomes a finegemm::Error.
#pragma once
#include <cuda_runtime.h>

#include <string>

#include "finegemm/error.hpp"

namespace finegemm::cuda {
[[noreturn]] void throw_cuda_error(cudaError_t status, const char* what, const char* file, int line);
}  // namespace finegemm::cuda

#define FG_CUDA_CHECK(expr)                                                                   \
  do {                                                                                        \
    cudaError_t fg_status_ = (expr);                                                          \
    if (fg_status_ != cudaSuccess) ::finegemm::cuda::throw_cuda_error(fg_status_, #expr, __FILE__, __LINE__); \
  } while (0)
