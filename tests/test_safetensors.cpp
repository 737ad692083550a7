// safetensors: round trips of every dtype, every malformed-file check, the model-directory loader, and a
// mutation fuzz of the header parser that runs in CI (the libFuzzer target under fuzz/ needs clang).
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "finegemm/safetensors.hpp"
#include "testing.hpp"

namespace fs = std::filesystem;
using finegemm::DType;
using finegemm::Error;
using finegemm::SafetensorsFile;
using finegemm::testing::Buffer;

namespace {

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xFF);
  return s;
}

// A file from a raw header text and data bytes.
std::string raw_file(const std::string& header, const std::string& data) { return le64(header.size()) + header + data; }

SafetensorsFile parse(const std::string& bytes) { return SafetensorsFile::from_bytes(bytes.data(), bytes.size(), "test"); }

// Expects parse() to throw finegemm::Error whose message contains every fragment.
void expect_error(const std::string& bytes, std::initializer_list<const char*> fragments) {
  try {
    parse(bytes);
    FAIL() << "expected finegemm::Error, the file parsed";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const char* f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << "message: " << msg << "\nmissing: " << f;
  }
}

Buffer random_bytes(DType dtype, std::vector<int64_t> shape) {
  Buffer b(dtype, std::move(shape));
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& x : b.bytes) x = static_cast<uint8_t>(byte(finegemm::testing::rng()));
  return b;
}

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() /
           ("finegemm_st_" + std::to_string(::getpid()) + "_" + std::to_string(finegemm::testing::rng()() % 1000000));
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
void write_file(const fs::path& p, const std::string& s) {
  std::ofstream out(p, std::ios::binary);
  out << s;
}

// A valid two-tensor file used as the base of the malformed cases.
const std::string kHeader2 =
    R"({"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},"b":{"dtype":"U8","shape":[4],"data_offsets":[16,20]}})";
const std::string kData2(20, '\x01');

}  // namespace

TEST(Safetensors, RoundTripEveryDtype) {
  TempDir dir;
  const std::vector<std::pair<DType, std::vector<int64_t>>> cases = {
      {DType::F8_E4M3, {7, 33}}, {DType::F8_E8M0, {3, 5}}, {DType::F32, {4, 3, 2}}, {DType::BF16, {17}},
      {DType::F16, {2, 2, 2, 3}}, {DType::U8, {9, 8}},   {DType::I8, {1, 13}},     {DType::I32, {6}},
      {DType::I64, {3, 1}},       {DType::F32, {}},      {DType::BF16, {0, 4}},
  };
  std::vector<Buffer> buffers;
  std::vector<finegemm::NamedTensor> tensors;
  for (size_t i = 0; i < cases.size(); ++i) buffers.push_back(random_bytes(cases[i].first, cases[i].second));
  for (size_t i = 0; i < cases.size(); ++i) tensors.push_back({"t" + std::to_string(cases.size() - i), buffers[i].view});
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"producer", "finegemm test"}};
  const fs::path path = dir.path / "x.safetensors";
  finegemm::save_safetensors(path.string(), tensors, metadata);

  const SafetensorsFile f = SafetensorsFile::open(path.string());
  EXPECT_EQ(f.metadata(), metadata);
  ASSERT_EQ(f.entries().size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& t = tensors[i];
    const finegemm::TensorView v = f.get(t.name);
    EXPECT_EQ(v.dtype, cases[i].first) << t.name;
    EXPECT_EQ(v.sizes(), cases[i].second) << t.name;
    const size_t nbytes = static_cast<size_t>(v.numel()) * finegemm::dtype_size(v.dtype);
    EXPECT_EQ(std::memcmp(v.data, t.tensor.data, nbytes), 0) << t.name;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data) % finegemm::dtype_size(v.dtype), 0u) << t.name << " misaligned";
  }
  EXPECT_FALSE(f.contains("nope"));
  EXPECT_THROW(f.get("nope"), Error);

  // The header: length a multiple of 8, keys sorted, every tensor at an offset aligned to its element size.
  const std::string bytes = read_file(path);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<uint8_t>(bytes[i]);
  EXPECT_EQ(header_len % 8, 0u);
  const auto header = nlohmann::json::parse(bytes.substr(8, header_len));
  std::string previous;
  for (const auto& [key, value] : header.items()) {
    EXPECT_LT(previous, key);
    previous = key;
    if (key == "__metadata__") continue;
    const uint64_t begin = value["data_offsets"][0];
    EXPECT_EQ(begin % finegemm::dtype_size(finegemm::parse_safetensors_dtype(value["dtype"])), 0u) << key;
  }
  // Copies share the mapping: a view outlives the object it came from.
  finegemm::TensorView kept;
  {
    SafetensorsFile copy = f;
    kept = copy.get(tensors[0].name);
  }
  EXPECT_EQ(std::memcmp(kept.data, tensors[0].tensor.data, 7 * 33), 0);
}

TEST(Safetensors, WriterRejectsBadInput) {
  TempDir dir;
  Buffer a = random_bytes(DType::F32, {2, 3});
  const std::string p = (dir.path / "bad.safetensors").string();
  EXPECT_THROW(finegemm::save_safetensors(p, {{"a", a.view}, {"a", a.view}}), Error);
  EXPECT_THROW(finegemm::save_safetensors(p, {{"__metadata__", a.view}}), Error);
  finegemm::TensorView strided = a.view;
  strided.strides[0] = 5;
  EXPECT_THROW(finegemm::save_safetensors(p, {{"s", strided}}), Error);
  finegemm::TensorView gpu = a.view;
  gpu.device = {finegemm::DeviceType::CUDA, 0};
  EXPECT_THROW(finegemm::save_safetensors(p, {{"g", gpu}}), Error);
  EXPECT_FALSE(fs::exists(p));
}

TEST(Safetensors, ValidBaseParses) {
  const SafetensorsFile f = parse(raw_file(kHeader2, kData2));
  EXPECT_EQ(f.get("a").sizes(), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(f.get("b").dtype, DType::U8);
  // Whitespace padding after the JSON and unknown entry keys are accepted.
  EXPECT_NO_THROW(parse(raw_file(kHeader2 + "      ", kData2)));
}

TEST(Safetensors, TruncatedFileIsAClearError) {
  const std::string full = raw_file(kHeader2, kData2);
  for (size_t len = 0; len < full.size(); ++len) EXPECT_THROW(parse(full.substr(0, len)), Error) << "length " << len;
  expect_error(full.substr(0, 5), {"expected at least 8 bytes", "got 5", "truncated"});
  expect_error(full.substr(0, full.size() - 3), {"'b'", "run past the end of the data region", "truncated"});

  // The same through mmap.
  TempDir dir;
  write_file(dir.path / "t.safetensors", full.substr(0, full.size() - 1));
  try {
    SafetensorsFile::open((dir.path / "t.safetensors").string());
    FAIL() << "truncated file opened";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("t.safetensors"), std::string::npos) << e.what();
  }
  write_file(dir.path / "empty.safetensors", "");
  EXPECT_THROW(SafetensorsFile::open((dir.path / "empty.safetensors").string()), Error);
  EXPECT_THROW(SafetensorsFile::open((dir.path / "missing.safetensors").string()), Error);
}

TEST(Safetensors, HeaderLengthPastEof) {
  expect_error(le64(1000) + "{}", {"header length 1000 runs past the end of the file (10 bytes"});
  expect_error(le64(~uint64_t{0}) + "{}", {"runs past the end of the file"});
  expect_error(le64(uint64_t{1} << 62) + kHeader2, {"runs past the end"});
}

TEST(Safetensors, OffsetsOutOfRange) {
  expect_error(raw_file(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[100,104]}})", "abcd"),
               {"'a'", "[100, 104]", "run past the end of the data region (4 bytes"});
  expect_error(raw_file(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[18446744073709551612,18446744073709551616]}})", "abcd"),
               {"'a'"});
  expect_error(raw_file(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[-4,0]}})", "abcd"), {"'a'", "data_offsets"});
  expect_error(raw_file(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}})", "abcd"), {"expected begin <= end"});
  expect_error(raw_file(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0]}})", "abcd"), {"[begin, end]"});
  expect_error(raw_file(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0.5,4.5]}})", "abcd"), {"[begin, end]"});
}

TEST(Safetensors, OverlappingHolesAndTrailingData) {
  expect_error(raw_file(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})",
                        "abcdef"),
               {"'b'", "overlap tensor 'a'"});
  expect_error(raw_file(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[4,6]}})",
                        "abcdef"),
               {"'b'", "a hole of 2 bytes"});
  expect_error(raw_file(kHeader2, kData2 + "xyz"), {"cover 20 bytes", "expected all 23", "trailing"});
  // Oversized: more bytes than the shape needs.
  expect_error(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,12]}})", std::string(12, 'x')),
               {"'a'", "hold 12 bytes, expected 8 for F32 [2]"});
}

TEST(Safetensors, BadJson) {
  expect_error(raw_file(R"({"a":{"dtype":"U8",)", ""), {"header is not valid JSON"});
  expect_error(raw_file("[1,2,3]", ""), {"expected a JSON object, got array"});
  expect_error(raw_file("", ""), {"not valid JSON"});
  expect_error(raw_file(std::string(1000, '[') + std::string(1000, ']'), ""), {"nests deeper"});
  expect_error(raw_file(R"({"a":"b"})", ""), {"'a'", "expected an object"});
  expect_error(raw_file(R"({"__metadata__":{"k":1}})", ""), {"__metadata__['k']", "expected a string"});
  expect_error(raw_file(R"({"__metadata__":[1]})", ""), {"__metadata__", "expected an object"});
  expect_error(raw_file(std::string("{\"\xff\xfe\":1}"), ""), {"not valid JSON"});
}

TEST(Safetensors, WrongDtype) {
  expect_error(raw_file(R"({"a":{"dtype":"F8_E5M2","shape":[4],"data_offsets":[0,4]}})", "abcd"),
               {"'a'", "dtype: expected one of F32, F16, BF16, F8_E4M3, F8_E8M0, U8, I8, I32, I64", "got 'F8_E5M2'"});
  expect_error(raw_file(R"({"a":{"dtype":7,"shape":[4],"data_offsets":[0,4]}})", "abcd"), {"expected a string \"dtype\""});
  expect_error(raw_file(R"({"a":{"shape":[4],"data_offsets":[0,4]}})", "abcd"), {"\"dtype\", got none"});
  try {
    parse(raw_file(R"({"a":{"dtype":"f32","shape":[1],"data_offsets":[0,4]}})", "abcd"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), finegemm::ErrorKind::Type);
  }
}

TEST(Safetensors, ShapeAndByteSizeMismatch) {
  expect_error(raw_file(R"({"a":{"dtype":"BF16","shape":[3],"data_offsets":[0,4]}})", "abcd"),
               {"'a'", "hold 4 bytes, expected 6 for BF16 [3]"});
  expect_error(raw_file(R"({"a":{"dtype":"U8","shape":[-4],"data_offsets":[0,4]}})", "abcd"), {"non-negative integer"});
  expect_error(raw_file(R"({"a":{"dtype":"U8","shape":[2.0,2],"data_offsets":[0,4]}})", "abcd"), {"non-negative integer"});
  expect_error(raw_file(R"({"a":{"dtype":"U8","shape":"4","data_offsets":[0,4]}})", "abcd"), {"expected an array \"shape\""});
  expect_error(raw_file(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}})", "abcd"),
               {"more elements than fit in 64 bits"});
  expect_error(raw_file(R"({"a":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,4]}})", "abcd"),
               {"more elements than fit in 64 bits"});
  expect_error(raw_file(R"({"a":{"dtype":"U8","shape":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1],"data_offsets":[0,1]}})", "a"),
               {"at most 16 dimensions"});
  // A zero dimension makes the tensor empty whatever the other dimensions are.
  EXPECT_NO_THROW(parse(raw_file(R"({"a":{"dtype":"F32","shape":[0,4611686018427387904,8],"data_offsets":[0,0]}})", "")));
  // Five dimensions parse, but finegemm's views take four: get() says so.
  const SafetensorsFile f = parse(raw_file(R"({"a":{"dtype":"U8","shape":[1,1,1,1,2],"data_offsets":[0,2]}})", "ab"));
  EXPECT_THROW(f.get("a"), Error);
}

TEST(Safetensors, MisalignedOffsetsAreCopiedAligned) {
  // An odd header length puts the F32 tensor at an odd address in the buffer.
  const std::string header = R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"b":{"dtype":"F32","shape":[2],"data_offsets":[1,9]}})";
  float values[2] = {1.5f, -2.25f};
  std::string data = "z" + std::string(reinterpret_cast<const char*>(values), 8);
  const SafetensorsFile f = parse(raw_file(header, data));
  const auto b = f.get("b");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data) % 4, 0u);
  EXPECT_EQ(b.ptr<float>()[0], 1.5f);
  EXPECT_EQ(b.ptr<float>()[1], -2.25f);
}

// ---- Mutation fuzz of the parser (the CI stand-in for fuzz/fuzz_safetensors.cpp) --------------------------------

namespace {

void exercise(const std::string& bytes) {
  try {
    const SafetensorsFile f = parse(bytes);
    for (const auto& e : f.entries()) {
      if (e.shape.size() > 4) continue;
      const auto v = f.get(e.name);
      const auto* p = static_cast<const uint8_t*>(v.data);
      uint8_t sum = 0;
      for (int64_t i = 0; i < v.numel() * static_cast<int64_t>(finegemm::dtype_size(v.dtype)); ++i) sum ^= p[i];
      volatile uint8_t sink = sum;
      (void)sink;
    }
  } catch (const Error&) {
  }
  // Anything else escapes and fails the test.
}

std::vector<std::string> seed_corpus() {
  std::vector<std::string> seeds;
  const fs::path dir = fs::path(__FILE__).parent_path().parent_path() / "fuzz" / "corpus";
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_regular_file()) seeds.push_back(read_file(e.path()));
  return seeds;
}

std::string mutate(std::string s, std::mt19937_64& gen) {
  std::uniform_int_distribution<int> kind(0, 7), byte(0, 255);
  const int rounds = 1 + static_cast<int>(gen() % 4);
  static const char* const tokens[] = {"{", "}", "[", "]", ",", ":", "\"", "-1", "0", "18446744073709551615",
                                       "9223372036854775808", "1e308", "null", "\"F32\"", "\"__metadata__\"",
                                       "\"data_offsets\"", "\"shape\"", "\"dtype\"", "[0,0]", "[]"};
  for (int r = 0; r < rounds; ++r) {
    const size_t pos = s.empty() ? 0 : gen() % (s.size() + 1);
    switch (kind(gen)) {
      case 0: if (!s.empty() && pos < s.size()) s[pos] = static_cast<char>(byte(gen)); break;
      case 1: if (pos < s.size()) s[pos] = static_cast<char>(s[pos] ^ (1 << (gen() % 8))); break;
      case 2: s.insert(pos, 1, static_cast<char>(byte(gen))); break;
      case 3: if (pos < s.size()) s.erase(pos, 1 + gen() % 8); break;
      case 4: s.insert(pos, tokens[gen() % std::size(tokens)]); break;
      case 5: s.resize(gen() % (s.size() + 1)); break;  // truncate
      case 6: if (s.size() >= 8) {                      // rewrite the header length
          const uint64_t len = (gen() % 3 == 0) ? gen() : (s.size() - 8) + (static_cast<int64_t>(gen() % 17) - 8);
          s.replace(0, 8, le64(len));
        }
        break;
      case 7: if (s.size() > 8 && pos < s.size()) {  // duplicate a chunk
          const size_t n = std::min<size_t>(gen() % 16 + 1, s.size() - pos);
          s.insert(pos, s.substr(pos, n));
        }
        break;
    }
  }
  return s;
}

}  // namespace

TEST(Safetensors, MutationFuzzOnlyThrowsError) {
  std::vector<std::string> seeds = seed_corpus();
  EXPECT_GE(seeds.size(), 5u) << "fuzz/corpus not found next to tests/";
  seeds.push_back(raw_file(kHeader2, kData2));
  std::mt19937_64 gen(finegemm::testing::rng()());
  for (const auto& s : seeds) ASSERT_NO_THROW(exercise(s));
  int parsed = 0;
  for (int i = 0; i < 6000; ++i) {
    const std::string input = mutate(seeds[i % seeds.size()], gen);
    ASSERT_NO_THROW(exercise(input)) << "input #" << i;
    try {
      parse(input);
      ++parsed;
    } catch (const Error&) {
    }
  }
  RecordProperty("parsed", parsed);
}

// ---- Model directory -------------------------------------------------------------------------------------------

TEST(ModelFiles, SingleFileShardsAndConfig) {
  TempDir dir;
  Buffer a = random_bytes(DType::BF16, {4, 8}), b = random_bytes(DType::F32, {3}), c = random_bytes(DType::U8, {5});
  // Single model.safetensors + config.json.
  finegemm::save_safetensors((dir.path / "model.safetensors").string(), {{"a", a.view}, {"b", b.view}});
  write_file(dir.path / "config.json", R"({"hidden_size": 8})");
  {
    const auto m = finegemm::ModelFiles::open(dir.path.string());
    EXPECT_EQ(m.names(), (std::vector<std::string>{"a", "b"}));
    EXPECT_NE(m.config_json().find("hidden_size"), std::string::npos);
    EXPECT_EQ(std::memcmp(m.get("b").data, b.bytes.data(), 12), 0);
    EXPECT_THROW(m.get("c"), Error);
    // A file path works too, with the config next to it.
    const auto single = finegemm::ModelFiles::open((dir.path / "model.safetensors").string());
    EXPECT_EQ(single.names().size(), 2u);
    EXPECT_NE(single.config_json().find("hidden_size"), std::string::npos);
  }
  // Shards through model.safetensors.index.json (it wins over model.safetensors).
  finegemm::save_safetensors((dir.path / "model-00001-of-00002.safetensors").string(), {{"a", a.view}, {"c", c.view}});
  finegemm::save_safetensors((dir.path / "model-00002-of-00002.safetensors").string(), {{"b", b.view}});
  write_file(dir.path / "model.safetensors.index.json",
             R"({"metadata": {"total_size": 81}, "weight_map": {"a": "model-00001-of-00002.safetensors",
                 "b": "model-00002-of-00002.safetensors", "c": "model-00001-of-00002.safetensors"}})");
  {
    const auto m = finegemm::ModelFiles::open(dir.path.string());
    EXPECT_EQ(m.names(), (std::vector<std::string>{"a", "b", "c"}));
    EXPECT_EQ(m.files().size(), 2u);
    EXPECT_EQ(std::memcmp(m.get("c").data, c.bytes.data(), 5), 0);
    EXPECT_EQ(m.get("a").dtype, DType::BF16);
  }
  // A weight_map entry naming a shard without the tensor, or a path outside the directory.
  write_file(dir.path / "model.safetensors.index.json",
             R"({"weight_map": {"b": "model-00001-of-00002.safetensors"}})");
  EXPECT_THROW(finegemm::ModelFiles::open(dir.path.string()), Error);
  write_file(dir.path / "model.safetensors.index.json", R"({"weight_map": {"b": "../x.safetensors"}})");
  EXPECT_THROW(finegemm::ModelFiles::open(dir.path.string()), Error);
  write_file(dir.path / "model.safetensors.index.json", R"({"weight_map": 3})");
  EXPECT_THROW(finegemm::ModelFiles::open(dir.path.string()), Error);
  // No safetensors at all.
  TempDir empty;
  EXPECT_THROW(finegemm::ModelFiles::open(empty.path.string()), Error);
  EXPECT_THROW(finegemm::ModelFiles::open((empty.path / "nope").string()), Error);
}
