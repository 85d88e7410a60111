#include "meridian/core/log.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <iterator>
#include <utility>

#include "meridian/core/mutex.h"
#include "meridian/core/thread_annotations.h"

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

// ThreadLogRole's name for this thread; empty: the process's role.
thread_local std::string thread_role;

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

// Each level's spellings: its name (MERIDIAN_LOG_LEVEL, --log-level) and
// the letter its lines start with.
struct LevelSpelling {
  LogLevel level;
  std::string_view name;
  char letter;
};
constexpr LevelSpelling kLevelSpellings[] = {
    {LogLevel::kDebug, "debug", 'D'},
    {LogLevel::kInfo, "info", 'I'},
    {LogLevel::kWarning, "warning", 'W'},
    {LogLevel::kError, "error", 'E'},
};

char LevelLetter(LogLevel level) {
  for (const LevelSpelling& spelling : kLevelSpellings) {
    if (spelling.level == level) return spelling.letter;
  }
  return '?';
}

// The length of the valid UTF-8 sequence (2 to 4 bytes) starting at
// `text[i]`, its code point in *code_point; 0 when the bytes there are not
// one (a stray continuation byte, a truncated sequence, an overlong form, a
// surrogate, beyond U+10FFFF).
size_t Utf8Sequence(std::string_view text, size_t i, uint32_t* code_point) {
  const auto byte = [&](size_t k) {
    return static_cast<unsigned char>(text[i + k]);
  };
  const unsigned char lead = byte(0);
  size_t length = 0;
  uint32_t value = 0;
  if (lead >= 0xc2 && lead <= 0xdf) {
    length = 2;
    value = lead & 0x1f;
  } else if (lead >= 0xe0 && lead <= 0xef) {
    length = 3;
    value = lead & 0x0f;
  } else if (lead >= 0xf0 && lead <= 0xf4) {
    length = 4;
    value = lead & 0x07;
  } else {
    return 0;
  }
  if (text.size() - i < length) return 0;
  for (size_t k = 1; k < length; ++k) {
    if ((byte(k) & 0xc0) != 0x80) return 0;
    value = (value << 6) | (byte(k) & 0x3f);
  }
  if ((length == 3 && value < 0x800) ||
      (length == 3 && value >= 0xd800 && value <= 0xdfff) ||
      (length == 4 && (value < 0x10000 || value > 0x10ffff))) {
    return 0;
  }
  *code_point = value;
  return length;
}

// Code points that are valid UTF-8 but can still break a line or reorder
// what a reader sees: the C1 controls (U+0085 is a line break to some
// tools), the line and paragraph separators, the bidirectional embeddings,
// overrides and isolates.
bool IsHiddenControl(uint32_t code_point) {
  return (code_point >= 0x80 && code_point <= 0x9f) || code_point == 0x2028 ||
         code_point == 0x2029 ||
         (code_point >= 0x202a && code_point <= 0x202e) ||
         (code_point >= 0x2066 && code_point <= 0x2069);
}

// Appends `text` escaped to *out, at most `max_bytes` bytes of it (an escape
// or a character is never split); returns how many bytes of `text` that
// covered. `escape_quotes`: also \\, \" and \' (for quoting).
size_t AppendEscaped(std::string_view text, bool escape_quotes,
                     size_t max_bytes, std::string* out) {
  size_t written = 0;
  size_t i = 0;
  char buffer[16];
  while (i < text.size()) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    std::string_view piece;
    size_t consumed = 1;
    if (c >= 0x20 && c < 0x7f) {
      if (escape_quotes && (c == '\\' || c == '"' || c == '\'')) {
        buffer[0] = '\\';
        buffer[1] = static_cast<char>(c);
        piece = std::string_view(buffer, 2);
      } else {
        piece = text.substr(i, 1);
      }
    } else if (c == '\n') {
      piece = "\\n";
    } else if (c == '\r') {
      piece = "\\r";
    } else if (c == '\t') {
      piece = "\\t";
    } else {
      uint32_t code_point = 0;
      const size_t length = c < 0x80 ? 0 : Utf8Sequence(text, i, &code_point);
      if (length == 0) {
        std::snprintf(buffer, sizeof(buffer), "\\x%02x", c);
        piece = buffer;
      } else if (IsHiddenControl(code_point)) {
        std::snprintf(buffer, sizeof(buffer), "\\u%04x", code_point);
        piece = buffer;
        consumed = length;
      } else {
        piece = text.substr(i, length);
        consumed = length;
      }
    }
    if (piece.size() > max_bytes - written) break;
    out->append(piece);
    written += piece.size();
    i += consumed;
  }
  return i;
}

// "…(1,234 more bytes)".
std::string MoreBytes(size_t count) {
  return "…(" + WithThousandsSeparators(count) + " more bytes)";
}

// `message` as one line: escaped (quotes kept) and capped.
std::string OneLine(std::string_view message) {
  std::string out;
  out.reserve(std::min(message.size(), kMaxLogMessageBytes) + 32);
  const size_t covered = AppendEscaped(message, /*escape_quotes=*/false,
                                       kMaxLogMessageBytes, &out);
  if (covered < message.size()) out += MoreBytes(message.size() - covered);
  return out;
}

// Writes one log line: "HH:MM:SS.mmm L role: message\n", the message made
// one line by OneLine.
void WriteLine(LogLevel level, std::string_view message) {
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
  std::string role = thread_role;
  if (role.empty()) {
    LogRole& state = Role();
    MutexLock lock(&state.mu);
    role = state.name;
  }
  const std::string text = OneLine(message);
  std::string line;
  line.reserve(64 + role.size() + text.size());
  char head[64];
  std::snprintf(head, sizeof(head), "%s.%03d %c ", stamp, millis,
                LevelLetter(level));
  line += head;
  line += OneLine(role);
  line += ": ";
  line += text;
  line += '\n';
  // One write per line so lines of concurrent processes do not interleave.
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

// "10 s": a span rounded up to whole seconds (at least 1), so that "in the
// last N s" always covers it.
std::string WholeSeconds(Duration span) {
  const int64_t ns = std::max<int64_t>(span.count(), 1);
  const int64_t seconds = (ns + 999'999'999) / 1'000'000'000;
  return WithThousandsSeparators(static_cast<uint64_t>(seconds)) + " s";
}

}  // namespace

std::string Sanitized(std::string_view untrusted, size_t max_bytes) {
  std::string out;
  out.reserve(std::min(untrusted.size(), max_bytes) + 8);
  const size_t covered =
      AppendEscaped(untrusted, /*escape_quotes=*/true, max_bytes, &out);
  if (covered < untrusted.size()) out += MoreBytes(untrusted.size() - covered);
  return out;
}

std::string WithThousandsSeparators(uint64_t value) {
  std::string digits = std::to_string(value);
  std::string out;
  out.reserve(digits.size() + digits.size() / 3);
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

LogRateLimiter::LogRateLimiter(const Clock* clock, Sink sink, Options options)
    : sink_(std::move(sink)), clock_(clock), options_(options) {}

bool LogRateLimiter::ShouldLog(LogLevel level, std::string_view key) {
  if (key.size() > kMaxKeyBytes) key = key.substr(0, kMaxKeyBytes);
  Summaries summaries;
  bool admit = false;
  {
    MutexLock lock(&mu_);
    const Duration now = clock_.load()->Now();
    EntryList::iterator entry;
    if (auto found = index_.find(key); found != index_.end()) {
      entry = found->second;
      // Most recently used last; list iterators (and index_'s views of the
      // keys) stay valid.
      entries_.splice(entries_.end(), entries_, entry);
      Roll(&*entry, /*total=*/false, now, &summaries);
    } else {
      if (entries_.size() >= std::max<size_t>(1, options_.max_keys)) {
        Entry& oldest = entries_.front();
        if (oldest.suppressed > 0) {
          summaries.emplace_back(oldest.level,
                                 TakeSummary(&oldest, /*total=*/false, now));
        }
        index_.erase(oldest.key);
        entries_.pop_front();
      }
      entries_.push_back(Entry{std::string(key), level, now, 0, 0});
      entry = std::prev(entries_.end());
      index_.emplace(entry->key, entry);
    }
    if (!total_started_) {
      total_.window_start = now;
      total_started_ = true;
    }
    Roll(&total_, /*total=*/true, now, &summaries);
    if (entry->lines >= std::max(1, options_.lines_per_key)) {
      LeftOut(&*entry, level);
    } else if (total_.lines >= std::max(1, options_.lines_in_total)) {
      // Not counted against the key: a key only leaves lines out after it
      // wrote its own, which bounds the number of key summaries.
      LeftOut(&total_, level);
    } else {
      ++entry->lines;
      ++total_.lines;
      admit = true;
    }
  }
  Write(summaries);
  return admit;
}

void LogRateLimiter::FlushDue() {
  if (clock_.load()->Now().count() < next_due_ns_.load()) return;
  Summaries summaries;
  {
    MutexLock lock(&mu_);
    Collect(/*only_due=*/true, clock_.load()->Now(), &summaries);
  }
  Write(summaries);
}

void LogRateLimiter::FlushAll() {
  Summaries summaries;
  {
    MutexLock lock(&mu_);
    Collect(/*only_due=*/false, clock_.load()->Now(), &summaries);
  }
  Write(summaries);
}

void LogRateLimiter::Reset(const Clock* clock, Options options) {
  MutexLock lock(&mu_);
  index_.clear();
  entries_.clear();
  total_ = Entry();
  total_started_ = false;
  options_ = options;
  clock_.store(clock);
  next_due_ns_.store(INT64_MAX);
}

size_t LogRateLimiter::key_count() const {
  MutexLock lock(&mu_);
  return entries_.size();
}

void LogRateLimiter::Roll(Entry* entry, bool total, Duration now,
                          Summaries* out) {
  if (now - entry->window_start < options_.window) return;
  if (entry->suppressed > 0) {
    out->emplace_back(entry->level, TakeSummary(entry, total, now));
  }
  entry->window_start = now;
  entry->lines = 0;
}

std::string LogRateLimiter::TakeSummary(Entry* entry, bool total,
                                        Duration now) {
  const std::string count = WithThousandsSeparators(entry->suppressed);
  const std::string span = WholeSeconds(now - entry->window_start);
  entry->suppressed = 0;
  if (total) {
    return "… " + count + " more rate-limited lines of any kind in the last " +
           span + " (at most " +
           WithThousandsSeparators(std::max(1, options_.lines_in_total)) +
           " per " + WholeSeconds(options_.window) + ")";
  }
  return "… " + count + " more like this in the last " + span + ": " +
         entry->key;
}

void LogRateLimiter::LeftOut(Entry* entry, LogLevel level) {
  ++entry->suppressed;
  entry->level = level;
  const int64_t due = (entry->window_start + options_.window).count();
  int64_t current = next_due_ns_.load();
  while (due < current && !next_due_ns_.compare_exchange_weak(current, due)) {
  }
}

void LogRateLimiter::Collect(bool only_due, Duration now, Summaries* out) {
  int64_t next_due = INT64_MAX;
  for (auto entry = entries_.begin();; ++entry) {
    const bool total = entry == entries_.end();
    Entry& visited = total ? total_ : *entry;
    if (visited.suppressed > 0) {
      const Duration end = visited.window_start + options_.window;
      if (!only_due || now >= end) {
        out->emplace_back(visited.level, TakeSummary(&visited, total, now));
      } else {
        next_due = std::min<int64_t>(next_due, end.count());
      }
    }
    if (total) break;
  }
  next_due_ns_.store(next_due);
}

void LogRateLimiter::Write(const Summaries& summaries) {
  for (const auto& [level, text] : summaries) sink_(level, text);
}

LogRateLimiter& GlobalLogRateLimiter() {
  // Never destroyed: lines are logged until the process exits.
  static LogRateLimiter* limiter = new LogRateLimiter(
      SystemClock(),
      [](LogLevel level, std::string_view text) { WriteLine(level, text); });
  return *limiter;
}

bool ShouldLog(LogLevel level, std::string_view key) {
  if (level < GetLogLevel()) return false;
  return GlobalLogRateLimiter().ShouldLog(level, key);
}

void SetLogRole(std::string role) {
  LogRole& state = Role();
  MutexLock lock(&state.mu);
  state.name = std::move(role);
}

ThreadLogRole::ThreadLogRole(std::string role)
    : previous_(std::exchange(thread_role, std::move(role))) {}

ThreadLogRole::~ThreadLogRole() { thread_role = std::move(previous_); }

void SetLogLevel(LogLevel level) { Level().store(level); }

LogLevel GetLogLevel() { return Level().load(std::memory_order_relaxed); }

bool ParseLogLevel(std::string_view text, LogLevel* level) {
  for (const LevelSpelling& spelling : kLevelSpellings) {
    if (spelling.name == text) {
      *level = spelling.level;
      return true;
    }
  }
  return false;
}

namespace internal {

LogMessage::LogMessage(LogLevel level, const char* /*file*/, int /*line*/)
    : level_(level) {}

LogMessage::~LogMessage() {
  // Counts of lines a rate limiter left out whose window has ended come
  // first, so that they appear even when those lines stopped.
  GlobalLogRateLimiter().FlushDue();
  WriteLine(level_, stream_.str());
}

}  // namespace internal
}  // namespace meridian
