// A report against a baseline (baseline.h).
#include "harness/report/baseline.h"

#include <algorithm>
#include <map>

#include "harness/io/errors.h"

namespace bp::harness {

namespace {

// What a tensor came to, in one phrase.
std::string state(const TensorRecord& t) {
  if (t.status != TensorStatus::kCompared) return tensor_status_name(t.status);
  const TensorMetrics& m = *t.metrics;
  if (t.nonfinite()) return "identical but non-finite (" + std::to_string(m.nan_a + m.inf_a) + "/" +
                             std::to_string(m.elements) + " NaN/Inf)";
  if (m.bit_identical) return "identical";
  return std::to_string(m.mismatches) + "/" + std::to_string(m.elements) + " differ, max_ulp_diff " +
         metric_text(m.max_ulp_diff, "%.0f") + ", max_abs_diff " + metric_text(m.max_abs_diff, "%.3g");
}

// The metric changes between two mismatching records ("" when none).
std::string metric_delta(const TensorRecord& a, const TensorRecord& b) {
  std::vector<std::string> parts;
  if (a.status != b.status) parts.push_back(std::string("status ") + tensor_status_name(a.status) + " -> " + tensor_status_name(b.status));
  if (a.metrics && b.metrics) {
    const TensorMetrics &x = *a.metrics, &y = *b.metrics;
    if (x.mismatches != y.mismatches)
      parts.push_back("mismatches " + std::to_string(x.mismatches) + " -> " + std::to_string(y.mismatches));
    if (x.max_ulp_diff != y.max_ulp_diff)
      parts.push_back("max_ulp_diff " + metric_text(x.max_ulp_diff, "%.0f") + " -> " +
                      metric_text(y.max_ulp_diff, "%.0f"));
    if (x.max_abs_diff != y.max_abs_diff)
      parts.push_back("max_abs_diff " + metric_text(x.max_abs_diff, "%.3g") + " -> " +
                      metric_text(y.max_abs_diff, "%.3g"));
  }
  std::string s;
  for (const std::string& p : parts) s += (s.empty() ? "" : ", ") + p;
  return s;
}

// Against a baseline, a non-finite match fails as a mismatch does: exact yesterday
// and NaN everywhere today is a regression. An error fails too, and worst.
bool passes(const TensorRecord& t) { return t.matches() && !t.nonfinite(); }
bool fails(const Case& c) {
  return c.verdict == Verdict::kMismatch || c.verdict == Verdict::kNonFinite || c.verdict == Verdict::kError;
}
// "error: <message>" for an error case, else its verdict.
std::string verdict_text(const Case& c) {
  return c.verdict == Verdict::kError ? "error: " + c.error : verdict_name(c.verdict);
}

// Whether a case's run came to a comparison with the reference.
bool compared(const Case& c) { return c.verdict != Verdict::kSkipped && c.verdict != Verdict::kError; }

// A case's tensors by key; BadInput when a key repeats.
std::map<std::string, const TensorRecord*> tensors_by_key(const Case& c, size_t case_index, const std::string& path) {
  std::map<std::string, const TensorRecord*> out;
  for (size_t i = 0; i < c.tensors.size(); ++i)
    if (!out.emplace(tensor_key(c.tensors[i]), &c.tensors[i]).second)
      throw io::BadInput(path, "cases[" + std::to_string(case_index) + "].tensors[" + std::to_string(i) + "]",
                         "tensor \"" + tensor_key(c.tensors[i]) + "\" appears twice in case \"" + c.id +
                             "\" (a baseline matches tensors by name)");
  return out;
}

class Differ {
 public:
  explicit Differ(BaselineDiff& d) : d_(d) {}

  void add(ChangeKind k, const std::string& case_id, const std::string& tensor, std::string detail, bool regression) {
    d_.changes.push_back({k, case_id, tensor, std::move(detail), regression});
  }

  void new_case(const Case& c) {
    if (fails(c)) {
      const TensorRecord* t = c.verdict == Verdict::kMismatch    ? c.first_mismatch()
                              : c.verdict == Verdict::kNonFinite ? c.first_nonfinite()
                                                                 : nullptr;
      add(ChangeKind::kNewlyFailing, c.id, "",
          "new case, " + verdict_text(c) + (t ? ": " + tensor_key(*t) + " " + state(*t) : ""), true);
    } else {
      add(ChangeKind::kCaseAdded, c.id, "", verdict_name(c.verdict), false);
    }
  }

  // A case skipped or failed with an error on either side: its verdicts, not its
  // tensors, say what changed. An error newly fails also after a mismatch (the case
  // no longer runs to a comparison); error -> mismatch still fails, no regression.
  void verdict_change(const Case& old, const Case& now) {
    if (old.verdict == now.verdict) {
      if (old.error != now.error)
        add(ChangeKind::kMetricsChanged, now.id, "", "error " + old.error + " -> " + now.error, false);
      return;
    }
    const std::string detail = verdict_text(old) + " -> " + verdict_text(now);
    if (now.verdict == Verdict::kError || (fails(now) && !fails(old)))
      add(ChangeKind::kNewlyFailing, now.id, "", detail, true);
    else if (old.verdict == Verdict::kError && now.verdict == Verdict::kExact)
      add(ChangeKind::kNewlyPassing, now.id, "", detail, false);
    else if (old.verdict == Verdict::kError && fails(now))
      add(ChangeKind::kMetricsChanged, now.id, "", detail, false);
    else
      add(ChangeKind::kSkipChanged, now.id, "", detail, false);
  }

  void both_compared(const Case& old, size_t old_index, const std::string& old_path, const Case& now, size_t now_index,
                     const std::string& now_path) {
    const auto old_tensors = tensors_by_key(old, old_index, old_path);
    const auto now_tensors = tensors_by_key(now, now_index, now_path);
    for (const TensorRecord& t : now.tensors) {
      const std::string key = tensor_key(t);
      const auto it = old_tensors.find(key);
      if (it == old_tensors.end()) {
        if (passes(t)) add(ChangeKind::kTensorAdded, now.id, key, state(t), false);
        else add(ChangeKind::kNewlyFailing, now.id, key, "new tensor: " + state(t), true);
        continue;
      }
      const TensorRecord& o = *it->second;
      if (passes(o) && !passes(t)) add(ChangeKind::kNewlyFailing, now.id, key, state(t), true);
      else if (!passes(o) && passes(t)) add(ChangeKind::kNewlyPassing, now.id, key, "was " + state(o), false);
      else if (!passes(o)) {
        if (std::string delta = metric_delta(o, t); !delta.empty())
          add(ChangeKind::kMetricsChanged, now.id, key, std::move(delta), false);
      }
    }
    for (const TensorRecord& o : old.tensors)
      if (!now_tensors.count(tensor_key(o))) add(ChangeKind::kTensorRemoved, now.id, tensor_key(o), "was " + state(o), false);
    if (old.verdict == Verdict::kMismatch && now.verdict == Verdict::kMismatch &&
        old.first_divergent_op != now.first_divergent_op)
      add(ChangeKind::kMetricsChanged, now.id, "",
          "first_divergent_op " + old.first_divergent_op.value_or("(none)") + " -> " +
              now.first_divergent_op.value_or("(none)"),
          false);
  }

 private:
  BaselineDiff& d_;
};

}  // namespace

const char* change_kind_title(ChangeKind k) {
  switch (k) {
    case ChangeKind::kNewlyFailing: return "newly failing";
    case ChangeKind::kCaseRemoved: return "cases removed";
    case ChangeKind::kTensorRemoved: return "tensors removed";
    case ChangeKind::kNewlyPassing: return "newly passing";
    case ChangeKind::kMetricsChanged: return "still failing, metrics changed";
    case ChangeKind::kCaseAdded: return "cases added";
    case ChangeKind::kTensorAdded: return "tensors added";
    case ChangeKind::kSkipChanged: return "skip changes";
  }
  return "?";
}

bool BaselineDiff::regressed() const {
  return std::any_of(changes.begin(), changes.end(), [](const Change& c) { return c.regression; });
}

size_t BaselineDiff::count(ChangeKind k) const {
  return static_cast<size_t>(std::count_if(changes.begin(), changes.end(), [k](const Change& c) { return c.kind == k; }));
}

std::string tensor_key(const TensorRecord& t) {
  if (t.status == TensorStatus::kOnlyInB) return t.name + " (only in B)";
  return t.name_b.empty() ? t.name : t.name + " -> " + t.name_b;
}

BaselineDiff compare_to_baseline(const Report& baseline, const std::string& baseline_path, const Report& current,
                                 const std::string& current_path) {
  BaselineDiff d;
  d.baseline_path = baseline_path;
  Differ differ(d);
  std::map<std::string, size_t> old_index, now_index;
  for (size_t i = 0; i < baseline.cases.size(); ++i) old_index.emplace(baseline.cases[i].id, i);
  for (size_t i = 0; i < current.cases.size(); ++i) now_index.emplace(current.cases[i].id, i);
  for (size_t i = 0; i < current.cases.size(); ++i) {
    const Case& now = current.cases[i];
    const auto it = old_index.find(now.id);
    if (it == old_index.end()) {
      differ.new_case(now);
      continue;
    }
    const Case& old = baseline.cases[it->second];
    if (compared(old) && compared(now)) differ.both_compared(old, it->second, baseline_path, now, i, current_path);
    else differ.verdict_change(old, now);
  }
  for (const Case& old : baseline.cases)
    if (!now_index.count(old.id))
      differ.add(ChangeKind::kCaseRemoved, old.id, "", "was " + verdict_text(old), compared(old));
  std::stable_sort(d.changes.begin(), d.changes.end(),
                   [](const Change& a, const Change& b) { return a.kind < b.kind; });
  return d;
}

std::string format_baseline_diff(const BaselineDiff& d) {
  std::string out = "against baseline " + terminal_text(d.baseline_path) + ":\n";
  for (size_t i = 0; i < d.changes.size(); ++i) {
    const Change& c = d.changes[i];
    if (i == 0 || d.changes[i - 1].kind != c.kind)
      out += std::string(change_kind_title(c.kind)) + " (" + std::to_string(d.count(c.kind)) + "):\n";
    out += std::string(c.regression ? "  ! " : "    ") + terminal_text(c.case_id) +
           (c.tensor.empty() ? "" : " / " + terminal_text(c.tensor)) + ": " + terminal_text(c.detail) + "\n";
  }
  if (d.changes.empty()) out += "  no changes\n";
  const size_t regressions = static_cast<size_t>(
      std::count_if(d.changes.begin(), d.changes.end(), [](const Change& c) { return c.regression; }));
  out += d.regressed() ? "baseline: REGRESSION (" + std::to_string(regressions) +
                             " newly failing or no longer compared; marked !)\n"
                       : std::string("baseline: no regression\n");
  return out;
}

}  // namespace bp::harness
