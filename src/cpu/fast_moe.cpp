// CPU fast path for the Mixture-of-Experts block (include/finegemm/moe.hpp):
//   route → per-expert token lists (token order, then slot order: deterministic) → quantize the hidden rows
//   → gate_up (+bias) → activation → requantize to E4M3 → down (+bias) → combine in slot order, in double.
// Each expert's projections run on the tile engine of fast_gemm.cpp with the weights kept quantized.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/formats.hpp"
#include "cpu/cpu_backend.hpp"
#include "cpu/fast_gemm.hpp"

namespace finegemm::cpu {
namespace {

// NOTE: the per-slot expert outputs are kept until the combine; tokens are processed in chunks so that
// buffer stays under this many floats (T=4096, k=8, H=7168 would otherwise need 940 MB).
constexpr int64_t kSlotBufferFloats = int64_t(1) << 24;

double silu(double v) { return v / (1.0 + std::exp(-v)); }
double sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }
double gelu_tanh(double v) {
  constexpr double kSqrt2OverPi = 0.7978845608028654;
  return 0.5 * v * (1.0 + std::tanh(kSqrt2OverPi * (v + 0.044715 * v * v * v)));
}

// h [rows, width] (gate_up output, bias added) → act [rows, inter].
void apply_activation(const MoeArgs& a, const float* h, int64_t rows, int64_t width, int64_t inter, float* act) {
  const double limit = a.swiglu_limit;
  const double alpha = a.swiglu_alpha;
  const bool gated = moe_activation_has_gate(a.activation);
  for (int64_t r = 0; r < rows; ++r) {
    const float* hr = h + r * width;
    float* out = act + r * inter;
    for (int64_t c = 0; c < inter; ++c) {
      if (gated) {
        double gate = a.interleaved_gate_up ? hr[2 * c] : hr[c];
        double up = a.interleaved_gate_up ? hr[2 * c + 1] : hr[inter + c];
        if (limit > 0.0) {
          gate = std::min(gate, limit);
          up = std::clamp(up, -limit, limit);
        }
        out[c] = static_cast<float>(a.activation == MoeActivation::SwiGLU ? silu(gate) * up
                                                                          : (up + 1.0) * gate * sigmoid(alpha * gate));
      } else {
        const double up = hr[c];
        double v = 0.0;
        switch (a.activation) {
          case MoeActivation::Silu: v = silu(up); break;
          case MoeActivation::Gelu: v = gelu_tanh(up); break;
          case MoeActivation::Relu2: v = up > 0.0 ? up * up : 0.0; break;
          default: break;
        }
        out[c] = static_cast<float>(v);
      }
    }
  }
}

TensorView scalar_at(const TensorView& t, int64_t index) {
  return TensorView::of(t.ptr<const float>() + index, DType::F32, {});
}

}  // namespace

void fast_moe(const MoeArgs& a) {
  const int64_t tokens = a.hidden.shape[0], hidden = a.hidden.shape[1];
  const int64_t top_k = a.top_k_index.shape[1];
  const int64_t experts = a.gate_up.shape[0];
  const bool fp4 = a.weight_recipe.element == ElementType::FP4_E2M1;
  const int64_t inter = fp4 ? 2 * a.down.shape[2] : a.down.shape[2];
  const int64_t width = a.gate_up.shape[1];  // 2I (gated) or I
  const ActivationRecipe& recipe = a.activation_recipe;

  // Routing, as int64 experts and fp32 weights.
  std::vector<int64_t> route(static_cast<size_t>(tokens * top_k));
  for (int64_t i = 0; i < tokens * top_k; ++i)
    route[i] = a.top_k_index.dtype == DType::I32 ? a.top_k_index.ptr<const int32_t>()[i]
                                                 : a.top_k_index.ptr<const int64_t>()[i];
  const std::vector<float> route_weight = fast::to_float(a.top_k_weights, 0, tokens * top_k);

  fast::Epilogue out_epilogue;
  out_epilogue.out = a.out.data;
  out_epilogue.dtype = a.out.dtype;
  out_epilogue.ld = hidden;

  const int64_t chunk = std::max<int64_t>(1, kSlotBufferFloats / std::max<int64_t>(1, top_k * hidden));
  std::vector<float> slot_out, x_chunk, x_expert, h, act, act_q, y;
  std::vector<std::vector<int64_t>> slots_of(static_cast<size_t>(experts));
  for (int64_t t0 = 0; t0 < tokens; t0 += chunk) {
    const int64_t tc = std::min(chunk, tokens - t0);

    // Per-expert lists of (token, slot), in token order then slot order.
    for (auto& s : slots_of) s.clear();
    for (int64_t s = t0 * top_k; s < (t0 + tc) * top_k; ++s)
      if (route[s] >= 0) slots_of[route[s]].push_back(s);

    // Hidden rows as fp32 (exact), and for dynamic recipes their quantize→dequantize once per token.
    const std::vector<float> x_raw = fast::to_float(a.hidden, t0 * hidden, tc * hidden);
    if (!recipe.is_static())
      fast::quantize_dequantize_activations(TensorView::of(x_raw.data(), DType::F32, {tc, hidden}), {}, recipe,
                                            x_chunk);

    slot_out.assign(static_cast<size_t>(tc * top_k * hidden), 0.0f);
    for (int64_t e = 0; e < experts; ++e) {
      const std::vector<int64_t>& slots = slots_of[e];
      const int64_t rows = static_cast<int64_t>(slots.size());
      if (rows == 0) continue;

      // The expert's input rows, dequantized.
      x_expert.resize(static_cast<size_t>(rows * hidden));
      const std::vector<float>& source = recipe.is_static() ? x_raw : x_chunk;
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t t = slots[r] / top_k - t0;
        std::copy_n(source.data() + t * hidden, hidden, x_expert.data() + r * hidden);
      }
      if (recipe.is_static()) {
        std::vector<float> raw = std::move(x_expert);
        fast::quantize_dequantize_activations(TensorView::of(raw.data(), DType::F32, {rows, hidden}),
                                              scalar_at(a.gate_up_act_scale, e), recipe, x_expert);
      }

      // gate_up (+ bias) → activation → requantize.
      h.resize(static_cast<size_t>(rows * width));
      std::vector<float> gate_up_bias;
      if (a.gate_up_bias.defined()) gate_up_bias = fast::to_float(a.gate_up_bias, e * width, width);
      fast::Epilogue h_epilogue{h.data(), DType::F32, width, gate_up_bias.empty() ? nullptr : gate_up_bias.data()};
      fast::gemm(x_expert.data(), rows, hidden,
                 fast::quantized_weight(a.gate_up, a.gate_up_scale, a.weight_recipe, hidden, e), h_epilogue);

      act.resize(static_cast<size_t>(rows * inter));
      apply_activation(a, h.data(), rows, width, inter, act.data());
      fast::quantize_dequantize_activations(
          TensorView::of(act.data(), DType::F32, {rows, inter}),
          recipe.is_static() ? scalar_at(a.down_act_scale, e) : TensorView{}, recipe, act_q);

      // down (+ bias), then scatter each row to its slot.
      y.resize(static_cast<size_t>(rows * hidden));
      std::vector<float> down_bias;
      if (a.down_bias.defined()) down_bias = fast::to_float(a.down_bias, e * hidden, hidden);
      fast::Epilogue y_epilogue{y.data(), DType::F32, hidden, down_bias.empty() ? nullptr : down_bias.data()};
      fast::gemm(act_q.data(), rows, inter, fast::quantized_weight(a.down, a.down_scale, a.weight_recipe, inter, e),
                 y_epilogue);
      for (int64_t r = 0; r < rows; ++r)
        std::copy_n(y.data() + r * hidden, hidden, slot_out.data() + (slots[r] - t0 * top_k) * hidden);
    }

    // Combine in slot order 0..k-1, in double: the same bits for any thread count.
#pragma omp parallel if (tc * hidden >= (1 << 15))
    {
      std::vector<double> sum(static_cast<size_t>(hidden));
      std::vector<float> row(static_cast<size_t>(hidden));
#pragma omp for schedule(static)
      for (int64_t t = 0; t < tc; ++t) {
        std::fill(sum.begin(), sum.end(), 0.0);
        for (int64_t j = 0; j < top_k; ++j) {
          const int64_t s = (t0 + t) * top_k + j;
          if (route[s] < 0) continue;
          const double w = route_weight[s];
          const float* ys = slot_out.data() + (t * top_k + j) * hidden;
          for (int64_t c = 0; c < hidden; ++c) sum[c] += w * ys[c];
        }
        for (int64_t c = 0; c < hidden; ++c) row[c] = static_cast<float>(sum[c]);
        fast::Epilogue ep = out_epilogue;
        ep.out = static_cast<uint8_t*>(a.out.data) + (t0 + t) * hidden * dtype_size(a.out.dtype);
        fast::store_row(ep, 0, 0, row.data(), hidden);
      }
    }
  }
}

}  // namespace finegemm::cpu
