// `bitparity diff A.safetensors B.safetensors`: the comparison of two dumps
// (engine/dump_diff.h) printed as a table, its reports, and the exit code.
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "harness/cli/common.h"
#include "harness/engine/dump_diff.h"
#include "harness/exit_codes.h"
#include "harness/io/safetensors.h"

namespace bp::harness {

namespace {

using io::DType;
using io::SafetensorsFile;
using io::TensorInfo;

struct DiffOptions {
  std::string a, b;
  std::vector<std::string> map;  // "nameInA=nameInB"
  std::string json, csv, junit;  // report paths ("" = none)
  bool quiet = false, strict = false;
};

// One element's bits and value, for the "first difference" line.
std::string element_text(const SafetensorsFile& f, const TensorInfo& t, uint64_t i) {
  const auto bytes = f.bytes(t);
  char buf[96];
  if (t.dtype == DType::BF16) {
    uint16_t u;
    std::memcpy(&u, bytes.data() + 2 * i, 2);
    std::snprintf(buf, sizeof buf, "0x%04x (%.9g)", u, static_cast<double>(widen(bf16{u})));
  } else {
    uint32_t u;
    std::memcpy(&u, bytes.data() + 4 * i, 4);
    std::snprintf(buf, sizeof buf, "0x%08x (%.9g)", u, static_cast<double>(float_of(u)));
  }
  return buf;
}

// Prints the table (unless quiet) and writes the requested reports. Exit code: 0
// all identical, 1 a mismatch or a tensor present on one side only, 2 bad input or
// an unwritable report path (earlier reports are left untouched).
int diff(const DiffOptions& o) {
  const ReportPaths paths{o.json, o.csv, o.junit, ""};
  if (const int rc = check_report_paths("diff", paths, {o.a, o.b}, stderr)) return rc;
  Report r;
  try {
    r = build_diff(o.a, o.b, o.map);
  } catch (...) {
    return exit_for_read_error("diff", stderr);
  }
  const Case& c = r.cases.front();

  if (!o.quiet) {
    std::FILE* const out = text_stream({o.json, o.csv, o.junit});
    size_t w = 6;
    auto label = [](const TensorRecord& t) {
      return terminal_text(t.name_b.empty() ? t.name : t.name + " -> " + t.name_b);
    };
    for (const TensorRecord& t : c.tensors) w = std::max(w, std::min<size_t>(label(t).size(), 60));
    std::fprintf(out, "%-*s  %-5s %-14s %-10s %12s %10s %10s %10s %10s\n", static_cast<int>(w), "tensor", "dtype",
                 "shape", "result", "mismatches", "max_ulp", "max_abs", "mean_abs", "first");
    for (const TensorRecord& t : c.tensors) {
      const std::string dtype = t.dtype_a.empty() ? t.dtype_b : t.dtype_a;
      const std::string shape = t.shape_a ? io::shape_str(*t.shape_a) : (t.shape_b ? io::shape_str(*t.shape_b) : "");
      std::string result, mism, ulp, mabs, mean, first;
      switch (t.status) {
        case TensorStatus::kOnlyInA: result = "only-in-A"; break;
        case TensorStatus::kOnlyInB: result = "only-in-B"; break;
        case TensorStatus::kDtypeMismatch: result = "dtype-diff"; break;
        case TensorStatus::kShapeMismatch: result = "shape-diff"; break;
        case TensorStatus::kCompared: {
          const TensorMetrics& m = *t.metrics;
          result = t.nonfinite() ? "NONFINITE" : m.bit_identical ? "identical" : "DIFFER";
          mism = std::to_string(m.mismatches);
          ulp = metric_text(m.max_ulp_diff, "%.0f");
          mabs = metric_text(m.max_abs_diff, "%.3g");
          mean = metric_text(m.mean_abs_diff, "%.3g");
          first = m.first_mismatch < 0 ? "-" : std::to_string(m.first_mismatch);
        }
      }
      const char* fmt = "%-*s  %-5s %-14s %-10s %12s %10s %10s %10s %10s";
      const std::string name = label(t);
      const int n = std::snprintf(nullptr, 0, fmt, static_cast<int>(w), name.c_str(), dtype.c_str(), shape.c_str(),
                                  result.c_str(), mism.c_str(), ulp.c_str(), mabs.c_str(), mean.c_str(), first.c_str());
      std::string text(static_cast<size_t>(std::max(n, 0)), '\0');
      std::snprintf(text.data(), text.size() + 1, fmt, static_cast<int>(w), name.c_str(), dtype.c_str(), shape.c_str(),
                    result.c_str(), mism.c_str(), ulp.c_str(), mabs.c_str(), mean.c_str(), first.c_str());
      while (!text.empty() && text.back() == ' ') text.pop_back();
      std::fprintf(out, "%s\n", text.c_str());
    }
    size_t same = 0, nonfinite = 0, differ = 0, only_a = 0, only_b = 0;
    for (const TensorRecord& t : c.tensors) {
      same += t.matches() && !t.nonfinite();
      nonfinite += t.nonfinite();
      only_a += t.status == TensorStatus::kOnlyInA;
      only_b += t.status == TensorStatus::kOnlyInB;
      differ += !t.matches() && t.status != TensorStatus::kOnlyInA && t.status != TensorStatus::kOnlyInB;
    }
    // The first differing tensor in file order of A (tensors only in B come last).
    for (const TensorRecord& t : c.tensors) {
      if (t.matches() || t.status == TensorStatus::kOnlyInA || t.status == TensorStatus::kOnlyInB) continue;
      std::fprintf(out, "first differing tensor (file order of A): %s", terminal_text(t.name).c_str());
      if (t.status == TensorStatus::kCompared) {
        const SafetensorsFile fa = SafetensorsFile::open(o.a), fb = SafetensorsFile::open(o.b);
        const uint64_t i = static_cast<uint64_t>(t.metrics->first_mismatch);
        std::fprintf(out, ", element %" PRIu64 ": A %s, B %s\n", i, element_text(fa, *fa.find(t.name), i).c_str(),
                     element_text(fb, *fb.find(t.name_b.empty() ? t.name : t.name_b), i).c_str());
      } else {
        std::fprintf(out, " (%s)\n", tensor_status_name(t.status));
      }
      break;
    }
    for (const TensorRecord& t : c.tensors)
      if (t.status == TensorStatus::kOnlyInA) std::fprintf(out, "only in A: %s\n", terminal_text(t.name).c_str());
    for (const TensorRecord& t : c.tensors)
      if (t.status == TensorStatus::kOnlyInB) std::fprintf(out, "only in B: %s\n", terminal_text(t.name).c_str());
    std::fprintf(out, "diff: %zu tensors: %zu identical, %zu nonfinite, %zu differ, %zu only in A, %zu only in B: %s\n",
                 c.tensors.size(), same, nonfinite, differ, only_a, only_b,
                 c.verdict == Verdict::kExact       ? "all identical"
                 : c.verdict == Verdict::kNonFinite ? "identical, but NON-FINITE (matching NaN/Inf prove nothing)"
                                                    : "MISMATCH");
  }

  if (const int rc = write_reports("diff", r, paths, stderr)) return rc;
  if (c.verdict == Verdict::kNonFinite) return nonfinite_exit("diff", r, o.strict, stderr);
  return c.verdict == Verdict::kExact ? kExitExact : kExitMismatch;
}

}  // namespace

Subcommand add_diff_command(CLI::App& app) {
  auto o = std::make_shared<DiffOptions>();
  CLI::App* sub = app.add_subcommand(
      "diff",
      "compare two safetensors dumps tensor by tensor, matched by name; exit 0 all identical (or identical but "
      "non-finite, with a warning), 1 a difference or a tensor on one side only (or, with --strict, a non-finite "
      "match), 2 bad input");
  sub->add_option("A", o->a, "first dump (.safetensors)")->required();
  sub->add_option("B", o->b, "second dump (.safetensors)")->required();
  sub->add_option("--map", o->map, "OLD=NEW: tensor OLD of A is tensor NEW of B (repeatable)");
  sub->add_option("--json", o->json, "write a JSON report (reports/schema/report.schema.json); '-': stdout");
  sub->add_option("--csv", o->csv, "write a CSV report (one row per tensor); '-': stdout");
  sub->add_option("--junit", o->junit, "write a JUnit XML report; '-': stdout");
  sub->add_flag("--quiet,-q", o->quiet, "print nothing but errors (and non-finite warnings)");
  sub->add_flag("--strict", o->strict, kStrictHelp);
  return {sub, [o] { return diff(*o); }};
}

}  // namespace bp::harness
