// The front of a ZeroMQ endpoint (wan/front.h) in front of a real ROUTER
// socket: it relays ZeroMQ both ways (CURVE included), holds at most a
// connection's credit of what the server has not taken, closes a
// connection that stalls there (a message that never ends, in 1 KiB or in
// empty frames) or that does not read, and makes room for new connections
// by evicting untrusted ones.
#include "meridian/wan/front.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "testing/raw_zmtp.h"
#include "testing/status_matchers.h"

namespace meridian::wan {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// Waits for `done` (checked every 10 ms) up to a deadline generous enough
// for a loaded machine.
bool WaitFor(const std::function<bool()>& done, seconds timeout = seconds(30)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(milliseconds(10));
  }
  return true;
}

class FrontTest : public ::testing::Test {
 protected:
  void TearDown() override {
    front_.reset();
    router_.close();
  }

  void Start(FrontOptions options, bool curve = false) {
    router_ = zmq::socket_t(context_, zmq::socket_type::router);
    router_.set(zmq::sockopt::linger, 0);
    if (curve) {
      router_.set(zmq::sockopt::curve_server, 1);
      router_.set(zmq::sockopt::curve_secretkey, server_secret_);
    }
    router_.bind("tcp://127.0.0.1:*");
    options.listen = "tcp://127.0.0.1:*";
    options.upstream = router_.get(zmq::sockopt::last_endpoint);
    options.name = "test front";
    Result<std::unique_ptr<ConnectionFront>> front =
        ConnectionFront::Start(std::move(options));
    ASSERT_OK(front);
    front_ = std::move(*front);
  }

  // A small untrusted credit and a short stall timeout, for strangers.
  static FrontOptions StrangerOptions(milliseconds stall_timeout) {
    FrontOptions options;
    options.untrusted_credit = 64 << 10;
    options.stall_timeout = stall_timeout;
    return options;
  }

  // A raw TCP peer through the front, past the ZMTP handshake; -1 when
  // either failed.
  int ConnectStranger() {
    const int fd = testing::ConnectRawTcp(front_->endpoint());
    if (fd >= 0 && testing::ZmtpHandshake(fd)) return fd;
    if (fd >= 0) ::close(fd);
    return -1;
  }

  zmq::socket_t Dealer() {
    zmq::socket_t dealer(context_, zmq::socket_type::dealer);
    dealer.set(zmq::sockopt::linger, 0);
    return dealer;
  }

  // One message off the ROUTER within `timeout`, reported to the front as
  // the site server reports it: its frames (routing id first) and the
  // upstream port of its connection.
  struct Taken {
    std::vector<zmq::message_t> frames;
    uint16_t port = 0;
  };
  std::optional<Taken> Take(milliseconds timeout) {
    zmq::pollitem_t item{router_.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, timeout) == 0) return std::nullopt;
    Taken taken;
    EXPECT_TRUE(zmq::recv_multipart(router_, std::back_inserter(taken.frames),
                                    zmq::recv_flags::dontwait));
    uint64_t bytes = 0;
    int fd = -1;
    for (size_t i = 1; i < taken.frames.size(); ++i) {
      bytes += taken.frames[i].size();
      if (const char* text = zmq_msg_gets(taken.frames[i].handle(), "__fd")) {
        fd = std::atoi(text);
      }
    }
    taken.port = UpstreamPortOfFd(fd);
    front_->Consumed(taken.port, bytes, taken.frames.size() - 1);
    return taken;
  }

  // A DEALER through the front whose first message ("hello") the
  // application took and whose connection it trusted as `identity`.
  struct Trusted {
    zmq::socket_t dealer;
    uint16_t port = 0;  // its upstream port, 0 when the hello never came
  };
  Trusted TrustedDealer(uint64_t identity) {
    Trusted trusted{Dealer()};
    trusted.dealer.connect(front_->endpoint());
    EXPECT_TRUE(trusted.dealer.send(zmq::buffer(std::string("hello")),
                                    zmq::send_flags::none));
    std::optional<Taken> hello = Take(milliseconds(20000));
    EXPECT_TRUE(hello.has_value()) << "the hello never arrived";
    if (hello.has_value()) {
      trusted.port = hello->port;
      front_->Trust(hello->port, identity);
    }
    return trusted;
  }

  // A request from `dealer` through the front and the ROUTER's answer.
  void RoundTrip(zmq::socket_t& dealer, const std::string& text) {
    ASSERT_TRUE(dealer.send(zmq::buffer(text), zmq::send_flags::none));
    std::optional<Taken> taken = Take(milliseconds(20000));
    ASSERT_TRUE(taken.has_value()) << "the request never arrived";
    ASSERT_EQ(taken->frames.size(), 2u);
    EXPECT_EQ(taken->frames[1].to_string(), text);
    EXPECT_NE(taken->port, 0) << "no connection known for the request";
    std::vector<zmq::message_t> reply;
    reply.push_back(std::move(taken->frames[0]));
    reply.emplace_back("re: " + text);
    ASSERT_TRUE(zmq::send_multipart(router_, reply));
    zmq::message_t answer;
    dealer.set(zmq::sockopt::rcvtimeo, 20000);
    ASSERT_TRUE(dealer.recv(answer));
    EXPECT_EQ(answer.to_string(), "re: " + text);
  }

  zmq::context_t context_;
  zmq::socket_t router_;
  std::unique_ptr<ConnectionFront> front_;
  std::string server_public_ = std::string(40, '\0');
  std::string server_secret_ = std::string(40, '\0');
};

TEST_F(FrontTest, RelaysRequestsAndRepliesAndKnowsTheirConnection) {
  Start({});
  zmq::socket_t dealer = Dealer();
  dealer.connect(front_->endpoint());
  RoundTrip(dealer, "hello");
  RoundTrip(dealer, std::string(200000, 'x'));  // several buffers' worth
  // The front publishes its counts at the end of its turn, which may come
  // after the reply arrived.
  EXPECT_TRUE(WaitFor([&] {
    return front_->stats().open == 1 && front_->stats().accepted == 1;
  })) << front_->stats().open << " open, " << front_->stats().accepted
      << " accepted";
}

TEST_F(FrontTest, CurveHandshakesAndFramesPassThrough) {
  char public_key[41];
  char secret_key[41];
  ASSERT_EQ(zmq_curve_keypair(public_key, secret_key), 0);
  server_public_ = public_key;
  server_secret_ = secret_key;
  Start({}, /*curve=*/true);
  ASSERT_EQ(zmq_curve_keypair(public_key, secret_key), 0);
  zmq::socket_t dealer = Dealer();
  dealer.set(zmq::sockopt::curve_serverkey, server_public_);
  dealer.set(zmq::sockopt::curve_publickey, std::string(public_key));
  dealer.set(zmq::sockopt::curve_secretkey, std::string(secret_key));
  dealer.connect(front_->endpoint());
  RoundTrip(dealer, "secret hello");
}

// Until the server trusts a connection it holds at most the untrusted
// credit of it; trusted, the message that did not fit arrives whole.
TEST_F(FrontTest, AConnectionHoldsAtMostItsCreditUntilTrusted) {
  FrontOptions options;
  options.untrusted_credit = 64 << 10;
  options.trusted_credit = 4 << 20;
  Start(options);
  zmq::socket_t dealer = Dealer();
  dealer.connect(front_->endpoint());
  ASSERT_TRUE(dealer.send(zmq::buffer(std::string("hello")),
                          zmq::send_flags::none));
  std::optional<Taken> hello = Take(milliseconds(20000));
  ASSERT_TRUE(hello.has_value());
  const std::string big(1 << 20, 'b');
  ASSERT_TRUE(dealer.send(zmq::buffer(big), zmq::send_flags::none));
  ASSERT_TRUE(WaitFor([&] {
    return front_->stats().held_bytes > options.untrusted_credit / 2;
  }));
  EXPECT_LE(front_->stats().held_bytes, options.untrusted_credit);
  EXPECT_FALSE(Take(milliseconds(300)).has_value())
      << "a message beyond the credit arrived before the connection was "
         "trusted";
  EXPECT_LE(front_->stats().held_bytes, options.untrusted_credit);
  front_->Trust(hello->port, /*identity=*/0);
  std::optional<Taken> taken = Take(milliseconds(20000));
  ASSERT_TRUE(taken.has_value()) << "the trusted connection stayed stalled";
  EXPECT_EQ(taken->frames[1].size(), big.size());
  // Published at the end of the turn that forwarded the message.
  EXPECT_TRUE(WaitFor([&] { return front_->stats().trusted == 1; }));
  // What remains is the handshake's (it is paid back by later frames).
  EXPECT_TRUE(WaitFor([&] { return front_->stats().held_bytes < 1024; }))
      << front_->stats().held_bytes;
}

// A message that never ends, in frames of `GetParam()` bytes: the front
// stops reading at the credit, closes the connection once it has sat
// there for stall_timeout, and serves another connection all along.
class EndlessMessageTest : public FrontTest,
                           public ::testing::WithParamInterface<size_t> {};

TEST_P(EndlessMessageTest, IsHeldAtTheCreditAndClosedWhenItStalls) {
  const FrontOptions options = StrangerOptions(milliseconds(500));
  Start(options);
  const int hostile = ConnectStranger();
  ASSERT_GE(hostile, 0);
  uint64_t peak = 0;
  const uint64_t sent = testing::SendEndlessMessage(
      hostile, GetParam(), uint64_t{1} << 30,
      [&] { peak = std::max(peak, front_->stats().held_bytes); });
  EXPECT_LT(sent, uint64_t{1} << 30) << "the front never stopped reading";
  EXPECT_LE(peak, options.untrusted_credit);
  ::close(hostile);
  // Someone else is served meanwhile, and the stalled connection goes.
  zmq::socket_t dealer = Dealer();
  dealer.connect(front_->endpoint());
  RoundTrip(dealer, "still there?");
  EXPECT_TRUE(WaitFor([&] {
    return front_->stats().open == 1 && front_->stats().held_bytes < 1024;
  })) << "open " << front_->stats().open << ", held "
      << front_->stats().held_bytes;
}

INSTANTIATE_TEST_SUITE_P(FrameSizes, EndlessMessageTest,
                         ::testing::Values(size_t{1024}, size_t{0},
                                           size_t{100000}));

TEST_F(FrontTest, AConnectionStalledAtItsCreditIsClosed) {
  Start(StrangerOptions(milliseconds(300)));
  const int hostile = ConnectStranger();
  ASSERT_GE(hostile, 0);
  std::string stream;
  for (int i = 0; i < 200; ++i) stream += testing::ZmtpMoreFrame(1024);
  ::fcntl(hostile, F_SETFL, ::fcntl(hostile, F_GETFL) | O_NONBLOCK);
  (void)::send(hostile, stream.data(), stream.size(), MSG_NOSIGNAL);
  ASSERT_TRUE(WaitFor([&] { return front_->stats().stalled == 1; }))
      << "held " << front_->stats().held_bytes << ", open "
      << front_->stats().open << ", accepted " << front_->stats().accepted;
  EXPECT_EQ(front_->stats().open, 0u);
  EXPECT_EQ(front_->stats().held_bytes, 0u);
  // The peer learns it: its connection is reset.
  char byte;
  ::fcntl(hostile, F_SETFL, ::fcntl(hostile, F_GETFL) & ~O_NONBLOCK);
  timeval timeout{10, 0};
  ::setsockopt(hostile, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  const ssize_t n = ::recv(hostile, &byte, 1, 0);
  EXPECT_TRUE(n == 0 || (n < 0 && errno == ECONNRESET))
      << n << " " << std::strerror(errno);
  ::close(hostile);
}

TEST_F(FrontTest, ThePeerThatDoesNotReadIsClosed) {
  FrontOptions options;
  options.stall_timeout = milliseconds(300);
  Start(options);
  zmq::socket_t deaf = Dealer();
  deaf.set(zmq::sockopt::rcvhwm, 1);
  deaf.set(zmq::sockopt::rcvbuf, 4096);
  deaf.connect(front_->endpoint());
  ASSERT_TRUE(deaf.send(zmq::buffer(std::string("hello")),
                        zmq::send_flags::none));
  std::optional<Taken> hello = Take(milliseconds(20000));
  ASSERT_TRUE(hello.has_value());
  router_.set(zmq::sockopt::sndtimeo, 0);
  const std::string chunk(64 << 10, 'r');
  // Replies until the way to the deaf peer is full and the front gives up
  // on it.
  ASSERT_TRUE(WaitFor([&] {
    std::vector<zmq::message_t> reply;
    reply.emplace_back(hello->frames[0].data(), hello->frames[0].size());
    reply.emplace_back(chunk.data(), chunk.size());
    try {
      (void)zmq::send_multipart(router_, reply, zmq::send_flags::dontwait);
    } catch (const zmq::error_t&) {
    }
    return front_->stats().stalled == 1;
  }));
  EXPECT_EQ(front_->stats().open, 0u);
}

// At most max_trusted connections are trusted at once: anyone may say
// HELLO on a plaintext endpoint, and each trusted connection may hold the
// larger credit.
TEST_F(FrontTest, TrustingOneTooManyDemotesTheLongestTrusted) {
  FrontOptions options;
  options.max_trusted = 2;
  Start(options);
  std::vector<Trusted> dealers;
  for (int i = 0; i < 3; ++i) {
    dealers.push_back(TrustedDealer(i));
    ASSERT_NE(dealers.back().port, 0);
    front_->Trust(dealers.back().port, i);  // twice: still one trusted
  }
  ASSERT_TRUE(WaitFor([&] { return front_->stats().open == 3; }));
  // Trust is applied in order; the third demoted the first.
  EXPECT_TRUE(WaitFor([&] { return front_->stats().trusted == 2; }))
      << front_->stats().trusted;
  EXPECT_EQ(front_->MemoryBound(),
            front_->stats().max_connections *
                    (2 * ConnectionFront::kBufferBytes +
                     options.untrusted_credit) +
                2 * options.trusted_credit);
}

// A worker that joins again over a new connection (or a peer that
// reconnects) takes the trust of its own earlier connection, not of the
// connection trusted longest ago: another worker's large messages still
// pass.
TEST_F(FrontTest, TrustingANewConnectionOfAnIdentityDemotesOnlyItsOldOne) {
  FrontOptions options;
  options.max_trusted = 2;
  options.untrusted_credit = 64 << 10;
  options.trusted_credit = 4 << 20;
  Start(options);
  std::vector<Trusted> dealers;
  // Worker 7 first (trusted longest), then worker 1 twice.
  for (const uint64_t identity : {7, 1, 1}) {
    dealers.push_back(TrustedDealer(identity));
    ASSERT_NE(dealers.back().port, 0);
  }
  ASSERT_TRUE(WaitFor([&] { return front_->stats().trusted == 2; }))
      << front_->stats().trusted;
  // Worker 7 kept its trust: a message far over the untrusted credit.
  const std::string big(1 << 20, 'b');
  ASSERT_TRUE(
      dealers[0].dealer.send(zmq::buffer(big), zmq::send_flags::none));
  std::optional<Taken> taken = Take(milliseconds(20000));
  ASSERT_TRUE(taken.has_value()) << "worker 7 lost its trust";
  EXPECT_EQ(taken->frames[1].size(), big.size());
  // And worker 1's new connection has it.
  ASSERT_TRUE(
      dealers[2].dealer.send(zmq::buffer(big), zmq::send_flags::none));
  taken = Take(milliseconds(20000));
  ASSERT_TRUE(taken.has_value()) << "worker 1's new connection is not trusted";
  EXPECT_EQ(taken->frames[1].size(), big.size());
}

// Untrusted connections share a message budget: a stranger's burst waits
// its turn as the budget refills (no faster than the rate, however idle
// the machine), every message arrives, and a trusted connection is not
// held to it.
TEST_F(FrontTest, StrangersShareAMessageBudgetAndTrustedConnectionsPass) {
  FrontOptions options;
  options.untrusted_messages_per_s = 200;  // a burst of 50 at most
  Start(options);
  Trusted worker = TrustedDealer(0);
  ASSERT_NE(worker.port, 0);
  ASSERT_TRUE(WaitFor([&] { return front_->stats().trusted == 1; }));

  // What one read brings passes at once (its debt is paid later): a first
  // burst, taken whole, spends the budget.
  constexpr int kBurst = 250;
  zmq::socket_t stranger = Dealer();
  stranger.connect(front_->endpoint());
  for (int i = 0; i < kBurst; ++i) {
    ASSERT_TRUE(stranger.send(zmq::buffer(std::string("status?")),
                              zmq::send_flags::none));
  }
  for (int i = 0; i < kBurst; ++i) {
    ASSERT_TRUE(Take(milliseconds(20000)).has_value()) << i;
  }
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kBurst; ++i) {
    ASSERT_TRUE(stranger.send(zmq::buffer(std::string("status?")),
                              zmq::send_flags::none));
  }
  // The worker's messages, sent after the burst, are not held to it.
  for (int i = 0; i < kBurst; ++i) {
    ASSERT_TRUE(worker.dealer.send(zmq::buffer(std::string("commit")),
                                   zmq::send_flags::none));
  }
  int strangers = 0;
  int worker_messages = 0;
  int strangers_before_the_worker_was_done = -1;
  while (strangers < kBurst || worker_messages < kBurst) {
    std::optional<Taken> taken = Take(milliseconds(20000));
    ASSERT_TRUE(taken.has_value())
        << strangers << " of the stranger's and " << worker_messages
        << " of the worker's messages arrived";
    if (taken->port == worker.port) {
      if (++worker_messages == kBurst) {
        strangers_before_the_worker_was_done = strangers;
      }
    } else {
      ++strangers;
    }
  }
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  // The second burst waited for the first one's debt: 200 a second.
  EXPECT_GE(elapsed, 0.9 * (kBurst - 50) / 200.0);
  EXPECT_GT(front_->stats().budget_waits, 0u);
  EXPECT_LT(strangers_before_the_worker_was_done, kBurst)
      << "the worker's messages waited behind the stranger's";
}

TEST_F(FrontTest, TheCapEvictsTheOldestUntrustedConnectionAndRefusesWhenAllAreTrusted) {
  FrontOptions options;
  options.max_connections = 3;
  Start(options);
  std::vector<int> idle;
  for (int i = 0; i < 3; ++i) idle.push_back(testing::ConnectRawTcp(front_->endpoint()));
  ASSERT_TRUE(WaitFor([&] { return front_->stats().open == 3; }));
  // A fourth connection takes the place of the oldest idle one.
  std::vector<Trusted> dealers;
  for (int i = 0; i < 3; ++i) {
    dealers.push_back(TrustedDealer(i));
    ASSERT_NE(dealers.back().port, 0) << "connection " << i << " was not served";
  }
  ASSERT_TRUE(WaitFor([&] { return front_->stats().trusted == 3; }));
  EXPECT_EQ(front_->stats().evicted, 3u);
  EXPECT_EQ(front_->stats().open, 3u);
  // Every open connection is trusted: a new one is refused.
  const int late = testing::ConnectRawTcp(front_->endpoint());
  ASSERT_TRUE(WaitFor([&] { return front_->stats().refused == 1; }));
  EXPECT_EQ(front_->stats().open, 3u);
  ::close(late);
  for (int fd : idle) ::close(fd);
}

}  // namespace
}  // namespace meridian::wan
