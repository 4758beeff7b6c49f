#include "golden.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>

#include "reference/common/sha256.h"

namespace bp::test {
namespace {

std::map<std::string, std::string> read_entries(const std::string& path) {
  std::map<std::string, std::string> entries;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    std::string name, hex;
    if (fields >> name >> hex) entries[name] = hex;
  }
  return entries;
}

void write_entries(const std::string& path, const std::map<std::string, std::string>& entries) {
  std::ofstream out(path, std::ios::trunc);
  out << "# SHA-256 of output bits (NaN canonicalised). Regenerate on purpose with\n"
         "# BP_UPDATE_GOLDEN=1 ctest -R <suite>, and explain the change of bits in the commit.\n";
  for (const auto& [name, hex] : entries) out << name << ' ' << hex << '\n';
}

}  // namespace

std::string digest(const std::vector<bf16>& v) {
  Sha256 h;
  for (bf16 x : v) {
    const uint16_t b = is_nan(x) ? kCanonicalNanBf16 : x.bits;
    const uint8_t le[2] = {uint8_t(b), uint8_t(b >> 8)};
    h.update(le, 2);
  }
  return h.hex();
}

std::string digest(const std::vector<float>& v) {
  Sha256 h;
  for (float x : v) {
    const uint32_t b = canonical_bits(x);
    const uint8_t le[4] = {uint8_t(b), uint8_t(b >> 8), uint8_t(b >> 16), uint8_t(b >> 24)};
    h.update(le, 4);
  }
  return h.hex();
}

std::string source_path(const std::string& relative) {
  const char* root = std::getenv("BP_SOURCE_DIR");
  return std::string(root ? root : BP_DEFAULT_SOURCE_DIR) + "/" + relative;
}

void expect_golden(const std::string& file, const std::string& name, const std::string& hex) {
  const std::string path = source_path("fixtures/golden/" + file);
  std::map<std::string, std::string> entries = read_entries(path);
  const char* update = std::getenv("BP_UPDATE_GOLDEN");
  if (update && std::string(update) == "1") {
    entries[name] = hex;
    write_entries(path, entries);
    return;
  }
  const auto it = entries.find(name);
  if (it == entries.end()) {
    ADD_FAILURE() << "no golden digest '" << name << "' in " << path
                  << "; create it on purpose with BP_UPDATE_GOLDEN=1";
    return;
  }
  EXPECT_EQ(it->second, hex) << "bits of '" << name << "' changed (" << path
                             << "). If intended, regenerate with BP_UPDATE_GOLDEN=1 and say why in the commit.";
}

}  // namespace bp::test
