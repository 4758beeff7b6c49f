#include "selfcheck.h"

#include <cmath>
#include <sstream>

#include "reference/contract/contract.h"
#include "reference/numerics/dot.h"
#include "reference/numerics/sm90_vectors.h"

namespace bp {
namespace {

CheckResult check_sm90_vectors() {
  int bad = 0, n = 0;
  std::ostringstream why;
  for (const Sm90Vector& v : sm90_targeted_vectors()) {
    const std::vector<bf16> a = to_bf16_exact(v.a), b = to_bf16_exact(v.b);
    const uint32_t got = bits_of(Sm90Tc::group(v.c, a.data(), 1, b.data(), 1, 16));
    ++n;
    if (got != v.expect) {
      ++bad;
      why << " [" << v.what << ": got 0x" << std::hex << got << std::dec << "]";
    }
  }
  return {"sm90-tc targeted vectors", bad == 0, std::to_string(n - bad) + "/" + std::to_string(n) + " match" + why.str()};
}

CheckResult check_bf16_rounding() {
  // Ties to even, overflow to Inf, subnormals, canonical NaN.
  struct Case { uint32_t in; uint16_t out; } cases[] = {
      {0x3f808000u, 0x3f80}, {0x3f818000u, 0x3f82}, {0x7f7fffffu, 0x7f80},
      {0x00018000u, 0x0002}, {0x7fc12345u, kCanonicalNanBf16}, {0x80000000u, 0x8000}};
  int bad = 0;
  for (const Case& c : cases) bad += round_bf16(float_of(c.in)).bits != c.out;
  return {"bf16 round-to-nearest-even", bad == 0, std::to_string(6 - bad) + "/6 edge cases"};
}

CheckResult check_fma_seq() {
  // fma-seq keeps the product exact before each add: 1 + 2^-24·(1+2^-7)... one rounding per step.
  const std::vector<bf16> a = to_bf16_exact({1.0f, 0x1p-24f, 0x1p-24f}), b = to_bf16_exact({1.0f, 1.0f, 1.0f});
  const float got = FmaSeq::chain(0.0f, a.data(), 1, b.data(), 1, 3);
  const float expect = (1.0f + 0x1p-24f) + 0x1p-24f;  // ties to even at each step: stays 1
  return {"fma-seq chain order", bits_of(got) == bits_of(expect), "sequential rounding at every step"};
}

CheckResult check_contracts() {
  std::ostringstream out;
  bool ok = true;
  for (const Contract& c : contracts()) {
    const std::string err = validate(c.knobs);
    ok = ok && err.empty();
    out << c.name << "=" << c.knob_hash() << (err.empty() ? "" : " (" + err + ")") << " ";
  }
  return {"contracts", ok, out.str()};
}

}  // namespace

std::vector<CheckResult> run_selfcheck() {
  return {check_bf16_rounding(), check_sm90_vectors(), check_fma_seq(), check_contracts()};
}

}  // namespace bp
