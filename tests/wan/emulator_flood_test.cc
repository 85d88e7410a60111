// What peers can make the WAN emulator hold (wan/emulator.h, "What peers
// can make the emulator hold"): connection caps, a flood of 10,000 held and
// dripping connections beside a legitimate one, senders faster than their
// link and receivers that do not read. Real loopback sockets; memory is
// this process's RSS (/proc/self/status) against the documented bound.
// Every wait is for an event with a generous deadline.
#include <gtest/gtest.h>
#include <poll.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "meridian/wan/link_model.h"
#include "testing/status_matchers.h"
#include "wan/connection_gate.h"
#include "wan/emulator.h"
#include "wan/wan_test_util.h"

namespace meridian::wan {
namespace {

// Whether the process's resident memory is what the code holds: not under
// ThreadSanitizer (shadow memory several times the application's) or
// AddressSanitizer (freed memory kept in quarantine). The bounds are
// checked in the normal build; the threads run under the sanitizers too.
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
constexpr bool kResidentMemoryIsOurs = false;
#else
constexpr bool kResidentMemoryIsOurs = true;
#endif

using std::chrono::milliseconds;
using testing::AddRoute;
using testing::Connect;
using testing::Eventually;
using testing::Listener;
using testing::Pattern;
using testing::PeerState;
using testing::RecvBytes;
using testing::SecondsSince;
using testing::SendAll;
using testing::Shaped;
using testing::SteadyClock;

std::unique_ptr<Emulator> MakeEmulator(EmulatorOptions options,
                                       const DirectionModel& model) {
  options.links.push_back(LinkModel{"a", "b", model, model});
  Result<std::unique_ptr<Emulator>> emulator =
      Emulator::Create(std::move(options));
  EXPECT_OK(emulator);
  return emulator.ok() ? std::move(*emulator) : nullptr;
}

long ResidentKiB() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  }
  return -1;
}

uint64_t RaiseFileLimit() { return RaiseDescriptorLimit(); }

// Accepts every connection to `listener` and holds it (without reading)
// until destroyed.
class Holder {
 public:
  explicit Holder(const Listener& listener)
      : thread_([this, &listener] {
          while (!stop_.load()) {
            const int fd = listener.Accept(50);
            if (fd < 0) continue;
            std::lock_guard<std::mutex> lock(mu_);
            fds_.push_back(fd);
          }
        }) {}
  ~Holder() {
    stop_.store(true);
    thread_.join();
    for (int fd : fds_) ::close(fd);
  }
  size_t held() {
    std::lock_guard<std::mutex> lock(mu_);
    return fds_.size();
  }

 private:
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::vector<int> fds_;
  std::thread thread_;
};

// A blocking TCP connection to "127.0.0.1:port" (`address`): the socket,
// or -errno when connect() fails.
int OpenConnection(const std::string& address) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -errno;
  sockaddr_in remote{};
  remote.sin_family = AF_INET;
  remote.sin_port =
      htons(static_cast<uint16_t>(std::stoi(address.substr(address.rfind(':') + 1))));
  remote.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&remote), sizeof(remote)) !=
      0) {
    const int error = errno;
    ::close(fd);
    return -error;
  }
  return fd;
}

// True once the emulator has closed the client end `fd` (an end of stream
// or a reset), within `timeout_ms`; `fd` < 0: Connect failed, the reset came
// before connect() returned.
bool Refused(int fd, int timeout_ms = 10000) {
  if (fd < 0) return true;
  const int state = PeerState(fd, timeout_ms);
  return state == 0 || state < 0;
}

TEST(ConnectionGateTest, CapsPerRouteAndInAllFollowTheDescriptorLimit) {
  ConnectionGate gate(1000, 2, /*descriptor_limit=*/1024);
  // (1024 - 512) / 6 = 85 connections fit the descriptors.
  EXPECT_EQ(gate.max_total(), 85u);
  EXPECT_EQ(gate.TryAdmit(0), std::nullopt);
  EXPECT_EQ(gate.TryAdmit(1), std::nullopt);
  const std::optional<std::string> refused = gate.TryAdmit(2);
  ASSERT_TRUE(refused.has_value());
  EXPECT_NE(refused->find("max_connections_per_route"), std::string::npos);
  EXPECT_EQ(gate.open(), 2u);
  gate.Release();
  EXPECT_EQ(gate.open(), 1u);
  EXPECT_EQ(ConnectionGate(5, 5, 1u << 20).max_total(), 5u);
  EXPECT_EQ(ConnectionGate(5, 5, 100).max_total(), 1u);
  EXPECT_EQ(RaiseDescriptorLimit(), DescriptorLimit());
}

TEST(EmulatorFloodTest, ConnectionsBeyondTheCapsAreRefusedAtOnce) {
  EmulatorOptions options;
  options.max_connections_per_route = 2;
  options.max_connections = 3;
  auto emulator = MakeEmulator(options, Shaped(0));
  ASSERT_NE(emulator, nullptr);
  Listener server;
  const std::string first = AddRoute(*emulator, server.address());
  const std::string second = AddRoute(*emulator, server.address(), "b");

  // Two on the first route forward; a third there is refused.
  const int a = Connect(first);
  const int a_peer = server.Accept();
  const int b = Connect(first);
  const int b_peer = server.Accept();
  ASSERT_GE(a_peer, 0);
  ASSERT_GE(b_peer, 0);
  const int c = Connect(first);
  EXPECT_TRUE(Refused(c));
  // One on the second route fits the total of 3; a second does not.
  const int d = Connect(second);
  const int d_peer = server.Accept();
  ASSERT_GE(d_peer, 0);
  const int e = Connect(second);
  EXPECT_TRUE(Refused(e));
  // The admitted ones forward.
  ASSERT_TRUE(SendAll(a, "hello"));
  EXPECT_EQ(RecvBytes(a_peer, 5), "hello");
  ASSERT_TRUE(SendAll(d_peer, "back"));
  EXPECT_EQ(RecvBytes(d, 4), "back");
  // A closed connection gives its place back.
  ::close(b);
  ::close(b_peer);
  // (Once its threads have ended; the route reaps it before its next
  // accept.)
  ASSERT_TRUE(Eventually([&] {
    Result<pb::WanLinkState> state = emulator->LinkState("a-b");
    return state.ok() && state->routes(0).connections() == 1;
  }));
  const int f = Connect(first);
  const int f_peer = server.Accept();
  ASSERT_GE(f_peer, 0);
  ASSERT_TRUE(SendAll(f, "again"));
  EXPECT_EQ(RecvBytes(f_peer, 5), "again");
  for (int fd : {a, a_peer, c, d, d_peer, e, f, f_peer}) {
    if (fd >= 0) ::close(fd);
  }
}

// Clients that send as fast as they can through a shaped link to a server
// that never reads: the link direction's queue never holds more than its
// limit, however many connections share it, and memory stays bounded (were
// the emulator to read what its clients send, it would hold hundreds of
// MiB within the three seconds).
TEST(EmulatorFloodTest, FastSendersAndANonReadingServerAreNotBuffered) {
  DirectionModel model = Shaped(1e9);
  model.queue_limit_bytes = 256 * 1024;
  auto emulator = MakeEmulator(EmulatorOptions(), model);
  ASSERT_NE(emulator, nullptr);
  Listener server;
  Holder holder(server);  // accepts, never reads
  const std::string route = AddRoute(*emulator, server.address());
  const long before_kib = ResidentKiB();

  constexpr int kSenders = 16;
  std::vector<int> clients;
  for (int i = 0; i < kSenders; ++i) clients.push_back(Connect(route));
  ASSERT_TRUE(Eventually([&] { return holder.held() == kSenders; }));
  const std::string chunk = Pattern(64 * 1024);
  uint64_t max_queued = 0;
  uint64_t sent = 0;
  const auto start = SteadyClock::now();
  while (SecondsSince(start) < 3.0) {
    for (int fd : clients) {
      const ssize_t n = ::send(fd, chunk.data(), chunk.size(),
                               MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n > 0) sent += static_cast<uint64_t>(n);
    }
    Result<pb::WanLinkState> state = emulator->LinkState("a-b");
    ASSERT_OK(state);
    max_queued = std::max(max_queued, state->a_to_b().queued_bytes());
  }
  EXPECT_GT(max_queued, 0u);
  EXPECT_LE(max_queued, model.queue_limit_bytes);
  // The documented bound: a read buffer per reader and the queue (twice,
  // for chunks that keep their read buffer), plus 16 MiB of slack for the
  // threads and the allocator.
  const long bound_kib =
      static_cast<long>(kSenders * 2 * EmulatorOptions().read_bytes / 1024 +
                        2 * 2 * model.queue_limit_bytes / 1024 + 16 * 1024);
  const long grew_kib = ResidentKiB() - before_kib;
  if (kResidentMemoryIsOurs) {
    EXPECT_LT(grew_kib, bound_kib);
  }
  std::printf("[ measured ] queue at most %llu of %llu bytes; clients sent "
              "%llu MiB; RSS grew %ld KiB (bound %ld KiB)\n",
              static_cast<unsigned long long>(max_queued),
              static_cast<unsigned long long>(model.queue_limit_bytes),
              static_cast<unsigned long long>(sent >> 20), grew_kib,
              bound_kib);
  for (int fd : clients) ::close(fd);
}

// The probe of the hostile-input issue: 10,000 connections opened and
// held on two routes, every one dripping a byte per 100 ms, while an
// established connection goes on forwarding both ways. The caps refuse
// all but 64 per route at once; memory stays under the bound of the
// admitted ones.
TEST(EmulatorFloodTest, TenThousandHeldConnectionsLeaveALegitimateOneAlone) {
  const uint64_t descriptors = RaiseFileLimit();
  // This process holds the flood's client ends as well as the emulator's.
  const int flood_size = static_cast<int>(
      std::min<uint64_t>(10000, descriptors > 2000 ? descriptors - 2000 : 0));
  ASSERT_GE(flood_size, 1000) << "descriptor limit " << descriptors;
  auto emulator =
      MakeEmulator(EmulatorOptions(), Shaped(100e6, milliseconds(1)));
  ASSERT_NE(emulator, nullptr);
  Listener server;
  const std::string routes[2] = {AddRoute(*emulator, server.address()),
                                 AddRoute(*emulator, server.address(), "b")};
  const int legit = Connect(routes[0]);
  const int legit_peer = server.Accept();
  ASSERT_GE(legit_peer, 0);
  ASSERT_TRUE(SendAll(legit, "hello"));
  ASSERT_EQ(RecvBytes(legit_peer, 5), "hello");
  Holder holder(server);
  const long before_kib = ResidentKiB();

  // Opened one after the other; a connection the emulator refuses may be
  // reset before connect() returns (then it is not held).
  std::vector<int> flood;
  int reset_at_once = 0;
  for (int i = 0; i < flood_size; ++i) {
    const int fd = OpenConnection(routes[i % 2]);
    if (fd >= 0) {
      flood.push_back(fd);
    } else {
      EXPECT_EQ(-fd, ECONNRESET);
      ++reset_at_once;
    }
  }
  EXPECT_EQ(static_cast<int>(flood.size()) + reset_at_once, flood_size);

  // The legitimate connection moves 4 MiB each way meanwhile.
  const std::string up = Pattern(4 << 20, 3);
  const std::string down = Pattern(4 << 20, 4);
  std::string got_up;
  std::string got_down;
  std::thread legit_traffic([&] {
    std::thread sender([&] { EXPECT_TRUE(SendAll(legit, up)); });
    got_up = RecvBytes(legit_peer, up.size(), 60000);
    sender.join();
    std::thread back([&] { EXPECT_TRUE(SendAll(legit_peer, down)); });
    got_down = RecvBytes(legit, down.size(), 60000);
    back.join();
  });
  // Twenty rounds of a byte on every flood connection, 100 ms apart.
  long peak_kib = 0;
  size_t open = flood.size();
  for (int round = 0; round < 20; ++round) {
    const auto start = SteadyClock::now();
    open = 0;
    for (int fd : flood) {
      if (::send(fd, "x", 1, MSG_DONTWAIT | MSG_NOSIGNAL) == 1) ++open;
    }
    peak_kib = std::max(peak_kib, ResidentKiB());
    std::this_thread::sleep_until(start + milliseconds(100));
  }
  legit_traffic.join();
  EXPECT_TRUE(got_up == up) << got_up.size() << " of " << up.size();
  EXPECT_TRUE(got_down == down) << got_down.size() << " of " << down.size();

  // 64 per route were admitted (the legitimate one among them); the rest
  // were refused at once and their sends fail.
  Result<pb::WanLinkState> state = emulator->LinkState("a-b");
  ASSERT_OK(state);
  for (const pb::WanRouteState& route : state->routes()) {
    EXPECT_LE(route.connections(), 64u);
  }
  EXPECT_LE(open, 2u * 64u);
  // The bound for 128 admitted connections: two read buffers each, four
  // threads each (128 KiB of stack and allocator allowance apiece), both
  // directions' queues twice, 32 MiB of slack (the flood's client ends are
  // in this process too).
  const DirectionModel model = Shaped(100e6, milliseconds(1));
  const long bound_kib = static_cast<long>(
      128 * 2 * EmulatorOptions().read_bytes / 1024 + 128 * 4 * 128 +
      2 * 2 * EffectiveQueueLimit(model) / 1024 + 32 * 1024);
  if (kResidentMemoryIsOurs) {
    EXPECT_LT(peak_kib - before_kib, bound_kib)
        << "peak " << peak_kib << " KiB, before " << before_kib << " KiB";
  }
  std::printf("[ measured ] %zu connections held, %d reset at once, %zu "
              "still open; RSS grew %ld KiB (bound %ld KiB)\n",
              flood.size(), reset_at_once, open, peak_kib - before_kib,
              bound_kib);
  for (int fd : flood) ::close(fd);
  ::close(legit);
  ::close(legit_peer);
}

}  // namespace
}  // namespace meridian::wan
