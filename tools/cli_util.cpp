#include "cli_util.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <sstream>

#include "core/formats.hpp"
#include "finegemm/error.hpp"

namespace finegemm::tools {

// ---------------------------------------------------------------- arguments

ArgParser::ArgParser(std::string command, std::string summary) : command_(std::move(command)), summary_(std::move(summary)) {}

void ArgParser::flag(const std::string& name, const std::string& help) { specs_.push_back({name, "", help, "", true}); }

void ArgParser::option(const std::string& name, const std::string& metavar, const std::string& help,
                       const std::string& default_value) {
  specs_.push_back({name, metavar, help, default_value, false});
}

void ArgParser::positional(const std::string& metavar, const std::string& help) {
  positional_specs_.emplace_back(metavar, help);
}

const ArgParser::Spec* ArgParser::find(const std::string& name) const {
  for (const auto& s : specs_)
    if (s.name == name) return &s;
  return nullptr;
}

std::string ArgParser::help() const {
  std::ostringstream os;
  os << "usage: finegemm " << command_;
  for (const auto& [metavar, _] : positional_specs_) os << ' ' << metavar;
  for (const auto& s : specs_) os << " [--" << s.name << (s.is_flag ? "" : " " + s.metavar) << ']';
  os << "\n\n" << summary_ << "\n\n";
  size_t width = 0;
  for (const auto& [metavar, _] : positional_specs_) width = std::max(width, metavar.size());
  for (const auto& s : specs_) width = std::max(width, s.name.size() + 2 + (s.is_flag ? 0 : s.metavar.size() + 1));
  for (const auto& [metavar, text] : positional_specs_)
    os << "  " << metavar << std::string(width - metavar.size() + 2, ' ') << text << '\n';
  for (const auto& s : specs_) {
    const std::string head = "--" + s.name + (s.is_flag ? "" : " " + s.metavar);
    os << "  " << head << std::string(width - head.size() + 2, ' ') << s.help;
    if (!s.default_value.empty()) os << " (default: " << s.default_value << ')';
    os << '\n';
  }
  os << "  --help" << std::string(width > 4 ? width - 4 : 2, ' ') << "show this help\n";
  return os.str();
}

bool ArgParser::parse(int argc, char** argv) {
  for (int i = 0; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(help().c_str(), stdout);
      return false;
    }
    if (arg.rfind("--", 0) != 0 || arg == "--") {
      if (positional_values_.size() >= positional_specs_.size())
        throw Error("unexpected argument '" + arg + "' (see finegemm " + command_ + " --help)");
      positional_values_.push_back(arg);
      continue;
    }
    std::string name = arg.substr(2), value;
    bool has_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    const Spec* spec = find(name);
    if (!spec) throw Error("unknown option '--" + name + "' (see finegemm " + command_ + " --help)");
    if (spec->is_flag) {
      if (has_value) throw Error("--" + name + ": a flag takes no value, got '" + value + "'");
      values_[name] = "1";
      continue;
    }
    if (!has_value) {
      if (i + 1 >= argc) throw Error("--" + name + ": expected a value (" + spec->metavar + "), got nothing");
      value = argv[++i];
    }
    values_[name] = value;
  }
  if (positional_values_.size() < positional_specs_.size())
    throw Error("expected " + positional_specs_[positional_values_.size()].first +
                " (see finegemm " + command_ + " --help)");
  return true;
}

bool ArgParser::has(const std::string& name) const { return values_.count(name) > 0; }

std::string ArgParser::get(const std::string& name) const {
  if (auto it = values_.find(name); it != values_.end()) return it->second;
  const Spec* spec = find(name);
  return spec ? spec->default_value : "";
}

int64_t ArgParser::get_int(const std::string& name, int64_t min_value, int64_t max_value) const {
  const std::string v = get(name);
  size_t used = 0;
  long long parsed = 0;
  try {
    parsed = std::stoll(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (v.empty() || used != v.size() || parsed < min_value || parsed > max_value)
    throw Error("--" + name + ": expected an integer in [" + std::to_string(min_value) + ", " +
                std::to_string(max_value) + "], got '" + v + "'");
  return parsed;
}

std::string ArgParser::get_choice(const std::string& name, const std::vector<std::string>& choices) const {
  const std::string v = get(name);
  if (std::find(choices.begin(), choices.end(), v) != choices.end()) return v;
  std::string list;
  for (const auto& c : choices) list += (list.empty() ? "" : "|") + c;
  throw Error("--" + name + ": expected one of " + list + ", got '" + v + "'");
}

// ---------------------------------------------------------------- terminal output

bool stdout_is_tty() { return isatty(STDOUT_FILENO) == 1; }
bool stderr_is_tty() { return isatty(STDERR_FILENO) == 1 && !std::getenv("FINEGEMM_NO_PROGRESS"); }

Progress::Progress(std::string label, int64_t total) : label_(std::move(label)), total_(total), enabled_(stderr_is_tty()) {}
Progress::~Progress() { done(); }

void Progress::step(const std::string& what) {
  what_ = what;
  draw();
  ++current_;
}

void Progress::draw() {
  if (!enabled_ || finished_) return;
  constexpr int kWidth = 28;
  const int filled = total_ > 0 ? static_cast<int>(kWidth * current_ / total_) : 0;
  std::string bar(filled, '#');
  bar += std::string(kWidth - filled, '.');
  std::string what = what_.size() > 48 ? what_.substr(0, 45) + "..." : what_;
  std::fprintf(stderr, "\r\033[K%s [%s] %lld/%lld %s", label_.c_str(), bar.c_str(), static_cast<long long>(current_),
               static_cast<long long>(total_), what.c_str());
  std::fflush(stderr);
}

void Progress::done() {
  if (!enabled_ || finished_) return;
  finished_ = true;
  std::fputs("\r\033[K", stderr);
  std::fflush(stderr);
}

Table::Table(std::vector<std::string> headers, std::vector<bool> align_right)
    : headers_(std::move(headers)), align_right_(std::move(align_right)) {
  align_right_.resize(headers_.size(), false);
}

void Table::add(std::vector<std::string> row) {
  row.resize(headers_.size());
  rows_.push_back(std::move(row));
}

// Display width of a UTF-8 string (counts code points; the table only holds ASCII and a few symbols).
static size_t display_width(const std::string& s) {
  size_t w = 0;
  for (unsigned char c : s) w += (c & 0xC0) != 0x80;
  return w;
}

void Table::print(FILE* out) const {
  const bool color = out == stdout && stdout_is_tty() && !std::getenv("NO_COLOR");
  std::vector<size_t> width(headers_.size());
  for (size_t c = 0; c < headers_.size(); ++c) width[c] = display_width(headers_[c]);
  for (const auto& row : rows_)
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], display_width(row[c]));
  auto cell = [&](const std::string& s, size_t c, bool paint) {
    const std::string pad(width[c] - display_width(s), ' ');
    std::string text = s;
    if (paint && color) {
      if (s == "ok") text = "\033[32m" + s + "\033[0m";
      else if (s == "FAIL" || s == "error") text = "\033[1;31m" + s + "\033[0m";
    }
    return align_right_[c] ? pad + text : text + pad;
  };
  std::string line;
  for (size_t c = 0; c < headers_.size(); ++c) line += (c ? "  " : "") + cell(headers_[c], c, false);
  std::fprintf(out, "%s\n", line.c_str());
  line.clear();
  for (size_t c = 0; c < headers_.size(); ++c) line += (c ? "  " : "") + std::string(width[c], '-');
  std::fprintf(out, "%s\n", line.c_str());
  for (const auto& row : rows_) {
    line.clear();
    for (size_t c = 0; c < row.size(); ++c) line += (c ? "  " : "") + cell(row[c], c, true);
    while (!line.empty() && line.back() == ' ') line.pop_back();
    std::fprintf(out, "%s\n", line.c_str());
  }
}

std::string format_double(double v, int precision) {
  if (!std::isfinite(v)) return std::isnan(v) ? "nan" : "inf";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", precision, v);
  return buf;
}

std::string format_sci(double v) {
  if (!std::isfinite(v)) return std::isnan(v) ? "nan" : "inf";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2e", v);
  return buf;
}

// ---------------------------------------------------------------- host tensors

HostTensor::HostTensor(DType dtype, const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (auto s : shape) n *= s;
  bytes.assign(static_cast<size_t>(n) * dtype_size(dtype) + 1, 0);  // +1: never a null pointer
  view = TensorView::of(bytes.data(), dtype, shape);
}

float read_float(const TensorView& t, int64_t i) {
  switch (t.dtype) {
    case DType::F32: return static_cast<const float*>(t.data)[i];
    case DType::BF16: return fmt::bf16_to_float(static_cast<const uint16_t*>(t.data)[i]);
    case DType::F16: return fmt::f16_to_float(static_cast<const uint16_t*>(t.data)[i]);
    case DType::F8_E4M3: return fmt::e4m3_to_float(static_cast<const uint8_t*>(t.data)[i]);
    default: throw Error(std::string("read_float: expected a float tensor, got ") + dtype_name(t.dtype));
  }
}

void write_float(const TensorView& t, int64_t i, float v) {
  switch (t.dtype) {
    case DType::F32: static_cast<float*>(t.data)[i] = v; break;
    case DType::BF16: static_cast<uint16_t*>(t.data)[i] = fmt::bf16_from_float(v); break;
    case DType::F16: static_cast<uint16_t*>(t.data)[i] = fmt::f16_from_float(v); break;
    case DType::F8_E4M3: static_cast<uint8_t*>(t.data)[i] = fmt::e4m3_from_float(v); break;
    default: throw Error(std::string("write_float: expected a float tensor, got ") + dtype_name(t.dtype));
  }
}

HostTensor random_normal(std::mt19937_64& rng, DType dtype, const std::vector<int64_t>& shape, float stddev) {
  HostTensor t(dtype, shape);
  std::normal_distribution<float> dist(0.0f, stddev);
  const int64_t n = t.numel();
  if (dtype == DType::F32) {
    float* p = t.ptr<float>();
    for (int64_t i = 0; i < n; ++i) p[i] = dist(rng);
  } else {
    for (int64_t i = 0; i < n; ++i) write_float(t.view, i, dist(rng));
  }
  return t;
}

void poison(const TensorView& t) {
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i) {
    switch (t.dtype) {
      case DType::F32: static_cast<float*>(t.data)[i] = NAN; break;
      case DType::BF16: case DType::F16: static_cast<uint16_t*>(t.data)[i] = 0x7FFF; break;  // NaN in both
      default: std::memset(static_cast<uint8_t*>(t.data) + i * dtype_size(t.dtype), 0xFF, dtype_size(t.dtype));
    }
  }
}

float amax(const TensorView& t) {
  float m = 0;
  for (int64_t i = 0; i < t.numel(); ++i) m = std::max(m, std::fabs(read_float(t, i)));
  return m;
}

Comparison compare(const TensorView& out, const TensorView& ref, int64_t rows) {
  const int64_t cols = out.size(-1);
  const int64_t n = (rows < 0 ? out.numel() / cols : rows) * cols;
  Comparison c;
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double o = read_float(out, i), r = read_float(ref, i);
    if (!std::isfinite(o)) {
      ++c.non_finite;
      continue;
    }
    num += (o - r) * (o - r);
    den += r * r;
  }
  c.rel = c.non_finite ? INFINITY : std::sqrt(num) / std::max(std::sqrt(den), 1e-300);
  return c;
}

// ---------------------------------------------------------------- quantized weights

QuantizedWeight quantize(const TensorView& master, const WeightRecipe& recipe) {
  const bool experts = master.ndim == 3;
  const int64_t e = experts ? master.size(0) : 1, n = master.size(-2), k = master.size(-1);
  const DType wdtype = recipe.element == ElementType::FP4_E2M1 ? DType::U8 : DType::F8_E4M3;
  const int64_t wcols = weight_storage_cols(recipe, k);
  const std::vector<int64_t> sshape = weight_scale_shape(recipe, n, k);
  const DType sdtype = weight_scale_dtype(recipe);
  std::vector<int64_t> wshape{n, wcols}, full_sshape = sshape;
  if (experts) {
    wshape.insert(wshape.begin(), e);
    full_sshape.insert(full_sshape.begin(), e);
  }
  QuantizedWeight q{HostTensor(wdtype, wshape), HostTensor(sdtype, full_sshape)};
  int64_t scale_numel = 1;
  for (auto s : sshape) scale_numel *= s;
  const size_t in_bytes = static_cast<size_t>(n * k) * dtype_size(master.dtype);
  const size_t w_bytes = static_cast<size_t>(n * wcols) * dtype_size(wdtype);
  const size_t s_bytes = static_cast<size_t>(scale_numel) * dtype_size(sdtype);
  // Experts are independent: quantized in parallel (the reference quantizer is a plain loop). An exception may
  // not leave an OpenMP region: the first error is kept and thrown after it.
  std::string error;
#pragma omp parallel for schedule(dynamic)
  for (int64_t i = 0; i < e; ++i) {
    try {
      const auto* src = static_cast<const uint8_t*>(master.data) + i * in_bytes;
      quantize_weights(TensorView::of(src, master.dtype, {n, k}), recipe,
                       TensorView::of(q.weight.bytes.data() + i * w_bytes, wdtype, {n, wcols}),
                       TensorView::of(q.scale.bytes.data() + i * s_bytes, sdtype, sshape));
    } catch (const Error& ex) {
#pragma omp critical(finegemm_cli_quantize)
      if (error.empty()) error = ex.what();
    }
  }
  if (!error.empty()) throw Error(error);
  return q;
}

// ---------------------------------------------------------------- linear

LinearArgs LinearData::args(const TensorView& out_view) const {
  LinearArgs a;
  a.x = x.view;
  a.x_scale = x_scale.view;
  a.activation = recipe.activation;
  a.weight = weight.weight.view;
  a.weight_recipe = recipe.weight;
  a.weight_scale = weight.scale.view;
  a.bias = bias.view;
  a.out = out_view;
  return a;
}

LinearData make_linear(std::mt19937_64& rng, const NamedRecipe& recipe, const LinearProblem& p) {
  LinearData d;
  d.recipe = recipe;
  d.x = random_normal(rng, DType::BF16, {p.m, p.k}, 1.0f);
  const HostTensor master = random_normal(rng, DType::F32, {p.n, p.k}, 1.0f / std::sqrt(static_cast<float>(p.k)));
  d.weight = quantize(master.view, recipe.weight);
  if (recipe.activation.is_static()) {
    d.x_scale = HostTensor(DType::F32, {});
    *d.x_scale.ptr<float>() = std::max(amax(d.x.view), 1e-4f) / fmt::kE4M3Max;
  }
  if (p.bias) d.bias = random_normal(rng, DType::F32, {p.n}, 0.1f);
  d.out = HostTensor(p.out_dtype, {p.m, p.n});
  d.ref = HostTensor(DType::F32, {p.m, p.n});
  return d;
}

LinearArgs first_rows(const LinearArgs& args, int64_t rows) {
  LinearArgs a = args;
  a.x.shape[0] = rows;
  a.out.shape[0] = rows;
  if (args.x.dtype == DType::F8_E4M3 && args.x_scale.ndim >= 1) a.x_scale.shape[0] = rows;
  return a;
}

// ---------------------------------------------------------------- Mixture of Experts

std::string MoeProblem::variant() const {
  std::string v = moe_activation_name(activation);
  if (!moe_activation_has_gate(activation)) v += " (no gate)";
  if (swiglu_limit > 0) v += " L=" + format_double(swiglu_limit, swiglu_limit == std::floor(swiglu_limit) ? 0 : 1);
  if (interleaved) v += " interleaved";
  if (bias) v += " +bias";
  return v;
}

double MoeProblem::flops_per_slot() const {
  const double up_rows = moe_activation_has_gate(activation) ? 2.0 * inter : 1.0 * inter;
  return 2.0 * (up_rows * hidden + static_cast<double>(hidden) * inter);
}

MoeMasters make_moe_masters(std::mt19937_64& rng, const MoeProblem& p) {
  const int64_t up_rows = moe_activation_has_gate(p.activation) ? 2 * p.inter : p.inter;
  // NOTE: with a limit the projections are drawn 4× wider so that the clamps bite on a few percent of the elements.
  const float widen = p.swiglu_limit > 0 ? 4.0f : 1.0f;
  MoeMasters m;
  m.gate_up = random_normal(rng, DType::F32, {p.experts, up_rows, p.hidden}, widen / std::sqrt(static_cast<float>(p.hidden)));
  m.down = random_normal(rng, DType::F32, {p.experts, p.hidden, p.inter}, 1.0f / std::sqrt(static_cast<float>(p.inter)));
  if (p.bias) {
    m.gate_up_bias = random_normal(rng, DType::F32, {p.experts, up_rows}, 0.5f);
    m.down_bias = random_normal(rng, DType::F32, {p.experts, p.hidden}, 0.1f);
  }
  return m;
}

MoeArgs MoeData::args(const TensorView& out) const {
  MoeArgs a;
  a.hidden = hidden.view;
  a.top_k_index = top_k_index.view;
  a.top_k_weights = top_k_weights.view;
  a.gate_up = gate_up.weight.view;
  a.gate_up_scale = gate_up.scale.view;
  a.down = down.weight.view;
  a.down_scale = down.scale.view;
  a.weight_recipe = recipe.weight;
  a.activation_recipe = recipe.activation;
  a.gate_up_act_scale = gate_up_act_scale.view;
  a.down_act_scale = down_act_scale.view;
  a.gate_up_bias = gate_up_bias.view;
  a.down_bias = down_bias.view;
  a.activation = problem.activation;
  a.swiglu_limit = problem.swiglu_limit;
  a.swiglu_alpha = problem.swiglu_alpha;
  a.interleaved_gate_up = problem.interleaved;
  a.out = out;
  return a;
}

namespace {

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// The MoE activation of RECIPES.md, for calibrating static scales.
double apply_activation(const MoeProblem& p, double gate, double up) {
  const double limit = p.swiglu_limit;
  if (limit > 0) {
    gate = std::min(gate, limit);
    up = std::clamp(up, -limit, limit);
  }
  switch (p.activation) {
    case MoeActivation::SwiGLU: return gate * sigmoid(gate) * up;
    case MoeActivation::SwiGLUOai: return (up + 1.0) * gate * sigmoid(p.swiglu_alpha * gate);
    case MoeActivation::Silu: return up * sigmoid(up);
    case MoeActivation::Gelu: {
      const double c = std::sqrt(2.0 / M_PI);
      return 0.5 * up * (1.0 + std::tanh(c * (up + 0.044715 * up * up * up)));
    }
    case MoeActivation::Relu2: return up > 0 ? up * up : 0.0;
  }
  return 0.0;
}


// Static recipes: per-expert input scales from the amax of the hidden states routed to each expert and of
// their intermediate activation, over the first calib_tokens tokens (what a calibration pass gives).
void calibrate_static(MoeData& d) {
  const MoeProblem& p = d.problem;
  d.gate_up_act_scale = HostTensor(DType::F32, {p.experts});
  d.down_act_scale = HostTensor(DType::F32, {p.experts});
  const int64_t calib = std::min(p.tokens, p.calib_tokens);
  const bool gated = moe_activation_has_gate(p.activation);
  const int64_t up_rows = gated ? 2 * p.inter : p.inter;
  std::vector<float> x(static_cast<size_t>(calib * p.hidden));
  for (int64_t i = 0; i < calib * p.hidden; ++i) x[i] = read_float(d.hidden.view, i);
  const float hidden_amax = std::max(amax(TensorView::of(x.data(), DType::F32, {calib * p.hidden})), 1e-4f);

  const auto& gw = d.gate_up.weight;
  const auto& gs = d.gate_up.scale;
  std::vector<int64_t> wshape = gw.view.sizes(), sshape = gs.view.sizes();
  wshape.erase(wshape.begin());
  sshape.erase(sshape.begin());
  const size_t w_bytes = static_cast<size_t>(up_rows * wshape[1]) * dtype_size(gw.view.dtype);
  const size_t s_bytes = static_cast<size_t>(gs.numel() / p.experts) * dtype_size(gs.view.dtype);
  HostTensor w(DType::F32, {up_rows, p.hidden});
  const float* wp = w.ptr<float>();
  const int32_t* idx = d.top_k_index.ptr<int32_t>();
  float* in_scale = d.gate_up_act_scale.ptr<float>();
  float* mid_scale = d.down_act_scale.ptr<float>();
  float any_mid = 1e-4f;
  std::vector<double> z(static_cast<size_t>(up_rows));
  for (int64_t e = 0; e < p.experts; ++e) {
    in_scale[e] = mid_scale[e] = 0;
    std::vector<int64_t> tokens;
    for (int64_t t = 0; t < calib; ++t)
      for (int64_t j = 0; j < p.top_k; ++j)
        if (idx[t * p.top_k + j] == e) tokens.push_back(t);
    if (tokens.empty()) continue;
    dequantize_weights(TensorView::of(gw.bytes.data() + e * w_bytes, gw.view.dtype, wshape),
                       TensorView::of(gs.bytes.data() + e * s_bytes, gs.view.dtype, sshape), d.recipe.weight, w.view);
    float x_amax = 1e-4f, mid_amax = 1e-4f;
    for (int64_t t : tokens) {
      const float* xt = x.data() + t * p.hidden;
      for (int64_t h = 0; h < p.hidden; ++h) x_amax = std::max(x_amax, std::fabs(xt[h]));
      for (int64_t r = 0; r < up_rows; ++r) {
        double acc = d.gate_up_bias.view.defined() ? read_float(d.gate_up_bias.view, e * up_rows + r) : 0.0;
        const float* wr = wp + r * p.hidden;
        for (int64_t h = 0; h < p.hidden; ++h) acc += static_cast<double>(wr[h]) * xt[h];
        z[r] = acc;
      }
      for (int64_t i = 0; i < p.inter; ++i) {
        double gate = 0, up = z[i];
        if (gated) {
          gate = p.interleaved ? z[2 * i] : z[i];
          up = p.interleaved ? z[2 * i + 1] : z[p.inter + i];
        }
        mid_amax = std::max(mid_amax, static_cast<float>(std::fabs(apply_activation(p, gate, up))));
      }
    }
    in_scale[e] = x_amax / fmt::kE4M3Max;
    mid_scale[e] = mid_amax / fmt::kE4M3Max;
    any_mid = std::max(any_mid, mid_amax);
  }
  // Experts no calibration token reached keep the layer-wide scales.
  for (int64_t e = 0; e < p.experts; ++e) {
    if (in_scale[e] == 0) in_scale[e] = hidden_amax / fmt::kE4M3Max;
    if (mid_scale[e] == 0) mid_scale[e] = any_mid / fmt::kE4M3Max;
  }
}

}  // namespace

void make_moe_inputs(std::mt19937_64& rng, MoeData& d, bool calibrate) {
  const MoeProblem& p = d.problem;
  d.hidden = random_normal(rng, DType::BF16, {p.tokens, p.hidden}, 1.0f);
  d.top_k_index = HostTensor(DType::I32, {p.tokens, p.top_k});
  d.top_k_weights = HostTensor(DType::F32, {p.tokens, p.top_k});
  int32_t* idx = d.top_k_index.ptr<int32_t>();
  float* wts = d.top_k_weights.ptr<float>();
  std::vector<int32_t> experts(static_cast<size_t>(p.experts));
  std::iota(experts.begin(), experts.end(), 0);
  std::uniform_real_distribution<float> weight_dist(0.05f, 1.0f);
  d.active_slots = 0;
  for (int64_t t = 0; t < p.tokens; ++t) {
    // k distinct experts: a partial Fisher-Yates shuffle.
    for (int64_t j = 0; j < p.top_k; ++j) {
      std::uniform_int_distribution<int64_t> pick(j, p.experts - 1);
      std::swap(experts[j], experts[pick(rng)]);
    }
    float sum = 0;
    for (int64_t j = 0; j < p.top_k; ++j) {
      bool skip = false;
      if (p.skip_slots) {
        // NOTE: -1 slots at the end, at the start, and one token (t = 1) routed nowhere at all.
        skip = (t % 7 == 3 && j == p.top_k - 1) || (t % 11 == 5 && j == 0) || (t == 1 && p.tokens > 2);
      }
      idx[t * p.top_k + j] = skip ? -1 : experts[j];
      wts[t * p.top_k + j] = weight_dist(rng);
      if (!skip) {
        sum += wts[t * p.top_k + j];
        ++d.active_slots;
      }
    }
    // Normalized over the token's routed slots; a token routed nowhere keeps its draws (unused, and no 1e6-fold
    // weights for a caller that routes it somewhere: they made that one token the whole output's norm).
    if (sum > 0)
      for (int64_t j = 0; j < p.top_k; ++j) wts[t * p.top_k + j] /= sum;
  }
  if (calibrate && d.recipe.activation.is_static()) calibrate_static(d);
}

MoeData make_moe(std::mt19937_64& rng, const NamedRecipe& recipe, const MoeProblem& p, const MoeMasters& masters) {
  MoeData d;
  d.recipe = recipe;
  d.problem = p;
  d.gate_up = quantize(masters.gate_up.view, recipe.weight);
  d.down = quantize(masters.down.view, recipe.weight);
  if (p.bias) {
    d.gate_up_bias = masters.gate_up_bias;
    d.down_bias = masters.down_bias;
  }
  make_moe_inputs(rng, d);
  return d;
}

MoeArgs first_tokens(const MoeArgs& args, int64_t rows) {
  MoeArgs a = args;
  a.hidden.shape[0] = rows;
  a.top_k_index.shape[0] = rows;
  a.top_k_weights.shape[0] = rows;
  a.out.shape[0] = rows;
  return a;
}

// ---------------------------------------------------------------- backends

DeviceRun::DeviceRun(Backend backend) : backend_(backend) {
  device_ = backend == Backend::Cuda ? Device{DeviceType::CUDA, 0} : Device{};
}

TensorView DeviceRun::put(const TensorView& host) {
  if (!host.defined() || device_.type == DeviceType::CPU) return host;
  held_.push_back(to_device(host, device_));
  return held_.back().view;
}

LinearArgs DeviceRun::upload(const LinearArgs& h) {
  LinearArgs a = h;
  a.x = put(h.x);
  a.x_scale = put(h.x_scale);
  a.weight = put(h.weight);
  a.weight_scale = put(h.weight_scale);
  a.bias = put(h.bias);
  a.out = put(h.out);
  return a;
}

MoeArgs DeviceRun::upload(const MoeArgs& h) {
  MoeArgs a = h;
  for (auto* t : {&a.hidden, &a.top_k_index, &a.top_k_weights, &a.gate_up, &a.gate_up_scale, &a.down, &a.down_scale,
                  &a.gate_up_act_scale, &a.down_act_scale, &a.gate_up_bias, &a.down_bias, &a.out})
    *t = put(*t);
  return a;
}

void DeviceRun::download(const TensorView& device_out, const TensorView& host_out) {
  if (device_.type == DeviceType::CPU) {
    if (device_out.data != host_out.data) copy_to_host(device_out, host_out);
    return;
  }
  copy_to_host(device_out, host_out);
}

void DeviceRun::sync() { synchronize(device_); }

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

uint64_t seed_from(const std::string& value) {
  if (value.empty()) return std::random_device{}() ^ (static_cast<uint64_t>(std::random_device{}()) << 32);
  size_t used = 0;
  uint64_t seed = 0;
  try {
    seed = std::stoull(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != value.size() || value[0] == '-') throw Error("--seed: expected a non-negative integer, got '" + value + "'");
  return seed;
}

}  // namespace finegemm::tools
