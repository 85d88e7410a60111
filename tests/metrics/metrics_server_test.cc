// The metrics endpoint's event loop over real sockets: HTTP as a scraper
// speaks it, and scrapes answered while hundreds of slow, idle or
// non-reading connections hold the server. Every wait is for an event
// (a reply, a close, a counter) with a generous deadline; the latency
// bounds are loose enough for a loaded 2-core machine (a scrape takes
// milliseconds; before the event loop it took 7-10 s behind 100 slow
// connections).
#include <gtest/gtest.h>
#include <poll.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "meridian/metrics/metrics.h"
#include "metrics/slow_clients.h"
#include "testing/status_matchers.h"
#include "testing/text.h"

namespace meridian {
namespace {

using ::meridian::testing::Contains;
using ::meridian::testing::Eventually;
using ::meridian::testing::PortOf;
using ::meridian::testing::RaiseFileLimit;
using ::meridian::testing::RawConnection;
using ::meridian::testing::SteadyClock;
using ::meridian::testing::SlowClientSwarm;
using ::meridian::testing::SlowKind;
using ::meridian::testing::TimedScrape;
using std::chrono::milliseconds;
using std::chrono::seconds;

// Limits under which only the caps close connections (no deadline falls
// within a test, even on a loaded machine).
MetricsServerLimits PatientLimits() {
  MetricsServerLimits limits;
  limits.io_timeout = seconds(120);
  limits.connection_timeout = seconds(300);
  return limits;
}

std::unique_ptr<MetricsServer> StartServer(
    const MetricsRegistry* registry,
    const MetricsServerLimits& limits = MetricsServerLimits()) {
  Result<std::unique_ptr<MetricsServer>> server =
      MetricsServer::Start(registry, "127.0.0.1:0", limits);
  EXPECT_OK(server);
  return server.ok() ? std::move(*server) : nullptr;
}

// Fills `registry` with about `bytes` of text.
void Pad(MetricsRegistry* registry, size_t bytes) {
  for (size_t i = 0; i * 80 < bytes; ++i) {
    registry
        ->Gauge("meridian_padding", "Padding",
                {{"series", std::to_string(i) + std::string(40, 'p')}})
        ->Set(static_cast<double>(i));
  }
}

long ResidentKiB() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  }
  return -1;
}

// Waits for the server to have answered something on `c` (bytes are
// there to read), without reading them.
bool AnsweredWithin(const RawConnection& c, milliseconds timeout) {
  pollfd item{c.fd(), POLLIN, 0};
  return ::poll(&item, 1, static_cast<int>(timeout.count())) > 0;
}

// --- HTTP as scrapers speak it ---------------------------------------------

TEST(MetricsHttpTest, KeepAlivePipeliningHeadAndRefusals) {
  MetricsRegistry registry;
  registry.Gauge("meridian_up", "Up")->Set(1);
  MetricsServerLimits limits = PatientLimits();
  limits.keep_alive_max = 3;
  std::unique_ptr<MetricsServer> server = StartServer(&registry, limits);
  ASSERT_NE(server, nullptr);
  const int port = PortOf(server->address());
  const std::string get = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";

  // Two requests in one send, a third after: answered in order on one
  // connection, the third (keep_alive_max) saying it closes.
  RawConnection kept(port);
  ASSERT_TRUE(kept.Send(get + get));
  std::string received;
  ASSERT_TRUE(kept.ReceiveUntil("meridian_up 1\n", seconds(30), &received));
  received.erase(0, received.find("meridian_up 1\n") + 14);
  ASSERT_TRUE(kept.ReceiveUntil("meridian_up 1\n", seconds(30), &received));
  ASSERT_TRUE(kept.Send(get));
  received.clear();
  ASSERT_TRUE(kept.ReceiveUntil("meridian_up 1\n", seconds(30), &received));
  EXPECT_TRUE(Contains(received, "HTTP/1.1 200 OK\r\n")) << received;
  EXPECT_TRUE(Contains(received, "Connection: close\r\n")) << received;
  EXPECT_TRUE(Contains(received, "text/plain; version=0.0.4")) << received;
  EXPECT_TRUE(kept.ClosedByServerWithin(seconds(30)));

  // HEAD: the length of the body, not the body.
  RawConnection head(port);
  ASSERT_TRUE(head.Send("HEAD /metrics HTTP/1.1\r\nConnection: close\r\n\r\n"));
  received.clear();
  ASSERT_TRUE(head.ReceiveUntil("\r\n\r\n", seconds(30), &received));
  EXPECT_TRUE(Contains(received, "Content-Length: " +
                                     std::to_string(registry.RenderText().size())))
      << received;
  EXPECT_TRUE(head.ClosedByServerWithin(seconds(30)));

  // HTTP/1.0 closes after its answer; a 404 names the path.
  RawConnection old(port);
  ASSERT_TRUE(old.Send("GET /nope HTTP/1.0\r\n\r\n"));
  received.clear();
  EXPECT_TRUE(old.ReceiveUntil("metrics are at /metrics", seconds(30),
                               &received));
  EXPECT_TRUE(Contains(received, "404 Not Found")) << received;
  EXPECT_TRUE(Contains(received, "not found: /nope")) << received;
  EXPECT_TRUE(old.ClosedByServerWithin(seconds(30)));

  // Refusals answer their status and close.
  struct Refused {
    std::string request;
    std::string status;
  };
  for (const Refused& refused : std::vector<Refused>{
           {"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n", "405"},
           {"GET /metrics HTTP/3.0\r\n\r\n", "505"},
           {"GET /metrics HTTP/1.1\r\nX: a\rb\r\n\r\n", "400"},
           {"GET /metrics HTTP/1.1\r\nX: " + std::string(9000, 'a'), "431"},
       }) {
    RawConnection c(port);
    ASSERT_TRUE(c.Send(refused.request));
    received.clear();
    EXPECT_TRUE(c.ReceiveUntil("HTTP/1.1 " + refused.status, seconds(30),
                               &received))
        << refused.status << ": " << received;
    EXPECT_TRUE(c.ClosedByServerWithin(seconds(30))) << refused.status;
  }
  EXPECT_GT(TimedScrape(server->address(), 30), 0);
}

// --- Deadlines ---------------------------------------------------------------

TEST(MetricsDeadlineTest, AHeadMustBeCompleteInTimeHoweverItsBytesTrickle) {
  MetricsRegistry registry;
  MetricsServerLimits limits = PatientLimits();
  limits.io_timeout = milliseconds(1000);  // the head's deadline
  std::unique_ptr<MetricsServer> server = StartServer(&registry, limits);
  ASSERT_NE(server, nullptr);
  RawConnection drip(PortOf(server->address()));
  ASSERT_TRUE(drip.Send("GET /metrics HTTP/1.1\r\nX-Drip: "));
  const auto start = SteadyClock::now();
  // A byte every 100 ms: each comes well within a second of the last.
  while (drip.Send("a") && !drip.ClosedByServerWithin(milliseconds(100)) &&
         SteadyClock::now() - start < seconds(60)) {
  }
  const double lasted =
      std::chrono::duration<double>(SteadyClock::now() - start).count();
  EXPECT_GE(lasted, 0.9);
  EXPECT_LT(lasted, 30.0);  // a second, unless the machine is very busy
}

// --- The connection budget ---------------------------------------------------

TEST(MetricsBudgetTest, TheOldestIdleConnectionsOfAnAddressAreShedFirst) {
  MetricsRegistry registry;
  registry.Gauge("meridian_up", "Up")->Set(1);
  MetricsServerLimits limits = PatientLimits();
  limits.max_connections_per_address = 4;
  std::unique_ptr<MetricsServer> server = StartServer(&registry, limits);
  ASSERT_NE(server, nullptr);
  const int port = PortOf(server->address());

  // A kept-alive connection that was answered, then three silent ones.
  std::vector<std::unique_ptr<RawConnection>> c;
  c.push_back(std::make_unique<RawConnection>(port));
  ASSERT_TRUE(c[0]->Send("GET /metrics HTTP/1.1\r\n\r\n"));
  std::string received;
  ASSERT_TRUE(c[0]->ReceiveUntil("meridian_up 1\n", seconds(30), &received));
  for (int i = 1; i < 4; ++i) {
    c.push_back(std::make_unique<RawConnection>(port));
    ASSERT_TRUE(c.back()->connected());
  }
  // c[0] has waited for a request longest (since its answer, which came
  // before the others connected): a fifth pushes it out.
  c.push_back(std::make_unique<RawConnection>(port));  // the fifth
  EXPECT_TRUE(c[0]->ClosedByServerWithin(seconds(30)));
  // A scrape from the same address gets in (pushing out c[1]) and is
  // answered.
  EXPECT_GT(TimedScrape(server->address(), 30), 0);
  EXPECT_TRUE(c[1]->ClosedByServerWithin(seconds(30)));
  for (int i = 2; i < 5; ++i) EXPECT_FALSE(c[i]->ClosedByServer()) << i;
}

TEST(MetricsBudgetTest, AnAddressCanOnlyPushOutItsOwnConnections) {
  MetricsRegistry registry;
  registry.Gauge("meridian_up", "Up")->Set(1);
  MetricsServerLimits limits = PatientLimits();
  limits.max_connections_per_address = 3;
  limits.max_connections = 6;
  std::unique_ptr<MetricsServer> server = StartServer(&registry, limits);
  ASSERT_NE(server, nullptr);
  const int port = PortOf(server->address());

  std::vector<std::unique_ptr<RawConnection>> bystanders;  // 127.0.0.3
  for (int i = 0; i < 2; ++i) {
    bystanders.push_back(std::make_unique<RawConnection>(port, "127.0.0.3"));
    ASSERT_TRUE(bystanders.back()->connected());
  }
  std::vector<std::unique_ptr<RawConnection>> flood;  // 127.0.0.2
  for (int i = 0; i < 10; ++i) {
    flood.push_back(std::make_unique<RawConnection>(port, "127.0.0.2"));
    ASSERT_TRUE(flood.back()->connected());
  }
  // The per-address cap: the flood keeps its 3 newest.
  for (int i = 0; i < 7; ++i) {
    EXPECT_TRUE(flood[i]->ClosedByServerWithin(seconds(30))) << i;
  }
  // 5 open; a sixth from a third address fits, a seventh meets the total
  // cap and pushes out the flood's oldest, the heaviest address.
  RawConnection third(port, "127.0.0.4");
  RawConnection fourth(port, "127.0.0.4");
  EXPECT_TRUE(flood[7]->ClosedByServerWithin(seconds(30)));
  // A scrape is answered too (the flood pays again).
  EXPECT_GT(TimedScrape(server->address(), 30), 0);
  EXPECT_TRUE(flood[8]->ClosedByServerWithin(seconds(30)));
  for (const auto& bystander : bystanders) {
    EXPECT_FALSE(bystander->ClosedByServer());
  }
  EXPECT_FALSE(third.ClosedByServer());
  EXPECT_FALSE(fourth.ClosedByServer());
}

// --- Scrapes under load ------------------------------------------------------

// Hundreds of connections of every misbehaving kind, reconnecting as the
// server closes them, from eight addresses: every scrape is answered, in
// milliseconds (the bound allows for a loaded machine).
TEST(MetricsUnderAttackTest, ScrapesAreAnsweredUnderHundredsOfSlowConnections) {
  RaiseFileLimit();
  MetricsRegistry registry;
  Pad(&registry, 512 * 1024);  // more than a socket buffer takes at once
  registry.Gauge("meridian_up", "Up")->Set(1);
  std::unique_ptr<MetricsServer> server = StartServer(&registry);
  ASSERT_NE(server, nullptr);
  const int port = PortOf(server->address());

  const std::vector<std::string> sources = {
      "127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5",
      "127.0.0.6", "127.0.0.7", "127.0.0.8", "127.0.0.9"};
  std::vector<std::unique_ptr<SlowClientSwarm>> swarms;
  for (const auto& [kind, count] :
       std::vector<std::pair<SlowKind, int>>{{SlowKind::kDrip, 200},
                                             {SlowKind::kSilent, 150},
                                             {SlowKind::kHalfHead, 100},
                                             {SlowKind::kNonReader, 50}}) {
    swarms.push_back(std::make_unique<SlowClientSwarm>(
        SlowClientSwarm::Options{port, count, kind, sources}));
  }
  // Every swarm has opened all its connections and moved them on twice.
  ASSERT_TRUE(Eventually(
      [&] {
        for (const auto& swarm : swarms) {
          if (swarm->rounds() < 3) return false;
        }
        return true;
      },
      seconds(60)));

  double slowest = 0;
  for (int i = 0; i < 10; ++i) {
    std::string text;
    const double took = TimedScrape(server->address(), 30, &text);
    ASSERT_GT(took, 0) << "scrape " << i << " failed";
    EXPECT_TRUE(Contains(text, "meridian_up 1\n"));
    slowest = std::max(slowest, took);
  }
  // How fast is the benchmark's goal (listeners_bench: 100 ms); here a
  // bound for a loaded machine, and none under a sanitizer (ThreadSanitizer
  // beside two busy loops took 4.0 s: every scrape answered is the test).
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  EXPECT_LT(slowest, 3.0);
#endif
  std::printf("[ measured ] slowest of 10 scrapes under 500 connections: "
              "%.1f ms\n", slowest * 1000);
  // The server made room: 500 connections against a budget of 256.
  uint64_t closed = 0;
  for (const auto& swarm : swarms) closed += swarm->closed_by_server();
  EXPECT_GT(closed, 0u);
}

// Clients that ask for a large response and never read it: each is
// dropped once it took nothing for io_timeout, and together they hold a
// few renders, not one each.
TEST(MetricsUnderAttackTest, ClientsThatDoNotReadShareRendersAndAreDropped) {
  RaiseFileLimit();
  MetricsRegistry registry;
  Pad(&registry, 4 << 20);
  registry.Gauge("meridian_up", "Up")->Set(1);
  const size_t render_kib = registry.RenderText().size() / 1024;
  MetricsServerLimits limits;  // connection_timeout 10 s
  limits.io_timeout = seconds(3);
  std::unique_ptr<MetricsServer> server = StartServer(&registry, limits);
  ASSERT_NE(server, nullptr);
  const int port = PortOf(server->address());
  const long before_kib = ResidentKiB();

  std::vector<std::unique_ptr<RawConnection>> readers;
  for (int i = 0; i < 80; ++i) {
    readers.push_back(std::make_unique<RawConnection>(
        port, "127.0.0." + std::to_string(2 + i % 4)));
    ASSERT_TRUE(readers.back()->Send("GET /metrics HTTP/1.1\r\n\r\n"));
  }
  for (const auto& reader : readers) {
    ASSERT_TRUE(AnsweredWithin(*reader, milliseconds(30000)));
  }
  const long held_kib = ResidentKiB() - before_kib;
  // One render each would be 80 x 4 MiB; the bound is
  // (max_rendered_responses 4 + 1 + connection_timeout 10 s) renders, and
  // in a second or so the loop makes about 5; 4 more for the allocator's
  // slack. (AddressSanitizer keeps freed memory and ThreadSanitizer
  // shadows every byte several times over: not measured there.)
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  EXPECT_LT(held_kib, static_cast<long>(19 * render_kib))
      << "render " << render_kib << " KiB";
#endif
  std::printf("[ measured ] 80 non-readers of a %zu KiB response: RSS grew "
              "%ld KiB\n", render_kib, held_kib);
  // A scrape meanwhile is answered.
  EXPECT_GT(TimedScrape(server->address(), 30), 0);
  // Each is dropped 3 s after its response stopped moving.
  for (const auto& reader : readers) {
    EXPECT_TRUE(Eventually([&] { return reader->ClosedByServer(); },
                           seconds(60)));
  }
}

}  // namespace
}  // namespace meridian
