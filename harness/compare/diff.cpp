#include "harness/compare/diff.h"

#include <algorithm>
#include <cinttypes>
#include <cstring>
#include <map>
#include <set>

#include "harness/exit_codes.h"
#include "harness/io/errors.h"
#include "harness/io/safetensors.h"

namespace bp::harness {

namespace {

using io::BadInput;
using io::DType;
using io::SafetensorsFile;
using io::TensorInfo;

// A's (or B's) tensors in file order: by byte offset, ties (empty tensors) by name.
std::vector<const TensorInfo*> file_order(const SafetensorsFile& f) {
  std::vector<const TensorInfo*> v;
  for (const TensorInfo& t : f.tensors()) v.push_back(&t);
  std::stable_sort(v.begin(), v.end(), [](const TensorInfo* x, const TensorInfo* y) { return x->begin < y->begin; });
  return v;
}

bool cmp_type_of(DType d, CmpType* out) {
  if (d == DType::BF16) return *out = CmpType::BF16, true;
  if (d == DType::F32) return *out = CmpType::F32, true;
  return false;
}


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

}  // namespace

Report build_diff(const DiffOptions& o) {
  const SafetensorsFile fa = SafetensorsFile::open(o.a);
  const SafetensorsFile fb = SafetensorsFile::open(o.b);

  std::map<std::string, std::string> rename;  // A name -> B name
  std::set<std::string> map_targets;
  for (const std::string& m : o.map) {
    const size_t eq = m.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == m.size())
      throw BadInput("--map", m, "expected OLD=NEW (a tensor of A = a tensor of B)");
    std::string from = m.substr(0, eq), to = m.substr(eq + 1);
    if (!fa.find(from)) throw BadInput(o.a, from, "--map names a tensor that is not in this file");
    if (!fb.find(to)) throw BadInput(o.b, to, "--map names a tensor that is not in this file");
    if (rename.count(from)) throw BadInput("--map", m, "tensor '" + from + "' is mapped twice");
    if (!map_targets.insert(to).second) throw BadInput("--map", m, "tensor '" + to + "' is a target twice");
    rename.emplace(std::move(from), std::move(to));
  }

  Report r = make_report("diff");
  Case c;
  c.id = "diff";
  c.parameters = {{"a", o.a}, {"b", o.b}};
  for (const std::string& m : o.map) c.parameters["map." + m.substr(0, m.find('='))] = m.substr(m.find('=') + 1);

  std::set<std::string> used_b;
  for (const TensorInfo* ta : file_order(fa)) {
    TensorRecord rec;
    rec.name = ta->name;
    rec.dtype_a = io::dtype_name(ta->dtype);
    rec.shape_a = ta->shape;
    rec.is_logprob = looks_like_logprob(ta->name);
    const auto it = rename.find(ta->name);
    const std::string bname = it == rename.end() ? ta->name : it->second;
    if (it != rename.end()) rec.name_b = bname;
    const TensorInfo* tb = fb.find(bname);
    if (tb && !used_b.insert(bname).second)
      throw BadInput("--map", bname, "tensor '" + bname + "' of B is matched twice (by name and by --map)");
    if (!tb) {
      rec.status = TensorStatus::kOnlyInA;
    } else {
      rec.dtype_b = io::dtype_name(tb->dtype);
      rec.shape_b = tb->shape;
      CmpType ct;
      if (ta->dtype != tb->dtype) {
        rec.status = TensorStatus::kDtypeMismatch;
      } else if (ta->shape != tb->shape) {
        rec.status = TensorStatus::kShapeMismatch;
      } else if (!cmp_type_of(ta->dtype, &ct)) {
        throw BadInput(o.a, ta->name, std::string("dtype ") + io::dtype_name(ta->dtype) +
                                          " cannot be compared (bitparity compares BF16 and F32)");
      } else {
        rec.metrics = compare_bytes(ct, fa.bytes(*ta).data(), fb.bytes(*tb).data(), ta->numel(), ta->shape);
        rec.metrics->is_logprob = rec.is_logprob;
      }
    }
    c.tensors.push_back(std::move(rec));
  }
  for (const TensorInfo* tb : file_order(fb)) {
    if (used_b.count(tb->name)) continue;
    TensorRecord rec;
    rec.name = tb->name;
    rec.status = TensorStatus::kOnlyInB;
    rec.dtype_b = io::dtype_name(tb->dtype);
    rec.shape_b = tb->shape;
    rec.is_logprob = looks_like_logprob(tb->name);
    c.tensors.push_back(std::move(rec));
  }
  c.settle();
  r.cases.push_back(std::move(c));
  return r;
}

int run_diff(const DiffOptions& o, std::FILE* out, std::FILE* err) {
  Report r;
  try {
    r = build_diff(o);
  } catch (...) {
    return exit_for_read_error("diff", err);
  }
  const Case& c = r.cases.front();

  if (!o.quiet) {
    size_t w = 6;
    auto label = [](const TensorRecord& t) { return t.name_b.empty() ? t.name : t.name + " -> " + t.name_b; };
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
          result = m.bit_identical ? "identical" : "DIFFER";
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
    size_t same = 0, differ = 0, only_a = 0, only_b = 0;
    for (const TensorRecord& t : c.tensors) {
      same += t.matches();
      only_a += t.status == TensorStatus::kOnlyInA;
      only_b += t.status == TensorStatus::kOnlyInB;
      differ += !t.matches() && t.status != TensorStatus::kOnlyInA && t.status != TensorStatus::kOnlyInB;
    }
    // The first differing tensor in file order of A (tensors only in B come last).
    for (const TensorRecord& t : c.tensors) {
      if (t.matches() || t.status == TensorStatus::kOnlyInA || t.status == TensorStatus::kOnlyInB) continue;
      std::fprintf(out, "first differing tensor (file order of A): %s", t.name.c_str());
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
      if (t.status == TensorStatus::kOnlyInA) std::fprintf(out, "only in A: %s\n", t.name.c_str());
    for (const TensorRecord& t : c.tensors)
      if (t.status == TensorStatus::kOnlyInB) std::fprintf(out, "only in B: %s\n", t.name.c_str());
    std::fprintf(out, "diff: %zu tensors: %zu identical, %zu differ, %zu only in A, %zu only in B: %s\n",
                 c.tensors.size(), same, differ, only_a, only_b,
                 c.verdict == Verdict::kExact ? "all identical" : "MISMATCH");
  }

  const ReportPaths paths{o.json, o.csv, o.junit, ""};
  if (const int rc = check_report_paths("diff", paths, err)) return rc;
  if (const int rc = write_reports("diff", r, paths, err)) return rc;
  return c.verdict == Verdict::kExact ? kExitExact : kExitMismatch;
}

}  // namespace bp::harness
