// bench/linear (GPU side): finegemm's FP8 linear on the reference shapes, timed with CUDA events around single
// launches (median) and with CUDA-graph replay (every M by default; --graph-max-m M limits it); with --sustain-ms T
// also under a sustained load (the graph replayed back to back for T ms: us_sustained, the card at its power cap).
// NOTE: events around a single launch on an idle stream also time the host's launch work (the start event runs as
// soon as it is queued, the kernel only once the host has built and queued it): a few µs for finegemm, tens of µs for
// torch's scaled_mm. Until stop 25 only M ≤ 128 were replayed, which flattered the M = 512 comparisons. Weights rotate among enough copies to exceed 3× the
// L2, so the cache never serves them. Every timed configuration is first checked against the CPU reference on
// sampled rows. Prints one JSON object per line (bench/linear.py merges them with the torch baselines).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/device_buffer.hpp"
#include "core/formats.hpp"
#include "finegemm/finegemm.hpp"

using namespace finegemm;

namespace {

#define CHECK_CUDA(x)                                                                  \
  do {                                                                                 \
    cudaError_t e_ = (x);                                                              \
    if (e_ != cudaSuccess) {                                                           \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

constexpr Device kGpu{DeviceType::CUDA, 0};
std::mt19937_64 rng(1234);

std::vector<uint8_t> random_e4m3(size_t n) {
  std::vector<uint8_t> v(n);
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (auto& b : v) b = fmt::e4m3_from_float(d(rng) * 64.0f);
  return v;
}
std::vector<float> random_scales(size_t n, bool pow2) {
  std::vector<float> v(n);
  std::uniform_real_distribution<float> d(0.5f, 2.0f);
  for (auto& s : v) s = pow2 ? fmt::pow2_ceil(d(rng) / 256.0f) : d(rng) / 256.0f;
  return v;
}

struct Variant {
  std::string name;
  WeightRecipe weight;
  ActivationRecipe activation;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Relative error on `rows` sampled rows against the CPU reference. set_x(row, a) points a.x and a.x_scale at the
// row's activations as the GPU call took them.
template <typename SetX>
double check_sampled_rows(const LinearArgs& gpu_args, SetX set_x, const std::vector<uint8_t>& w,
                          const std::vector<uint8_t>& ws_bytes, int64_t m, int64_t n, int64_t k, int rows) {
  std::vector<uint16_t> out_all(static_cast<size_t>(m * n));
  CHECK_CUDA(cudaMemcpy(out_all.data(), gpu_args.out.data, out_all.size() * 2, cudaMemcpyDeviceToHost));
  double num = 0, den = 0;
  for (int r = 0; r < rows; ++r) {
    const int64_t row = (r * 7919LL) % m;
    LinearArgs a = gpu_args;
    set_x(row, a);
    a.weight = gpu_args.weight_recipe.element == ElementType::FP4_E2M1 ? TensorView::of(w.data(), DType::U8, {n, k / 2})
                                                                       : TensorView::of(w.data(), DType::F8_E4M3, {n, k});
    a.weight_scale = TensorView::of(ws_bytes.data(), gpu_args.weight_scale.dtype, gpu_args.weight_scale.sizes());
    std::vector<float> ref(static_cast<size_t>(n));
    a.out = TensorView::of(ref.data(), DType::F32, {1, n});
    linear(a, {Backend::Reference});
    for (int64_t j = 0; j < n; ++j) {
      const double o = fmt::bf16_to_float(out_all[row * n + j]);
      if (!std::isfinite(o)) return INFINITY;
      num += (o - ref[j]) * (o - ref[j]);
      den += double(ref[j]) * ref[j];
    }
  }
  return std::sqrt(num / den);
}

// E4M3 activations with their scales, as given to the GPU.
double check_rows(const LinearArgs& gpu_args, const std::vector<uint8_t>& xq, const std::vector<uint8_t>& xs_bytes,
                  const std::vector<uint8_t>& w, const std::vector<uint8_t>& ws_bytes, int64_t m, int64_t n, int64_t k,
                  int rows) {
  const int64_t scale_cols = gpu_args.x_scale.ndim == 2 ? gpu_args.x_scale.shape[1] : 1;
  auto set_x = [&](int64_t row, LinearArgs& a) {
    a.x = TensorView::of(xq.data() + row * k, DType::F8_E4M3, {1, k});
    if (gpu_args.activation.is_static()) a.x_scale = TensorView::of(xs_bytes.data(), DType::F32, {});
    else if (gpu_args.x_scale.ndim == 2) a.x_scale = TensorView::of(xs_bytes.data() + row * scale_cols * 4, DType::F32, {1, scale_cols});
    else a.x_scale = TensorView::of(xs_bytes.data() + row * 4, DType::F32, {1});
  };
  return check_sampled_rows(gpu_args, set_x, w, ws_bytes, m, n, k, rows);
}

// BF16 activations (--bf16-input): the reference quantizes each sampled row itself, as linear() does on the GPU (bit
// for bit: test_cuda_linear's QuantizeActivationsBitExact).
double check_rows_bf16(const LinearArgs& gpu_args, const std::vector<uint16_t>& x, const std::vector<uint8_t>& xs_bytes,
                       const std::vector<uint8_t>& w, const std::vector<uint8_t>& ws_bytes, int64_t m, int64_t n,
                       int64_t k, int rows) {
  auto set_x = [&](int64_t row, LinearArgs& a) {
    a.x = TensorView::of(x.data() + row * k, DType::BF16, {1, k});
    a.x_scale = gpu_args.activation.is_static() ? TensorView::of(xs_bytes.data(), DType::F32, {}) : TensorView{};
  };
  return check_sampled_rows(gpu_args, set_x, w, ws_bytes, m, n, k, rows);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> ms = {1, 16, 64, 128, 512, 4096};
  std::vector<std::pair<int64_t, int64_t>> nks = {{2112, 7168}, {24576, 1536}, {32768, 512}, {7168, 16384},
                                                  {4096, 7168}, {7168, 2048},  {576, 7168}};
  std::vector<std::string> variant_names = {"block-fp32-dynamic"};
  int check_rows_n = 4;
  // --bf16-input: activations arrive in BF16 and linear() quantizes them (the serving path: the activation
  // quantization is timed with the GEMM); by default they arrive quantized (E4M3 and their scales).
  bool bf16_input = false;
  // --m-major-scales: the group scales of E4M3 activations M-major ([K/G, M rounded up to 4] memory, an [M, K/G]
  // view with strides [1, ld]), as cuBLASLt's block-scaled A and DeepGEMM take them; the GEMM copies them per stage
  // in one bulk copy. Default: row-major [M, K/G].
  bool m_major_scales = false;
  bool weights_static = false;  // --weights-static: RunOptions::weights_static (no kernel here writes weights)
  std::vector<std::string> env_sets = {""};  // --envs: one row per entry, each with its environment settings
  int64_t graph_max_m = INT64_MAX;             // --graph-max-m: graph replay up to this M (stop 24's runs: 128)
  // --sustain-ms: also replay the graph back to back for this long and report the time per call under that sustained
  // load (us_sustained): a card at its power cap clocks down within a fraction of a second (stop 50: an H100 ran a
  // sustained FP8 GEMM at a median 1290 MHz), which the short event and graph timings do not see.
  double sustain_ms = 0;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--m" && i + 1 < argc) {
      ms.clear();
      for (char* tok = std::strtok(argv[++i], ","); tok; tok = std::strtok(nullptr, ",")) ms.push_back(std::atoll(tok));
    } else if (a == "--variants" && i + 1 < argc) {
      variant_names.clear();
      for (char* tok = std::strtok(argv[++i], ","); tok; tok = std::strtok(nullptr, ",")) variant_names.push_back(tok);
    } else if (a == "--weights-static") {
      weights_static = true;
    } else if (a == "--bf16-input") {
      bf16_input = true;
    } else if (a == "--m-major-scales") {
      m_major_scales = true;
    } else if (a == "--graph-max-m" && i + 1 < argc) {
      graph_max_m = std::atoll(argv[++i]);
    } else if (a == "--sustain-ms" && i + 1 < argc) {
      sustain_ms = std::atof(argv[++i]);
    } else if (a == "--quick") {
      nks.resize(3);
    } else if (a == "--envs" && i + 1 < argc) {
      // Settings to compare on the same data: entries separated by ';', each a comma-separated list of NAME=VALUE
      // (an empty entry: the defaults), e.g. --envs ';FINEGEMM_GEMM_CONFIG=192x128:1c2;FINEGEMM_GEMM_CLUSTER=1'.
      // An entry's variables are unset after its row (set nothing the caller also sets).
      env_sets.clear();
      const std::string list = argv[++i];
      size_t start = 0;
      while (true) {
        const size_t end = list.find(';', start);
        env_sets.push_back(list.substr(start, end == std::string::npos ? std::string::npos : end - start));
        if (end == std::string::npos) break;
        start = end + 1;
      }
    } else if (a == "--nk" && i + 1 < argc) {  // (N, K) shapes: --nk 7168:16384 or --nk 4096:7168,32768:512
      // NOTE: until stop 43 only one shape was read (a comma list ran its first N with K parsed up to the comma), so
      // the stop 40-42 call scripts' lists ran their first shape only.
      const std::string list = argv[++i];
      nks.clear();
      for (size_t start = 0; start <= list.size();) {
        const size_t end = std::min(list.find(',', start), list.size());
        const std::string nk = list.substr(start, end - start);
        const auto colon = nk.find(':');
        char* n_end = nullptr;
        char* k_end = nullptr;
        const long long n = colon == std::string::npos ? 0 : std::strtoll(nk.c_str(), &n_end, 10);
        const long long k = colon == std::string::npos ? 0 : std::strtoll(nk.c_str() + colon + 1, &k_end, 10);
        if (colon == std::string::npos || n_end != nk.c_str() + colon || k_end != nk.c_str() + nk.size() || n <= 0 ||
            k <= 0) {
          std::fprintf(stderr, "--nk expects N:K[,N:K...] with positive N and K, got '%s' in '%s'\n", nk.c_str(),
                       list.c_str());
          return 2;
        }
        nks.push_back({n, k});
        start = end + 1;
      }
    }
  }
  std::vector<Variant> variants;
  for (const auto& v : variant_names) {
    if (v == "block-fp32-dynamic") variants.push_back({v, WeightRecipe::block(), ActivationRecipe::per_token_group(128)});
    else if (v == "block-ue8m0-dynamic") variants.push_back({v, WeightRecipe::block(128, 128, ScaleFormat::UE8M0), ActivationRecipe::per_token_group(128, true)});
    else if (v == "block-fp32-static") variants.push_back({v, WeightRecipe::block(), ActivationRecipe::static_per_tensor()});
    else if (v == "channel-token") variants.push_back({v, WeightRecipe::per_channel(), ActivationRecipe::per_token()});
    else if (v == "mxfp4-group32") variants.push_back({v, WeightRecipe::mxfp4(ScaleFormat::UE8M0), ActivationRecipe::per_token_group(32)});
    else if (v == "mxfp4-group128") variants.push_back({v, WeightRecipe::mxfp4(ScaleFormat::UE8M0), ActivationRecipe::per_token_group(128, true)});
    else { std::fprintf(stderr, "unknown variant %s\n", v.c_str()); return 2; }
  }
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  const size_t l2 = static_cast<size_t>(prop.l2CacheSize);
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  CHECK_CUDA(cudaEventCreate(&e0));
  CHECK_CUDA(cudaEventCreate(&e1));

  for (const auto& [n, k] : nks) {
    for (const auto& var : variants) {
    // Weight copies: enough to exceed 3× L2 together. FP4: any byte is two valid E2M1 codes.
    const bool fp4 = var.weight.element == ElementType::FP4_E2M1;
    const size_t w_bytes = static_cast<size_t>(n * weight_storage_cols(var.weight, k));
    const int copies = static_cast<int>(std::clamp<size_t>((3 * l2 + w_bytes - 1) / w_bytes + 1, 1, 64));
    std::vector<uint8_t> w_host = random_e4m3(w_bytes);
    if (fp4)
      for (auto& b : w_host) b = static_cast<uint8_t>(rng() & 0xFF);
    std::vector<DeviceBuffer> w_dev;
    for (int c = 0; c < copies; ++c) {
      w_dev.emplace_back(kGpu, w_bytes);
      w_dev.back().copy_from_host(w_host.data(), w_bytes);
    }
      const auto ws_shape = weight_scale_shape(var.weight, n, k);
      int64_t ws_count = 1;
      for (auto s : ws_shape) ws_count *= s;
      std::vector<uint8_t> ws_bytes;
      if (var.weight.scale_format == ScaleFormat::FP32) {
        auto f = random_scales(ws_count, false);
        ws_bytes.assign(reinterpret_cast<uint8_t*>(f.data()), reinterpret_cast<uint8_t*>(f.data()) + f.size() * 4);
      } else {
        auto f = random_scales(ws_count, true);
        for (float s : f) ws_bytes.push_back(fmt::ue8m0_from_pow2(s));
      }
      auto ws_dev = to_device(TensorView::of(ws_bytes.data(), weight_scale_dtype(var.weight), ws_shape), kGpu);
      for (int64_t m : ms) {
        const std::vector<uint8_t> xq = random_e4m3(static_cast<size_t>(m * k));
        const auto xs_shape = activation_scale_shape(var.activation, m, k);
        int64_t xs_count = 1;
        for (auto s : xs_shape) xs_count *= s;
        auto xs_f = random_scales(xs_count, var.activation.pow2_scale);
        std::vector<uint8_t> xs_bytes(reinterpret_cast<uint8_t*>(xs_f.data()), reinterpret_cast<uint8_t*>(xs_f.data()) + xs_count * 4);
        // BF16 activations (--bf16-input): N(0, 1) values; a static recipe takes amax / 448 as its scale.
        std::vector<uint16_t> xb;
        if (bf16_input) {
          std::normal_distribution<float> d(0.0f, 1.0f);
          xb.resize(static_cast<size_t>(m * k));
          float amax = 0.0f;
          for (auto& v : xb) {
            v = fmt::bf16_from_float(d(rng));
            amax = std::max(amax, std::fabs(fmt::bf16_to_float(v)));
          }
          if (var.activation.is_static()) {
            const float s = amax / 448.0f;
            std::memcpy(xs_bytes.data(), &s, 4);
          }
        }
        auto x_dev = bf16_input ? to_device(TensorView::of(xb.data(), DType::BF16, {m, k}), kGpu)
                                : to_device(TensorView::of(xq.data(), DType::F8_E4M3, {m, k}), kGpu);
        auto xs_dev = to_device(TensorView::of(xs_bytes.data(), DType::F32, xs_shape), kGpu);
        // M-major group scales (--m-major-scales): the same values, transposed, padding rows set to 1.
        const bool m_major = m_major_scales && !bf16_input && xs_shape.size() == 2 &&
                             var.activation.granularity == ActGranularity::PerTokenGroup;
        if (m_major) {
          const int64_t groups = xs_shape[1], ld = (m + 3) / 4 * 4;
          std::vector<float> t(static_cast<size_t>(groups * ld), 1.0f);
          for (int64_t r = 0; r < m; ++r)
            for (int64_t g = 0; g < groups; ++g) t[g * ld + r] = xs_f[r * groups + g];
          xs_dev = to_device(TensorView::of(t.data(), DType::F32, {groups, ld}), kGpu);
          xs_dev.view.shape[0] = m;
          xs_dev.view.shape[1] = groups;
          xs_dev.view.strides[0] = 1;
          xs_dev.view.strides[1] = ld;
        }
        DeviceBuffer out(kGpu, static_cast<size_t>(m * n * 2));

        for (const std::string& env_set : env_sets) {
          // This entry's settings (NAME=VALUE, comma-separated), undone after its row.
          std::vector<std::string> set_names;
          for (size_t pos = 0; pos < env_set.size();) {
            const size_t comma = env_set.find(',', pos);
            const std::string item = env_set.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
            pos = comma == std::string::npos ? env_set.size() : comma + 1;
            const size_t eq = item.find('=');
            if (item.empty()) continue;
            if (eq == std::string::npos) { std::fprintf(stderr, "--envs expects NAME=VALUE, got %s\n", item.c_str()); return 2; }
            set_names.push_back(item.substr(0, eq));
            setenv(set_names.back().c_str(), item.substr(eq + 1).c_str(), 1);
          }
          CHECK_CUDA(cudaMemset(out.data(), 0xFF, out.bytes()));  // poison (NaN in bf16): each entry's output is checked
          LinearArgs args;
          args.x = x_dev.view;
          // BF16 input: linear() computes dynamic scales itself; a static recipe still takes its scalar.
          args.x_scale = bf16_input && !var.activation.is_static() ? TensorView{} : xs_dev.view;
          args.activation = var.activation;
          args.weight = fp4 ? TensorView::of(w_dev[0].data(), DType::U8, {n, k / 2}, kGpu)
                            : TensorView::of(w_dev[0].data(), DType::F8_E4M3, {n, k}, kGpu);
          args.weight_scale = ws_dev.view;
          args.weight_recipe = var.weight;
          args.out = TensorView::of(out.data(), DType::BF16, {m, n}, kGpu);
          RunOptions opt{Backend::Cuda, stream};
          opt.weights_static = weights_static;
          linear(args, opt);
          CHECK_CUDA(cudaStreamSynchronize(stream));
          const double rel = bf16_input ? check_rows_bf16(args, xb, xs_bytes, w_host, ws_bytes, m, n, k, check_rows_n)
                                        : check_rows(args, xq, xs_bytes, w_host, ws_bytes, m, n, k, check_rows_n);

          // Events around single launches, cycling the weight copies.
          const int iters = m >= 4096 ? 30 : 100;
          std::vector<double> times;
          for (int it = 0; it < iters + 5; ++it) {
            args.weight.data = w_dev[it % copies].data();
            CHECK_CUDA(cudaEventRecord(e0, stream));
            linear(args, opt);
            CHECK_CUDA(cudaEventRecord(e1, stream));
            CHECK_CUDA(cudaEventSynchronize(e1));
            float ms_ = 0;
            CHECK_CUDA(cudaEventElapsedTime(&ms_, e0, e1));
            if (it >= 5) times.push_back(ms_ * 1e3);
          }
          const double us = median(times);
          // Graph replay: one graph of `copies` launches, timed over many replays.
          double us_graph = 0, us_sustained = 0;
          if (m <= graph_max_m) {
            cudaGraph_t graph;
            cudaGraphExec_t exec;
            CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
            for (int c = 0; c < copies; ++c) {
              args.weight.data = w_dev[c].data();
              linear(args, opt);
            }
            CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
            CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
            CHECK_CUDA(cudaGraphLaunch(exec, stream));
            CHECK_CUDA(cudaStreamSynchronize(stream));
            std::vector<double> g;
            for (int r = 0; r < 20; ++r) {
              CHECK_CUDA(cudaEventRecord(e0, stream));
              CHECK_CUDA(cudaGraphLaunch(exec, stream));
              CHECK_CUDA(cudaEventRecord(e1, stream));
              CHECK_CUDA(cudaEventSynchronize(e1));
              float ms_ = 0;
              CHECK_CUDA(cudaEventElapsedTime(&ms_, e0, e1));
              g.push_back(ms_ * 1e3 / copies);
            }
            us_graph = median(g);
            if (sustain_ms > 0) {
              // Replays in batches of 8 between event pairs until sustain_ms has passed; the time per call over the
              // last half of the replays (the clock has settled by then).
              std::vector<std::pair<double, int>> batches;  // (µs, calls)
              double elapsed = 0;
              while (elapsed < sustain_ms * 1e3) {
                CHECK_CUDA(cudaEventRecord(e0, stream));
                for (int r = 0; r < 8; ++r) CHECK_CUDA(cudaGraphLaunch(exec, stream));
                CHECK_CUDA(cudaEventRecord(e1, stream));
                CHECK_CUDA(cudaEventSynchronize(e1));
                float ms_ = 0;
                CHECK_CUDA(cudaEventElapsedTime(&ms_, e0, e1));
                batches.push_back({ms_ * 1e3, 8 * copies});
                elapsed += ms_ * 1e3;
              }
              double t = 0;
              int calls = 0;
              for (size_t b = batches.size() / 2; b < batches.size(); ++b) {
                t += batches[b].first;
                calls += batches[b].second;
              }
              us_sustained = t / calls;
            }
            CHECK_CUDA(cudaGraphExecDestroy(exec));
            CHECK_CUDA(cudaGraphDestroy(graph));
          }
          const double flops = 2.0 * m * n * k;
          const double bytes = static_cast<double>(m * k * (bf16_input ? 2 : 1) + w_bytes + m * n * 2);
          const double best = us_graph > 0 ? std::min(us, us_graph) : us;
          std::printf("{\"variant\": \"%s\", \"m\": %lld, \"n\": %lld, \"k\": %lld, \"us\": %.3f, \"us_graph\": %.3f, "
                      "\"tflops\": %.1f, \"gbps\": %.1f, \"rel_err\": %.3e, \"weight_copies\": %d, \"input\": \"%s\", "
                      "\"weights_static\": %s, \"scales\": \"%s\", \"env\": \"%s\", \"us_sustained\": %.3f}\n",
                      var.name.c_str(), (long long)m, (long long)n, (long long)k, us, us_graph, flops / best / 1e6,
                      bytes / best / 1e3, rel, copies, bf16_input ? "bf16" : "e4m3", weights_static ? "true" : "false",
                      m_major ? "m-major" : "row-major", env_set.c_str(), us_sustained);
          std::fflush(stdout);
          for (const auto& name : set_names) unsetenv(name.c_str());
        }
      }
    }
  }
  return 0;
}
