// CPU fast path for linear: quantize x per the recipe (the reference's quantizer), dequantize it to fp32 once,
// then the tile engine of fast_gemm.cpp with the weight kept quantized in memory.
#include <vector>

#include "cpu/cpu_backend.hpp"
#include "cpu/fast_gemm.hpp"

namespace finegemm::cpu {

void fast_linear(const LinearArgs& args) {
  const int64_t m = args.x.shape[0], k = args.x.shape[1];
  const int64_t n = args.weight.shape[0];

  std::vector<float> xf;
  fast::quantize_dequantize_activations(args.x, args.x_scale, args.activation, xf);

  std::vector<float> bias;
  if (args.bias.defined()) bias = fast::to_float(args.bias, 0, n);

  const fast::QuantizedWeight w = fast::quantized_weight(args.weight, args.weight_scale, args.weight_recipe, k);
  fast::Epilogue epilogue;
  epilogue.out = args.out.data;
  epilogue.dtype = args.out.dtype;
  epilogue.ld = n;
  epilogue.bias = bias.empty() ? nullptr : bias.data();
  fast::gemm(xf.data(), m, k, w, epilogue);
}

}  // namespace finegemm::cpu
