// Small blocking-socket helpers for the WAN emulator tests.
#ifndef MERIDIAN_TESTS_WAN_WAN_TEST_UTIL_H_
#define MERIDIAN_TESTS_WAN_WAN_TEST_UTIL_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "testing/status_matchers.h"
#include "wan/emulator.h"
#include "wan/socket_util.h"  // wan/: WriteAll

namespace meridian::wan::testing {

using SteadyClock = std::chrono::steady_clock;

inline double SecondsSince(SteadyClock::time_point start) {
  return std::chrono::duration<double>(SteadyClock::now() - start).count();
}

// Timing on a loaded machine: a measurement of the emulator can come out
// late (the machine ran something else meanwhile), never early, since the
// emulator holds every byte until it is due. Runs `attempt` (which
// measures and says whether the measurement is within its bounds) up to
// `attempts` times, until one is; the caller then checks the last
// measurement. A result that is wrong every time (early, or late on an
// idle machine) still fails.
template <typename Attempt>
void UntilWithinBounds(Attempt attempt, int attempts = 3) {
  for (int i = 0; i < attempts && !attempt(); ++i) {
  }
}

// Waits until `predicate` holds or `seconds` pass; says whether it held.
// The deadline only matters when the test fails, so it is generous.
// The emulator counts a chunk after writing it on, so a reader can see
// bytes before the counters do: wait for the counter, not for the bytes.
template <typename Predicate>
bool Eventually(Predicate predicate, double seconds = 30) {
  const auto start = SteadyClock::now();
  while (SecondsSince(start) < seconds) {
    if (predicate()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return predicate();
}

// A listening socket on 127.0.0.1 with a free port (-1 / 0 when the
// machine has none to give).
struct Listener {
  int fd = -1;
  int port = 0;
  Listener() {
    Result<int> listening = ListenTcp(HostPort{"127.0.0.1", 0});
    if (!listening.ok()) return;
    fd = *listening;
    Result<std::string> local = LocalAddress(fd);
    if (local.ok()) port = std::stoi(local->substr(local->rfind(':') + 1));
  }
  ~Listener() {
    if (fd >= 0) ::close(fd);
  }
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;
  std::string address() const { return "127.0.0.1:" + std::to_string(port); }
  // -1 when nothing connects within `timeout_ms`.
  int Accept(int timeout_ms = 5000) const {
    pollfd item{fd, POLLIN, 0};
    if (::poll(&item, 1, timeout_ms) <= 0) return -1;
    return ::accept4(fd, nullptr, nullptr, SOCK_CLOEXEC);
  }
};

// A port where nothing listens (bound, then closed).
inline int DeadPort() {
  Listener listener;
  const int port = listener.port;
  return port;
}

// A connected socket (TCP_NODELAY) to "host:port"; -1 when nothing
// listens there.
inline int Connect(const std::string& address) {
  Result<HostPort> parsed = ParseHostPort(address, /*allow_port_zero=*/false);
  if (!parsed.ok()) return -1;
  Result<int> fd = ConnectTcp(*parsed, std::chrono::seconds(5));
  return fd.ok() ? *fd : -1;
}

// Sends all of `data`.
inline bool SendAll(int fd, const std::string& data) {
  return ::meridian::wan::WriteAll(fd, data.data(), data.size());
}

// Reads until `size` bytes, end of stream, an error or the timeout.
inline std::string RecvBytes(int fd, size_t size, int timeout_ms = 10000) {
  std::string out;
  const auto deadline =
      SteadyClock::now() + std::chrono::milliseconds(timeout_ms);
  std::vector<char> buffer(1 << 16);
  while (out.size() < size && SteadyClock::now() < deadline) {
    pollfd item{fd, POLLIN, 0};
    if (::poll(&item, 1, 50) <= 0) continue;
    const ssize_t n = ::recv(fd, buffer.data(),
                             std::min(buffer.size(), size - out.size()), 0);
    if (n <= 0) break;
    out.append(buffer.data(), static_cast<size_t>(n));
  }
  return out;
}

// How a peer's end of a connection looks after `timeout_ms`: 0 = end of
// stream, -errno = an error (e.g. -ECONNRESET), 1 = data, 2 = nothing yet.
inline int PeerState(int fd, int timeout_ms) {
  pollfd item{fd, POLLIN, 0};
  if (::poll(&item, 1, timeout_ms) <= 0) return 2;
  char byte;
  const ssize_t n = ::recv(fd, &byte, 1, MSG_PEEK);
  if (n == 0) return 0;
  if (n < 0) return -errno;
  return 1;
}

// Deterministic pseudo-random bytes.
inline std::string Pattern(size_t size, uint32_t seed = 1) {
  std::string out(size, '\0');
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < size; ++i) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    out[i] = static_cast<char>(x);
  }
  return out;
}

// A direction of `bps` bits per second and `latency` each way (the rest as
// DirectionModel's defaults).
inline DirectionModel Shaped(double bps, Duration latency = Duration::zero()) {
  DirectionModel model;
  model.bandwidth_bps = bps;
  model.latency = latency;
  return model;
}

// A route of link "a-b" from site `from` to `forward`; its listening
// address, or "" (and a test failure) when it cannot open.
inline std::string AddRoute(Emulator& emulator, const std::string& forward,
                            const std::string& from = "a") {
  Result<std::string> bound =
      emulator.AddRoute({"a-b", from, "127.0.0.1:0", forward});
  EXPECT_OK(bound);
  return bound.ok() ? *bound : "";
}

}  // namespace meridian::wan::testing

#endif  // MERIDIAN_TESTS_WAN_WAN_TEST_UTIL_H_
