// End to end: the real `meridian wanem` process, driven like the launcher
// drives it (ready fd, control endpoint, add-route), with real ZeroMQ
// sockets talking through it; and the command line's answers to bad input.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <optional>
#include <sstream>
#include <zmq.hpp>

#include "meridian/wan/control.h"
#include "meridian/core/process.h"
#include "testing/processes.h"
#include "testing/test_data.h"
#include "wan/wan_test_util.h"
#include "testing/status_matchers.h"

namespace meridian::wan {
namespace {

using ::meridian::testing::CommandResult;
using testing::SecondsSince;
using testing::SteadyClock;

CommandResult Meridian(const std::string& args) {
  return ::meridian::testing::RunCommand(std::string(MERIDIAN_BINARY) + " " +
                                         args);
}

// A `meridian wanem ...` child (ChildProcess, the launcher's) with
// --ready-fd and its log in a file.
class WanemProcess {
 public:
  explicit WanemProcess(std::vector<std::string> flags) {
    std::vector<std::string> argv = {MERIDIAN_BINARY, "wanem"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    argv.insert(argv.end(), {"--ready-fd", std::to_string(kReadyFd)});
    Result<ChildProcess> child = ChildProcess::Spawn(
        "wanem", argv,
        ::meridian::testing::MakeTempDir("wanem") + "/wanem.log");
    EXPECT_OK(child);
    if (!child.ok()) return;
    child_.emplace(std::move(*child));
    Result<std::string> line =
        child_->ReadReadyLine(std::chrono::milliseconds(10000));
    EXPECT_TRUE(line.ok() && line->rfind("ready ", 0) == 0)
        << (line.ok() ? *line : line.status().message()) << "\n"
        << Log();
    if (line.ok() && line->size() > 6) endpoint_ = line->substr(6);
  }

  // Sends SIGTERM; returns the exit code (-1 if it did not exit by itself
  // within `seconds`, or was killed by a signal).
  int Terminate(double seconds = 5) {
    if (!child_) return -1;
    child_->Signal(SIGTERM);
    const auto start = SteadyClock::now();
    while (!child_->Poll() && SecondsSince(start) < seconds) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (!child_->exited()) return -1;
    const int status = child_->exit_status();
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  std::string Log() const {
    if (!child_) return "";
    std::ifstream in(child_->log_path());
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }

  const std::string& endpoint() const { return endpoint_; }

 private:
  std::optional<ChildProcess> child_;  // killed and reaped on destruction
  std::string endpoint_;
};

std::string TwoSiteJob(const std::string& wan) {
  pb::JobConfig job = ::meridian::testing::SmallJob("/nonexistent", 1);
  pb::SiteConfig* b = job.add_site();
  b->set_name("site-b");
  b->set_address("tcp://127.0.0.1:0");
  b->add_workers()->set_count(1);
  const std::string dir = ::meridian::testing::MakeTempDir("wanem-job");
  std::string text;
  const std::string path = dir + "/job.pbtxt";
  EXPECT_OK(::meridian::testing::WriteJobFile(job, path));
  std::ofstream(path, std::ios::app) << wan << "\n";
  return path;
}

int BindZmq(zmq::socket_t& socket) {
  socket.bind("tcp://127.0.0.1:*");
  const std::string endpoint = socket.get(zmq::sockopt::last_endpoint);
  return std::stoi(endpoint.substr(endpoint.rfind(':') + 1));
}

std::string Trim(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) {
    text.pop_back();
  }
  return text;
}

TEST(WanemE2eTest, ZeroMqThroughWanemCountsBytesAndMessages) {
  const std::string job = TwoSiteJob(
      "wan { default_link { bandwidth: '200mbit' latency: '2ms' } }");
  WanemProcess wanem({"--config", job, "--control", "tcp://127.0.0.1:0"});
  ASSERT_FALSE(wanem.endpoint().empty());
  const std::string control = "--control " + wanem.endpoint();

  zmq::context_t context;
  // PUSH at site-a -> PULL at site-b, through a route added with the CLI.
  zmq::socket_t pull(context, ZMQ_PULL);
  pull.set(zmq::sockopt::rcvtimeo, 10000);
  const int pull_port = BindZmq(pull);
  CommandResult route =
      Meridian("wanem ctl " + control +
               " add-route site-a-site-b --from site-a --listen 127.0.0.1:0 "
               "--forward 127.0.0.1:" +
               std::to_string(pull_port));
  ASSERT_EQ(route.exit_code, 0) << route.output;
  const std::string push_listen = Trim(route.output);
  ASSERT_EQ(push_listen.rfind("127.0.0.1:", 0), 0u) << push_listen;

  zmq::socket_t push(context, ZMQ_PUSH);
  push.set(zmq::sockopt::linger, 1000);
  push.connect("tcp://" + push_listen);
  const std::vector<size_t> sizes = {10, 1000, 100000};
  uint64_t payload = 0;
  for (int m = 0; m < 50; ++m) {
    for (size_t i = 0; i < sizes.size(); ++i) {
      std::string frame(sizes[i], static_cast<char>('a' + m % 26));
      payload += frame.size();
      push.send(zmq::buffer(frame), i + 1 < sizes.size()
                                        ? zmq::send_flags::sndmore
                                        : zmq::send_flags::none);
    }
  }
  for (int m = 0; m < 50; ++m) {
    for (size_t i = 0; i < sizes.size(); ++i) {
      zmq::message_t frame;
      ASSERT_TRUE(pull.recv(frame)) << "message " << m;
      ASSERT_EQ(frame.size(), sizes[i]);
      EXPECT_EQ(static_cast<const char*>(frame.data())[0], 'a' + m % 26);
    }
  }

  // REQ at site-b -> REP at site-a: a route from the other side.
  zmq::socket_t rep(context, ZMQ_REP);
  rep.set(zmq::sockopt::rcvtimeo, 10000);
  const int rep_port = BindZmq(rep);
  ControlClient client(wanem.endpoint());
  auto req_listen = client.AddRoute("site-a-site-b", "site-b", "127.0.0.1:0",
                                    "127.0.0.1:" + std::to_string(rep_port));
  ASSERT_OK(req_listen);
  zmq::socket_t req(context, ZMQ_REQ);
  req.set(zmq::sockopt::rcvtimeo, 10000);
  req.set(zmq::sockopt::linger, 0);
  req.connect("tcp://" + *req_listen);
  for (int i = 0; i < 20; ++i) {
    req.send(zmq::str_buffer("ping"));
    zmq::message_t message;
    ASSERT_TRUE(rep.recv(message));
    rep.send(zmq::str_buffer("pong!"));
    ASSERT_TRUE(req.recv(message));
    EXPECT_EQ(message.to_string(), "pong!");
  }

  // The last reply reached the REQ socket an instant before wanem counted
  // it (it counts a chunk once written on): wait for the counters.
  Result<pb::WanControlReply> status = client.GetStatus();
  EXPECT_TRUE(testing::Eventually([&] {
    status = client.GetStatus();
    return status.ok() && status->links_size() == 1 &&
           status->links(0).a_to_b().messages() >= 70 &&
           status->links(0).b_to_a().messages() >= 20;
  }));
  ASSERT_OK(status);
  ASSERT_EQ(status->links_size(), 1);
  const pb::WanLinkState& link = status->links(0);
  EXPECT_EQ(link.a(), "site-a");
  EXPECT_DOUBLE_EQ(link.a_to_b().bandwidth_bps(), 200e6);
  // 50 PUSH messages and 20 REPs go a -> b; 20 REQs go b -> a.
  EXPECT_EQ(link.a_to_b().messages(), 70u);
  EXPECT_EQ(link.b_to_a().messages(), 20u);
  // Bytes on the wire: the payload plus ZMTP greetings, handshakes and
  // frame headers (a few dozen bytes per connection and per frame).
  EXPECT_GE(link.a_to_b().bytes(), payload);
  EXPECT_LE(link.a_to_b().bytes(), payload + 2000 + 20 * 150 + 150 * 10);
  EXPECT_GT(link.b_to_a().bytes(), 20u * 4);
  EXPECT_EQ(link.routes_size(), 2);

  // The CLI's status table shows the same counters.
  CommandResult table = Meridian("wanem ctl " + control + " status");
  EXPECT_EQ(table.exit_code, 0) << table.output;
  EXPECT_NE(table.output.find("site-a->site-b"), std::string::npos)
      << table.output;
  EXPECT_NE(table.output.find(" 70 "), std::string::npos) << table.output;

  // Partition: the request is held, the connection kept; heal delivers it.
  CommandResult partition =
      Meridian("wanem ctl " + control + " partition site-a-site-b");
  ASSERT_EQ(partition.exit_code, 0) << partition.output;
  req.send(zmq::str_buffer("held"));
  rep.set(zmq::sockopt::rcvtimeo, 300);
  zmq::message_t held;
  EXPECT_FALSE(rep.recv(held)) << "nothing crosses a partition";
  ASSERT_EQ(Meridian("wanem ctl " + control + " heal site-a-site-b").exit_code,
            0);
  rep.set(zmq::sockopt::rcvtimeo, 10000);
  ASSERT_TRUE(rep.recv(held));
  EXPECT_EQ(held.to_string(), "held");

  // Every control change was logged with its time.
  const std::string log = wanem.Log();
  EXPECT_NE(log.find("site-a-site-b: partitioned"), std::string::npos) << log;
  EXPECT_NE(log.find("site-a-site-b: healed"), std::string::npos) << log;
  EXPECT_NE(log.find(" t="), std::string::npos) << log;

  EXPECT_EQ(wanem.Terminate(), 0) << wanem.Log();
}

TEST(WanemE2eTest, OneLinkFormShapesAndTakesRunTimeChanges) {
  testing::Listener server;
  WanemProcess wanem({"--listen", "127.0.0.1:0", "--forward", server.address(),
                      "--bandwidth", "8mbit", "--latency", "20ms", "--control",
                      "tcp://127.0.0.1:0"});
  ControlClient client(wanem.endpoint());
  auto status = client.GetStatus();
  ASSERT_OK(status);
  ASSERT_EQ(status->links_size(), 1);
  EXPECT_EQ(status->links(0).link(), "client-server");
  ASSERT_EQ(status->links(0).routes_size(), 1);
  const int fd = testing::Connect(status->links(0).routes(0).listen());
  const int peer = server.Accept();
  ASSERT_GE(peer, 0);

  const std::string data = testing::Pattern(1'000'000);  // 1 s at 8 Mbit/s
  auto transfer = [&] {
    const auto start = SteadyClock::now();
    std::thread sender([&] { testing::SendAll(fd, data); });
    EXPECT_EQ(testing::RecvBytes(peer, data.size(), 20000), data);
    const double seconds = SecondsSince(start);
    sender.join();
    return seconds;
  };
  // 1 s of bytes plus 20 ms: never sooner (the shaper's promise, up to
  // its first burst); later only by what a busy machine adds (a late
  // transfer is measured again).
  double seconds = 0;
  testing::UntilWithinBounds([&] {
    seconds = transfer();
    EXPECT_GE(seconds, 0.95) << "never early";
    return seconds < 2.0;
  });
  EXPECT_LT(seconds, 2.0);

  CommandResult set =
      Meridian("wanem ctl --control " + wanem.endpoint() +
               " set client-server --direction a-to-b --bandwidth 400mbit");
  EXPECT_EQ(set.exit_code, 0) << set.output;
  // 0.02 s of bytes plus 20 ms at the new rate. The rate is 50 times the
  // old one so that the transfer is short even where a loaded machine,
  // not the link, sets the pace (1 ms chunks at 8 Mbit/s are 1 KB, a
  // thread hand-off each; at 400 Mbit/s they are 50 KB).
  double seconds2 = 0;
  testing::UntilWithinBounds([&] {
    seconds2 = transfer();
    EXPECT_GE(seconds2, 0.035) << "never early";
    return seconds2 < seconds / 3;
  });
  EXPECT_LT(seconds2, seconds / 3) << "much faster after the change";
  EXPECT_NE(wanem.Log().find("client->server: set 400mbit 20ms"),
            std::string::npos)
      << wanem.Log();

  CommandResult unknown =
      Meridian("wanem ctl --control " + wanem.endpoint() + " heal nope");
  EXPECT_EQ(unknown.exit_code, 1);
  EXPECT_NE(unknown.output.find("no link 'nope'"), std::string::npos)
      << unknown.output;
  ::close(fd);
  ::close(peer);
  EXPECT_EQ(wanem.Terminate(), 0);
}

// A route flooded beyond its cap: the connections beyond it are closed at
// once and wanem says so, naming the cap; the first ones forward.
TEST(WanemE2eTest, ConnectionsBeyondARoutesCapAreRefusedWithALogLine) {
  testing::Listener server;
  WanemProcess wanem({"--listen", "127.0.0.1:0", "--forward", server.address(),
                      "--control", "tcp://127.0.0.1:0"});
  ControlClient client(wanem.endpoint());
  auto status = client.GetStatus();
  ASSERT_OK(status);
  const std::string listen = status->links(0).routes(0).listen();
  std::vector<int> clients;
  for (int i = 0; i < 80; ++i) clients.push_back(testing::Connect(listen));
  const auto start = SteadyClock::now();
  while (wanem.Log().find("max_connections_per_route") == std::string::npos &&
         SecondsSince(start) < 30) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const std::string log = wanem.Log();
  EXPECT_NE(log.find("connections: at most 64 per route"), std::string::npos)
      << log;
  EXPECT_NE(log.find("refused a connection from 127.0.0.1:"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("64 connections open on this route "
                     "(max_connections_per_route)"),
            std::string::npos)
      << log;
  // The admitted ones forward (their forward connections arrive in any
  // order; a refused one's send fails).
  for (size_t i = 0; i < clients.size(); ++i) {
    if (clients[i] < 0) continue;
    const std::string hello = "hello" + std::to_string(10 + i);
    (void)::send(clients[i], hello.data(), hello.size(), MSG_NOSIGNAL);
  }
  const int peer = server.Accept();
  ASSERT_GE(peer, 0);
  EXPECT_EQ(testing::RecvBytes(peer, 7).substr(0, 5), "hello");
  ::close(peer);
  for (int fd : clients) {
    if (fd >= 0) ::close(fd);
  }
  EXPECT_EQ(wanem.Terminate(), 0);
}

TEST(WanemE2eTest, BadCommandLinesAreClearErrors) {
  struct Case {
    std::string args;
    int exit_code;
    std::string message;
  };
  testing::Listener busy;
  const std::vector<Case> cases = {
      {"wanem --listen 127.0.0.1:0 --forward 127.0.0.1:1 --bandwidth 0mbit", 2,
       "positive"},
      {"wanem --listen 127.0.0.1:0 --forward 127.0.0.1:1 --bandwidth 1Gbits", 2,
       "unknown unit"},
      {"wanem --listen 127.0.0.1:0 --forward 127.0.0.1:1 --latency -5ms", 2,
       "negative"},
      {"wanem --listen 127.0.0.1:0 --forward 127.0.0.1:1 --latency 40", 2,
       "needs a unit"},
      {"wanem --listen 127.0.0.1:0 --forward 127.0.0.1:0", 2, "port 0"},
      {"wanem --listen 127.0.0.1:0", 2, "--forward"},
      {"wanem --config x.pbtxt --listen 127.0.0.1:0", 2, "one"},
      {"wanem --config /nonexistent/job.pbtxt", 2, "/nonexistent/job.pbtxt"},
      {"wanem --listen " + busy.address() +
           " --forward 127.0.0.1:1 --control none",
       1, "cannot listen"},
      {"wanem ctl set a-b --bandwidth 10mbits", 2, "unknown unit"},
      {"wanem ctl set a-b", 2, "nothing to change"},
      {"wanem ctl partition", 2, "LINK"},
      {"wanem ctl add-route a-b --from a --listen 127.0.0.1:0", 2, "forward"},
  };
  for (const Case& c : cases) {
    const CommandResult result = Meridian(c.args);
    EXPECT_FALSE(result.crashed) << c.args;
    EXPECT_EQ(result.exit_code, c.exit_code) << c.args << "\n" << result.output;
    EXPECT_NE(result.output.find(c.message), std::string::npos)
        << c.args << "\n"
        << result.output;
  }
}

TEST(WanemE2eTest, ControlEndpointInUseAndUnreachableWanem) {
  WanemProcess first({"--listen", "127.0.0.1:0", "--forward", "127.0.0.1:1",
                      "--control", "tcp://127.0.0.1:0"});
  ASSERT_FALSE(first.endpoint().empty());
  const CommandResult second =
      Meridian("wanem --listen 127.0.0.1:0 --forward 127.0.0.1:1 --control " +
               first.endpoint());
  EXPECT_EQ(second.exit_code, 1) << second.output;
  EXPECT_NE(second.output.find("cannot bind the control endpoint"),
            std::string::npos)
      << second.output;
  EXPECT_EQ(first.Terminate(), 0);
  // Nobody answers there any more.
  const CommandResult gone =
      Meridian("wanem ctl --control " + first.endpoint() + " status");
  EXPECT_EQ(gone.exit_code, 1) << gone.output;
  EXPECT_NE(gone.output.find("no answer from wanem"), std::string::npos)
      << gone.output;
}

}  // namespace
}  // namespace meridian::wan
