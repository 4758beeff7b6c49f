#include "support/sample_report.h"

#include <cmath>
#include <stdexcept>
#include <vector>

namespace bp::test {

using namespace bp::harness;

TensorRecord compared_tensor(const std::string& name, int bad, int ulps) {
  std::vector<float> a(8), b(8);
  for (size_t i = 0; i < a.size(); ++i) a[i] = b[i] = -1.0f - 0.25f * static_cast<float>(i);
  for (int i = 0; i < bad; ++i) b[static_cast<size_t>(i)] = float_of(bits_of(a[static_cast<size_t>(i)]) + static_cast<uint32_t>(ulps));
  TensorRecord t;
  t.name = name;
  t.dtype_a = t.dtype_b = "F32";
  t.shape_a = t.shape_b = std::vector<uint64_t>{8};
  t.is_logprob = name.find("logprob") != std::string::npos;
  t.metrics = compare(a, b, {8});
  t.metrics->is_logprob = t.is_logprob;
  return t;
}

Report sample_sweep_report() {
  Report r = make_report("sweep");
  r.created_utc = "2026-11-22T04:00:00Z";
  r.environment.contract_name = "qwen3_true_on_policy_v1";
  r.environment.contract_knob_hash = "abc123";
  auto grid_case = [&r](const std::string& layout, const std::string& path, bool bad) {
    Case c;
    c.id = layout + "-" + path;
    c.parameters = {{"model", "qwen3-tiny"}, {"contract", "v1"}, {"backend", "cpu"}, {"layout", layout}, {"path", path}};
    c.tensors.push_back(compared_tensor("logprobs", bad ? 3 : 0, 5));
    c.tensors.push_back(compared_tensor("grad.layers.0.mlp.down_proj", 0, 0));
    if (bad) c.first_divergent_op = "layer0.mlp.down_proj";
    c.seconds = 0.125 * static_cast<double>(r.cases.size() + 1);
    c.settle();
    r.cases.push_back(c);
  };
  for (const char* layout : {"tp1", "tp2"})
    for (const char* path : {"full", "decode", "prefill"})
      if (std::string(layout) != "tp2" || std::string(path) != "prefill")
        grid_case(layout, path, std::string(layout) == "tp2" && std::string(path) == "decode");

  Case moe;
  moe.id = "moe-ep2-decode";
  moe.parameters = {{"model", "moe<&>\""}, {"contract", "v1"}, {"backend", "cuda"}, {"layout", "ep2"}, {"path", "decode"}};
  moe.verdict = Verdict::kSkipped;
  moe.skip_reason = "no GPU";
  r.cases.push_back(moe);

  Case other;
  other.id = "other <b>&'\"";
  other.parameters = {{"note", "a,b \"q\""}};
  TensorRecord hostile = compared_tensor("<script>alert(\"x\")</script>&'", 0, 0);
  TensorRecord only;
  only.name = "only<a>";
  only.status = TensorStatus::kOnlyInA;
  only.dtype_a = "BF16";
  only.shape_a = std::vector<uint64_t>{2, 3};
  TensorRecord renamed = compared_tensor("x", 0, 0);
  renamed.name_b.assign(1, 'y');  // (= "y" trips GCC 12's false -Wrestrict)
  other.tensors = {hostile, only, renamed};
  other.seconds = 75.5;
  other.peak_device_bytes = kSamplePeakDeviceBytes;
  other.settle();
  r.cases.push_back(other);
  return r;
}

Case& sample_case(Report& r, const std::string& id) {
  for (Case& c : r.cases)
    if (c.id == id) return c;
  throw std::invalid_argument("sample report has no case " + id);
}

}  // namespace bp::test
