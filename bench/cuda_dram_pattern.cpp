// How fast the H200's memory serves the decode kernels' weight-read pattern, and which change of pattern would serve
// it faster (stop 35: the FP8 decode kernel streams 3.0-3.45 TB/s where a sequential read reaches 4.33; neither two
// or three stages requested together nor other splits closed the gap). No arithmetic: each CTA's TMA thread loads
// its tile's K chunks through a ring and a consumer thread releases each stage as it lands (dram_pattern_kernels.cu).
//
// Weight sets, each larger than the 50 MB L2: dense N = 7168 K = 16384 (117 MB), the DeepSeek-V3 decode gate_up of
// 8 experts (32768 rows of 7168 bytes, 235 MB) and its down (57344 rows of 2048 bytes, 117 MB), and FP4 weights of
// two dense N = 7168 K = 16384 layers (14336 rows of 8192 bytes, 117 MB: one layer's 58.7 MB would fit the H200's
// 60 MB L2). Per set, the decode
// kernel's pattern (64-row tiles, 128-byte boxes, 6 stages, the split that fills 4 CTAs per SM) and one change at a
// time: L2 promotion, bytes per row and request, stage size, stage count, tile height, CTAs per SM, split, and the
// weights repacked so that each stage is one contiguous block (read by cp.async.bulk); then the sequential read of the
// same bytes.
// Output: one JSON line per row (us per pass: median of 7 samples of 10 passes between two events; TB/s of the set).
// Every set also runs with 64-byte boxes, the FP4 decode kernel's rows (128 of K per stage; stop 44's ncu of that
// kernel had its consumers waiting on data with DRAM at half its rate): 6 stages, and 12 (an E4M3 stage's bytes in
// flight).
//   bench_cuda_dram_pattern [--set dense,gate_up,down,fp4_dense] [--quick]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "dram_pattern.hpp"

using finegemm::bench::TmaPattern;

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

struct WeightSet {
  const char* name;
  int64_t rows, row_bytes;
};

template <typename F>
double median_us(F&& launch) {
  cudaEvent_t e0, e1;
  check(cudaEventCreate(&e0), "event");
  check(cudaEventCreate(&e1), "event");
  for (int i = 0; i < 3; ++i) launch();
  std::vector<double> samples;
  for (int s = 0; s < 7; ++s) {
    check(cudaEventRecord(e0), "record");
    for (int i = 0; i < 10; ++i) launch();
    check(cudaEventRecord(e1), "record");
    check(cudaEventSynchronize(e1), "sync");
    float ms = 0.0f;
    check(cudaEventElapsedTime(&ms, e0, e1), "elapsed");
    samples.push_back(ms * 1e3 / 10);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> sets = {"dense", "gate_up", "down", "fp4_dense"};
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") {
      quick = true;
    } else if (a == "--set" && i + 1 < argc) {
      sets.clear();
      std::string list = argv[++i];
      for (size_t p = 0; p <= list.size();) {
        const size_t q = std::min(list.find(',', p), list.size());
        sets.push_back(list.substr(p, q - p));
        p = q + 1;
      }
    } else {
      std::fprintf(stderr, "usage: bench_cuda_dram_pattern [--set dense,gate_up,down,fp4_dense] [--quick]\n");
      return 2;
    }
  }
  try {
    int device = 0, sms = 0;
    check(cudaGetDevice(&device), "device");
    check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "SM count");
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, device), "properties");
    const WeightSet all[] = {
        {"dense", 7168, 16384}, {"gate_up", 32768, 7168}, {"down", 57344, 2048}, {"fp4_dense", 14336, 8192}};
    int64_t max_bytes = 0;
    for (const auto& w : all) max_bytes = std::max(max_bytes, w.rows * w.row_bytes);
    void* data = nullptr;
    unsigned* sink = nullptr;
    check(cudaMalloc(&data, max_bytes), "weights");
    check(cudaMalloc(&sink, 1 << 20), "sink");
    check(cudaMemset(data, 0x11, max_bytes), "fill");
    for (const auto& w : all) {
      if (std::find(sets.begin(), sets.end(), w.name) == sets.end()) continue;
      const int64_t bytes = w.rows * w.row_bytes;
      auto emit = [&](const char* pattern, const std::string& change, const TmaPattern* t, int ctas, int grid, double us) {
        std::printf("{\"gpu\": \"%s\", \"set\": \"%s\", \"rows\": %lld, \"row_bytes\": %lld, \"pattern\": \"%s\", \"change\": \"%s\"",
                    prop.name, w.name, static_cast<long long>(w.rows), static_cast<long long>(w.row_bytes), pattern,
                    change.c_str());
        if (t)
          std::printf(", \"tile_rows\": %d, \"box_bytes\": %d, \"boxes_per_chunk\": %d, \"chunks_per_stage\": %d, \"stages\": %d, "
                      "\"splits\": %d, \"l2_promotion\": %d, \"ctas_per_sm\": %d",
                      t->tile_rows, t->box_bytes, t->boxes_per_chunk, t->chunks_per_stage, t->stages, t->splits,
                      t->l2_promotion, ctas);
        std::printf(", \"grid\": %d, \"us\": %.2f, \"tbps\": %.3f}\n", grid, us, bytes / us * 1e-6);
        std::fflush(stdout);
      };
      auto run = [&](const std::string& change, TmaPattern t, int want_ctas_per_sm = 4, bool fill_split = true) {
        // CTAs per SM: pad the shared memory down to want_ctas_per_sm where the ring allows more.
        const int per_sm_smem = 227 * 1024 / want_ctas_per_sm - 2048;
        t.smem_pad = std::max(0, per_sm_smem - finegemm::bench::tma_pattern_smem(t));
        const int ctas = finegemm::bench::tma_pattern_ctas_per_sm(t);
        const int tiles = static_cast<int>(w.rows / t.tile_rows);
        const int chunks = static_cast<int>(w.row_bytes / (t.box_bytes * t.boxes_per_chunk));
        if (fill_split) t.splits = std::max(1, std::min(ctas * sms / tiles, chunks / std::max(4, t.chunks_per_stage)));
        const double us = median_us([&] { finegemm::bench::launch_tma_pattern(data, w.rows, w.row_bytes, t, sink, nullptr); });
        emit("tma", change, &t, ctas, tiles * t.splits, us);
      };
      const TmaPattern base;  // the decode kernel's: 64 rows, 128-byte boxes, 6 stages, 256-byte L2 promotion
      run("decode kernel's pattern", base);
      for (int p : {0, 2}) {
        TmaPattern t = base;
        t.l2_promotion = p;
        run(p == 0 ? "L2 promotion none" : "L2 promotion 128 B", t);
      }
      {
        TmaPattern t = base;
        t.boxes_per_chunk = 2;
        t.stages = 3;
        run("256 B per row per stage (two 128 B boxes), 3 stages", t);
        t.boxes_per_chunk = 4;
        t.stages = 2;
        run("512 B per row per stage (four boxes), 2 stages", t);
        t.boxes_per_chunk = 1;
        t.box_bytes = 256;
        t.stages = 3;
        run("one 256 B box per row (no swizzle), 3 stages", t);
      }
      for (int st : {6, 12}) {
        TmaPattern t = base;
        t.box_bytes = 64;
        t.stages = st;
        run("64 B boxes (the FP4 decode kernel's rows, no swizzle), " + std::to_string(st) + " stages", t);
      }
      for (int c : {1, 2, 4}) {
        TmaPattern t = base;
        t.packed = true;
        t.chunks_per_stage = c;
        t.stages = 6 / c;
        run("packed: each stage one contiguous " + std::to_string(8 * c) + " KB block (cp.async.bulk)", t);
      }
      for (int s : {3, 4, 8, 12}) {
        TmaPattern t = base;
        t.stages = s;
        run("stages " + std::to_string(s), t, s >= 8 ? 2 : 4);
      }
      for (int r : {32, 128}) {
        TmaPattern t = base;
        t.tile_rows = r;
        if (r == 128) t.stages = 3;
        run("tile rows " + std::to_string(r), t);
      }
      for (int c : {1, 2, 3, 8}) {
        TmaPattern t = base;
        if (c == 8) t.stages = 3;
        run(std::to_string(c) + " CTAs per SM", t, c);
      }
      if (!quick) {
        for (int s : {1, 2, 3, 4, 6, 8}) {
          TmaPattern t = base;
          t.splits = s;
          run("split " + std::to_string(s) + " (not filled)", t, 4, false);
        }
      }
      for (int blocks : {sms * 4, sms * 8, sms * 16}) {
        const double us = median_us([&] { finegemm::bench::launch_ldg_pattern(data, bytes, blocks, sink, nullptr); });
        emit("ldg_sequential", std::to_string(blocks / sms) + " blocks of 256 per SM", nullptr, 0, blocks, us);
      }
    }
    cudaFree(data);
    cudaFree(sink);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cuda_dram_pattern: %s\n", e.what());
    return 1;
  }
  return 0;
}
