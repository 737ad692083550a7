// Argument checks for every op. Each failure throws finegemm::Error naming the argument, what was
// expected and what was given (ErrorKind::Type for a wrong dtype, ErrorKind::Value for everything else).
//
// Order of the checks: recipes first, then each tensor's presence, dtype, rank and shape, then the
// divisibility the recipe needs, then layout (contiguity, one device), and last, for CPU tensors only,
// the values (scales finite and > 0, routing indices in range). CUDA tensors skip the value checks:
// reading them would cost a copy, and the GPU kernels guard against bad indices themselves.
#include <cmath>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "core/formats.hpp"
#include "finegemm/error.hpp"
#include "finegemm/linear.hpp"
#include "finegemm/moe.hpp"
#include "finegemm/quantize.hpp"

namespace finegemm {

bool moe_activation_has_gate(MoeActivation act) {
  return act == MoeActivation::SwiGLU || act == MoeActivation::SwiGLUOai;
}

const char* moe_activation_name(MoeActivation act) {
  switch (act) {
    case MoeActivation::SwiGLU: return "swiglu";
    case MoeActivation::SwiGLUOai: return "swiglu-oai";
    case MoeActivation::Silu: return "silu";
    case MoeActivation::Gelu: return "gelu";
    case MoeActivation::Relu2: return "relu2";
  }
  return "?";
}

namespace {

using Shape = std::vector<int64_t>;

[[noreturn]] void fail(const std::string& message) { throw Error(ErrorKind::Value, message); }
[[noreturn]] void fail_type(const std::string& message) { throw Error(ErrorKind::Type, message); }

std::string str(int64_t v) { return std::to_string(v); }

std::string join_dtypes(std::initializer_list<DType> dtypes) {
  std::string s;
  size_t i = 0;
  for (DType d : dtypes) {
    if (i > 0) s += (i + 1 == dtypes.size()) ? " or " : ", ";
    s += dtype_name(d);
    ++i;
  }
  return s;
}

std::string join_shapes(const std::vector<Shape>& shapes) {
  std::string s;
  for (size_t i = 0; i < shapes.size(); ++i) s += (i ? " or " : "") + shape_string(shapes[i]);
  return s;
}

Shape prepend(int64_t lead, Shape shape) {
  if (lead >= 0) shape.insert(shape.begin(), lead);
  return shape;
}

// "[3, 1]": the multi-index of flat element i of t.
std::string index_string(const TensorView& t, int64_t i) {
  if (t.ndim <= 0) return "[]";
  Shape idx(static_cast<size_t>(t.ndim));
  for (int d = t.ndim - 1; d >= 0; --d) {
    idx[d] = t.shape[d] > 0 ? i % t.shape[d] : 0;
    i = t.shape[d] > 0 ? i / t.shape[d] : 0;
  }
  return shape_string(idx);
}

std::string float_string(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

const char* granularity_name(WeightGranularity g) {
  switch (g) {
    case WeightGranularity::PerTensor: return "per-tensor";
    case WeightGranularity::PerChannel: return "per-channel";
    case WeightGranularity::Block: return "block";
    case WeightGranularity::MX: return "MX (1x32)";
  }
  return "?";
}

// ---- Single-tensor checks.

void require(const TensorView& t, const char* name, const std::string& what) {
  if (!t.defined()) fail(std::string(name) + ": required (" + what + "), but it was left out");
}

void forbid(const TensorView& t, const char* name, const std::string& why) {
  if (t.defined()) fail(std::string(name) + ": expected no tensor (" + why + "), got one of shape " + shape_string(t));
}

void check_dtype(const TensorView& t, const char* name, std::initializer_list<DType> allowed,
                 const std::string& note = "") {
  for (DType d : allowed)
    if (t.dtype == d) return;
  fail_type(std::string(name) + ": expected dtype " + join_dtypes(allowed) + (note.empty() ? "" : " (" + note + ")") +
            ", got " + dtype_name(t.dtype));
}

void check_ndim(const TensorView& t, const char* name, int ndim, const char* layout) {
  if (t.ndim != ndim)
    fail(std::string(name) + ": expected " + str(ndim) + " dimensions " + layout + ", got shape " + shape_string(t));
}

// One of several accepted shapes; `context` says where the numbers come from.
void check_shape(const TensorView& t, const char* name, const std::vector<Shape>& accepted, const std::string& context) {
  for (const Shape& s : accepted)
    if (t.sizes() == s) return;
  fail(std::string(name) + ": expected shape " + join_shapes(accepted) + (context.empty() ? "" : " " + context) +
       ", got " + shape_string(t));
}

// An M-major [M, G] scale tensor: stride 1 along M and a leading dimension ld ≥ M along G (the layout cuBLASLt's
// block-scaled A and DeepGEMM read; a transposed view of a [G, ld] tensor).
bool is_m_major(const TensorView& t) {
  return t.ndim == 2 && (t.shape[0] == 1 || t.strides[0] == 1) && (t.shape[1] == 1 || t.strides[1] >= t.shape[0]);
}

// Layout: contiguous (or, where m_major_ok, M-major: is_m_major), data present, and on the same device as every other
// tensor of the op.
class Layout {
 public:
  void operator()(const TensorView& t, const char* name, bool m_major_ok = false) {
    if (!t.defined()) return;
    if (!t.is_contiguous() && !(m_major_ok && is_m_major(t))) {
      Shape strides(t.strides, t.strides + t.ndim);
      fail(std::string(name) + ": expected a contiguous (row-major) tensor" +
           (m_major_ok ? " or an M-major one (strides [1, ld] with ld >= " + str(t.ndim == 2 ? t.shape[0] : 0) + ")" : "") +
           ", got shape " + shape_string(t) + " with strides " + shape_string(strides) + "; make it contiguous first");
    }
    if (t.data == nullptr && t.numel() > 0)
      fail(std::string(name) + ": expected data for shape " + shape_string(t) + ", got a null pointer");
    if (first_name_ == nullptr) {
      first_name_ = name;
      first_ = t.device;
    } else if (!(t.device == first_)) {
      fail(std::string(name) + ": expected every tensor on one device (" + first_name_ + " is on " +
           device_name(first_) + "), got " + device_name(t.device));
    }
  }

 private:
  const char* first_name_ = nullptr;
  Device first_{};
};

bool on_host(const TensorView& t) { return t.defined() && t.device.type == DeviceType::CPU; }

// F32 scales: finite and > 0 (every scale is a dequantization multiplier). Contiguous, or 2-D with any strides (an
// M-major x_scale): element i (row-major order) is read through the strides.
void check_f32_scale_values(const TensorView& t, const char* name) {
  if (!on_host(t)) return;
  const float* s = t.ptr<const float>();
  const bool strided = t.ndim == 2 && !t.is_contiguous();
  for (int64_t i = 0; i < t.numel(); ++i) {
    const float v = strided ? s[(i / t.shape[1]) * t.strides[0] + (i % t.shape[1]) * t.strides[1]] : s[i];
    if (!(std::isfinite(v) && v > 0.0f))
      fail(std::string(name) + ": expected finite scales > 0, got " + float_string(v) + " at index " +
           index_string(t, i));
  }
}

// Weight scales in any format. `used_cols`: how many scales along K each row holds (packed UE8M0 pads
// the last int32; the padding bytes are not checked).
void check_weight_scale_values(const TensorView& t, const char* name, const WeightRecipe& recipe, int64_t used_cols) {
  if (!on_host(t)) return;
  switch (recipe.scale_format) {
    case ScaleFormat::FP32: return check_f32_scale_values(t, name);
    case ScaleFormat::UE8M0: {
      const uint8_t* s = t.ptr<const uint8_t>();
      for (int64_t i = 0; i < t.numel(); ++i)
        if (s[i] == 255)
          fail(std::string(name) + ": expected finite UE8M0 scales, got NaN (byte 255) at index " + index_string(t, i));
      return;
    }
    case ScaleFormat::UE8M0_PACKED: {
      const int32_t* s = t.ptr<const int32_t>();
      const int64_t cols = t.ndim > 0 ? t.shape[t.ndim - 1] : 1;
      for (int64_t i = 0; i < t.numel(); ++i) {
        const int64_t c = cols > 0 ? i % cols : 0;
        for (int j = 0; j < 4; ++j) {
          if (4 * c + j >= used_cols) break;
          if (fmt::ue8m0_unpack(s[i], j) == 255)
            fail(std::string(name) + ": expected finite UE8M0 scales, got NaN (byte 255) in byte " + str(j) +
                 " of int32 at index " + index_string(t, i));
        }
      }
      return;
    }
  }
}

// ---- Recipes.

void check_weight_recipe(const WeightRecipe& r) {
  const std::string given = " (recipe " + r.name() + ")";
  switch (r.granularity) {
    case WeightGranularity::Block:
      if (r.block_n <= 0 || r.block_k <= 0)
        fail("weight_recipe: expected positive block sizes, got " + str(r.block_n) + "x" + str(r.block_k));
      break;
    case WeightGranularity::MX:
      if (r.block_n != 1 || r.block_k != 32)
        fail("weight_recipe: MX granularity means 1x32 blocks, got " + str(r.block_n) + "x" + str(r.block_k));
      break;
    case WeightGranularity::PerTensor:
    case WeightGranularity::PerChannel: break;
    default: fail("weight_recipe: unknown granularity " + str(static_cast<int>(r.granularity)));
  }
  if (r.element != ElementType::FP8_E4M3 && r.element != ElementType::FP4_E2M1)
    fail("weight_recipe: unknown element type " + str(static_cast<int>(r.element)));
  if (r.element == ElementType::FP4_E2M1 && r.granularity != WeightGranularity::MX)
    fail(std::string("weight_recipe: FP4 E2M1 elements need MX (1x32) granularity, got ") +
         granularity_name(r.granularity) + given);
  if (r.scale_format != ScaleFormat::FP32 && r.scale_format != ScaleFormat::UE8M0 &&
      r.scale_format != ScaleFormat::UE8M0_PACKED)
    fail("weight_recipe: unknown scale format " + str(static_cast<int>(r.scale_format)));
  if (r.scale_format != ScaleFormat::FP32 &&
      (r.granularity == WeightGranularity::PerTensor || r.granularity == WeightGranularity::PerChannel))
    fail(std::string("weight_recipe: UE8M0 scales need block or MX granularity, got ") +
         granularity_name(r.granularity) + given);
}

void check_activation_recipe(const ActivationRecipe& r, const char* name) {
  switch (r.granularity) {
    case ActGranularity::PerTokenGroup:
      if (r.group_size != 32 && r.group_size != 128)
        fail(std::string(name) + ": expected group_size 32 or 128 for per-token-group scales, got " +
             str(r.group_size));
      break;
    case ActGranularity::PerToken: break;
    case ActGranularity::StaticPerTensor:
      if (r.pow2_scale)
        fail(std::string(name) + ": pow2_scale rounds dynamic scales; a static recipe reads its scale as given, "
                                 "got pow2_scale=true");
      break;
    default: fail(std::string(name) + ": unknown granularity " + str(static_cast<int>(r.granularity)));
  }
}

// ---- Shapes derived from the recipes.

// "for N=7168, K=2048 with 128x128 blocks"
std::string scale_context(const WeightRecipe& r, const char* n_label, int64_t n, const char* k_label, int64_t k) {
  std::string s = std::string("for ") + n_label + "=" + str(n) + ", " + k_label + "=" + str(k);
  switch (r.granularity) {
    case WeightGranularity::PerTensor: s += " with one per-tensor scale"; break;
    case WeightGranularity::PerChannel: s += " with per-channel scales"; break;
    case WeightGranularity::Block: s += " with " + str(r.block_n) + "x" + str(r.block_k) + " blocks"; break;
    case WeightGranularity::MX: s += " with 1x32 groups"; break;
  }
  if (r.scale_format == ScaleFormat::UE8M0_PACKED) s += ", 4 UE8M0 scales packed per int32";
  return s;
}

// The K the weight recipe needs: a multiple of block_k (Block) or 32 (MX, and FP4 storage).
void check_weight_k(const WeightRecipe& r, const char* name, const char* k_label, int64_t k) {
  int64_t multiple = 1;
  std::string why;
  if (r.granularity == WeightGranularity::Block) {
    multiple = r.block_k;
    why = "block_k=" + str(r.block_k);
  } else if (r.granularity == WeightGranularity::MX) {
    multiple = 32;
    why = "the 1x32 MX groups";
  }
  if (k % multiple != 0)
    fail(std::string(name) + ": " + k_label + "=" + str(k) + " must be a multiple of " + str(multiple) + " for " + why +
         " (recipe " + r.name() + ")");
}

void check_activation_k(const ActivationRecipe& r, const char* name, const char* k_label, int64_t k) {
  if (r.granularity == ActGranularity::PerTokenGroup && k % r.group_size != 0)
    fail(std::string(name) + ": " + k_label + "=" + str(k) + " must be a multiple of the activation group size " +
         str(r.group_size) + " (recipe " + r.name() + ")");
}

void check_weight_dtype(const TensorView& w, const char* name, const WeightRecipe& r) {
  if (r.element == ElementType::FP4_E2M1)
    check_dtype(w, name, {DType::U8, DType::I8}, "packed FP4 E2M1, two per byte, for recipe " + r.name());
  else
    check_dtype(w, name, {DType::F8_E4M3}, "recipe " + r.name());
}

void check_weight_scale_dtype(const TensorView& s, const char* name, const WeightRecipe& r) {
  switch (r.scale_format) {
    case ScaleFormat::FP32: return check_dtype(s, name, {DType::F32}, "FP32 scales, recipe " + r.name());
    case ScaleFormat::UE8M0:
      return check_dtype(s, name, {DType::F8_E8M0, DType::U8}, "UE8M0 scales, recipe " + r.name());
    case ScaleFormat::UE8M0_PACKED:
      return check_dtype(s, name, {DType::I32}, "4 UE8M0 scales packed per int32, recipe " + r.name());
  }
}

// Accepted scale shapes for an [n, k] weight, with `experts` leading (or -1 for none).
std::vector<Shape> weight_scale_shapes(const WeightRecipe& r, int64_t experts, int64_t n, int64_t k) {
  switch (r.granularity) {
    case WeightGranularity::PerTensor: return {prepend(experts, {}), prepend(experts, {1})};
    case WeightGranularity::PerChannel: return {prepend(experts, {n}), prepend(experts, {n, 1})};
    default: return {prepend(experts, weight_scale_shape(r, n, k))};
  }
}

// A quantized weight [experts?, n, storage(k)] and its scales. Divisibility of k is checked by the caller
// (before this, so that "K not a multiple of the block" is the message a ragged K gets); the scale values
// after the layout checks.
void check_weight_and_scale(const TensorView& w, const char* w_name, const TensorView& s, const char* s_name,
                            const WeightRecipe& r, int64_t experts, const char* n_label, int64_t n,
                            const char* k_label, int64_t k) {
  check_weight_dtype(w, w_name, r);
  const int64_t cols = weight_storage_cols(r, k);
  const std::string layout = std::string(experts >= 0 ? "[E, " : "[") + n_label + ", " + k_label +
                             (r.element == ElementType::FP4_E2M1 ? "/2]" : "]");
  std::string context = "(" + layout + " for " + n_label + "=" + str(n) + ", " + k_label + "=" + str(k) +
                        (experts >= 0 ? ", E=" + str(experts) : "") + ")";
  check_shape(w, w_name, {prepend(experts, {n, cols})}, context);

  require(s, s_name, "the weight scales of recipe " + r.name());
  check_weight_scale_dtype(s, s_name, r);
  check_shape(s, s_name, weight_scale_shapes(r, experts, n, k),
              scale_context(r, n_label, n, k_label, k) + (experts >= 0 ? ", E=" + str(experts) : ""));
}

void check_float_input(const TensorView& t, const char* name) {
  check_dtype(t, name, {DType::F32, DType::BF16, DType::F16});
}
void check_output(const TensorView& t, const char* name) {
  check_dtype(t, name, {DType::BF16, DType::F16, DType::F32});
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
void validate_quantize_activations(const TensorView& x, const ActivationRecipe& recipe, const TensorView& x_q,
                                   const TensorView& x_scale) {
  check_activation_recipe(recipe, "recipe");
  require(x, "x", "the [M, K] activations to quantize");
  check_float_input(x, "x");
  check_ndim(x, "x", 2, "[M, K]");
  const int64_t m = x.shape[0], k = x.shape[1];
  check_activation_k(recipe, "x", "K", k);

  require(x_q, "x_q", "the [M, K] float8_e4m3fn output");
  check_dtype(x_q, "x_q", {DType::F8_E4M3});
  check_shape(x_q, "x_q", {{m, k}}, "(same as x)");

  require(x_scale, "x_scale", recipe.is_static() ? "the static input scale" : "the output scales");
  check_dtype(x_scale, "x_scale", {DType::F32});
  const std::string ctx = "for M=" + str(m) + ", K=" + str(k) + " with recipe " + recipe.name();
  switch (recipe.granularity) {
    case ActGranularity::PerTokenGroup: check_shape(x_scale, "x_scale", {{m, k / recipe.group_size}}, ctx); break;
    case ActGranularity::PerToken: check_shape(x_scale, "x_scale", {{m}, {m, 1}}, ctx); break;
    case ActGranularity::StaticPerTensor: check_shape(x_scale, "x_scale", {{}, {1}}, ctx); break;
  }

  Layout layout;
  layout(x, "x");
  layout(x_q, "x_q");
  layout(x_scale, "x_scale");
  if (recipe.is_static()) check_f32_scale_values(x_scale, "x_scale");
}

void validate_quantize_weights(const TensorView& w, const WeightRecipe& recipe, const TensorView& w_q,
                               const TensorView& w_scale) {
  check_weight_recipe(recipe);
  require(w, "w", "the [N, K] weights to quantize");
  check_float_input(w, "w");
  check_ndim(w, "w", 2, "[N, K]");
  const int64_t n = w.shape[0], k = w.shape[1];
  check_weight_k(recipe, "w", "K", k);
  require(w_q, "w_q", "the quantized weight output");
  check_weight_and_scale(w_q, "w_q", w_scale, "w_scale", recipe, -1, "N", n, "K", k);

  Layout layout;
  layout(w, "w");
  layout(w_q, "w_q");
  layout(w_scale, "w_scale");
}

void validate_linear(const LinearArgs& a) {
  check_weight_recipe(a.weight_recipe);
  check_activation_recipe(a.activation, "activation");

  require(a.x, "x", "the [M, K] activations");
  check_dtype(a.x, "x", {DType::F32, DType::BF16, DType::F16, DType::F8_E4M3},
              "float8_e4m3fn means already quantized, with x_scale");
  check_ndim(a.x, "x", 2, "[M, K]");
  const int64_t m = a.x.shape[0], k = a.x.shape[1];
  const bool prequantized = a.x.dtype == DType::F8_E4M3;

  require(a.weight, "weight", "the [N, K] quantized weight");
  check_ndim(a.weight, "weight", 2, a.weight_recipe.element == ElementType::FP4_E2M1 ? "[N, K/2]" : "[N, K]");
  const int64_t n = a.weight.shape[0];

  check_weight_k(a.weight_recipe, "x", "K", k);
  check_activation_k(a.activation, "x", "K", k);
  check_weight_and_scale(a.weight, "weight", a.weight_scale, "weight_scale", a.weight_recipe, -1, "N", n, "K", k);

  // x_scale: the static input scale, or the scales of a pre-quantized x; otherwise nothing.
  const std::string ctx = "for M=" + str(m) + ", K=" + str(k) + " with activation recipe " + a.activation.name();
  if (prequantized || a.activation.is_static()) {
    require(a.x_scale, "x_scale",
            prequantized ? "x is float8_e4m3fn, so its scales must come with it" : "the static input scale");
    check_dtype(a.x_scale, "x_scale", {DType::F32});
    switch (a.activation.granularity) {
      case ActGranularity::PerTokenGroup:
        check_shape(a.x_scale, "x_scale", {{m, k / a.activation.group_size}}, ctx);
        break;
      case ActGranularity::PerToken: check_shape(a.x_scale, "x_scale", {{m}, {m, 1}}, ctx); break;
      case ActGranularity::StaticPerTensor: check_shape(a.x_scale, "x_scale", {{}, {1}}, ctx); break;
    }
  } else {
    forbid(a.x_scale, "x_scale", "the dynamic recipe " + a.activation.name() + " computes the scales of a " +
                                     dtype_name(a.x.dtype) + " x itself");
  }

  if (a.bias.defined()) {
    check_float_input(a.bias, "bias");
    check_shape(a.bias, "bias", {{n}}, "(N=" + str(n) + " from weight)");
  }
  require(a.out, "out", "the [M, N] output");
  check_output(a.out, "out");
  check_shape(a.out, "out", {{m, n}}, "(M=" + str(m) + " from x, N=" + str(n) + " from weight)");

  Layout layout;
  layout(a.x, "x");
  // The scales of a pre-quantized x with token groups may also be M-major.
  layout(a.x_scale, "x_scale", prequantized && a.activation.granularity == ActGranularity::PerTokenGroup);
  layout(a.weight, "weight");
  layout(a.weight_scale, "weight_scale");
  layout(a.bias, "bias");
  layout(a.out, "out");
  check_weight_scale_values(a.weight_scale, "weight_scale", a.weight_recipe, a.weight_recipe.scale_cols(k));
  if (a.x_scale.defined()) check_f32_scale_values(a.x_scale, "x_scale");
}

void validate_moe(const MoeArgs& a) {
  check_weight_recipe(a.weight_recipe);
  check_activation_recipe(a.activation_recipe, "activation_recipe");
  const WeightRecipe& r = a.weight_recipe;

  const int act = static_cast<int>(a.activation);
  if (act < 0 || act > static_cast<int>(MoeActivation::Relu2)) fail("activation: unknown MoeActivation " + str(act));
  const bool gated = moe_activation_has_gate(a.activation);
  if (std::isnan(a.swiglu_limit) || a.swiglu_limit < 0.0f)
    fail("swiglu_limit: expected a value >= 0 (0: no clamp), got " + float_string(a.swiglu_limit));
  if (a.activation == MoeActivation::SwiGLUOai && !std::isfinite(a.swiglu_alpha))
    fail("swiglu_alpha: expected a finite value, got " + float_string(a.swiglu_alpha));
  if (a.interleaved_gate_up && !gated)
    fail(std::string("interleaved_gate_up: set, but activation ") + moe_activation_name(a.activation) +
         " has no gate to interleave");

  // Tokens and routing.
  require(a.hidden, "hidden", "the [T, H] tokens");
  check_float_input(a.hidden, "hidden");
  check_ndim(a.hidden, "hidden", 2, "[T, H]");
  const int64_t t = a.hidden.shape[0], h = a.hidden.shape[1];

  require(a.top_k_index, "top_k_index", "the [T, k] routing indices");
  check_dtype(a.top_k_index, "top_k_index", {DType::I32, DType::I64});
  check_ndim(a.top_k_index, "top_k_index", 2, "[T, k]");
  const int64_t top_k = a.top_k_index.shape[1];
  check_shape(a.top_k_index, "top_k_index", {{t, top_k}}, "(T=" + str(t) + " from hidden)");
  require(a.top_k_weights, "top_k_weights", "the [T, k] routing weights");
  check_float_input(a.top_k_weights, "top_k_weights");
  check_shape(a.top_k_weights, "top_k_weights", {{t, top_k}}, "(the shape of top_k_index)");

  // Experts: E from gate_up, I from down's last dim.
  require(a.gate_up, "gate_up", gated ? "the [E, 2I, H] gate/up projection" : "the [E, I, H] up projection");
  check_weight_dtype(a.gate_up, "gate_up", r);
  check_ndim(a.gate_up, "gate_up", 3, gated ? "[E, 2I, H]" : "[E, I, H]");
  const int64_t e = a.gate_up.shape[0];
  require(a.down, "down", "the [E, H, I] down projection");
  check_weight_dtype(a.down, "down", r);
  check_ndim(a.down, "down", 3, r.element == ElementType::FP4_E2M1 ? "[E, H, I/2]" : "[E, H, I]");
  const int64_t i = r.element == ElementType::FP4_E2M1 ? 2 * a.down.shape[2] : a.down.shape[2];
  if (a.down.shape[0] != e || a.down.shape[1] != h)
    fail("down: expected shape " +
         shape_string(Shape{e, h, a.down.shape[2]}) + " (E=" + str(e) + " from gate_up, H=" + str(h) +
         " from hidden), got " + shape_string(a.down));
  const int64_t rows = gated ? 2 * i : i;

  check_weight_k(r, "hidden", "H", h);
  check_activation_k(a.activation_recipe, "hidden", "H", h);
  check_weight_k(r, "down", "I", i);
  check_activation_k(a.activation_recipe, "down", "I", i);

  const char* rows_label = gated ? "2I" : "I";
  if (a.gate_up.shape[1] != rows || a.gate_up.shape[2] != weight_storage_cols(r, h))
    fail(std::string("gate_up: expected shape ") + shape_string(Shape{e, rows, weight_storage_cols(r, h)}) + " ([E, " +
         rows_label + ", H" + (r.element == ElementType::FP4_E2M1 ? "/2" : "") + "] for I=" + str(i) +
         " from down's last dim, H=" + str(h) + " from hidden, activation " + moe_activation_name(a.activation) +
         "), got " + shape_string(a.gate_up));
  check_weight_and_scale(a.gate_up, "gate_up", a.gate_up_scale, "gate_up_scale", r, e, rows_label, rows, "H", h);
  check_weight_and_scale(a.down, "down", a.down_scale, "down_scale", r, e, "H", h, "I", i);

  // Per-expert static activation scales.
  if (a.activation_recipe.is_static()) {
    require(a.gate_up_act_scale, "gate_up_act_scale", "the static recipe needs one input scale per expert");
    check_dtype(a.gate_up_act_scale, "gate_up_act_scale", {DType::F32});
    check_shape(a.gate_up_act_scale, "gate_up_act_scale", {{e}}, "(E=" + str(e) + ")");
    require(a.down_act_scale, "down_act_scale", "the static recipe needs one input scale per expert");
    check_dtype(a.down_act_scale, "down_act_scale", {DType::F32});
    check_shape(a.down_act_scale, "down_act_scale", {{e}}, "(E=" + str(e) + ")");
  } else {
    const std::string why = "the dynamic recipe " + a.activation_recipe.name() + " computes its own scales";
    forbid(a.gate_up_act_scale, "gate_up_act_scale", why);
    forbid(a.down_act_scale, "down_act_scale", why);
  }

  if (a.gate_up_bias.defined()) {
    check_float_input(a.gate_up_bias, "gate_up_bias");
    check_shape(a.gate_up_bias, "gate_up_bias", {{e, rows}}, std::string("([E, ") + rows_label + "])");
  }
  if (a.down_bias.defined()) {
    check_float_input(a.down_bias, "down_bias");
    check_shape(a.down_bias, "down_bias", {{e, h}}, "([E, H])");
  }

  require(a.out, "out", "the [T, H] output");
  check_output(a.out, "out");
  check_shape(a.out, "out", {{t, h}}, "(the shape of hidden)");

  Layout layout;
  layout(a.hidden, "hidden");
  layout(a.top_k_index, "top_k_index");
  layout(a.top_k_weights, "top_k_weights");
  layout(a.gate_up, "gate_up");
  layout(a.gate_up_scale, "gate_up_scale");
  layout(a.down, "down");
  layout(a.down_scale, "down_scale");
  layout(a.gate_up_act_scale, "gate_up_act_scale");
  layout(a.down_act_scale, "down_act_scale");
  layout(a.gate_up_bias, "gate_up_bias");
  layout(a.down_bias, "down_bias");
  layout(a.out, "out");

  // Values (CPU only).
  check_weight_scale_values(a.gate_up_scale, "gate_up_scale", r, r.scale_cols(h));
  check_weight_scale_values(a.down_scale, "down_scale", r, r.scale_cols(i));
  if (a.gate_up_act_scale.defined()) check_f32_scale_values(a.gate_up_act_scale, "gate_up_act_scale");
  if (a.down_act_scale.defined()) check_f32_scale_values(a.down_act_scale, "down_act_scale");
  if (on_host(a.top_k_index)) {
    for (int64_t tok = 0; tok < t; ++tok) {
      for (int64_t slot = 0; slot < top_k; ++slot) {
        const int64_t flat = tok * top_k + slot;
        const int64_t idx = a.top_k_index.dtype == DType::I32 ? a.top_k_index.ptr<const int32_t>()[flat]
                                                              : a.top_k_index.ptr<const int64_t>()[flat];
        if (idx != -1 && (idx < 0 || idx >= e))
          fail("top_k_index: expected -1 (skip) or an expert in [0, " + str(e) + "), got " + str(idx) + " at token " +
               str(tok) + ", slot " + str(slot));
      }
    }
  }
}

}  // namespace finegemm
