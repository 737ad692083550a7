#include "core/device_buffer.hpp"

#include <cstdlib>
#include <cstring>
#include <utility>

#include "finegemm/error.hpp"

namespace finegemm {

#if FINEGEMM_WITH_CUDA
namespace cuda {
void* device_alloc(int device, size_t bytes);
void device_free(int device, void* ptr);
void copy_host_to_device(void* dst, const void* src, size_t bytes);
void copy_device_to_host(void* dst, const void* src, size_t bytes);
void device_synchronize(int device);
}  // namespace cuda
#endif

DeviceBuffer::DeviceBuffer(Device device, size_t bytes) : bytes_(bytes), device_(device) {
  const size_t alloc = bytes ? bytes : 1;
  if (device.type == DeviceType::CPU) {
    data_ = std::malloc(alloc);
    if (!data_) throw Error(ErrorKind::Runtime, "out of host memory allocating " + std::to_string(bytes) + " bytes");
  } else {
#if FINEGEMM_WITH_CUDA
    data_ = cuda::device_alloc(device.index, alloc);
#else
    throw Error(ErrorKind::Runtime, "device: this finegemm was built without CUDA, got " + device_name(device));
#endif
  }
}

DeviceBuffer::~DeviceBuffer() {
  if (!data_) return;
  if (device_.type == DeviceType::CPU) std::free(data_);
#if FINEGEMM_WITH_CUDA
  else cuda::device_free(device_.index, data_);
#endif
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(other.bytes_), device_(other.device_) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    DeviceBuffer tmp(std::move(*this));
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = other.bytes_;
    device_ = other.device_;
  }
  return *this;
}

void DeviceBuffer::copy_from_host(const void* src, size_t bytes) {
  if (bytes > bytes_) throw Error("copy_from_host: " + std::to_string(bytes) + " bytes into a buffer of " + std::to_string(bytes_));
  if (device_.type == DeviceType::CPU) {
    std::memcpy(data_, src, bytes);
    return;
  }
#if FINEGEMM_WITH_CUDA
  cuda::copy_host_to_device(data_, src, bytes);
#endif
}

void DeviceBuffer::copy_to_host(void* dst, size_t bytes) const {
  if (bytes > bytes_) throw Error("copy_to_host: " + std::to_string(bytes) + " bytes from a buffer of " + std::to_string(bytes_));
  if (device_.type == DeviceType::CPU) {
    std::memcpy(dst, data_, bytes);
    return;
  }
#if FINEGEMM_WITH_CUDA
  cuda::copy_device_to_host(dst, data_, bytes);
#endif
}

DeviceTensor to_device(const TensorView& host, Device device) {
  if (!host.defined()) return {};
  if (!host.is_contiguous()) throw Error("to_device: expected a contiguous host tensor, got strides that are not");
  const size_t bytes = static_cast<size_t>(host.numel()) * dtype_size(host.dtype);
  DeviceTensor t{DeviceBuffer(device, bytes), {}};
  t.buffer.copy_from_host(host.data, bytes);
  t.view = TensorView::of(t.buffer.data(), host.dtype, host.sizes(), device);
  return t;
}

void copy_to_host(const TensorView& device_tensor, const TensorView& host) {
  const size_t bytes = static_cast<size_t>(host.numel()) * dtype_size(host.dtype);
  if (device_tensor.device.type == DeviceType::CPU) {
    std::memcpy(host.data, device_tensor.data, bytes);
    return;
  }
#if FINEGEMM_WITH_CUDA
  cuda::copy_device_to_host(host.data, device_tensor.data, bytes);
#endif
}

void synchronize(Device device) {
#if FINEGEMM_WITH_CUDA
  if (device.type == DeviceType::CUDA) cuda::device_synchronize(device.index);
#else
  (void)device;
#endif
}

}  // namespace finegemm
