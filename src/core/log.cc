#include "meridian/log.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>

#include "meridian/mutex.h"
#include "meridian/thread_annotations.h"

namespace meridian {
namespace {

// The role every log line names: set by SetLogRole (any thread, usually
// once at start-up), read by every thread that logs.
struct LogRole {
  Mutex mu;
  std::string name GUARDED_BY(mu) = "meridian";
};

LogRole& Role() {
  static LogRole* role = new LogRole();  // never destroyed: logs at exit
  return *role;
}

LogLevel InitialLevel() {
  LogLevel level = LogLevel::kInfo;
  if (const char* env = std::getenv("MERIDIAN_LOG_LEVEL")) {
    ParseLogLevel(env, &level);
  }
  return level;
}

std::atomic<LogLevel>& Level() {
  static std::atomic<LogLevel> level{InitialLevel()};
  return level;
}

char LevelLetter(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return 'D';
    case LogLevel::kInfo:
      return 'I';
    case LogLevel::kWarning:
      return 'W';
    case LogLevel::kError:
      return 'E';
  }
  return '?';
}

}  // namespace

void SetLogRole(std::string role) {
  LogRole& state = Role();
  MutexLock lock(&state.mu);
  state.name = std::move(role);
}

void SetLogLevel(LogLevel level) { Level().store(level); }

LogLevel GetLogLevel() { return Level().load(std::memory_order_relaxed); }

bool ParseLogLevel(std::string_view text, LogLevel* level) {
  if (text == "debug") {
    *level = LogLevel::kDebug;
  } else if (text == "info") {
    *level = LogLevel::kInfo;
  } else if (text == "warning") {
    *level = LogLevel::kWarning;
  } else if (text == "error") {
    *level = LogLevel::kError;
  } else {
    return false;
  }
  return true;
}

namespace internal {

LogMessage::LogMessage(LogLevel level, const char* /*file*/, int /*line*/)
    : level_(level) {}

LogMessage::~LogMessage() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t seconds = std::chrono::system_clock::to_time_t(now);
  const int millis =
      static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                           now.time_since_epoch())
                           .count() %
                       1000);
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%H:%M:%S", &utc);
  std::string role;
  {
    LogRole& state = Role();
    MutexLock lock(&state.mu);
    role = state.name;
  }
  std::string line;
  line.reserve(64 + stream_.str().size());
  char head[64];
  std::snprintf(head, sizeof(head), "%s.%03d %c ", stamp, millis,
                LevelLetter(level_));
  line += head;
  line += role;
  line += ": ";
  line += stream_.str();
  line += '\n';
  // One write per line so lines of concurrent processes do not interleave.
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

}  // namespace internal
}  // namespace meridian
