// The comparison as a dependency-free SVG chart (comparison.svg, and inline in report.html): a panel of
// horizontal bars each for throughput, peak memory, achieved TFLOP/s against the GPU's peak and, when measured,
// energy per step; then where the time goes, stacked by kernel category.
#pragma once

#include <string>

#include "apps/compare/compare.h"

namespace tt::compare {

// The chart; its last panel is where the time goes (time_breakdown_svg) unless with_breakdown is false.
std::string to_svg(const Comparison& comparison, bool with_breakdown = true);
// Where the time goes alone, as its own SVG: for every row with a GPU profile, GPU ms per step by kernel
// category and the host gap as stacked bars. Empty when no row has a GPU profile.
std::string time_breakdown_svg(const Comparison& comparison);

}  // namespace tt::compare
