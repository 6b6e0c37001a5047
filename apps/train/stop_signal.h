// A clean stop on SIGINT (Ctrl-C) or SIGTERM (what Slurm and most schedulers send before they kill a job):
// the first signal asks the training loop to stop after the step it is in, so the run can write a
// checkpoint and a result marked interrupted; a second signal ends the process at once.
#pragma once

namespace tt {

// Installs the handlers for SIGINT and SIGTERM (the previous ones come back when the guard goes).
class StopSignalGuard {
 public:
  StopSignalGuard();
  ~StopSignalGuard();
  StopSignalGuard(const StopSignalGuard&) = delete;
  StopSignalGuard& operator=(const StopSignalGuard&) = delete;
};

// The first signal received since the guard was installed, 0 if none.
int stop_signal_received();

}  // namespace tt
