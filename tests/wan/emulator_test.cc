// The emulator on real loopback sockets. Timing checks use ±20% (as
// Mininet's own fidelity tests do), enough for a loaded 2-core machine.
#include <algorithm>
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <atomic>
#include <cmath>
#include <thread>

#include "wan/emulator.h"
#include "wan/wan_test_util.h"
#include "testing/status_matchers.h"

namespace meridian::wan {
namespace {

using std::chrono::milliseconds;
using testing::AddRoute;
using testing::Connect;
using testing::Eventually;
using testing::Listener;
using testing::Pattern;
using testing::RecvBytes;
using testing::SecondsSince;
using testing::SendAll;
using testing::Shaped;
using testing::SteadyClock;

DirectionModel Unshaped() { return Shaped(0); }

std::unique_ptr<Emulator> MakeEmulator(const DirectionModel& a_to_b,
                                       const DirectionModel& b_to_a) {
  EmulatorOptions options;
  options.links.push_back(LinkModel{"a", "b", a_to_b, b_to_a});
  Result<std::unique_ptr<Emulator>> emulator =
      Emulator::Create(std::move(options));
  EXPECT_OK(emulator);
  return std::move(*emulator);
}

pb::WanLinkState State(Emulator& emulator) {
  Result<pb::WanLinkState> state = emulator.LinkState("a-b");
  EXPECT_OK(state);
  return *state;
}

TEST(EmulatorTest, ForwardsEveryByteInOrderAndCountsThemExactly) {
  auto emulator = MakeEmulator(Unshaped(), Unshaped());
  Listener server;
  const std::string listen = AddRoute(*emulator, server.address());
  const int client = Connect(listen);
  ASSERT_GE(client, 0);
  const int peer = server.Accept();
  ASSERT_GE(peer, 0);

  const std::string up = Pattern(5 << 20, 1);
  const std::string down = Pattern(1 << 20, 2);
  std::thread sender([&] { EXPECT_TRUE(SendAll(client, up)); });
  EXPECT_EQ(RecvBytes(peer, up.size()), up);
  sender.join();
  ASSERT_TRUE(SendAll(peer, down));
  EXPECT_EQ(RecvBytes(client, down.size()), down);

  ASSERT_TRUE(Eventually([&] {
    return State(*emulator).a_to_b().bytes() == up.size() &&
           State(*emulator).b_to_a().bytes() == down.size();
  }));
  const pb::WanLinkState state = State(*emulator);
  EXPECT_EQ(state.a_to_b().bytes(), up.size());
  EXPECT_EQ(state.b_to_a().bytes(), down.size());
  EXPECT_EQ(state.a_to_b().messages(), 0u) << "not ZMTP";
  EXPECT_EQ(state.a_to_b().queued_bytes(), 0u);
  ASSERT_EQ(state.routes_size(), 1);
  EXPECT_EQ(state.routes(0).connections(), 1u);
  EXPECT_EQ(state.routes(0).from_site(), "a");
  ::close(client);
  ::close(peer);
  EXPECT_TRUE(Eventually(
      [&] { return State(*emulator).routes(0).connections() == 0; }));
}

// A ZMTP 3 stream: greeting, READY, then `n` two-frame messages whose
// second frame has `body` bytes.
std::string ZmtpStream(int n, size_t body) {
  std::string s(64, '\0');
  s[0] = '\xFF';
  s[9] = '\x7F';
  s[10] = 3;
  s.replace(12, 4, "NULL");
  const std::string ready = "\x05READY";
  s += '\x04';
  s += static_cast<char>(ready.size());
  s += ready;
  for (int m = 0; m < n; ++m) {
    s += '\x01';  // MORE, short
    s += '\x03';
    s += "hdr";
    s += '\x02';  // last frame, long size
    for (int i = 7; i >= 0; --i) {
      s += static_cast<char>((static_cast<uint64_t>(body) >> (8 * i)) & 0xFF);
    }
    s += Pattern(body, static_cast<uint32_t>(m) + 10);
  }
  return s;
}

TEST(EmulatorTest, ZmtpMessagesAreCountedOnTheZeroCopyPathToo) {
  // Unshaped: large frame bodies are spliced without being looked at.
  auto emulator = MakeEmulator(Unshaped(), Shaped(50e6, milliseconds(1)));
  Listener server;
  const int client = Connect(AddRoute(*emulator, server.address()));
  const int peer = server.Accept();
  ASSERT_GE(peer, 0);
  const std::string up = ZmtpStream(20, 3'000'000);
  const std::string down = ZmtpStream(7, 200'000);  // shaped direction
  std::thread sender([&] { EXPECT_TRUE(SendAll(client, up)); });
  EXPECT_EQ(RecvBytes(peer, up.size(), 20000), up);
  sender.join();
  ASSERT_TRUE(SendAll(peer, down));
  EXPECT_EQ(RecvBytes(client, down.size(), 20000), down);
  ASSERT_TRUE(Eventually(
      [&] { return State(*emulator).b_to_a().bytes() == down.size(); }));
  const pb::WanLinkState state = State(*emulator);
  EXPECT_EQ(state.a_to_b().bytes(), up.size());
  EXPECT_EQ(state.a_to_b().messages(), 20u);
  EXPECT_EQ(state.b_to_a().messages(), 7u);
  ::close(client);
  ::close(peer);
}

TEST(EmulatorTest, ShapedThroughputIsTheConfiguredRate) {
  auto emulator = MakeEmulator(Shaped(8e6), Shaped(8e6));
  Listener server;
  const int client = Connect(AddRoute(*emulator, server.address()));
  const int peer = server.Accept();
  ASSERT_GE(peer, 0);
  const std::string data = Pattern(1'000'000);  // 1 s at 8 Mbit/s
  double seconds = 0;
  testing::UntilWithinBounds([&] {
    std::thread sender([&] { SendAll(client, data); });
    const std::string first = RecvBytes(peer, 1);
    const auto start = SteadyClock::now();
    const std::string rest = RecvBytes(peer, data.size() - 1, 20000);
    seconds = SecondsSince(start);
    sender.join();
    EXPECT_EQ(first + rest, data);
    return std::abs(seconds - 1.0) <= 0.2;
  });
  EXPECT_NEAR(seconds, 1.0, 0.2);
  ::close(client);
  ::close(peer);
}

TEST(EmulatorTest, LatencyIsAddedEachWay) {
  auto emulator =
      MakeEmulator(Shaped(0, milliseconds(40)), Shaped(0, milliseconds(40)));
  Listener server;
  const int client = Connect(AddRoute(*emulator, server.address()));
  const int peer = server.Accept();
  ASSERT_GE(peer, 0);
  std::vector<double> rtts;
  testing::UntilWithinBounds([&] {
    rtts.clear();
    for (int i = 0; i < 5; ++i) {
      const auto start = SteadyClock::now();
      EXPECT_TRUE(SendAll(client, "ping"));
      EXPECT_EQ(RecvBytes(peer, 4), "ping");
      EXPECT_TRUE(SendAll(peer, "pong"));
      EXPECT_EQ(RecvBytes(client, 4), "pong");
      rtts.push_back(SecondsSince(start));
    }
    std::sort(rtts.begin(), rtts.end());
    EXPECT_GE(rtts[0], 0.079) << "never early";
    return std::abs(rtts[2] - 0.080) <= 0.016;
  });
  EXPECT_NEAR(rtts[2], 0.080, 0.016);  // median RTT = 2 x 40 ms, ±20%
  ::close(client);
  ::close(peer);
}

TEST(EmulatorTest, AsymmetricLinkShapesEachDirectionOnItsOwn) {
  auto emulator = MakeEmulator(Shaped(16e6), Shaped(4e6));
  Listener server;
  const int client = Connect(AddRoute(*emulator, server.address()));
  const int peer = server.Accept();
  ASSERT_GE(peer, 0);
  const std::string up = Pattern(1'000'000, 3);    // 0.5 s at 16 Mbit/s
  const std::string down = Pattern(1'000'000, 4);  // 2 s at 4 Mbit/s
  double up_s = 0, down_s = 0;
  testing::UntilWithinBounds([&] {
    std::thread up_sender([&] { SendAll(client, up); });
    std::thread down_sender([&] { SendAll(peer, down); });
    std::thread up_receiver([&] {
      const auto start = SteadyClock::now();
      EXPECT_EQ(RecvBytes(peer, up.size(), 20000), up);
      up_s = SecondsSince(start);
    });
    const auto start = SteadyClock::now();
    EXPECT_EQ(RecvBytes(client, down.size(), 20000), down);
    down_s = SecondsSince(start);
    up_receiver.join();
    up_sender.join();
    down_sender.join();
    return std::abs(up_s - 0.5) <= 0.1 && std::abs(down_s - 2.0) <= 0.4;
  });
  EXPECT_NEAR(up_s, 0.5, 0.1);
  EXPECT_NEAR(down_s, 2.0, 0.4);
  ::close(client);
  ::close(peer);
}

TEST(EmulatorTest, ConnectionsOfALinkShareItsBandwidth) {
  auto emulator = MakeEmulator(Shaped(16e6), Shaped(16e6));
  Listener server;
  const std::string listen = AddRoute(*emulator, server.address());
  const int c1 = Connect(listen);
  const int p1 = server.Accept();
  const int c2 = Connect(listen);
  const int p2 = server.Accept();
  ASSERT_GE(p1, 0);
  ASSERT_GE(p2, 0);
  const std::string data = Pattern(1'000'000);
  double seconds = 0;
  testing::UntilWithinBounds([&] {
    const auto start = SteadyClock::now();
    std::thread s1([&] { SendAll(c1, data); });
    std::thread s2([&] { SendAll(c2, data); });
    std::thread r1(
        [&] { EXPECT_EQ(RecvBytes(p1, data.size(), 20000), data); });
    EXPECT_EQ(RecvBytes(p2, data.size(), 20000), data);
    r1.join();
    seconds = SecondsSince(start);
    s1.join();
    s2.join();
    return std::abs(seconds - 1.0) <= 0.2;
  });
  // 2 MB at 16 Mbit/s: 1 s for both together (not 0.5 s each).
  EXPECT_NEAR(seconds, 1.0, 0.2);
  for (int fd : {c1, c2, p1, p2}) ::close(fd);
}

TEST(EmulatorTest, PartitionHoldsBytesKeepsConnectionsAndHealDelivers) {
  auto emulator = MakeEmulator(Shaped(100e6, milliseconds(5)),
                               Shaped(100e6, milliseconds(5)));
  Listener server;
  const int client = Connect(AddRoute(*emulator, server.address()));
  const int peer = server.Accept();
  ASSERT_GE(peer, 0);
  ASSERT_TRUE(SendAll(client, "before"));
  ASSERT_EQ(RecvBytes(peer, 6), "before");

  ASSERT_OK(emulator->Partition("a-b"));
  const std::string held = Pattern(200'000, 5);
  ASSERT_TRUE(SendAll(client, held));
  ASSERT_TRUE(SendAll(peer, "reply"));
  EXPECT_EQ(testing::PeerState(peer, 300), 2) << "nothing crosses";
  EXPECT_EQ(testing::PeerState(client, 0), 2);
  ASSERT_TRUE(Eventually(
      [&] { return State(*emulator).a_to_b().queued_bytes() == held.size(); }));
  pb::WanLinkState state = State(*emulator);
  EXPECT_TRUE(state.partitioned());
  EXPECT_EQ(state.routes(0).connections(), 1u) << "connection kept";
  EXPECT_EQ(state.a_to_b().bytes(), 6u);

  ASSERT_OK(emulator->Heal("a-b"));
  EXPECT_EQ(RecvBytes(peer, held.size()), held);
  EXPECT_EQ(RecvBytes(client, 5), "reply");
  ASSERT_TRUE(Eventually(
      [&] { return State(*emulator).a_to_b().bytes() == 6 + held.size(); }));
  EXPECT_FALSE(State(*emulator).partitioned());
  ::close(client);
  ::close(peer);
}

TEST(EmulatorTest, QueueLimitStopsReadingAndLosesNothing) {
  DirectionModel model = Unshaped();
  model.queue_limit_bytes = 64 * 1024;
  auto emulator = MakeEmulator(model, model);
  // Partitioned before the connection exists: every read is a queued one.
  ASSERT_OK(emulator->Partition("a-b"));
  Listener server;
  const int client = Connect(AddRoute(*emulator, server.address()));
  const int peer = server.Accept();
  ASSERT_GE(peer, 0);

  // Write without blocking until the kernel buffers and the emulator's
  // queue are full: the emulator must stop at its limit.
  const std::string block = Pattern(16 * 1024, 6);
  std::string sent;
  const auto start = SteadyClock::now();
  int idle_rounds = 0;
  while (SecondsSince(start) < 10 && idle_rounds < 20) {
    const ssize_t n =
        ::send(client, block.data(), block.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) {
      sent.append(block.data(), static_cast<size_t>(n));
      idle_rounds = 0;
    } else {
      ++idle_rounds;
      std::this_thread::sleep_for(milliseconds(10));
    }
  }
  const uint64_t queued = State(*emulator).a_to_b().queued_bytes();
  EXPECT_GT(queued, 0u);
  EXPECT_LE(queued, 64u * 1024) << "never more than the queue limit";
  EXPECT_GT(sent.size(), queued) << "the rest waits in TCP buffers";

  ASSERT_OK(emulator->Heal("a-b"));
  EXPECT_EQ(RecvBytes(peer, sent.size(), 20000), sent);
  ::close(client);
  ::close(peer);
}

TEST(EmulatorTest, EndOfStreamIsPassedOnAfterTheData) {
  auto emulator = MakeEmulator(Shaped(50e6, milliseconds(20)),
                               Shaped(50e6, milliseconds(20)));
  Listener server;
  const int client = Connect(AddRoute(*emulator, server.address()));
  const int peer = server.Accept();
  ASSERT_GE(peer, 0);
  const std::string request = Pattern(100'000, 7);
  ASSERT_TRUE(SendAll(client, request));
  ::shutdown(client, SHUT_WR);  // half-close
  EXPECT_EQ(RecvBytes(peer, request.size() + 1), request) << "then EOF";
  ASSERT_TRUE(SendAll(peer, "answer"));
  ::close(peer);
  EXPECT_EQ(RecvBytes(client, 100), "answer");
  EXPECT_EQ(testing::PeerState(client, 2000), 0) << "clean end of stream";
  ::close(client);
  EXPECT_TRUE(Eventually(
      [&] { return State(*emulator).routes(0).connections() == 0; }));
}

TEST(EmulatorTest, UnreachableForwardClosesTheClientAndKeepsServing) {
  auto emulator = MakeEmulator(Unshaped(), Unshaped());
  const std::string dead = "127.0.0.1:" + std::to_string(testing::DeadPort());
  const int client = Connect(AddRoute(*emulator, dead));
  ASSERT_GE(client, 0);
  const int state = testing::PeerState(client, 5000);
  EXPECT_TRUE(state == 0 || state == -ECONNRESET) << state;
  ::close(client);

  // The same emulator keeps serving another route of the link.
  Listener server;
  const int client2 = Connect(AddRoute(*emulator, server.address(), "b"));
  const int peer = server.Accept();
  ASSERT_GE(peer, 0);
  ASSERT_TRUE(SendAll(client2, "still here"));
  EXPECT_EQ(RecvBytes(peer, 10), "still here");
  // A route from b uses the b->a shaper for its requests.
  EXPECT_TRUE(
      Eventually([&] { return State(*emulator).b_to_a().bytes() == 10; }));
  ::close(client2);
  ::close(peer);
}

TEST(EmulatorTest, PeerDisconnectingMidStreamClosesCleanly) {
  auto emulator = MakeEmulator(Shaped(100e6, milliseconds(2)),
                               Shaped(100e6, milliseconds(2)));
  Listener server;
  const std::string listen = AddRoute(*emulator, server.address());
  const int client = Connect(listen);
  const int peer = server.Accept();
  ASSERT_GE(peer, 0);
  std::atomic<bool> stop{false};
  std::thread sender([&] {
    const std::string block = Pattern(64 * 1024);
    while (!stop.load() && SendAll(client, block)) {
    }
  });
  EXPECT_EQ(RecvBytes(peer, 100'000).size(), 100'000u);
  // The server dies abruptly (RST).
  linger hard{1, 0};
  ::setsockopt(peer, SOL_SOCKET, SO_LINGER, &hard, sizeof(hard));
  ::close(peer);
  const int state = testing::PeerState(client, 5000);
  EXPECT_NE(state, 2) << "the client learns that the peer is gone";
  stop.store(true);
  ::shutdown(client, SHUT_RDWR);
  sender.join();
  ::close(client);
  EXPECT_TRUE(Eventually(
      [&] { return State(*emulator).routes(0).connections() == 0; }));

  // The route keeps serving new connections.
  const int client2 = Connect(listen);
  const int peer2 = server.Accept();
  ASSERT_GE(peer2, 0);
  ASSERT_TRUE(SendAll(client2, "again"));
  EXPECT_EQ(RecvBytes(peer2, 5), "again");
  ::close(client2);
  ::close(peer2);
}

TEST(EmulatorTest, SetLinkChangesTheModelWhileRunning) {
  auto emulator = MakeEmulator(Unshaped(), Unshaped());
  Listener server;
  const int client = Connect(AddRoute(*emulator, server.address()));
  const int peer = server.Accept();
  ASSERT_GE(peer, 0);
  // The fastest of five one-way trips: a busy machine delays some trips
  // (never speeds one up), so the minimum is the link's own delay.
  auto one_way = [&] {
    double fastest = 1e9;
    for (int i = 0; i < 5; ++i) {
      const auto start = SteadyClock::now();
      EXPECT_TRUE(SendAll(client, "x"));
      EXPECT_EQ(RecvBytes(peer, 1), "x");
      fastest = std::min(fastest, SecondsSince(start));
    }
    return fastest;
  };
  double before = 0;
  testing::UntilWithinBounds([&] { return (before = one_way()) < 0.03; });
  EXPECT_LT(before, 0.03);
  pb::LinkDirectionConfig change;
  change.set_latency("60ms");
  ASSERT_OK(emulator->SetLink("a-b", pb::A_TO_B, change));
  // Never early (the model holds every byte 60 ms); late only by what the
  // scheduler adds (a late measurement is taken again).
  double after = 0;
  testing::UntilWithinBounds([&] {
    after = one_way();
    EXPECT_GE(after, 0.059) << "never early";
    return after < 0.110;
  });
  EXPECT_LT(after, 0.110);  // and not twice: 0.120
  const pb::WanLinkState state = State(*emulator);
  EXPECT_DOUBLE_EQ(state.a_to_b().latency_s(), 0.060);
  EXPECT_DOUBLE_EQ(state.b_to_a().latency_s(), 0.0) << "only a->b";

  // A bad change is refused as a whole.
  change.set_bandwidth("fast");
  const Status bad = emulator->SetLink("a-b", pb::BOTH, change);
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("bandwidth"), std::string::npos) << bad;
  EXPECT_DOUBLE_EQ(State(*emulator).b_to_a().latency_s(), 0.0);
  ::close(client);
  ::close(peer);
}

TEST(EmulatorTest, BadRequestsAreClearErrors) {
  auto emulator = MakeEmulator(Unshaped(), Unshaped());
  EXPECT_EQ(emulator->Partition("x-y").code(), StatusCode::kNotFound);
  EXPECT_NE(emulator->Partition("x-y").message().find("a-b"), std::string::npos)
      << "names the links that exist";
  EXPECT_EQ(emulator->SetLink("x-y", pb::BOTH, {}).code(),
            StatusCode::kNotFound);
  EXPECT_FALSE(
      emulator->AddRoute({"a-b", "c", "127.0.0.1:0", "1.2.3.4:5"}).ok());
  EXPECT_FALSE(emulator->AddRoute({"a-b", "a", "nonsense", "1.2.3.4:5"}).ok());
  EXPECT_FALSE(emulator->AddRoute({"a-b", "a", "127.0.0.1:0", "1.2.3.4"}).ok());
  EXPECT_FALSE(
      emulator->AddRoute({"a-b", "a", "127.0.0.1:0", "no.such.host.invalid:5"})
          .ok());
  // A standalone wanem's route waits for its forward host to exist.
  Result<std::string> later = emulator->AddRoute(
      {"a-b", "a", "127.0.0.1:0", "no.such.host.invalid:5", true});
  ASSERT_OK(later);
  const int client = Connect(*later);
  ASSERT_GE(client, 0) << "the route listens";
  EXPECT_LE(testing::PeerState(client, 5000), 0)
      << "the connection is closed: nothing to forward to";
  ::close(client);
  Listener busy;
  EXPECT_EQ(emulator->AddRoute({"a-b", "a", busy.address(), "1.2.3.4:5"})
                .status()
                .code(),
            StatusCode::kUnavailable)
      << "address in use";
  EXPECT_FALSE(emulator->LinkState("nope").ok());

  EmulatorOptions twice;
  twice.links.push_back(LinkModel{"a", "b", {}, {}});
  twice.links.push_back(LinkModel{"b", "a", {}, {}});
  EXPECT_FALSE(Emulator::Create(twice).ok());
  EmulatorOptions self;
  self.links.push_back(LinkModel{"a", "a", {}, {}});
  EXPECT_FALSE(Emulator::Create(self).ok());
}

TEST(EmulatorTest, StopClosesEverythingAndIsIdempotent) {
  auto emulator = MakeEmulator(Shaped(1e6, milliseconds(50)),
                               Shaped(1e6, milliseconds(50)));
  Listener server;
  const int client = Connect(AddRoute(*emulator, server.address()));
  const int peer = server.Accept();
  ASSERT_GE(peer, 0);
  ASSERT_TRUE(SendAll(client, Pattern(200'000)));  // still queued at 1 Mbit/s
  const auto start = SteadyClock::now();
  emulator->Stop();
  EXPECT_LT(SecondsSince(start), 2.0);
  emulator->Stop();
  const int state = testing::PeerState(client, 2000);
  EXPECT_TRUE(state == 0 || state == -ECONNRESET) << state;
  ::close(client);
  ::close(peer);
}

}  // namespace
}  // namespace meridian::wan
