#include "models/precision.h"

#include <ATen/autocast_mode.h>

namespace tt {

torch::ScalarType compute_dtype(Precision precision) {
  return precision == Precision::kBf16 ? torch::kBFloat16 : torch::kFloat32;
}

AutocastScope::AutocastScope(const torch::Device& device, Precision precision)
    : type_(device.type()),
      enabled_(precision == Precision::kBf16), previous_(at::autocast::is_autocast_enabled(device.type())) {
  if (!enabled_) return;
  at::autocast::set_autocast_dtype(type_, at::kBFloat16);
  at::autocast::set_autocast_enabled(type_, true);
  at::autocast::increment_nesting();
}

AutocastScope::~AutocastScope() {
  if (!enabled_) return;
  // Leaving the outermost scope drops the cached bf16 copies of the weights, as Python's autocast does.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_enabled(type_, previous_);
}

}  // namespace tt
