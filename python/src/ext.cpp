// finegemm._ext: the nanobind bindings. They only translate — Python arrays to TensorView (through DLPack, no
// copies), recipe objects, and finegemm::Error to Python exceptions. Every check and every computation is the
// C++ library's; the allocation conveniences live in finegemm/__init__.py.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/operators.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "finegemm/finegemm.hpp"

namespace nb = nanobind;
using namespace nb::literals;
namespace fg = finegemm;

namespace {

// The exception classes, created at import: finegemm.Error and its ValueError / TypeError / RuntimeError children.
PyObject* g_error = nullptr;
PyObject* g_value_error = nullptr;
PyObject* g_type_error = nullptr;
PyObject* g_runtime_error = nullptr;

PyObject* make_exception(nb::module_& m, const char* name, PyObject* bases, const char* doc) {
  const std::string qualified = std::string("finegemm.") + name;
  PyObject* type = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, bases, nullptr);
  if (!type) throw nb::python_error();
  m.attr(name) = nb::borrow(type);
  return type;
}

// The Python objects whose memory the views point into, alive until the op returns.
struct Keep {
  std::vector<nb::ndarray<nb::ro>> inputs;
  std::vector<nb::ndarray<>> outputs;
  std::vector<nb::object> views;
};

std::optional<fg::DType> from_dlpack(nb::dlpack::dtype dt) {
  using Code = nb::dlpack::dtype_code;
  if (dt.lanes != 1) return std::nullopt;
  const auto code = static_cast<Code>(dt.code);
  switch (dt.bits) {
    case 8:
      if (code == Code::UInt) return fg::DType::U8;
      if (code == Code::Int) return fg::DType::I8;
      if (code == Code::Float8_E4M3FN) return fg::DType::F8_E4M3;
      if (code == Code::Float8_E8M0FNU) return fg::DType::F8_E8M0;
      break;
    case 16:
      if (code == Code::Float) return fg::DType::F16;
      if (code == Code::Bfloat) return fg::DType::BF16;
      break;
    case 32:
      if (code == Code::Float) return fg::DType::F32;
      if (code == Code::Int) return fg::DType::I32;
      break;
    case 64:
      if (code == Code::Int) return fg::DType::I64;
      break;
  }
  return std::nullopt;
}

// The dtypes some producers cannot export through DLPack: numpy with ml_dtypes refuses all three, and torch
// builds before DLPack 1.1 refuse the float8 types. Their bytes are reached through an integer view of the
// same width (no copy), and the dtype is taken from its name.
std::optional<fg::DType> from_name(std::string name) {
  if (name.rfind("torch.", 0) == 0) name = name.substr(6);
  if (name == "bfloat16") return fg::DType::BF16;
  if (name == "float8_e4m3fn") return fg::DType::F8_E4M3;
  if (name == "float8_e8m0fnu") return fg::DType::F8_E8M0;
  return std::nullopt;
}

// str(h) in Python.
std::string str_of(nb::handle h) {
  nb::object s = nb::steal(PyObject_Str(h.ptr()));
  if (!s.is_valid()) throw nb::python_error();
  return nb::str(s).c_str();
}

std::string describe(nb::handle obj) {
  std::string s = str_of(nb::getattr(obj.type(), "__module__", nb::str("?"))) + "." +
                  str_of(nb::getattr(obj.type(), "__qualname__", nb::str("?")));
  nb::object dtype = nb::getattr(obj, "dtype", nb::none());
  if (!dtype.is_none()) s += " of dtype " + str_of(dtype);
  return s;
}

template <typename Array>
bool import(nb::handle obj, Array& array) {
  return nb::try_cast(obj, array, /*convert=*/false);
}

// One argument: a DLPack array (numpy, torch, cupy, jax, ...) → TensorView on the same memory.
template <bool kWritable>
fg::TensorView to_view(nb::handle obj, const char* name, Keep& keep, bool optional = false) {
  using Array = std::conditional_t<kWritable, nb::ndarray<>, nb::ndarray<nb::ro>>;
  if (obj.is_none()) {
    if (optional) return {};
    throw fg::Error(fg::ErrorKind::Type, std::string(name) + ": expected an array, got None");
  }
  Array array;
  std::optional<fg::DType> dtype;
  nb::handle source = obj;
  bool ok = import(source, array);
  if (!ok && nb::hasattr(obj, "detach") && nb::hasattr(obj, "requires_grad") &&
      nb::cast<bool>(obj.attr("requires_grad"))) {
    // torch refuses to export a tensor that requires grad; the op never differentiates, so a detached alias
    // of the same memory is what it means.
    nb::object detached = obj.attr("detach")();
    keep.views.push_back(detached);
    source = detached;
    ok = import(source, array);
  }
  if (!ok && nb::hasattr(source, "dtype") && nb::hasattr(source, "view")) {
    dtype = from_name(str_of(source.attr("dtype")));
    if (dtype) {
      std::string package = str_of(source.type().attr("__module__"));
      package = package.substr(0, package.find('.'));
      nb::object module = nb::module_::import_(package.c_str());
      nb::object as_int = source.attr("view")(module.attr(fg::dtype_size(*dtype) == 1 ? "uint8" : "int16"));
      keep.views.push_back(as_int);
      ok = import(as_int, array);
    }
  }
  if (!ok) {
    throw fg::Error(fg::ErrorKind::Type,
                    std::string(name) + ": expected " + (kWritable ? "a writable " : "an ") +
                        "array exported through DLPack (numpy, torch, cupy, jax) with a dtype finegemm reads, got " +
                        describe(obj));
  }
  if (!dtype) dtype = from_dlpack(array.dtype());
  if (!dtype) {
    throw fg::Error(fg::ErrorKind::Type, std::string(name) +
                                             ": expected float32, float16, bfloat16, float8_e4m3fn, float8_e8m0fnu, "
                                             "uint8, int8, int32 or int64, got " +
                                             describe(obj));
  }
  if (array.ndim() > static_cast<size_t>(fg::kMaxDims)) {
    throw fg::Error(std::string(name) + ": expected at most " + std::to_string(fg::kMaxDims) + " dimensions, got " +
                    std::to_string(array.ndim()));
  }

  fg::TensorView view;
  view.data = const_cast<void*>(static_cast<const void*>(array.data()));
  view.dtype = *dtype;
  view.ndim = static_cast<int>(array.ndim());
  for (int d = 0; d < view.ndim; ++d) {
    view.shape[d] = static_cast<int64_t>(array.shape(d));
    view.strides[d] = static_cast<int64_t>(array.stride(d));
  }
  const int device_type = array.device_type();
  if (device_type == nb::device::cpu::value || device_type == nb::device::cuda_host::value) {
    view.device = {fg::DeviceType::CPU, 0};
  } else if (device_type == nb::device::cuda::value || device_type == nb::device::cuda_managed::value) {
    view.device = {fg::DeviceType::CUDA, array.device_id()};
  } else {
    throw fg::Error(fg::ErrorKind::Type, std::string(name) +
                                             ": expected an array on the CPU or a CUDA device, got "
                                             "DLPack device type " +
                                             std::to_string(device_type));
  }
  if constexpr (kWritable)
    keep.outputs.push_back(std::move(array));
  else
    keep.inputs.push_back(std::move(array));
  return view;
}

fg::TensorView in(nb::handle obj, const char* name, Keep& keep) { return to_view<false>(obj, name, keep); }
fg::TensorView in_opt(nb::handle obj, const char* name, Keep& keep) { return to_view<false>(obj, name, keep, true); }
fg::TensorView out(nb::handle obj, const char* name, Keep& keep) { return to_view<true>(obj, name, keep); }

// The MoeArgs of moe_experts and moe_experts_ep, from the arguments they share (views kept alive by `keep`).
fg::MoeArgs moe_args(nb::handle hidden, nb::handle top_k_index, nb::handle top_k_weights, nb::handle gate_up,
                     nb::handle gate_up_scale, nb::handle down, nb::handle down_scale, nb::handle out_array,
                     const fg::WeightRecipe& weight_recipe, const fg::ActivationRecipe& activation_recipe,
                     nb::handle gate_up_act_scale, nb::handle down_act_scale, nb::handle gate_up_bias,
                     nb::handle down_bias, fg::MoeActivation activation, float swiglu_limit, float swiglu_alpha,
                     bool interleaved_gate_up, Keep& keep) {
  fg::MoeArgs args;
  args.hidden = in(hidden, "hidden", keep);
  args.top_k_index = in(top_k_index, "top_k_index", keep);
  args.top_k_weights = in(top_k_weights, "top_k_weights", keep);
  args.gate_up = in(gate_up, "gate_up", keep);
  args.gate_up_scale = in(gate_up_scale, "gate_up_scale", keep);
  args.down = in(down, "down", keep);
  args.down_scale = in(down_scale, "down_scale", keep);
  args.weight_recipe = weight_recipe;
  args.activation_recipe = activation_recipe;
  args.gate_up_act_scale = in_opt(gate_up_act_scale, "gate_up_act_scale", keep);
  args.down_act_scale = in_opt(down_act_scale, "down_act_scale", keep);
  args.gate_up_bias = in_opt(gate_up_bias, "gate_up_bias", keep);
  args.down_bias = in_opt(down_bias, "down_bias", keep);
  args.activation = activation;
  args.swiglu_limit = swiglu_limit;
  args.swiglu_alpha = swiglu_alpha;
  args.interleaved_gate_up = interleaved_gate_up;
  args.out = out(out_array, "out", keep);
  return args;
}

fg::RunOptions run_options(fg::Backend backend, uintptr_t stream) { return {backend, reinterpret_cast<void*>(stream)}; }

nb::tuple shape_tuple(const std::vector<int64_t>& shape) {
  nb::list list;
  for (int64_t s : shape) list.append(s);
  return nb::tuple(list);
}

void translate(const fg::Error& e) {
  PyObject* type = e.kind() == fg::ErrorKind::Type    ? g_type_error
                   : e.kind() == fg::ErrorKind::Value ? g_value_error
                                                      : g_runtime_error;
  PyErr_SetString(type, e.what());
}

}  // namespace

NB_MODULE(_ext, m) {
  m.doc() = "finegemm's C++ library; use the finegemm package, which re-exports all of this.";

  g_error = make_exception(m, "Error", PyExc_Exception, "Base of every error finegemm raises.");
  {
    nb::object value_bases = nb::make_tuple(nb::handle(g_error), nb::handle(PyExc_ValueError));
    nb::object type_bases = nb::make_tuple(nb::handle(g_error), nb::handle(PyExc_TypeError));
    nb::object runtime_bases = nb::make_tuple(nb::handle(g_error), nb::handle(PyExc_RuntimeError));
    g_value_error = make_exception(m, "FinegemmValueError", value_bases.ptr(),
                                   "A bad argument value (shape, divisibility, NaN scale, index out of range).");
    g_type_error = make_exception(m, "FinegemmTypeError", type_bases.ptr(), "An argument of the wrong dtype or kind.");
    g_runtime_error = make_exception(m, "FinegemmRuntimeError", runtime_bases.ptr(),
                                     "A failure while running (e.g. a backend this build lacks).");
  }
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const fg::Error& e) {
      translate(e);
    }
  });

  // ---- Enums.
  nb::enum_<fg::Backend>(m, "Backend", "Where an op runs.")
      .value("Auto", fg::Backend::Auto, "the tensors' device: CPU tensors → Cpu, CUDA tensors → Cuda")
      .value("Reference", fg::Backend::Reference, "CPU reference: double accumulation, plain loops")
      .value("Cpu", fg::Backend::Cpu, "CPU fast path")
      .value("Cuda", fg::Backend::Cuda, "sm_90a kernels");
  nb::enum_<fg::ElementType>(m, "ElementType")
      .value("FP8_E4M3", fg::ElementType::FP8_E4M3)
      .value("FP4_E2M1", fg::ElementType::FP4_E2M1);
  nb::enum_<fg::ScaleFormat>(m, "ScaleFormat")
      .value("FP32", fg::ScaleFormat::FP32, "float32 scales")
      .value("UE8M0", fg::ScaleFormat::UE8M0, "one byte per scale, 2^(e-127) (float8_e8m0fnu)")
      .value("UE8M0_PACKED", fg::ScaleFormat::UE8M0_PACKED, "four consecutive K-scales per int32");
  nb::enum_<fg::WeightGranularity>(m, "WeightGranularity")
      .value("PerTensor", fg::WeightGranularity::PerTensor)
      .value("PerChannel", fg::WeightGranularity::PerChannel)
      .value("Block", fg::WeightGranularity::Block)
      .value("MX", fg::WeightGranularity::MX);
  nb::enum_<fg::ActGranularity>(m, "ActGranularity")
      .value("PerTokenGroup", fg::ActGranularity::PerTokenGroup)
      .value("PerToken", fg::ActGranularity::PerToken)
      .value("StaticPerTensor", fg::ActGranularity::StaticPerTensor);
  nb::enum_<fg::MoeActivation>(m, "MoeActivation")
      .value("SwiGLU", fg::MoeActivation::SwiGLU, "silu(gate) * up")
      .value("SwiGLUOai", fg::MoeActivation::SwiGLUOai, "GPT-OSS: (up + 1) * gate * sigmoid(alpha * gate)")
      .value("Silu", fg::MoeActivation::Silu, "no gate: silu(up)")
      .value("Gelu", fg::MoeActivation::Gelu, "no gate: gelu(up), tanh approximation")
      .value("Relu2", fg::MoeActivation::Relu2, "no gate: relu(up)^2");

  // ---- Recipes.
  nb::class_<fg::WeightRecipe>(m, "WeightRecipe",
                               "How a weight is stored and scaled (scales are dequantization multipliers).")
      .def(nb::init<>())
      .def(
          "__init__",
          [](fg::WeightRecipe* self, fg::WeightGranularity granularity, fg::ElementType element,
             fg::ScaleFormat scale_format, int block_n, int block_k) {
            new (self) fg::WeightRecipe{granularity, element, scale_format, block_n, block_k};
          },
          "granularity"_a, "element"_a = fg::ElementType::FP8_E4M3, "scale_format"_a = fg::ScaleFormat::FP32,
          "block_n"_a = 128, "block_k"_a = 128)
      .def_static("block", &fg::WeightRecipe::block, "block_n"_a = 128, "block_k"_a = 128,
                  "scale_format"_a = fg::ScaleFormat::FP32)
      .def_static("per_channel", &fg::WeightRecipe::per_channel)
      .def_static("per_tensor", &fg::WeightRecipe::per_tensor)
      .def_static("mxfp4", &fg::WeightRecipe::mxfp4, "scale_format"_a = fg::ScaleFormat::UE8M0)
      .def_rw("granularity", &fg::WeightRecipe::granularity)
      .def_rw("element", &fg::WeightRecipe::element)
      .def_rw("scale_format", &fg::WeightRecipe::scale_format)
      .def_rw("block_n", &fg::WeightRecipe::block_n)
      .def_rw("block_k", &fg::WeightRecipe::block_k)
      .def_prop_ro("name", &fg::WeightRecipe::name)
      .def("scale_rows", &fg::WeightRecipe::scale_rows, "n"_a)
      .def("scale_cols", &fg::WeightRecipe::scale_cols, "k"_a)
      .def(nb::self == nb::self)
      .def("__hash__", [](const fg::WeightRecipe& r) { return std::hash<std::string>{}(r.name()); })
      .def("__repr__", [](const fg::WeightRecipe& r) { return "WeightRecipe('" + r.name() + "')"; });

  nb::class_<fg::ActivationRecipe>(m, "ActivationRecipe", "How activations are quantized to FP8.")
      .def(nb::init<>())
      .def(
          "__init__",
          [](fg::ActivationRecipe* self, fg::ActGranularity granularity, int group_size, bool pow2_scale) {
            new (self) fg::ActivationRecipe{granularity, group_size, pow2_scale};
          },
          "granularity"_a, "group_size"_a = 128, "pow2_scale"_a = false)
      .def_static("per_token_group", &fg::ActivationRecipe::per_token_group, "group_size"_a = 128,
                  "pow2_scale"_a = false)
      .def_static("per_token", &fg::ActivationRecipe::per_token, "pow2_scale"_a = false)
      .def_static("static_per_tensor", &fg::ActivationRecipe::static_per_tensor)
      .def_rw("granularity", &fg::ActivationRecipe::granularity)
      .def_rw("group_size", &fg::ActivationRecipe::group_size)
      .def_rw("pow2_scale", &fg::ActivationRecipe::pow2_scale)
      .def_prop_ro("is_static", &fg::ActivationRecipe::is_static)
      .def_prop_ro("name", &fg::ActivationRecipe::name)
      .def(nb::self == nb::self)
      .def("__hash__", [](const fg::ActivationRecipe& r) { return std::hash<std::string>{}(r.name()); })
      .def("__repr__", [](const fg::ActivationRecipe& r) { return "ActivationRecipe('" + r.name() + "')"; });

  nb::class_<fg::NamedRecipe>(m, "NamedRecipe", "One recipe of RECIPES.md: a weight recipe and an activation recipe.")
      .def_ro("name", &fg::NamedRecipe::name)
      .def_ro("weight", &fg::NamedRecipe::weight)
      .def_ro("activation", &fg::NamedRecipe::activation)
      .def("__repr__", [](const fg::NamedRecipe& r) { return "NamedRecipe('" + r.name + "')"; });

  m.def("all_recipes", &fg::all_recipes,
        "Every recipe of RECIPES.md, with a stable name (what `finegemm check` walks).");
  m.def(
      "weight_scale_shape",
      [](const fg::WeightRecipe& recipe, int64_t n, int64_t k) {
        return shape_tuple(fg::weight_scale_shape(recipe, n, k));
      },
      "recipe"_a, "n"_a, "k"_a, "Shape of the scale tensor of an [n, k] weight.");
  m.def(
      "weight_scale_dtype",
      [](const fg::WeightRecipe& recipe) { return std::string(fg::dtype_name(fg::weight_scale_dtype(recipe))); },
      "recipe"_a, "Dtype name of the scale tensor: float32, float8_e8m0fnu or int32 (packed UE8M0).");
  m.def("weight_storage_cols", &fg::weight_storage_cols, "recipe"_a, "k"_a,
        "Last dim of the stored weight: k for FP8, k/2 for packed FP4.");
  m.def(
      "activation_scale_shape",
      [](const fg::ActivationRecipe& recipe, int64_t m_rows, int64_t k) {
        return shape_tuple(fg::activation_scale_shape(recipe, m_rows, k));
      },
      "recipe"_a, "m"_a, "k"_a, "Shape of the activation scales of an [m, k] input: [m, k/group], [m] or [].");
  m.def("cuda_available", &fg::cuda_available, "Built with CUDA and a device is present.");
  m.def("release_cached_memory", &fg::release_cached_memory, "cuda_device"_a,
        "Synchronize the device and give finegemm's unused CUDA scratch memory back (a no-op without CUDA).");
  m.def("backend_name", &fg::backend_name, "backend"_a);
  m.def("parse_backend", &fg::parse_backend, "name"_a);

  // ---- Ops on caller-allocated arrays. GPU work runs on `stream` (a cudaStream_t as int; 0: the legacy default).
  m.def(
      "quantize_activations",
      [](nb::handle x, const fg::ActivationRecipe& recipe, nb::handle x_q, nb::handle x_scale, fg::Backend backend,
         uintptr_t stream) {
        Keep keep;
        // Static: x_scale is read (and may be read-only); dynamic: it is written.
        const fg::TensorView scale = recipe.is_static() ? in(x_scale, "x_scale", keep) : out(x_scale, "x_scale", keep);
        const fg::TensorView x_view = in(x, "x", keep), x_q_view = out(x_q, "x_q", keep);
        nb::gil_scoped_release release;
        fg::quantize_activations(x_view, recipe, x_q_view, scale, run_options(backend, stream));
      },
      "x"_a.none(), "recipe"_a, "x_q"_a.none(), "x_scale"_a.none(), nb::kw_only(), "backend"_a = fg::Backend::Auto,
      "stream"_a = 0);
  m.def(
      "quantize_weights",
      [](nb::handle w, const fg::WeightRecipe& recipe, nb::handle w_q, nb::handle w_scale, fg::Backend backend,
         uintptr_t stream) {
        Keep keep;
        const fg::TensorView w_view = in(w, "w", keep), w_q_view = out(w_q, "w_q", keep),
                             scale = out(w_scale, "w_scale", keep);
        nb::gil_scoped_release release;
        fg::quantize_weights(w_view, recipe, w_q_view, scale, run_options(backend, stream));
      },
      "w"_a.none(), "recipe"_a, "w_q"_a.none(), "w_scale"_a.none(), nb::kw_only(), "backend"_a = fg::Backend::Auto,
      "stream"_a = 0);
  m.def(
      "dequantize_weights",
      [](nb::handle w_q, nb::handle w_scale, const fg::WeightRecipe& recipe, nb::handle w, fg::Backend backend,
         uintptr_t stream) {
        Keep keep;
        const fg::TensorView w_q_view = in(w_q, "w_q", keep), scale = in(w_scale, "w_scale", keep),
                             w_view = out(w, "w", keep);
        nb::gil_scoped_release release;
        fg::dequantize_weights(w_q_view, scale, recipe, w_view, run_options(backend, stream));
      },
      "w_q"_a.none(), "w_scale"_a.none(), "recipe"_a, "w"_a.none(), nb::kw_only(), "backend"_a = fg::Backend::Auto,
      "stream"_a = 0);
  m.def(
      "linear",
      [](nb::handle x, nb::handle weight, nb::handle weight_scale, nb::handle out_array,
         const fg::WeightRecipe& weight_recipe, const fg::ActivationRecipe& activation, nb::handle x_scale,
         nb::handle bias, fg::Backend backend, uintptr_t stream, bool weights_static) {
        Keep keep;
        fg::LinearArgs args;
        args.x = in(x, "x", keep);
        args.x_scale = in_opt(x_scale, "x_scale", keep);
        args.activation = activation;
        args.weight = in(weight, "weight", keep);
        args.weight_scale = in(weight_scale, "weight_scale", keep);
        args.weight_recipe = weight_recipe;
        args.bias = in_opt(bias, "bias", keep);
        args.out = out(out_array, "out", keep);
        nb::gil_scoped_release release;
        fg::RunOptions options = run_options(backend, stream);
        options.weights_static = weights_static;
        fg::linear(args, options);
      },
      "x"_a.none(), "weight"_a.none(), "weight_scale"_a.none(), "out"_a.none(), nb::kw_only(), "weight_recipe"_a,
      "activation"_a, "x_scale"_a.none() = nb::none(), "bias"_a.none() = nb::none(), "backend"_a = fg::Backend::Auto,
      "stream"_a = 0, "weights_static"_a = false, "out = dequant(x) @ dequant(weight).T (+ bias), written into `out` [M, N].");
  m.def(
      "moe_experts",
      [](nb::handle hidden, nb::handle top_k_index, nb::handle top_k_weights, nb::handle gate_up,
         nb::handle gate_up_scale, nb::handle down, nb::handle down_scale, nb::handle out_array,
         const fg::WeightRecipe& weight_recipe, const fg::ActivationRecipe& activation_recipe,
         nb::handle gate_up_act_scale, nb::handle down_act_scale, nb::handle gate_up_bias, nb::handle down_bias,
         fg::MoeActivation activation, float swiglu_limit, float swiglu_alpha, bool interleaved_gate_up,
         fg::Backend backend, uintptr_t stream, bool weights_constant) {
        Keep keep;
        const fg::MoeArgs args = moe_args(hidden, top_k_index, top_k_weights, gate_up, gate_up_scale, down, down_scale,
                                          out_array, weight_recipe, activation_recipe, gate_up_act_scale,
                                          down_act_scale, gate_up_bias, down_bias, activation, swiglu_limit,
                                          swiglu_alpha, interleaved_gate_up, keep);
        fg::RunOptions options = run_options(backend, stream);
        options.weights_constant = weights_constant;
        nb::gil_scoped_release release;
        fg::moe_experts(args, options);
      },
      "hidden"_a.none(), "top_k_index"_a.none(), "top_k_weights"_a.none(), "gate_up"_a.none(), "gate_up_scale"_a.none(),
      "down"_a.none(), "down_scale"_a.none(), "out"_a.none(), nb::kw_only(), "weight_recipe"_a, "activation_recipe"_a,
      "gate_up_act_scale"_a.none() = nb::none(), "down_act_scale"_a.none() = nb::none(),
      "gate_up_bias"_a.none() = nb::none(), "down_bias"_a.none() = nb::none(),
      "activation"_a = fg::MoeActivation::SwiGLU, "swiglu_limit"_a = 0.0f, "swiglu_alpha"_a = 1.702f,
      "interleaved_gate_up"_a = false, "backend"_a = fg::Backend::Auto, "stream"_a = 0, "weights_constant"_a = false,
      "The Mixture-of-Experts block of transformers' FP8Experts, written into `out` [T, H].");

  // ---- Expert parallelism over NCCL (finegemm/ep.hpp). A build without NCCL has the same functions; they raise
  // FinegemmRuntimeError saying so (ep_available() tells first).
  m.def("ep_available", &fg::ep_available, "Built with expert parallelism (CUDA and NCCL).");
  m.def(
      "ep_unique_id",
      [] {
        const fg::EpUniqueId id = fg::ep_unique_id();
        return nb::bytes(id.data(), id.size());
      },
      "A new NCCL unique id (128 bytes): made on rank 0, handed to every rank.");
  nb::class_<fg::EpGroup>(m, "EpGroup", "One rank's NCCL communicator on one GPU (finegemm/ep.hpp).")
      .def_static(
          "init",
          [](int rank, int world, nb::bytes unique_id, int device) {
            fg::EpUniqueId id{};
            if (unique_id.size() != id.size())
              throw fg::Error("unique_id: expected the " + std::to_string(id.size()) + " bytes of ep_unique_id(), got " +
                              std::to_string(unique_id.size()) + " bytes");
            std::memcpy(id.data(), unique_id.c_str(), id.size());
            nb::gil_scoped_release release;
            return fg::EpGroup::init(rank, world, id, device);
          },
          "rank"_a, "world"_a, "unique_id"_a, "device"_a,
          "ncclCommInitRank on `device`; every rank calls it with the same id (blocks until all have joined).")
      .def_static(
          "init_all",
          [](const std::vector<int>& devices) {
            std::vector<fg::EpGroup> groups;
            {
              nb::gil_scoped_release release;
              groups = fg::EpGroup::init_all(devices);
            }
            nb::list out;
            for (auto& g : groups) out.append(nb::cast(std::move(g)));
            return out;
          },
          "devices"_a, "ncclCommInitAll: one group per device, all in this process (rank i on devices[i]).")
      .def_prop_ro("rank", &fg::EpGroup::rank)
      .def_prop_ro("world", &fg::EpGroup::world)
      .def_prop_ro("device", &fg::EpGroup::device);
  m.def(
      "moe_experts_ep",
      [](nb::handle hidden, nb::handle top_k_index, nb::handle top_k_weights, nb::handle gate_up,
         nb::handle gate_up_scale, nb::handle down, nb::handle down_scale, nb::handle out_array, fg::EpGroup& group,
         int num_global_experts, const fg::WeightRecipe& weight_recipe, const fg::ActivationRecipe& activation_recipe,
         nb::handle gate_up_act_scale, nb::handle down_act_scale, nb::handle gate_up_bias, nb::handle down_bias,
         fg::MoeActivation activation, float swiglu_limit, float swiglu_alpha, bool interleaved_gate_up,
         const std::string& wire_y, int chunks, uintptr_t stream) {
        Keep keep;
        const fg::MoeArgs args = moe_args(hidden, top_k_index, top_k_weights, gate_up, gate_up_scale, down, down_scale,
                                          out_array, weight_recipe, activation_recipe, gate_up_act_scale,
                                          down_act_scale, gate_up_bias, down_bias, activation, swiglu_limit,
                                          swiglu_alpha, interleaved_gate_up, keep);
        fg::EpMoeOptions options;
        if (wire_y == "float32")
          options.wire_y = fg::DType::F32;
        else if (wire_y == "bfloat16")
          options.wire_y = fg::DType::BF16;
        else
          throw fg::Error(fg::ErrorKind::Type, "wire_y: expected 'float32' or 'bfloat16', got '" + wire_y + "'");
        options.chunks = chunks;
        nb::gil_scoped_release release;
        fg::moe_experts_ep(args, num_global_experts, group, options, run_options(fg::Backend::Cuda, stream));
      },
      "hidden"_a.none(), "top_k_index"_a.none(), "top_k_weights"_a.none(), "gate_up"_a.none(), "gate_up_scale"_a.none(),
      "down"_a.none(), "down_scale"_a.none(), "out"_a.none(), nb::kw_only(), "group"_a, "num_global_experts"_a,
      "weight_recipe"_a, "activation_recipe"_a, "gate_up_act_scale"_a.none() = nb::none(),
      "down_act_scale"_a.none() = nb::none(), "gate_up_bias"_a.none() = nb::none(), "down_bias"_a.none() = nb::none(),
      "activation"_a = fg::MoeActivation::SwiGLU, "swiglu_limit"_a = 0.0f, "swiglu_alpha"_a = 1.702f,
      "interleaved_gate_up"_a = false, "wire_y"_a = "float32", "chunks"_a = 1, "stream"_a = 0,
      "One expert-parallel MoE layer on this rank (finegemm/ep.hpp): the rank's tokens, its E/W experts, GLOBAL "
      "expert ids in top_k_index; written into `out` [T, H].");
}
