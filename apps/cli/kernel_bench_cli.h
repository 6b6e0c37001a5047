// Command line of the kernel benchmark (apps/bench/kernel_bench.h holds the benchmark).
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

namespace tt {

// Returns the exit code: 0 done, 1 no GPU or the report cannot be written, 2 bad flags.
int kernel_bench_main(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace tt
