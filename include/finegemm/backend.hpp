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
  // A promise for CUDA linear calls: no work enqueued on the stream since the weights (and their scales) were last
  // written is still running when the call is enqueued, i.e. the kernel directly ahead of the call does not write
  // them (serving: weights loaded once). A decode-sized call (M ≤ 64) then requests its first weight tiles before it
  // waits for that kernel (programmatic dependent launch), as it always does when it quantizes its own activations.
  // Without it, E4M3 activations arriving from the caller's kernel make the call load nothing before that kernel
  // completes. H200, graph replay, M = 1, N = 24576, K = 1536: 13.15-13.21 µs without it; 11.75-11.92 when the kernel
  // made these early requests whatever ran ahead (stop 20).
  bool weights_static = false;
  // A promise for CUDA MoE calls (moe_experts): the expert weights and scales at these addresses never change while
  // the process runs (serving: weights loaded once, never written in place). What the calls derive from them alone is
  // then made once per weight and kept: the fold scan of FP4 experts' UE8M0 scales (FINEGEMM_FP4_SCAN_CACHE=1 does the
  // same for every call). A weight freed and another of the same shape put at the same address would reuse the old
  // scan. H100, DeepSeek-V3 FP4 experts at T = 4096: the layer 2.7% faster (stop 59).
  bool weights_constant = false;
};

const char* backend_name(Backend backend);
Backend parse_backend(const std::string& name);  // "ref"|"reference", "cpu", "cuda", "auto"
bool cuda_available();                            // built with CUDA and a device is present

// The scratch memory of CUDA calls comes from a pool per device that keeps what the calls free (as a framework's
// caching allocator does), so that a call does not map its scratch afresh. This synchronizes the device and gives
// its unused scratch back to CUDA; a no-op without CUDA. FINEGEMM_SCRATCH_POOL=default: CUDA's default pool instead.
void release_cached_memory(int cuda_device);

}  // namespace finegemm
