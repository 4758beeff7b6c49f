#include "harness/engine/dump_diff.h"

#include <algorithm>
#include <map>
#include <set>

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

}  // namespace

Report build_diff(const std::string& a, const std::string& b, const std::vector<std::string>& map) {
  const SafetensorsFile fa = SafetensorsFile::open(a);
  const SafetensorsFile fb = SafetensorsFile::open(b);

  std::map<std::string, std::string> rename;  // A name -> B name
  std::set<std::string> map_targets;
  for (const std::string& m : map) {
    const size_t eq = m.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == m.size())
      throw BadInput("--map", m, "expected OLD=NEW (a tensor of A = a tensor of B)");
    std::string from = m.substr(0, eq), to = m.substr(eq + 1);
    if (!fa.find(from)) throw BadInput(a, from, "--map names a tensor that is not in this file");
    if (!fb.find(to)) throw BadInput(b, to, "--map names a tensor that is not in this file");
    if (rename.count(from)) throw BadInput("--map", m, "tensor " + io::quoted_input(from) + " is mapped twice");
    if (!map_targets.insert(to).second) throw BadInput("--map", m, "tensor " + io::quoted_input(to) + " is a target twice");
    rename.emplace(std::move(from), std::move(to));
  }

  Report r = make_report("diff");
  Case c;
  c.id = "diff";
  c.parameters = {{"a", a}, {"b", b}};
  for (const std::string& m : map) c.parameters["map." + m.substr(0, m.find('='))] = m.substr(m.find('=') + 1);

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
      throw BadInput("--map", bname, "tensor " + io::quoted_input(bname) + " of B is matched twice (by name and by --map)");
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
        throw BadInput(a, ta->name, std::string("dtype ") + io::dtype_name(ta->dtype) +
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

}  // namespace bp::harness
