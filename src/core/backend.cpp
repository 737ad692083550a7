#include <cstdlib>

#include "finegemm/backend.hpp"
#include "finegemm/error.hpp"

namespace finegemm {

#if FINEGEMM_WITH_CUDA
namespace cuda {
bool device_present();  // src/cuda/runtime/device.cu
void release_scratch(int device);  // src/cuda/runtime/memory.cu
}
#endif

const char* backend_name(Backend backend) {
  switch (backend) {
    case Backend::Auto: return "auto";
    case Backend::Reference: return "ref";
    case Backend::Cpu: return "cpu";
    case Backend::Cuda: return "cuda";
  }
  return "?";
}

Backend parse_backend(const std::string& name) {
  if (name == "auto") return Backend::Auto;
  if (name == "ref" || name == "reference") return Backend::Reference;
  if (name == "cpu") return Backend::Cpu;
  if (name == "cuda") return Backend::Cuda;
  throw Error("backend: expected one of auto, ref, cpu, cuda, got '" + name + "'");
}

bool cuda_available() {
#if FINEGEMM_WITH_CUDA
  return cuda::device_present();
#else
  return false;
#endif
}

void release_cached_memory(int cuda_device) {
#if FINEGEMM_WITH_CUDA
  if (cuda::device_present()) cuda::release_scratch(cuda_device);
#else
  (void)cuda_device;
#endif
}

}  // namespace finegemm
