// Command line of the roofline tool (apps/compare/roofline.h holds its logic).
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

namespace tt {

// Returns the exit code: 0 fine, 2 bad arguments or an unreadable counter or result file.
int roofline_main(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace tt
