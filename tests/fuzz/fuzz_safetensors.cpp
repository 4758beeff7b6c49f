// libFuzzer target: the safetensors reader (harness/io/safetensors.h).
//
// Every input goes through parse_safetensors, then SafetensorsFile::from_buffer
// and read_bf16 / read_f32 of every tensor. Contract: only bp::io::BadInput may
// escape; any other exception, a crash or a sanitizer report is a finding. An
// accepted file must then open from a buffer without any exception, convert its
// float tensors (and refuse the others), and survive the writer: serializing its
// tensors and metadata and reading that back gives the same names, dtypes, shapes,
// bytes and metadata.
#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

#include "fuzz_contract.h"
#include "harness/io/safetensors.h"

namespace {

using bp::io::SafetensorsFile;

// BF16, F32 and F16 convert to as many values as the tensor has; every other dtype
// is refused with BadInput by both conversions.
void read_every_tensor(const SafetensorsFile& f) {
  using bp::io::DType;
  for (const bp::io::TensorInfo& t : f.tensors()) {
    if (t.dtype == DType::BF16 || t.dtype == DType::F32 || t.dtype == DType::F16) {
      bp::fuzz::require(f.read_bf16(t).size() == t.numel(), "read_bf16 returned a wrong element count");
      bp::fuzz::require(f.read_f32(t).size() == t.numel(), "read_f32 returned a wrong element count");
    } else {
      bp::fuzz::require(bp::fuzz::refused([&] { (void)f.read_bf16(t); }), "read_bf16 converted a non-float dtype");
      bp::fuzz::require(bp::fuzz::refused([&] { (void)f.read_f32(t); }), "read_f32 converted a non-float dtype");
    }
  }
}

// What the writer makes of an accepted file reads back as the same tensors.
void check_round_trip(const SafetensorsFile& f) {
  std::vector<bp::io::WriteTensor> out;
  for (const bp::io::TensorInfo& t : f.tensors()) out.push_back({t.name, t.dtype, t.shape, f.bytes(t)});
  const SafetensorsFile back = SafetensorsFile::from_buffer(bp::io::serialize_safetensors(out, f.metadata()), "round-trip");
  bp::fuzz::require(back.metadata() == f.metadata(), "metadata changed in a write/read round trip");
  bp::fuzz::require(back.tensors().size() == f.tensors().size(), "tensor count changed in a write/read round trip");
  for (size_t i = 0; i < f.tensors().size(); ++i) {
    const bp::io::TensorInfo &a = f.tensors()[i], &b = back.tensors()[i];
    const auto ab = f.bytes(a), bb = back.bytes(b);
    bp::fuzz::require(a.name == b.name && a.dtype == b.dtype && a.shape == b.shape && ab.size() == bb.size() &&
                          (ab.empty() || std::memcmp(ab.data(), bb.data(), ab.size()) == 0),
                      "a tensor changed in a write/read round trip");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::optional<bp::io::SafetensorsHeader> header;
  bp::fuzz::allow_bad_input([&] { header = bp::io::parse_safetensors(data, size, "fuzz.safetensors"); });
  if (!header) return 0;
  bp::fuzz::must_not_throw("an accepted file could not be opened from a buffer or written back", [&] {
    const SafetensorsFile f = SafetensorsFile::from_buffer(std::vector<uint8_t>(data, data + size), "fuzz.safetensors");
    bp::fuzz::require(f.tensors().size() == header->tensors.size(), "from_buffer and parse_safetensors disagree");
    read_every_tensor(f);
    check_round_trip(f);
  });
  return 0;
}
