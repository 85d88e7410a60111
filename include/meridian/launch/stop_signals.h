// SIGINT and SIGTERM as a request to stop: every long-running `meridian`
// subcommand polls the flag and stops in order.
#ifndef MERIDIAN_LAUNCH_STOP_SIGNALS_H_
#define MERIDIAN_LAUNCH_STOP_SIGNALS_H_

#include <atomic>

namespace meridian {

// Installs SIGINT/SIGTERM handlers that set the returned flag (SIGPIPE is
// ignored). Call once, early in main; the flag lives for the process.
const std::atomic<bool>* InstallStopSignalHandlers();
// How many SIGINT/SIGTERM arrived since InstallStopSignalHandlers.
const std::atomic<int>* StopSignalCount();
// Sets the flag as a first stop signal would (without counting a signal):
// the process stops itself in order. Any thread.
void RequestStop();

}  // namespace meridian

#endif  // MERIDIAN_LAUNCH_STOP_SIGNALS_H_
