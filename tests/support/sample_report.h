// A report shaped like a sweep's, for the report reader, baseline, HTML and CLI
// tests: two (model, contract, backend) groups of layouts x paths, one case off the
// grid, every tensor status, a mismatch with a ULP histogram and a first divergent
// op, a skipped case, and names that need escaping in every format.
#pragma once
#include <cstdint>
#include <string>

#include "harness/report/report.h"

namespace bp::test {

// Group "qwen3-tiny / v1 / cpu": layouts tp1, tp2 x paths full, decode, prefill,
// all present but tp2/prefill (6 cells, 5 cases); case "tp2-decode" mismatches.
// Group "moe<&>\" / v1 / cuda": ep2 x decode, skipped (1 cell). Case "other" has no
// grid parameters. So 7 grid cells, 7 cases. The grid cases ran 0.125 s, 0.25 s, ...
// (in order), "other" 75.5 s with a peak of kSamplePeakDeviceBytes (1.5 GiB); the
// skipped case has no time and no peak.
inline constexpr int kSampleGridCells = 7;
inline constexpr uint64_t kSamplePeakDeviceBytes = uint64_t{3} << 29;
harness::Report sample_sweep_report();

// The sample's case `id`, for tests that vary one case.
harness::Case& sample_case(harness::Report& r, const std::string& id);

// A compared F32 tensor `name` whose B side differs from A at `bad` elements by
// `ulps` units in the last place.
harness::TensorRecord compared_tensor(const std::string& name, int bad, int ulps);

}  // namespace bp::test
