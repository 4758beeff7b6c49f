// HTML rendering of a report (html.h).
#include "harness/report/html.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <set>

#include "reference/model/model_graph.h"

namespace bp::harness {

namespace {

constexpr const char* kStyle = R"(
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
h1{margin:0 0 .3em}h2{border-bottom:1px solid #ccc;margin-top:1.5em}
table{border-collapse:collapse;margin:.4em 0}
th,td{border:1px solid #ccc;padding:2px 6px;text-align:left;vertical-align:top}
td.num{text-align:right;font-variant-numeric:tabular-nums}
.verdict{display:inline-block;padding:.2em .8em;font-weight:bold;border-radius:3px}
.v-exact{background:#c8e6c9}.v-mismatch{background:#ffcdd2}.v-skipped{background:#e0e0e0}.v-nonfinite{background:#ffe0b2}
.v-error{background:#e57373}.v-none{background:#fff;color:#aaa}
.grid td.cell{min-width:5em;text-align:center}.grid td.cell a{color:inherit}
.interrupted{background:#fff3cd;padding:.3em .6em}.regression{color:#b00020;font-weight:bold}
.env th{font-weight:normal;color:#555}code{font-size:90%}
svg.hist rect.bar{fill:#c62828}svg.hist text{font-size:9px;fill:#444}
table.heat td{width:2.6em;height:1.4em;text-align:center;font-size:11px;padding:0}
table.heat th{font-size:11px;font-weight:normal;writing-mode:vertical-rl}table.heat th.row{writing-mode:initial}
table.heat td.exact{background:#c8e6c9}table.heat td.first{outline:3px solid #000;outline-offset:-3px}
.heats{display:flex;flex-wrap:wrap;gap:0 2em;align-items:flex-start}.heats figure{margin:.4em 0}
td.better{background:#c8e6c9}td.unmeasured{background:#e0e0e0}
table.legend td{font-size:11px;padding:0 .6em;text-align:center}
)";

std::string verdict_span(Verdict v) {
  return std::string("<span class=\"verdict v-") + verdict_name(v) + "\">" + verdict_name(v) + "</span>";
}

std::string anchor(size_t case_index) { return "case-" + std::to_string(case_index); }

// --- header ------------------------------------------------------------------

std::string environment_table(const Environment& e) {
  const std::pair<const char*, std::optional<std::string>> rows[] = {
      {"git commit", e.git_commit + (e.git_dirty.value_or(false) ? " (dirty)" : "")},
      {"bitparity", e.bitparity_version},
      {"compiler", e.compiler_id + " " + e.compiler_version},
      {"flags", e.compiler_flags},
      {"build type", e.build_type},
      {"contract", e.contract_name ? *e.contract_name + " (knob hash " + e.contract_knob_hash.value_or("?") + ")"
                                   : std::optional<std::string>()},
      {"CPU", e.cpu_model},
      {"GPU", e.gpu_name},
      {"GPU driver", e.gpu_driver},
      {"CUDA runtime", e.cuda_version},
      {"NCCL", e.nccl_version},
  };
  std::string h = "<table class=\"env\">\n";
  for (const auto& [k, v] : rows)
    h += std::string("<tr><th>") + k + "</th><td>" + (v ? html_escape(*v) : "<i>n/a</i>") + "</td></tr>\n";
  for (const WeightsOrigin& w : e.weights)
    h += "<tr><th>weights of " + html_escape(w.model) + "</th><td>" + html_escape(weights_text(w, true)) + "</td></tr>\n";
  return h + "</table>\n";
}

std::string header(const Report& r, const std::string& source) {
  std::string h = "<header>\n<h1>bitparity report</h1>\n<p>" + verdict_span(r.overall()) + " <code>" +
                  html_escape(source) + "</code>: command <code>" + html_escape(r.command) + "</code>, created " +
                  html_escape(r.created_utc) + "; " + std::to_string(r.cases.size()) + " cases: " + r.counts_text() +
                  "</p>\n";
  if (r.interrupted) h += "<p class=\"interrupted\">The run was interrupted: only the finished cases are listed.</p>\n";
  h += environment_table(r.environment);
  h += std::string("<p>NaN policy <code>") + kNanPolicy + "</code>: " + html_escape(kNanPolicyText) + ".</p>\n";
  return h + "</header>\n";
}

// --- baseline ----------------------------------------------------------------

std::string baseline_section(const BaselineDiff& d) {
  std::string h = "<section id=\"baseline\">\n<h2>Against baseline <code>" + html_escape(d.baseline_path) + "</code></h2>\n";
  h += d.regressed() ? "<p class=\"regression\">Regression: something newly fails or is no longer compared (marked !).</p>\n"
                     : "<p>No regression.</p>\n";
  if (d.changes.empty()) return h + "<p>No changes.</p>\n</section>\n";
  h += "<table class=\"changes\"><tr><th></th><th>change</th><th>case</th><th>tensor</th><th>detail</th></tr>\n";
  for (const Change& c : d.changes)
    h += std::string("<tr") + (c.regression ? " class=\"regression\"" : "") + "><td>" + (c.regression ? "!" : "") +
         "</td><td>" + change_kind_title(c.kind) + "</td><td>" + html_escape(c.case_id) + "</td><td>" +
         html_escape(c.tensor) + "</td><td>" + html_escape(c.detail) + "</td></tr>\n";
  return h + "</table>\n</section>\n";
}

// --- grids -------------------------------------------------------------------

// Values in order of first appearance (a sweep's order is meaningful: tp1, tp2, tp4).
struct Ordered {
  std::vector<std::string> values;
  void add(const std::string& v) {
    if (std::find(values.begin(), values.end(), v) == values.end()) values.push_back(v);
  }
};

struct Group {
  std::string model, contract, backend;
  Ordered layouts, paths;
  std::map<std::pair<std::string, std::string>, std::vector<size_t>> cells;  // (layout, path) -> case indices
};

const char* const kGridKeys[] = {"model", "contract", "backend", "layout", "path"};

bool on_grid(const Case& c) {
  return std::all_of(std::begin(kGridKeys), std::end(kGridKeys), [&c](const char* k) { return c.parameters.count(k) > 0; });
}

std::vector<Group> groups_of(const Report& r) {
  std::vector<Group> groups;
  for (size_t i = 0; i < r.cases.size(); ++i) {
    const auto& p = r.cases[i].parameters;
    if (!on_grid(r.cases[i])) continue;
    auto it = std::find_if(groups.begin(), groups.end(), [&p](const Group& g) {
      return g.model == p.at("model") && g.contract == p.at("contract") && g.backend == p.at("backend");
    });
    if (it == groups.end()) it = groups.insert(groups.end(), Group{p.at("model"), p.at("contract"), p.at("backend"), {}, {}, {}});
    it->layouts.add(p.at("layout"));
    it->paths.add(p.at("path"));
    it->cells[{p.at("layout"), p.at("path")}].push_back(i);
  }
  return groups;
}

// A cell's verdict is that of its cases taken together (as Report::overall).
std::string grid_cell(const Report& r, const std::vector<size_t>* cases) {
  if (!cases) return "<td class=\"cell v-none\">&ndash;</td>";
  Report part;
  for (size_t i : *cases) part.cases.push_back(r.cases[i]);
  const Verdict v = part.overall();
  std::string h = std::string("<td class=\"cell v-") + verdict_name(v) + "\">";
  for (size_t k = 0; k < cases->size(); ++k) {
    const Case& c = r.cases[(*cases)[k]];
    h += std::string(k ? " " : "") + "<a href=\"#" + anchor((*cases)[k]) + "\" title=\"" + html_escape(c.id) + "\">" +
         verdict_name(c.verdict) + "</a>";
  }
  return h + "</td>";
}

std::string grid_section(const Report& r) {
  const std::vector<Group> groups = groups_of(r);
  std::string h = "<section id=\"grids\">\n<h2>Layouts &times; paths</h2>\n";
  if (groups.empty()) h += "<p>No case names a model, contract, backend, layout and path.</p>\n";
  for (const Group& g : groups) {
    h += "<h3>" + html_escape(g.model) + " &middot; " + html_escape(g.contract) + " &middot; " + html_escape(g.backend) +
         "</h3>\n<table class=\"grid\" data-rows=\"" + std::to_string(g.layouts.values.size()) + "\" data-columns=\"" +
         std::to_string(g.paths.values.size()) + "\">\n<tr><th>layout \\ path</th>";
    for (const std::string& p : g.paths.values) h += "<th>" + html_escape(p) + "</th>";
    h += "</tr>\n";
    for (const std::string& l : g.layouts.values) {
      h += "<tr><th>" + html_escape(l) + "</th>";
      for (const std::string& p : g.paths.values) {
        const auto it = g.cells.find({l, p});
        h += grid_cell(r, it == g.cells.end() ? nullptr : &it->second);
      }
      h += "</tr>\n";
    }
    h += "</table>\n";
  }
  std::string plain;
  for (size_t i = 0; i < r.cases.size(); ++i)
    if (!on_grid(r.cases[i]))
      plain += "<li><a href=\"#" + anchor(i) + "\">" + html_escape(r.cases[i].id) + "</a> " +
               verdict_span(r.cases[i].verdict) + "</li>\n";
  if (!plain.empty()) h += "<h3>Other cases</h3>\n<ul class=\"plain\">\n" + plain + "</ul>\n";
  return h + "</section>\n";
}

// --- cases -------------------------------------------------------------------

// Bars of the mismatch-only ULP histogram (compare/compare.h bins), height linear in the count.
std::string histogram_svg(const TensorMetrics& m) {
  constexpr int kBar = 10, kGap = 2, kHeight = 80, kLabels = 14;
  const uint64_t top = *std::max_element(m.ulp_histogram.begin(), m.ulp_histogram.end());
  const int width = static_cast<int>(kUlpBins) * (kBar + kGap);
  std::string h = "<svg class=\"hist\" width=\"" + std::to_string(width) + "\" height=\"" +
                  std::to_string(kHeight + kLabels) + "\" role=\"img\" aria-label=\"ULP distance histogram\">\n";
  for (size_t b = 0; b < kUlpBins; ++b) {
    const uint64_t n = m.ulp_histogram[b];
    const int x = static_cast<int>(b) * (kBar + kGap);
    const int bar = n == 0 ? 0 : std::max(1, static_cast<int>(std::lround(static_cast<double>(n) * kHeight / static_cast<double>(top))));
    h += "<rect class=\"bar\" x=\"" + std::to_string(x) + "\" y=\"" + std::to_string(kHeight - bar) + "\" width=\"" +
         std::to_string(kBar) + "\" height=\"" + std::to_string(bar) + "\"><title>ULP " + html_escape(ulp_bin_label(b)) +
         ": " + std::to_string(n) + "</title></rect>";
    if (b % 8 == 0 || b == kUlpBinNan)
      h += "<text x=\"" + std::to_string(x) + "\" y=\"" + std::to_string(kHeight + kLabels - 3) + "\">" +
           (b == 0 ? "1" : b == kUlpBinNan ? "NaN" : "2^" + std::to_string(b)) + "</text>";
    h += "\n";
  }
  return h + "</svg>\n";
}

// A captured op's place in the heat map: its layer (-1 for the model's own ops:
// embed, final_norm, logits) and its op name; nullopt for other tensors.
std::optional<std::pair<int64_t, std::string>> op_cell(const std::string& tensor) {
  if (tensor.rfind("ops.", 0) != 0) return std::nullopt;
  const std::string op = tensor.substr(4);
  if (const auto lo = graph::split_layer_capture(op)) return std::pair<int64_t, std::string>{lo->first, lo->second};
  if (op.rfind("layers.", 0) == 0) return std::nullopt;  // "layers.x.y" that is no layer's op
  return std::pair<int64_t, std::string>{-1, op};
}

// One cell: exact (green), or the largest ULP distance, red darker with its log2
// (1 ulp light, 2^20 and beyond darkest), the first divergent op outlined.
std::string heat_cell(const TensorRecord& t, bool first) {
  const std::string cls = std::string(t.matches() ? "exact" : "off") + (first ? " first" : "");
  std::string title = t.name + ": ";
  std::string text, style;
  if (t.matches()) {
    title += "exact";
  } else if (!t.metrics) {
    title += tensor_status_name(t.status);
    text = "&ndash;";
    style = " style=\"background:#e0e0e0\"";
  } else {
    const TensorMetrics& m = *t.metrics;
    title += std::to_string(m.mismatches) + " of " + std::to_string(m.elements) + " differ, max " +
             metric_text(m.max_ulp_diff, "%.0f") + " ulp";
    const double bits = std::isfinite(m.max_ulp_diff) ? std::log2(std::max(1.0, m.max_ulp_diff)) : 20.0;
    text = std::isfinite(m.max_ulp_diff) && m.max_ulp_diff < 1000 ? metric_text(m.max_ulp_diff, "%.0f")
                                                                   : "2^" + std::to_string(std::lround(bits));
    style = " style=\"background:hsl(0,70%," + std::to_string(85 - std::lround(2 * std::min(bits, 20.0))) + "%)\"";
  }
  return "<td class=\"" + cls + "\"" + style + " title=\"" + html_escape(title) + "\">" + text + "</td>";
}

// The case's captured ops as a layers × ops grid in execution order (graph::kOps): a
// row per layer and one (layer -1) for the model's own ops.
struct OpGrid {
  std::map<std::pair<int64_t, std::string>, const TensorRecord*> cells;
  std::set<int64_t> layers;
  std::vector<std::string> columns;
};

OpGrid op_grid(const Case& c) {
  OpGrid g;
  std::set<std::string> ops;
  for (const TensorRecord& t : c.tensors)
    if (const auto cell = op_cell(t.name)) {
      g.cells[*cell] = &t;
      g.layers.insert(cell->first);
      ops.insert(cell->second);
    }
  for (const graph::OpRow& row : graph::kOps)
    if (ops.erase(row.name)) g.columns.push_back(row.name);
  g.columns.insert(g.columns.end(), ops.begin(), ops.end());  // names the graph does not know, after its own
  return g;
}

// The grid as <table class="`cls`">, each captured op's cell drawn by `cell`.
std::string op_table(const OpGrid& g, const char* cls, const std::function<std::string(const TensorRecord&)>& cell) {
  std::string h = std::string("<table class=\"") + cls + "\"><tr><th class=\"row\"></th>";
  for (const std::string& col : g.columns) h += "<th>" + html_escape(col) + "</th>";
  h += "</tr>\n";
  for (const int64_t layer : g.layers) {
    h += "<tr><th class=\"row\">" + (layer < 0 ? std::string("model") : "layer " + std::to_string(layer)) + "</th>";
    for (const std::string& col : g.columns) {
      const auto it = g.cells.find({layer, col});
      h += it == g.cells.end() ? "<td></td>" : cell(*it->second);
    }
    h += "</tr>\n";
  }
  return h + "</table>";
}

// A ratio of A's error from the truth to B's as a cell: its class (better: A is as
// close or closer; worse: farther, red darker with the ratio's log2, 256 and beyond
// darkest; unmeasured: a side is missing), its style and its text.
struct RatioLook {
  std::string cls, style, text;
};
RatioLook ratio_look(std::optional<double> ratio) {
  if (!ratio) return {"unmeasured", "", "&ndash;"};
  const double r = *ratio;
  const std::string text = !std::isfinite(r) ? "inf"
                           : r < 999.5       ? metric_text(r, "%.3g")
                                             : "2^" + std::to_string(std::lround(std::log2(r)));
  if (r <= 1) return {"better", "", text};
  const long lightness = 85 - std::lround(5 * std::min(std::log2(r), 8.0));
  return {"worse", " style=\"background:hsl(0,70%," + std::to_string(lightness) + "%)\"", text};
}

std::string truth_cell(const TensorRecord& t) {
  const std::optional<double> ratio = t.truth_ratio();
  const RatioLook look = ratio_look(ratio);
  const std::string title = t.name + ": engine (A) " + truth_error_text(t.truth_error_a) + "; contract (B) " +
                            truth_error_text(t.truth_error_b) + (ratio ? "; ratio " + look.text : "");
  return "<td class=\"" + look.cls + "\"" + look.style + " title=\"" + html_escape(title) + "\">" + look.text + "</td>";
}

std::string truth_legend() {
  std::string h = "<table class=\"legend\"><tr>";
  for (const double r : {1.0, 2.0, 4.0, 16.0, 256.0}) {
    const RatioLook look = ratio_look(r);
    const std::string text = r == 1 ? "&le; 1" : r == 256 ? "&ge; 256" : look.text;
    h += "<td class=\"" + look.cls + "\"" + look.style + ">" + text + "</td>";
  }
  return h + "</tr></table>\n";
}

// The heat map of the case's captured ops, and beside it, where they have truth errors,
// its twin of each op's engine / contract ratio of mean ulp from the float64 truth; ""
// for a case without captured ops.
std::string heat_maps(const Case& c) {
  const OpGrid g = op_grid(c);
  if (g.cells.empty()) return "";
  const std::string first = c.first_divergent_op ? "ops." + *c.first_divergent_op : "";
  std::string h = "<div class=\"heats\">\n<figure><figcaption>Captured ops, layer by layer: exact, or the largest ULP "
                  "distance</figcaption>\n" +
                  op_table(g, "heat", [&first](const TensorRecord& t) { return heat_cell(t, t.name == first); }) +
                  "</figure>\n";
  if (std::any_of(g.cells.begin(), g.cells.end(), [](const auto& cell) { return cell.second->has_truth_error(); }))
    h += "<figure><figcaption>Error against float64 truth, engine / contract (mean ulp ratio)</figcaption>\n" +
         op_table(g, "heat truth", truth_cell) + "\n" + truth_legend() + "</figure>\n";
  return h + "</div>\n";
}

// Each side's max and mean ulp from the float64 truth, per tensor that has them, and A's
// mean over B's; "" for a case without truth errors.
std::string truth_table(const Case& c) {
  auto side = [](const std::optional<TruthError>& e) {
    if (!e) return std::string("<td class=\"num\">&ndash;</td><td class=\"num\">&ndash;</td>");
    return "<td class=\"num\">" + metric_text(e->max_ulp, "%.6g") + "</td><td class=\"num\">" +
           metric_text(e->mean_ulp, "%.6g") + "</td>";
  };
  std::string rows;
  for (const TensorRecord& t : c.tensors) {
    if (!t.has_truth_error()) continue;
    const RatioLook look = ratio_look(t.truth_ratio());
    rows += "<tr><td>" + html_escape(t.name) + "</td>" + side(t.truth_error_a) + side(t.truth_error_b) +
            "<td class=\"num " + look.cls + "\"" + look.style + ">" + look.text + "</td></tr>\n";
  }
  if (rows.empty()) return "";
  return "<figure><figcaption>Error against the float64 truth of each op on the same inputs, in ulps of its "
         "dtype</figcaption>\n<table class=\"truth\"><tr><th>tensor</th><th>engine (A) max</th><th>engine (A) "
         "mean</th><th>contract (B) max</th><th>contract (B) mean</th><th>engine / contract (mean)</th></tr>\n" +
         rows + "</table></figure>\n";
}

std::string shape_text(const std::optional<std::vector<uint64_t>>& s) {
  if (!s) return "";
  std::string t = "[";
  for (size_t i = 0; i < s->size(); ++i) t += (i ? "," : "") + std::to_string((*s)[i]);
  return t + "]";
}

std::string tensor_row(const TensorRecord& t) {
  std::string h = std::string("<tr class=\"v-") + (t.matches() ? "exact" : "mismatch") + "\"><td>" + html_escape(t.name) +
                  (t.name_b.empty() ? "" : " &rarr; " + html_escape(t.name_b)) + "</td><td>" +
                  tensor_status_name(t.status) + "</td><td>" +
                  html_escape(t.dtype_a.empty() ? t.dtype_b : t.dtype_a) + "</td><td>" +
                  html_escape(shape_text(t.shape_a ? t.shape_a : t.shape_b)) + "</td>";
  if (!t.metrics) return h + "<td colspan=\"6\"></td></tr>\n";
  const TensorMetrics& m = *t.metrics;
  return h + "<td class=\"num\">" + std::to_string(m.mismatches) + " / " + std::to_string(m.elements) +
         "</td><td class=\"num\">" + metric_text(m.max_ulp_diff, "%.0f") + "</td><td class=\"num\">" +
         metric_text(m.max_abs_diff, "%.6g") + "</td><td class=\"num\">" + metric_text(m.mean_abs_diff, "%.6g") +
         "</td><td class=\"num\">" +
         (m.first_mismatch < 0 ? std::string("&ndash;") : std::to_string(m.first_mismatch)) + "</td><td class=\"num\">" +
         std::to_string(m.nan_a) + "/" + std::to_string(m.nan_b) + " NaN, " + std::to_string(m.inf_a) + "/" +
         std::to_string(m.inf_b) + " Inf</td></tr>\n";
}

// "Ran on 2 ranks; 3.1 MiB moved in 42 collectives: all_gather 30 calls, 2 MiB; ...";
// "" for a case with neither (one process).
std::string communication_line(const Case& c) {
  std::string s = c.ranks ? "Ran on " + std::to_string(*c.ranks) + (*c.ranks == 1 ? " rank" : " ranks") : "";
  if (!c.communication.empty()) {
    s += (s.empty() ? "" : "; ") + communication_text(c.communication) + ":";
    for (size_t i = 0; i < c.communication.size(); ++i) {
      const CollectiveTraffic& t = c.communication[i];
      s += (i ? "; " : " ") + t.collective + " " + std::to_string(t.calls) + (t.calls == 1 ? " call, " : " calls, ") +
           bytes_text(t.bytes);
    }
  }
  return s.empty() ? "" : "<p class=\"communication\">" + html_escape(s) + "</p>\n";
}

std::string case_section(const Case& c, size_t index) {
  std::string h = "<section class=\"case\" id=\"" + anchor(index) + "\">\n<h3>" + html_escape(c.id) + " " +
                  verdict_span(c.verdict) + "</h3>\n";
  if (!c.parameters.empty()) {
    h += "<p class=\"params\">";
    for (const auto& [k, v] : c.parameters) h += "<code>" + html_escape(k) + "=" + html_escape(v) + "</code> ";
    h += "</p>\n";
  }
  if (c.verdict == Verdict::kSkipped) h += "<p>Skipped: " + html_escape(c.skip_reason) + "</p>\n";
  if (c.verdict == Verdict::kError) h += "<p class=\"error\">Error: " + html_escape(c.error) + "</p>\n";
  h += communication_line(c);
  if (c.first_divergent_op) h += "<p>First divergent op: <code>" + html_escape(*c.first_divergent_op) + "</code></p>\n";
  if (c.tensors.empty()) return h + "</section>\n";
  h += heat_maps(c);
  h += "<table class=\"tensors\"><tr><th>tensor</th><th>status</th><th>dtype</th><th>shape</th><th>mismatches</th>"
       "<th>max ULP</th><th>max |diff|</th><th>mean |diff|</th><th>first</th><th>NaN/Inf (A/B)</th></tr>\n";
  for (const TensorRecord& t : c.tensors) h += tensor_row(t);
  h += "</table>\n" + truth_table(c);
  for (const TensorRecord& t : c.tensors)
    if (t.metrics && !t.metrics->ulp_histogram.empty())
      h += "<figure><figcaption>ULP distances of the " + std::to_string(t.metrics->mismatches) +
           " mismatching elements of <code>" + html_escape(t.name) + "</code></figcaption>\n" +
           histogram_svg(*t.metrics) + "</figure>\n";
  return h + "</section>\n";
}

// One row per case: its verdict, run time and peak device memory, in human units
// (the exact numbers on hover), linking to its section.
std::string case_index(const Report& r) {
  std::string h = "<table class=\"cases\"><tr><th>case</th><th>verdict</th><th>time</th>"
                  "<th>peak device memory</th></tr>\n";
  for (size_t i = 0; i < r.cases.size(); ++i) {
    const Case& c = r.cases[i];
    const std::string peak = c.peak_device_bytes ? "<td class=\"num\" title=\"" + std::to_string(*c.peak_device_bytes) +
                                                       " bytes\">" + bytes_text(*c.peak_device_bytes) + "</td>"
                                                 : std::string("<td class=\"num\">&ndash;</td>");
    h += "<tr><td><a href=\"#" + anchor(i) + "\">" + html_escape(c.id) + "</a></td><td>" + verdict_span(c.verdict) +
         "</td><td class=\"num\" title=\"" + metric_text(c.seconds, "%.6f") + " s\">" + duration_text(c.seconds) +
         "</td>" + peak + "</tr>\n";
  }
  return h + "</table>\n";
}

}  // namespace

std::string markup_escape(const std::string& s, Markup m) {
  const bool html = m == Markup::kHtml;
  std::string o;
  o.reserve(s.size());
  for (char ch : s) {
    const unsigned char c = static_cast<unsigned char>(ch);
    switch (ch) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      case '\'': o += html ? "&#39;" : "&apos;"; break;
      case '\n': o += html ? "\n" : "&#10;"; break;
      case '\t': o += html ? "\t" : "&#9;"; break;
      default:
        if (c < 0x20 || c == 0x7f) o += html ? "\xEF\xBF\xBD" : "?";  // U+FFFD in HTML
        else o += ch;
    }
  }
  return o;
}

std::string html_escape(const std::string& s) { return markup_escape(s, Markup::kHtml); }

std::string render_html(const Report& r, const std::string& source, const BaselineDiff* baseline) {
  std::string h = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
                  "<link rel=\"icon\" href=\"data:,\">\n<title>bitparity report: " +
                  std::string(verdict_name(r.overall())) + " &ndash; " + html_escape(source) + "</title>\n<style>" +
                  kStyle + "</style>\n</head>\n<body>\n";
  h += header(r, source);
  if (baseline) h += baseline_section(*baseline);
  h += grid_section(r);
  h += "<section id=\"cases\">\n<h2>Cases</h2>\n" + case_index(r);
  for (size_t i = 0; i < r.cases.size(); ++i) h += case_section(r.cases[i], i);
  return h + "</section>\n</body>\n</html>\n";
}

}  // namespace bp::harness
