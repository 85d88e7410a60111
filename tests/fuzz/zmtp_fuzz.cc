// libFuzzer target for the ZMTP message counter of the WAN emulator
// (wan/zmtp.cc), which parses bytes straight from the network.
//
// Input: byte 0 picks how the rest is split into Consume() calls (a chunk
// size of 1 + byte0, with every 7th chunk cut short by one); the rest is the
// stream. Besides "no crash, no out-of-bounds read", it checks:
//  - any split gives the same counts as one Consume() of everything;
//  - the per-call return values add up to messages();
//  - the counts agree with a simple whole-buffer reference parser;
//  - messages <= frames, and once a stream is not ZMTP it stays so;
//  - a MESSAGE command (CURVE's encrypted frame) counts as a frame and a
//    message, any other command as a command;
//  - skipping opaque bytes (SkipOpaque, as the zero-copy path does) counts
//    the same as consuming them.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include "wan/zmtp.h"

namespace {

using meridian::wan::ZmtpCounter;

[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "zmtp_fuzz: invariant violated: %s\n", what);
  std::abort();
}

void Require(bool condition, const char* what) {
  if (!condition) Fail(what);
}

struct Counts {
  uint64_t messages = 0;
  uint64_t frames = 0;
  uint64_t commands = 0;
  bool zmtp = true;
};

// Reference: parses a complete buffer front to back, written independently
// of the incremental state machine.
Counts Reference(const uint8_t* data, size_t size) {
  Counts c;
  if (size == 0) return c;
  // Greeting checks on the bytes that are present.
  if (data[0] != 0xFF || (size > 9 && data[9] != 0x7F) ||
      (size > 10 && data[10] < 3)) {
    c.zmtp = false;
    return c;
  }
  size_t pos = 64;
  while (pos < size) {
    const uint8_t flags = data[pos++];
    if (flags & 0xF8) {
      c.zmtp = false;
      return c;
    }
    const size_t size_bytes = (flags & 0x02) ? 8 : 1;
    if (pos + size_bytes > size) return c;  // size cut off
    uint64_t length = 0;
    for (size_t i = 0; i < size_bytes; ++i)
      length = (length << 8) | data[pos + i];
    pos += size_bytes;
    if (length >> 63) {
      c.zmtp = false;
      return c;
    }
    if (length > size - pos) return c;  // body cut off
    // A command whose name is MESSAGE carries one encrypted frame (CURVE):
    // a frame and a message.
    const bool message_command =
        (flags & 0x04) && length >= 8 &&
        std::memcmp(data + pos, "\x07MESSAGE", 8) == 0;
    pos += static_cast<size_t>(length);
    if (message_command) {
      ++c.frames;
      ++c.messages;
    } else if (flags & 0x04) {
      ++c.commands;
    } else {
      ++c.frames;
      if (!(flags & 0x01)) ++c.messages;
    }
  }
  return c;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t step = size_t{data[0]} + 1;
  const uint8_t* stream = data + 1;
  const size_t n = size - 1;

  ZmtpCounter whole;
  const uint64_t all = whole.Consume({stream, n});
  Require(all == whole.messages(), "return value of one call");
  Require(whole.bytes() == n, "bytes counted");
  Require(whole.messages() <= whole.frames(), "messages <= frames");

  ZmtpCounter split;
  uint64_t sum = 0;
  bool was_zmtp = true;
  size_t pos = 0;
  for (int call = 0; pos < n; ++call) {
    size_t take = std::min(step, n - pos);
    if (call % 7 == 6 && take > 1) --take;
    sum += split.Consume({stream + pos, take});
    pos += take;
    Require(was_zmtp || !split.is_zmtp(), "not ZMTP stays not ZMTP");
    was_zmtp = split.is_zmtp();
  }
  split.Consume({});  // empty calls are harmless

  // A proxy that forwards opaque bytes unseen (splice) must count the same.
  ZmtpCounter skipping;
  uint64_t skipped_sum = 0;
  pos = 0;
  for (int call = 0; pos < n; ++call) {
    const uint64_t opaque = skipping.OpaqueBytesAhead();
    if (call % 2 == 0 && opaque > 0) {
      const size_t take =
          static_cast<size_t>(std::min<uint64_t>(opaque, n - pos));
      skipped_sum += skipping.SkipOpaque(take);
      pos += take;
    } else {
      const size_t take = std::min(step, n - pos);
      skipped_sum += skipping.Consume({stream + pos, take});
      pos += take;
    }
  }
  Require(skipped_sum == skipping.messages(), "skipping: counts add up");
  Require(skipping.messages() == whole.messages(), "skipping: messages");
  Require(skipping.frames() == whole.frames(), "skipping: frames");
  Require(skipping.bytes() == n, "skipping: bytes");
  Require(sum == split.messages(), "per-call counts add up");
  Require(split.messages() == whole.messages(), "split: messages");
  Require(split.frames() == whole.frames(), "split: frames");
  Require(split.commands() == whole.commands(), "split: commands");
  Require(split.is_zmtp() == whole.is_zmtp(), "split: zmtp");

  const Counts reference = Reference(stream, n);
  Require(reference.messages == whole.messages(), "reference: messages");
  Require(reference.frames == whole.frames(), "reference: frames");
  Require(reference.commands == whole.commands(), "reference: commands");
  Require(reference.zmtp == whole.is_zmtp(), "reference: zmtp");
  return 0;
}
