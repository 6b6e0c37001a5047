#include "models/scoped_range.h"

#include <torch/csrc/profiler/stubs/base.h>

namespace tt {

ScopedRange::ScopedRange(const char* name)
    : active_(torch::profiler::impl::cudaStubs()->enabled()), record_(at::RecordScope::USER_SCOPE) {
  if (active_) torch::profiler::impl::cudaStubs()->rangePush(name);
  if (record_.isActive()) record_.before(std::string_view(name));
}

ScopedRange::~ScopedRange() {
  if (active_) torch::profiler::impl::cudaStubs()->rangePop();
}

}  // namespace tt
