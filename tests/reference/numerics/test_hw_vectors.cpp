// Hardware truth, checked forever: every dot product captured on an H100/H200 by
// tools/hw_truth/hw_truth.cu (fixtures/hw/sm90_cases.csv) must come out of the sm90-tc
// model with the same bits, for mma.sync and for wgmma. NaN is compared after
// canonicalisation (SPEC.md §3): payloads are not part of the contract.
//
// File format (written by hw_truth, documented there too): '#' lines are comments;
// a header row, then one single-group case per row, 36 columns:
//   category, c, a0..a15, b0..b15, mma, wgmma
// c, mma and wgmma are fp32 bit patterns as 8 hex digits, a_i and b_i bf16 bit
// patterns as 4 hex digits (no 0x). Each row is d = c + sum_{i<16} a_i·b_i as one
// mma.sync.m16n8k16 (column mma) and one wgmma.m64n8k16 k16 step (column wgmma).
#include <gtest/gtest.h>

#include <array>
#include <charconv>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <tuple>

#include "reference/numerics/dot.h"
#include "support/fccp_csv.h"
#include "support/golden.h"

namespace bp {
namespace {

constexpr int kColumns = 36;
constexpr const char* kFixture = "fixtures/hw/sm90_cases.csv";

// Categories hw_truth writes; a capture missing one is incomplete.
const std::set<std::string> kRequiredCategories = {
    "uniform",       "wide",     "cancel",   "tiny_huge",   "window", "zeros", "bf16_subnormal",
    "f32_subnormal", "overflow", "specials", "signed_zero"};

std::array<std::string, kColumns> column_names() {
  std::array<std::string, kColumns> n;
  n[0] = "category";
  n[1] = "c";
  for (int i = 0; i < 16; ++i) n[2 + i] = "a" + std::to_string(i), n[18 + i] = "b" + std::to_string(i);
  n[34] = "mma";
  n[35] = "wgmma";
  return n;
}

uint32_t parse_hex(const std::string& s, size_t digits, int line, const char* column) {
  uint32_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v, 16);
  if (ec != std::errc() || end != s.data() + s.size() || s.size() != digits)
    throw std::runtime_error("line " + std::to_string(line) + ": bad " + column + " '" + s + "' (want " +
                             std::to_string(digits) + " hex digits)");
  return v;
}

struct Row {
  std::string category;
  float c;
  bf16 a[16], b[16];
  uint32_t mma, wgmma;
};

std::string describe(const Row& r, uint32_t model) {
  char buf[96];
  std::string s = r.category + " c=";
  std::snprintf(buf, sizeof buf, "%08x", bits_of(r.c));
  s += buf;
  for (int i = 0; i < 16; ++i) {
    if ((r.a[i].bits | r.b[i].bits) == 0 || (r.a[i].bits == 0 && r.b[i].bits == 0x3f80)) continue;  // 0 x 1 filler
    std::snprintf(buf, sizeof buf, " [%d]%04x*%04x", i, r.a[i].bits, r.b[i].bits);
    s += buf;
  }
  std::snprintf(buf, sizeof buf, " -> model %08x, mma %08x, wgmma %08x", model, r.mma, r.wgmma);
  return s + buf;
}

TEST(HwVectors, Sm90TcReproducesEveryCapturedBit) {
  const std::string path = test::source_path(kFixture);
  ASSERT_TRUE(std::filesystem::exists(path))
      << path << " is missing. It is the hardware capture of the sm90-tc model: run `bash scripts/device` "
      << "on an H100/H200 (carry build-device) and commit $OUT/hw/sm90_cases.csv as " << kFixture
      << " (see tools/hw_truth/hw_truth.cu).";

  io::CSVReader<kColumns, io::trim_chars<' ', '\t'>, io::no_quote_escape<','>, io::throw_on_overflow,
                io::single_line_comment<'#'>>
      in(path);
  std::apply([&](const auto&... n) { in.read_header(io::ignore_extra_column, n...); }, column_names());

  std::array<std::string, kColumns> f;
  std::map<std::string, int> per_category;
  int rows = 0, mismatches = 0;
  while (std::apply([&](auto&... x) { return in.read_row(x...); }, f)) {
    const int line = static_cast<int>(in.get_file_line());
    Row r;
    r.category = f[0];
    r.c = float_of(parse_hex(f[1], 8, line, "c"));
    for (int i = 0; i < 16; ++i) {
      r.a[i].bits = static_cast<uint16_t>(parse_hex(f[2 + i], 4, line, "a"));
      r.b[i].bits = static_cast<uint16_t>(parse_hex(f[18 + i], 4, line, "b"));
    }
    r.mma = parse_hex(f[34], 8, line, "mma");
    r.wgmma = parse_hex(f[35], 8, line, "wgmma");

    const float model = Sm90Tc::group(r.c, r.a, 1, r.b, 1, 16);
    const uint32_t want = canonical_bits(model);
    if (canonical_bits(float_of(r.mma)) != want || canonical_bits(float_of(r.wgmma)) != want) {
      if (++mismatches <= 20) ADD_FAILURE() << "line " << line << ": " << describe(r, bits_of(model));
    }
    ++rows;
    ++per_category[r.category.substr(0, r.category.find('.'))];
  }
  EXPECT_EQ(mismatches, 0) << mismatches << " of " << rows << " captured cases differ from the model";
  EXPECT_GE(rows, 1000) << "a capture has a few thousand cases; this file looks truncated";
  for (const std::string& cat : kRequiredCategories)
    EXPECT_GT(per_category[cat], 0) << "no case of category '" << cat << "' in " << kFixture;
  EXPECT_GT(per_category["probe"], 0) << "no edge-case probe rows in " << kFixture;
}

}  // namespace
}  // namespace bp
