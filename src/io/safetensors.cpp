// safetensors reader (mmap), writer and model-directory loader. See include/finegemm/safetensors.hpp.
#include "finegemm/safetensors.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "finegemm/error.hpp"
#include "io/io_util.hpp"

namespace finegemm {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

// NOTE: the reference implementation refuses headers above 100 MB; so do we, before allocating anything.
constexpr uint64_t kMaxHeaderBytes = 100u << 20;
constexpr int kMaxJsonDepth = 4;  // {name: {"shape": [..]}} is depth 3 at most
constexpr size_t kMaxHeaderDims = 16;

struct DTypeName {
  DType dtype;
  const char* name;
};
constexpr DTypeName kDTypeNames[] = {
    {DType::F32, "F32"}, {DType::F16, "F16"}, {DType::BF16, "BF16"}, {DType::F8_E4M3, "F8_E4M3"},
    {DType::F8_E8M0, "F8_E8M0"}, {DType::U8, "U8"}, {DType::I8, "I8"}, {DType::I32, "I32"}, {DType::I64, "I64"},
};

std::string supported_dtypes() {
  std::string s;
  for (const auto& d : kDTypeNames) s += (s.empty() ? "" : ", ") + std::string(d.name);
  return s;
}

// A JSON number that is a non-negative integer fitting in uint64.
bool as_u64(const json& v, uint64_t& out) {
  if (v.is_number_unsigned()) {
    out = v.get<uint64_t>();
    return true;
  }
  if (v.is_number_integer()) {
    const int64_t i = v.get<int64_t>();
    if (i < 0) return false;
    out = static_cast<uint64_t>(i);
    return true;
  }
  return false;
}

std::string quoted(const std::string& s) {
  // Names come from untrusted files: keep messages printable and short.
  std::string out = "'";
  for (size_t i = 0; i < s.size() && i < 200; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    out += (c >= 0x20 && c < 0x7F) ? static_cast<char>(c) : '?';
  }
  if (s.size() > 200) out += "...";
  return out + "'";
}

SafetensorsEntry parse_entry(const std::string& origin, const std::string& name, const json& value) {
  const std::string where = origin + ": tensor " + quoted(name);
  if (!value.is_object())
    throw Error(where + ": expected an object {\"dtype\", \"shape\", \"data_offsets\"}, got " + value.type_name());
  SafetensorsEntry e;
  e.name = name;

  const auto dtype_it = value.find("dtype");
  if (dtype_it == value.end() || !dtype_it->is_string())
    throw Error(where + ": expected a string \"dtype\", got " +
                (dtype_it == value.end() ? std::string("none") : std::string(dtype_it->type_name())));
  try {
    e.dtype = parse_safetensors_dtype(dtype_it->get<std::string>());
  } catch (const Error& err) {
    throw Error(ErrorKind::Type, where + ": " + err.what());
  }

  const auto shape_it = value.find("shape");
  if (shape_it == value.end() || !shape_it->is_array())
    throw Error(where + ": expected an array \"shape\", got " +
                (shape_it == value.end() ? std::string("none") : std::string(shape_it->type_name())));
  if (shape_it->size() > kMaxHeaderDims)
    throw Error(where + ": expected at most " + std::to_string(kMaxHeaderDims) + " dimensions, got " +
                std::to_string(shape_it->size()));
  uint64_t numel = 1;
  bool overflow = false;
  for (const auto& dim : *shape_it) {
    uint64_t d = 0;
    if (!as_u64(dim, d) || d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      throw Error(where + ": shape " + shape_it->dump() + ": expected non-negative integer dimensions");
    e.shape.push_back(static_cast<int64_t>(d));
    overflow = overflow || __builtin_mul_overflow(numel, d, &numel);
  }
  uint64_t nbytes = 0;
  overflow = overflow || numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
             __builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_size(e.dtype)), &nbytes);
  // A zero dimension makes the product 0 whatever the others are; an overflow before it is harmless.
  if (std::find(e.shape.begin(), e.shape.end(), 0) != e.shape.end()) overflow = false, nbytes = 0;
  if (overflow) throw Error(where + ": shape " + shape_string(e.shape) + " has more elements than fit in 64 bits");

  const auto off_it = value.find("data_offsets");
  if (off_it == value.end() || !off_it->is_array() || off_it->size() != 2 || !as_u64((*off_it)[0], e.begin) ||
      !as_u64((*off_it)[1], e.end))
    throw Error(where + ": expected \"data_offsets\": [begin, end] with non-negative integers, got " +
                (off_it == value.end() ? std::string("none") : off_it->dump()));
  if (e.begin > e.end)
    throw Error(where + ": data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                "]: expected begin <= end");
  if (e.end - e.begin != nbytes)
    throw Error(where + ": data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) + "] hold " +
                std::to_string(e.end - e.begin) + " bytes, expected " + std::to_string(nbytes) + " for " +
                safetensors_dtype_name(e.dtype) + " " + shape_string(e.shape));
  return e;
}

}  // namespace

DType parse_safetensors_dtype(const std::string& name) {
  for (const auto& d : kDTypeNames)
    if (name == d.name) return d.dtype;
  throw Error(ErrorKind::Type, "dtype: expected one of " + supported_dtypes() + ", got " + quoted(name));
}

const char* safetensors_dtype_name(DType dtype) {
  for (const auto& d : kDTypeNames)
    if (d.dtype == dtype) return d.name;
  return "?";
}

int64_t SafetensorsEntry::numel() const {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

SafetensorsHeader parse_safetensors_header(const void* data, size_t size, const std::string& origin) {
  const auto* bytes = static_cast<const uint8_t*>(data);
  if (size < 8 || bytes == nullptr)
    throw Error(origin + ": expected at least 8 bytes (the header length), got " + std::to_string(size) +
                " (truncated file?)");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];
  if (header_len > size - 8)
    throw Error(origin + ": header length " + std::to_string(header_len) + " runs past the end of the file (" +
                std::to_string(size) + " bytes; truncated file?)");
  if (header_len > kMaxHeaderBytes)
    throw Error(origin + ": header length " + std::to_string(header_len) + " exceeds the limit of " +
                std::to_string(kMaxHeaderBytes) + " bytes");

  json root;
  try {
    const char* begin = reinterpret_cast<const char*>(bytes + 8);
    // Deeply nested input would only waste memory: a valid header is never deeper than 3.
    json::parser_callback_t depth_guard = [&](int depth, json::parse_event_t, json&) {
      if (depth > kMaxJsonDepth)
        throw Error(origin + ": header JSON nests deeper than " + std::to_string(kMaxJsonDepth) + " levels");
      return true;
    };
    root = json::parse(begin, begin + header_len, depth_guard);
  } catch (const json::exception& e) {
    throw Error(origin + ": header is not valid JSON: " + e.what());
  }
  if (!root.is_object()) throw Error(origin + ": header: expected a JSON object, got " + root.type_name());

  SafetensorsHeader header;
  header.data_offset = 8 + header_len;
  const uint64_t data_size = size - header.data_offset;
  for (const auto& [key, value] : root.items()) {
    if (key == "__metadata__") {
      if (!value.is_object())
        throw Error(origin + ": __metadata__: expected an object of strings, got " + value.type_name());
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string())
          throw Error(origin + ": __metadata__[" + quoted(mk) + "]: expected a string, got " + mv.type_name());
        header.metadata[mk] = mv.get<std::string>();
      }
      continue;
    }
    SafetensorsEntry e = parse_entry(origin, key, value);
    if (e.end > data_size)
      throw Error(origin + ": tensor " + quoted(key) + ": data_offsets [" + std::to_string(e.begin) + ", " +
                  std::to_string(e.end) + "] run past the end of the data region (" + std::to_string(data_size) +
                  " bytes; truncated file?)");
    header.tensors.push_back(std::move(e));
  }

  // The data region is exactly the tensors' bytes, back to back: no overlap, no hole, nothing after the last.
  std::vector<const SafetensorsEntry*> by_offset;
  for (const auto& e : header.tensors) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(), [](const SafetensorsEntry* a, const SafetensorsEntry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t covered = 0;
  const SafetensorsEntry* previous = nullptr;
  for (const SafetensorsEntry* e : by_offset) {
    if (e->begin < covered)
      throw Error(origin + ": tensor " + quoted(e->name) + ": data_offsets [" + std::to_string(e->begin) + ", " +
                  std::to_string(e->end) + "] overlap tensor " + quoted(previous->name) + " which ends at " +
                  std::to_string(covered));
    if (e->begin > covered)
      throw Error(origin + ": tensor " + quoted(e->name) + ": data_offsets start at " + std::to_string(e->begin) +
                  ", expected " + std::to_string(covered) + " (a hole of " + std::to_string(e->begin - covered) +
                  " bytes in the data region)");
    covered = e->end;
    previous = e;
  }
  if (covered != data_size)
    throw Error(origin + ": the tensors cover " + std::to_string(covered) + " bytes of the data region, expected all " +
                std::to_string(data_size) + " (trailing bytes after the last tensor)");
  return header;
}

// ---- SafetensorsFile -------------------------------------------------------------------------------------------

struct SafetensorsFile::Storage {
  void* map = nullptr;
  size_t map_size = 0;
  std::vector<uint8_t> owned;                         // from_bytes
  std::vector<std::vector<uint64_t>> aligned_copies;  // misaligned tensors, copied once at open
  const uint8_t* base() const { return map ? static_cast<const uint8_t*>(map) : owned.data(); }
  ~Storage() {
    if (map) munmap(map, map_size);
  }
};

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(ErrorKind::Runtime, path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(ErrorKind::Runtime, path + ": not a regular file");
  }
  const size_t size = static_cast<size_t>(st.st_size);
  auto storage = std::make_shared<Storage>();
  if (size > 0) {
    void* map = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      throw Error(ErrorKind::Runtime, path + ": mmap failed: " + std::strerror(err));
    }
    storage->map = map;
    storage->map_size = size;
  }
  ::close(fd);
  SafetensorsFile f;
  f.path_ = path;
  f.storage_ = std::move(storage);
  f.header_ = parse_safetensors_header(f.storage_->base(), size, path);
  f.index_tensors();
  return f;
}

SafetensorsFile SafetensorsFile::from_bytes(const void* data, size_t size, const std::string& origin) {
  auto storage = std::make_shared<Storage>();
  // +8: the base pointer of an empty buffer is still valid; the vector's own allocation is suitably aligned.
  storage->owned.resize(size + 8);
  if (size) std::memcpy(storage->owned.data(), data, size);
  SafetensorsFile f;
  f.path_ = origin;
  f.storage_ = std::move(storage);
  f.header_ = parse_safetensors_header(f.storage_->base(), size, origin);
  f.index_tensors();
  return f;
}

void SafetensorsFile::index_tensors() {
  pointers_.resize(header_.tensors.size());
  for (size_t i = 0; i < header_.tensors.size(); ++i) {
    const auto& e = header_.tensors[i];
    index_[e.name] = i;
    const uint8_t* p = storage_->base() + header_.data_offset + e.begin;
    const size_t align = dtype_size(e.dtype);
    if (reinterpret_cast<uintptr_t>(p) % align != 0) {
      // NOTE: files from the reference writer never take this path (it aligns every tensor); others may.
      auto& copy = storage_->aligned_copies.emplace_back((e.end - e.begin + 7) / 8 + 1);
      std::memcpy(copy.data(), p, e.end - e.begin);
      p = reinterpret_cast<const uint8_t*>(copy.data());
    }
    pointers_[i] = p;
  }
}

bool SafetensorsFile::contains(const std::string& name) const { return index_.count(name) != 0; }

const SafetensorsEntry* SafetensorsFile::find(const std::string& name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &header_.tensors[it->second];
}

TensorView SafetensorsFile::get(const std::string& name) const {
  const auto it = index_.find(name);
  if (it == index_.end()) throw Error(path_ + ": no tensor named " + quoted(name));
  const auto& e = header_.tensors[it->second];
  if (e.shape.size() > static_cast<size_t>(finegemm::kMaxDims))
    throw Error(path_ + ": tensor " + quoted(name) + ": shape " + shape_string(e.shape) + " has more than " +
                std::to_string(finegemm::kMaxDims) + " dimensions, which finegemm's tensor views do not support");
  return TensorView::of(pointers_[it->second], e.dtype, e.shape);
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  for (const auto& e : header_.tensors) out.push_back(e.name);
  return out;
}

// ---- Writer ----------------------------------------------------------------------------------------------------

void save_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::set<std::string> seen;
  for (const auto& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__")
      throw Error("save_safetensors: tensor name " + quoted(t.name) + " is reserved or empty");
    if (!seen.insert(t.name).second) throw Error("save_safetensors: tensor " + quoted(t.name) + " appears twice");
    if (!t.tensor.defined()) throw Error("save_safetensors: tensor " + quoted(t.name) + ": expected a tensor, got none");
    if (t.tensor.device.type != DeviceType::CPU)
      throw Error("save_safetensors: tensor " + quoted(t.name) + ": expected a CPU tensor, got one on " +
                  device_name(t.tensor.device));
    if (!t.tensor.is_contiguous())
      throw Error("save_safetensors: tensor " + quoted(t.name) + ": expected a contiguous tensor");
    if (t.tensor.numel() > 0 && t.tensor.data == nullptr)
      throw Error("save_safetensors: tensor " + quoted(t.name) + ": null data");
  }
  // Largest elements first, then by name: every tensor starts aligned to its element size.
  std::vector<const NamedTensor*> order;
  for (const auto& t : tensors) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](const NamedTensor* a, const NamedTensor* b) {
    const size_t sa = dtype_size(a->tensor.dtype), sb = dtype_size(b->tensor.dtype);
    return sa != sb ? sa > sb : a->name < b->name;
  });
  json header = json::object();
  uint64_t offset = 0;
  for (const NamedTensor* t : order) {
    const uint64_t nbytes = static_cast<uint64_t>(t->tensor.numel()) * dtype_size(t->tensor.dtype);
    header[t->name] = {{"dtype", safetensors_dtype_name(t->tensor.dtype)},
                       {"shape", t->tensor.sizes()},
                       {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');

  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw Error(ErrorKind::Runtime, tmp + ": cannot open for writing: " + std::strerror(errno));
    uint8_t len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));
    out.write(reinterpret_cast<const char*>(len), 8);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (const NamedTensor* t : order) {
      const uint64_t nbytes = static_cast<uint64_t>(t->tensor.numel()) * dtype_size(t->tensor.dtype);
      if (nbytes) out.write(static_cast<const char*>(t->tensor.data), static_cast<std::streamsize>(nbytes));
    }
    out.flush();
    if (!out) throw Error(ErrorKind::Runtime, tmp + ": write failed: " + std::strerror(errno));
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) throw Error(ErrorKind::Runtime, path + ": cannot rename " + tmp + ": " + ec.message());
}

// ---- Model directory -------------------------------------------------------------------------------------------

ModelFiles ModelFiles::open(const std::string& path) {
  ModelFiles m;
  std::error_code ec;
  const bool is_dir = fs::is_directory(path, ec);
  if (!is_dir && !fs::is_regular_file(path, ec))
    throw Error(ErrorKind::Runtime, path + ": no such model directory or safetensors file");
  const fs::path dir = is_dir ? fs::path(path) : fs::path(path).parent_path();
  m.directory_ = dir.empty() ? "." : dir.string();
  if (fs::is_regular_file(dir / "config.json", ec)) m.config_json_ = io::read_text_file((dir / "config.json").string());

  auto add_file = [&](const fs::path& file) -> size_t {
    m.files_.push_back(SafetensorsFile::open(file.string()));
    return m.files_.size() - 1;
  };
  auto add_all = [&](size_t file_index) {
    for (const auto& e : m.files_[file_index].entries()) {
      const auto [it, inserted] = m.owner_.emplace(e.name, file_index);
      if (!inserted && it->second != file_index)
        throw Error(m.directory_ + ": tensor " + quoted(e.name) + " appears in both " + m.files_[it->second].path() +
                    " and " + m.files_[file_index].path());
    }
  };

  if (!is_dir) {
    add_all(add_file(path));
    return m;
  }
  const fs::path index_path = dir / "model.safetensors.index.json";
  if (fs::is_regular_file(index_path, ec)) {
    json index;
    try {
      index = json::parse(io::read_text_file(index_path.string()));
    } catch (const json::exception& e) {
      throw Error(index_path.string() + ": not valid JSON: " + e.what());
    }
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
      throw Error(index_path.string() + ": expected an object with a \"weight_map\" object");
    std::map<std::string, size_t> shard_index;
    for (const auto& [tensor, shard] : index["weight_map"].items()) {
      if (!shard.is_string()) throw Error(index_path.string() + ": weight_map[" + quoted(tensor) + "]: expected a file name");
      const std::string shard_name = shard.get<std::string>();
      const fs::path rel(shard_name);
      if (shard_name.empty() || rel.is_absolute() || shard_name.find("..") != std::string::npos)
        throw Error(index_path.string() + ": weight_map[" + quoted(tensor) + "]: expected a file inside the directory, got " +
                    quoted(shard_name));
      auto it = shard_index.find(shard_name);
      if (it == shard_index.end()) it = shard_index.emplace(shard_name, add_file(dir / rel)).first;
      if (!m.files_[it->second].contains(tensor))
        throw Error(index_path.string() + ": weight_map puts " + quoted(tensor) + " in " + shard_name +
                    ", which has no such tensor");
      m.owner_[tensor] = it->second;
    }
    for (const auto& [name, file_index] : shard_index) add_all(file_index);
    return m;
  }
  if (fs::is_regular_file(dir / "model.safetensors", ec)) {
    add_all(add_file(dir / "model.safetensors"));
    return m;
  }
  // No index and no model.safetensors: every *.safetensors file in the directory, in name order.
  std::vector<fs::path> found;
  for (const auto& de : fs::directory_iterator(dir, ec))
    if (de.is_regular_file() && de.path().extension() == ".safetensors") found.push_back(de.path());
  std::sort(found.begin(), found.end());
  if (found.empty())
    throw Error(path + ": expected model.safetensors, model.safetensors.index.json or *.safetensors files, found none");
  for (const auto& f : found) add_all(add_file(f));
  return m;
}

const SafetensorsEntry* ModelFiles::find(const std::string& name) const {
  const auto it = owner_.find(name);
  return it == owner_.end() ? nullptr : files_[it->second].find(name);
}

TensorView ModelFiles::get(const std::string& name) const {
  const auto it = owner_.find(name);
  if (it == owner_.end()) throw Error(directory_ + ": no tensor named " + quoted(name));
  return files_[it->second].get(name);
}

std::vector<std::string> ModelFiles::names() const {
  std::vector<std::string> out;
  for (const auto& [name, file] : owner_) out.push_back(name);
  return out;
}

}  // namespace finegemm
