// Log lines that untrusted text cannot forge (one line per message,
// escaped, capped), Sanitized() for quoting peer strings, and the rate
// limiter of repeated lines, on a manual clock.
#include "meridian/core/log.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "meridian/core/clock.h"
#include "testing/text.h"

namespace meridian {
namespace {

using ::meridian::testing::Contains;

using std::chrono::seconds;

// The lines of `text` (each without its '\n'); a last line without '\n'
// is returned as well.
std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < text.size()) {
    const size_t end = text.find('\n', start);
    if (end == std::string::npos) {
      lines.push_back(text.substr(start));
      break;
    }
    lines.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return lines;
}


// What MLOG(WARNING) << message writes to stderr.
std::string Logged(const std::string& message) {
  ::testing::internal::CaptureStderr();
  MLOG(WARNING) << message;
  return ::testing::internal::GetCapturedStderr();
}

// The message part of a log line ("HH:MM:SS.mmm W role: message").
std::string MessageOf(const std::string& line) {
  const size_t colon = line.find(": ");
  return colon == std::string::npos ? "" : line.substr(colon + 2);
}

TEST(LogLineTest, ANewlineInAMessageCannotForgeALine) {
  const std::string sender =
      "site-x\nFAKE 2026-01-01 site-a/server INFO forged";
  const std::string out = Logged("rejected HELLO from " + sender);
  const std::vector<std::string> lines = Lines(out);
  ASSERT_EQ(lines.size(), 1u) << out;
  EXPECT_EQ(out.back(), '\n');
  EXPECT_EQ(MessageOf(lines[0]),
            "rejected HELLO from site-x\\nFAKE 2026-01-01 site-a/server INFO "
            "forged");
}

// Several roles in one process: a thread's own role names its lines
// while it lives, nested ones restore the outer one, and other threads
// keep the process's role.
TEST(LogLineTest, AThreadsRoleNamesItsLinesOnly) {
  SetLogRole("process-role");
  ::testing::internal::CaptureStderr();
  MLOG(WARNING) << "one";
  {
    ThreadLogRole outer("site-a/server");
    MLOG(WARNING) << "two";
    {
      ThreadLogRole inner("site-b/server");
      MLOG(WARNING) << "three";
    }
    MLOG(WARNING) << "four";
    std::thread other([] { MLOG(WARNING) << "five"; });
    other.join();
  }
  MLOG(WARNING) << "six";
  const std::vector<std::string> lines =
      Lines(::testing::internal::GetCapturedStderr());
  ASSERT_EQ(lines.size(), 6u);
  const char* expected[] = {" process-role: one",    " site-a/server: two",
                            " site-b/server: three", " site-a/server: four",
                            " process-role: five",   " process-role: six"};
  for (int i = 0; i < 6; ++i) {
    EXPECT_TRUE(Contains(lines[i], expected[i])) << lines[i];
  }
  SetLogRole("meridian");
}

TEST(LogLineTest, ControlCharactersAndInvalidUtf8AreEscaped) {
  const std::string message = std::string("a\rb\tc\x1b[31md") + '\0' +
                              "e\x01\x7f" + "f\xff\xfe" +
                              "g\xe2\x82" +      // a truncated 3-byte sequence
                              "h\xc0\xaf" +      // an overlong '/'
                              "i\xed\xa0\x80" +  // a surrogate
                              "j\xc2\x85" +      // U+0085, a C1 line break
                              "k\xe2\x80\xa8" +  // U+2028, line separator
                              "l\xe2\x80\xae" +  // U+202E, right-to-left
                              "m";
  const std::vector<std::string> lines = Lines(Logged(message));
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(MessageOf(lines[0]),
            "a\\rb\\tc\\x1b[31md\\x00e\\x01\\x7ff\\xff\\xfeg\\xe2\\x82h\\xc0"
            "\\xafi\\xed\\xa0\\x80j\\u0085k\\u2028l\\u202em");
}

TEST(LogLineTest, Utf8BackslashesAndQuotesAreKept) {
  const std::string message =
      "Zürich → 東京 🙂 path C:\\tmp \"quoted\" 'single'";
  const std::vector<std::string> lines = Lines(Logged(message));
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(MessageOf(lines[0]), message);
}

TEST(LogLineTest, LongMessagesAreCapped) {
  const std::string message(10000, 'a');
  const std::string out = Logged(message);
  const std::vector<std::string> lines = Lines(out);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(MessageOf(lines[0]),
            std::string(kMaxLogMessageBytes, 'a') + "…(5,904 more bytes)");
  // Exactly the cap: nothing cut.
  EXPECT_EQ(MessageOf(Lines(Logged(std::string(kMaxLogMessageBytes, 'b')))[0]),
            std::string(kMaxLogMessageBytes, 'b'));
  // Escapes count against the cap and are never split: 2,000 newlines
  // become 2,048 "\n" escapes (4,096 bytes) and the count of the rest.
  EXPECT_EQ(MessageOf(Lines(Logged(std::string(3000, '\n')))[0]), [] {
    std::string expected;
    for (int i = 0; i < 2048; ++i) expected += "\\n";
    return expected + "…(952 more bytes)";
  }());
}

TEST(SanitizedTest, EscapesQuotesBackslashesAndControls) {
  EXPECT_EQ(Sanitized("plain-name_1.2"), "plain-name_1.2");
  EXPECT_EQ(Sanitized("a\"b'c\\d"), "a\\\"b\\'c\\\\d");
  EXPECT_EQ(Sanitized("x\ny\r\tz\x1b"), "x\\ny\\r\\tz\\x1b");
  EXPECT_EQ(Sanitized("\xff\xc2"), "\\xff\\xc2");
  EXPECT_EQ(Sanitized("Zürich 東京"), "Zürich 東京");
  EXPECT_EQ(Sanitized(""), "");
}

TEST(SanitizedTest, CapsWithoutSplittingAnEscapeOrACharacter) {
  EXPECT_EQ(Sanitized(std::string(300, 'x')),
            std::string(256, 'x') + "…(44 more bytes)");
  EXPECT_EQ(Sanitized(std::string(256, 'x')), std::string(256, 'x'));
  // 'é' is 2 bytes: 127 of them fit in 255 bytes, 73 (146 bytes) do not.
  std::string accents;
  for (int i = 0; i < 200; ++i) accents += "é";
  std::string kept;
  for (int i = 0; i < 127; ++i) kept += "é";
  EXPECT_EQ(Sanitized(accents, 255), kept + "…(146 more bytes)");
  EXPECT_EQ(Sanitized("\n\n\n", 3), "\\n…(2 more bytes)");
  EXPECT_EQ(Sanitized("abc", 0), "…(3 more bytes)");
}

TEST(WithThousandsSeparatorsTest, GroupsDigits) {
  EXPECT_EQ(WithThousandsSeparators(0), "0");
  EXPECT_EQ(WithThousandsSeparators(999), "999");
  EXPECT_EQ(WithThousandsSeparators(1000), "1,000");
  EXPECT_EQ(WithThousandsSeparators(1203), "1,203");
  EXPECT_EQ(WithThousandsSeparators(1234567), "1,234,567");
  EXPECT_EQ(WithThousandsSeparators(18446744073709551615u),
            "18,446,744,073,709,551,615");
}

// A limiter on a manual clock whose summaries land in `lines`.
struct TestLimiter {
  explicit TestLimiter(LogRateLimitOptions options = {})
      : limiter(
            &clock,
            [this](LogLevel level, std::string_view text) {
              levels.push_back(level);
              lines.emplace_back(text);
            },
            options) {}
  // How many of `count` lines about `key` were admitted.
  int Admitted(std::string_view key, int count,
               LogLevel level = LogLevel::kWarning) {
    int admitted = 0;
    for (int i = 0; i < count; ++i) admitted += limiter.ShouldLog(level, key);
    return admitted;
  }
  ManualClock clock;
  std::vector<std::string> lines;
  std::vector<LogLevel> levels;
  LogRateLimiter limiter;
};

TEST(LogRateLimiterTest, FiveLinesPerKeyPerWindowThenACount) {
  TestLimiter test;
  EXPECT_EQ(test.Admitted("rejected PULL", 1208), 5);
  EXPECT_TRUE(test.lines.empty());
  // Not before the window has ended.
  test.clock.Advance(seconds(10) - std::chrono::nanoseconds(1));
  test.limiter.FlushDue();
  EXPECT_EQ(test.Admitted("rejected PULL", 10), 0);
  EXPECT_TRUE(test.lines.empty());
  // Lazily: the window ended and the key fell silent.
  test.clock.Advance(std::chrono::nanoseconds(1));
  test.limiter.FlushDue();
  ASSERT_EQ(test.lines.size(), 1u);
  EXPECT_EQ(test.lines[0],
            "… 1,213 more like this in the last 10 s: rejected PULL");
  EXPECT_EQ(test.levels[0], LogLevel::kWarning);
  test.limiter.FlushDue();
  test.limiter.FlushAll();
  EXPECT_EQ(test.lines.size(), 1u);  // once
  // A new window: five more, and its count.
  EXPECT_EQ(test.Admitted("rejected PULL", 7), 5);
  test.clock.AdvanceSeconds(25);
  test.limiter.FlushDue();
  ASSERT_EQ(test.lines.size(), 2u);
  EXPECT_EQ(test.lines[1],
            "… 2 more like this in the last 25 s: rejected PULL");
}

TEST(LogRateLimiterTest, TheCountPrecedesTheKeysNextLine) {
  TestLimiter test;
  EXPECT_EQ(test.Admitted("k", 8, LogLevel::kError), 5);
  test.clock.AdvanceSeconds(12.5);
  // No FlushDue: the next line of the key writes the count first.
  EXPECT_TRUE(test.limiter.ShouldLog(LogLevel::kError, "k"));
  ASSERT_EQ(test.lines.size(), 1u);
  EXPECT_EQ(test.lines[0], "… 3 more like this in the last 13 s: k");
  EXPECT_EQ(test.levels[0], LogLevel::kError);
  EXPECT_EQ(test.Admitted("k", 10), 4);  // 5 in the new window
}

TEST(LogRateLimiterTest, KeysAreIndependent) {
  TestLimiter test;
  EXPECT_EQ(test.Admitted("a", 100), 5);
  EXPECT_EQ(test.Admitted("b", 100), 5);
  EXPECT_EQ(test.Admitted("a", 100), 0);
  test.clock.AdvanceSeconds(10);
  test.limiter.FlushDue();
  std::sort(test.lines.begin(), test.lines.end());
  ASSERT_EQ(test.lines.size(), 2u);
  EXPECT_EQ(test.lines[0], "… 195 more like this in the last 10 s: a");
  EXPECT_EQ(test.lines[1], "… 95 more like this in the last 10 s: b");
}

TEST(LogRateLimiterTest, MadeUpKeysShareTheTotalBudget) {
  // A peer that names itself differently in every message.
  LogRateLimitOptions options;
  options.lines_in_total = 12;
  TestLimiter test(options);
  int admitted = 0;
  for (int i = 0; i < 10000; ++i) {
    admitted += test.limiter.ShouldLog(
        LogLevel::kError, "rejected from site-" + std::to_string(i % 3000));
  }
  EXPECT_EQ(admitted, 12);
  test.clock.AdvanceSeconds(10);
  test.limiter.FlushDue();
  // One count for all of them, none per made-up key.
  ASSERT_EQ(test.lines.size(), 1u);
  EXPECT_EQ(test.lines[0],
            "… 9,988 more rate-limited lines of any kind in the last 10 s "
            "(at most 12 per 10 s)");
  EXPECT_EQ(test.limiter.key_count(), 1024u);  // bounded
}

TEST(LogRateLimiterTest, TheOldestKeyIsEvictedWithItsCount) {
  LogRateLimitOptions options;
  options.max_keys = 3;
  TestLimiter test(options);
  EXPECT_EQ(test.Admitted("a", 7), 5);
  EXPECT_EQ(test.Admitted("b", 1), 1);
  EXPECT_EQ(test.Admitted("c", 1), 1);
  EXPECT_EQ(test.Admitted("a", 1), 0);  // a is the most recent again
  EXPECT_EQ(test.Admitted("d", 1), 1);  // evicts b (no count to write)
  EXPECT_TRUE(test.lines.empty());
  EXPECT_EQ(test.limiter.key_count(), 3u);
  test.clock.AdvanceSeconds(1);
  EXPECT_EQ(test.Admitted("e", 1), 1);  // evicts c
  EXPECT_EQ(test.Admitted("f", 1), 1);  // evicts a, which left 3 out
  ASSERT_EQ(test.lines.size(), 1u);
  EXPECT_EQ(test.lines[0], "… 3 more like this in the last 1 s: a");
  EXPECT_EQ(test.limiter.key_count(), 3u);
  // An evicted key starts afresh.
  EXPECT_EQ(test.Admitted("a", 6), 5);
}

TEST(LogRateLimiterTest, LongKeysAreCut) {
  TestLimiter test;
  const std::string long_key(10000, 'k');
  EXPECT_EQ(test.Admitted(long_key, 6), 5);
  // The same first kMaxKeyBytes: the same key.
  EXPECT_EQ(test.Admitted(long_key + "other", 1), 0);
  test.limiter.FlushAll();
  ASSERT_EQ(test.lines.size(), 1u);
  EXPECT_EQ(test.lines[0], "… 2 more like this in the last 1 s: " +
                               std::string(LogRateLimiter::kMaxKeyBytes, 'k'));
}

TEST(LogRateLimiterTest, ThreadsCountExactly) {
  TestLimiter test;
  std::atomic<int> admitted{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) {
        admitted += test.limiter.ShouldLog(LogLevel::kWarning, "same");
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(admitted.load(), 5);
  test.limiter.FlushAll();
  ASSERT_EQ(test.lines.size(), 1u);
  EXPECT_EQ(test.lines[0], "… 39,995 more like this in the last 1 s: same");
}

// The process-wide limiter on a manual clock, restored afterwards.
class GlobalLimiterTest : public ::testing::Test {
 protected:
  void SetUp() override { GlobalLogRateLimiter().Reset(&clock_, {}); }
  void TearDown() override { GlobalLogRateLimiter().Reset(SystemClock(), {}); }
  ManualClock clock_;
};

TEST_F(GlobalLimiterTest, MlogEveryKeyWritesAFewLinesAndLaterTheCount) {
  ::testing::internal::CaptureStderr();
  for (int i = 0; i < 1000; ++i) {
    MLOG_EVERY_KEY(WARNING, "bad hello") << "bad hello #" << i;
  }
  clock_.AdvanceSeconds(10);
  MLOG(INFO) << "something else";
  const std::string out = ::testing::internal::GetCapturedStderr();
  const std::vector<std::string> lines = Lines(out);
  ASSERT_EQ(lines.size(), 7u) << out;
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(MessageOf(lines[i]), "bad hello #" + std::to_string(i));
  }
  // The count comes with the next line of any kind, at the level of the
  // lines it counts.
  EXPECT_EQ(MessageOf(lines[5]),
            "… 995 more like this in the last 10 s: bad hello");
  EXPECT_TRUE(Contains(lines[5], " W ")) << lines[5];
  EXPECT_EQ(MessageOf(lines[6]), "something else");
}

TEST_F(GlobalLimiterTest, LinesBelowTheLogLevelAreNotCounted) {
  const LogLevel before = GetLogLevel();
  SetLogLevel(LogLevel::kWarning);
  for (int i = 0; i < 10; ++i)
    EXPECT_FALSE(ShouldLog(LogLevel::kInfo, "quiet"));
  SetLogLevel(before);
  EXPECT_EQ(GlobalLogRateLimiter().key_count(), 0u);
  ::testing::internal::CaptureStderr();
  MLOG_EVERY_KEY(WARNING, "quiet") << "first";
  EXPECT_EQ(Lines(::testing::internal::GetCapturedStderr()).size(), 1u);
}

}  // namespace
}  // namespace meridian
