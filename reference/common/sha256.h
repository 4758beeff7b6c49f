// SHA-256 (FIPS 180-4), for contract hashes and golden digests of output bits.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace bp {

class Sha256 {
 public:
  Sha256();
  Sha256& update(const void* data, size_t len);
  Sha256& update(std::string_view s) { return update(s.data(), s.size()); }
  std::array<uint8_t, 32> digest();  // finalises; the object is then spent
  std::string hex();                 // digest() as 64 lowercase hex digits

 private:
  void block(const uint8_t* p);
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t buf_len_ = 0;
  uint64_t total_ = 0;
};

inline std::string sha256_hex(std::string_view s) { return Sha256().update(s).hex(); }

}  // namespace bp
