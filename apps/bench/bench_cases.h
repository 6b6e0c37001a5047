// What kernel_bench times (apps/bench/kernel_bench.h holds the method): for each benchmarked family, the
// cases at one shape and dtype, forward and forward + backward, each with every implementation of the catalog
// (models/stage.h) in benchmark order, and the minimum bytes (and, for attention, the FLOPs) it moves.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "apps/bench/kernel_bench.h"

namespace tt::bench {

// One implementation of one operation. `run` does the measured work; inputs are built beforehand.
struct Timed {
  std::string name;
  std::function<void()> run;
};

// One operation at one shape, dtype and pass, timed for each implementation. The first implementation
// is the one the others are compared with.
struct Case {
  std::string pass;  // "forward" or "forward+backward"
  int64_t bytes;     // minimum bytes moved, see the header comment
  std::vector<Timed> implementations;
  double flops = 0;  // for compute-bound cases (attention): the work, so rows also report TFLOP/s
};

// The cases of one family at a shape and dtype.
using CaseBuilder = std::vector<Case> (*)(const BenchShape&, torch::ScalarType, c10::Device);
// Every family's builder, in families() order.
const std::vector<std::pair<std::string, CaseBuilder>>& builders();

}  // namespace tt::bench
