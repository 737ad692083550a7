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

}  // namespace finegemm
