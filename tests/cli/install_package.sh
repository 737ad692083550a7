#!/usr/bin/env bash
# The installed CMake package works: `cmake --install` the build, then a separate project finds it with
# find_package(finegemm), links finegemm::finegemm, and runs a linear through the public API.
#   $1: the finegemm binary (its build tree is two levels up)   $2: a scratch directory
set -euo pipefail
build=$(cd "$(dirname "$1")/.." && pwd)
scratch=$2
rm -rf "$scratch" && mkdir -p "$scratch/consumer"
cmake --install "$build" --prefix "$scratch/prefix" >"$scratch/install.log"
cat >"$scratch/consumer/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.25)
project(consumer LANGUAGES CXX)
find_package(finegemm 0.1 REQUIRED)
add_executable(consumer main.cpp)
target_link_libraries(consumer PRIVATE finegemm::finegemm)
CMAKE
cat >"$scratch/consumer/main.cpp" <<'CPP'
#include <finegemm/finegemm.hpp>
#include <cstdio>
#include <vector>
// y = x · Wᵀ with per-tensor FP8 weights and static activations, all exact: K in every output.
int main() {
  using namespace finegemm;
  const int64_t m = 2, n = 16, k = 32;
  std::vector<float> x(m * k, 1.0f), w(n * k, 1.0f), xs{1.0f}, y(m * n, -1.0f);
  std::vector<uint8_t> wq(n * k);
  float ws = 0;
  quantize_weights(TensorView::of(w.data(), DType::F32, {n, k}), WeightRecipe::per_tensor(),
                   TensorView::of(wq.data(), DType::F8_E4M3, {n, k}), TensorView::of(&ws, DType::F32, {}));
  LinearArgs a;
  a.x = TensorView::of(x.data(), DType::F32, {m, k});
  a.x_scale = TensorView::of(xs.data(), DType::F32, {});
  a.activation = ActivationRecipe::static_per_tensor();
  a.weight = TensorView::of(wq.data(), DType::F8_E4M3, {n, k});
  a.weight_scale = TensorView::of(&ws, DType::F32, {});
  a.weight_recipe = WeightRecipe::per_tensor();
  a.out = TensorView::of(y.data(), DType::F32, {m, n});
  linear(a);
  for (float v : y)
    if (v != static_cast<float>(k)) {
      std::printf("wrong output %g (expected %lld)\n", v, static_cast<long long>(k));
      return 1;
    }
  std::printf("consumer: find_package(finegemm) and linear ok\n");
  return 0;
}
CPP
cmake -S "$scratch/consumer" -B "$scratch/consumer/build" -G Ninja -DCMAKE_PREFIX_PATH="$scratch/prefix" \
  -DCMAKE_BUILD_TYPE=Release >"$scratch/configure.log" || { cat "$scratch/configure.log"; exit 1; }
cmake --build "$scratch/consumer/build" >"$scratch/build.log" || { cat "$scratch/build.log"; exit 1; }
"$scratch/consumer/build/consumer"
