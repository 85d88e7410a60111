// Well- and ill-behaved HTTP clients over real loopback sockets, for the
// metrics endpoint's tests and its benchmark (bench/listeners): one raw
// connection (RawConnection), a swarm of misbehaving connections driven by
// one thread (SlowClientSwarm), and a timed scrape. Header-only.
#ifndef MERIDIAN_TESTS_METRICS_SLOW_CLIENTS_H_
#define MERIDIAN_TESTS_METRICS_SLOW_CLIENTS_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "meridian/metrics/metrics.h"

namespace meridian::testing {

using SteadyClock = std::chrono::steady_clock;

inline int PortOf(const std::string& address) {
  return std::stoi(address.substr(address.rfind(':') + 1));
}

// Raises this process's descriptor limit to its hard limit (a test that
// opens hundreds of connections must not run out under a low soft limit).
inline void RaiseFileLimit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 &&
      limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &limit);
  }
}

// A TCP connection to 127.0.0.1:`port` from `source` (an address of the
// loopback network, e.g. "127.0.0.2", so that tests can play several
// peers), within a second; -1 when it cannot be made.
inline int ConnectFrom(const std::string& source, int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  const timeval timeout{1, 0};  // bounds connect() too
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  sockaddr_in local{};
  local.sin_family = AF_INET;
  ::inet_pton(AF_INET, source.c_str(), &local.sin_addr);
  sockaddr_in remote{};
  remote.sin_family = AF_INET;
  remote.sin_port = htons(static_cast<uint16_t>(port));
  remote.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&local), sizeof(local)) != 0 ||
      ::connect(fd, reinterpret_cast<sockaddr*>(&remote), sizeof(remote)) !=
          0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// A client TCP connection to the metrics server, closed on destruction.
class RawConnection {
 public:
  explicit RawConnection(int port, const std::string& source = "127.0.0.1")
      : fd_(ConnectFrom(source, port)) {}
  ~RawConnection() {
    if (fd_ >= 0) ::close(fd_);
  }
  RawConnection(const RawConnection&) = delete;
  RawConnection& operator=(const RawConnection&) = delete;

  bool connected() const { return fd_ >= 0; }
  // Sends all of `bytes`; false when the server closed the connection.
  bool Send(const std::string& bytes) {
    size_t sent = 0;
    while (sent < bytes.size()) {
      const ssize_t n =
          ::send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return false;
      sent += static_cast<size_t>(n);
    }
    return true;
  }
  // True once the server has closed the connection (reads whatever it sent
  // before, e.g. a 400 for a request cut short). Waits at most `timeout`.
  bool ClosedByServerWithin(std::chrono::milliseconds timeout) {
    const auto deadline = SteadyClock::now() + timeout;
    char buffer[65536];
    while (SteadyClock::now() < deadline) {
      pollfd item{fd_, POLLIN, 0};
      if (::poll(&item, 1, 50) <= 0) continue;
      const ssize_t n = ::recv(fd_, buffer, sizeof(buffer), 0);
      if (n <= 0) return true;
    }
    return false;
  }
  // Whether the server has closed the connection by now, without reading
  // what it sent (a FIN or an RST has arrived).
  bool ClosedByServer() const {
    pollfd item{fd_, POLLRDHUP, 0};
    return ::poll(&item, 1, 0) > 0 &&
           (item.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
  }
  // Reads until `text` has arrived (true) or `timeout` passed or the
  // server closed (false); everything read is appended to *received.
  bool ReceiveUntil(const std::string& text, std::chrono::milliseconds timeout,
                    std::string* received) {
    const auto deadline = SteadyClock::now() + timeout;
    char buffer[65536];
    while (received->find(text) == std::string::npos) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - SteadyClock::now());
      if (left.count() <= 0) return false;
      pollfd item{fd_, POLLIN, 0};
      if (::poll(&item, 1, static_cast<int>(left.count())) <= 0) continue;
      const ssize_t n = ::recv(fd_, buffer, sizeof(buffer), 0);
      if (n <= 0) return false;
      received->append(buffer, static_cast<size_t>(n));
    }
    return true;
  }
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
};

// How a swarm's connections misbehave.
enum class SlowKind {
  kDrip,       // a request head, one byte per period, never finished
  kSilent,     // connects and sends nothing
  kHalfHead,   // half a request head, then nothing
  kNonReader,  // asks for /metrics once per period, never reads
};

inline const char* SlowKindName(SlowKind kind) {
  switch (kind) {
    case SlowKind::kDrip: return "drip a byte per 100 ms";
    case SlowKind::kSilent: return "open and silent";
    case SlowKind::kHalfHead: return "half a request head";
    case SlowKind::kNonReader: return "never read the response";
  }
  return "?";
}

// `count` connections of one kind to 127.0.0.1:`port`, from `sources` in
// turn, driven by one thread: every `period` each sends its next bytes, and
// one the server closed is opened again (as an attacker would), until the
// swarm is destroyed.
class SlowClientSwarm {
 public:
  struct Options {
    int port = 0;
    int count = 0;
    SlowKind kind = SlowKind::kDrip;
    std::vector<std::string> sources = {"127.0.0.1"};
    std::chrono::milliseconds period{100};
  };

  explicit SlowClientSwarm(Options options)
      : options_(std::move(options)),
        fds_(static_cast<size_t>(options_.count), -1),
        thread_([this] { Run(); }) {}
  ~SlowClientSwarm() {
    stop_.store(true);
    thread_.join();
    for (int fd : fds_) {
      if (fd >= 0) ::close(fd);
    }
  }
  SlowClientSwarm(const SlowClientSwarm&) = delete;
  SlowClientSwarm& operator=(const SlowClientSwarm&) = delete;

  // Connections made so far (reconnections included).
  uint64_t opened() const { return opened_.load(); }
  // Connections the server closed so far.
  uint64_t closed_by_server() const { return closed_.load(); }
  // Rounds the driving thread has completed (every connection opened or
  // tried once per round).
  uint64_t rounds() const { return rounds_.load(); }

 private:
  void Run() {
    while (!stop_.load()) {
      const auto round_start = SteadyClock::now();
      for (size_t i = 0; i < fds_.size() && !stop_.load(); ++i) Step(i);
      rounds_.fetch_add(1);
      std::this_thread::sleep_until(round_start + options_.period);
    }
  }

  void Step(size_t i) {
    int& fd = fds_[i];
    if (fd >= 0 && ServerClosed(fd)) {
      ::close(fd);
      fd = -1;
      closed_.fetch_add(1);
    }
    if (fd < 0) {
      fd = ConnectFrom(options_.sources[i % options_.sources.size()],
                       options_.port);
      if (fd < 0) return;
      opened_.fetch_add(1);
      switch (options_.kind) {
        case SlowKind::kDrip:
          SendSome(fd, "GET /metrics HTTP/1.1\r\nX-Drip: ");
          break;
        case SlowKind::kHalfHead:
          SendSome(fd, "GET /metrics HTTP/1.1\r\nHost: x");
          break;
        default:
          break;
      }
      return;
    }
    if (options_.kind == SlowKind::kDrip) SendSome(fd, "a");
    if (options_.kind == SlowKind::kNonReader) {
      SendSome(fd, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    }
  }

  // A FIN, an RST or an error has arrived. Never reads what a non-reader
  // was sent; the others read and drop (a 400 or 408 before the close).
  bool ServerClosed(int fd) const {
    pollfd item{fd, POLLIN | POLLRDHUP, 0};
    if (::poll(&item, 1, 0) <= 0) return false;
    if (item.revents & (POLLRDHUP | POLLHUP | POLLERR)) return true;
    if (options_.kind == SlowKind::kNonReader) return false;
    char buffer[4096];
    return ::recv(fd, buffer, sizeof(buffer), MSG_DONTWAIT) == 0;
  }

  static void SendSome(int fd, const std::string& bytes) {
    // Never blocks: a full socket buffer is the server not reading.
    (void)::send(fd, bytes.data(), bytes.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  }

  const Options options_;
  std::vector<int> fds_;  // the driving thread's
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> opened_{0};
  std::atomic<uint64_t> closed_{0};
  std::atomic<uint64_t> rounds_{0};
  std::thread thread_;
};

// Polls `condition` every 20 ms for at most `timeout`.
inline bool Eventually(const std::function<bool()>& condition,
                       std::chrono::milliseconds timeout) {
  const auto deadline = SteadyClock::now() + timeout;
  while (!condition()) {
    if (SteadyClock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

// One scrape of `address` with `timeout_s`: how long it took in seconds,
// or a negative number when it failed.
inline double TimedScrape(const std::string& address, double timeout_s,
                          std::string* text = nullptr) {
  const auto start = SteadyClock::now();
  Result<std::string> scraped = FetchMetricsText(address, timeout_s);
  const double elapsed =
      std::chrono::duration<double>(SteadyClock::now() - start).count();
  if (!scraped.ok()) return -1;
  if (text != nullptr) *text = std::move(*scraped);
  return elapsed;
}

}  // namespace meridian::testing

#endif  // MERIDIAN_TESTS_METRICS_SLOW_CLIENTS_H_
