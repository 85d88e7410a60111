#include "meridian/wan/front.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>

#include "meridian/core/log.h"
#include "wan/connection_gate.h"
#include "wan/host_port.h"
#include "wan/socket_util.h"
#include "wan/zmtp.h"

namespace meridian::wan {
namespace {

using Clock = std::chrono::steady_clock;

// epoll tags: the listening socket, the wake-up eventfd, then a connection's
// sides as id * 2 (the peer) and id * 2 + 1 (upstream); ids start at 1.
constexpr uint64_t kListenTag = 0;
constexpr uint64_t kWakeTag = 1;
constexpr int kMaxEvents = 256;
// Rounds of reading and writing one readiness event may do for a
// connection before the others get their turn.
constexpr int kPumpRounds = 16;
constexpr auto kTick = std::chrono::milliseconds(250);
constexpr int kAcceptsPerTurn = 64;
// Frame bodies at least this large are spliced instead of read.
constexpr uint64_t kSpliceMinBytes = 16 << 10;
// What each direction's pipe may hold (kernel memory, not the process's).
constexpr size_t kPipeBytes = 1 << 20;
constexpr auto kUpstreamConnectTimeout = std::chrono::seconds(1);

bool Retry(ssize_t n) {
  return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR);
}

// "tcp://*:*" and the like as ParseHostPort reads them.
std::string NormalizeListen(std::string text) {
  if (text.rfind("tcp://", 0) == 0) text = text.substr(6);
  if (text.rfind("*:", 0) == 0) text = "0.0.0.0" + text.substr(1);
  if (text.size() >= 2 && text.compare(text.size() - 2, 2, ":*") == 0) {
    text = text.substr(0, text.size() - 1) + "0";
  }
  return text;
}

uint16_t PortOf(const sockaddr_storage& address) {
  if (address.ss_family == AF_INET) {
    return ntohs(reinterpret_cast<const sockaddr_in*>(&address)->sin_port);
  }
  if (address.ss_family == AF_INET6) {
    return ntohs(reinterpret_cast<const sockaddr_in6*>(&address)->sin6_port);
  }
  return 0;
}

uint16_t LocalPort(int fd) {
  sockaddr_storage address{};
  socklen_t size = sizeof(address);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &size) != 0) {
    return 0;
  }
  return PortOf(address);
}

// Bytes of a connection holding `held` that may be read within `credit`:
// a frame may end at the first byte read (a header begun in the last read)
// and every 2 bytes after may be an empty frame, each charged
// kFrameChargeBytes, so what is read never charges more than is left.
uint64_t ReadRoom(uint64_t held, uint64_t credit) {
  constexpr uint64_t kCharge = ConnectionFront::kFrameChargeBytes;
  if (credit <= held + kCharge) return 0;
  return (credit - held - kCharge) / (1 + kCharge / 2);
}

// A non-blocking pipe holding up to kPipeBytes: larger pipes move a
// model-sized message in fewer turns, and the kernel may refuse the size
// (a user's pipe pages are limited), leaving the default. False (errno
// set) when there is no pipe.
bool OpenPipe(int* read_end, int* write_end, size_t* capacity) {
  int ends[2];
  if (::pipe2(ends, O_NONBLOCK | O_CLOEXEC) != 0) return false;
  const int set = ::fcntl(ends[1], F_SETPIPE_SZ, static_cast<int>(kPipeBytes));
  *capacity =
      static_cast<size_t>(set > 0 ? set : ::fcntl(ends[1], F_GETPIPE_SZ));
  *read_end = ends[0];
  *write_end = ends[1];
  return true;
}

void SetNonBlocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL);
  ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

// Logs at most one line a second; the lines it held back are counted in
// the next one.
class RateLimitedLog {
 public:
  void Warn(const std::string& text) {
    const Clock::time_point now = Clock::now();
    if (now - last_ < std::chrono::seconds(1)) {
      ++held_back_;
      return;
    }
    last_ = now;
    MLOG(WARNING) << text
                  << (held_back_ > 0 ? " (and " + std::to_string(held_back_) +
                                           " more like it since the last)"
                                     : "");
    held_back_ = 0;
  }

 private:
  Clock::time_point last_{};
  uint64_t held_back_ = 0;
};

RateLimitedLog& FrontLog() {
  static thread_local RateLimitedLog log;
  return log;
}

}  // namespace

uint16_t UpstreamPortOfFd(int fd) {
  if (fd < 0) return 0;
  sockaddr_storage address{};
  socklen_t size = sizeof(address);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&address), &size) != 0) {
    return 0;
  }
  return PortOf(address);
}

// One direction's bytes in flight through the front.
struct FrontBuffer {
  // Not zeroed: a connection's pages become resident only as it uses them.
  std::unique_ptr<uint8_t[]> data =
      std::make_unique_for_overwrite<uint8_t[]>(ConnectionFront::kBufferBytes);
  size_t begin = 0;
  size_t end = 0;

  size_t size() const { return end - begin; }
  size_t space() const { return ConnectionFront::kBufferBytes - end; }
  void Consume(size_t n) {
    begin += n;
    if (begin == end) {
      begin = end = 0;
    } else if (begin >= ConnectionFront::kBufferBytes / 2) {
      std::memmove(data.get(), data.get() + begin, end - begin);
      end -= begin;
      begin = 0;
    }
  }
};

struct ConnectionFront::Connection {
  uint64_t id = 0;
  int peer = -1;
  int upstream = -1;
  uint16_t port = 0;     // the upstream connection's local port
  std::string address;   // the peer's "host:port", for logs
  // peer -> upstream: framing (and small frames) read into `up` and
  // parsed; the bodies of large frames spliced through a pipe, `up_spliced`
  // bytes in it. Never both at once, so the order holds.
  FrontBuffer up;
  int up_pipe_read = -1;
  int up_pipe_write = -1;
  size_t up_spliced = 0;
  size_t up_capacity = 0;
  // upstream -> peer: spliced through a pipe (kernel memory, no copy into
  // the process); `down` bytes are in it.
  int pipe_read = -1;
  int pipe_write = -1;
  size_t down = 0;
  size_t down_capacity = 0;  // the pipe's (F_GETPIPE_SZ)
  // Parses what the peer sends, to count its frames.
  ZmtpCounter parsed;
  // What the peer sent that the application has not taken: its bytes and
  // kFrameChargeBytes per frame.
  uint64_t held = 0;
  bool trusted = false;
  uint64_t trusted_since = 0;    // when it was trusted last (a count)
  uint64_t identity = 0;         // whom it speaks for, when trusted
  bool peer_closing = false;     // the peer shut down its side
  bool upstream_done = false;    // libzmq closed; flush `down`, then close
  Clock::time_point last_taken;  // opened, or the last Consumed
  Clock::time_point down_since;  // `down` last drained or started filling
  uint32_t peer_mask = 0;        // epoll interest registered
  uint32_t upstream_mask = 0;
};

ConnectionFront::ConnectionFront(FrontOptions options)
    : options_(std::move(options)) {}

Result<std::unique_ptr<ConnectionFront>> ConnectionFront::Start(
    FrontOptions options) {
  if (options.untrusted_credit == 0 || options.trusted_credit == 0 ||
      options.max_connections == 0 || options.max_trusted == 0) {
    return InvalidArgumentError(options.name +
                                ": the front's credits and connection cap "
                                "must be positive");
  }
  std::unique_ptr<ConnectionFront> front(
      new ConnectionFront(std::move(options)));
  const FrontOptions& o = front->options_;
  MERIDIAN_ASSIGN_OR_RETURN(HostPort listen,
                            ParseHostPort(NormalizeListen(o.listen), true));
  MERIDIAN_ASSIGN_OR_RETURN(HostPort upstream,
                            ParseHostPort(o.upstream, false));
  front->upstream_port_ = upstream.port;
  front->upstream_host_ = upstream.host;
  Result<int> fd = ListenTcp(listen, kListenBacklog);
  if (!fd.ok()) {
    return UnavailableError(o.name + " cannot listen on '" + o.listen +
                            "': " + fd.status().message());
  }
  front->listen_fd_ = *fd;
  SetNonBlocking(front->listen_fd_);
  MERIDIAN_ASSIGN_OR_RETURN(const std::string local,
                            LocalAddress(front->listen_fd_));
  front->endpoint_ = "tcp://" + local;
  const uint64_t limit = RaiseDescriptorLimit();
  const uint64_t affordable =
      limit > kReservedDescriptors
          ? (limit - kReservedDescriptors) / kDescriptorsPerFrontConnection
          : 1;
  front->cap_ = static_cast<size_t>(std::max<uint64_t>(
      1, std::min<uint64_t>(o.max_connections, affordable)));
  front->budget_.rate = o.untrusted_messages_per_s;
  front->budget_.tokens = std::max(1.0, o.untrusted_messages_per_s / 4);
  front->budget_.at = Clock::now();
  front->epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  front->wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (front->epoll_fd_ < 0 || front->wake_fd_ < 0) {
    return InternalError(o.name + ": epoll or eventfd: " +
                         std::strerror(errno));
  }
  epoll_event listen_event{EPOLLIN, {.u64 = kListenTag}};
  epoll_event wake_event{EPOLLIN, {.u64 = kWakeTag}};
  ::epoll_ctl(front->epoll_fd_, EPOLL_CTL_ADD, front->listen_fd_,
              &listen_event);
  ::epoll_ctl(front->epoll_fd_, EPOLL_CTL_ADD, front->wake_fd_, &wake_event);
  front->Publish();
  front->thread_ = std::thread([raw = front.get()] { raw->Run(); });
  if (front->cap_ < o.max_connections) {
    MLOG(WARNING) << o.name << ": at most " << front->cap_
                  << " connections (the descriptor limit, " << limit
                  << ", allows no more than that)";
  }
  return front;
}

ConnectionFront::~ConnectionFront() {
  stop_ = true;
  Wake();
  if (thread_.joinable()) thread_.join();
  for (auto& [id, c] : connections_) {
    CloseFd(&c->peer);
    CloseFd(&c->upstream);
    CloseFd(&c->pipe_read);
    CloseFd(&c->pipe_write);
    CloseFd(&c->up_pipe_read);
    CloseFd(&c->up_pipe_write);
  }
  CloseFd(&listen_fd_);
  CloseFd(&epoll_fd_);
  CloseFd(&wake_fd_);
}

void ConnectionFront::Consumed(uint16_t upstream_port, uint64_t bytes,
                               uint64_t frames) {
  if (upstream_port == 0) return;
  {
    std::lock_guard lock(events_mutex_);
    events_.push_back({upstream_port, bytes, frames, false, 0});
    if (events_.size() > 1) return;  // a wake-up is already on its way
  }
  Wake();
}

void ConnectionFront::Trust(uint16_t upstream_port, uint64_t identity) {
  if (upstream_port == 0) return;
  {
    std::lock_guard lock(events_mutex_);
    events_.push_back({upstream_port, 0, 0, true, identity});
    if (events_.size() > 1) return;
  }
  Wake();
}

ConnectionFront::Stats ConnectionFront::stats() const {
  std::lock_guard lock(stats_mutex_);
  return stats_;
}

uint64_t ConnectionFront::MemoryBound() const {
  return cap_ * (2 * kBufferBytes + options_.untrusted_credit) +
         options_.max_trusted * options_.trusted_credit;
}

void ConnectionFront::MarkTrusted(Connection& c, uint64_t identity) {
  if (c.trusted && c.identity == identity) return;
  // The identity's earlier connection loses its trust.
  if (const auto earlier = trusted_by_identity_.find(identity);
      earlier != trusted_by_identity_.end() && earlier->second != c.id) {
    const auto found = connections_.find(earlier->second);
    if (found != connections_.end() && found->second->trusted &&
        found->second->identity == identity) {
      Demote(*found->second);
    }
  }
  trusted_by_identity_[identity] = c.id;
  c.identity = identity;
  if (c.trusted) return;  // it speaks for another identity now
  auto current = [&](const std::pair<uint64_t, uint64_t>& entry) {
    const auto found = connections_.find(entry.first);
    return found != connections_.end() && found->second->trusted &&
           found->second->trusted_since == entry.second;
  };
  while (counts_.trusted >= options_.max_trusted && !trusted_order_.empty()) {
    const std::pair<uint64_t, uint64_t> oldest = trusted_order_.front();
    trusted_order_.pop_front();
    if (!current(oldest)) continue;
    Demote(*connections_.at(oldest.first));
  }
  c.trusted = true;
  c.trusted_since = ++trust_count_;
  ++counts_.trusted;
  trusted_order_.emplace_back(c.id, c.trusted_since);
  if (trusted_order_.size() > 2 * options_.max_trusted + 16) {
    std::erase_if(trusted_order_, [&](const auto& entry) {
      return !current(entry);
    });
  }
}

void ConnectionFront::Budget::Refill() {
  if (rate <= 0) return;
  const Clock::time_point now = Clock::now();
  const double seconds = std::chrono::duration<double>(now - at).count();
  at = now;
  tokens = std::min(std::max(1.0, rate / 4), tokens + seconds * rate);
}

// Each waiting connection, oldest first, while the budget lasts; the
// others wait on (Pump -> Watch queues a connection again when the budget
// runs out before its turn).
void ConnectionFront::ResumeWaiting() {
  budget_.Refill();
  while (!budget_.waiting.empty() && budget_.tokens >= 1) {
    const uint64_t id = budget_.waiting.front();
    budget_.waiting.pop_front();
    budget_.waiting_ids.erase(id);
    const auto found = connections_.find(id);
    if (found == connections_.end()) continue;  // closed meanwhile
    Pump(*found->second);
  }
}

// It reads on within the untrusted credit (a connection holding more
// stalls until it is closed).
void ConnectionFront::Demote(Connection& c) {
  c.trusted = false;
  --counts_.trusted;
  Watch(c);
}

void ConnectionFront::Wake() {
  const uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof(one));
}

void ConnectionFront::Run() {
  epoll_event events[kMaxEvents];
  Clock::time_point next_tick = Clock::now() + kTick;
  while (!stop_) {
    const int n =
        ::epoll_wait(epoll_fd_, events, kMaxEvents, WaitMilliseconds());
    budget_.Refill();
    // Trusted peers first: a joined worker's bytes never wait behind a
    // batch of strangers' (issue 38, item 2). The application's refills
    // come before both, new connections after. Decided before any event is
    // handled, so each event is handled once (a connection trusted midway
    // waits for the next turn: the events are level-triggered).
    bool first[kMaxEvents];
    for (int i = 0; i < n; ++i) {
      const uint64_t tag = events[i].data.u64;
      const auto found = tag == kListenTag || tag == kWakeTag
                             ? connections_.end()
                             : connections_.find(tag / 2);
      first[i] = tag == kWakeTag ||
                 (found != connections_.end() && found->second->trusted);
    }
    for (const bool pass : {true, false}) {
      for (int i = 0; i < n; ++i) {
        if (first[i] != pass) continue;
        const uint64_t tag = events[i].data.u64;
        if (tag == kListenTag) {
          Accept();
        } else if (tag == kWakeTag) {
          uint64_t count = 0;
          (void)!::read(wake_fd_, &count, sizeof(count));
          ApplyEvents();
        } else {
          OnReady(tag, events[i].events);
        }
      }
    }
    if (!budget_.waiting.empty()) ResumeWaiting();
    if (Clock::now() >= next_tick) {
      CloseStalled();
      next_tick = Clock::now() + kTick;
    }
    Publish();
  }
}

// A tick, or until the budget has a message for a waiting connection.
int ConnectionFront::WaitMilliseconds() const {
  if (budget_.waiting.empty() || budget_.rate <= 0) {
    return static_cast<int>(kTick.count());
  }
  const double ms = std::ceil((1 - budget_.tokens) * 1000 / budget_.rate);
  return static_cast<int>(
      std::clamp(ms, 1.0, static_cast<double>(kTick.count())));
}

void ConnectionFront::ApplyEvents() {
  std::vector<Event> events;
  {
    std::lock_guard lock(events_mutex_);
    events.swap(events_);
  }
  const Clock::time_point now = Clock::now();
  for (const Event& event : events) {
    const auto found = by_port_.find(event.port);
    if (found == by_port_.end()) continue;  // closed meanwhile
    Connection& c = *connections_.at(found->second);
    if (event.trust) {
      MarkTrusted(c, event.identity);
    } else {
      const uint64_t refill =
          event.bytes +
          event.frames * (kFrameChargeBytes + kFramingAllowanceBytes);
      const uint64_t taken = std::min(refill, c.held);
      c.held -= taken;
      counts_.held_bytes -= taken;
      c.last_taken = now;
    }
    Pump(c);
  }
}

void ConnectionFront::Accept() {
  const HostPort upstream{upstream_host_, upstream_port_};
  // A flood of connections waits in the kernel's queue: a batch per turn,
  // so the relaying goes on meanwhile (the listener stays readable).
  for (int batch = 0; batch < kAcceptsPerTurn; ++batch) {
    sockaddr_storage address{};
    socklen_t size = sizeof(address);
    const int fd =
        ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&address), &size,
                  SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE) {
        // Out of descriptors although the cap allows for them: something
        // else of the process holds them. Make room if an untrusted
        // connection can go; otherwise the listener waits for the next
        // tick (level-triggered, it would wake the loop at once).
        FrontLog().Warn(options_.name + ": out of descriptors accepting "
                                        "a connection");
        if (!EvictOne()) {
          epoll_event paused{0, {.u64 = kListenTag}};
          ::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, listen_fd_, &paused);
          listen_paused_ = true;
          return;
        }
        continue;
      }
      return;  // EAGAIN: nothing more waiting
    }
    ++counts_.accepted;
    const std::string peer = RemoteAddress(fd);
    if (connections_.size() >= cap_ && !EvictOne()) {
      ++counts_.refused;
      FrontLog().Warn(options_.name + ": refused the connection from " +
                      peer + ": " + std::to_string(connections_.size()) +
                      " connections open, every one of a trusted peer "
                      "(server.limits.max_connections)");
      ResetAndClose(fd);
      continue;
    }
    Result<int> up = ConnectTcp(upstream, kUpstreamConnectTimeout);
    if (!up.ok()) {
      FrontLog().Warn(options_.name + ": cannot relay the connection from " +
                      peer + ": " + up.status().message());
      ResetAndClose(fd);
      continue;
    }
    auto c = std::make_unique<Connection>();
    if (!OpenPipe(&c->pipe_read, &c->pipe_write, &c->down_capacity) ||
        !OpenPipe(&c->up_pipe_read, &c->up_pipe_write, &c->up_capacity)) {
      FrontLog().Warn(options_.name + ": cannot relay the connection from " +
                      peer + ": pipe: " + std::strerror(errno));
      ResetAndClose(fd);
      ::close(*up);
      for (int* end : {&c->pipe_read, &c->pipe_write, &c->up_pipe_read,
                       &c->up_pipe_write}) {
        CloseFd(end);
      }
      continue;
    }
    SetNonBlocking(*up);
    SetNoDelay(fd);
    c->id = next_id_++;
    c->peer = fd;
    c->upstream = *up;
    c->port = LocalPort(*up);
    c->address = peer;
    c->last_taken = c->down_since = Clock::now();
    epoll_event peer_event{0, {.u64 = c->id * 2}};
    epoll_event upstream_event{0, {.u64 = c->id * 2 + 1}};
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, c->peer, &peer_event);
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, c->upstream, &upstream_event);
    Connection& added = *c;
    by_port_[c->port] = c->id;
    connections_.emplace(c->id, std::move(c));
    Watch(added);
  }
}

void ConnectionFront::OnReady(uint64_t tag, uint32_t events) {
  const auto found = connections_.find(tag / 2);
  if (found == connections_.end()) return;  // closed earlier in this batch
  Connection& c = *found->second;
  const bool peer_side = tag % 2 == 0;
  if (events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) {
    if (peer_side) {
      c.peer_closing = true;
    } else {
      c.upstream_done = true;
    }
  }
  Pump(c);
}

void ConnectionFront::Pump(Connection& c) {
  const uint64_t id = c.id;
  if (c.upstream_done) EndUpstream(c);
  for (int round = 0; round < kPumpRounds; ++round) {
    bool progress = false;
    if (!FromPeer(c, &progress)) return Close(id, nullptr);
    ToUpstream(c, &progress);
    if (!FromUpstreamToPeer(c, &progress)) return Close(id, nullptr);
    // libzmq closed the connection (a refused handshake, a frame over
    // its limit): the peer gets what libzmq said last, then the close.
    if (c.upstream_done && c.down == 0) return Close(id, nullptr);
    if (!progress) break;
  }
  Watch(c);
}

bool ConnectionFront::FromPeer(Connection& c, bool* progress) {
  const uint64_t credit =
      c.trusted ? options_.trusted_credit : options_.untrusted_credit;
  bool splice_body = false;
  const uint64_t room = PeerRoom(c, credit, &splice_body);
  if (c.upstream_done || room == 0) {
    // A peer that left, when nothing more will be read from it, is gone.
    return !(c.peer_closing && room == 0 && c.up.size() == 0 &&
             c.up_spliced == 0);
  }
  if (!c.trusted && !budget_.Allows()) return true;  // Watch() queues it
  uint8_t* const at = c.up.data.get() + c.up.end;
  const ssize_t n =
      splice_body ? ::splice(c.peer, nullptr, c.up_pipe_write, nullptr, room,
                             SPLICE_F_MOVE | SPLICE_F_NONBLOCK)
                  : ::recv(c.peer, at, room, 0);
  if (n == 0 || (n < 0 && !Retry(n))) return false;  // the peer left
  if (n < 0) return true;
  const uint64_t before = c.parsed.frames() + c.parsed.commands();
  const uint64_t messages_before = c.parsed.messages();
  if (splice_body) {
    c.parsed.SkipOpaque(static_cast<uint64_t>(n));
    c.up_spliced += static_cast<size_t>(n);
  } else {
    c.parsed.Consume({at, static_cast<size_t>(n)});
    c.up.end += static_cast<size_t>(n);
  }
  const uint64_t frames = c.parsed.frames() + c.parsed.commands() - before;
  if (!c.trusted) {
    budget_.tokens -=
        static_cast<double>(c.parsed.messages() - messages_before);
  }
  const uint64_t charge = static_cast<uint64_t>(n) + frames * kFrameChargeBytes;
  c.held += charge;
  counts_.held_bytes += charge;
  *progress = true;
  return true;
}

void ConnectionFront::ToUpstream(Connection& c, bool* progress) {
  if (c.upstream_done) return;
  ssize_t n = 0;
  if (c.up.size() > 0) {
    n = ::send(c.upstream, c.up.data.get() + c.up.begin, c.up.size(),
               MSG_NOSIGNAL);
    if (n > 0) c.up.Consume(static_cast<size_t>(n));
  } else if (c.up_spliced > 0) {
    n = ::splice(c.up_pipe_read, nullptr, c.upstream, nullptr, c.up_spliced,
                 SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
    if (n > 0) c.up_spliced -= static_cast<size_t>(n);
  } else {
    return;
  }
  if (n > 0) {
    *progress = true;
  } else if (n == 0 || !Retry(n)) {
    EndUpstream(c);
  }
}

bool ConnectionFront::FromUpstreamToPeer(Connection& c, bool* progress) {
  // libzmq -> pipe.
  if (!c.upstream_done && c.down < c.down_capacity) {
    const ssize_t n =
        ::splice(c.upstream, nullptr, c.pipe_write, nullptr,
                 c.down_capacity - c.down, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
    if (n > 0) {
      if (c.down == 0) c.down_since = Clock::now();
      c.down += static_cast<size_t>(n);
      *progress = true;
    } else if (n == 0 || !Retry(n)) {
      EndUpstream(c);
    }
  }
  // Pipe -> peer.
  if (c.down > 0) {
    const ssize_t n = ::splice(c.pipe_read, nullptr, c.peer, nullptr, c.down,
                               SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
    if (n > 0) {
      c.down -= static_cast<size_t>(n);
      c.down_since = Clock::now();
      *progress = true;
    } else if (n == 0 || !Retry(n)) {
      return false;  // the peer is gone
    }
  }
  return true;
}

uint64_t ConnectionFront::PeerRoom(const Connection& c, uint64_t credit,
                                   bool* splice_body) {
  // The rest of a large frame's body goes through the pipe, once what was
  // read before it has gone on; its bytes cost only themselves (and the
  // frame's charge, when they end it).
  const uint64_t opaque = c.parsed.OpaqueBytesAhead();
  if (c.up.size() == 0 && opaque >= kSpliceMinBytes) {
    *splice_body = true;
    const uint64_t left =
        credit > c.held + kFrameChargeBytes
            ? credit - c.held - kFrameChargeBytes
            : 0;
    return std::min({opaque, left,
                     static_cast<uint64_t>(c.up_capacity - c.up_spliced)});
  }
  *splice_body = false;
  // Framing and small frames are read and parsed, once the pipe is empty.
  if (c.up_spliced > 0) return 0;
  return std::min<uint64_t>(c.up.space(), ReadRoom(c.held, credit));
}

void ConnectionFront::EndUpstream(Connection& c) {
  c.upstream_done = true;
  if (c.upstream < 0) return;
  // Out of epoll and closed: a closed socket would report its hang-up at
  // every wait while `down` drains to the peer.
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c.upstream, nullptr);
  CloseFd(&c.upstream);
  const auto port = by_port_.find(c.port);
  if (port != by_port_.end() && port->second == c.id) by_port_.erase(port);
}

void ConnectionFront::Watch(Connection& c) {
  const uint64_t credit =
      c.trusted ? options_.trusted_credit : options_.untrusted_credit;
  bool splice_body = false;
  bool read_peer = !c.upstream_done && PeerRoom(c, credit, &splice_body) > 0;
  if (read_peer && !c.trusted && !budget_.Allows()) {
    read_peer = false;
    if (budget_.waiting_ids.insert(c.id).second) {
      ++counts_.budget_waits;
      budget_.waiting.push_back(c.id);
    }
  }
  const uint32_t peer_mask = EPOLLRDHUP | (read_peer ? EPOLLIN : 0u) |
                             (c.down > 0 ? EPOLLOUT : 0u);
  const uint32_t upstream_mask =
      EPOLLRDHUP |
      (!c.upstream_done && c.down < c.down_capacity ? EPOLLIN : 0u) |
      (c.up.size() > 0 || c.up_spliced > 0 ? EPOLLOUT : 0u);
  if (peer_mask != c.peer_mask) {
    epoll_event event{peer_mask, {.u64 = c.id * 2}};
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, c.peer, &event);
    c.peer_mask = peer_mask;
  }
  if (c.upstream >= 0 && upstream_mask != c.upstream_mask) {
    epoll_event event{upstream_mask, {.u64 = c.id * 2 + 1}};
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, c.upstream, &event);
    c.upstream_mask = upstream_mask;
  }
}

void ConnectionFront::Close(uint64_t id, const char* why) {
  const auto found = connections_.find(id);
  if (found == connections_.end()) return;
  Connection& c = *found->second;
  if (why != nullptr) {
    FrontLog().Warn(options_.name + ": closed the connection from " +
                    c.address + ": " + why);
  }
  counts_.held_bytes -= c.held;
  if (c.trusted) {
    --counts_.trusted;
    const auto entry = trusted_by_identity_.find(c.identity);
    if (entry != trusted_by_identity_.end() && entry->second == id) {
      trusted_by_identity_.erase(entry);
    }
  }
  const auto port = by_port_.find(c.port);
  if (port != by_port_.end() && port->second == id) by_port_.erase(port);
  // An abrupt close: nothing of the connection lingers in the kernel.
  if (why != nullptr) {
    ResetAndClose(c.peer);
    c.peer = -1;
  }
  CloseFd(&c.peer);
  CloseFd(&c.upstream);
  CloseFd(&c.pipe_read);
  CloseFd(&c.pipe_write);
  CloseFd(&c.up_pipe_read);
  CloseFd(&c.up_pipe_write);
  connections_.erase(found);
}

void ConnectionFront::CloseStalled() {
  if (listen_paused_) {
    epoll_event listen_event{EPOLLIN, {.u64 = kListenTag}};
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, listen_fd_, &listen_event);
    listen_paused_ = false;
  }
  const Clock::time_point now = Clock::now();
  std::vector<std::pair<uint64_t, std::string>> stalled;
  for (const auto& [id, c] : connections_) {
    const uint64_t credit =
        c->trusted ? options_.trusted_credit : options_.untrusted_credit;
    if (ReadRoom(c->held, credit) == 0 &&
        now - c->last_taken >= options_.stall_timeout) {
      stalled.emplace_back(
          id, std::to_string(c->held) +
                  " bytes sent that the server has not taken (the "
                  "connection's credit) for " +
                  std::to_string(options_.stall_timeout.count()) +
                  " ms: an unfinished message");
    } else if (c->down > 0 &&
               now - c->down_since >= options_.stall_timeout) {
      stalled.emplace_back(
          id, "it has not read what the server sent for " +
                  std::to_string(options_.stall_timeout.count()) + " ms");
    }
  }
  for (const auto& [id, why] : stalled) {
    ++counts_.stalled;
    Close(id, why.c_str());
  }
}

bool ConnectionFront::EvictOne() {
  const Connection* oldest = nullptr;
  for (const auto& [id, c] : connections_) {
    if (c->trusted) continue;
    if (oldest == nullptr || c->last_taken < oldest->last_taken) {
      oldest = c.get();
    }
  }
  if (oldest == nullptr) return false;
  ++counts_.evicted;
  Close(oldest->id,
        "the connection cap is reached, and it is the untrusted connection "
        "the server took nothing from for longest");
  return true;
}

void ConnectionFront::Publish() {
  std::lock_guard lock(stats_mutex_);
  stats_ = counts_;
  stats_.open = connections_.size();
  stats_.max_connections = cap_;
  stats_.untrusted_credit = options_.untrusted_credit;
  stats_.trusted_credit = options_.trusted_credit;
}

}  // namespace meridian::wan
