#include <sstream>

#include "finegemm/error.hpp"
#include "finegemm/tensor.hpp"

namespace finegemm {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::F32: case DType::I32: return 4;
    case DType::F16: case DType::BF16: return 2;
    case DType::F8_E4M3: case DType::F8_E8M0: case DType::U8: case DType::I8: return 1;
    case DType::I64: return 8;
  }
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::F32: return "float32";
    case DType::F16: return "float16";
    case DType::BF16: return "bfloat16";
    case DType::F8_E4M3: return "float8_e4m3fn";
    case DType::F8_E8M0: return "float8_e8m0fnu";
    case DType::U8: return "uint8";
    case DType::I8: return "int8";
    case DType::I32: return "int32";
    case DType::I64: return "int64";
  }
  return "?";
}

std::string device_name(Device device) {
  return device.type == DeviceType::CPU ? std::string("cpu") : "cuda:" + std::to_string(device.index);
}

TensorView TensorView::of(const void* data, DType dtype, std::initializer_list<int64_t> shape, Device device) {
  return of(data, dtype, std::vector<int64_t>(shape), device);
}

TensorView TensorView::of(const void* data, DType dtype, const std::vector<int64_t>& shape, Device device) {
  if (shape.size() > static_cast<size_t>(kMaxDims))
    throw Error("tensor: expected at most " + std::to_string(kMaxDims) + " dimensions, got " + shape_string(shape));
  TensorView t;
  t.data = const_cast<void*>(data);
  t.dtype = dtype;
  t.ndim = static_cast<int>(shape.size());
  t.device = device;
  int64_t stride = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    t.shape[d] = shape[d];
    t.strides[d] = stride;
    stride *= shape[d];
  }
  return t;
}

int64_t TensorView::numel() const {
  if (ndim < 0) return 0;
  int64_t n = 1;
  for (int d = 0; d < ndim; ++d) n *= shape[d];
  return n;
}

bool TensorView::is_contiguous() const {
  int64_t stride = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    if (shape[d] != 1 && strides[d] != stride) return false;
    stride *= shape[d];
  }
  return true;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << ']';
  return os.str();
}

std::string shape_string(const TensorView& t) {
  if (!t.defined()) return "(none)";
  return shape_string(t.sizes());
}

}  // namespace finegemm
