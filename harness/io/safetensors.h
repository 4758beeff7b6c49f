// safetensors reader and writer (https://github.com/huggingface/safetensors, the
// format of Hugging Face checkpoints and of bitparity's tensor dumps).
//
// Layout: 8-byte little-endian header length N; N bytes of UTF-8 JSON
//   {"<name>": {"dtype": "BF16", "shape": [d0, ...], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"<key>": "<string>", ...}}          (metadata optional)
// padded with trailing spaces; then the byte buffer, offsets relative to its start.
//
// The reader is strict, with the same acceptance rules as the reference Rust
// implementation plus a few more (all throw BadInput naming the file and the
// tensor or field):
//   - the file is at least 8 bytes; N <= 100,000,000 (the Rust limit) and 8 + N <= file size;
//   - the header is valid JSON (UTF-8, no duplicate keys at any level) and an object;
//   - "__metadata__", if present, is an object of string values;
//   - every tensor entry is an object with exactly the keys dtype, shape, data_offsets;
//     the tensor name is not empty;
//   - dtype is one of the safetensors names (BOOL U8 I8 U16 I16 F16 BF16 U32 I32 F32
//     U64 I64 F64 F8_E4M3 F8_E5M2 F8_E8M0); sub-byte types (F4, F6_*) are refused;
//   - shape is a list of non-negative integers whose product, times the dtype size,
//     fits in 64 bits; data_offsets is a list of exactly two non-negative integers,
//     begin <= end, end - begin == product(shape) * dtype size;
//   - the tensors tile the byte buffer exactly: sorted by offset, each begins where
//     the previous ended (no overlap, no hole), the first at 0, and the last ends at
//     the end of the file: trailing unreferenced bytes are refused. (The safetensors
//     spec says the buffer is fully indexed; the Rust reader refuses holes and tails
//     too, so a file bitparity accepts is one the reference accepts, and vice versa.)
// Byte order: little-endian host assumed (static_assert).
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "harness/io/errors.h"
#include "reference/numerics/bf16.h"

namespace bp::io {

enum class DType : uint8_t {
  BOOL, U8, I8, U16, I16, F16, BF16, U32, I32, F32, U64, I64, F64, F8_E4M3, F8_E5M2, F8_E8M0,
};

const char* dtype_name(DType d);              // "BF16"
size_t dtype_size(DType d);                   // bytes per element
bool dtype_from_name(std::string_view s, DType* out);

constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// "[d0, d1, ...]": a shape in messages and tables.
template <class Int>
std::string shape_str(const std::vector<Int>& shape) {
  std::string r = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) r += ", ";
    r += std::to_string(shape[i]);
  }
  return r + "]";
}

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<uint64_t> shape;
  uint64_t begin = 0, end = 0;  // relative to the start of the byte buffer
  uint64_t numel() const;
  uint64_t nbytes() const { return end - begin; }
};

struct SafetensorsHeader {
  std::vector<TensorInfo> tensors;              // sorted by name
  std::map<std::string, std::string> metadata;  // "__metadata__"
  uint64_t data_start = 0;                      // 8 + N: file offset of the byte buffer
  const TensorInfo* find(std::string_view name) const;  // nullptr if absent
};

// Validates a whole safetensors image in memory (the libFuzzer entry point) and
// returns its header. Never reads outside [data, data + size). `path` only names
// the input in messages.
SafetensorsHeader parse_safetensors(const uint8_t* data, size_t size, std::string_view path);

// An opened, validated safetensors file: memory-mapped (or an owned buffer).
class SafetensorsFile {
 public:
  static SafetensorsFile open(const std::string& path);
  static SafetensorsFile from_buffer(std::vector<uint8_t> bytes, std::string path);

  SafetensorsFile(SafetensorsFile&&) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept;
  ~SafetensorsFile();

  const std::string& path() const { return path_; }
  const SafetensorsHeader& header() const { return header_; }
  const std::vector<TensorInfo>& tensors() const { return header_.tensors; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  const TensorInfo* find(std::string_view name) const { return header_.find(name); }
  // Throws BadInput(path, name, "no tensor ...") if absent.
  const TensorInfo& at(std::string_view name) const;

  // The tensor's raw little-endian bytes (not necessarily aligned).
  std::span<const uint8_t> bytes(const TensorInfo& t) const;

  // The whole file's bytes (what a checkpoint's digest covers).
  std::span<const uint8_t> file_bytes() const { return {base_, size_}; }

  // Values converted to bf16: BF16 bit-exact; F32 by R() (RNE, NaN canonical);
  // F16 widened exactly to fp32, then R(). Any other dtype: BadInput.
  std::vector<bf16> read_bf16(const TensorInfo& t) const { return read_bf16(t, 0, t.numel()); }
  // Values widened exactly to fp32 from BF16, F16 or F32. Any other dtype: BadInput.
  std::vector<float> read_f32(const TensorInfo& t) const { return read_f32(t, 0, t.numel()); }
  // The same for elements [first, first + count) of the flat tensor (within it: std::out_of_range).
  std::vector<bf16> read_bf16(const TensorInfo& t, uint64_t first, uint64_t count) const;
  std::vector<float> read_f32(const TensorInfo& t, uint64_t first, uint64_t count) const;

 private:
  SafetensorsFile() = default;
  void release();
  std::string path_;
  SafetensorsHeader header_;
  const uint8_t* base_ = nullptr;
  size_t size_ = 0;
  void* map_ = nullptr;         // mmap region, or nullptr
  std::vector<uint8_t> owned_;  // used when not mapped
};

// Exact IEEE binary16 -> binary32.
float f16_to_f32(uint16_t h);

// --- writer -----------------------------------------------------------------

struct WriteTensor {
  std::string name;
  DType dtype = DType::BF16;
  std::vector<uint64_t> shape;
  std::span<const uint8_t> bytes;  // product(shape) * dtype_size(dtype) bytes, little-endian
};

// Writes `path` with io::write_output (io/files.h: a file atomically -- a temporary in
// the same directory, fsync, rename over `path` -- "-" to standard output). Tensors
// are laid out sorted by name; the JSON header is padded with spaces so that the
// byte buffer starts at a multiple of 8. Throws
// std::invalid_argument for inconsistent tensors (duplicate or empty name, byte
// count != shape) and IoError for a failed write (the temporary is removed and
// `path` is untouched).
void write_safetensors(const std::string& path, std::vector<WriteTensor> tensors,
                       const std::map<std::string, std::string>& metadata = {});

// The same bytes in memory (for tests and fuzz corpora).
std::vector<uint8_t> serialize_safetensors(std::vector<WriteTensor> tensors,
                                           const std::map<std::string, std::string>& metadata = {});

}  // namespace bp::io
