// Command line of the compare tool (apps/compare/compare.h holds its logic).
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

namespace tt {

// Returns the exit code: 0 fine, 1 a result is slower than --fail-if-slower allows, 2 bad arguments,
// unreadable or invalid files, or results that are not comparable.
int compare_main(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace tt
