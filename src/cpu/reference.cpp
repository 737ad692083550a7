// The CPU reference: the definition of every op (RECIPES.md), written to be obviously right rather than fast.
// Plain loops, double accumulation, one scale lookup per element. Every other backend is tested against it.
// Independent outputs (a linear's rows, an MoE layer's routed slots) run on OpenMP threads: each output's arithmetic,
// and so every bit of the result, is that of the plain loop, whatever the thread count.
// Arguments arrive validated (src/core/validate.cpp): dtypes, shapes, contiguity and scale values hold.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/formats.hpp"
#include "cpu/cpu_backend.hpp"
#include "finegemm/error.hpp"

namespace finegemm::cpu {
namespace {

// ---- Element access.

// Element i of a float-like tensor (F32/BF16/F16/F8_E4M3), exactly.
float load(const TensorView& t, int64_t i) {
  switch (t.dtype) {
    case DType::F32: return t.ptr<const float>()[i];
    case DType::BF16: return fmt::bf16_to_float(t.ptr<const uint16_t>()[i]);
    case DType::F16: return fmt::f16_to_float(t.ptr<const uint16_t>()[i]);
    case DType::F8_E4M3: return fmt::e4m3_to_float(t.ptr<const uint8_t>()[i]);
    default: throw Error(ErrorKind::Type, std::string("reference: cannot read ") + dtype_name(t.dtype) + " as float");
  }
}

// Rounds a double to float with round-to-odd: the float nearest v toward zero, with its last bit set when
// inexact. Rounding that float to bf16/f16 (RNE) then equals rounding v to bf16/f16 directly, which a plain
// double → float → bf16 chain gets wrong when the first rounding lands exactly on a bf16 midpoint.
float round_to_odd(double v) {
  float f = static_cast<float>(v);
  if (!std::isfinite(f) || static_cast<double>(f) == v) return f;
  // Step toward zero if the nearest rounding went away from zero.
  if (std::fabs(static_cast<double>(f)) > std::fabs(v)) f = std::nextafter(f, 0.0f);
  uint32_t bits = fmt::float_bits(f);
  bits |= 1u;  // inexact: make it odd
  return fmt::bits_float(bits);
}

// Writes v to element i of an F32/BF16/F16 tensor, rounding to nearest even once.
void store(const TensorView& t, int64_t i, double v) {
  switch (t.dtype) {
    case DType::F32: t.ptr<float>()[i] = static_cast<float>(v); break;
    case DType::BF16: t.ptr<uint16_t>()[i] = fmt::bf16_from_float(round_to_odd(v)); break;
    case DType::F16: t.ptr<uint16_t>()[i] = fmt::f16_from_float(round_to_odd(v)); break;
    default: throw Error(ErrorKind::Type, std::string("reference: cannot write ") + dtype_name(t.dtype));
  }
}

int64_t load_index(const TensorView& t, int64_t i) {
  return t.dtype == DType::I32 ? t.ptr<const int32_t>()[i] : t.ptr<const int64_t>()[i];
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ---- Weights.

// The rows × columns of the weight that one scale covers.
struct ScaleBlock {
  int64_t rows, cols;
};
ScaleBlock scale_block(const WeightRecipe& r, int64_t n, int64_t k) {
  switch (r.granularity) {
    case WeightGranularity::PerTensor: return {std::max<int64_t>(n, 1), std::max<int64_t>(k, 1)};
    case WeightGranularity::PerChannel: return {1, std::max<int64_t>(k, 1)};
    case WeightGranularity::Block: return {r.block_n, r.block_k};
    case WeightGranularity::MX: return {1, 32};
  }
  return {1, 1};
}

// Scale elements one [n, k] weight carries (what an expert's slice of an [E, ...] scale tensor holds).
int64_t scale_numel(const WeightRecipe& r, int64_t n, int64_t k) {
  int64_t count = 1;
  for (int64_t d : weight_scale_shape(r, n, k)) count *= d;
  return count;
}

// One quantized [n, k] weight: the whole weight of a linear, or one expert's slice.
struct QuantizedMatrix {
  const uint8_t* codes;  // F8 E4M3 codes [n, k], or packed FP4 bytes [n, k/2]
  const void* scales;    // this matrix's scales, laid out as weight_scale_shape(recipe, n, k)
  WeightRecipe recipe;
  int64_t n, k;

  double element(int64_t row, int64_t col) const {
    if (recipe.element == ElementType::FP4_E2M1)
      return fmt::e2m1_to_float(fmt::e2m1_unpack(codes[row * (k / 2) + col / 2], static_cast<int>(col)));
    return fmt::e4m3_to_float(codes[row * k + col]);
  }

  double scale(int64_t row, int64_t col) const {
    const ScaleBlock b = scale_block(recipe, n, k);
    const int64_t sr = row / b.rows, sc = col / b.cols;
    const int64_t cols = recipe.scale_cols(k);
    switch (recipe.scale_format) {
      case ScaleFormat::FP32: return static_cast<const float*>(scales)[sr * cols + sc];
      case ScaleFormat::UE8M0: return fmt::ue8m0_to_float(static_cast<const uint8_t*>(scales)[sr * cols + sc]);
      case ScaleFormat::UE8M0_PACKED: {
        const int32_t packed = static_cast<const int32_t*>(scales)[sr * ceil_div(cols, 4) + sc / 4];
        return fmt::ue8m0_to_float(fmt::ue8m0_unpack(packed, static_cast<int>(sc % 4)));
      }
    }
    return NAN;
  }

  // decode(q) · scale for every element, row-major [n, k], exact in double (rows on threads: each element is exact).
  std::vector<double> dequantize() const {
    std::vector<double> w(static_cast<size_t>(n * k));
#pragma omp parallel for schedule(static) if (n * k >= (int64_t{1} << 18))
    for (int64_t row = 0; row < n; ++row)
      for (int64_t col = 0; col < k; ++col) w[row * k + col] = element(row, col) * scale(row, col);
    return w;
  }
};

QuantizedMatrix matrix_of(const TensorView& w_q, const TensorView& w_scale, const WeightRecipe& r, int64_t n,
                          int64_t k) {
  return {w_q.ptr<const uint8_t>(), w_scale.data, r, n, k};
}

// Expert e's slice of an [E, n, storage(k)] weight and its [E, ...] scales.
QuantizedMatrix expert_matrix(const TensorView& w_q, const TensorView& w_scale, const WeightRecipe& r, int64_t e,
                              int64_t n, int64_t k) {
  const int64_t code_bytes = n * weight_storage_cols(r, k);
  const int64_t scale_bytes = scale_numel(r, n, k) * static_cast<int64_t>(dtype_size(w_scale.dtype));
  return {w_q.ptr<const uint8_t>() + e * code_bytes, static_cast<const uint8_t*>(w_scale.data) + e * scale_bytes, r, n,
          k};
}

// ---- Activations.

// Quantizes one row of k floats per the recipe and returns the dequantized values, e4m3(q) · s, in double.
// Dynamic: s = max(amax, 1e-4) / 448 per group (per row for PerToken), in float, optionally rounded up to a
// power of two; static: s = static_scale. q = e4m3(x / s) with a float division.
// `codes` and `scales` (one per group), when given, receive the stored result.
std::vector<double> quantize_row(const float* x, int64_t k, const ActivationRecipe& r, float static_scale,
                                 uint8_t* codes = nullptr, float* scales = nullptr) {
  std::vector<double> deq(static_cast<size_t>(k));
  const bool grouped = r.granularity == ActGranularity::PerTokenGroup;
  const int64_t group = grouped ? r.group_size : k;
  const int64_t num_groups = grouped ? k / r.group_size : 1;  // PerToken and static: the whole row
  for (int64_t gi = 0; gi < num_groups; ++gi) {
    const int64_t g0 = gi * group, g1 = std::min(g0 + group, k);
    float s = static_scale;
    if (!r.is_static()) {
      float amax = 0.0f;
      for (int64_t c = g0; c < g1; ++c) amax = std::fmax(amax, std::fabs(x[c]));
      s = std::max(amax, 1e-4f) / fmt::kE4M3Max;
      if (r.pow2_scale) s = fmt::pow2_ceil(s);
      if (scales) scales[gi] = s;
    }
    for (int64_t c = g0; c < g1; ++c) {
      const uint8_t q = fmt::e4m3_from_float(x[c] / s);
      if (codes) codes[c] = q;
      deq[c] = static_cast<double>(fmt::e4m3_to_float(q)) * static_cast<double>(s);
    }
  }
  return deq;
}

// The activations of a linear, dequantized to double [m, k]: quantized here per the recipe when x is
// F32/BF16/F16, read with their scales when x is already F8_E4M3.
std::vector<double> linear_activations(const LinearArgs& a) {
  const int64_t m = a.x.shape[0], k = a.x.shape[1];
  const ActivationRecipe& r = a.activation;
  std::vector<double> out(static_cast<size_t>(m * k));
  if (a.x.dtype == DType::F8_E4M3) {
    const float* s = a.x_scale.ptr<const float>();
    // Group scales row-major or M-major (validate_linear): read through the strides.
    const bool groups = r.granularity == ActGranularity::PerTokenGroup;
    const int64_t stride_m = groups ? a.x_scale.strides[0] : 0, stride_g = groups ? a.x_scale.strides[1] : 0;
    for (int64_t row = 0; row < m; ++row) {
      for (int64_t c = 0; c < k; ++c) {
        float scale = s[0];
        if (groups) scale = s[row * stride_m + (c / r.group_size) * stride_g];
        if (r.granularity == ActGranularity::PerToken) scale = s[row];
        out[row * k + c] = static_cast<double>(load(a.x, row * k + c)) * scale;
      }
    }
    return out;
  }
  const float static_scale = r.is_static() ? a.x_scale.ptr<const float>()[0] : 0.0f;
  std::vector<float> row_values(static_cast<size_t>(k));
  for (int64_t row = 0; row < m; ++row) {
    for (int64_t c = 0; c < k; ++c) row_values[c] = load(a.x, row * k + c);
    const std::vector<double> deq = quantize_row(row_values.data(), k, r, static_scale);
    std::copy(deq.begin(), deq.end(), out.begin() + row * k);
  }
  return out;
}

// ---- MoE activation functions, in double.

double silu(double v) { return v / (1.0 + std::exp(-v)); }
double sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }

double gated_activation(const MoeArgs& a, double gate, double up) {
  const double limit = a.swiglu_limit;
  if (limit > 0.0) {
    gate = std::min(gate, limit);
    up = std::clamp(up, -limit, limit);
  }
  if (a.activation == MoeActivation::SwiGLUOai) return (up + 1.0) * gate * sigmoid(static_cast<double>(a.swiglu_alpha) * gate);
  return silu(gate) * up;
}

double plain_activation(MoeActivation act, double up) {
  switch (act) {
    case MoeActivation::Silu: return silu(up);
    case MoeActivation::Gelu: {
      const double kSqrt2OverPi = 0.7978845608028654;
      return 0.5 * up * (1.0 + std::tanh(kSqrt2OverPi * (up + 0.044715 * up * up * up)));
    }
    case MoeActivation::Relu2: {
      const double r = std::max(up, 0.0);
      return r * r;
    }
    default: return NAN;  // gated kinds go through gated_activation
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
void reference_quantize_activations(const TensorView& x, const ActivationRecipe& recipe, const TensorView& x_q,
                                    const TensorView& x_scale) {
  const int64_t m = x.shape[0], k = x.shape[1];
  const float static_scale = recipe.is_static() ? x_scale.ptr<const float>()[0] : 0.0f;
  const int64_t scales_per_row = recipe.granularity == ActGranularity::PerTokenGroup ? k / recipe.group_size : 1;
  std::vector<float> row_values(static_cast<size_t>(k));
  for (int64_t row = 0; row < m; ++row) {
    for (int64_t c = 0; c < k; ++c) row_values[c] = load(x, row * k + c);
    float* scales = recipe.is_static() ? nullptr : x_scale.ptr<float>() + row * scales_per_row;
    quantize_row(row_values.data(), k, recipe, static_scale, x_q.ptr<uint8_t>() + row * k, scales);
  }
}

void reference_quantize_weights(const TensorView& w, const WeightRecipe& recipe, const TensorView& w_q,
                                const TensorView& w_scale) {
  const int64_t n = w.shape[0], k = w.shape[1];
  const bool fp4 = recipe.element == ElementType::FP4_E2M1;
  const float element_max = fp4 ? fmt::kE2M1Max : fmt::kE4M3Max;
  const ScaleBlock b = scale_block(recipe, n, k);
  const int64_t scale_rows = recipe.scale_rows(n), scale_cols = recipe.scale_cols(k);
  const int64_t packed_cols = ceil_div(scale_cols, 4);
  uint8_t* codes = w_q.ptr<uint8_t>();
  if (fp4) std::memset(codes, 0, static_cast<size_t>(n * (k / 2)));
  if (recipe.scale_format == ScaleFormat::UE8M0_PACKED) {
    // Padding scales past the last K group are 1.0 (byte 127).
    for (int64_t i = 0; i < scale_rows * packed_cols; ++i) w_scale.ptr<int32_t>()[i] = fmt::ue8m0_pack(127, 127, 127, 127);
  }

  for (int64_t sr = 0; sr < scale_rows; ++sr) {
    for (int64_t sc = 0; sc < scale_cols; ++sc) {
      const int64_t r0 = sr * b.rows, r1 = std::min(r0 + b.rows, n);
      const int64_t c0 = sc * b.cols, c1 = std::min(c0 + b.cols, k);
      float amax = 0.0f;
      for (int64_t row = r0; row < r1; ++row)
        for (int64_t c = c0; c < c1; ++c) amax = std::fmax(amax, std::fabs(load(w, row * k + c)));
      // s = amax / max; an all-zero block gets s = 1 (any positive scale decodes its zeros).
      float s = amax > 0.0f ? amax / element_max : 1.0f;
      switch (recipe.scale_format) {
        case ScaleFormat::FP32: w_scale.ptr<float>()[sr * scale_cols + sc] = s; break;
        case ScaleFormat::UE8M0: {
          const uint8_t e = fmt::ue8m0_ceil(s);
          w_scale.ptr<uint8_t>()[sr * scale_cols + sc] = e;
          s = fmt::ue8m0_to_float(e);
          break;
        }
        case ScaleFormat::UE8M0_PACKED: {
          const uint8_t e = fmt::ue8m0_ceil(s);
          int32_t& word = w_scale.ptr<int32_t>()[sr * packed_cols + sc / 4];
          const int shift = static_cast<int>(8 * (sc % 4));
          word = static_cast<int32_t>((static_cast<uint32_t>(word) & ~(0xFFu << shift)) | (uint32_t(e) << shift));
          s = fmt::ue8m0_to_float(e);
          break;
        }
      }
      for (int64_t row = r0; row < r1; ++row) {
        for (int64_t c = c0; c < c1; ++c) {
          const float v = load(w, row * k + c) / s;
          if (fp4) {
            uint8_t& byte = codes[row * (k / 2) + c / 2];
            const uint8_t nibble = fmt::e2m1_from_float(v);
            byte = (c & 1) ? fmt::e2m1_pack(fmt::e2m1_unpack(byte, 0), nibble) : fmt::e2m1_pack(nibble, fmt::e2m1_unpack(byte, 1));
          } else {
            codes[row * k + c] = fmt::e4m3_from_float(v);
          }
        }
      }
    }
  }
}

void reference_dequantize_weights(const TensorView& w_q, const TensorView& w_scale, const WeightRecipe& recipe,
                                  const TensorView& w) {
  // dequantize_weights has no validation of its own: its arguments are those of quantize_weights, reversed.
  validate_quantize_weights(w, recipe, w_q, w_scale);
  const int64_t n = w.shape[0], k = w.shape[1];
  const QuantizedMatrix q = matrix_of(w_q, w_scale, recipe, n, k);
  for (int64_t row = 0; row < n; ++row)
    for (int64_t c = 0; c < k; ++c) store(w, row * k + c, q.element(row, c) * q.scale(row, c));
}

// y[row, col] = Σ_c x[row, c] · w[col, c] (c = 0..k-1 in order, in double), + bias[col]; y is [m, n] row-major
// (a linear's outputs; an expert's projections of one row, m = 1).
// The outputs are independent, so rows are spread over threads; four columns at a time only so that four sums'
// additions overlap (each still adds its products in the order above: the same bits as one column at a time).
// No throwing call inside: the caller stores the doubles.
// NOTE: threads and four sums at a time: M = 400, N = 1800, K = 2048 took 3.66 s one column at a time and 0.38 s so
// (two cores; byte for byte the same output); the GPU tests compare against this reference on large shapes.
void dot_rows(const double* x, const double* w, const double* bias, int64_t m, int64_t n, int64_t k, double* y) {
#pragma omp parallel for schedule(dynamic, 1) if (m * n * k >= (int64_t{1} << 22))
  for (int64_t row = 0; row < m; ++row) {
    const double* xr = x + row * k;
    int64_t col = 0;
    for (; col + 4 <= n; col += 4) {
      double acc[4] = {0.0, 0.0, 0.0, 0.0};
      for (int64_t c = 0; c < k; ++c)
        for (int j = 0; j < 4; ++j) acc[j] += xr[c] * w[(col + j) * k + c];
      for (int j = 0; j < 4; ++j) y[row * n + col + j] = bias ? acc[j] + bias[col + j] : acc[j];
    }
    for (; col < n; ++col) {
      double acc = 0.0;
      for (int64_t c = 0; c < k; ++c) acc += xr[c] * w[col * k + c];
      y[row * n + col] = bias ? acc + bias[col] : acc;
    }
  }
}

void reference_linear(const LinearArgs& a) {
  const int64_t m = a.x.shape[0], k = a.x.shape[1], n = a.weight.shape[0];
  const std::vector<double> x = linear_activations(a);
  const std::vector<double> w = matrix_of(a.weight, a.weight_scale, a.weight_recipe, n, k).dequantize();
  std::vector<double> bias;
  if (a.bias.defined())
    for (int64_t col = 0; col < n; ++col) bias.push_back(load(a.bias, col));
  std::vector<double> y(static_cast<size_t>(m * n));
  dot_rows(x.data(), w.data(), bias.empty() ? nullptr : bias.data(), m, n, k, y.data());
  for (int64_t i = 0; i < m * n; ++i) store(a.out, i, y[i]);
}

void reference_moe(const MoeArgs& a) {
  const int64_t tokens = a.hidden.shape[0], h = a.hidden.shape[1];
  const int64_t top_k = a.top_k_index.shape[1];
  const int64_t experts = a.gate_up.shape[0];
  const WeightRecipe& wr = a.weight_recipe;
  const ActivationRecipe& ar = a.activation_recipe;
  const int64_t inter = wr.element == ElementType::FP4_E2M1 ? 2 * a.down.shape[2] : a.down.shape[2];
  const bool gated = moe_activation_has_gate(a.activation);
  const int64_t rows = gated ? 2 * inter : inter;

  // y of every routed (token, slot), [T·k, H]; combined in slot order at the end.
  std::vector<double> slot_out(static_cast<size_t>(tokens * top_k * h), 0.0);
  // The hidden states as floats, read once (no throwing call in the parallel loop below).
  std::vector<float> hidden(static_cast<size_t>(tokens * h));
  for (int64_t i = 0; i < tokens * h; ++i) hidden[i] = load(a.hidden, i);

  // Expert-major: each used expert's weights are dequantized once.
  for (int64_t e = 0; e < experts; ++e) {
    std::vector<int64_t> routed;  // flat (t·k + j) of the slots that chose e
    for (int64_t i = 0; i < tokens * top_k; ++i)
      if (load_index(a.top_k_index, i) == e) routed.push_back(i);
    if (routed.empty()) continue;

    const std::vector<double> w_gate_up = expert_matrix(a.gate_up, a.gate_up_scale, wr, e, rows, h).dequantize();
    const std::vector<double> w_down = expert_matrix(a.down, a.down_scale, wr, e, h, inter).dequantize();
    const float gate_up_static = ar.is_static() ? a.gate_up_act_scale.ptr<const float>()[e] : 0.0f;
    const float down_static = ar.is_static() ? a.down_act_scale.ptr<const float>()[e] : 0.0f;
    std::vector<double> gate_up_bias, down_bias;
    if (a.gate_up_bias.defined())
      for (int64_t r = 0; r < rows; ++r) gate_up_bias.push_back(load(a.gate_up_bias, e * rows + r));
    if (a.down_bias.defined())
      for (int64_t c = 0; c < h; ++c) down_bias.push_back(load(a.down_bias, e * h + c));

    // The routed slots are independent (each writes its own row of slot_out): spread over threads.
#pragma omp parallel for schedule(dynamic, 1) if (routed.size() > 1 && static_cast<int64_t>(routed.size()) * rows * h >= (int64_t{1} << 20))
    for (size_t ri = 0; ri < routed.size(); ++ri) {
      const int64_t flat = routed[ri];
      const int64_t t = flat / top_k;
      std::vector<float> act(static_cast<size_t>(inter));
      std::vector<double> hidden_proj(static_cast<size_t>(rows));
      // Quantize the token per the activation recipe, then the gate/up projection.
      const std::vector<double> x = quantize_row(hidden.data() + t * h, h, ar, gate_up_static);
      dot_rows(x.data(), w_gate_up.data(), gate_up_bias.empty() ? nullptr : gate_up_bias.data(), 1, rows, h,
               hidden_proj.data());
      // Activation in double, rounded to float: the GPU does the same from its fp32 accumulator.
      for (int64_t i = 0; i < inter; ++i) {
        double v;
        if (gated) {
          const int64_t gate_row = a.interleaved_gate_up ? 2 * i : i;
          const int64_t up_row = a.interleaved_gate_up ? 2 * i + 1 : inter + i;
          v = gated_activation(a, hidden_proj[gate_row], hidden_proj[up_row]);
        } else {
          v = plain_activation(a.activation, hidden_proj[i]);
        }
        act[i] = static_cast<float>(v);
      }
      // Requantize the intermediate per the recipe, then the down projection.
      const std::vector<double> mid = quantize_row(act.data(), inter, ar, down_static);
      dot_rows(mid.data(), w_down.data(), down_bias.empty() ? nullptr : down_bias.data(), 1, h, inter,
               slot_out.data() + flat * h);
    }
  }

  // Deterministic combine: out[t] = Σ_j w[t,j] · y[t,j] in slot order j = 0..k-1, in double.
  std::vector<double> acc(static_cast<size_t>(h));
  for (int64_t t = 0; t < tokens; ++t) {
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t j = 0; j < top_k; ++j) {
      const int64_t flat = t * top_k + j;
      if (load_index(a.top_k_index, flat) == -1) continue;
      const double weight = load(a.top_k_weights, flat);
      for (int64_t c = 0; c < h; ++c) acc[c] += weight * slot_out[flat * h + c];
    }
    for (int64_t c = 0; c < h; ++c) store(a.out, t * h + c, acc[c]);
  }
}

}  // namespace finegemm::cpu
