// An owning buffer on a device (CPU or CUDA), for tools, tests and benchmarks.
// Host code only; the CUDA half lives in src/cuda/runtime/memory.cu.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "finegemm/tensor.hpp"

namespace finegemm {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Device device, size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

  void copy_from_host(const void* src, size_t bytes);
  void copy_to_host(void* dst, size_t bytes) const;

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Device device_{};
};

// A copy of a host tensor on `device`, and its view. The view is contiguous.
struct DeviceTensor {
  DeviceBuffer buffer;
  TensorView view;
};
DeviceTensor to_device(const TensorView& host, Device device);
// Copies a (contiguous) device tensor into a contiguous host tensor of the same shape and dtype.
void copy_to_host(const TensorView& device_tensor, const TensorView& host);
// Blocks until all work queued on the device is done (no-op for the CPU).
void synchronize(Device device);

}  // namespace finegemm
