// Counting ZeroMQ messages in a TCP byte stream (ZMTP 3.x framing).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "wan/zmtp.h"

namespace meridian::wan {
namespace {

std::string Greeting(uint8_t major = 3) {
  std::string g(64, '\0');
  g[0] = '\xFF';
  g[8] = '\x01';
  g[9] = '\x7F';
  g[10] = static_cast<char>(major);
  g[11] = '\x00';
  g.replace(12, 4, "NULL");
  return g;
}

std::string Frame(const std::string& body, bool more, bool command = false,
                  bool force_long = false) {
  std::string f;
  const bool is_long = force_long || body.size() > 255;
  f +=
      static_cast<char>((more ? 1 : 0) | (is_long ? 2 : 0) | (command ? 4 : 0));
  if (is_long) {
    for (int i = 7; i >= 0; --i) {
      f += static_cast<char>((static_cast<uint64_t>(body.size()) >> (8 * i)) &
                             0xFF);
    }
  } else {
    f += static_cast<char>(body.size());
  }
  return f + body;
}

// A NULL-mechanism handshake and `n` messages of `parts` frames each.
std::string Stream(int n, int parts, size_t frame_bytes) {
  std::string s = Greeting();
  s += Frame("\x05READY\x0bSocket-Type\x00\x00\x00\x04PUSH", false, true);
  for (int m = 0; m < n; ++m) {
    for (int p = 0; p < parts; ++p) {
      s += Frame(std::string(frame_bytes + p, 'x'), p + 1 < parts);
    }
  }
  return s;
}

uint64_t CountAtOnce(const std::string& s) {
  ZmtpCounter counter;
  return counter.Consume(
      {reinterpret_cast<const uint8_t*>(s.data()), s.size()});
}

TEST(ZmtpTest, CountsMessagesNotFramesOrCommands) {
  ZmtpCounter counter;
  const std::string s = Stream(10, 3, 20);
  EXPECT_EQ(
      counter.Consume({reinterpret_cast<const uint8_t*>(s.data()), s.size()}),
      10u);
  EXPECT_TRUE(counter.is_zmtp());
  EXPECT_TRUE(counter.greeted());
  EXPECT_EQ(counter.frames(), 30u);
  EXPECT_EQ(counter.commands(), 1u);
  EXPECT_EQ(counter.bytes(), s.size());
}

TEST(ZmtpTest, LongFramesAndEmptyFrames) {
  std::string s = Greeting();
  s += Frame(std::string(100000, 'y'), true);  // long
  s += Frame("", false);                       // empty, ends message 1
  s += Frame("ab", false, false, /*force_long=*/true);
  s += Frame("", false);
  EXPECT_EQ(CountAtOnce(s), 3u);
}

TEST(ZmtpTest, AnySplitGivesTheSameCount) {
  const std::string s = Stream(7, 2, 300);
  for (size_t step : {1u, 2u, 3u, 7u, 63u, 64u, 65u, 1000u}) {
    ZmtpCounter counter;
    uint64_t total = 0;
    for (size_t pos = 0; pos < s.size(); pos += step) {
      const size_t n = std::min(step, s.size() - pos);
      total += counter.Consume(
          {reinterpret_cast<const uint8_t*>(s.data()) + pos, n});
    }
    EXPECT_EQ(total, 7u) << "step " << step;
    EXPECT_EQ(counter.messages(), 7u);
  }
}

TEST(ZmtpTest, MessageIsCountedWhenItsLastByteArrives) {
  ZmtpCounter counter;
  const std::string head = Greeting() + Frame("hello", false);
  const auto* p = reinterpret_cast<const uint8_t*>(head.data());
  EXPECT_EQ(counter.Consume({p, head.size() - 1}), 0u);
  EXPECT_EQ(counter.Consume({p + head.size() - 1, 1}), 1u);
}

TEST(ZmtpTest, NonZmtpStreamsCountNothing) {
  EXPECT_EQ(CountAtOnce("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), 0u);
  ZmtpCounter counter;
  const std::string http = "GET / HTTP/1.1\r\n";
  counter.Consume({reinterpret_cast<const uint8_t*>(http.data()), http.size()});
  EXPECT_FALSE(counter.is_zmtp());
  // ZMTP 2 (major version 1) is not counted either.
  std::string old = Greeting(1) + Frame("x", false);
  EXPECT_EQ(CountAtOnce(old), 0u);
  // A bad signature end.
  std::string bad = Stream(2, 1, 4);
  bad[9] = 'x';
  EXPECT_EQ(CountAtOnce(bad), 0u);
}

TEST(ZmtpTest, BrokenFramingStopsCounting) {
  std::string s = Greeting() + Frame("a", false);
  s += '\x80';  // reserved flag bit
  s += Frame("b", false);
  ZmtpCounter counter;
  EXPECT_EQ(
      counter.Consume({reinterpret_cast<const uint8_t*>(s.data()), s.size()}),
      1u);
  EXPECT_FALSE(counter.is_zmtp());
  // A size with the top bit set.
  std::string huge = Greeting();
  huge += '\x02';
  huge += std::string("\x80\0\0\0\0\0\0\0", 8);
  ZmtpCounter counter2;
  counter2.Consume(
      {reinterpret_cast<const uint8_t*>(huge.data()), huge.size()});
  EXPECT_FALSE(counter2.is_zmtp());
}

TEST(ZmtpTest, HugeDeclaredFrameOnlyWaitsForBytes) {
  std::string s = Greeting();
  s += '\x02';
  s += std::string("\x00\x00\x10\x00\x00\x00\x00\x00", 8);  // 16 TiB
  s += "some body bytes";
  ZmtpCounter counter;
  EXPECT_EQ(
      counter.Consume({reinterpret_cast<const uint8_t*>(s.data()), s.size()}),
      0u);
  EXPECT_TRUE(counter.is_zmtp());
}

// A CURVE stream: handshake commands, then one MESSAGE command per frame
// (flags encrypted). Each MESSAGE counts as a frame and a message; other
// commands (including one named like MESSAGE but not it) as commands; a
// MESSAGE command split anywhere, or skipped unseen after its name, counts
// the same.
TEST(ZmtpTest, CurveMessageCommandsCountOncePerFrame) {
  std::string s = Greeting();
  s.replace(12, 5, "CURVE");
  s += Frame("\x05HELLO" + std::string(194, '\0'), false, true);
  s += Frame("\x08INITIATE" + std::string(300, 'i'), false, true);
  s += Frame("\x07MESSAGX" + std::string(40, 'm'), false, true);  // not it
  s += Frame("\x07MESSAG", false, true);  // too short to be a MESSAGE
  for (int i = 0; i < 5; ++i) {
    s += Frame("\x07MESSAGE" + std::string(8 + 17 + 100 * i, 'c'), false,
               true, /*force_long=*/i == 4);
  }
  s += Frame("\x07MESSAGE" + std::string(70000, 'c'), false, true);  // long
  for (size_t step : {1u, 3u, 8u, 9u, 64u, 100000u}) {
    ZmtpCounter counter;
    uint64_t total = 0;
    for (size_t pos = 0; pos < s.size(); pos += step) {
      const auto* p = reinterpret_cast<const uint8_t*>(s.data());
      total += counter.Consume({p + pos, std::min(step, s.size() - pos)});
    }
    EXPECT_EQ(total, 6u) << "step " << step;
    EXPECT_EQ(counter.frames(), 6u);
    EXPECT_EQ(counter.commands(), 4u);
    EXPECT_EQ(counter.bytes(), s.size());
    EXPECT_TRUE(counter.is_zmtp());
  }
  // The name is framing; the ciphertext after it may be skipped unseen.
  ZmtpCounter skipping;
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  size_t pos = 0;
  uint64_t total = 0;
  while (pos < s.size()) {
    const uint64_t opaque = skipping.OpaqueBytesAhead();
    if (opaque > 0) {
      const size_t n = static_cast<size_t>(
          std::min<uint64_t>(opaque, s.size() - pos));
      total += skipping.SkipOpaque(n);
      pos += n;
    } else {
      total += skipping.Consume({p + pos, 1});
      ++pos;
    }
  }
  EXPECT_EQ(total, 6u);
  EXPECT_EQ(skipping.commands(), 4u);
  EXPECT_EQ(skipping.bytes(), s.size());
}

}  // namespace
}  // namespace meridian::wan
