// The learning-rate schedule as one closed form, compiled for the host (LibTorch's optimizers, the CPU
// formulation of our AdamW, the result file) and for the device (our AdamW's prepare kernel, which
// evaluates it from the step counter it keeps on the device, so a replayed graph follows the schedule
// without the host touching it). No torch or vendor headers: plain C++ that nvcc and hipcc also compile.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__) || defined(__HIP__)
#define TT_HOST_DEVICE __host__ __device__
#else
#define TT_HOST_DEVICE
#endif

namespace tt {

enum class LrScheduleKind : int32_t { kConstant, kCosine, kLinear };

// Plain values only: the struct is a kernel argument.
struct LrSchedule {
  LrScheduleKind kind = LrScheduleKind::kConstant;
  double peak_lr = 3e-4;     // training.learning_rate
  double min_lr = 0.0;       // reached by cosine and linear at the last step
  int64_t warmup_steps = 0;  // training.lr_warmup_steps: linear ramp from 0 over these steps
  int64_t total_steps = 1;   // every optimizer step of the run: warmup_steps (unmeasured) + num_steps
};

// The learning rate of optimizer step `step` (1-based: the first update is step 1), in double.
//   warm-up (step <= W):      peak * step / W
//   constant after it:        peak (exactly, so that the default schedule changes nothing)
//   cosine, linear after it:  p = (step - W) / (T - W), clamped to [0, 1]
//                             cosine: min + (peak - min) * (1 + cos(pi p)) / 2;  linear: peak (1 - p) + min p
// The decay reaches min at step T; a run that continues past T (a resume with more num_steps recomputes T,
// so only a schedule misused this way gets there) stays at min.
TT_HOST_DEVICE inline double lr_at(const LrSchedule& s, double step) {
  const double warmup = static_cast<double>(s.warmup_steps);
  // step / W first: the ramp ends on exactly the peak (peak * W / W may round). Not reached with W = 0.
  if (step <= warmup) return s.peak_lr * (step / warmup);
  if (s.kind == LrScheduleKind::kConstant) return s.peak_lr;
  const double span = static_cast<double>(s.total_steps) - warmup;
  double p = span > 0 ? (step - warmup) / span : 1.0;
  p = p < 0 ? 0 : (p > 1 ? 1 : p);
  // Weighted sums rather than peak + (min - peak) p: exactly peak at p = 0 and exactly min at p = 1.
  if (s.kind == LrScheduleKind::kLinear) return s.peak_lr * (1.0 - p) + s.min_lr * p;
  constexpr double kPi = 3.14159265358979323846;
  return s.min_lr + (s.peak_lr - s.min_lr) * 0.5 * (1.0 + cos(kPi * p));
}

}  // namespace tt
