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

// Where a child runs and what it finds in its environment, beyond this
// process's own.
struct SpawnOptions {
  // The child's working directory; empty: this process's.
  std::string working_dir;
  // "NAME=VALUE" entries set in the child's environment (over this
  // process's entry of the same name).
  std::vector<std::string> set_environment;
  // Names removed from the child's environment (applied before `set`).
  std::vector<std::string> unset_environment;
};

// One child process. Movable, not copyable. The destructor kills (SIGKILL)
// and reaps a child that is still running, so no child outlives its owner.
class ChildProcess {
 public:
  // Starts `argv[0]` (a path: no PATH search) with `argv`, stdout and
  // stderr appended to `log_path`, and the write end of a fresh pipe on
  // kReadyFd, in the directory and environment `options` say. The child
  // gets SIGTERM if the thread that called Spawn ends (PR_SET_PDEATHSIG):
  // call it from a thread that outlives the child. A child that cannot
  // change into its directory or execute the program writes why into its
  // log and exits with status 127.
  static Result<ChildProcess> Spawn(std::string name,
                                    const std::vector<std::string>& argv,
                                    const std::string& log_path,
                                    const SpawnOptions& options = {});

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
