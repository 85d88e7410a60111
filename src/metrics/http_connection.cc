#include "metrics/http_connection.h"

#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace meridian {

HttpConnection::HttpConnection(int fd, uint64_t id, const PeerAddress& peer,
                               Time now, const MetricsServerLimits& limits)
    : fd_(fd),
      id_(id),
      peer_(peer),
      limits_(limits),
      end_of_life_(now + limits.connection_timeout),
      phase_deadline_(now + limits.io_timeout) {}

HttpConnection::~HttpConnection() { Close(false); }

void HttpConnection::Close(bool reset) {
  if (fd_ < 0) return;
  if (reset) {
    const linger abort{1, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_LINGER, &abort, sizeof(abort));
  }
  ::close(fd_);
  fd_ = -1;
}

HttpConnection::ReadStatus HttpConnection::Read() {
  if (HasHead()) return ReadStatus::kHead;
  const size_t capacity = std::max<size_t>(1, limits_.max_request_bytes);
  if (buffered_ >= capacity) return ReadStatus::kFull;
  if (!buffer_) buffer_ = std::make_unique<char[]>(capacity);
  const ssize_t n = ::recv(fd_, buffer_.get() + buffered_,
                           capacity - buffered_, MSG_DONTWAIT);
  if (n == 0) {
    peer_closed_ = true;
    return ReadStatus::kClosed;
  }
  if (n < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
      return ReadStatus::kWaiting;
    }
    peer_closed_ = true;
    return ReadStatus::kClosed;
  }
  buffered_ += static_cast<size_t>(n);
  if (HasHead()) return ReadStatus::kHead;
  return buffered_ >= capacity ? ReadStatus::kFull : ReadStatus::kWaiting;
}

bool HttpConnection::HasHead() const {
  return buffered_ > 0 &&
         FindHeadEnd(std::string_view(buffer_.get(), buffered_)) !=
             std::string_view::npos;
}

ParsedRequestHead HttpConnection::TakeHead() {
  const std::string_view bytes(buffer_.get(), buffered_);
  const size_t end = FindHeadEnd(bytes);
  ParsedRequestHead parsed = ParseRequestHead(bytes.substr(0, end));
  std::memmove(buffer_.get(), buffer_.get() + end, buffered_ - end);
  buffered_ -= end;
  return parsed;
}

void HttpConnection::Respond(std::string head,
                             std::shared_ptr<const std::string> body,
                             bool close_after, Time now) {
  ++requests_;
  writing_ = true;
  close_after_ = close_after;
  response_head_ = std::move(head);
  body_ = std::move(body);
  written_ = 0;
  phase_deadline_ = now + limits_.io_timeout;
}

HttpConnection::WriteStatus HttpConnection::Write(Time now) {
  const size_t body_size = body_ ? body_->size() : 0;
  const size_t total = response_head_.size() + body_size;
  while (written_ < total) {
    iovec parts[2];
    int count = 0;
    if (written_ < response_head_.size()) {
      parts[count++] = {response_head_.data() + written_,
                        response_head_.size() - written_};
    }
    const size_t body_offset =
        written_ > response_head_.size() ? written_ - response_head_.size()
                                         : 0;
    if (body_size > body_offset) {
      parts[count++] = {const_cast<char*>(body_->data()) + body_offset,
                        body_size - body_offset};
    }
    msghdr message{};
    message.msg_iov = parts;
    message.msg_iovlen = static_cast<size_t>(count);
    const ssize_t n = ::sendmsg(fd_, &message, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return WriteStatus::kBlocked;
      return WriteStatus::kFailed;
    }
    written_ += static_cast<size_t>(n);
    phase_deadline_ = now + limits_.io_timeout;
  }
  // Written: give the body back (it may be large) and wait for the next
  // head, from now.
  writing_ = false;
  body_.reset();
  response_head_.clear();
  response_head_.shrink_to_fit();
  written_ = 0;
  phase_deadline_ = now + limits_.io_timeout;
  return WriteStatus::kDone;
}

HttpConnection::Time HttpConnection::deadline() const {
  return std::min(phase_deadline_, end_of_life_);
}

}  // namespace meridian
