// One self-contained HTML report per run folder (report.html, written by compare): the comparison table,
// the debugging exercise's summary, the chart, each result's top kernels from --profile, energy and timing,
// the roofline reports found in the folder, and the system and config each result came from. Inline SVG and
// CSS only: no JavaScript, no network, so the folder can be copied and opened anywhere.
#pragma once

#include <string>
#include <vector>

#include "apps/compare/compare.h"

namespace tt::compare {

// `folder`: where the report goes; every `*roofline.json` there (with its `.svg` sibling) is included.
std::string to_html(const Comparison& comparison, const std::vector<Result>& results, const std::string& folder);

}  // namespace tt::compare
