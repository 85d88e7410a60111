// Running the meridian binary from tests and finding its processes.
#ifndef MERIDIAN_TESTS_TESTING_PROCESSES_H_
#define MERIDIAN_TESTS_TESTING_PROCESSES_H_

#include <sys/types.h>

#include <string>
#include <vector>

namespace meridian::testing {

struct CommandResult {
  int exit_code = -1;    // -1 when the command did not exit normally
  bool crashed = false;  // ended by a signal
  std::string output;    // stdout and stderr, interleaved
};

// Runs `command` through /bin/sh and collects its output.
CommandResult RunCommand(const std::string& command);

// Live processes whose command line (arguments joined by spaces) contains
// `needle`, this process excluded. Zombies count as gone.
std::vector<pid_t> FindProcesses(const std::string& needle);

// Sends SIGKILL to every process FindProcesses(needle) finds.
void KillProcesses(const std::string& needle);

}  // namespace meridian::testing

#endif  // MERIDIAN_TESTS_TESTING_PROCESSES_H_
