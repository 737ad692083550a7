// Device discovery and error checking for the CUDA backend.
#include <cuda_runtime.h>

#include "cuda/runtime/check.hpp"

namespace finegemm::cuda {

bool device_present() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no device" error
    return false;
  }
  return count > 0;
}

void throw_cuda_error(cudaError_t status, const char* what, const char* file, int line) {
  throw Error(ErrorKind::Runtime, std::string("CUDA error in ") + what + " (" + file + ":" + std::to_string(line) +
                                      "): " + cudaGetErrorString(status));
}

}  // namespace finegemm::cuda
