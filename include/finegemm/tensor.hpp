// A non-owning tensor view: pointer, dtype, shape, strides (in elements), device.
#pragma once
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace finegemm {

enum class DType : uint8_t {
  F32,
  F16,
  BF16,
  F8_E4M3,  // float8_e4m3fn
  F8_E8M0,  // float8_e8m0fnu (UE8M0 scales)
  U8,       // also packed FP4 E2M1 (two per byte, low nibble first)
  I8,       // also packed FP4 E2M1 (DeepSeek-V4 stores int8)
  I32,      // also packed UE8M0 (4 scales per int32, little-endian)
  I64,
};

size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);

enum class DeviceType : uint8_t { CPU, CUDA };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;
  bool operator==(const Device&) const = default;
};
std::string device_name(Device device);

inline constexpr int kMaxDims = 4;

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::F32;
  int ndim = -1;  // -1: no tensor (an optional argument left out); 0: a scalar
  int64_t shape[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};  // in elements
  Device device = {};

  // A contiguous (row-major) view.
  static TensorView of(const void* data, DType dtype, std::initializer_list<int64_t> shape, Device device = {});
  static TensorView of(const void* data, DType dtype, const std::vector<int64_t>& shape, Device device = {});

  bool defined() const { return ndim >= 0; }
  int64_t numel() const;
  int64_t size(int dim) const { return shape[dim < 0 ? dim + ndim : dim]; }
  bool is_contiguous() const;
  std::vector<int64_t> sizes() const { return {shape, shape + (ndim > 0 ? ndim : 0)}; }
  template <typename T>
  T* ptr() const { return static_cast<T*>(data); }
};

// "[56, 16]" — used by error messages.
std::string shape_string(const TensorView& t);
std::string shape_string(const std::vector<int64_t>& shape);

}  // namespace finegemm
