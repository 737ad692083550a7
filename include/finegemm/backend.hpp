// Where an op runs.
#pragma once
#include <string>

namespace finegemm {

enum class Backend {
  Auto,       // the tensors' device: CPU tensors → Cpu, CUDA tensors → Cuda
  Reference,  // CPU reference: double accumulation, plain loops (what every test compares with)
  Cpu,        // CPU fast path: OpenMP, weights stay quantized in memory
  Cuda,       // sm_90a kernels
};

struct RunOptions {
  Backend backend = Backend::Auto;
  void* stream = nullptr;  // cudaStream_t for CUDA work (nullptr: the legacy default stream)
};

const char* backend_name(Backend backend);
Backend parse_backend(const std::string& name);  // "ref"|"reference", "cpu", "cuda", "auto"
bool cuda_available();                            // built with CUDA and a device is present

// The scratch memory of CUDA calls comes from a pool per device that keeps what the calls free (as a framework's
// caching allocator does), so that a call does not map its scratch afresh. This synchronizes the device and gives
// its unused scratch back to CUDA; a no-op without CUDA. FINEGEMM_SCRATCH_POOL=default: CUDA's default pool instead.
void release_cached_memory(int cuda_device);

}  // namespace finegemm
