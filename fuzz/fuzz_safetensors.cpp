// libFuzzer target for the safetensors header parser and the views it hands out.
// Build: cmake -S . -B build-fuzz -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang \
//          -DFINEGEMM_BUILD_FUZZ=ON -DFINEGEMM_CUDA=OFF && ninja -C build-fuzz fuzz_safetensors
// Run:   build-fuzz/fuzz/fuzz_safetensors -max_total_time=60 fuzz/corpus   (add a scratch dir first to keep finds)
// Contract: any input either parses, with every view inside the buffer, or throws finegemm::Error. Anything else
// (another exception, an out-of-bounds read caught by ASan, a hang) is a bug.
#include <cstddef>
#include <cstdint>

#include "finegemm/error.hpp"
#include "finegemm/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const finegemm::SafetensorsFile file = finegemm::SafetensorsFile::from_bytes(data, size, "fuzz");
    uint8_t sum = 0;
    for (const auto& entry : file.entries()) {
      if (entry.shape.size() > static_cast<size_t>(finegemm::kMaxDims)) continue;
      const finegemm::TensorView view = file.get(entry.name);
      const auto* bytes = static_cast<const uint8_t*>(view.data);
      const size_t nbytes = static_cast<size_t>(view.numel()) * finegemm::dtype_size(view.dtype);
      for (size_t i = 0; i < nbytes; ++i) sum ^= bytes[i];  // ASan checks every byte is inside the buffer
    }
    volatile uint8_t sink = sum;
    (void)sink;
  } catch (const finegemm::Error&) {
  }
  return 0;
}
