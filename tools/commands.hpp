// The finegemm program's subcommands. Each returns the process exit code.
#pragma once

namespace finegemm::tools {

int cmd_check(int argc, char** argv);     // tools/cmd_check.cpp
int cmd_run(int argc, char** argv);       // tools/cmd_run.cpp
int cmd_quantize(int argc, char** argv);  // tools/cmd_quantize.cpp

}  // namespace finegemm::tools
