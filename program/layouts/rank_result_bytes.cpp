#include "program/layouts/rank_result_bytes.h"

#include <cstring>
#include <stdexcept>
#include <type_traits>

namespace bp::layouts {
namespace {

class Writer {
 public:
  template <class T>
  void put(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto* p = reinterpret_cast<const std::byte*>(&v);
    out.insert(out.end(), p, p + sizeof(T));
  }
  template <class T>
  void put(const std::vector<T>& v) {
    put(static_cast<uint64_t>(v.size()));
    const auto* p = reinterpret_cast<const std::byte*>(v.data());
    out.insert(out.end(), p, p + v.size() * sizeof(T));
  }
  void put(const std::string& s) { put(std::vector<char>(s.begin(), s.end())); }
  Bytes out;
};

class Reader {
 public:
  explicit Reader(const Bytes& b) : b_(b) {}
  template <class T>
  void get(T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    std::memcpy(&v, take(sizeof(T)), sizeof(T));
  }
  template <class T>
  void get(std::vector<T>& v) {
    uint64_t n = 0;
    get(n);
    if (n > (b_.size() - at_) / sizeof(T)) throw std::runtime_error("rank result: truncated bytes");
    v.resize(n);
    if (n) std::memcpy(v.data(), take(n * sizeof(T)), n * sizeof(T));
  }
  void get(std::string& s) {
    std::vector<char> c;
    get(c);
    s.assign(c.begin(), c.end());
  }
  bool done() const { return at_ == b_.size(); }

 private:
  const std::byte* take(size_t n) {
    if (n > b_.size() - at_) throw std::runtime_error("rank result: truncated bytes");
    const std::byte* p = b_.data() + at_;
    at_ += n;
    return p;
  }
  const Bytes& b_;
  size_t at_ = 0;
};

}  // namespace

Bytes to_bytes(const RankResult& r) {
  Writer w;
  w.put(r.values);
  w.put(static_cast<uint64_t>(r.grads.size()));
  for (const RankResult::GradBlock& g : r.grads) {
    w.put(g.name);
    for (int64_t v : {g.row0, g.rows, g.col0, g.cols, g.width}) w.put(v);
    w.put(g.data);
  }
  w.put(static_cast<uint64_t>(r.captures.size()));
  for (const RankResult::CaptureBlock& c : r.captures) {
    w.put(c.name);
    for (int64_t v : {c.width, c.col0, c.cols}) w.put(v);
    w.put(c.rows);
    w.put(c.data);
  }
  return std::move(w.out);
}

RankResult rank_result_from_bytes(const Bytes& b) {
  Reader rd(b);
  RankResult r;
  rd.get(r.values);
  uint64_t n = 0;
  rd.get(n);
  for (uint64_t i = 0; i < n; ++i) {
    RankResult::GradBlock& g = r.grads.emplace_back();
    rd.get(g.name);
    for (int64_t* v : {&g.row0, &g.rows, &g.col0, &g.cols, &g.width}) rd.get(*v);
    rd.get(g.data);
  }
  rd.get(n);
  for (uint64_t i = 0; i < n; ++i) {
    RankResult::CaptureBlock& c = r.captures.emplace_back();
    rd.get(c.name);
    for (int64_t* v : {&c.width, &c.col0, &c.cols}) rd.get(*v);
    rd.get(c.rows);
    rd.get(c.data);
  }
  if (!rd.done()) throw std::runtime_error("rank result: trailing bytes");
  return r;
}

}  // namespace bp::layouts
