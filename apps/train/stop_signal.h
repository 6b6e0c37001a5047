// A clean stop on SIGINT (Ctrl-C) or SIGTERM (what Slurm and most schedulers send before they kill a job):
// the first signal asks the training loop to stop after the step it is in, so the run can write a
// checkpoint and a result marked interrupted; a second signal ends the process at once, removing the
// temporary file of a write in progress (PendingFile).
#pragma once

#include <string>

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

// While one lives, a second signal (which ends the process at once) first removes `path`: the temporary file
// of a write in progress, so that exiting mid-write leaves nothing behind. One at a time (writes are
// sequential); the path is copied into a fixed buffer, since the handler may only make async-signal-safe calls.
class PendingFile {
 public:
  explicit PendingFile(const std::string& path);
  ~PendingFile();
  PendingFile(const PendingFile&) = delete;
  PendingFile& operator=(const PendingFile&) = delete;
};

}  // namespace tt
