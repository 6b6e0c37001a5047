#include "apps/train/stop_signal.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <csignal>

namespace tt {
namespace {

std::atomic<int> received{0};
char pending_path[4096];
std::atomic<bool> pending{false};
struct sigaction previous_int, previous_term;

// Only async-signal-safe calls here: atomics, write, unlink and _exit.
void on_signal(int signal) {
  int none = 0;
  if (!received.compare_exchange_strong(none, signal)) {
    if (pending.load()) {
      (void)unlink(pending_path);
      constexpr char kRemoved[] = "\nsecond signal: removed the file being written\n";
      (void)!write(STDERR_FILENO, kRemoved, sizeof(kRemoved) - 1);
    }
    constexpr char kAgain[] = "\nsecond signal: exiting now, without a checkpoint or result\n";
    (void)!write(STDERR_FILENO, kAgain, sizeof(kAgain) - 1);
    _exit(128 + signal);  // the shell's convention for "killed by this signal"
  }
  constexpr char kFirst[] =
      "\nstop requested: finishing this step, then the checkpoint (if on) and the result; signal again to exit now\n";
  (void)!write(STDERR_FILENO, kFirst, sizeof(kFirst) - 1);
}

}  // namespace

StopSignalGuard::StopSignalGuard() {
  received = 0;
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // reads and writes in progress go on: the step must finish
  sigaction(SIGINT, &action, &previous_int);
  sigaction(SIGTERM, &action, &previous_term);
}

StopSignalGuard::~StopSignalGuard() {
  sigaction(SIGINT, &previous_int, nullptr);
  sigaction(SIGTERM, &previous_term, nullptr);
}

int stop_signal_received() { return received.load(); }

PendingFile::PendingFile(const std::string& path) {
  // A path too long for the buffer cannot exist on Linux (PATH_MAX is 4096): the write itself fails first.
  const size_t n = std::min(path.size(), sizeof(pending_path) - 1);
  std::memcpy(pending_path, path.data(), n);
  pending_path[n] = '\0';
  pending.store(true);
}

PendingFile::~PendingFile() { pending.store(false); }

}  // namespace tt
