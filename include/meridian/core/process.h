// Child processes of the launcher: spawn with a log file and a readiness
// pipe, poll, signal, reap. POSIX only.
//
// Each child runs in its own process group, so that a terminal's Ctrl-C
// (or a signal to the launcher's group) reaches only the launcher, which
// then stops its children in order (workers, site servers, emulator)
// instead of every process at once. A child still dies with its launcher
// (SIGTERM through PR_SET_PDEATHSIG), so none is orphaned.
#ifndef MERIDIAN_CORE_PROCESS_H_
#define MERIDIAN_CORE_PROCESS_H_

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "meridian/core/status.h"

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
  // The same without waiting: the line once the child has written all of
  // it, nullopt while it has not (yet); Unavailable once the child closed
  // the pipe without a whole line (it exited, or said ready and closed).
  Result<std::optional<std::string>> TryReadReadyLine();

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
  // Reads what the ready pipe holds, waiting up to `timeout_ms` for it.
  // Ok(false): nothing arrived in time; Unavailable: the pipe closed.
  Result<bool> FillReadyBuffer(int timeout_ms);
  std::optional<std::string> TakeReadyLine();

  std::string name_;
  std::string log_path_;
  pid_t pid_ = -1;
  int ready_fd_ = -1;
  bool exited_ = false;
  int status_ = 0;
  std::string ready_buffer_;
};

// Appends `line` and a newline to the log file at `path` (created when
// missing): the separator written before a restarted child's output.
Status AppendLogLine(const std::string& path, const std::string& line);

}  // namespace meridian

#endif  // MERIDIAN_CORE_PROCESS_H_
