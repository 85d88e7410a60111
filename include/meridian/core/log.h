// Line-oriented logging to stderr: one line per message, prefixed with UTC
// time, level and the process role (set once at start-up). Thread-safe.
//
// Untrusted input cannot forge or flood the log:
//  - Every message is written as exactly one line: control characters
//    (\n, \r, \t, ESC, the rest of 0x00-0x1f, 0x7f), bytes that are not
//    valid UTF-8, and the C1 controls, Unicode line separators and
//    bidirectional overrides are escaped (\n, \x1b, \xff, \u2028); the rest
//    of valid UTF-8 is kept (backslashes and quotes too). A message longer
//    than kMaxLogMessageBytes after escaping is cut there and ends in
//    "…(N more bytes)".
//  - Code quoting a peer-supplied string inside a message wraps it in
//    Sanitized(), which also escapes quotes and backslashes and caps it.
//  - Lines that may repeat at a peer's pace go through a rate limiter
//    (ShouldLog, MLOG_EVERY_KEY): per key at most a few lines per window,
//    then one line with the count of those left out.
#ifndef MERIDIAN_CORE_LOG_H_
#define MERIDIAN_CORE_LOG_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <sstream>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "meridian/core/clock.h"
#include "meridian/core/mutex.h"
#include "meridian/core/thread_annotations.h"

namespace meridian {

enum class LogLevel { kDebug = 0, kInfo, kWarning, kError };

// Names this process in every line, e.g. "site-a/server" or "site-a/w3".
void SetLogRole(std::string role);

// Names the calling thread's lines instead, while it lives (the previous
// name of the thread, if any, comes back at destruction): several roles
// in one process, e.g. a test running three site servers on threads.
// Create and destroy on the same thread.
class ThreadLogRole {
 public:
  explicit ThreadLogRole(std::string role);
  ~ThreadLogRole();
  ThreadLogRole(const ThreadLogRole&) = delete;
  ThreadLogRole& operator=(const ThreadLogRole&) = delete;

 private:
  std::string previous_;
};
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

// The longest message one log line carries, in bytes after escaping; the
// rest is replaced by "…(N more bytes)".
inline constexpr size_t kMaxLogMessageBytes = 4096;

// `untrusted` (a peer's site name, a tensor name, ...) made safe to quote
// inside a log message or an error: backslash, both quote characters and
// \n \r \t become \\ \" \' \n \r \t; other control characters, DEL
// and bytes that are not valid UTF-8 become \xNN; the C1 controls, Unicode
// line separators and bidirectional controls become \uNNNN; printable ASCII
// and the rest of valid UTF-8 stay. At most `max_bytes` bytes of that (never
// splitting an escape or a character), then "…(N more bytes)" naming how many
// bytes of `untrusted` were left out. Thread-safe (a pure function).
std::string Sanitized(std::string_view untrusted, size_t max_bytes = 256);

// 1203 -> "1,203".
std::string WithThousandsSeparators(uint64_t value);

// The budgets of a LogRateLimiter (the defaults are the process-wide one's).
struct LogRateLimitOptions {
  Duration window = std::chrono::seconds(10);
  int lines_per_key = 5;     // per key per window
  int lines_in_total = 100;  // all keys together, per window
  size_t max_keys = 1024;    // beyond: the least recently used is evicted
};

// Limits how often lines of one kind are written, so that a peer repeating
// the same mistake thousands of times writes a few lines and a count.
//
// Per key (free text naming the kind of line, e.g. "rejected PULL from
// site-b: ERROR_SEQUENCE"), at most `lines_per_key` lines are admitted per
// window, which starts at the key's first line; and all keys together are
// admitted at most `lines_in_total` lines per window (a window of its own),
// so that keys holding peer-chosen text (a site name) cannot multiply the
// budget. Lines beyond either are counted. When a window that left lines
// out has ended, one summary line is written through the sink:
//   "… 1,203 more like this in the last 10 s: <key>" (the key's budget) or
//   "… 812 more rate-limited lines of any kind in the last 10 s (at most
//   100 per 10 s)" (the total's),
// the key's right before its next admitted line, or, if the key falls
// silent, at the next FlushDue() (the process-wide limiter calls it on
// every log line, so the count comes out with the next line of any kind),
// or when the key is evicted. "in the last N s" counts from the start of
// the window, rounded up, so it always covers the lines counted.
//
// Bounds: written lines <= lines_in_total per window, plus summaries, of
// which there are about lines_in_total / lines_per_key + 1 per window (a
// key only leaves lines out once it has written its lines_per_key, so keys
// a peer makes up by the thousand never reach a summary). Memory: at most
// `max_keys` keys, each cut to kMaxKeyBytes (about 400 bytes per key with
// the list and index nodes: ~400 KiB at 1024 keys); a new key beyond that
// evicts the least recently used one, writing its summary first if it
// left lines out. A key that comes back after eviction starts afresh.
//
// Thread-safe. Summaries are written after the internal lock is released.
class LogRateLimiter {
 public:
  using Options = LogRateLimitOptions;
  // Receives every summary line (level: that of the lines left out).
  using Sink = std::function<void(LogLevel level, std::string_view text)>;

  static constexpr size_t kMaxKeyBytes = 256;

  // `clock` must outlive the limiter (or its next Reset).
  LogRateLimiter(const Clock* clock, Sink sink, Options options = Options());
  LogRateLimiter(const LogRateLimiter&) = delete;
  LogRateLimiter& operator=(const LogRateLimiter&) = delete;

  // True when a line about `key` may be written now (both budgets allow
  // it; the line is counted against both). Otherwise counts it as left out
  // and returns false. Before returning true it writes the summary of the
  // key's previous window if that left lines out, so that the summary
  // precedes the caller's line.
  bool ShouldLog(LogLevel level, std::string_view key) EXCLUDES(mu_);
  // Writes the summaries of every ended window that left lines out. Cheap
  // when none is due (an atomic load and a clock read, no lock).
  void FlushDue() EXCLUDES(mu_);
  // Writes every pending summary now, ended window or not (at exit, in
  // tests).
  void FlushAll() EXCLUDES(mu_);
  // Forgets every key and count without writing summaries, and takes a new
  // clock and options (tests of the process-wide limiter).
  void Reset(const Clock* clock, Options options) EXCLUDES(mu_);
  size_t key_count() const EXCLUDES(mu_);

 private:
  struct Entry {
    std::string key;
    LogLevel level = LogLevel::kInfo;
    Duration window_start{};
    int lines = 0;            // admitted in the current window
    uint64_t suppressed = 0;  // left out in the current window
  };
  using EntryList = std::list<Entry>;  // least recently used first
  using Summaries = std::vector<std::pair<LogLevel, std::string>>;

  // Starts a new window for `entry` if its current one has ended at `now`,
  // taking the old one's summary into *out.
  void Roll(Entry* entry, bool total, Duration now, Summaries* out)
      REQUIRES(mu_);
  // The summary of `entry`'s window at `now` (suppressed > 0); clears it.
  std::string TakeSummary(Entry* entry, bool total, Duration now) REQUIRES(mu_);
  void LeftOut(Entry* entry, LogLevel level) REQUIRES(mu_);
  void Collect(bool only_due, Duration now, Summaries* out) REQUIRES(mu_);
  void Write(const Summaries& summaries);

  const Sink sink_;
  // Read without the lock by FlushDue's fast path; written under mu_.
  std::atomic<const Clock*> clock_;
  // Earliest end of a window that left lines out (ns on clock_); INT64_MAX
  // when none. May be early (then a scan finds nothing), never late.
  std::atomic<int64_t> next_due_ns_{INT64_MAX};
  mutable Mutex mu_;
  Options options_ GUARDED_BY(mu_);
  Entry total_ GUARDED_BY(mu_);  // all keys together
  bool total_started_ GUARDED_BY(mu_) = false;
  EntryList entries_ GUARDED_BY(mu_);
  // Views of entries_' keys (list nodes never move).
  std::unordered_map<std::string_view, EntryList::iterator> index_
      GUARDED_BY(mu_);
};

// The process-wide limiter behind ShouldLog and MLOG_EVERY_KEY (default
// LogRateLimitOptions: 5 lines per key and 100 in total per 10 s, at most
// 1024 keys), on SystemClock(); its summaries go to the log. Never
// destroyed.
LogRateLimiter& GlobalLogRateLimiter();

// The process-wide limiter's verdict on a line of `level` about `key`.
// False without counting when `level` is below the log level.
bool ShouldLog(LogLevel level, std::string_view key);

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
// MLOG_EVERY_KEY(WARNING, key) << ...: the same, rate-limited per `key` by
// the process-wide LogRateLimiter (ShouldLog).
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
#define MLOG_EVERY_KEY(severity, key)                                       \
  (MERIDIAN_LOG_LEVEL_##severity < ::meridian::GetLogLevel() ||             \
   !::meridian::ShouldLog(MERIDIAN_LOG_LEVEL_##severity, (key)))            \
      ? (void)0                                                             \
      : ::meridian::internal::LogVoidify() &                                \
            ::meridian::internal::LogMessage(MERIDIAN_LOG_LEVEL_##severity, \
                                             __FILE__, __LINE__)            \
                .stream()

#endif  // MERIDIAN_CORE_LOG_H_
