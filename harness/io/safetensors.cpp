#include "harness/io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "harness/io/files.h"
#include "harness/io/json_strict.h"

static_assert(std::endian::native == std::endian::little,
              "bitparity's safetensors I/O assumes a little-endian host");

namespace bp::io {

using nlohmann::json;

namespace {

struct DTypeRow {
  DType d;
  const char* name;
  size_t size;
};
constexpr DTypeRow kDTypes[] = {
    {DType::BOOL, "BOOL", 1},       {DType::U8, "U8", 1},           {DType::I8, "I8", 1},
    {DType::U16, "U16", 2},         {DType::I16, "I16", 2},         {DType::F16, "F16", 2},
    {DType::BF16, "BF16", 2},       {DType::U32, "U32", 4},         {DType::I32, "I32", 4},
    {DType::F32, "F32", 4},         {DType::U64, "U64", 8},         {DType::I64, "I64", 8},
    {DType::F64, "F64", 8},         {DType::F8_E4M3, "F8_E4M3", 1}, {DType::F8_E5M2, "F8_E5M2", 1},
    {DType::F8_E8M0, "F8_E8M0", 1},
};

std::string u64s(uint64_t v) { return std::to_string(v); }

// Small tensors convert serially (thread start-up costs more than the work).
constexpr int64_t kParallelMin = int64_t{1} << 16;

// Messages stay one short line even for a hostile header.
std::string cut(std::string s, size_t n = 80) {
  if (s.size() > n) s = s.substr(0, n - 3) + "...";
  return s;
}


uint64_t read_le64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

bool mul_overflows(uint64_t a, uint64_t b, uint64_t* out) { return __builtin_mul_overflow(a, b, out); }

// A JSON value that must be a non-negative integer; `what` names it in messages.
uint64_t want_u64(const json& v, const std::string& path, const std::string& field, const char* what) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer()) throw BadInput(path, field, std::string(what) + " is negative (" + cut(v.dump()) + ")");
  if (v.is_number_float())
    throw BadInput(path, field, std::string(what) + " is not an integer (" + cut(v.dump()) + "; too large, or has a fraction)");
  throw BadInput(path, field, std::string(what) + " is " + json_type_word(v) + ", not an integer");
}

}  // namespace

const char* dtype_name(DType d) {
  for (const auto& r : kDTypes)
    if (r.d == d) return r.name;
  return "?";
}
size_t dtype_size(DType d) {
  for (const auto& r : kDTypes)
    if (r.d == d) return r.size;
  return 0;
}
bool dtype_from_name(std::string_view s, DType* out) {
  for (const auto& r : kDTypes)
    if (s == r.name) {
      *out = r.d;
      return true;
    }
  return false;
}

uint64_t TensorInfo::numel() const {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;  // validated not to overflow by the parser
  return n;
}

const TensorInfo* SafetensorsHeader::find(std::string_view name) const {
  auto it = std::lower_bound(tensors.begin(), tensors.end(), name,
                             [](const TensorInfo& t, std::string_view n) { return t.name < n; });
  return (it != tensors.end() && it->name == name) ? &*it : nullptr;
}

SafetensorsHeader parse_safetensors(const uint8_t* data, size_t size, std::string_view path_sv) {
  const std::string path(path_sv);
  if (data == nullptr && size != 0) throw std::invalid_argument("parse_safetensors: null data");
  if (size < 8)
    throw BadInput(path, "", "file is " + u64s(size) +
                                 " bytes; a safetensors file starts with an 8-byte header length");
  const uint64_t n = read_le64(data);
  if (n > kMaxHeaderBytes)
    throw BadInput(path, "header length",
                   "header length " + u64s(n) + " exceeds the " + u64s(kMaxHeaderBytes) +
                       "-byte limit (corrupt, or not a safetensors file)");
  if (n > size - 8)
    throw BadInput(path, "header length",
                   "header length " + u64s(n) + " goes past the end of the file (" + u64s(size) + " bytes)");
  if (n < 2) throw BadInput(path, "header length", "header length " + u64s(n) + " cannot hold a JSON object");
  if (data[8] != '{')
    throw BadInput(path, "header", "the JSON header does not start with '{' (not a safetensors file?)");
  const std::string_view text(reinterpret_cast<const char*>(data + 8), static_cast<size_t>(n));
  const json h = parse_json_strict(text, path, /*max_depth=*/8);
  if (!h.is_object()) throw BadInput(path, "header", std::string("the JSON header is ") + json_type_word(h) + ", not an object");

  SafetensorsHeader out;
  out.data_start = 8 + n;
  const uint64_t buffer = size - 8 - n;

  for (auto it = h.begin(); it != h.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object())
        throw BadInput(path, "__metadata__", std::string("is ") + json_type_word(v) + ", not an object of strings");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string())
          throw BadInput(path, "__metadata__." + m.key(),
                         std::string("metadata value is ") + json_type_word(m.value()) + ", not a string");
        out.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    if (name.empty()) throw BadInput(path, "\"\"", "a tensor has an empty name");
    if (!v.is_object())
      throw BadInput(path, name, std::string("tensor entry is ") + json_type_word(v) + ", not an object");
    for (auto k = v.begin(); k != v.end(); ++k)
      if (k.key() != "dtype" && k.key() != "shape" && k.key() != "data_offsets")
        throw BadInput(path, name, "unknown key \"" + k.key() + "\" in tensor entry (expected dtype, shape, data_offsets)");
    for (const char* req : {"dtype", "shape", "data_offsets"})
      if (!v.contains(req)) throw BadInput(path, name, std::string("tensor entry has no \"") + req + "\"");

    TensorInfo t;
    t.name = name;
    const json& dt = v["dtype"];
    if (!dt.is_string()) throw BadInput(path, name, std::string("dtype is ") + json_type_word(dt) + ", not a string");
    const std::string dts = dt.get<std::string>();
    if (!dtype_from_name(dts, &t.dtype)) {
      if (dts == "F4" || dts.rfind("F6_", 0) == 0)
        throw BadInput(path, name, "dtype \"" + dts + "\" (sub-byte) is not supported by bitparity");
      throw BadInput(path, name, "unknown dtype \"" + dts + "\"");
    }
    const json& sh = v["shape"];
    if (!sh.is_array()) throw BadInput(path, name, std::string("shape is ") + json_type_word(sh) + ", not a list of integers");
    uint64_t numel = 1;
    for (const json& d : sh) {
      const uint64_t dim = want_u64(d, path, name, "a shape dimension");
      t.shape.push_back(dim);
      if (mul_overflows(numel, dim, &numel))
        throw BadInput(path, name, "shape " + cut(sh.dump()) + " has more elements than 64 bits can count");
    }
    uint64_t nbytes = 0;
    if (mul_overflows(numel, dtype_size(t.dtype), &nbytes))
      throw BadInput(path, name, "shape " + cut(sh.dump()) + " is too large for 64-bit byte offsets");
    const json& off = v["data_offsets"];
    if (!off.is_array() || off.size() != 2)
      throw BadInput(path, name, "data_offsets must be a list of two integers [begin, end], got " + cut(off.dump()));
    t.begin = want_u64(off[0], path, name, "data_offsets begin");
    t.end = want_u64(off[1], path, name, "data_offsets end");
    if (t.begin > t.end)
      throw BadInput(path, name, "data_offsets begin " + u64s(t.begin) + " > end " + u64s(t.end));
    if (t.end > buffer)
      throw BadInput(path, name,
                     "data_offsets end " + u64s(t.end) + " is past the end of the data buffer (" + u64s(buffer) +
                         " bytes after the header; truncated file?)");
    if (t.end - t.begin != nbytes)
      throw BadInput(path, name,
                     "data_offsets [" + u64s(t.begin) + ", " + u64s(t.end) + ") hold " + u64s(t.end - t.begin) +
                         " bytes but shape " + cut(shape_str(t.shape)) + " of " + dts + " needs " + u64s(nbytes));
    out.tensors.push_back(std::move(t));
  }

  // The tensors must tile [0, buffer) exactly.
  std::vector<const TensorInfo*> by_offset;
  by_offset.reserve(out.tensors.size());
  for (const TensorInfo& t : out.tensors) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->begin != b->begin ? a->begin < b->begin : (a->end != b->end ? a->end < b->end : a->name < b->name);
  });
  uint64_t expect = 0;
  const TensorInfo* prev = nullptr;
  for (const TensorInfo* t : by_offset) {
    if (t->begin < expect)
      throw BadInput(path, t->name,
                     "data_offsets [" + u64s(t->begin) + ", " + u64s(t->end) + ") overlap tensor \"" + prev->name +
                         "\" [" + u64s(prev->begin) + ", " + u64s(prev->end) + ")");
    if (t->begin > expect)
      throw BadInput(path, t->name,
                     "data_offsets begin " + u64s(t->begin) + " leaves a hole of " + u64s(t->begin - expect) +
                         " unreferenced bytes before it (offsets must tile the data buffer)");
    if (t->end > expect || prev == nullptr) {
      expect = t->end;
      prev = t;
    }
  }
  if (expect != buffer)
    throw BadInput(path, "", u64s(buffer - expect) + " trailing bytes after the last tensor are not referenced by the header (data buffer " +
                                 u64s(buffer) + " bytes, tensors end at " + u64s(expect) + ")");

  std::sort(out.tensors.begin(), out.tensors.end(),
            [](const TensorInfo& a, const TensorInfo& b) { return a.name < b.name; });
  return out;
}

// --- SafetensorsFile -----------------------------------------------------------

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  struct stat st {};
  const int fd = open_regular_file(path, st);
  SafetensorsFile f;
  f.path_ = path;
  const size_t size = static_cast<size_t>(st.st_size);
  if (size >= 8) {
    void* m = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      const int e = errno;
      ::close(fd);
      throw IoError(path + ": cannot mmap: " + std::strerror(e));
    }
    f.map_ = m;
    f.base_ = static_cast<const uint8_t*>(m);
    f.size_ = size;
  } else {
    f.owned_.resize(size);
    size_t got = 0;
    while (got < size) {
      const ssize_t r = ::read(fd, f.owned_.data() + got, size - got);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) break;
      got += static_cast<size_t>(r);
    }
    f.owned_.resize(got);
    f.base_ = f.owned_.data();
    f.size_ = got;
  }
  ::close(fd);
  f.header_ = parse_safetensors(f.base_, f.size_, path);  // on throw, ~SafetensorsFile unmaps
  return f;
}

SafetensorsFile SafetensorsFile::from_buffer(std::vector<uint8_t> bytes, std::string path) {
  SafetensorsFile f;
  f.path_ = std::move(path);
  f.owned_ = std::move(bytes);
  f.base_ = f.owned_.data();
  f.size_ = f.owned_.size();
  f.header_ = parse_safetensors(f.base_, f.size_, f.path_);
  return f;
}

void SafetensorsFile::release() {
  if (map_ != nullptr) ::munmap(map_, size_);
  map_ = nullptr;
  base_ = nullptr;
  size_ = 0;
  owned_.clear();
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& o) noexcept { *this = std::move(o); }

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& o) noexcept {
  if (this != &o) {
    release();
    path_ = std::move(o.path_);
    header_ = std::move(o.header_);
    map_ = o.map_;
    size_ = o.size_;
    owned_ = std::move(o.owned_);
    base_ = map_ ? static_cast<const uint8_t*>(map_) : owned_.data();
    o.map_ = nullptr;
    o.base_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}

SafetensorsFile::~SafetensorsFile() { release(); }

const TensorInfo& SafetensorsFile::at(std::string_view name) const {
  const TensorInfo* t = find(name);
  if (t == nullptr) throw BadInput(path_, std::string(name), "no tensor of that name in the file");
  return *t;
}

std::span<const uint8_t> SafetensorsFile::bytes(const TensorInfo& t) const {
  return {base_ + header_.data_start + t.begin, static_cast<size_t>(t.end - t.begin)};
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  if (exp == 0) {
    const float mag = static_cast<float>(man) * 0x1p-24f;  // exact: man < 2^10, result normal in fp32
    return sign ? -mag : mag;
  }
  uint32_t bits;
  if (exp == 31)
    bits = sign | 0x7f800000u | (man << 13);  // Inf, or NaN with its payload
  else
    bits = sign | ((exp + 112u) << 23) | (man << 13);
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

namespace {

// out[i] = convert(element i of the raw little-endian buffer, read as In).
template <class In, class Out, class Convert>
void convert_each(const uint8_t* p, int64_t n, Out* out, Convert convert) {
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    In v;
    std::memcpy(&v, p + sizeof(In) * i, sizeof(In));
    out[i] = convert(v);
  }
}

}  // namespace

namespace {

// The first byte of elements [first, first + count) of `t` in `bytes`.
const uint8_t* element_range(std::span<const uint8_t> bytes, const TensorInfo& t, uint64_t first, uint64_t count) {
  if (first > t.numel() || count > t.numel() - first)
    throw std::out_of_range("elements [" + u64s(first) + ", +" + u64s(count) + ") of " + t.name + " (" +
                            u64s(t.numel()) + " elements)");
  return bytes.data() + first * dtype_size(t.dtype);
}

}  // namespace

std::vector<bf16> SafetensorsFile::read_bf16(const TensorInfo& t, uint64_t first, uint64_t count) const {
  const uint8_t* p = element_range(bytes(t), t, first, count);
  const int64_t n = static_cast<int64_t>(count);
  std::vector<bf16> out(static_cast<size_t>(n));
  switch (t.dtype) {
    case DType::BF16:
      if (n > 0) std::memcpy(out.data(), p, static_cast<size_t>(n) * 2);
      break;
    case DType::F32:
      convert_each<float>(p, n, out.data(), [](float f) { return round_bf16(f); });
      break;
    case DType::F16:
      convert_each<uint16_t>(p, n, out.data(), [](uint16_t h) { return round_bf16(f16_to_f32(h)); });
      break;
    default:
      throw BadInput(path_, t.name,
                     std::string("dtype ") + dtype_name(t.dtype) + " cannot be converted to bf16 (expected BF16, F32 or F16)");
  }
  return out;
}

std::vector<float> SafetensorsFile::read_f32(const TensorInfo& t, uint64_t first, uint64_t count) const {
  const uint8_t* p = element_range(bytes(t), t, first, count);
  const int64_t n = static_cast<int64_t>(count);
  std::vector<float> out(static_cast<size_t>(n));
  switch (t.dtype) {
    case DType::F32:
      if (n > 0) std::memcpy(out.data(), p, static_cast<size_t>(n) * 4);
      break;
    case DType::BF16:
      convert_each<uint16_t>(p, n, out.data(), [](uint16_t h) { return widen(bf16{h}); });
      break;
    case DType::F16:
      convert_each<uint16_t>(p, n, out.data(), [](uint16_t h) { return f16_to_f32(h); });
      break;
    default:
      throw BadInput(path_, t.name,
                     std::string("dtype ") + dtype_name(t.dtype) + " cannot be widened exactly to fp32 (expected BF16, F16 or F32)");
  }
  return out;
}

// --- writer ----------------------------------------------------------------------

namespace {

// Validates, sorts by name and returns the padded header text.
std::string prepare_header(std::vector<WriteTensor>& tensors, const std::map<std::string, std::string>& metadata) {
  std::sort(tensors.begin(), tensors.end(), [](const WriteTensor& a, const WriteTensor& b) { return a.name < b.name; });
  json h = json::object();
  if (!metadata.empty()) {
    json m = json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    h["__metadata__"] = std::move(m);
  }
  uint64_t offset = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const WriteTensor& t = tensors[i];
    if (t.name.empty()) throw std::invalid_argument("write_safetensors: empty tensor name");
    if (t.name == "__metadata__") throw std::invalid_argument("write_safetensors: tensor name __metadata__ is reserved");
    if (i > 0 && tensors[i - 1].name == t.name)
      throw std::invalid_argument("write_safetensors: duplicate tensor name " + t.name);
    uint64_t numel = 1;
    for (uint64_t d : t.shape)
      if (mul_overflows(numel, d, &numel)) throw std::invalid_argument("write_safetensors: shape overflow for " + t.name);
    uint64_t nbytes = 0;
    if (mul_overflows(numel, dtype_size(t.dtype), &nbytes) || nbytes != t.bytes.size())
      throw std::invalid_argument("write_safetensors: tensor " + t.name + " has " + u64s(t.bytes.size()) +
                                  " bytes; its shape and dtype need " + u64s(nbytes));
    json e = json::object();
    e["dtype"] = dtype_name(t.dtype);
    e["shape"] = t.shape;
    e["data_offsets"] = json::array({offset, offset + nbytes});
    h[t.name] = std::move(e);
    offset += nbytes;
  }
  std::string text = h.dump();
  const size_t pad = (8 - (8 + text.size()) % 8) % 8;
  text.append(pad, ' ');
  if (text.size() > kMaxHeaderBytes) throw std::invalid_argument("write_safetensors: header exceeds 100 MB");
  return text;
}

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

}  // namespace

std::vector<uint8_t> serialize_safetensors(std::vector<WriteTensor> tensors, const std::map<std::string, std::string>& metadata) {
  const std::string header = prepare_header(tensors, metadata);
  size_t total = 8 + header.size();
  for (const WriteTensor& t : tensors) total += t.bytes.size();
  std::vector<uint8_t> out(total);
  const std::string len = le64(header.size());
  std::memcpy(out.data(), len.data(), 8);
  std::memcpy(out.data() + 8, header.data(), header.size());
  size_t at = 8 + header.size();
  for (const WriteTensor& t : tensors) {
    if (!t.bytes.empty()) std::memcpy(out.data() + at, t.bytes.data(), t.bytes.size());
    at += t.bytes.size();
  }
  return out;
}

void write_safetensors(const std::string& path, std::vector<WriteTensor> tensors,
                       const std::map<std::string, std::string>& metadata) {
  const std::string header = prepare_header(tensors, metadata);
  const std::string len = le64(header.size());
  auto bytes = [](const std::string& s) { return std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(s.data()), s.size()); };
  std::vector<std::span<const uint8_t>> pieces = {bytes(len), bytes(header)};
  for (const WriteTensor& t : tensors) pieces.push_back(t.bytes);
  write_output(path, pieces);
}

}  // namespace bp::io
