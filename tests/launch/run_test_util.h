// Helpers of the tests that run the meridian binary for real: a command in
// a thread of the test, waiting for a condition, the processes of a run,
// the fault events of its report.
#ifndef MERIDIAN_TESTS_LAUNCH_RUN_TEST_UTIL_H_
#define MERIDIAN_TESTS_LAUNCH_RUN_TEST_UTIL_H_

#include <sys/types.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <cstring>
#include <cmath>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "meridian/report.pb.h"
#include "testing/processes.h"
#include "testing/text.h"

namespace meridian::testing {

// A shell command in a thread of the test; its output is collected.
class BackgroundCommand {
 public:
  explicit BackgroundCommand(const std::string& command)
      : thread_([this, command] { result_ = RunCommand(command); }) {}
  ~BackgroundCommand() {
    if (thread_.joinable()) thread_.join();
  }
  const CommandResult& Wait() {
    if (thread_.joinable()) thread_.join();
    return result_;
  }

 private:
  CommandResult result_;
  std::thread thread_;
};

// `meridian run ARGS` in a thread of the test.
class BackgroundRun : public BackgroundCommand {
 public:
  explicit BackgroundRun(const std::string& args)
      : BackgroundCommand(std::string(MERIDIAN_BINARY) + " run " + args) {}
};

// Polls `condition` every 100 ms until it holds or `timeout` passes.
inline bool WaitFor(const std::function<bool()>& condition,
                    std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (condition()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return condition();
}

// Processes whose command line contains `needle` and every one of
// `tokens`.
inline std::vector<pid_t> Pids(const std::string& needle,
                               const std::vector<std::string>& tokens) {
  std::vector<pid_t> found;
  for (pid_t pid : FindProcesses(needle)) {
    std::string args = ReadFile("/proc/" + std::to_string(pid) + "/cmdline");
    std::replace(args.begin(), args.end(), '\0', ' ');
    if (std::all_of(tokens.begin(), tokens.end(), [&](const std::string& t) {
          return args.find(t) != std::string::npos;
        })) {
      found.push_back(pid);
    }
  }
  return found;
}

inline std::vector<pb::FaultEvent> EventsOf(const pb::RunReport& report,
                                            pb::FaultKind kind,
                                            const std::string& subject) {
  std::vector<pb::FaultEvent> found;
  for (const pb::FaultEvent& event : report.events()) {
    if (event.kind() == kind && event.subject() == subject) {
      found.push_back(event);
    }
  }
  return found;
}

// The largest difference between two model files (model-<site>.f32);
// infinity when they cannot be read or differ in size.
inline double MaxDifference(const std::string& a, const std::string& b) {
  const std::string x = ReadFile(a);
  const std::string y = ReadFile(b);
  if (x.empty() || x.size() != y.size() || x.size() % sizeof(float) != 0) {
    return std::numeric_limits<double>::infinity();
  }
  double largest = 0;
  for (size_t i = 0; i < x.size(); i += sizeof(float)) {
    float u = 0;
    float v = 0;
    std::memcpy(&u, x.data() + i, sizeof(float));
    std::memcpy(&v, y.data() + i, sizeof(float));
    largest = std::max(largest, static_cast<double>(std::abs(u - v)));
  }
  return largest;
}

}  // namespace meridian::testing

#endif  // MERIDIAN_TESTS_LAUNCH_RUN_TEST_UTIL_H_
