// MetricsServer: the metrics endpoint's event loop. One thread waits on
// epoll for the listening socket, every connection and a wake-up eventfd;
// every socket is non-blocking, so no client can hold the loop. The
// connections (HttpConnection) read request heads into bounded buffers and
// write responses as their clients take them; ConnectionBudget decides
// which connection makes room for a new one; deadlines are swept when the
// earliest one is due.
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "meridian/core/log.h"
#include "meridian/metrics/metrics.h"
#include "metrics/connection_budget.h"
#include "metrics/http_connection.h"
#include "metrics/http_request.h"

namespace meridian {
namespace {

using SteadyClock = std::chrono::steady_clock;
using Time = SteadyClock::time_point;

// The kernel's queue of connections not yet accepted (capped by
// net.core.somaxconn). The loop accepts at once, so this only matters for
// a burst: a full queue drops a SYN, which the client retries after 1 s.
constexpr int kListenBacklog = 1024;
// Connections accepted per turn of the loop, so that a flood of new
// connections cannot keep the loop from answering requests that arrived.
constexpr int kAcceptBatch = 16;
// How long the loop stops accepting after accept() ran out of descriptors
// or memory (instead of failing in a tight loop).
constexpr auto kAcceptPause = std::chrono::milliseconds(100);
// A render younger than this may be shared while max_rendered_responses
// responses wait for readers.
constexpr auto kRenderReuseWindow = std::chrono::seconds(1);
// Longest path quoted back in a 404.
constexpr size_t kMaxQuotedPath = 200;

constexpr uint64_t kWakeId = 0;
constexpr uint64_t kListenId = 1;

std::string ResponseHead(int status, size_t content_length, bool close,
                         bool http10, bool text_format) {
  std::string head = "HTTP/1.1 " + std::to_string(status) + " ";
  head += HttpReasonPhrase(status);
  head += "\r\nContent-Type: ";
  head += text_format ? "text/plain; version=0.0.4; charset=utf-8"
                      : "text/plain; charset=utf-8";
  head += "\r\nContent-Length: " + std::to_string(content_length) + "\r\n";
  if (close) {
    head += "Connection: close\r\n";
  } else if (http10) {
    head += "Connection: keep-alive\r\n";
  }
  if (status == 405) head += "Allow: GET, HEAD\r\n";
  return head + "\r\n";
}

// Binds and listens on `address` (the first of its resolved addresses
// that binds): a non-blocking socket with SO_REUSEADDR only (SO_REUSEPORT
// would let a second server silently share the port instead of failing).
Result<int> Listen(const MetricsAddress& address) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(address.port);
  const Status unavailable = UnavailableError(
      "cannot listen for metrics on " + address.ToString() +
      " (address in use or not on this host)");
  if (::getaddrinfo(address.host.c_str(), port.c_str(), &hints, &found) != 0) {
    return unavailable;
  }
  int fd = -1;
  for (addrinfo* ai = found; ai != nullptr && fd < 0; ai = ai->ai_next) {
    fd = ::socket(ai->ai_family,
                  ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                  ai->ai_protocol);
    if (fd < 0) continue;
    const int yes = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 ||
        ::listen(fd, kListenBacklog) != 0) {
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(found);
  if (fd < 0) return unavailable;
  return fd;
}

int BoundPort(int fd) {
  sockaddr_storage bound{};
  socklen_t length = sizeof(bound);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length) != 0) {
    return -1;
  }
  if (bound.ss_family == AF_INET) {
    return ntohs(reinterpret_cast<const sockaddr_in*>(&bound)->sin_port);
  }
  return ntohs(reinterpret_cast<const sockaddr_in6*>(&bound)->sin6_port);
}

}  // namespace

// The event loop. Threads: Start, Stop, address() and url() belong to the
// owner; everything else to the loop's thread, which runs from Start until
// Stop wakes it (stopping_ and the eventfd are the only state shared).
class MetricsServer::Impl {
 public:
  Impl(const MetricsRegistry* registry, const MetricsServerLimits& limits)
      : registry_(registry),
        limits_(limits),
        budget_(limits.max_connections, limits.max_connections_per_address) {}
  ~Impl() {
    Stop();
    for (int fd : {listen_fd_, epoll_fd_, wake_fd_}) {
      if (fd >= 0) ::close(fd);
    }
  }

  Status Start(const MetricsAddress& address) {
    MERIDIAN_ASSIGN_OR_RETURN(listen_fd_, Listen(address));
    const int port = BoundPort(listen_fd_);
    epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
    wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (port <= 0 || epoll_fd_ < 0 || wake_fd_ < 0 ||
        !Watch(wake_fd_, kWakeId, EPOLLIN, EPOLL_CTL_ADD) ||
        !Watch(listen_fd_, kListenId, EPOLLIN, EPOLL_CTL_ADD)) {
      return UnavailableError("metrics server on " + address.ToString() +
                              ": " + std::strerror(errno));
    }
    address_ = MetricsAddress{address.host, port}.ToString();
    url_host_ = address.host == "0.0.0.0" ? "127.0.0.1" : address.host;
    url_host_.append(":").append(std::to_string(port));
    thread_ = std::thread([this] { Loop(); });
    return Status::Ok();
  }

  void Stop() {
    if (!thread_.joinable()) return;
    stopping_.store(true);
    const uint64_t one = 1;
    if (::write(wake_fd_, &one, sizeof(one)) < 0) {
      // The counter is full: the loop is being woken anyway.
    }
    thread_.join();
    // Refuse connections from now on rather than leave them in the
    // kernel's queue.
    ::close(listen_fd_);
    listen_fd_ = -1;
  }

  const std::string& address() const { return address_; }
  std::string url() const { return "http://" + url_host_ + "/metrics"; }

 private:
  // A connection and the events it is watched for.
  struct Slot {
    std::unique_ptr<HttpConnection> connection;
    uint32_t events = 0;
  };

  void Loop() {
    epoll_event events[64];
    while (!stopping_.load()) {
      const int ready = ::epoll_wait(epoll_fd_, events, 64, WaitMs());
      const Time now = SteadyClock::now();
      for (int i = 0; i < ready && !stopping_.load(); ++i) {
        const uint64_t id = events[i].data.u64;
        if (id == kWakeId) continue;
        if (id == kListenId) {
          AcceptBatch(now);
          continue;
        }
        OnReady(id, events[i].events, now);
      }
      if (now >= next_deadline_) ExpireDeadlines(now);
      if (accept_paused_ && now >= accept_resume_) {
        accept_paused_ = !Watch(listen_fd_, kListenId, EPOLLIN, EPOLL_CTL_ADD);
      }
    }
    for (auto& [id, slot] : slots_) slot.connection->Close(true);
    slots_.clear();
  }

  // Milliseconds until the earliest deadline or the end of an accept
  // pause (rounded up); -1 (wait for ever) when there is neither.
  int WaitMs() const {
    Time until = next_deadline_;
    if (accept_paused_) until = std::min(until, accept_resume_);
    if (until == Time::max()) return -1;
    const auto left = until - SteadyClock::now();
    if (left <= SteadyClock::duration::zero()) return 0;
    return static_cast<int>(
        std::chrono::ceil<std::chrono::milliseconds>(left).count());
  }

  bool Watch(int fd, uint64_t id, uint32_t events, int op) {
    epoll_event event{};
    event.events = events;
    event.data.u64 = id;
    return ::epoll_ctl(epoll_fd_, op, fd, &event) == 0;
  }

  void AcceptBatch(Time now) {
    for (int i = 0; i < kAcceptBatch; ++i) {
      sockaddr_storage peer{};
      socklen_t length = sizeof(peer);
      const int fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&peer),
                               &length, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd >= 0) {
        Admit(fd, PeerAddress::FromSockaddr(peer), now);
        continue;
      }
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS ||
          errno == ENOMEM) {
        MLOG_EVERY_KEY(WARNING, "metrics endpoint cannot accept")
            << "metrics endpoint " << address_ << ": cannot accept ("
            << std::strerror(errno) << "); accepting again in "
            << kAcceptPause.count() << " ms";
        ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, listen_fd_, nullptr);
        accept_paused_ = true;
        accept_resume_ = now + kAcceptPause;
        return;
      }
      // ECONNABORTED, EINTR, EPROTO...: that connection is gone; go on.
    }
  }

  // Makes room for a connection from `peer` if a cap is reached, then
  // watches it for its request.
  void Admit(int fd, const PeerAddress& peer, Time now) {
    const ConnectionBudget::Admission admission = budget_.Admit(peer);
    if (admission.shed) {
      const bool per_address =
          admission.cap == ConnectionBudget::Cap::kPerAddress;
      const std::string who = peer.ToString();
      MLOG_EVERY_KEY(WARNING, per_address
                                  ? "metrics endpoint: address cap: " + who
                                  : std::string("metrics endpoint: total cap"))
          << "metrics endpoint " << address_ << ": "
          << (per_address ? std::to_string(budget_.CountOf(peer)) +
                                " connections from " + who +
                                " (max_connections_per_address)"
                          : std::to_string(budget_.size()) +
                                " connections (max_connections)")
          << ": closing the one that waited longest to admit a new one";
      Close(*admission.shed, /*reset=*/true);
    }
    const int yes = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof(yes));
    const uint64_t id = next_id_++;
    auto connection =
        std::make_unique<HttpConnection>(fd, id, peer, now, limits_);
    if (!Watch(fd, id, EPOLLIN, EPOLL_CTL_ADD)) return;  // closes fd
    budget_.Add(id, peer, now);
    next_deadline_ = std::min(next_deadline_, connection->deadline());
    slots_[id] = Slot{std::move(connection), EPOLLIN};
  }

  void OnReady(uint64_t id, uint32_t events, Time now) {
    const auto it = slots_.find(id);
    if (it == slots_.end()) return;  // closed earlier in this turn
    HttpConnection* c = it->second.connection.get();
    if (c->writing()) {
      Flush(c, now);
      return;
    }
    if ((events & (EPOLLIN | EPOLLERR | EPOLLHUP)) == 0) return;
    switch (c->Read()) {
      case HttpConnection::ReadStatus::kWaiting:
        return;
      case HttpConnection::ReadStatus::kClosed:
        Close(id, /*reset=*/false);
        return;
      case HttpConnection::ReadStatus::kFull:
        Answer(c, HttpRefusal{431, "request head over " +
                                       std::to_string(limits_.max_request_bytes) +
                                       " bytes"},
               now);
        Flush(c, now);
        return;
      case HttpConnection::ReadStatus::kHead:
        Serve(c, now);
        return;
    }
  }

  // Answers the heads the connection holds, one at a time, while their
  // responses go out at once.
  void Serve(HttpConnection* c, Time now) {
    while (!c->writing() && c->HasHead()) {
      Answer(c, c->TakeHead(), now);
      if (!Flush(c, now)) return;
    }
  }

  // Starts the response to `parsed` (the policy: /metrics or 404; a
  // refusal closes the connection).
  void Answer(HttpConnection* c, const ParsedRequestHead& parsed, Time now) {
    if (const auto* refusal = std::get_if<HttpRefusal>(&parsed)) {
      auto body = std::make_shared<const std::string>(refusal->reason + "\n");
      std::string head =
          ResponseHead(refusal->status, body->size(), true, false, false);
      c->Respond(std::move(head), std::move(body), /*close_after=*/true, now);
      ++writing_;
      return;
    }
    const HttpRequestHead& request = std::get<HttpRequestHead>(parsed);
    const bool close = !request.keep_alive || c->peer_closed() ||
                       c->requests() + 1 >= limits_.keep_alive_max;
    const bool found = request.path == "/metrics";
    std::shared_ptr<const std::string> body =
        found ? Render(now)
              : std::make_shared<const std::string>(
                    "not found: " + request.path.substr(0, kMaxQuotedPath) +
                    " (metrics are at /metrics)\n");
    std::string head = ResponseHead(found ? 200 : 404, body->size(), close,
                                    request.minor_version == 0, found);
    if (request.method == HttpMethod::kHead) body = nullptr;
    c->Respond(std::move(head), std::move(body), close, now);
    ++writing_;
  }

  // The registry's text: rendered afresh while fewer than
  // max_rendered_responses responses wait for readers, else the newest
  // render if it is recent (readers that do not read share one copy).
  std::shared_ptr<const std::string> Render(Time now) {
    if (!newest_ || writing_ < limits_.max_rendered_responses ||
        now - newest_time_ >= kRenderReuseWindow) {
      std::string text = registry_->RenderText();
      text.shrink_to_fit();  // held while slow readers take it
      newest_ = std::make_shared<const std::string>(std::move(text));
      newest_time_ = now;
    }
    return newest_;
  }

  // Writes what the client takes of the connection's response. True when
  // it is all written and the connection waits for its next request.
  bool Flush(HttpConnection* c, Time now) {
    const uint64_t id = c->id();
    switch (c->Write(now)) {
      case HttpConnection::WriteStatus::kFailed:
        Close(id, /*reset=*/true);
        return false;
      case HttpConnection::WriteStatus::kBlocked:
        budget_.MarkBusy(id, now);
        SetEvents(id, EPOLLOUT);
        return false;
      case HttpConnection::WriteStatus::kDone:
        --writing_;
        if (c->close_after()) {
          ::shutdown(c->fd(), SHUT_WR);
          Close(id, /*reset=*/false);
          return false;
        }
        budget_.MarkIdle(id, now);
        SetEvents(id, EPOLLIN);
        next_deadline_ = std::min(next_deadline_, c->deadline());
        return true;
    }
    return false;
  }

  void SetEvents(uint64_t id, uint32_t events) {
    Slot& slot = slots_.at(id);
    if (slot.events == events) return;
    if (Watch(slot.connection->fd(), id, events, EPOLL_CTL_MOD)) {
      slot.events = events;
    }
  }

  // Closes a connection. `reset`: with an RST (a connection shed, past
  // its deadline or failed), so that the kernel drops at once whatever it
  // still holds for it (a response its client never read) instead of
  // keeping it, orphaned, until the client reads or TCP gives up.
  void Close(uint64_t id, bool reset) {
    const auto it = slots_.find(id);
    if (it == slots_.end()) return;
    HttpConnection* c = it->second.connection.get();
    if (c->writing()) --writing_;
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c->fd(), nullptr);
    c->Close(reset);
    budget_.Remove(id);
    slots_.erase(it);
  }

  // Closes every connection past its deadline and finds the next one.
  void ExpireDeadlines(Time now) {
    std::vector<uint64_t> expired;
    next_deadline_ = Time::max();
    for (const auto& [id, slot] : slots_) {
      const Time deadline = slot.connection->deadline();
      if (deadline <= now) {
        expired.push_back(id);
      } else {
        next_deadline_ = std::min(next_deadline_, deadline);
      }
    }
    for (uint64_t id : expired) Close(id, /*reset=*/true);
  }

  const MetricsRegistry* registry_;
  const MetricsServerLimits limits_;
  int listen_fd_ = -1;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  std::string address_;
  std::string url_host_;
  // The loop thread's.
  ConnectionBudget budget_;
  std::unordered_map<uint64_t, Slot> slots_;  // open connections by id
  uint64_t next_id_ = kListenId + 1;
  Time next_deadline_ = Time::max();  // earliest deadline (may be early)
  size_t writing_ = 0;  // connections writing a response
  std::shared_ptr<const std::string> newest_;  // the newest render
  Time newest_time_;
  bool accept_paused_ = false;
  Time accept_resume_;
};

Result<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const MetricsRegistry* registry, std::string_view address,
    const MetricsServerLimits& limits) {
  MERIDIAN_ASSIGN_OR_RETURN(MetricsAddress parsed,
                            ParseMetricsAddress(address));
  auto impl = std::make_unique<Impl>(registry, limits);
  try {
    MERIDIAN_RETURN_IF_ERROR(impl->Start(parsed));
  } catch (const std::exception& error) {  // no thread to be had
    return UnavailableError("metrics server on " + parsed.ToString() + ": " +
                            error.what());
  }
  return std::unique_ptr<MetricsServer>(new MetricsServer(std::move(impl)));
}

MetricsServer::MetricsServer(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}
MetricsServer::~MetricsServer() = default;
void MetricsServer::Stop() { impl_->Stop(); }
const std::string& MetricsServer::address() const { return impl_->address(); }
std::string MetricsServer::url() const { return impl_->url(); }

std::unique_ptr<MetricsServer> StartMetricsServerOrWarn(
    const MetricsRegistry* registry, std::string_view address,
    std::string_view who) {
  if (address.empty() || address == "none") return nullptr;
  Result<std::unique_ptr<MetricsServer>> server =
      MetricsServer::Start(registry, address);
  if (!server.ok()) {
    MLOG(WARNING) << who << " runs without a metrics endpoint: "
                  << server.status().message();
    return nullptr;
  }
  MLOG(INFO) << "metrics at " << (*server)->url();
  return std::move(*server);
}

}  // namespace meridian
