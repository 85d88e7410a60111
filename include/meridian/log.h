// Line-oriented logging to stderr: one line per message, prefixed with UTC
// time, level and the process role (set once at start-up). Thread-safe.
#ifndef MERIDIAN_LOG_H_
#define MERIDIAN_LOG_H_

#include <sstream>
#include <string>
#include <string_view>

namespace meridian {

enum class LogLevel { kDebug = 0, kInfo, kWarning, kError };

// Names this process in every line, e.g. "site-a/server" or "site-a/w3".
void SetLogRole(std::string role);
// Messages below `level` are dropped. Default kInfo; MERIDIAN_LOG_LEVEL
// (debug|info|warning|error) in the environment overrides at start-up.
void SetLogLevel(LogLevel level);

// When to repeat a "still waiting for ..." line: `first_s` after the wait
// began, then at doubling intervals up to `max_s`, so a role waiting for
// its peers says so without flooding its log. Not thread-safe.
class WaitNotice {
 public:
  explicit WaitNotice(double first_s = 1.0, double max_s = 30.0)
      : first_s_(first_s), max_s_(max_s) {}
  // True when a line is due at `now_s` (seconds on any monotonic clock);
  // schedules the next one. The first call starts the wait.
  bool Due(double now_s) {
    if (next_s_ < 0) {
      interval_s_ = first_s_;
      next_s_ = now_s + interval_s_;
      return false;
    }
    if (now_s < next_s_) return false;
    interval_s_ = interval_s_ * 2 < max_s_ ? interval_s_ * 2 : max_s_;
    next_s_ = now_s + interval_s_;
    return true;
  }
  // The wait is over; the next Due() starts a new one.
  void Reset() { next_s_ = -1; }

 private:
  double first_s_;
  double max_s_;
  double interval_s_ = 0;
  double next_s_ = -1;
};
LogLevel GetLogLevel();
// Parses "debug", "info", "warning", "error"; false on anything else.
bool ParseLogLevel(std::string_view text, LogLevel* level);

namespace internal {

class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};

// Swallows a stream expression when the level is disabled.
struct LogVoidify {
  void operator&(std::ostream&) {}
};

}  // namespace internal
}  // namespace meridian

// Usage: MLOG(INFO) << "joined " << n << " workers";
#define MERIDIAN_LOG_LEVEL_DEBUG ::meridian::LogLevel::kDebug
#define MERIDIAN_LOG_LEVEL_INFO ::meridian::LogLevel::kInfo
#define MERIDIAN_LOG_LEVEL_WARNING ::meridian::LogLevel::kWarning
#define MERIDIAN_LOG_LEVEL_ERROR ::meridian::LogLevel::kError
#define MLOG(severity)                                                      \
  (MERIDIAN_LOG_LEVEL_##severity < ::meridian::GetLogLevel())               \
      ? (void)0                                                             \
      : ::meridian::internal::LogVoidify() &                                \
            ::meridian::internal::LogMessage(MERIDIAN_LOG_LEVEL_##severity, \
                                             __FILE__, __LINE__)            \
                .stream()

#endif  // MERIDIAN_LOG_H_
