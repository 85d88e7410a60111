#include "testing/processes.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>

namespace meridian::testing {

CommandResult RunCommand(const std::string& command) {
  CommandResult result;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) {
    result.output.append(buffer, n);
  }
  const int status = ::pclose(pipe);
  result.crashed = !WIFEXITED(status);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

namespace {

// The contents of a /proc file; empty when the process is gone (a read of
// an exiting process's file fails with ESRCH, which std::ifstream would
// throw).
std::string ReadProcFile(const std::filesystem::path& path) {
  std::string text;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return text;
  char buffer[4096];
  ssize_t n;
  while ((n = ::read(fd, buffer, sizeof(buffer))) > 0) {
    text.append(buffer, static_cast<size_t>(n));
  }
  ::close(fd);
  return n < 0 ? std::string() : text;
}

}  // namespace

std::vector<pid_t> FindProcesses(const std::string& needle) {
  std::vector<pid_t> found;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = std::stoi(name);
    if (pid == ::getpid()) continue;
    std::string args = ReadProcFile(entry.path() / "cmdline");
    std::replace(args.begin(), args.end(), '\0', ' ');
    if (args.find(needle) == std::string::npos) continue;
    const std::string stat = ReadProcFile(entry.path() / "stat");
    const std::string stat_line = stat.substr(0, stat.find('\n'));
    const size_t paren = stat_line.rfind(')');
    if (paren != std::string::npos && paren + 2 < stat_line.size() &&
        stat_line[paren + 2] == 'Z') {
      continue;
    }
    found.push_back(pid);
  }
  return found;
}

void KillProcesses(const std::string& needle) {
  for (pid_t pid : FindProcesses(needle)) ::kill(pid, SIGKILL);
}

}  // namespace meridian::testing
