// Model I/O: safetensors reader/writer, sharded checkpoints, HF config.json,
// generated weights. Files to read are made by an independent byte-level writer
// in this file (not bp::io's writer), so reader and writer cannot share a bug.
#include <gtest/gtest.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "harness/io/checkpoint.h"
#include "harness/io/errors.h"
#include "harness/io/hf_config.h"
#include "harness/io/json_strict.h"
#include "harness/io/safetensors.h"
#include "reference/common/rng.h"
#include "reference/contract/contract.h"
#include "reference/model/config.h"
#include "reference/model/weights.h"
#include "support/golden.h"

namespace bp {
namespace {

namespace fs = std::filesystem;
using io::BadInput;

bool has(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

// Runs f, which must throw BadInput; returns it.
BadInput expect_bad(const std::function<void()>& f) {
  try {
    f();
  } catch (const BadInput& e) {
    return e;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected BadInput, got another exception: " << e.what();
    return BadInput("", "", "");
  }
  ADD_FAILURE() << "expected BadInput, nothing was thrown";
  return BadInput("", "", "");
}

// --- independent byte-level safetensors writer ------------------------------

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(v >> (8 * i));
  return s;
}

template <class T>
std::string bytes_of(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

// The raw file: length, header text verbatim, data.
std::string raw_file(const std::string& header, const std::string& data) { return le64(header.size()) + header + data; }

struct RawTensor {
  std::string name, dtype, shape;  // shape as JSON text, e.g. "[2,3]"
  std::string data;
};

// A well-formed file from tensors laid out in the given order (the header lists them
// in that order too, with hand-written JSON).
std::string raw_safetensors(const std::vector<RawTensor>& ts, const std::string& metadata_json = "") {
  std::string h = "{";
  std::string data;
  bool first = true;
  if (!metadata_json.empty()) {
    h += "\"__metadata__\":" + metadata_json;
    first = false;
  }
  for (const RawTensor& t : ts) {
    h += (first ? "" : ",");
    first = false;
    h += "\"" + t.name + "\":{\"dtype\":\"" + t.dtype + "\",\"shape\":" + t.shape + ",\"data_offsets\":[" +
         std::to_string(data.size()) + "," + std::to_string(data.size() + t.data.size()) + "]}";
    data += t.data;
  }
  h += "}";
  return raw_file(h, data);
}

std::string shape_json(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) r += ',';
    r += std::to_string(s[i]);
  }
  return r + "]";
}

class TempDir {
 public:
  TempDir() {
    static int n = 0;
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() /
            ("bp_test_io_" + std::to_string(::getpid()) + "_" + (info ? std::string(info->name()) : "x") + "_" +
             std::to_string(n++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  std::string str() const { return path_.string(); }
  std::string write(const std::string& name, const std::string& bytes) const {
    std::ofstream(file(name), std::ios::binary) << bytes;
    return file(name);
  }
  size_t count_files() const {
    size_t k = 0;
    for (auto& e : fs::directory_iterator(path_)) k += e.is_regular_file();
    return k;
  }

 private:
  fs::path path_;
};

std::string read_all(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

ModelConfig fixture(const std::string& name) {
  return io::load_hf_config(test::source_path("fixtures/models/" + name + "/config.json"));
}

// ============================================================================
// safetensors reader
// ============================================================================

TEST(SafetensorsRead, IndependentlyWrittenFile) {
  TempDir d;
  const std::vector<float> f32 = {1.0f, -2.5f, 0x1.01p0f /* tie: 1 + 2^-8 -> 1 */, 0x1.03p0f /* -> 1+2^-6 (even) */,
                                  3.0e38f, -0.0f};
  const std::vector<uint16_t> b16 = {0x3f80, 0xc000, 0x7fc1 /* NaN payload kept as bits */, 0x0001};
  // F16: 1.0, -2.0, smallest subnormal 2^-24, max 65504, +Inf, -0.
  const std::vector<uint16_t> f16 = {0x3c00, 0xc000, 0x0001, 0x7bff, 0x7c00, 0x8000};
  const std::vector<int32_t> i32 = {7, -9};
  const std::vector<int64_t> i64 = {int64_t{1} << 40};
  const std::string path = d.write("a.safetensors", raw_safetensors({{"w.f32", "F32", "[2,3]", bytes_of(f32)},
                                                                     {"w.bf16", "BF16", "[4]", bytes_of(b16)},
                                                                     {"w.f16", "F16", "[3,2]", bytes_of(f16)},
                                                                     {"ids", "I32", "[2]", bytes_of(i32)},
                                                                     {"big", "I64", "[1,1]", bytes_of(i64)}},
                                                                    R"({"format":"pt","note":"x"})"));
  const io::SafetensorsFile f = io::SafetensorsFile::open(path);
  ASSERT_EQ(f.tensors().size(), 5u);
  EXPECT_EQ(f.tensors()[0].name, "big");  // sorted by name
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.metadata().at("note"), "x");

  const io::TensorInfo& t = f.at("w.f32");
  EXPECT_EQ(t.dtype, io::DType::F32);
  EXPECT_EQ(t.shape, (std::vector<uint64_t>{2, 3}));
  EXPECT_EQ(f.read_f32(t), f32);
  const std::vector<bf16> r = f.read_bf16(t);
  EXPECT_EQ(r[0].bits, 0x3f80);
  EXPECT_EQ(r[1].bits, 0xc020);
  EXPECT_EQ(r[2].bits, 0x3f80);  // tie to even
  EXPECT_EQ(r[3].bits, 0x3f82);  // 1 + 3·2^-8 is a tie between 0x3f81 and 0x3f82: even
  EXPECT_EQ(r[4].bits, 0x7f62);  // 3e38 rounds to 0x7f62 (nearest)
  EXPECT_EQ(r[5].bits, 0x8000);

  const std::vector<bf16> rb = f.read_bf16(f.at("w.bf16"));
  for (size_t i = 0; i < b16.size(); ++i) EXPECT_EQ(rb[i].bits, b16[i]) << i;  // bit-exact, NaN payload included

  const std::vector<float> h = f.read_f32(f.at("w.f16"));
  EXPECT_EQ(h[0], 1.0f);
  EXPECT_EQ(h[1], -2.0f);
  EXPECT_EQ(h[2], 0x1p-24f);
  EXPECT_EQ(h[3], 65504.0f);
  EXPECT_TRUE(std::isinf(h[4]) && h[4] > 0);
  EXPECT_TRUE(std::signbit(h[5]) && h[5] == 0.0f);
  const std::vector<bf16> hb = f.read_bf16(f.at("w.f16"));
  EXPECT_EQ(hb[3].bits, round_bf16(65504.0f).bits);
  EXPECT_EQ(hb[2].bits, 0x3380);  // 2^-24 exactly

  const auto raw = f.bytes(f.at("ids"));
  ASSERT_EQ(raw.size(), 8u);
  int32_t v;
  std::memcpy(&v, raw.data() + 4, 4);
  EXPECT_EQ(v, -9);
  // Integer tensors are not weights: no implicit conversion.
  const BadInput e = expect_bad([&] { (void)f.read_bf16(f.at("ids")); });
  EXPECT_EQ(e.field(), "ids");
  EXPECT_TRUE(has(e.message(), "I32"));
}

TEST(SafetensorsRead, EdgeCasesThatAreValid) {
  // Scalars (shape []), zero-size tensors (several at one offset), no tensors at
  // all, header padded with spaces, unaligned data.
  const std::vector<float> one = {4.0f};
  const std::string file = raw_safetensors({{"empty1", "F32", "[0,5]", ""},
                                            {"s", "F32", "[]", bytes_of(one)},
                                            {"empty2", "BF16", "[3,0]", ""},
                                            {"odd", "U8", "[3]", "abc"},
                                            {"after", "BF16", "[1]", std::string("\x80\x3f", 2)}});
  const auto f = io::SafetensorsFile::from_buffer(std::vector<uint8_t>(file.begin(), file.end()), "mem");
  EXPECT_EQ(f.at("s").numel(), 1u);
  EXPECT_EQ(f.read_f32(f.at("s"))[0], 4.0f);
  EXPECT_EQ(f.at("empty1").numel(), 0u);
  EXPECT_EQ(f.read_bf16(f.at("after"))[0].bits, 0x3f80);  // at an odd offset

  const std::string header = "{}     ";
  EXPECT_TRUE(io::parse_safetensors(reinterpret_cast<const uint8_t*>(raw_file(header, "").data()), 8 + header.size(), "p")
                  .tensors.empty());
  const std::string meta_only = raw_file(R"({"__metadata__":{}})", "");
  EXPECT_NO_THROW(io::parse_safetensors(reinterpret_cast<const uint8_t*>(meta_only.data()), meta_only.size(), "p"));
}

struct BadCase {
  const char* what;
  std::string bytes;
  std::string field;       // expected BadInput::field()
  std::string msg_has;     // substring of the message
};

std::vector<BadCase> bad_cases() {
  const std::string f4 = std::string(16, '\x01');  // 4 F32 values
  auto entry = [](const std::string& name, const std::string& body) { return "\"" + name + "\":" + body; };
  std::vector<BadCase> c;
  c.push_back({"empty file", "", "", "0 bytes"});
  c.push_back({"7 bytes", std::string(7, '\0'), "", "7 bytes"});
  c.push_back({"header length past the end", le64(100) + "{}", "header length", "past the end"});
  c.push_back({"huge header length", le64(0xffffffffffffffffull) + "{}", "header length", "exceeds"});
  c.push_back({"header length just over the limit", le64(100'000'001) + "{}", "header length", "exceeds"});
  c.push_back({"bad JSON", raw_file("{\"a\": {\"dtype\": ", ""), "", "not valid JSON"});
  c.push_back({"JSON with garbage after it", raw_file("{} x", ""), "", "not valid JSON"});
  c.push_back({"JSON array header", raw_file("[1,2]", ""), "header", "start with '{'"});
  c.push_back({"invalid UTF-8", raw_file("{\"\xff\":1}", ""), "", "not valid JSON"});
  c.push_back({"unknown dtype",
               raw_file("{" + entry("w", R"({"dtype":"F128","shape":[4],"data_offsets":[0,16]})") + "}", f4), "w",
               "unknown dtype"});
  c.push_back({"sub-byte dtype",
               raw_file("{" + entry("w", R"({"dtype":"F4","shape":[4],"data_offsets":[0,16]})") + "}", f4), "w",
               "sub-byte"});
  c.push_back({"shape not a list",
               raw_file("{" + entry("w", R"({"dtype":"F32","shape":4,"data_offsets":[0,16]})") + "}", f4), "w",
               "not a list of integers"});
  c.push_back({"negative dim",
               raw_file("{" + entry("w", R"({"dtype":"F32","shape":[-4],"data_offsets":[0,16]})") + "}", f4), "w",
               "negative"});
  c.push_back({"fractional dim",
               raw_file("{" + entry("w", R"({"dtype":"F32","shape":[2.5],"data_offsets":[0,16]})") + "}", f4), "w",
               "not an integer"});
  c.push_back({"string dim",
               raw_file("{" + entry("w", R"({"dtype":"F32","shape":["4"],"data_offsets":[0,16]})") + "}", f4), "w",
               "is a string, not an integer"});
  c.push_back({"shape product overflows",
               raw_file("{" + entry("w", R"({"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,16]})") + "}",
                        f4),
               "w", "64 bits"});
  c.push_back({"one offset",
               raw_file("{" + entry("w", R"({"dtype":"F32","shape":[4],"data_offsets":[0]})") + "}", f4), "w",
               "two integers"});
  c.push_back({"three offsets",
               raw_file("{" + entry("w", R"({"dtype":"F32","shape":[4],"data_offsets":[0,16,16]})") + "}", f4), "w",
               "two integers"});
  c.push_back({"begin > end",
               raw_file("{" + entry("w", R"({"dtype":"F32","shape":[0],"data_offsets":[16,0]})") + "}", f4), "w",
               "begin 16 > end 0"});
  c.push_back({"end beyond the buffer (truncated file)",
               raw_file("{" + entry("w", R"({"dtype":"F32","shape":[4],"data_offsets":[0,16]})") + "}", f4.substr(0, 12)),
               "w", "past the end of the data buffer"});
  c.push_back({"header lies about the byte size",
               raw_file("{" + entry("w", R"({"dtype":"F32","shape":[3],"data_offsets":[0,16]})") + "}", f4), "w",
               "needs 12"});
  c.push_back({"overlapping tensors",
               raw_file("{" + entry("a", R"({"dtype":"F32","shape":[3],"data_offsets":[0,12]})") + "," +
                            entry("b", R"({"dtype":"F32","shape":[2],"data_offsets":[8,16]})") + "}",
                        f4),
               "b", "overlap tensor \"a\""});
  c.push_back({"identical offsets",
               raw_file("{" + entry("a", R"({"dtype":"F32","shape":[4],"data_offsets":[0,16]})") + "," +
                            entry("b", R"({"dtype":"I32","shape":[4],"data_offsets":[0,16]})") + "}",
                        f4),
               "b", "overlap"});
  c.push_back({"hole between tensors",
               raw_file("{" + entry("a", R"({"dtype":"F32","shape":[1],"data_offsets":[0,4]})") + "," +
                            entry("b", R"({"dtype":"F32","shape":[2],"data_offsets":[8,16]})") + "}",
                        f4),
               "b", "hole of 4"});
  c.push_back({"first tensor not at 0",
               raw_file("{" + entry("a", R"({"dtype":"F32","shape":[3],"data_offsets":[4,16]})") + "}", f4), "a",
               "hole"});
  c.push_back({"trailing bytes",
               raw_file("{" + entry("a", R"({"dtype":"F32","shape":[3],"data_offsets":[0,12]})") + "}", f4), "",
               "4 trailing bytes"});
  c.push_back({"duplicate tensor name",
               raw_file("{" + entry("a", R"({"dtype":"F32","shape":[2],"data_offsets":[0,8]})") + "," +
                            entry("a", R"({"dtype":"F32","shape":[2],"data_offsets":[8,16]})") + "}",
                        f4),
               "a", "duplicate key"});
  c.push_back({"duplicate key in an entry",
               raw_file("{" + entry("a", R"({"dtype":"F32","dtype":"I32","shape":[4],"data_offsets":[0,16]})") + "}", f4),
               "a.dtype", "duplicate key"});
  c.push_back({"unknown key in an entry",
               raw_file("{" + entry("a", R"({"dtype":"F32","shape":[4],"data_offsets":[0,16],"x":1})") + "}", f4), "a",
               "unknown key \"x\""});
  c.push_back({"missing dtype", raw_file("{" + entry("a", R"({"shape":[4],"data_offsets":[0,16]})") + "}", f4), "a",
               "no \"dtype\""});
  c.push_back({"entry not an object", raw_file("{" + entry("a", "[1]") + "}", ""), "a", "not an object"});
  c.push_back({"empty tensor name",
               raw_file("{" + entry("", R"({"dtype":"F32","shape":[4],"data_offsets":[0,16]})") + "}", f4), "\"\"",
               "empty name"});
  c.push_back({"metadata value not a string", raw_file(R"({"__metadata__":{"format":1}})", ""), "__metadata__.format",
               "not a string"});
  c.push_back({"metadata not an object", raw_file(R"({"__metadata__":"pt"})", ""), "__metadata__", "not an object"});
  c.push_back({"deep nesting", raw_file("{\"a\":" + std::string(100, '[') + std::string(100, ']') + "}", ""), "",
               "nested deeper"});
  return c;
}

TEST(SafetensorsRead, EveryBadInputIsRefusedNamingFileAndField) {
  TempDir d;
  int k = 0;
  for (const BadCase& c : bad_cases()) {
    SCOPED_TRACE(c.what);
    // From a file (mmap path) ...
    const std::string path = d.write("bad" + std::to_string(k++) + ".safetensors", c.bytes);
    const BadInput e = expect_bad([&] { (void)io::SafetensorsFile::open(path); });
    EXPECT_EQ(e.file(), path);
    EXPECT_EQ(e.field(), c.field);
    EXPECT_TRUE(has(e.message(), c.msg_has)) << e.what();
    EXPECT_TRUE(has(e.what(), path)) << e.what();
    // ... and from memory (the fuzzing entry point), with an exactly-sized heap copy
    // so that ASan sees any read past the end.
    std::vector<uint8_t> buf(c.bytes.begin(), c.bytes.end());
    const BadInput m = expect_bad([&] { (void)io::parse_safetensors(buf.data(), buf.size(), "mem.safetensors"); });
    EXPECT_EQ(m.file(), "mem.safetensors");
    EXPECT_EQ(m.field(), c.field);
  }
}

TEST(SafetensorsRead, EveryTruncationOfAValidFileIsRefused) {
  const std::vector<float> v = {1, 2, 3, 4, 5, 6};
  const std::string file = raw_safetensors({{"a", "F32", "[2]", bytes_of(std::vector<float>(v.begin(), v.begin() + 2))},
                                            {"b", "F32", "[4]", bytes_of(std::vector<float>(v.begin() + 2, v.end()))}});
  for (size_t n = 0; n < file.size(); ++n) {
    std::vector<uint8_t> buf(file.begin(), file.begin() + static_cast<std::ptrdiff_t>(n));
    EXPECT_THROW((void)io::parse_safetensors(buf.data(), buf.size(), "t"), BadInput) << n;
  }
  std::vector<uint8_t> buf(file.begin(), file.end());
  EXPECT_NO_THROW((void)io::parse_safetensors(buf.data(), buf.size(), "t"));
}

TEST(SafetensorsRead, MissingFileAndDirectory) {
  TempDir d;
  EXPECT_EQ(expect_bad([&] { (void)io::SafetensorsFile::open(d.file("nope.safetensors")); }).message(), "no such file");
  EXPECT_TRUE(has(expect_bad([&] { (void)io::SafetensorsFile::open(d.str()); }).message(), "not a regular file"));
}

TEST(SafetensorsRead, MessagesStayOneShortLine) {
  const std::string name = "evil\\nname" + std::string(5000, 'x');  // JSON escape: a real newline in the name
  const std::string file = raw_file("{\"" + name + R"(":{"dtype":"F32","shape":[1],"data_offsets":[0,8]}})", "12345678");
  std::vector<uint8_t> buf(file.begin(), file.end());
  const BadInput e = expect_bad([&] { (void)io::parse_safetensors(buf.data(), buf.size(), "p"); });
  EXPECT_EQ(e.field().substr(0, 9), "evil\nname");
  const std::string what = e.what();
  EXPECT_EQ(what.find('\n'), std::string::npos);
  EXPECT_LT(what.size(), 600u);
}

// The seed corpora of tests/fuzz/ are valid inputs (fuzzers mutate from there).
TEST(FuzzSeeds, AreValidInputs) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(test::source_path("tests/fuzz/safetensors"))) {
    EXPECT_NO_THROW((void)io::SafetensorsFile::open(e.path().string())) << e.path();
    ++n;
  }
  for (const auto& e : fs::directory_iterator(test::source_path("tests/fuzz/hf_config"))) {
    EXPECT_NO_THROW((void)io::load_hf_config(e.path().string())) << e.path();
    ++n;
  }
  EXPECT_GE(n, 6);
}

// ============================================================================
// safetensors writer
// ============================================================================

TEST(SafetensorsWrite, RoundTripSortedAlignedAtomic) {
  TempDir d;
  const std::vector<bf16> a = random_bf16(6, 1, 1.0f);
  const std::vector<float> b = random_f32(5, 2, 3.0f);
  const std::vector<int64_t> c = {-1, 2, 3};
  const std::string path = d.file("rt.safetensors");
  std::vector<io::WriteTensor> ts = {
      {"zeta", io::DType::BF16, {2, 3}, {reinterpret_cast<const uint8_t*>(a.data()), a.size() * 2}},
      {"alpha", io::DType::F32, {5}, {reinterpret_cast<const uint8_t*>(b.data()), b.size() * 4}},
      {"mid", io::DType::I64, {3, 1}, {reinterpret_cast<const uint8_t*>(c.data()), c.size() * 8}},
      {"nothing", io::DType::F16, {0}, {}},
  };
  io::write_safetensors(path, ts, {{"format", "pt"}});
  EXPECT_EQ(d.count_files(), 1u);  // no temporary left behind

  const std::string bytes = read_all(path);
  EXPECT_EQ(bytes, bytes_of(io::serialize_safetensors(ts, {{"format", "pt"}})));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[static_cast<size_t>(i)]);
  EXPECT_EQ((8 + n) % 8, 0u);
  EXPECT_EQ(bytes[8], '{');
  EXPECT_EQ(bytes[8 + n - 1] == ' ' || bytes[8 + n - 1] == '}', true);
  // Data laid out in name order: alpha (20 bytes) first.
  EXPECT_EQ(bytes.substr(8 + n, 20), bytes_of(b));

  const io::SafetensorsFile f = io::SafetensorsFile::open(path);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.at("alpha").begin, 0u);
  EXPECT_EQ(f.read_f32(f.at("alpha")), b);
  const std::vector<bf16> ra = f.read_bf16(f.at("zeta"));
  EXPECT_EQ(std::memcmp(ra.data(), a.data(), 12), 0);
  EXPECT_EQ(f.at("mid").shape, (std::vector<uint64_t>{3, 1}));
  EXPECT_EQ(f.at("nothing").numel(), 0u);

  // Overwrite in place: replaced whole, still no temporary.
  io::write_safetensors(path, {ts[1]});
  EXPECT_EQ(io::SafetensorsFile::open(path).tensors().size(), 1u);
  EXPECT_EQ(d.count_files(), 1u);
}

TEST(SafetensorsWrite, RefusesInconsistentTensorsAndKeepsTheOldFile) {
  TempDir d;
  const std::string path = d.file("keep.safetensors");
  const std::vector<float> v = {1, 2};
  const io::WriteTensor good{"x", io::DType::F32, {2}, {reinterpret_cast<const uint8_t*>(v.data()), 8}};
  io::write_safetensors(path, {good});
  const std::string before = read_all(path);
  EXPECT_THROW(io::write_safetensors(path, {good, good}), std::invalid_argument);  // duplicate
  EXPECT_THROW(io::write_safetensors(path, {{"y", io::DType::F32, {3}, good.bytes}}), std::invalid_argument);
  EXPECT_THROW(io::write_safetensors(path, {{"", io::DType::F32, {2}, good.bytes}}), std::invalid_argument);
  EXPECT_THROW(io::write_safetensors(path, {{"__metadata__", io::DType::F32, {2}, good.bytes}}), std::invalid_argument);
  EXPECT_THROW(io::write_safetensors(d.file("no/such/dir/x.safetensors"), {good}), io::IoError);
  EXPECT_EQ(read_all(path), before);
  EXPECT_EQ(d.count_files(), 1u);
}

// ============================================================================
// HF config.json
// ============================================================================

// Strict parsing is linear in an object's members: a safetensors header of a dump
// with tens of thousands of tensors is one object of that many objects. With
// nlohmann's callback parser it was quadratic (7 minutes for 90k tensors); CTest's
// TIMEOUT on json_strict_linear (tests/CMakeLists.txt) is the bound, 100x the
// linear time.
TEST(JsonStrict, ObjectOfManyObjectsParsesInLinearTime) {
  constexpr int kMembers = 200000;
  std::string text = "{";
  for (int i = 0; i < kMembers; ++i) text += (i ? ",\"t" : "\"t") + std::to_string(i) + "\":{\"a\":[1]}";
  text += "}";
  const nlohmann::json j = bp::io::parse_json_strict(text, "big.json");
  EXPECT_EQ(j.size(), static_cast<size_t>(kMembers));
  EXPECT_EQ(j.at("t199999").at("a").at(0), 1);
  // The checks still hold past the first pass: a duplicate at the end is refused.
  text.back() = ',';
  text += "\"t0\":{}}";
  try {
    bp::io::parse_json_strict(text, "big.json");
    ADD_FAILURE() << "a duplicate key was accepted";
  } catch (const bp::io::BadInput& e) {
    EXPECT_NE(std::string(e.what()).find("duplicate key \"t0\""), std::string::npos) << e.what();
  }
}

TEST(HfConfig, FixturesParse) {
  const ModelConfig d = fixture("qwen3-dense-tiny");
  EXPECT_EQ(d.model_type, "qwen3");
  EXPECT_EQ(d.hidden_size, 64);
  EXPECT_EQ(d.num_hidden_layers, 3);
  EXPECT_EQ(d.num_attention_heads, 8);
  EXPECT_EQ(d.num_key_value_heads, 4);
  EXPECT_EQ(d.head_dim, 32);
  EXPECT_EQ(d.intermediate_size, 128);
  EXPECT_EQ(d.vocab_size, 512);
  EXPECT_TRUE(d.tie_word_embeddings);
  EXPECT_EQ(d.rope_theta, 1e6);
  EXPECT_EQ(d.rms_norm_eps, 1e-6);
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(d.is_moe_layer(i));

  const ModelConfig m = fixture("qwen3-moe-tiny");
  EXPECT_EQ(m.model_type, "qwen3_moe");
  EXPECT_EQ(m.num_experts, 8);
  EXPECT_EQ(m.num_experts_per_tok, 2);
  EXPECT_EQ(m.moe_intermediate_size, 32);
  EXPECT_EQ(m.intermediate_size, 128);
  EXPECT_TRUE(m.norm_topk_prob);
  EXPECT_FALSE(m.tie_word_embeddings);
  EXPECT_EQ(m.mlp_only_layers, std::vector<int64_t>{0});
  EXPECT_FALSE(m.is_moe_layer(0));
  EXPECT_TRUE(m.is_moe_layer(1));
  EXPECT_TRUE(m.is_moe_layer(2));
  EXPECT_TRUE(m.is_moe_layer(3));

  const ModelConfig s = fixture("qwen3-0.6b");
  EXPECT_EQ(s.hidden_size, 1024);
  EXPECT_EQ(s.num_hidden_layers, 28);
  EXPECT_EQ(s.num_attention_heads, 16);
  EXPECT_EQ(s.num_key_value_heads, 8);
  EXPECT_EQ(s.head_dim, 128);
  EXPECT_EQ(s.intermediate_size, 3072);
  EXPECT_EQ(s.vocab_size, 151936);
  EXPECT_TRUE(s.tie_word_embeddings);
  EXPECT_EQ(s.max_position_embeddings, 40960);
  EXPECT_EQ(s.rope_theta, 1e6);

  const ModelConfig l = fixture("qwen3-30b-a3b");
  EXPECT_EQ(l.hidden_size, 2048);
  EXPECT_EQ(l.num_hidden_layers, 48);
  EXPECT_EQ(l.num_attention_heads, 32);
  EXPECT_EQ(l.num_key_value_heads, 4);
  EXPECT_EQ(l.head_dim, 128);  // not hidden/heads = 64
  EXPECT_EQ(l.num_experts, 128);
  EXPECT_EQ(l.num_experts_per_tok, 8);
  EXPECT_EQ(l.moe_intermediate_size, 768);
  EXPECT_EQ(l.intermediate_size, 6144);
  EXPECT_TRUE(l.norm_topk_prob);
  EXPECT_FALSE(l.tie_word_embeddings);
  EXPECT_EQ(l.max_position_embeddings, 40960);
  for (int i = 0; i < 48; ++i) EXPECT_TRUE(l.is_moe_layer(i));
}

// Every fixture satisfies the contracts' sharding constraints (README in fixtures/models).
TEST(HfConfig, FixturesMeetContractConstraints) {
  const int C = find_contract("bf16-sm90tc-v1")->knobs.tp_tree_width;
  for (const char* name : {"qwen3-dense-tiny", "qwen3-moe-tiny", "qwen3-0.6b", "qwen3-30b-a3b"}) {
    SCOPED_TRACE(name);
    const ModelConfig c = fixture(name);
    EXPECT_EQ(c.q_dim() % C, 0);              // o_proj K
    EXPECT_EQ(c.intermediate_size % C, 0);    // dense down_proj K
    EXPECT_EQ(c.vocab_size % C, 0);           // vocabulary-wide reductions
    for (int tp : {1, 2, 4}) EXPECT_EQ(c.num_attention_heads % tp, 0) << tp;
    // The layouts shard whole kv heads: the tiny fixtures run the whole TP matrix.
    if (std::string(name).find("tiny") != std::string::npos) {
      for (int tp : {1, 2, 4}) EXPECT_EQ(c.num_key_value_heads % tp, 0) << tp;
    }
    if (c.is_moe_model()) {
      EXPECT_EQ(c.moe_intermediate_size % C, 0);  // expert down_proj K
      for (int ep : {1, 2, 4}) EXPECT_EQ(c.num_experts % ep, 0) << ep;
    }
  }
}

const char* kDenseV5 = R"({
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 1, "dtype": "bfloat16", "eos_token_id": [2, 3], "head_dim": 32, "hidden_act": "silu",
  "hidden_size": 64, "initializer_range": 0.02, "intermediate_size": 128,
  "layer_types": ["full_attention", "full_attention"], "max_position_embeddings": 4096,
  "max_window_layers": 2, "model_type": "qwen3", "num_attention_heads": 4, "num_hidden_layers": 2,
  "num_key_value_heads": 2, "pad_token_id": null, "rms_norm_eps": 1e-06,
  "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}, "sliding_window": null,
  "tie_word_embeddings": true, "transformers_version": "5.0.0", "use_cache": true,
  "use_sliding_window": false, "vocab_size": 512})";

const char* kMoeLegacy = R"({
  "architectures": ["Qwen3MoeForCausalLM"], "decoder_sparse_step": 2, "head_dim": 32,
  "hidden_size": 64, "intermediate_size": 128, "max_position_embeddings": 4096, "mlp_only_layers": [3],
  "model_type": "qwen3_moe", "moe_intermediate_size": 32, "norm_topk_prob": false,
  "num_attention_heads": 4, "num_experts": 8, "num_experts_per_tok": 2, "num_hidden_layers": 6,
  "num_key_value_heads": 4, "rms_norm_eps": 1e-05, "rope_scaling": null, "rope_theta": 5000,
  "tie_word_embeddings": false, "torch_dtype": "float32", "use_sliding_window": false,
  "sliding_window": 4096, "vocab_size": 256})";

// Replace (or add, or with value "" remove) one top-level field of a JSON text.
std::string with(const std::string& text, const std::string& key, const std::string& value_json) {
  nlohmann::json j = nlohmann::json::parse(text);
  if (value_json.empty()) j.erase(key);
  else j[key] = nlohmann::json::parse(value_json);
  return j.dump();
}

TEST(HfConfig, BothSerialisationsAndHfRules) {
  const ModelConfig d = io::parse_hf_config(kDenseV5, "d.json");
  EXPECT_EQ(d.rope_theta, 10000.0);
  EXPECT_EQ(d.rms_norm_eps, 1e-6);
  // The same config in the legacy form.
  std::string legacy = with(with(kDenseV5, "rope_parameters", ""), "rope_theta", "10000.0");
  legacy = with(with(with(legacy, "rope_scaling", "null"), "dtype", ""), "torch_dtype", "\"bfloat16\"");
  const ModelConfig d2 = io::parse_hf_config(legacy, "d2.json");
  EXPECT_EQ(d2.rope_theta, d.rope_theta);
  EXPECT_EQ(d2.head_dim, d.head_dim);

  const ModelConfig m = io::parse_hf_config(kMoeLegacy, "m.json");
  EXPECT_EQ(m.rope_theta, 5000.0);
  EXPECT_EQ(m.decoder_sparse_step, 2);
  // HF's rule: (i + 1) % step == 0 and not in mlp_only_layers.
  const std::vector<bool> want = {false, true, false, false, false, true};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(m.is_moe_layer(i), want[static_cast<size_t>(i)]) << i;
  ModelConfig none = m;
  none.num_experts = 0;
  for (int i = 0; i < 6; ++i) EXPECT_FALSE(none.is_moe_layer(i));

  // head_dim absent: Qwen3-MoE falls back to hidden/heads; Qwen3 uses its class default 128.
  EXPECT_EQ(io::parse_hf_config(with(kMoeLegacy, "head_dim", ""), "m").head_dim, 16);
  EXPECT_EQ(io::parse_hf_config(with(kDenseV5, "head_dim", ""), "d").head_dim, 128);
  // transformers 5.x's attribute name for num_experts.
  EXPECT_EQ(io::parse_hf_config(with(with(kMoeLegacy, "num_experts", ""), "num_local_experts", "8"), "m").num_experts, 8);
  // Optional with HF defaults.
  const ModelConfig m2 = io::parse_hf_config(with(with(kMoeLegacy, "decoder_sparse_step", ""), "mlp_only_layers", ""), "m");
  EXPECT_EQ(m2.decoder_sparse_step, 1);
  EXPECT_TRUE(m2.mlp_only_layers.empty());
  EXPECT_EQ(io::parse_hf_config(with(kMoeLegacy, "mlp_only_layers", "null"), "m").mlp_only_layers.size(), 0u);
  // Qwen3: num_key_value_heads null means MHA.
  EXPECT_EQ(io::parse_hf_config(with(kDenseV5, "num_key_value_heads", "null"), "d").num_key_value_heads, 4);
}

struct ConfigCase {
  const char* base;
  std::string key, value;  // value "" removes the key
  std::string field, msg_has;
};

TEST(HfConfig, UnsupportedUnknownAndInconsistentAreRefused) {
  const std::vector<ConfigCase> cases = {
      {kDenseV5, "rope_parameters", R"({"rope_type":"yarn","factor":4.0,"rope_theta":10000.0})", "rope_parameters.rope_type", "not supported"},
      {kMoeLegacy, "rope_scaling", R"({"type":"linear","factor":2.0})", "rope_scaling.type", "not supported"},
      {kDenseV5, "rope_parameters", R"({"rope_type":"default","rope_theta":10000.0,"factor":2})", "rope_parameters.factor", "not supported"},
      {kDenseV5, "rope_parameters", R"({"rope_type":"default","rope_theta":10000.0,"partial_rotary_factor":0.5})", "rope_parameters.partial_rotary_factor", "partial"},
      {kDenseV5, "use_sliding_window", "true", "use_sliding_window", "not supported"},
      {kDenseV5, "attention_bias", "true", "attention_bias", "not supported"},
      {kDenseV5, "hidden_act", "\"gelu\"", "hidden_act", "only silu"},
      {kDenseV5, "attention_dropout", "0.1", "attention_dropout", "must be 0"},
      {kDenseV5, "layer_types", R"(["full_attention","sliding_attention"])", "layer_types", "sliding_attention"},
      {kDenseV5, "layer_types", R"(["full_attention"])", "layer_types", "num_hidden_layers"},
      {kDenseV5, "model_type", "\"llama\"", "model_type", "unsupported model_type"},
      {kDenseV5, "architectures", R"(["Qwen3ForSequenceClassification"])", "architectures", "Qwen3ForCausalLM"},
      {kDenseV5, "quantization_config", R"({"quant_method":"fp8"})", "quantization_config", "quantized"},
      {kDenseV5, "fancy_new_knob", "1", "fancy_new_knob", "refuses to guess"},
      {kDenseV5, "num_experts", "8", "num_experts", "belongs to qwen3_moe"},
      {kDenseV5, "hidden_size", "", "hidden_size", "missing"},
      {kDenseV5, "tie_word_embeddings", "", "tie_word_embeddings", "missing"},
      {kDenseV5, "rope_parameters", "", "rope_theta", "missing"},
      {kMoeLegacy, "num_experts", "", "num_experts", "missing"},
      {kMoeLegacy, "norm_topk_prob", "", "norm_topk_prob", "missing"},
      {kDenseV5, "hidden_size", "0", "hidden_size", "at least 1"},
      {kDenseV5, "hidden_size", "64.0", "hidden_size", "integer"},
      {kDenseV5, "hidden_size", "\"64\"", "hidden_size", "integer"},
      {kDenseV5, "hidden_size", "true", "hidden_size", "integer"},
      {kDenseV5, "vocab_size", "99999999999", "vocab_size", "too large"},
      {kDenseV5, "num_key_value_heads", "3", "num_key_value_heads", "does not divide"},
      {kDenseV5, "head_dim", "31", "head_dim", "odd"},
      {kDenseV5, "rms_norm_eps", "0", "rms_norm_eps", "positive"},
      {kDenseV5, "rms_norm_eps", "1e-50", "rms_norm_eps", "fp32"},
      {kDenseV5, "tie_word_embeddings", "1", "tie_word_embeddings", "true or false"},
      {kDenseV5, "rope_theta", "20000.0", "rope_parameters.rope_theta", "disagrees"},
      {kMoeLegacy, "num_experts_per_tok", "9", "num_experts_per_tok", "exceeds"},
      {kMoeLegacy, "decoder_sparse_step", "0", "decoder_sparse_step", "at least 1"},
      {kMoeLegacy, "mlp_only_layers", "[6]", "mlp_only_layers", "too large"},
      {kMoeLegacy, "mlp_only_layers", "[1,1]", "mlp_only_layers", "twice"},
      {kMoeLegacy, "num_local_experts", "16", "num_local_experts", "disagrees"},
      {kMoeLegacy, "num_key_value_heads", "null", "num_key_value_heads", "integer"},
      {kDenseV5, "bos_token_id", "\"<s>\"", "bos_token_id", "integer"},
      {kDenseV5, "initializer_range", "\"x\"", "initializer_range", "number"},
  };
  for (const ConfigCase& c : cases) {
    SCOPED_TRACE(c.key + " = " + c.value);
    const std::string text = with(c.base, c.key, c.value);
    const BadInput e = expect_bad([&] { (void)io::parse_hf_config(text, "cfg/config.json"); });
    EXPECT_EQ(e.file(), "cfg/config.json");
    EXPECT_EQ(e.field(), c.field);
    EXPECT_TRUE(has(e.message(), c.msg_has)) << e.what();
  }
  // Unknown fields pass with the explicit escape; unsupported values never do.
  EXPECT_NO_THROW(io::parse_hf_config(with(kDenseV5, "fancy_new_knob", "1"), "c", /*allow_unknown_fields=*/true));
  EXPECT_THROW(io::parse_hf_config(with(kDenseV5, "attention_bias", "true"), "c", true), BadInput);

  // Malformed JSON.
  EXPECT_TRUE(has(expect_bad([] { (void)io::parse_hf_config("{\"hidden_size\": 64,", "c"); }).message(), "not valid JSON"));
  EXPECT_TRUE(has(expect_bad([] { (void)io::parse_hf_config("[]", "c"); }).message(), "not an object"));
  const BadInput dup = expect_bad([] { (void)io::parse_hf_config(R"({"hidden_size": 64, "hidden_size": 32})", "c"); });
  EXPECT_EQ(dup.field(), "hidden_size");
  EXPECT_TRUE(has(dup.message(), "duplicate"));
  EXPECT_EQ(expect_bad([] { (void)io::load_hf_config("/nonexistent/dir/config.json"); }).message(), "no such file");
}

// ============================================================================
// weights: specs, generation, checkpoints
// ============================================================================

// parameter_count is what the specs add up to, and moe_layer_count the layers
// is_moe_layer names, for every fixture and Hugging Face checkpoint (dense, MoE,
// tied, untied, mlp_only_layers, sparse steps).
TEST(Weights, ParameterCountIsTheSpecsSum) {
  std::vector<std::string> configs;
  for (const char* name : {"qwen3-dense-tiny", "qwen3-moe-tiny", "qwen3-0.6b", "qwen3-30b-a3b"})
    configs.push_back(test::source_path(std::string("fixtures/models/") + name + "/config.json"));
  for (const auto& e : fs::directory_iterator(test::source_path("fixtures/hf")))
    if (e.is_directory()) configs.push_back(e.path().string() + "/config.json");
  ASSERT_GT(configs.size(), 8u);
  for (const std::string& path : configs) {
    SCOPED_TRACE(path);
    const ModelConfig c = io::load_hf_config(path);
    double sum = 0;
    for (const WeightSpec& w : weight_specs(c)) {
      double n = 1;
      for (const int64_t d : w.shape) n *= static_cast<double>(d);
      sum += n;
    }
    EXPECT_EQ(parameter_count(c), sum);
    int64_t moe = 0;
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) moe += c.is_moe_layer(i);
    EXPECT_EQ(c.moe_layer_count(), moe);
  }
}

TEST(Weights, SpecsHaveHuggingFaceNamesAndShapes) {
  const ModelConfig m = fixture("qwen3-moe-tiny");
  const std::vector<WeightSpec> s = weight_specs(m);
  std::map<std::string, std::vector<int64_t>> by;
  for (const WeightSpec& w : s) EXPECT_TRUE(by.emplace(w.name, w.shape).second) << w.name;
  // embed + 4 layers x (4 proj + 2 qk norms + 2 layer norms) + dense MLP (3) + 3 MoE layers x (router + 8x3) + norm + lm_head
  EXPECT_EQ(s.size(), 1u + 4 * 8 + 3 + 3 * (1 + 24) + 1 + 1);
  EXPECT_EQ(by.at("model.embed_tokens.weight"), (std::vector<int64_t>{512, 64}));
  EXPECT_EQ(by.at("model.layers.0.self_attn.q_proj.weight"), (std::vector<int64_t>{256, 64}));
  EXPECT_EQ(by.at("model.layers.0.self_attn.k_proj.weight"), (std::vector<int64_t>{128, 64}));
  EXPECT_EQ(by.at("model.layers.0.self_attn.o_proj.weight"), (std::vector<int64_t>{64, 256}));
  EXPECT_EQ(by.at("model.layers.0.self_attn.q_norm.weight"), (std::vector<int64_t>{32}));
  EXPECT_EQ(by.at("model.layers.0.mlp.down_proj.weight"), (std::vector<int64_t>{64, 128}));
  EXPECT_EQ(by.count("model.layers.0.mlp.gate.weight"), 0u);
  EXPECT_EQ(by.at("model.layers.1.mlp.gate.weight"), (std::vector<int64_t>{8, 64}));
  EXPECT_EQ(by.at("model.layers.3.mlp.experts.7.up_proj.weight"), (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(by.at("model.layers.3.mlp.experts.7.down_proj.weight"), (std::vector<int64_t>{64, 32}));
  EXPECT_EQ(by.count("model.layers.1.mlp.gate_proj.weight"), 0u);
  EXPECT_EQ(by.at("lm_head.weight"), (std::vector<int64_t>{512, 64}));
  EXPECT_EQ(by.count("lm_head.weight"), 1u);

  const std::vector<WeightSpec> d = weight_specs(fixture("qwen3-dense-tiny"));
  EXPECT_EQ(d.size(), 1u + 3 * 11 + 1);  // tied: no lm_head
  for (const WeightSpec& w : d) EXPECT_NE(w.name, "lm_head.weight");
}

TEST(Weights, GenerationIsDefinedGoldenAndThreadIndependent) {
  const ModelConfig m = fixture("qwen3-moe-tiny");
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const Weights w1 = generate_weights(m, 1234);
  omp_set_num_threads(3);
  const Weights w3 = generate_weights(m, 1234);
  omp_set_num_threads(saved);
  ASSERT_EQ(w1.size(), w3.size());
  for (const auto& [name, t] : w1.all()) {
    const Tensor& u = w3.at(name);
    ASSERT_EQ(t.shape, u.shape) << name;
    EXPECT_EQ(std::memcmp(t.data.data(), u.data.data(), t.data.size() * 2), 0) << name;
  }
  // One tensor alone has the same bits as inside the whole model.
  for (const WeightSpec& s : weight_specs(m))
    if (s.name == "model.layers.2.mlp.experts.5.down_proj.weight") {
      EXPECT_EQ(test::digest(generate_tensor(s, 1234).data), test::digest(w1.at(s.name).data));
    }

  // Ranges by kind.
  for (const WeightSpec& s : weight_specs(m)) {
    const Tensor& t = w1.at(s.name);
    float lo = 1e9f, hi = -1e9f;
    for (bf16 x : t.data) {
      lo = std::min(lo, widen(x));
      hi = std::max(hi, widen(x));
    }
    if (s.kind == WeightKind::Norm) {
      EXPECT_GE(lo, 0.875f) << s.name;
      EXPECT_LE(hi, 1.125f) << s.name;
    } else if (s.kind == WeightKind::Embedding) {
      EXPECT_GE(lo, -1.0f);
      EXPECT_LE(hi, 1.0f);
    } else {
      const float a = 1.0f / std::sqrt(static_cast<float>(s.shape[1]));
      EXPECT_LE(std::max(-lo, hi), through_bf16(a)) << s.name;
    }
  }
  // Different seeds, different names: different bits.
  EXPECT_NE(test::digest(generate_weights(m, 1235).at("model.norm.weight").data), test::digest(w1.at("model.norm.weight").data));
  EXPECT_NE(weight_tensor_seed(1234, "a"), weight_tensor_seed(1234, "b"));

  for (const char* name : {"model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
                           "model.layers.0.input_layernorm.weight", "model.layers.1.mlp.gate.weight",
                           "model.layers.3.mlp.experts.7.down_proj.weight", "lm_head.weight", "model.norm.weight"})
    test::expect_golden("weights.txt", std::string("qwen3-moe-tiny/1234/") + name, test::digest(w1.at(name).data));
  const Weights dense = generate_weights(fixture("qwen3-dense-tiny"), 7);
  test::expect_golden("weights.txt", "qwen3-dense-tiny/7/model.embed_tokens.weight",
                      test::digest(dense.at("model.embed_tokens.weight").data));
  test::expect_golden("weights.txt", "qwen3-dense-tiny/7/model.layers.2.mlp.down_proj.weight",
                      test::digest(dense.at("model.layers.2.mlp.down_proj.weight").data));
  // 0.6B shapes: one tensor (2M elements: generated in parallel), alone, with 1 and 3 threads.
  for (const WeightSpec& s : weight_specs(fixture("qwen3-0.6b")))
    if (s.name == "model.layers.27.self_attn.o_proj.weight") {
      omp_set_num_threads(1);
      const std::string one = test::digest(generate_tensor(s, 0).data);
      omp_set_num_threads(3);
      const std::string three = test::digest(generate_tensor(s, 0).data);
      omp_set_num_threads(saved);
      EXPECT_EQ(one, three);
      test::expect_golden("weights.txt", "qwen3-0.6b/0/" + s.name, three);
    }
}

TEST(SafetensorsRead, LargeConversionsAreThreadIndependent) {
  const std::vector<float> f = random_f32(200000, 77, 1e3f);
  std::vector<uint16_t> h(f.size());
  for (size_t i = 0; i < h.size(); ++i) h[i] = static_cast<uint16_t>(counter_hash(78, i));  // every F16 bit pattern class
  const std::string file = raw_safetensors({{"f", "F32", "[200000]", bytes_of(f)}, {"h", "F16", "[200000]", bytes_of(h)}});
  const auto st = io::SafetensorsFile::from_buffer(std::vector<uint8_t>(file.begin(), file.end()), "big");
  const int saved = omp_get_max_threads();
  for (int threads : {1, 3}) {
    omp_set_num_threads(threads);
    const std::vector<bf16> a = st.read_bf16(st.at("f"));
    const std::vector<bf16> b = st.read_bf16(st.at("h"));
    for (size_t i = 0; i < f.size(); ++i) {
      ASSERT_EQ(a[i].bits, round_bf16(f[i]).bits) << i;
      ASSERT_EQ(b[i].bits, round_bf16(io::f16_to_f32(h[i])).bits) << i;
    }
  }
  omp_set_num_threads(saved);
  // f16_to_f32 is exact: every finite half converts back by the hardware-independent rule.
  for (uint32_t x = 0; x < 0x10000; ++x) {
    const float v = io::f16_to_f32(static_cast<uint16_t>(x));
    const uint32_t e = (x >> 10) & 0x1f, m = x & 0x3ff;
    if (e == 31) {
      ASSERT_TRUE(m ? std::isnan(v) : std::isinf(v)) << x;
      continue;
    }
    const double want = (e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, static_cast<int>(e) - 25)) * ((x & 0x8000) ? -1 : 1);
    ASSERT_EQ(static_cast<double>(v), want) << x;
    ASSERT_EQ(std::signbit(v), (x & 0x8000) != 0) << x;
  }
}

void expect_same_weights(const Weights& a, const Weights& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a.all()) {
    ASSERT_TRUE(b.contains(name)) << name;
    const Tensor& u = b.at(name);
    EXPECT_EQ(t.shape, u.shape) << name;
    ASSERT_EQ(t.data.size(), u.data.size()) << name;
    EXPECT_EQ(std::memcmp(t.data.data(), u.data.data(), t.data.size() * 2), 0) << name;
  }
}

// Independent writer: a sharded checkpoint, tensors assigned round-robin to shards,
// the index written by hand. `as_f32` stores every weight as F32 (exact widening).
void write_sharded_independently(const TempDir& d, const ModelConfig& cfg, const Weights& w, int shards, bool as_f32,
                                 const std::function<void(std::vector<std::vector<RawTensor>>&)>& edit = {}) {
  std::vector<std::vector<RawTensor>> files(static_cast<size_t>(shards));
  int k = 0;
  for (const WeightSpec& s : weight_specs(cfg)) {
    const Tensor& t = w.at(s.name);
    RawTensor r{s.name, as_f32 ? "F32" : "BF16", shape_json(t.shape), ""};
    if (as_f32) {
      std::vector<float> f(t.data.size());
      for (size_t i = 0; i < f.size(); ++i) f[i] = widen(t.data[i]);
      r.data = bytes_of(f);
    } else {
      r.data = bytes_of(t.data);
    }
    files[static_cast<size_t>(k++ % shards)].push_back(std::move(r));
  }
  if (edit) edit(files);
  std::string index = "{\n  \"metadata\": {\"total_size\": 0},\n  \"weight_map\": {";
  bool first = true;
  for (int s = 0; s < shards; ++s) {
    const std::string fname = "model-0000" + std::to_string(s + 1) + "-of-0000" + std::to_string(shards) + ".safetensors";
    d.write(fname, raw_safetensors(files[static_cast<size_t>(s)], R"({"format":"pt"})"));
    for (const RawTensor& r : files[static_cast<size_t>(s)]) {
      index += std::string(first ? "" : ",") + "\n    \"" + r.name + "\": \"" + fname + "\"";
      first = false;
    }
  }
  d.write("model.safetensors.index.json", index + "\n  }\n}\n");
}

TEST(Checkpoint, ShardedIndependentlyWrittenLoadsExactly) {
  for (const char* name : {"qwen3-dense-tiny", "qwen3-moe-tiny"}) {
    SCOPED_TRACE(name);
    const ModelConfig cfg = fixture(name);
    const Weights w = generate_weights(cfg, 99);
    for (bool as_f32 : {false, true}) {
      TempDir d;
      write_sharded_independently(d, cfg, w, 3, as_f32);
      expect_same_weights(w, io::load_weights(d.str(), cfg));
      EXPECT_EQ(io::Checkpoint::open(d.str()).num_files(), 3u);
      // The index path itself works too.
      expect_same_weights(w, io::load_weights(d.file("model.safetensors.index.json"), cfg));
    }
  }
}

TEST(Checkpoint, FusedExpertsIndependentlyWritten) {
  // transformers 5.x's in-memory layout: gate_up_proj [E][2I][H] (gate rows first), down_proj [E][H][I].
  const ModelConfig cfg = fixture("qwen3-moe-tiny");
  const Weights w = generate_weights(cfg, 5);
  TempDir d;
  std::vector<RawTensor> ts;
  for (const WeightSpec& s : weight_specs(cfg)) {
    if (s.name.find(".mlp.experts.") != std::string::npos) continue;
    ts.push_back({s.name, "BF16", shape_json(s.shape), bytes_of(w.at(s.name).data)});
  }
  const int64_t E = cfg.num_experts, I = cfg.moe_intermediate_size, H = cfg.hidden_size;
  for (int64_t i = 0; i < cfg.num_hidden_layers; ++i) {
    if (!cfg.is_moe_layer(i)) continue;
    const std::string p = "model.layers." + std::to_string(i) + ".mlp.experts.";
    std::string gu, dn;
    for (int64_t e = 0; e < E; ++e) {
      gu += bytes_of(w.at(p + std::to_string(e) + ".gate_proj.weight").data);
      gu += bytes_of(w.at(p + std::to_string(e) + ".up_proj.weight").data);
      dn += bytes_of(w.at(p + std::to_string(e) + ".down_proj.weight").data);
    }
    ts.push_back({p + "gate_up_proj", "BF16", shape_json({E, 2 * I, H}), gu});
    ts.push_back({p + "down_proj", "BF16", shape_json({E, H, I}), dn});
  }
  d.write("model.safetensors", raw_safetensors(ts));
  expect_same_weights(w, io::load_weights(d.str(), cfg));

  // Both layouts in one layer: refused.
  ts.push_back({"model.layers.1.mlp.experts.0.up_proj.weight", "BF16", shape_json({I, H}),
                bytes_of(w.at("model.layers.1.mlp.experts.0.up_proj.weight").data)});
  d.write("model.safetensors", raw_safetensors(ts));
  const BadInput e = expect_bad([&] { (void)io::load_weights(d.str(), cfg); });
  EXPECT_EQ(e.field(), "model.layers.1.mlp.experts.0.up_proj.weight");
  EXPECT_TRUE(has(e.message(), "both fused"));
}

TEST(Checkpoint, OwnWriterRoundTrips) {
  for (const char* name : {"qwen3-dense-tiny", "qwen3-moe-tiny"}) {
    const ModelConfig cfg = fixture(name);
    const Weights w = generate_weights(cfg, 3);
    for (int shards : {1, 2, 3})
      for (bool fused : {false, true}) {
        SCOPED_TRACE(std::string(name) + " shards " + std::to_string(shards) + (fused ? " fused" : ""));
        TempDir d;
        io::save_weights(d.str(), w, cfg, {shards, fused});
        EXPECT_EQ(fs::exists(d.file("model.safetensors.index.json")), shards > 1);
        const io::Checkpoint ck = io::Checkpoint::open(d.str());
        EXPECT_EQ(ck.find("lm_head.weight") != nullptr, !cfg.tie_word_embeddings);
        EXPECT_EQ(ck.find("model.layers.1.mlp.experts.gate_up_proj") != nullptr, fused && cfg.is_moe_model());
        expect_same_weights(w, io::load_weights(d.str(), cfg));
      }
  }
}

// A load tells its progress: the parameters' stored bytes as they are read (all of
// them at the end), then the files' as they are hashed; and it reads no value before
// every shape has been checked (a wrong shape in the last tensor reports no progress).
TEST(Checkpoint, LoadProgressAndChecksBeforeReading) {
  const ModelConfig cfg = fixture("qwen3-moe-tiny");
  const Weights w = generate_weights(cfg, 5);
  TempDir d;
  io::save_weights(d.str(), w, cfg, {3, false});
  std::vector<io::LoadProgress> seen;
  io::LoadOptions opt;
  opt.progress = [&](const io::LoadProgress& p) { seen.push_back(p); };
  io::LoadNotes notes;  // asks for the files' digests
  expect_same_weights(w, io::load_weights(d.str(), cfg, opt, &notes));
  EXPECT_EQ(notes.files.size(), 4u);  // the index and 3 shards
  uint64_t param_bytes = 0, file_bytes = 0;
  for (const WeightSpec& s : weight_specs(cfg)) param_bytes += 2 * static_cast<uint64_t>(s.numel());
  for (const auto& e : fs::directory_iterator(d.str()))
    if (e.path().extension() == ".safetensors") file_bytes += fs::file_size(e.path());
  size_t reading = 0, hashing = 0;
  uint64_t last = 0;
  for (const io::LoadProgress& p : seen) {
    const bool read = std::string(p.stage) == "reading";
    EXPECT_TRUE(read || std::string(p.stage) == "hashing") << p.stage;
    EXPECT_EQ(p.total_bytes, read ? param_bytes : file_bytes);
    if (read) EXPECT_EQ(hashing, 0u) << "hashing comes after reading";
    EXPECT_GT(p.done_bytes, (read ? reading : hashing) ? last : 0u) << "progress only grows";
    last = p.done_bytes;
    ++(read ? reading : hashing);
  }
  EXPECT_EQ(reading, weight_specs(cfg).size());
  EXPECT_EQ(hashing, 3u);
  EXPECT_EQ(seen.back().done_bytes, file_bytes);

  seen.clear();
  TempDir bad;
  // The parameter read last (in name order): without the checks first, all others would be read before it.
  const std::vector<WeightSpec> specs = weight_specs(cfg);
  const WeightSpec last_spec = *std::max_element(specs.begin(), specs.end(),
                                                 [](const WeightSpec& a, const WeightSpec& b) { return a.name < b.name; });
  const std::string last_name = last_spec.name;
  write_sharded_independently(bad, cfg, w, 2, false, [&](std::vector<std::vector<RawTensor>>& f) {
    for (auto& s : f)
      for (auto& r : s)
        if (r.name == last_name) r.shape = "[1," + std::to_string(last_spec.numel()) + "]";  // same size, wrong shape
  });
  EXPECT_EQ(expect_bad([&] { (void)io::load_weights(bad.str(), cfg, opt); }).field(), last_name);
  EXPECT_TRUE(seen.empty()) << seen.size() << " progress reports before the shape was refused";
}

TEST(Checkpoint, BadCheckpointsNameTheTensor) {
  const ModelConfig cfg = fixture("qwen3-dense-tiny");
  const ModelConfig moe = fixture("qwen3-moe-tiny");
  const Weights w = generate_weights(cfg, 11);
  const std::string q = "model.layers.1.self_attn.q_proj.weight";
  auto drop = [&](const std::string& n) {
    return [n](std::vector<std::vector<RawTensor>>& f) {
      for (auto& s : f) std::erase_if(s, [&](const RawTensor& r) { return r.name == n; });
    };
  };
  auto edit_tensor = [&](const std::string& n, std::function<void(RawTensor&)> fn) {
    return [n, fn](std::vector<std::vector<RawTensor>>& f) {
      for (auto& s : f)
        for (auto& r : s)
          if (r.name == n) fn(r);
    };
  };
  {  // missing tensor (absent from the shard and the index)
    TempDir d;
    write_sharded_independently(d, cfg, w, 2, false, drop(q));
    const BadInput e = expect_bad([&] { (void)io::load_weights(d.str(), cfg); });
    EXPECT_EQ(e.field(), q);
    EXPECT_EQ(e.file(), d.file("model.safetensors.index.json"));
    EXPECT_TRUE(has(e.message(), "missing")) << e.what();
  }
  {  // wrong shape
    TempDir d;
    write_sharded_independently(d, cfg, w, 2, false, edit_tensor(q, [](RawTensor& r) { r.shape = "[64,256]"; }));
    const BadInput e = expect_bad([&] { (void)io::load_weights(d.str(), cfg); });
    EXPECT_EQ(e.field(), q);
    EXPECT_TRUE(has(e.file(), ".safetensors"));
    EXPECT_TRUE(has(e.message(), "wrong shape [64, 256]")) << e.what();
    EXPECT_TRUE(has(e.message(), "[256, 64]")) << e.what();
  }
  {  // wrong dtype (I32 for a weight)
    TempDir d;
    write_sharded_independently(d, cfg, w, 2, false, edit_tensor(q, [](RawTensor& r) {
                                  r.dtype = "I16";  // same byte size as BF16: a valid file, a wrong weight
                                }));
    const BadInput e = expect_bad([&] { (void)io::load_weights(d.str(), cfg); });
    EXPECT_EQ(e.field(), q);
    EXPECT_TRUE(has(e.message(), "wrong dtype I16")) << e.what();
    TempDir d2;
    write_sharded_independently(d2, cfg, w, 1, false, edit_tensor(q, [](RawTensor& r) {
                                  r.dtype = "I32";
                                  r.shape = "[64,64]";
                                }));
    EXPECT_TRUE(has(expect_bad([&] { (void)io::load_weights(d2.str(), cfg); }).message(), "I32"));
  }
  {  // unexpected extra tensor
    TempDir d;
    write_sharded_independently(d, cfg, w, 2, false, [](std::vector<std::vector<RawTensor>>& f) {
      f[1].push_back({"model.layers.9.mlp.up_proj.weight", "BF16", "[1]", std::string(2, '\0')});
    });
    const BadInput e = expect_bad([&] { (void)io::load_weights(d.str(), cfg); });
    EXPECT_EQ(e.field(), "model.layers.9.mlp.up_proj.weight");
    EXPECT_TRUE(has(e.message(), "unexpected")) << e.what();
  }
  {  // a checkpoint of another config: missing and extra, missing reported first
    TempDir d;
    io::save_weights(d.str(), generate_weights(moe, 1), moe);
    const BadInput e = expect_bad([&] { (void)io::load_weights(d.str(), cfg); });
    EXPECT_TRUE(has(e.message(), "missing")) << e.what();
  }
  {  // tied: a stored lm_head equal to the embedding is accepted, a different one refused
    TempDir d;
    write_sharded_independently(d, cfg, w, 2, false, [&](std::vector<std::vector<RawTensor>>& f) {
      f[0].push_back({"lm_head.weight", "BF16", "[512,64]", bytes_of(w.at("model.embed_tokens.weight").data)});
    });
    expect_same_weights(w, io::load_weights(d.str(), cfg));
    TempDir d2;
    write_sharded_independently(d2, cfg, w, 2, false, [&](std::vector<std::vector<RawTensor>>& f) {
      std::vector<bf16> other = w.at("model.embed_tokens.weight").data;
      other[77].bits ^= 1;
      f[0].push_back({"lm_head.weight", "BF16", "[512,64]", bytes_of(other)});
    });
    const BadInput e = expect_bad([&] { (void)io::load_weights(d2.str(), cfg); });
    EXPECT_EQ(e.field(), "lm_head.weight");
    EXPECT_TRUE(has(e.message(), "tie_word_embeddings")) << e.what();
  }
  {  // untied MoE without lm_head: missing
    TempDir d;
    const Weights wm = generate_weights(moe, 1);
    io::save_weights(d.str(), wm, moe);
    std::vector<RawTensor> ts;
    const io::SafetensorsFile f = io::SafetensorsFile::open(d.file("model.safetensors"));
    for (const io::TensorInfo& t : f.tensors())
      if (t.name != "lm_head.weight")
        ts.push_back({t.name, "BF16", shape_json(std::vector<int64_t>(t.shape.begin(), t.shape.end())),
                      std::string(reinterpret_cast<const char*>(f.bytes(t).data()), f.bytes(t).size())});
    d.write("model.safetensors", raw_safetensors(ts));
    EXPECT_EQ(expect_bad([&] { (void)io::load_weights(d.str(), moe); }).field(), "lm_head.weight");
  }
}

TEST(Checkpoint, BadIndexes) {
  const ModelConfig cfg = fixture("qwen3-dense-tiny");
  const Weights w = generate_weights(cfg, 2);
  TempDir d;
  io::save_weights(d.str(), w, cfg, {2, false});
  const std::string index_path = d.file("model.safetensors.index.json");
  const nlohmann::json good = nlohmann::json::parse(read_all(index_path));
  const std::string shard1 = "model-00001-of-00002.safetensors";
  auto expect_index_bad = [&](const nlohmann::json& j, const std::string& field, const std::string& msg,
                              const std::string& file = "") {
    d.write("model.safetensors.index.json", j.dump());
    const BadInput e = expect_bad([&] { (void)io::Checkpoint::open(d.str()); });
    EXPECT_EQ(e.field(), field) << e.what();
    EXPECT_EQ(e.file(), file.empty() ? index_path : file);
    EXPECT_TRUE(has(e.message(), msg)) << e.what();
  };
  {  // tensor listed but not in its shard
    nlohmann::json j = good;
    j["weight_map"]["model.layers.7.mlp.up_proj.weight"] = shard1;
    expect_index_bad(j, "model.layers.7.mlp.up_proj.weight", "missing from their shard");
  }
  {  // tensor in a shard but not listed
    nlohmann::json j = good;
    j["weight_map"].erase("model.norm.weight");
    const std::string where = good["weight_map"]["model.norm.weight"];
    expect_index_bad(j, "model.norm.weight", "not listed", d.file(where));
  }
  {  // listed under the wrong shard
    nlohmann::json j = good;
    const std::string where = good["weight_map"]["model.embed_tokens.weight"];
    j["weight_map"]["model.embed_tokens.weight"] = where == shard1 ? "model-00002-of-00002.safetensors" : shard1;
    expect_index_bad(j, "model.embed_tokens.weight", "missing from their shard");
  }
  {  // shard file absent, path traversal, wrong types, unknown key
    nlohmann::json j = good;
    j["weight_map"]["model.norm.weight"] = "model-00003-of-00003.safetensors";
    expect_index_bad(j, "weight_map.model.norm.weight", "does not exist");
    j = good;
    j["weight_map"]["model.norm.weight"] = "../model.safetensors";
    expect_index_bad(j, "weight_map.model.norm.weight", "plain file name");
    j = good;
    j["weight_map"]["model.norm.weight"] = 3;
    expect_index_bad(j, "weight_map.model.norm.weight", "not a string");
    j = good;
    j["weight_map"] = nlohmann::json::array();
    expect_index_bad(j, "weight_map", "not an object");
    j = good;
    j.erase("weight_map");
    expect_index_bad(j, "weight_map", "missing");
    j = good;
    j["shards"] = 2;
    expect_index_bad(j, "shards", "unknown key");
  }
  {  // not JSON, duplicate keys
    d.write("model.safetensors.index.json", "{\"weight_map\": {");
    EXPECT_TRUE(has(expect_bad([&] { (void)io::Checkpoint::open(d.str()); }).message(), "not valid JSON"));
    d.write("model.safetensors.index.json",
            R"({"weight_map": {"model.norm.weight": "a.safetensors", "model.norm.weight": "b.safetensors"}})");
    const BadInput e = expect_bad([&] { (void)io::Checkpoint::open(d.str()); });
    EXPECT_EQ(e.field(), "weight_map.model.norm.weight");
    EXPECT_TRUE(has(e.message(), "duplicate"));
  }
  {  // a corrupt shard names the shard
    d.write("model.safetensors.index.json", good.dump());
    std::string bytes = read_all(d.file(shard1));
    d.write(shard1, bytes.substr(0, bytes.size() - 3));
    const BadInput e = expect_bad([&] { (void)io::Checkpoint::open(d.str()); });
    EXPECT_EQ(e.file(), d.file(shard1));
  }
  {  // both layouts in one directory; nothing at all
    TempDir e;
    io::save_weights(e.str(), w, cfg, {2, false});
    io::save_weights(e.str(), w, cfg, {1, false});
    EXPECT_TRUE(has(expect_bad([&] { (void)io::Checkpoint::open(e.str()); }).message(), "both"));
    TempDir empty;
    EXPECT_TRUE(has(expect_bad([&] { (void)io::Checkpoint::open(empty.str()); }).message(), "no model.safetensors"));
  }
}

}  // namespace
}  // namespace bp
