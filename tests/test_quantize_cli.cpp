// `finegemm quantize` end to end: a small random bf16 model written with the safetensors writer, quantized by the
// finegemm program, read back through Checkpoint: dtypes, shapes, config.json, copied tensors, and the dequantized
// weights against the originals.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "finegemm/checkpoint.hpp"
#include "finegemm/safetensors.hpp"
#include "testing.hpp"

namespace fs = std::filesystem;
using json = nlohmann::json;
using finegemm::DType;
using finegemm::testing::Buffer;

#ifndef FINEGEMM_CLI
TEST(QuantizeCli, NeedsTheProgram) { GTEST_SKIP() << "built without the finegemm program (FINEGEMM_BUILD_TOOLS=OFF)"; }
#else
namespace {

constexpr int64_t kHidden = 256, kInter = 128, kExperts = 4;

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() /
           ("finegemm_q_" + std::to_string(::getpid()) + "_" + std::to_string(finegemm::testing::rng()() % 1000000));
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
void write_file(const fs::path& p, const std::string& s) { std::ofstream(p, std::ios::binary) << s; }

struct Result {
  int code = -1;
  std::string out, err;
};

Result run_cli(const std::string& arguments, const fs::path& scratch) {
  const fs::path out = scratch / "stdout.txt", err = scratch / "stderr.txt";
  const std::string cmd = std::string("\"") + FINEGEMM_CLI + "\" quantize " + arguments + " >\"" + out.string() +
                          "\" 2>\"" + err.string() + "\" </dev/null";
  const int status = std::system(cmd.c_str());
  Result r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = read_file(out);
  r.err = read_file(err);
  return r;
}

// The toy model: one attention projection, a router, an MoE block (transformers 5.x fused experts), an
// embedding, a norm, the head, and a linear whose K no recipe can block.
struct Model {
  TempDir dir;
  std::map<std::string, Buffer> tensors;
  Model() {
    tensors["model.embed_tokens.weight"] = finegemm::testing::random_tensor(DType::BF16, {64, kHidden});
    tensors["model.layers.0.input_layernorm.weight"] = finegemm::testing::random_tensor(DType::BF16, {kHidden});
    tensors["model.layers.0.self_attn.q_proj.weight"] = finegemm::testing::random_tensor(DType::BF16, {384, kHidden}, 0.05f);
    tensors["model.layers.0.self_attn.o_proj.weight"] = finegemm::testing::random_tensor(DType::F32, {kHidden, 384}, 0.02f);
    tensors["model.layers.0.mlp.gate.weight"] = finegemm::testing::random_tensor(DType::BF16, {kExperts, kHidden});
    tensors["model.layers.0.mlp.experts.gate_up_proj"] =
        finegemm::testing::random_tensor(DType::BF16, {kExperts, 2 * kInter, kHidden}, 0.03f);
    tensors["model.layers.0.mlp.experts.down_proj"] =
        finegemm::testing::random_tensor(DType::BF16, {kExperts, kHidden, kInter}, 0.03f);
    tensors["model.layers.0.odd.weight"] = finegemm::testing::random_tensor(DType::BF16, {32, 100});
    tensors["lm_head.weight"] = finegemm::testing::random_tensor(DType::BF16, {64, kHidden});
    std::vector<finegemm::NamedTensor> named;
    for (auto& [name, b] : tensors) named.push_back({name, b.view});
    finegemm::save_safetensors((dir.path / "model.safetensors").string(), named);
    write_file(dir.path / "config.json",
               json{{"model_type", "toy_moe"}, {"hidden_size", kHidden}, {"moe_intermediate_size", kInter},
                    {"num_local_experts", kExperts}, {"num_experts_per_tok", 2}, {"hidden_act", "silu"}}
                   .dump());
    write_file(dir.path / "tokenizer.json", "{\"toy\": true}");
  }
  fs::path in() const { return dir.path; }
};

// ‖dequant − original‖ / ‖original‖ for one [N, K] matrix.
double dequant_error(const finegemm::TensorView& wq, const finegemm::TensorView& scale, const finegemm::WeightRecipe& recipe,
                     const finegemm::TensorView& original) {
  const int64_t n = original.size(-2), k = original.size(-1);
  Buffer back(DType::F32, {n, k});
  finegemm::testing::poison(back.view);
  finegemm::dequantize_weights(wq, scale, recipe, back.view);
  double num = 0, den = 0;
  for (int64_t i = 0; i < n * k; ++i) {
    const double o = finegemm::testing::get(original, i), d = back.ptr<float>()[i] - o;
    num += d * d;
    den += o * o;
  }
  return std::sqrt(num / den);
}

finegemm::TensorView expert(const finegemm::TensorView& t, int64_t e) {
  std::vector<int64_t> shape(t.shape + 1, t.shape + t.ndim);
  int64_t per = 1;
  for (auto d : shape) per *= d;
  return finegemm::TensorView::of(static_cast<uint8_t*>(t.data) + e * per * finegemm::dtype_size(t.dtype), t.dtype, shape);
}

float amax(const finegemm::TensorView& t) {
  float m = 0;
  for (int64_t i = 0; i < t.numel(); ++i) m = std::max(m, std::fabs(finegemm::testing::get(t, i)));
  return m;
}

// Checks the quantized output against the model, for any recipe; returns the checkpoint.
// `odd_quantized`: the K=100 linear is quantized (per-channel and per-tensor recipes take any K) or copied.
finegemm::Checkpoint check_output(const Model& model, const fs::path& out, const std::string& expect_recipe,
                                  double tolerance, bool odd_quantized = false) {
  const finegemm::Checkpoint ckpt = finegemm::Checkpoint::open(out.string());
  std::vector<std::string> linears = {"model.layers.0.self_attn.o_proj", "model.layers.0.self_attn.q_proj"};
  if (odd_quantized) linears.insert(linears.begin(), "model.layers.0.odd");
  EXPECT_EQ(ckpt.linear_layers(), linears);
  EXPECT_EQ(ckpt.experts_layers(), (std::vector<std::string>{"model.layers.0.mlp.experts"}));
  for (const char* name : {"model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.o_proj"}) {
    const finegemm::LinearLayer layer = ckpt.linear(name);
    const auto& original = model.tensors.at(std::string(name) + ".weight").view;
    EXPECT_EQ(layer.weight_recipe.name(), expect_recipe) << name;
    EXPECT_EQ(layer.n, original.shape[0]);
    EXPECT_EQ(layer.k, original.shape[1]);
    EXPECT_EQ(layer.weight_scale.sizes(), finegemm::weight_scale_shape(layer.weight_recipe, layer.n, layer.k));
    EXPECT_EQ(layer.weight_scale.dtype, finegemm::weight_scale_dtype(layer.weight_recipe));
    const double rel = dequant_error(layer.weight, layer.weight_scale, layer.weight_recipe, original);
    EXPECT_LT(rel, tolerance) << name;
    EXPECT_GT(rel, 0.0) << name << ": the weights were not quantized at all";
  }
  const finegemm::ExpertsLayer experts = ckpt.experts("model.layers.0.mlp.experts");
  EXPECT_EQ(experts.num_experts, kExperts);
  EXPECT_EQ(experts.hidden, kHidden);
  EXPECT_EQ(experts.intermediate, kInter);
  EXPECT_TRUE(experts.has_gate);
  EXPECT_EQ(experts.weight_recipe.name(), expect_recipe);
  for (int64_t e = 0; e < kExperts; ++e) {
    EXPECT_LT(dequant_error(expert(experts.gate_up, e), expert(experts.gate_up_scale, e), experts.weight_recipe,
                            expert(model.tensors.at("model.layers.0.mlp.experts.gate_up_proj").view, e)),
              tolerance);
    EXPECT_LT(dequant_error(expert(experts.down, e), expert(experts.down_scale, e), experts.weight_recipe,
                            expert(model.tensors.at("model.layers.0.mlp.experts.down_proj").view, e)),
              tolerance);
  }
  // Everything else is copied bit for bit.
  std::vector<std::string> copied = {"model.embed_tokens.weight", "model.layers.0.input_layernorm.weight",
                                     "model.layers.0.mlp.gate.weight", "lm_head.weight"};
  if (!odd_quantized) copied.push_back("model.layers.0.odd.weight");
  for (const std::string& name : copied) {
    const auto copy = ckpt.files().get(name);
    const auto& original = model.tensors.at(name).view;
    EXPECT_EQ(copy.dtype, original.dtype) << name;
    EXPECT_EQ(copy.sizes(), original.sizes()) << name;
    EXPECT_EQ(std::memcmp(copy.data, original.data, original.numel() * finegemm::dtype_size(original.dtype)), 0) << name;
  }
  EXPECT_EQ(read_file(out / "tokenizer.json"), "{\"toy\": true}");
  return ckpt;
}

}  // namespace

TEST(QuantizeCli, Block128Dynamic) {
  Model model;
  const fs::path out = model.dir.path / "out";
  const Result r = run_cli("\"" + model.in().string() + "\" \"" + out.string() + "\" --weights block128 --activations dynamic --json",
                           model.dir.path);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err, "") << "no progress bar when stderr is not a terminal";
  const json summary = json::parse(r.out);
  EXPECT_EQ(summary["weight_recipe"], "block128x128/fp32");
  EXPECT_EQ(summary["activation_recipe"], "group128");
  EXPECT_EQ(summary["quantized"], 4);
  EXPECT_EQ(summary["copied"], 5);
  EXPECT_LT(summary["max_rel_error"].get<double>(), 0.06);

  const finegemm::Checkpoint ckpt = check_output(model, out, "block128x128/fp32", 0.06);
  const auto layer = ckpt.linear("model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(layer.weight.dtype, DType::F8_E4M3);
  EXPECT_EQ(layer.weight_scale.sizes(), (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(layer.activation_recipe, finegemm::ActivationRecipe::per_token_group(128));
  EXPECT_FALSE(layer.act_scale.defined());
  EXPECT_FALSE(ckpt.files().contains("model.layers.0.self_attn.q_proj.activation_scale"));

  // config.json: the input's fields, and a quantization_config that FineGrainedFP8Config reads.
  const json config = json::parse(read_file(out / "config.json"));
  EXPECT_EQ(config["model_type"], "toy_moe");
  const json& qc = config["quantization_config"];
  EXPECT_EQ(qc["quant_method"], "fp8");
  EXPECT_EQ(qc["activation_scheme"], "dynamic");
  EXPECT_EQ(qc["weight_block_size"], json({128, 128}));
  EXPECT_EQ(qc["fmt"], "e4m3");
  EXPECT_EQ(qc["scale_fmt"], "float");
  const auto skip = qc["modules_to_not_convert"].get<std::vector<std::string>>();
  for (const char* m : {"lm_head", "model.layers.0.mlp.gate$", "model.layers.0.odd$"})
    EXPECT_NE(std::find(skip.begin(), skip.end(), m), skip.end()) << m;
  EXPECT_TRUE(ckpt.quantization().present);
  EXPECT_FALSE(ckpt.quantization().static_activations);
  EXPECT_EQ(ckpt.moe().num_experts, kExperts);
}

TEST(QuantizeCli, Block128StaticWithCalibration) {
  Model model;
  Buffer q_in = finegemm::testing::random_tensor(DType::F32, {32, kHidden}, 3.0f);
  Buffer o_in = finegemm::testing::random_tensor(DType::BF16, {2, 8, 384}, 0.5f);  // [*, K]
  Buffer gu_in = finegemm::testing::random_tensor(DType::F32, {kExperts, 16, kHidden});
  Buffer dn_in = finegemm::testing::random_tensor(DType::F32, {16, kInter}, 2.0f);  // shared by every expert
  for (int64_t e = 0; e < kExperts; ++e) gu_in.ptr<float>()[e * 16 * kHidden] = 10.0f * (e + 1);  // distinct amax
  const fs::path calib = model.dir.path / "calib.safetensors";
  finegemm::save_safetensors(calib.string(), {{"model.layers.0.self_attn.q_proj.input", q_in.view},
                                              {"model.layers.0.self_attn.o_proj", o_in.view},
                                              {"model.layers.0.mlp.experts.gate_up_proj.input", gu_in.view},
                                              {"model.layers.0.mlp.experts.down_proj", dn_in.view}});
  const fs::path out = model.dir.path / "out_static";
  const Result r = run_cli("\"" + model.in().string() + "\" \"" + out.string() +
                               "\" --weights block128 --activations static --calib \"" + calib.string() + "\" --json",
                           model.dir.path);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(json::parse(r.out)["activation_recipe"], "static");

  const finegemm::Checkpoint ckpt = check_output(model, out, "block128x128/fp32", 0.06);
  EXPECT_TRUE(ckpt.quantization().static_activations);
  EXPECT_EQ(json::parse(read_file(out / "config.json"))["quantization_config"]["activation_scheme"], "static");
  // The key transformers' FP8Linear loads: <name>.activation_scale, a float32 scalar = amax / 448.
  const auto q_scale = ckpt.files().get("model.layers.0.self_attn.q_proj.activation_scale");
  EXPECT_EQ(q_scale.dtype, DType::F32);
  EXPECT_EQ(q_scale.ndim, 0);
  EXPECT_FLOAT_EQ(q_scale.ptr<float>()[0], amax(q_in.view) / 448.0f);
  const auto layer = ckpt.linear("model.layers.0.self_attn.o_proj");
  EXPECT_TRUE(layer.activation_recipe.is_static());
  ASSERT_TRUE(layer.act_scale.defined());
  EXPECT_FLOAT_EQ(layer.act_scale.ptr<float>()[0], amax(o_in.view) / 448.0f);

  const auto experts = ckpt.experts("model.layers.0.mlp.experts");
  EXPECT_TRUE(experts.activation_recipe.is_static());
  ASSERT_EQ(experts.gate_up_act_scale.sizes(), (std::vector<int64_t>{kExperts}));
  ASSERT_EQ(experts.down_act_scale.sizes(), (std::vector<int64_t>{kExperts}));
  for (int64_t e = 0; e < kExperts; ++e) {
    EXPECT_FLOAT_EQ(experts.gate_up_act_scale.ptr<float>()[e], amax(expert(gu_in.view, e)) / 448.0f) << e;
    EXPECT_FLOAT_EQ(experts.down_act_scale.ptr<float>()[e], amax(dn_in.view) / 448.0f) << e;
  }
  EXPECT_NE(experts.gate_up_act_scale.ptr<float>()[0], experts.gate_up_act_scale.ptr<float>()[1]);
}

TEST(QuantizeCli, OtherRecipes) {
  Model model;
  struct Case {
    const char* args;
    const char* recipe;
    double tolerance;
    DType scale_dtype;
    bool odd_quantized;
  };
  for (const Case& c : {Case{"--weights block128 --scale-fmt ue8m0", "block128x128/ue8m0", 0.08, DType::F8_E8M0, false},
                        Case{"--weights channel", "channel/fp32", 0.08, DType::F32, true},
                        Case{"--weights tensor", "tensor/fp32", 0.1, DType::F32, true},
                        Case{"--weights mxfp4", "mxfp4/ue8m0", 0.2, DType::F8_E8M0, false}}) {
    SCOPED_TRACE(c.args);
    const fs::path out = model.dir.path / "out_other";
    fs::remove_all(out);
    const Result r = run_cli("\"" + model.in().string() + "\" \"" + out.string() + "\" " + c.args, model.dir.path);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.out.find(c.odd_quantized ? "quantized 5 tensors" : "quantized 4 tensors"), std::string::npos) << r.out;
    const finegemm::Checkpoint ckpt = check_output(model, out, c.recipe, c.tolerance, c.odd_quantized);
    const auto layer = ckpt.linear("model.layers.0.self_attn.q_proj");
    EXPECT_EQ(ckpt.files().get("model.layers.0.self_attn.q_proj.weight_scale_inv").dtype, c.scale_dtype);
    if (layer.weight_recipe.element == finegemm::ElementType::FP4_E2M1) {
      EXPECT_EQ(layer.weight.dtype, DType::I8);
      EXPECT_EQ(layer.weight.sizes(), (std::vector<int64_t>{384, kHidden / 2}));
      EXPECT_EQ(layer.activation_recipe, finegemm::ActivationRecipe::per_token_group(128, true));
    }
    if (layer.weight_recipe.scale_format == finegemm::ScaleFormat::UE8M0 &&
        layer.weight_recipe.granularity == finegemm::WeightGranularity::Block)
      EXPECT_EQ(layer.activation_recipe, finegemm::ActivationRecipe::per_token_group(128, true));
  }
}

TEST(QuantizeCli, ErrorsAreClear) {
  Model model;
  const std::string io = "\"" + model.in().string() + "\" \"" + (model.dir.path / "bad").string() + "\" ";
  struct Case {
    std::string args, message;
  };
  const fs::path partial = model.dir.path / "partial.safetensors";
  Buffer x = finegemm::testing::random_tensor(DType::F32, {4, kHidden});
  finegemm::save_safetensors(partial.string(), {{"model.layers.0.self_attn.q_proj", x.view}});
  for (const Case& c : {
           Case{"--weights block64", "--weights"},
           Case{"--activations static", "expected --calib FILE"},
           Case{"--activations static --calib \"" + partial.string() + "\"", "no calibration activations for model.layers.0"},
           Case{"--weights tensor --scale-fmt ue8m0", "--scale-fmt: expected float"},
           Case{"--calib x.safetensors", "only used with --activations static"},
       }) {
    const Result r = run_cli(io + c.args, model.dir.path);
    EXPECT_NE(r.code, 0) << c.args;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << c.args << "\nstderr: " << r.err;
  }
  const Result missing = run_cli("\"" + (model.dir.path / "nope").string() + "\" out", model.dir.path);
  EXPECT_NE(missing.code, 0);
  EXPECT_NE(missing.err.find("nope"), std::string::npos) << missing.err;
  const Result same = run_cli("\"" + model.in().string() + "\" \"" + model.in().string() + "\"", model.dir.path);
  EXPECT_NE(same.code, 0);
  EXPECT_NE(same.err.find("other than IN"), std::string::npos) << same.err;
}
#endif

#ifdef FINEGEMM_CLI
TEST(QuantizeCli, ShardedInputKeepsItsShards) {
  TempDir dir;
  Buffer a = finegemm::testing::random_tensor(DType::BF16, {128, kHidden}, 0.1f);
  Buffer b = finegemm::testing::random_tensor(DType::BF16, {kHidden, 128}, 0.1f);
  finegemm::save_safetensors((dir.path / "model-00001-of-00002.safetensors").string(), {{"l.a.weight", a.view}});
  finegemm::save_safetensors((dir.path / "model-00002-of-00002.safetensors").string(), {{"l.b.weight", b.view}});
  write_file(dir.path / "model.safetensors.index.json",
             R"({"weight_map": {"l.a.weight": "model-00001-of-00002.safetensors", "l.b.weight": "model-00002-of-00002.safetensors"}})");
  const fs::path out = dir.path / "out";
  const Result r = run_cli("\"" + dir.path.string() + "\" \"" + out.string() + "\"", dir.path);
  ASSERT_EQ(r.code, 0) << r.err;
  const json index = json::parse(read_file(out / "model.safetensors.index.json"));
  EXPECT_EQ(index["weight_map"]["l.a.weight_scale_inv"], "model-00001-of-00002.safetensors");
  EXPECT_EQ(index["weight_map"]["l.b.weight_scale_inv"], "model-00002-of-00002.safetensors");
  const auto ckpt = finegemm::Checkpoint::open(out.string());
  EXPECT_EQ(ckpt.files().files().size(), 2u);
  EXPECT_EQ(ckpt.linear_layers(), (std::vector<std::string>{"l.a", "l.b"}));
  EXPECT_LT(dequant_error(ckpt.linear("l.b").weight, ckpt.linear("l.b").weight_scale, ckpt.linear("l.b").weight_recipe, b.view), 0.06);
}
#endif
