// What the finegemm subcommands share: argument parsing, a progress bar, tables, host tensors,
// synthetic problems (random data quantized per recipe) and the comparison with the reference.
#pragma once
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "core/device_buffer.hpp"
#include "finegemm/finegemm.hpp"

namespace finegemm::tools {

// ---- Arguments: `--name value`, `--name=value`, flags, positionals. Unknown options are errors.
class ArgParser {
 public:
  ArgParser(std::string command, std::string summary);
  void flag(const std::string& name, const std::string& help);
  void option(const std::string& name, const std::string& metavar, const std::string& help,
              const std::string& default_value = "");
  void positional(const std::string& metavar, const std::string& help);
  // False when --help was asked for (the help is printed on stdout).
  bool parse(int argc, char** argv);

  bool has(const std::string& name) const;  // a flag was given, or an option has a value
  std::string get(const std::string& name) const;
  int64_t get_int(const std::string& name, int64_t min_value, int64_t max_value) const;
  // Value must be one of `choices`.
  std::string get_choice(const std::string& name, const std::vector<std::string>& choices) const;
  const std::vector<std::string>& positionals() const { return positional_values_; }
  std::string help() const;

 private:
  struct Spec {
    std::string name, metavar, help, default_value;
    bool is_flag = false;
  };
  const Spec* find(const std::string& name) const;
  std::string command_, summary_;
  std::vector<Spec> specs_;
  std::vector<std::pair<std::string, std::string>> positional_specs_;
  std::map<std::string, std::string> values_;
  std::vector<std::string> positional_values_;
};

// ---- Terminal output.
bool stdout_is_tty();
bool stderr_is_tty();

// A one-line progress bar on stderr; silent when stderr is not a terminal.
class Progress {
 public:
  Progress(std::string label, int64_t total);
  ~Progress();
  void step(const std::string& what);  // starts item `what` (shows the count done so far)
  void done();                          // clears the line

 private:
  void draw();
  std::string label_, what_;
  int64_t total_, current_ = 0;
  bool enabled_, finished_ = false;
};

// A plain text table; "ok"/"FAIL" cells are coloured when stdout is a terminal.
class Table {
 public:
  explicit Table(std::vector<std::string> headers, std::vector<bool> align_right = {});
  void add(std::vector<std::string> row);
  void print(FILE* out) const;

 private:
  std::vector<std::string> headers_;
  std::vector<bool> align_right_;
  std::vector<std::vector<std::string>> rows_;
};

std::string format_double(double v, int precision);  // fixed notation
std::string format_sci(double v);                    // "1.23e-03", "nan", "inf"

// ---- Host tensors that own their bytes.
struct HostTensor {
  std::vector<uint8_t> bytes;
  TensorView view;  // undefined (ndim -1) for a tensor left out

  HostTensor() = default;
  HostTensor(DType dtype, const std::vector<int64_t>& shape);
  HostTensor(const HostTensor& other) : bytes(other.bytes), view(other.view) {
    if (view.defined()) view.data = bytes.data();
  }
  HostTensor& operator=(const HostTensor& other) {
    if (this != &other) *this = HostTensor(other);
    return *this;
  }
  HostTensor(HostTensor&&) noexcept = default;  // a moved vector keeps its buffer, so the view stays valid
  HostTensor& operator=(HostTensor&&) noexcept = default;
  template <typename T>
  T* ptr() { return reinterpret_cast<T*>(bytes.data()); }
  template <typename T>
  const T* ptr() const { return reinterpret_cast<const T*>(bytes.data()); }
  int64_t numel() const { return view.numel(); }
};

float read_float(const TensorView& t, int64_t i);  // F32/BF16/F16/F8_E4M3 element as float
void write_float(const TensorView& t, int64_t i, float v);
HostTensor random_normal(std::mt19937_64& rng, DType dtype, const std::vector<int64_t>& shape, float stddev);
void poison(const TensorView& t);  // NaN everywhere: an unwritten element fails the comparison
float amax(const TensorView& t);

// ---- Comparison with the reference: rel = ‖out − ref‖₂ / ‖ref‖₂, any NaN/Inf fails.
struct Comparison {
  double rel = 0;
  int64_t non_finite = 0;
  bool ok(double tolerance) const { return non_finite == 0 && rel <= tolerance; }
};
// Compares the first `rows` rows of out and ref ([rows*, cols], any float dtypes).
Comparison compare(const TensorView& out, const TensorView& ref, int64_t rows = -1);

// ---- Quantized weights: a [N, K] matrix, or E experts of [N, K].
struct QuantizedWeight {
  HostTensor weight;  // [(E,) N, storage_cols(K)]
  HostTensor scale;   // [(E,) <weight_scale_shape(N, K)>]
};
// master: [N, K] or [E, N, K] F32/BF16.
QuantizedWeight quantize(const TensorView& master, const WeightRecipe& recipe);

// ---- Synthetic problems.
struct LinearProblem {
  int64_t m = 33, n = 320, k = 512;
  bool bias = false;
  DType out_dtype = DType::BF16;
};
struct LinearData {
  NamedRecipe recipe;
  HostTensor x, x_scale, bias, out, ref;
  QuantizedWeight weight;
  LinearArgs args(const TensorView& out) const;  // the op's arguments, writing to `out`
};
LinearData make_linear(std::mt19937_64& rng, const NamedRecipe& recipe, const LinearProblem& problem);

struct MoeProblem {
  int64_t tokens = 24, hidden = 256, inter = 128, experts = 8, top_k = 4;
  MoeActivation activation = MoeActivation::SwiGLU;
  float swiglu_limit = 0.0f;
  float swiglu_alpha = 1.702f;
  bool interleaved = false;
  bool bias = false;
  bool skip_slots = true;      // some -1 routing slots, one token with none at all
  int64_t calib_tokens = 64;   // static recipes: activation scales from the amax of this many tokens
  DType out_dtype = DType::BF16;
  std::string variant() const;  // "swiglu", "swiglu-oai L=7", "silu (no gate)", ...
  // Multiply-adds per routed token (gate_up and down).
  double flops_per_slot() const;
};
struct MoeData {
  NamedRecipe recipe;
  MoeProblem problem;
  HostTensor hidden, top_k_index, top_k_weights, gate_up_act_scale, down_act_scale, gate_up_bias, down_bias;
  QuantizedWeight gate_up, down;
  int64_t active_slots = 0;  // routing slots that are not -1
  MoeArgs args(const TensorView& out) const;  // the op's arguments, writing to `out`
};
// Master weights (F32 [E, 2I or I, H] and [E, H, I]) are drawn once per shape and quantized per recipe.
struct MoeMasters {
  HostTensor gate_up, down, gate_up_bias, down_bias;
};
MoeMasters make_moe_masters(std::mt19937_64& rng, const MoeProblem& problem);
MoeData make_moe(std::mt19937_64& rng, const NamedRecipe& recipe, const MoeProblem& problem, const MoeMasters& masters);
// Random hidden states and routing for `data.problem`; with `calibrate` and a static recipe, also the per-expert
// activation scales, calibrated on them (data.gate_up/down must be set).
void make_moe_inputs(std::mt19937_64& rng, MoeData& data, bool calibrate = true);
// The rows [0, rows) of `args` as their own problem (tokens are independent).
MoeArgs first_tokens(const MoeArgs& args, int64_t rows);
LinearArgs first_rows(const LinearArgs& args, int64_t rows);

// ---- Running on a backend. For CUDA the inputs are copied to the device and the output back.
class DeviceRun {
 public:
  explicit DeviceRun(Backend backend);
  Backend backend() const { return backend_; }
  Device device() const { return device_; }
  // Returns the args with every tensor on the device (owning copies held by this object).
  LinearArgs upload(const LinearArgs& host);
  MoeArgs upload(const MoeArgs& host);
  void download(const TensorView& device_out, const TensorView& host_out);
  void sync();

 private:
  TensorView put(const TensorView& host);
  Backend backend_;
  Device device_;
  std::vector<DeviceTensor> held_;
};

double seconds_since(std::chrono::steady_clock::time_point start);
uint64_t seed_from(const std::string& value);  // "" → random

}  // namespace finegemm::tools
