// Child processes of the launcher: spawn with a log file and a readiness
// pipe, poll, signal, reap. POSIX only.
#ifndef MERIDIAN_RUNTIME_PROCESS_H_
#define MERIDIAN_RUNTIME_PROCESS_H_

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "meridian/status.h"

namespace meridian {

// The file descriptor number a child finds its readiness pipe on.
inline constexpr int kReadyFd = 3;

// One child process. Movable, not copyable. The destructor kills (SIGKILL)
// and reaps a child that is still running, so no child outlives its owner.
class ChildProcess {
 public:
  // Starts `argv[0]` with `argv`, stdout and stderr appended to `log_path`,
  // and the write end of a fresh pipe on kReadyFd. The child gets SIGTERM
  // if this process dies.
  static Result<ChildProcess> Spawn(std::string name,
                                    const std::vector<std::string>& argv,
                                    const std::string& log_path);

  ChildProcess(ChildProcess&& other) noexcept;
  ChildProcess& operator=(ChildProcess&& other) noexcept;
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  ~ChildProcess();

  const std::string& name() const { return name_; }
  pid_t pid() const { return pid_; }
  const std::string& log_path() const { return log_path_; }

  // Reads one line the child writes on its readiness pipe, waiting up to
  // `timeout`. Fails if the child closes the pipe (e.g. exits) first.
  Result<std::string> ReadReadyLine(std::chrono::milliseconds timeout);

  // Non-blocking: true once the child has exited (then exit_status() holds
  // the raw wait status).
  bool Poll();
  bool exited() const { return exited_; }
  int exit_status() const { return status_; }
  // Exited normally with status 0.
  bool succeeded() const;
  // "exited with status 1" / "killed by signal 9 (Killed)".
  std::string DescribeExit() const;

  void Signal(int signal);
  // The last `lines` lines of the child's log.
  std::string LogTail(int lines) const;

 private:
  ChildProcess() = default;
  void Reset();

  std::string name_;
  std::string log_path_;
  pid_t pid_ = -1;
  int ready_fd_ = -1;
  bool exited_ = false;
  int status_ = 0;
  std::string ready_buffer_;
};

}  // namespace meridian

#endif  // MERIDIAN_RUNTIME_PROCESS_H_
