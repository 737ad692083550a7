// safetensors files: a bounds-checked reader over a memory map, a writer, and a model directory loader.
//
// File layout: 8-byte little-endian header length L, L bytes of JSON
//   {"<name>": {"dtype": "F8_E4M3", "shape": [N, K], "data_offsets": [begin, end]}, ..., "__metadata__": {...}}
// then the data region; offsets are relative to its start. Every check the reference implementation makes is made
// here too (offsets contiguous from 0 to the end of the file, no holes, no overlaps), and each failure is a
// finegemm::Error that names the file, the tensor and what was wrong.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "finegemm/tensor.hpp"

namespace finegemm {

// "F8_E4M3" ↔ DType. Unknown strings throw finegemm::Error listing the supported ones.
DType parse_safetensors_dtype(const std::string& name);
const char* safetensors_dtype_name(DType dtype);

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offsets into the data region
  uint64_t end = 0;
  int64_t numel() const;
};

struct SafetensorsHeader {
  std::vector<SafetensorsEntry> tensors;  // in name order
  std::map<std::string, std::string> metadata;
  uint64_t data_offset = 0;  // 8 + header length: where the data region starts in the file
};

// Parses and validates the header of a whole safetensors file held in memory (`size` bytes). Never reads outside
// [data, data + size). `origin` names the file in error messages.
SafetensorsHeader parse_safetensors_header(const void* data, size_t size, const std::string& origin = "safetensors");

// A safetensors file opened read-only through mmap. Views point into the mapping (or, for the rare tensor whose
// offset is not aligned to its element size, into an aligned copy), and stay valid while any copy of this object
// lives. Copies share the mapping.
class SafetensorsFile {
 public:
  SafetensorsFile() = default;
  static SafetensorsFile open(const std::string& path);
  // The same checks over bytes already in memory (tests, the fuzzer); the bytes are copied.
  static SafetensorsFile from_bytes(const void* data, size_t size, const std::string& origin = "<memory>");

  const std::string& path() const { return path_; }
  bool contains(const std::string& name) const;
  const SafetensorsEntry* find(const std::string& name) const;  // nullptr when absent
  TensorView get(const std::string& name) const;                // throws Error when absent
  std::vector<std::string> names() const;
  const std::vector<SafetensorsEntry>& entries() const { return header_.tensors; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }

 private:
  void index_tensors();  // fills index_ and pointers_ from header_
  struct Storage;
  std::shared_ptr<Storage> storage_;
  std::string path_;
  SafetensorsHeader header_;
  std::map<std::string, size_t> index_;
  std::vector<const void*> pointers_;  // per entry, aligned
};

// Writes a safetensors file: keys sorted, data ordered by element size (largest first) then name so that every
// tensor starts aligned to its element size, header padded with spaces to a multiple of 8. Views must be CPU and
// contiguous. Written to `path + ".tmp"` first, then renamed.
struct NamedTensor {
  std::string name;
  TensorView tensor;
};
void save_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// A Hugging Face model directory: config.json plus model.safetensors, or the shards named by
// model.safetensors.index.json ("weight_map": tensor → shard file). `path` may also be a single .safetensors file
// (config.json is then looked up next to it and may be absent).
class ModelFiles {
 public:
  static ModelFiles open(const std::string& path);

  const std::string& directory() const { return directory_; }
  const std::string& config_json() const { return config_json_; }  // "{}" when there is no config.json
  bool contains(const std::string& name) const { return owner_.count(name) != 0; }
  TensorView get(const std::string& name) const;  // throws Error naming the tensor and the directory
  const SafetensorsEntry* find(const std::string& name) const;
  std::vector<std::string> names() const;  // sorted
  const std::vector<SafetensorsFile>& files() const { return files_; }

 private:
  std::string directory_;
  std::string config_json_ = "{}";
  std::vector<SafetensorsFile> files_;
  std::map<std::string, size_t> owner_;  // tensor → index in files_
};

}  // namespace finegemm
