#include <algorithm>

#include "wan/zmtp.h"

namespace meridian::wan {
namespace {

constexpr uint8_t kMore = 0x01;
constexpr uint8_t kLong = 0x02;
constexpr uint8_t kCommand = 0x04;
constexpr uint8_t kReserved = 0xF8;
// How a MESSAGE command's body starts: the length-prefixed command name
// (RFC 26 CurveZMQ, RFC 38 GSSAPI). The rest of its body is ciphertext.
constexpr uint8_t kMessageName[] = {7, 'M', 'E', 'S', 'S', 'A', 'G', 'E'};
constexpr uint64_t kMessageNameBytes = sizeof(kMessageName);
// Greeting offsets.
constexpr size_t kSignatureEnd = 9;  // 0x7F
constexpr size_t kVersionMajor = 10;

}  // namespace

void ZmtpCounter::EndFrame() {
  if (flags_ & kCommand) {
    if (message_command_) {
      // One encrypted frame; its MORE flag is inside the ciphertext, so
      // each counts as a message (see zmtp.h).
      ++frames_;
      ++messages_;
    } else {
      ++commands_;
    }
    message_command_ = false;
  } else {
    ++frames_;
    if (!(flags_ & kMore)) ++messages_;
  }
  state_ = State::kFlags;
}

uint64_t ZmtpCounter::OpaqueBytesAhead() const {
  if (state_ == State::kNotZmtp) return UINT64_MAX;
  if (state_ == State::kBody && !name_pending_) return body_left_;
  return 0;
}

uint64_t ZmtpCounter::SkipOpaque(uint64_t n) {
  n = std::min(n, OpaqueBytesAhead());
  bytes_ += n;
  if (state_ != State::kBody || n == 0) return 0;
  const uint64_t before = messages_;
  body_left_ -= n;
  if (body_left_ == 0) EndFrame();
  return messages_ - before;
}

uint64_t ZmtpCounter::Consume(std::span<const uint8_t> bytes) {
  bytes_ += bytes.size();
  const uint64_t before = messages_;
  size_t pos = 0;
  while (pos < bytes.size()) {
    switch (state_) {
      case State::kNotZmtp:
        return messages_ - before;
      case State::kGreeting: {
        const uint8_t byte = bytes[pos];
        const size_t at = greeting_pos_;
        if ((at == 0 && byte != 0xFF) ||
            (at == kSignatureEnd && byte != 0x7F) ||
            (at == kVersionMajor && byte < 3)) {
          state_ = State::kNotZmtp;
          return messages_ - before;
        }
        ++pos;
        if (++greeting_pos_ == kGreetingBytes) {
          greeted_ = true;
          state_ = State::kFlags;
        }
        break;
      }
      case State::kFlags: {
        flags_ = bytes[pos++];
        if (flags_ & kReserved) {
          state_ = State::kNotZmtp;
          return messages_ - before;
        }
        size_ = 0;
        size_bytes_left_ = (flags_ & kLong) ? 8 : 1;
        state_ = State::kSize;
        break;
      }
      case State::kSize: {
        size_ = (size_ << 8) | bytes[pos++];
        if (--size_bytes_left_ > 0) break;
        if (size_ >> 63) {  // sizes are at most 2^63 - 1
          state_ = State::kNotZmtp;
          return messages_ - before;
        }
        body_left_ = size_;
        // A command's name decides whether it is a MESSAGE: look at the
        // first bytes of its body.
        name_pending_ = (flags_ & kCommand) && size_ >= kMessageNameBytes;
        name_pos_ = 0;
        message_command_ = false;
        if (body_left_ == 0) {
          EndFrame();
        } else {
          state_ = State::kBody;
        }
        break;
      }
      case State::kBody: {
        if (name_pending_) {
          const uint8_t byte = bytes[pos++];
          --body_left_;
          if (byte != kMessageName[name_pos_]) {
            name_pending_ = false;
          } else if (++name_pos_ == kMessageNameBytes) {
            name_pending_ = false;
            message_command_ = true;
          }
          if (body_left_ == 0) EndFrame();
          break;
        }
        const uint64_t take =
            std::min<uint64_t>(body_left_, bytes.size() - pos);
        pos += static_cast<size_t>(take);
        body_left_ -= take;
        if (body_left_ == 0) EndFrame();
        break;
      }
    }
  }
  return messages_ - before;
}

}  // namespace meridian::wan
