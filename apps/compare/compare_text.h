// The comparison as text: the terminal table, Markdown (comparison.md) and CSV (comparison.csv), and "where
// the time goes" as a table. The number formats here are the ones the chart (compare_svg.h) writes too.
#pragma once

#include <string>
#include <vector>

#include "apps/compare/compare.h"

namespace tt::compare {

std::string format_table(const Comparison& comparison);  // terminal
// With the debugging exercise's summary (exercise.h) and where the time goes when the results have them.
std::string to_markdown(const Comparison& comparison);
std::string to_csv(const Comparison& comparison);
// The table as every writer shows it: the column headers and each row's cells.
const std::vector<std::string>& table_headers();
std::vector<std::vector<std::string>> table_text(const Comparison& comparison);

// Where the time goes: for every row with a GPU profile, GPU ms per step by kernel category and the host
// gap, as a text table (terminal and Markdown); the kernels the category rule left in "other" are listed.
// Empty when no row has a GPU profile. The chart's stacked bars: compare_svg.h, time_breakdown_svg.
std::string format_time_breakdown(const Comparison& comparison);
std::string time_breakdown_markdown(const Comparison& comparison);

// The name of step time - GPU busy in every writer's breakdown ("host gap").
extern const char* const kHostGap;
// 1234567.8 -> "1,234,568"
std::string thousands(double value);
// Utilisation as a percentage; below 10 % with two decimals, or small models' stages all read "0.2%".
std::string percent(double fraction);

}  // namespace tt::compare
