// Plain device allocations and copies for DeviceBuffer (src/core/device_buffer.cpp).
#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "cuda/runtime/check.hpp"

namespace finegemm::cuda {

// The stream-ordered scratch of every call (StreamScratch) comes from a pool of finegemm's own per device that keeps
// what was freed, as a framework's caching allocator does. NOTE: CUDA's default pool gives its free memory back at
// every synchronization; a layer that synchronizes once per call (the EP layer reads its counts) then maps its
// gigabytes of scratch afresh on every call: measured as milliseconds per call on the H200 (finegemm-ep --bench,
// T = 4096 per rank, 2026-12-01). FINEGEMM_SCRATCH_POOL=default takes the device's current pool instead (the one
// cudaMallocAsync uses). The memory kept is what the largest call needed; release_cached_memory() gives it back.
namespace {
std::mutex pool_mutex;
std::array<cudaMemPool_t, 64> pools{};
}  // namespace

bool scratch_pool_created(int device) {
  std::lock_guard<std::mutex> lock(pool_mutex);
  return device >= 0 && device < static_cast<int>(pools.size()) && pools[device] != nullptr;
}

cudaMemPool_t scratch_pool(int device) {
  static const bool use_default = [] {
    const char* v = std::getenv("FINEGEMM_SCRATCH_POOL");
    return v && std::strcmp(v, "default") == 0;
  }();
  if (device < 0 || device >= static_cast<int>(pools.size())) throw Error("device: expected 0..63, got " + std::to_string(device));
  std::lock_guard<std::mutex> lock(pool_mutex);
  if (pools[device]) return pools[device];
  // NOTE: the first call may come while the caller captures a CUDA graph, where creating a pool is refused
  // ("operation not permitted when stream is capturing", seen on the H200 at 303b74c): this thread relaxes its
  // capture mode for the creation, which enqueues nothing on any stream.
  struct RelaxedCapture {
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    RelaxedCapture() { (void)cudaThreadExchangeStreamCaptureMode(&mode); }
    ~RelaxedCapture() { (void)cudaThreadExchangeStreamCaptureMode(&mode); }
  } relaxed;
  cudaMemPool_t pool = nullptr;
  if (use_default) {
    FG_CUDA_CHECK(cudaDeviceGetMemPool(&pool, device));  // the pool plain cudaMallocAsync uses
  } else {
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = cudaMemHandleTypeNone;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    FG_CUDA_CHECK(cudaMemPoolCreate(&pool, &props));
    uint64_t threshold = UINT64_MAX;
    const cudaError_t status = cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold);
    if (status != cudaSuccess) {
      (void)cudaMemPoolDestroy(pool);
      FG_CUDA_CHECK(status);
    }
  }
  pools[device] = pool;
  return pool;
}

void* scratch_alloc(size_t bytes, cudaStream_t stream) {
  int device = 0;
  FG_CUDA_CHECK(cudaGetDevice(&device));
  void* ptr = nullptr;
  FG_CUDA_CHECK(cudaMallocFromPoolAsync(&ptr, bytes, scratch_pool(device), stream));
  return ptr;
}

void* scratch_try_alloc(size_t bytes, cudaStream_t stream) {
  int device = 0;
  FG_CUDA_CHECK(cudaGetDevice(&device));
  void* ptr = nullptr;
  const cudaError_t status = cudaMallocFromPoolAsync(&ptr, bytes, scratch_pool(device), stream);
  if (status == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();  // not sticky: clear it for the caller's next check
    return nullptr;
  }
  FG_CUDA_CHECK(status);
  return ptr;
}

void release_scratch(int device) {
  int count = 0;
  FG_CUDA_CHECK(cudaGetDeviceCount(&count));
  if (device < 0 || device >= count)
    throw Error("cuda_device: expected 0.." + std::to_string(count - 1) + ", got " + std::to_string(device));
  // A device finegemm has not allocated scratch on is left alone (no context, no pool, no synchronization).
  if (!scratch_pool_created(device)) return;
  const DeviceGuard guard(device);
  FG_CUDA_CHECK(cudaDeviceSynchronize());
  FG_CUDA_CHECK(cudaMemPoolTrimTo(scratch_pool(device), 0));
}

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
