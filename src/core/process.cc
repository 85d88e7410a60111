#include "meridian/core/process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <fstream>
#include <string_view>

namespace meridian {

namespace {

// The name of an environment entry "NAME=VALUE".
std::string_view EntryName(std::string_view entry) {
  return entry.substr(0, entry.find('='));
}

// This process's environment with `options` applied: the child's.
std::vector<std::string> ChildEnvironment(const SpawnOptions& options) {
  std::vector<std::string> entries;
  auto replaced = [&](std::string_view name) {
    for (const std::string& unset : options.unset_environment) {
      if (unset == name) return true;
    }
    for (const std::string& set : options.set_environment) {
      if (EntryName(set) == name) return true;
    }
    return false;
  };
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    if (!replaced(EntryName(*entry))) entries.emplace_back(*entry);
  }
  entries.insert(entries.end(), options.set_environment.begin(),
                 options.set_environment.end());
  return entries;
}

std::vector<char*> NullTerminated(const std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  for (const std::string& s : strings) {
    pointers.push_back(const_cast<char*>(s.c_str()));
  }
  pointers.push_back(nullptr);
  return pointers;
}

// In the child after fork: writes `what` and errno's description to
// stderr (the log) and exits 127. Async-signal-safe: strerrordesc_np
// returns a constant string.
[[noreturn]] void ExitChild(const std::string& what) {
  const char* reason = ::strerrordesc_np(errno);
  if (reason == nullptr) reason = "unknown error";
  [[maybe_unused]] ssize_t ignored =
      ::write(STDERR_FILENO, what.data(), what.size());
  ignored = ::write(STDERR_FILENO, reason, std::strlen(reason));
  ignored = ::write(STDERR_FILENO, "\n", 1);
  ::_exit(127);
}

}  // namespace

Result<ChildProcess> ChildProcess::Spawn(std::string name,
                                         const std::vector<std::string>& argv,
                                         const std::string& log_path,
                                         const SpawnOptions& options) {
  if (argv.empty()) return InvalidArgumentError("empty command line");
  const int log_fd =
      ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) {
    return InvalidArgumentError("cannot open log '" + log_path +
                                "': " + std::strerror(errno));
  }
  int ready[2];
  if (::pipe2(ready, O_CLOEXEC) != 0) {
    ::close(log_fd);
    return InternalError(std::string("pipe: ") + std::strerror(errno));
  }
  // Everything the child needs is prepared before fork: after it only
  // async-signal-safe calls are allowed.
  std::vector<char*> args = NullTerminated(argv);
  const std::vector<std::string> environment = ChildEnvironment(options);
  std::vector<char*> envp = NullTerminated(environment);
  const std::string chdir_failed = "meridian: cannot change into '" +
                                   options.working_dir + "' to start " +
                                   argv[0] + ": ";
  const std::string exec_failed =
      "meridian: cannot execute '" + argv[0] + "': ";
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(log_fd);
    ::close(ready[0]);
    ::close(ready[1]);
    return InternalError(std::string("fork: ") + std::strerror(errno));
  }
  if (pid == 0) {
    // Child. Die with the launcher, so that nothing is orphaned even if
    // the launcher is killed outright.
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(127);
    // Its own process group: the terminal's Ctrl-C reaches the launcher
    // only, which stops its children in order (see the header).
    ::setpgid(0, 0);
    ::dup2(log_fd, STDOUT_FILENO);
    ::dup2(log_fd, STDERR_FILENO);
    ::dup2(ready[1], kReadyFd);  // dup2 clears close-on-exec on the copy
    // Restore default signal dispositions the launcher may have changed.
    ::signal(SIGINT, SIG_DFL);
    ::signal(SIGTERM, SIG_DFL);
    ::signal(SIGPIPE, SIG_DFL);
    if (!options.working_dir.empty() &&
        ::chdir(options.working_dir.c_str()) != 0) {
      ExitChild(chdir_failed);
    }
    ::execve(args[0], args.data(), envp.data());
    ExitChild(exec_failed);
  }
  ::close(log_fd);
  ::close(ready[1]);
  ChildProcess child;
  child.name_ = std::move(name);
  child.log_path_ = log_path;
  child.pid_ = pid;
  child.ready_fd_ = ready[0];
  return child;
}

ChildProcess::ChildProcess(ChildProcess&& other) noexcept {
  *this = std::move(other);
}

ChildProcess& ChildProcess::operator=(ChildProcess&& other) noexcept {
  if (this != &other) {
    Reset();
    name_ = std::move(other.name_);
    log_path_ = std::move(other.log_path_);
    pid_ = other.pid_;
    ready_fd_ = other.ready_fd_;
    exited_ = other.exited_;
    status_ = other.status_;
    ready_buffer_ = std::move(other.ready_buffer_);
    other.pid_ = -1;
    other.ready_fd_ = -1;
  }
  return *this;
}

ChildProcess::~ChildProcess() { Reset(); }

void ChildProcess::Reset() {
  if (pid_ > 0 && !exited_) {
    ::kill(pid_, SIGKILL);
    int status;
    ::waitpid(pid_, &status, 0);
  }
  if (ready_fd_ >= 0) ::close(ready_fd_);
  pid_ = -1;
  ready_fd_ = -1;
}

std::optional<std::string> ChildProcess::TakeReadyLine() {
  const size_t newline = ready_buffer_.find('\n');
  if (newline == std::string::npos) return std::nullopt;
  std::string line = ready_buffer_.substr(0, newline);
  ready_buffer_.erase(0, newline + 1);
  return line;
}

Result<bool> ChildProcess::FillReadyBuffer(int timeout_ms) {
  if (ready_fd_ < 0)
    return UnavailableError(name_ + " ended before it was ready");
  pollfd item{ready_fd_, POLLIN, 0};
  const int ready = ::poll(&item, 1, timeout_ms);
  if (ready < 0 && errno == EINTR) return false;
  if (ready <= 0) return false;
  char buffer[256];
  const ssize_t n = ::read(ready_fd_, buffer, sizeof(buffer));
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return false;
  if (n <= 0) return UnavailableError(name_ + " ended before it was ready");
  ready_buffer_.append(buffer, static_cast<size_t>(n));
  return true;
}

Result<std::string> ChildProcess::ReadReadyLine(
    std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    if (std::optional<std::string> line = TakeReadyLine()) return *line;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      return DeadlineExceededError(name_ + " did not report ready within " +
                                   std::to_string(timeout.count()) + " ms");
    }
    MERIDIAN_RETURN_IF_ERROR(
        FillReadyBuffer(static_cast<int>(left.count())).status());
  }
}

Result<std::optional<std::string>> ChildProcess::TryReadReadyLine() {
  // Whatever is there now, a read at a time (a line is short).
  while (true) {
    if (std::optional<std::string> line = TakeReadyLine()) return line;
    MERIDIAN_ASSIGN_OR_RETURN(const bool read, FillReadyBuffer(0));
    if (!read) return std::optional<std::string>();
  }
}

bool ChildProcess::Poll() {
  if (exited_ || pid_ <= 0) return exited_;
  int status;
  const pid_t done = ::waitpid(pid_, &status, WNOHANG);
  if (done == pid_) {
    exited_ = true;
    status_ = status;
  }
  return exited_;
}

bool ChildProcess::succeeded() const {
  return exited_ && WIFEXITED(status_) && WEXITSTATUS(status_) == 0;
}

std::string ChildProcess::DescribeExit() const {
  if (!exited_) return "still running";
  if (WIFEXITED(status_)) {
    return "exited with status " + std::to_string(WEXITSTATUS(status_));
  }
  if (WIFSIGNALED(status_)) {
    const int sig = WTERMSIG(status_);
    return "killed by signal " + std::to_string(sig) + " (" + ::strsignal(sig) +
           ")";
  }
  return "ended with wait status " + std::to_string(status_);
}

void ChildProcess::Signal(int signal) {
  if (pid_ > 0 && !exited_) ::kill(pid_, signal);
}

std::string ChildProcess::LogTail(int lines) const {
  std::ifstream in(log_path_);
  std::deque<std::string> tail;
  std::string line;
  while (std::getline(in, line)) {
    tail.push_back(line);
    if (static_cast<int>(tail.size()) > lines) tail.pop_front();
  }
  std::string out;
  for (const std::string& l : tail) out += "    " + l + "\n";
  return out;
}

Status AppendLogLine(const std::string& path, const std::string& line) {
  std::ofstream out(path, std::ios::app);
  out << line << "\n";
  out.flush();
  if (!out) return InvalidArgumentError("cannot append to log '" + path + "'");
  return Status::Ok();
}

}  // namespace meridian
