// Runs an op on the CPU fast path for CUDA tensors: copies inputs to the host, computes, copies the output back.
// For recipes or shapes that no GPU kernel serves yet: slower, but no valid recipe is ever refused.
#pragma once
#include <cuda_runtime.h>

#include "finegemm/linear.hpp"
#include "finegemm/moe.hpp"

namespace finegemm::cuda {

void linear_on_host(const LinearArgs& args, cudaStream_t stream);
void moe_on_host(const MoeArgs& args, cudaStream_t stream);

}  // namespace finegemm::cuda
