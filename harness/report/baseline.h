// A report against a baseline report (`bitparity report R --baseline OLD`): cases
// matched by id, tensors within a case by key (tensor_key), each difference
// classified. A regression is something newly failing (a tensor or case that
// matched, or was not there or skipped, and now mismatches or is a non-finite
// match, TensorRecord::nonfinite; a case that now fails with an error, whatever it
// was) or a case that was compared (neither skipped nor an error) in the baseline
// and is gone now. A case's seconds, peak_device_bytes, ranks and communication are
// measurements, not results: they never make a change.
#pragma once
#include <string>
#include <vector>

#include "harness/report/report.h"

namespace bp::harness {

enum class ChangeKind {
  kNewlyFailing,    // exact (or new, or skipped) -> mismatch or nonfinite; anything else -> error
  kCaseRemoved,     // in the baseline, not in the report
  kTensorRemoved,   // in the baseline's case, not in the report's
  kNewlyPassing,    // mismatch, nonfinite or error -> exact
  kMetricsChanged,  // mismatch -> mismatch with other mismatches / max_ulp_diff / max_abs_diff / status;
                    // error -> error with another message; error -> mismatch or nonfinite
  kCaseAdded,       // not in the baseline (and not failing)
  kTensorAdded,     // not in the baseline's case (and matching)
  kSkipChanged,     // skipped <-> exact, or mismatch, nonfinite or error -> skipped
};
const char* change_kind_title(ChangeKind k);  // "newly failing", ...

struct Change {
  ChangeKind kind;
  std::string case_id;
  std::string tensor;  // tensor_key; "" for a whole case
  std::string detail;  // e.g. "mismatches 3 -> 5, max_ulp_diff 2 -> 8"
  bool regression = false;
};

struct BaselineDiff {
  std::string baseline_path;
  std::vector<Change> changes;  // grouped by kind (enum order), then report order
  bool regressed() const;
  size_t count(ChangeKind k) const;
};

// How a tensor is matched across reports: its name; "A -> B" when renamed (--map);
// "name (only in B)" for a tensor only in B, which can share its name with a
// renamed tensor of A.
std::string tensor_key(const TensorRecord& t);

// Throws bp::io::BadInput(path of the report at fault, "cases[i].tensors", ...) when
// one case holds two tensors with one key (matching would be ambiguous).
BaselineDiff compare_to_baseline(const Report& baseline, const std::string& baseline_path, const Report& current,
                                 const std::string& current_path);

// The readable summary `bitparity report --baseline` prints: one section per kind
// that occurs, then one verdict line (names escaped for a terminal: terminal_text).
std::string format_baseline_diff(const BaselineDiff& d);

}  // namespace bp::harness
