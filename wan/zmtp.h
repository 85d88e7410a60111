// Counts ZeroMQ messages in one direction of a TCP byte stream by parsing
// ZMTP 3.x framing incrementally (rfc.zeromq.org/spec/23 and /37):
//
//   greeting: 64 bytes = signature 0xFF, 8 padding bytes, 0x7F; version
//             major (>= 3), minor; mechanism (20); as-server (1); filler (31)
//   frames:   flags byte (bit0 MORE, bit1 LONG, bit2 COMMAND, bits 3-7 must
//             be 0), size (1 byte, or 8 bytes big-endian when LONG), body
//
// A message is a non-command frame with MORE clear. A stream that does not
// start with a ZMTP 3.x greeting, or that breaks the framing later (reserved
// flag bits, a size >= 2^63), stops being parsed: it counts 0 further
// messages (its bytes are still counted exactly by the emulator).
//
// Encrypted streams (CURVE, rfc.zeromq.org/spec/26): after the handshake
// commands (HELLO, WELCOME, INITIATE, READY), every frame travels as one
// MESSAGE command (a command whose body starts with "\x07MESSAGE") whose
// flags, MORE included, are inside the ciphertext. Message boundaries are
// then invisible on the wire, so each MESSAGE command counts as one frame
// AND one message: a multipart message of k frames counts k. Meridian's
// mirror messages are a header frame plus one frame per tensor slice, so
// under CURVE `messages` counts frames (MIRROR_CLOCK: 1; MIRROR_UPDATE:
// 1 + slices). Bytes stay exact either way.
//
// The parser never looks at a byte twice and holds no buffer: any split of
// the stream into Consume() calls gives the same counts.
#ifndef MERIDIAN_WAN_ZMTP_H_
#define MERIDIAN_WAN_ZMTP_H_

#include <cstddef>
#include <cstdint>
#include <span>

namespace meridian::wan {

class ZmtpCounter {
 public:
  // Feeds the next bytes of the stream; returns the number of messages
  // whose last byte is among them.
  uint64_t Consume(std::span<const uint8_t> bytes);

  // How many of the next bytes the parser does not need to look at: the
  // rest of the current frame body, all of them (UINT64_MAX) once the stream
  // is not ZMTP, 0 when the next byte is framing. Lets a proxy forward them
  // without copying them (splice).
  uint64_t OpaqueBytesAhead() const;
  // Accounts for `n` <= OpaqueBytesAhead() bytes that were forwarded unseen;
  // returns the messages they completed (0 or 1).
  uint64_t SkipOpaque(uint64_t n);

  // False once the stream proved not to be ZMTP 3.x (or broke framing).
  bool is_zmtp() const { return state_ != State::kNotZmtp; }
  // True once a whole greeting has been seen.
  bool greeted() const { return greeted_; }
  uint64_t messages() const { return messages_; }
  // Data frames, including MESSAGE commands (encrypted frames).
  uint64_t frames() const { return frames_; }
  // Other command frames (handshakes, heartbeats).
  uint64_t commands() const { return commands_; }
  uint64_t bytes() const { return bytes_; }        // everything consumed

  static constexpr size_t kGreetingBytes = 64;

 private:
  enum class State { kGreeting, kFlags, kSize, kBody, kNotZmtp };
  void EndFrame();

  State state_ = State::kGreeting;
  bool greeted_ = false;
  size_t greeting_pos_ = 0;
  uint8_t flags_ = 0;
  size_t size_bytes_left_ = 0;  // of an 8-byte size still to read
  uint64_t size_ = 0;
  uint64_t body_left_ = 0;
  // The current command frame's name is still being compared with
  // "\x07MESSAGE" (its first name_pos_ bytes matched so far).
  bool name_pending_ = false;
  uint64_t name_pos_ = 0;
  bool message_command_ = false;  // the current command is a MESSAGE
  uint64_t messages_ = 0;
  uint64_t frames_ = 0;
  uint64_t commands_ = 0;
  uint64_t bytes_ = 0;
};

}  // namespace meridian::wan

#endif  // MERIDIAN_WAN_ZMTP_H_
