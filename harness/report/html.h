// The human-readable rendering of a report: one self-contained HTML page (inline
// CSS and SVG, no script, no external resource), for `bitparity report --html`.
//   - header: overall verdict, command, status, summary, environment block, NaN policy;
//   - the comparison against a baseline, when given;
//   - per (model, contract, backend) a grid <table class="grid">: layouts as rows,
//     paths as columns, one <td class="cell v-..."> per pair coloured by the verdict
//     of its cases (v-none where no case ran), linking to them; from Case::parameters
//     keys "model", "contract", "backend", "layout", "path" (cases lacking one of
//     them are listed plainly below the grids);
//   - a table of the cases: verdict, run time and peak device memory (a dash for a
//     backend without a device), in human units (duration_text, bytes_text);
//   - per case: its parameters, skip reason or error, the ranks it ran on and the
//     bytes its collectives moved (where it ran on several processes), first
//     divergent op; where it holds captured ops (ops.*: a sweep with --capture ops,
//     bisect, conform), a heat map <table class="heat">, layers as rows and ops as
//     columns in execution order, each cell exact or its largest ULP distance (red,
//     darker with its log2), the first divergent op outlined, and beside it, where the
//     ops have truth errors (schema 6: conform), <table class="heat truth">: each op's
//     ratio of the engine's (A's) mean ulp from the float64 truth to the contract's
//     (B's), green where at most 1, red darker with its log2 above, grey where a side
//     is missing, the numbers in the title, a legend below; a table of its tensors
//     with their metrics; where its tensors have truth errors, <table class="truth">
//     of both sides' max and mean ulp and that ratio; a ULP-distance histogram (inline
//     SVG bars) per mismatching tensor.
// Every text from the report is escaped (names may hold <, &, quotes, control bytes).
#pragma once
#include <string>

#include "harness/report/baseline.h"
#include "harness/report/report.h"

namespace bp::harness {

// `source`: the report file's path, shown in the title. `baseline` may be null.
std::string render_html(const Report& r, const std::string& source, const BaselineDiff* baseline);

// Text/attribute escape for an HTML page or an XML file (the JUnit report): &, <,
// >, " and ' always. HTML keeps newline and tab and turns other control characters
// into U+FFFD; XML writes newline and tab as character references (attribute values
// keep them) and other control characters, which XML 1.0 cannot carry, as '?'.
enum class Markup { kHtml, kXml };
std::string markup_escape(const std::string& s, Markup m);

// markup_escape(s, Markup::kHtml).
std::string html_escape(const std::string& s);

}  // namespace bp::harness
