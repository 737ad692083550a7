// Plain device allocations and copies for DeviceBuffer (src/core/device_buffer.cpp).
#include <cuda_runtime.h>

#include "cuda/runtime/check.hpp"

namespace finegemm::cuda {

void* device_alloc(int device, size_t bytes) {
  const DeviceGuard guard(device);
  void* ptr = nullptr;
  FG_CUDA_CHECK(cudaMalloc(&ptr, bytes));
  return ptr;
}
void device_free(int device, void* ptr) {
  int previous = 0;
  if (cudaGetDevice(&previous) == cudaSuccess && previous != device) (void)cudaSetDevice(device);
  (void)cudaFree(ptr);
  if (previous != device) (void)cudaSetDevice(previous);
}
void copy_host_to_device(void* dst, const void* src, size_t bytes) {
  FG_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
}
void copy_device_to_host(void* dst, const void* src, size_t bytes) {
  FG_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}
void device_synchronize(int device) {
  const DeviceGuard guard(device);
  FG_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace finegemm::cuda
