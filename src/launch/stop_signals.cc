#include "meridian/launch/stop_signals.h"

#include <signal.h>

namespace meridian {
namespace {

std::atomic<bool> g_stop_signal{false};
std::atomic<int> g_stop_signals{0};

void OnStopSignal(int) {
  g_stop_signal.store(true);
  g_stop_signals.fetch_add(1);
}

}  // namespace

const std::atomic<bool>* InstallStopSignalHandlers() {
  struct sigaction action {};
  action.sa_handler = OnStopSignal;
  sigemptyset(&action.sa_mask);
  ::sigaction(SIGINT, &action, nullptr);
  ::sigaction(SIGTERM, &action, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
  return &g_stop_signal;
}

const std::atomic<int>* StopSignalCount() { return &g_stop_signals; }

void RequestStop() { g_stop_signal.store(true); }

}  // namespace meridian
