// One client connection of the metrics endpoint: its socket, the bytes of
// the request head it is reading, the response it is writing, and its
// deadlines. Never blocks: the server's event loop calls Read() when the
// socket is readable and Write() when it is writable.
//
// Bounds: the head buffer holds at most max_request_bytes (allocated on the
// first byte, so a silent connection costs none); the response is a head
// of its own (a few hundred bytes) and a body shared with the other
// responses rendered at the same time (never copied). Deadlines (see
// MetricsServerLimits): a request head must be complete io_timeout after
// the connection began waiting for it (accepted, or its previous response
// written), however its bytes trickle in; a response must move at least a
// byte every io_timeout; and nothing outlives connection_timeout from
// accept.
//
// Owned and driven by the server's event loop thread alone.
#ifndef MERIDIAN_METRICS_HTTP_CONNECTION_H_
#define MERIDIAN_METRICS_HTTP_CONNECTION_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "meridian/metrics/metrics.h"
#include "metrics/connection_budget.h"
#include "metrics/http_request.h"

namespace meridian {

class HttpConnection {
 public:
  using Time = std::chrono::steady_clock::time_point;

  // Takes ownership of `fd` (non-blocking) and closes it on destruction.
  HttpConnection(int fd, uint64_t id, const PeerAddress& peer, Time now,
                 const MetricsServerLimits& limits);
  ~HttpConnection();
  HttpConnection(const HttpConnection&) = delete;
  HttpConnection& operator=(const HttpConnection&) = delete;

  enum class ReadStatus {
    kWaiting,  // no complete head yet: wait for the socket to be readable
    kHead,     // a complete head is buffered: TakeHead()
    kFull,     // max_request_bytes without the end of a head
    kClosed,   // the client closed or the socket failed, no head buffered
  };
  // Reads what the socket holds now (one recv), up to the buffer's room.
  ReadStatus Read();
  // A complete head is buffered (a pipelined request may follow a
  // response).
  bool HasHead() const;
  // Precondition: HasHead(). The head, parsed; the buffer keeps the bytes
  // after it.
  ParsedRequestHead TakeHead();

  // Starts writing a response: `head` (status line and header lines, with
  // the blank line) then `body` (may be null: no body). `close_after`: the
  // connection ends once it is written.
  void Respond(std::string head, std::shared_ptr<const std::string> body,
               bool close_after, Time now);
  enum class WriteStatus {
    kDone,     // the response is written; the connection waits for the
               // next request (or ends: close_after())
    kBlocked,  // the client has not taken it all: wait for writable
    kFailed,   // the client is gone
  };
  WriteStatus Write(Time now);
  bool close_after() const { return close_after_; }
  // Whether the connection writes a response (between Respond and kDone).
  bool writing() const { return writing_; }
  // Whether the client closed its side (after sending a request).
  bool peer_closed() const { return peer_closed_; }

  // When the connection must end if nothing changes: the head's deadline
  // while reading, the next progress's while writing, and never after
  // connection_timeout from accept.
  Time deadline() const;
  // Requests answered on this connection so far.
  size_t requests() const { return requests_; }

  // Closes the socket now; `reset`: with an RST, so that the kernel drops
  // what it still holds for a client that does not read.
  void Close(bool reset);

  int fd() const { return fd_; }
  uint64_t id() const { return id_; }
  const PeerAddress& peer() const { return peer_; }

 private:
  int fd_;
  const uint64_t id_;
  const PeerAddress peer_;
  const MetricsServerLimits& limits_;
  const Time end_of_life_;   // accept + connection_timeout
  Time phase_deadline_;      // the head's, or the next write progress's
  std::unique_ptr<char[]> buffer_;  // max_request_bytes, on the first byte
  size_t buffered_ = 0;
  bool peer_closed_ = false;
  // The response being written.
  bool writing_ = false;
  bool close_after_ = false;
  std::string response_head_;
  std::shared_ptr<const std::string> body_;
  size_t written_ = 0;  // of response_head_ + *body_
  size_t requests_ = 0;
};

}  // namespace meridian

#endif  // MERIDIAN_METRICS_HTTP_CONNECTION_H_
