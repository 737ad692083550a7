// FG_CUDA_CHECK: every CUDA runtime call's status becomes a finegemm::Error.
#pragma once
#include <cuda_runtime.h>

#include <string>

#include "finegemm/error.hpp"

namespace finegemm::cuda {
[[noreturn]] void throw_cuda_error(cudaError_t status, const char* what, const char* file, int line);

// Makes the tensors' device current for the scope (kernels, tensor maps and workspaces follow the current device),
// and restores the caller's device after.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (device != previous_) {
      const cudaError_t status = cudaSetDevice(device);
      if (status != cudaSuccess) throw_cuda_error(status, "cudaSetDevice", __FILE__, __LINE__);
      switched_ = true;
    }
  }
  ~DeviceGuard() {
    if (switched_ && previous_ >= 0) (void)cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
  bool switched_ = false;
};

}  // namespace finegemm::cuda

#define FG_CUDA_CHECK(expr)                                                                   \
  do {                                                                                        \
    cudaError_t fg_status_ = (expr);                                                          \
    if (fg_status_ != cudaSuccess) ::finegemm::cuda::throw_cuda_error(fg_status_, #expr, __FILE__, __LINE__); \
  } while (0)
