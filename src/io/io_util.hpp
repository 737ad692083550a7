// Small file helpers shared by src/io and tools/cmd_quantize.cpp.
#pragma once
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "finegemm/error.hpp"

namespace finegemm::io {

inline std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorKind::Runtime, path + ": cannot open: " + std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void write_text_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw Error(ErrorKind::Runtime, path + ": cannot open for writing: " + std::strerror(errno));
  out << text;
  out.flush();
  if (!out) throw Error(ErrorKind::Runtime, path + ": write failed: " + std::strerror(errno));
}

}  // namespace finegemm::io
