// Fills most of the GPU's free memory with one byte value (default 0xFF: NaN as F32, BF16 and E4M3) and exits, so
// that the next process's allocations start on those bytes instead of a fresh machine's zeros. Stop 56: test_cuda_moe's
// same-bits tests failed in a call whose earlier processes had filled trace buffers with 0xFF, and passed on a fresh
// machine at the same seed; a kernel reading memory it never wrote would do that.
// Usage: poison_memory [byte] [fraction of free memory, default 0.9]
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char** argv) {
  const int byte = argc > 1 ? static_cast<int>(std::strtol(argv[1], nullptr, 0)) : 0xFF;
  const double fraction = argc > 2 ? std::atof(argv[2]) : 0.9;
  size_t free_bytes = 0, total = 0;
  if (cudaMemGetInfo(&free_bytes, &total) != cudaSuccess) return 1;
  const size_t chunk = size_t{1} << 30;
  size_t want = static_cast<size_t>(static_cast<double>(free_bytes) * fraction), done = 0;
  std::vector<void*> blocks;
  while (done + chunk <= want) {
    void* p = nullptr;
    if (cudaMalloc(&p, chunk) != cudaSuccess) break;
    if (cudaMemset(p, byte, chunk) != cudaSuccess) break;
    blocks.push_back(p);
    done += chunk;
  }
  cudaDeviceSynchronize();
  std::printf("poison_memory: %zu GiB of %zu GiB free set to 0x%02X\n", done >> 30, free_bytes >> 30, byte & 0xFF);
  for (void* p : blocks) cudaFree(p);
  return 0;
}
