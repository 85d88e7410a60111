// The metrics registry's Prometheus text, its parser, and the HTTP endpoint
// over real sockets.
#include "meridian/metrics/metrics.h"
#include "metrics/slow_clients.h"
#include "testing/status_matchers.h"
#include "testing/text.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace meridian {
namespace {

using ::meridian::testing::Contains;


TEST(MetricsRegistryTest, RendersHelpTypeAndSeries) {
  MetricsRegistry registry;
  registry
      .Counter("meridian_site_commits_total", "Commits applied",
               {{"site", "us"}})
      ->Add(3);
  registry.Gauge("meridian_sync_theta", "Threshold", {{"site", "us"}})
      ->Set(0.05);
  registry.Gauge("meridian_up", "Up")->Set(1);
  const std::string text = registry.RenderText();
  EXPECT_TRUE(Contains(text,
                       "# HELP meridian_site_commits_total Commits "
                       "applied\n# TYPE meridian_site_commits_total "
                       "counter\nmeridian_site_commits_total{site=\"us\"}"
                       " 3\n"))
      << text;
  EXPECT_TRUE(Contains(text, "# TYPE meridian_sync_theta gauge\n")) << text;
  EXPECT_TRUE(Contains(text, "meridian_sync_theta{site=\"us\"} 0.05\n"))
      << text;
  EXPECT_TRUE(Contains(text, "meridian_up 1\n")) << text;
  // Families in name order.
  EXPECT_LT(text.find("meridian_site_commits_total"),
            text.find("meridian_sync_theta"));
  EXPECT_LT(text.find("meridian_sync_theta"), text.find("meridian_up"));
}

TEST(MetricsRegistryTest, SameSeriesIsTheSameCell) {
  MetricsRegistry registry;
  MetricCell* a = registry.Counter("m_total", "h", {{"x", "1"}, {"y", "2"}});
  // Label order does not matter.
  MetricCell* b =
      registry.Counter("m_total", "other", {{"y", "2"}, {"x", "1"}});
  MetricCell* c = registry.Counter("m_total", "h", {{"x", "2"}, {"y", "2"}});
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  a->Add(1);
  b->Add(2);
  EXPECT_EQ(a->value(), 3);
  const std::string text = registry.RenderText();
  EXPECT_TRUE(Contains(text, "m_total{x=\"1\",y=\"2\"} 3\n")) << text;
  EXPECT_TRUE(Contains(text, "m_total{x=\"2\",y=\"2\"} 0\n")) << text;
  EXPECT_TRUE(Contains(text, "# HELP m_total h\n")) << text;  // first wins
}

TEST(MetricsRegistryTest, EscapesLabelValuesAndHelp) {
  MetricsRegistry registry;
  registry.Gauge("g", "line one\nback\\slash", {{"site", "a\"b\\c\nd"}})
      ->Set(1);
  const std::string text = registry.RenderText();
  EXPECT_TRUE(Contains(text, "# HELP g line one\\nback\\\\slash\n")) << text;
  EXPECT_TRUE(Contains(text, "g{site=\"a\\\"b\\\\c\\nd\"} 1\n")) << text;
  // And the parser reads the value back unescaped.
  Result<std::vector<MetricSample>> samples = ParseMetricsText(text);
  ASSERT_OK(samples);
  ASSERT_EQ(samples->size(), 1u);
  EXPECT_EQ((*samples)[0].Label("site"), "a\"b\\c\nd");
}

TEST(MetricsRegistryTest, SanitizesNames) {
  MetricsRegistry registry;
  registry.Gauge("meridian-bad name", "h", {{"bad-label", "v"}})->Set(2);
  registry.Gauge("9lives", "h")->Set(1);
  const std::string text = registry.RenderText();
  EXPECT_TRUE(Contains(text, "meridian_bad_name{bad_label=\"v\"} 2\n")) << text;
  EXPECT_TRUE(Contains(text, "_lives 1\n")) << text;
}

TEST(MetricsRegistryTest, FormatsSpecialValues) {
  EXPECT_EQ(FormatMetricValue(0), "0");
  EXPECT_EQ(FormatMetricValue(1234567890123), "1234567890123");
  EXPECT_EQ(FormatMetricValue(0.1), "0.1");
  EXPECT_EQ(FormatMetricValue(-2.5), "-2.5");
  EXPECT_EQ(FormatMetricValue(std::nan("")), "NaN");
  EXPECT_EQ(FormatMetricValue(HUGE_VAL), "+Inf");
  EXPECT_EQ(FormatMetricValue(-HUGE_VAL), "-Inf");
}

TEST(MetricsRegistryTest, ConcurrentUpdatesAreNotLost) {
  MetricsRegistry registry;
  MetricCell* cell = registry.Counter("c_total", "h");
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) cell->Add(1);
    });
  }
  std::thread renderer([&] {
    for (int i = 0; i < 100; ++i) (void)registry.RenderText();
  });
  for (std::thread& t : threads) t.join();
  renderer.join();
  EXPECT_EQ(cell->value(), 40000);
}

TEST(MetricsParseTest, ReadsSamplesAndSkipsComments) {
  Result<std::vector<MetricSample>> samples = ParseMetricsText(
      "# HELP a x\n# TYPE a counter\na_total{site=\"us\",peer=\"eu\"} 12 "
      "1700000000\n\nb 1.5e3\nc{} NaN\nd +Inf\n");
  ASSERT_OK(samples);
  ASSERT_EQ(samples->size(), 4u);
  EXPECT_EQ((*samples)[0].name, "a_total");
  EXPECT_EQ((*samples)[0].Label("peer"), "eu");
  EXPECT_EQ((*samples)[0].value, 12);
  EXPECT_EQ((*samples)[1].value, 1500);
  EXPECT_TRUE(std::isnan((*samples)[2].value));
  EXPECT_TRUE(std::isinf((*samples)[3].value));
}

TEST(MetricsParseTest, GarbageNamesTheLine) {
  for (const char* text :
       {"ok 1\n{bad} 1\n", "ok 1\nx{a=\"unterminated} 1\n",
        "ok 1\nx notanumber\n", "ok 1\nx{a=b} 1\n", "ok 1\nx\n"}) {
    Result<std::vector<MetricSample>> samples = ParseMetricsText(text);
    ASSERT_FALSE(samples.ok()) << text;
    EXPECT_TRUE(Contains(samples.status().message(), "line 2"))
        << samples.status();
  }
}

TEST(MetricsAddressTest, ParsesAndRefuses) {
  Result<MetricsAddress> a = ParseMetricsAddress("127.0.0.1:9100");
  ASSERT_OK(a);
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_EQ(a->port, 9100);
  Result<MetricsAddress> b = ParseMetricsAddress("*:0");
  ASSERT_OK(b);
  EXPECT_EQ(b->ToString(), "0.0.0.0:0");
  Result<MetricsAddress> c =
      ParseMetricsAddress("http://meridian-us:9100/metrics");
  ASSERT_OK(c);
  EXPECT_EQ(c->ToString(), "meridian-us:9100");
  for (const char* bad : {"", "9100", "host:", ":9100", "host:70000",
                          "host:12x", "a b:1", "tcp://h:1"}) {
    Result<MetricsAddress> parsed = ParseMetricsAddress(bad);
    EXPECT_FALSE(parsed.ok()) << bad;
    if (!parsed.ok()) {
      EXPECT_TRUE(Contains(parsed.status().message(), "HOST:PORT"))
          << parsed.status();
    }
  }
}

TEST(MetricsServerTest, ServesMetricsOverHttpOnAFreePort) {
  MetricsRegistry registry;
  MetricCell* commits = registry.Counter("meridian_site_commits_total",
                                         "Commits", {{"site", "a"}});
  commits->Add(7);
  Result<std::unique_ptr<MetricsServer>> server =
      MetricsServer::Start(&registry, "127.0.0.1:0");
  ASSERT_OK(server);
  const std::string address = (*server)->address();
  EXPECT_NE(address, "127.0.0.1:0");
  EXPECT_EQ((*server)->url(), "http://" + address + "/metrics");

  Result<std::string> text = FetchMetricsText(address, 5.0);
  ASSERT_OK(text);
  EXPECT_TRUE(Contains(*text, "meridian_site_commits_total{site=\"a\"} 7\n"))
      << *text;
  // Live: the next scrape sees the update.
  commits->Add(1);
  text = FetchMetricsText(address, 5.0);
  ASSERT_OK(text);
  EXPECT_TRUE(Contains(*text, "meridian_site_commits_total{site=\"a\"} 8\n"))
      << *text;

  // Content type and 404 elsewhere, with a plain HTTP client.
  const int port = std::stoi(address.substr(address.rfind(':') + 1));
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(5);
  httplib::Result ok = client.Get("/metrics");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
  EXPECT_TRUE(Contains(ok->get_header_value("Content-Type"), "text/plain"));
  httplib::Result missing = client.Get("/other");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
  EXPECT_TRUE(Contains(missing->body, "/metrics")) << missing->body;

  (*server)->Stop();
  (*server)->Stop();  // idempotent
  Result<std::string> after = FetchMetricsText(address, 1.0);
  EXPECT_FALSE(after.ok());
  EXPECT_EQ(after.status().code(), StatusCode::kUnavailable) << after.status();
}

TEST(MetricsServerTest, ASecondBindOnTheSamePortFailsCleanly) {
  MetricsRegistry registry;
  Result<std::unique_ptr<MetricsServer>> first =
      MetricsServer::Start(&registry, "127.0.0.1:0");
  ASSERT_OK(first);
  const std::string address = (*first)->address();
  Result<std::unique_ptr<MetricsServer>> second =
      MetricsServer::Start(&registry, address);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
  EXPECT_TRUE(Contains(second.status().message(), address)) << second.status();
  // The first keeps serving.
  EXPECT_OK(FetchMetricsText(address, 5.0));
  // A role would run on without metrics: null and a warning.
  EXPECT_EQ(StartMetricsServerOrWarn(&registry, address, "test"), nullptr);
  EXPECT_EQ(StartMetricsServerOrWarn(&registry, "", "test"), nullptr);
  EXPECT_EQ(StartMetricsServerOrWarn(&registry, "none", "test"), nullptr);
}

TEST(MetricsServerTest, MalformedAddressIsInvalidArgument) {
  MetricsRegistry registry;
  Result<std::unique_ptr<MetricsServer>> server =
      MetricsServer::Start(&registry, "no-port");
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), StatusCode::kInvalidArgument);
}

TEST(MetricsServerTest, StopsRightAfterStarting) {
  MetricsRegistry registry;
  for (int i = 0; i < 20; ++i) {
    Result<std::unique_ptr<MetricsServer>> server =
        MetricsServer::Start(&registry, "127.0.0.1:0");
    ASSERT_OK(server);
  }  // each destroyed at once: must not hang
}

TEST(MetricsFetchTest, UnreachableIsUnavailable) {
  // Bind and release a port so that nothing listens on it.
  MetricsRegistry registry;
  std::string address;
  {
    Result<std::unique_ptr<MetricsServer>> server =
        MetricsServer::Start(&registry, "127.0.0.1:0");
    ASSERT_OK(server);
    address = (*server)->address();
  }
  Result<std::string> text = FetchMetricsText(address, 1.0);
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.status().code(), StatusCode::kUnavailable);
  EXPECT_FALSE(FetchMetricsText("bad", 1.0).ok());
}

// --- Slow and hostile clients -------------------------------------------

using std::chrono::milliseconds;
using std::chrono::seconds;
using SteadyClock = std::chrono::steady_clock;

using ::meridian::testing::Eventually;
using ::meridian::testing::PortOf;
using ::meridian::testing::RawConnection;

int ThreadsOfThisProcess() {
  int count = 0;
  DIR* dir = ::opendir("/proc/self/task");
  if (dir == nullptr) return -1;
  while (const dirent* entry = ::readdir(dir)) {
    if (entry->d_name[0] != '.') ++count;
  }
  ::closedir(dir);
  return count;
}

// Scrapes `address` and says how long it took; fails the test on error.
double ScrapeSeconds(const std::string& address, const std::string& expect) {
  const auto start = SteadyClock::now();
  Result<std::string> text = FetchMetricsText(address, 30.0);
  const double elapsed =
      std::chrono::duration<double>(SteadyClock::now() - start).count();
  EXPECT_OK(text);
  if (text.ok()) {
    EXPECT_TRUE(Contains(*text, expect)) << *text;
  }
  return elapsed;
}

TEST(MetricsSlowClientTest, ScrapesAreServedWhileStalledConnectionsWait) {
  MetricsRegistry registry;
  registry.Gauge("meridian_up", "Up")->Set(1);
  const int threads_before = ThreadsOfThisProcess();
  Result<std::unique_ptr<MetricsServer>> server =
      MetricsServer::Start(&registry, "127.0.0.1:0");  // 2 s io timeout
  ASSERT_OK(server);
  const std::string address = (*server)->address();
  const int port = PortOf(address);

  // 32 connections that send half a request and stall, 16 that send
  // nothing at all.
  std::vector<std::unique_ptr<RawConnection>> stalled;
  for (int i = 0; i < 48; ++i) {
    stalled.push_back(std::make_unique<RawConnection>(port));
    ASSERT_TRUE(stalled.back()->connected());
    if (i < 32) {
      ASSERT_TRUE(stalled.back()->Send("GET /metrics HTTP/1.1\r\nHost: x"));
    }
  }
  // A scrape is served at once, not after them (generous for a loaded
  // 2-core machine: it takes milliseconds).
  EXPECT_LT(ScrapeSeconds(address, "meridian_up 1"), 5.0);
  // One thread serves them all (the event loop), however many wait.
  EXPECT_LE(ThreadsOfThisProcess(), threads_before + 1);

  // The server gives up on each after the io timeout (2 s) ...
  for (const auto& connection : stalled) {
    EXPECT_TRUE(connection->ClosedByServerWithin(seconds(20)));
  }
  stalled.clear();
  // ... and still runs on that one thread.
  EXPECT_TRUE(
      Eventually([&] { return ThreadsOfThisProcess() <= threads_before + 1; },
                 seconds(30)))
      << ThreadsOfThisProcess() << " threads, " << threads_before
      << " before the server";
  EXPECT_LT(ScrapeSeconds(address, "meridian_up 1"), 5.0);
}

TEST(MetricsSlowClientTest, TricklersAndEndlessHeadersAreCutOff) {
  MetricsRegistry registry;
  registry.Gauge("meridian_up", "Up")->Set(1);
  MetricsServerLimits limits;
  limits.io_timeout = milliseconds(1000);
  limits.connection_timeout = milliseconds(1500);
  Result<std::unique_ptr<MetricsServer>> server =
      MetricsServer::Start(&registry, "127.0.0.1:0", limits);
  ASSERT_OK(server);
  const std::string address = (*server)->address();
  const int port = PortOf(address);

  // Headers without end, as fast as the server takes them: it stops
  // reading at max_request_bytes (16 KiB) and closes, long before 64 MiB.
  RawConnection flood(port);
  ASSERT_TRUE(flood.connected());
  ASSERT_TRUE(flood.Send("GET /metrics HTTP/1.1\r\n"));
  const std::string header_lines = [] {
    std::string lines;
    for (int i = 0; i < 100; ++i)
      lines += "X-Padding: " + std::string(100, 'a') + "\r\n";
    return lines;
  }();
  size_t sent = 0;
  while (sent < (64u << 20) && flood.Send(header_lines)) {
    sent += header_lines.size();
  }
  EXPECT_LT(sent, 64u << 20) << "the server read 64 MiB of headers";

  // A byte every 200 ms: each read comes well within the io timeout, but
  // the connection ends at its 1.5 s deadline.
  RawConnection trickle(port);
  ASSERT_TRUE(trickle.connected());
  const auto start = SteadyClock::now();
  bool open = trickle.Send("GET /metrics HTTP/1.1\r\nX-Slow: ");
  while (open && SteadyClock::now() - start < seconds(30)) {
    std::this_thread::sleep_for(milliseconds(200));
    open = trickle.Send("a") && !trickle.ClosedByServerWithin(milliseconds(1));
  }
  const double lasted =
      std::chrono::duration<double>(SteadyClock::now() - start).count();
  EXPECT_FALSE(open);
  EXPECT_LT(lasted, 15.0);
  EXPECT_LT(ScrapeSeconds(address, "meridian_up 1"), 5.0);
}

TEST(MetricsSlowClientTest, ReadersThatDoNotReadDoNotBlockScrapes) {
  // A response of a few MiB, more than the socket buffers hold.
  MetricsRegistry registry;
  for (int i = 0; i < 40000; ++i) {
    registry
        .Gauge("meridian_padding", "Padding",
               {{"series", std::to_string(i) + std::string(40, 'p')}})
        ->Set(i);
  }
  registry.Gauge("meridian_up", "Up")->Set(1);
  Result<std::unique_ptr<MetricsServer>> server =
      MetricsServer::Start(&registry, "127.0.0.1:0");
  ASSERT_OK(server);
  const std::string address = (*server)->address();
  std::vector<std::unique_ptr<RawConnection>> readers;
  for (int i = 0; i < 8; ++i) {
    readers.push_back(std::make_unique<RawConnection>(PortOf(address)));
    ASSERT_TRUE(
        readers.back()->Send("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"));
  }
  EXPECT_LT(ScrapeSeconds(address, "meridian_up 1"), 10.0);
  // Each is dropped 2 s after its response stopped moving, not kept for
  // ever (they read what was sent, then see the end).
  for (const auto& reader : readers) {
    std::this_thread::sleep_for(milliseconds(100));
    EXPECT_TRUE(reader->ClosedByServerWithin(seconds(30)));
  }
}

TEST(MetricsSlowClientTest, StopDoesNotWaitForStalledConnections) {
  MetricsRegistry registry;
  Result<std::unique_ptr<MetricsServer>> server =
      MetricsServer::Start(&registry, "127.0.0.1:0");
  ASSERT_OK(server);
  std::vector<std::unique_ptr<RawConnection>> stalled;
  for (int i = 0; i < 16; ++i) {
    stalled.push_back(
        std::make_unique<RawConnection>(PortOf((*server)->address())));
    stalled.back()->Send("GET /metrics HTTP/1.1\r\n");
  }
  std::this_thread::sleep_for(milliseconds(200));  // all being served
  const auto start = SteadyClock::now();
  (*server)->Stop();
  // Every wait looks at the server every 100 ms; the 2 s io timeout
  // does not apply (generous bound for a loaded machine).
  EXPECT_LT(std::chrono::duration<double>(SteadyClock::now() - start).count(),
            1.5);
}

}  // namespace
}  // namespace meridian
