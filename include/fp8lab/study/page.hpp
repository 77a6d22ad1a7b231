// A study's page: the sweep's Markdown template (the sweep file's `page`) with its
// placeholders filled from the report, so that every number on the page comes from the
// store. `fp8lab report` writes it as <out>/README.md. The placeholders (docs/experiments.md,
// "Pages"):
//   {{commands}}      the sweep and report commands, as a sh block
//   {{runs}}          the sweep's number of runs
//   {{table}}         the report's Markdown table (table.md)
//   {{table:METRIC}}  the table of an `also` metric
//   {{figure:FILE}}   a [[plot]]'s PNG, with its title and a link to its SVG
//   {{value:POINT}}   a point's "mean ± sd" as the table gives it; POINT is var=value[,var=value]
//                     and must name exactly one point (a value with commas is read whole
//                     where a point has it)
//   {{p:POINT}}       that point's p-value against the baseline
//   {{scale:POINT}}   its mean log2 loss scale, {{skipped:POINT}} its skipped steps (as the
//                     table gives them; an error for a point without loss scaling)
//   {{window:VAR:WITHIN:POINTS}}  the values of VAR among the points POINTS names whose mean
//                     lies within WITHIN of the baseline's, as ranges, then the best
//   {{machines}}      the line naming the processors the runs were made on
//   {{zeroed:KIND;STEP;LAYERS;FORMAT;POINT}}  of the finite nonzero values of tensor kind KIND
//                     recorded at step STEP in the layers LAYERS (a glob, "!GLOB" the others,
//                     "*" all) of POINT's first run, the share in whole percent that rounds to
//                     zero in FORMAT (results::share_rounding_to_zero); ';' separates the
//                     arguments, as formats and points hold ':'
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "fp8lab/study/report.hpp"
#include "fp8lab/study/sweep.hpp"

namespace fp8lab::study {

struct PageInputs {
  const Sweep& sweep;
  const SweepReport& report;
  const std::vector<std::pair<Sweep, SweepReport>>& also;  // also_reports(sweep, store)
  std::string sweep_path, out_dir;                        // for {{commands}}, as the user gave them
  // The tensor statistics of a point's first finished run (empty: none), for {{zeroed}}.
  std::function<std::vector<results::Store::StatRow>(int point)> point_stats = {};
};

// `text` (read from `source`) with every placeholder filled. Throws Error naming the source,
// the line and the placeholder for an unknown placeholder, an unclosed "{{", a metric or
// figure the sweep does not have, and a POINT that names no point or several.
std::string fill_page(const std::string& text, const std::string& source, const PageInputs& in);

}  // namespace fp8lab::study
