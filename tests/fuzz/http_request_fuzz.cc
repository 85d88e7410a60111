// libFuzzer target for what the metrics endpoint reads from a peer: the
// request-head parser (FindHeadEnd, ParseRequestHead in
// src/metrics/http_request.cc) and a connection's head buffering
// (HttpConnection::Read/TakeHead in src/metrics/http_connection.cc) over a
// real socket pair, fed in pieces.
//
// Input: byte 0 picks the piece size (1..64 bytes per write), byte 1 the
// head buffer's size (64..16384 bytes); the rest is the byte stream a
// client sends. Besides "no crash, no leak", it checks:
//  - FindHeadEnd depends on the prefix only: no end before it, the same
//    end on every longer prefix;
//  - an accepted head holds what HttpRequestHead promises (a path without
//    control characters, spaces, '#' or '?'; HTTP/1.0 or 1.1), a refusal
//    one of the statuses the endpoint answers, with a reason;
//  - an accepted head written back canonically parses to the same head;
//  - the connection, fed in pieces, yields exactly the heads the whole
//    stream splits into, in order, and says kFull exactly when the next
//    head does not fit its buffer.

#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "meridian/metrics/metrics.h"
#include "metrics/connection_budget.h"
#include "metrics/http_connection.h"
#include "metrics/http_request.h"

namespace {

using meridian::HttpRefusal;
using meridian::HttpRequestHead;
using meridian::ParsedRequestHead;

[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "http_request_fuzz: invariant violated: %s\n", what);
  std::abort();
}

void Require(bool condition, const char* what) {
  if (!condition) Fail(what);
}

bool SameParse(const ParsedRequestHead& a, const ParsedRequestHead& b) {
  if (a.index() != b.index()) return false;
  if (const auto* head = std::get_if<HttpRequestHead>(&a)) {
    return *head == std::get<HttpRequestHead>(b);
  }
  const HttpRefusal& x = std::get<HttpRefusal>(a);
  const HttpRefusal& y = std::get<HttpRefusal>(b);
  return x.status == y.status && x.reason == y.reason;
}

void CheckParse(const ParsedRequestHead& parsed) {
  if (const auto* refusal = std::get_if<HttpRefusal>(&parsed)) {
    const int s = refusal->status;
    Require(s == 400 || s == 405 || s == 413 || s == 501 || s == 505,
            "a refusal with an unexpected status");
    Require(!refusal->reason.empty(), "a refusal without a reason");
    return;
  }
  const HttpRequestHead& head = std::get<HttpRequestHead>(parsed);
  Require(!head.path.empty() && head.path.front() == '/',
          "an accepted path that does not start with /");
  for (char c : head.path) {
    const auto byte = static_cast<unsigned char>(c);
    Require(byte > 0x20 && byte < 0x7f && c != '#' && c != '?',
            "an accepted path with a forbidden character");
  }
  Require(head.minor_version == 0 || head.minor_version == 1,
          "an accepted version other than 1.0 and 1.1");
  // Written back canonically, it parses to the same head.
  std::string again = head.method == meridian::HttpMethod::kGet ? "GET " : "HEAD ";
  again += head.path + " HTTP/1." + std::to_string(head.minor_version) + "\r\n";
  if (head.minor_version == 1 && !head.keep_alive) {
    again += "Connection: close\r\n";
  }
  if (head.minor_version == 0 && head.keep_alive) {
    again += "Connection: keep-alive\r\n";
  }
  again += "\r\n";
  Require(SameParse(meridian::ParseRequestHead(again), parsed),
          "a head written back canonically parses differently");
}

// The heads of `stream` as a connection with a buffer of `capacity` sees
// them; *full: the stream stops at a head that does not fit.
std::vector<ParsedRequestHead> SplitHeads(std::string_view stream,
                                          size_t capacity, bool* full) {
  std::vector<ParsedRequestHead> heads;
  *full = false;
  while (true) {
    const size_t end = meridian::FindHeadEnd(stream.substr(0, capacity));
    if (end == std::string_view::npos) {
      *full = stream.size() >= capacity;
      return heads;
    }
    heads.push_back(meridian::ParseRequestHead(stream.substr(0, end)));
    stream.remove_prefix(end);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const size_t piece = 1 + data[0] % 64;
  const size_t capacity = 64 + (static_cast<size_t>(data[1]) * 64) % 16321;
  const std::string_view stream(reinterpret_cast<const char*>(data + 2),
                                size - 2);

  // The parser on the whole stream.
  const size_t end = meridian::FindHeadEnd(stream);
  if (end != std::string_view::npos) {
    Require(end <= stream.size(), "a head end past the bytes");
    Require(meridian::FindHeadEnd(stream.substr(0, end)) == end,
            "the head end moved when the bytes after it went");
    if (end > 0) {
      Require(meridian::FindHeadEnd(stream.substr(0, end - 1)) ==
                  std::string_view::npos,
              "a head end before the one found");
    }
    CheckParse(meridian::ParseRequestHead(stream.substr(0, end)));
  }
  CheckParse(meridian::ParseRequestHead(stream));

  // A connection fed in pieces yields the same heads.
  bool full = false;
  const std::vector<ParsedRequestHead> expected =
      SplitHeads(stream, capacity, &full);
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) return 0;
  meridian::MetricsServerLimits limits;
  limits.max_request_bytes = capacity;
  const auto now = std::chrono::steady_clock::now();
  meridian::HttpConnection connection(fds[1], 1, meridian::PeerAddress(), now,
                                      limits);
  size_t taken = 0;
  bool saw_full = false;
  for (size_t offset = 0; offset < stream.size() && !saw_full;
       offset += piece) {
    const std::string_view bytes = stream.substr(offset, piece);
    Require(::send(fds[0], bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
                static_cast<ssize_t>(bytes.size()),
            "the socket pair did not take a piece");
    while (true) {
      const auto status = connection.Read();
      if (status == meridian::HttpConnection::ReadStatus::kWaiting) {
        int pending = 0;  // one recv may not take all the pieces sent
        if (::ioctl(fds[1], FIONREAD, &pending) == 0 && pending > 0) continue;
        break;
      }
      if (status == meridian::HttpConnection::ReadStatus::kFull) {
        saw_full = true;
        break;
      }
      Require(status == meridian::HttpConnection::ReadStatus::kHead,
              "the connection closed with its peer open");
      while (connection.HasHead()) {
        Require(taken < expected.size(), "more heads than the stream holds");
        Require(SameParse(connection.TakeHead(), expected[taken]),
                "a head differs from the stream's");
        ++taken;
      }
    }
  }
  Require(taken == expected.size(), "fewer heads than the stream holds");
  Require(saw_full == full, "kFull when the next head fits, or not when not");
  ::close(fds[0]);
  return 0;
}
