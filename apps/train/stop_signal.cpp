#include "apps/train/stop_signal.h"

#include <unistd.h>

#include <atomic>
#include <csignal>

namespace tt {
namespace {

std::atomic<int> received{0};
struct sigaction previous_int, previous_term;

// Only async-signal-safe calls here: an atomic store, write and _exit.
void on_signal(int signal) {
  int none = 0;
  if (!received.compare_exchange_strong(none, signal)) {
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

}  // namespace tt
