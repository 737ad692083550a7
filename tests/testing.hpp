// Shared test helpers: owned buffers, random data, poison, relative error.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/formats.hpp"
#include "finegemm/finegemm.hpp"

namespace finegemm::testing {

// A CPU tensor that owns its bytes.
struct Buffer {
  std::vector<uint8_t> bytes;
  TensorView view;

  Buffer() = default;
  Buffer(DType dtype, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (auto s : shape) n *= s;
    bytes.assign(static_cast<size_t>(n) * dtype_size(dtype) + 1, 0);  // +1: never a null pointer
    view = TensorView::of(bytes.data(), dtype, shape);
  }
  template <typename T>
  T* ptr() { return reinterpret_cast<T*>(bytes.data()); }
  int64_t numel() const { return view.numel(); }
  operator const TensorView&() const { return view; }
};

// Reads element i of a float-like tensor (F32/BF16/F16/F8_E4M3) as float.
inline float get(const TensorView& t, int64_t i) {
  switch (t.dtype) {
    case DType::F32: return static_cast<const float*>(t.data)[i];
    case DType::BF16: return fmt::bf16_to_float(static_cast<const uint16_t*>(t.data)[i]);
    case DType::F16: return fmt::f16_to_float(static_cast<const uint16_t*>(t.data)[i]);
    case DType::F8_E4M3: return fmt::e4m3_to_float(static_cast<const uint8_t*>(t.data)[i]);
    default: return NAN;
  }
}
inline void set(const TensorView& t, int64_t i, float v) {
  switch (t.dtype) {
    case DType::F32: static_cast<float*>(t.data)[i] = v; break;
    case DType::BF16: static_cast<uint16_t*>(t.data)[i] = fmt::bf16_from_float(v); break;
    case DType::F16: static_cast<uint16_t*>(t.data)[i] = fmt::f16_from_float(v); break;
    case DType::F8_E4M3: static_cast<uint8_t*>(t.data)[i] = fmt::e4m3_from_float(v); break;
    default: break;
  }
}

// The seed of this test process's random data: FINEGEMM_TEST_SEED when set, else a fresh one. It is printed once to
// stderr, so that a failure on fresh random data reruns exactly (same binary, same --gtest_filter, that seed).
inline uint64_t test_seed() {
  static const uint64_t seed = [] {
    const char* env = std::getenv("FINEGEMM_TEST_SEED");
    const uint64_t s = env && *env ? std::strtoull(env, nullptr, 10)
                                   : (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
    std::fprintf(stderr, "test data seed %llu (rerun with FINEGEMM_TEST_SEED=%llu)\n", static_cast<unsigned long long>(s),
                 static_cast<unsigned long long>(s));
    return s;
  }();
  return seed;
}

inline std::mt19937_64& rng() {
  static std::mt19937_64 gen(test_seed());
  return gen;
}

// Fresh random data: normal(0, stddev), stored in the tensor's dtype.
inline Buffer random_tensor(DType dtype, std::vector<int64_t> shape, float stddev = 1.0f) {
  Buffer b(dtype, std::move(shape));
  std::normal_distribution<float> dist(0.0f, stddev);
  for (int64_t i = 0; i < b.numel(); ++i) set(b.view, i, dist(rng()));
  return b;
}

// Poison: NaN in every float element, so an unwritten output fails the check.
inline void poison(const TensorView& t) {
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i) {
    switch (t.dtype) {
      case DType::F32: static_cast<float*>(t.data)[i] = NAN; break;
      case DType::BF16: case DType::F16: static_cast<uint16_t*>(t.data)[i] = 0x7FFF; break;  // NaN in both
      case DType::F8_E4M3: static_cast<uint8_t*>(t.data)[i] = 0x7F; break;
      default: std::memset(static_cast<uint8_t*>(t.data) + i * dtype_size(t.dtype), 0xFF, dtype_size(t.dtype));
    }
  }
}

struct Comparison {
  double rel = INFINITY;  // ‖out − ref‖₂ / ‖ref‖₂
  int64_t non_finite = 0;
};

// out: any float tensor; ref: doubles of the same numel.
inline Comparison compare(const TensorView& out, const std::vector<double>& ref) {
  Comparison c;
  double num = 0, den = 0;
  for (int64_t i = 0; i < out.numel(); ++i) {
    const double o = get(out, i);
    if (!std::isfinite(o)) ++c.non_finite;
    num += (o - ref[i]) * (o - ref[i]);
    den += ref[i] * ref[i];
  }
  c.rel = c.non_finite ? INFINITY : std::sqrt(num) / std::max(std::sqrt(den), 1e-300);
  return c;
}
inline Comparison compare(const TensorView& out, const TensorView& ref) {
  std::vector<double> r(static_cast<size_t>(ref.numel()));
  for (int64_t i = 0; i < ref.numel(); ++i) r[i] = get(ref, i);
  return compare(out, r);
}

// Sets an environment variable for a scope (an empty value unsets it there); at the end it is as it was before (an
// enclosing scope's value, or unset). Until stop 39 it was unset at the end, which cleared an enclosing scope's value.
struct ScopedEnv {
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    const char* before = std::getenv(name);
    had_ = before != nullptr;
    if (had_) before_ = before;
    if (value.empty()) unsetenv(name);
    else setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (had_) setenv(name_, before_.c_str(), 1);
    else unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  bool had_ = false;
  std::string before_;
};

}  // namespace finegemm::testing
