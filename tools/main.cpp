// finegemm <check|run|quantize> ...: the command-line program.
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "commands.hpp"
#include "finegemm/finegemm.hpp"

#ifndef FINEGEMM_VERSION
#define FINEGEMM_VERSION "0.1.0"
#endif

namespace {

constexpr const char* kUsage =
    "usage: finegemm <command> [options]\n"
    "\n"
    "Fine-grained FP8/FP4 linear and Mixture-of-Experts layers, for every recipe real checkpoints ship.\n"
    "\n"
    "commands:\n"
    "  check      run every recipe x op on each backend against the CPU reference; print the support matrix\n"
    "  run        run a synthetic DeepSeek-V3-shaped MoE block in every recipe, or a layer of a checkpoint\n"
    "  quantize   turn a bf16 safetensors model into an FP8/FP4 checkpoint\n"
    "\n"
    "options:\n"
    "  --help     show this help (finegemm <command> --help: the command's options)\n"
    "  --version  show the version and the backends this build has\n"
    "\n"
    "examples:\n"
    "  finegemm run                                   # every recipe, synthetic MoE block, fastest backend\n"
    "  finegemm check --backend cpu --json\n"
    "  finegemm run --checkpoint DIR --layer model.layers.0.mlp.down_proj --tokens 64\n";

void print_version() {
  std::printf("finegemm %s\n", FINEGEMM_VERSION);
  std::printf("backends: ref, cpu%s\n", FINEGEMM_WITH_CUDA ? ", cuda (sm_90a)" : "");
  if (FINEGEMM_WITH_CUDA)
    std::printf("cuda device: %s\n", finegemm::cuda_available() ? "present" : "not found");
  else
    std::printf("cuda: not built (configure with -DFINEGEMM_CUDA=ON)\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  const std::string command = argv[1];
  if (command == "--help" || command == "-h" || command == "help") {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (command == "--version" || command == "version") {
    print_version();
    return 0;
  }
  try {
    // Each command parses its own options: argv from the first one on.
    if (command == "check") return finegemm::tools::cmd_check(argc - 2, argv + 2);
    if (command == "run") return finegemm::tools::cmd_run(argc - 2, argv + 2);
    if (command == "quantize") return finegemm::tools::cmd_quantize(argc - 2, argv + 2);
    std::fprintf(stderr, "finegemm: unknown command '%s': expected check, run or quantize (see finegemm --help)\n",
                 command.c_str());
    return 2;
  } catch (const finegemm::Error& e) {
    std::fprintf(stderr, "finegemm %s: error: %s\n", command.c_str(), e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "finegemm %s: internal error: %s\n", command.c_str(), e.what());
    return 3;
  }
}
