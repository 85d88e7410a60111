// RefuseMessage's log under a flood of refused messages from a real
// ZeroMQ peer: a few lines per kind of refusal and a count, never a forged
// line, every refusal still answered.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "meridian/core/clock.h"
#include "meridian/core/log.h"
#include "meridian/net/message.h"
#include "meridian/net/transport.h"
#include "testing/text.h"

namespace meridian {
namespace {

using ::meridian::testing::Contains;

using std::chrono::milliseconds;

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    lines.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return lines;
}


// A ROUTER (the server) and a DEALER (the peer) over TCP on loopback, and
// the process-wide log limiter on a manual clock for the test's duration.
class RefuseLogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    GlobalLogRateLimiter().Reset(&clock_, {});
    router_.set(zmq::sockopt::linger, 0);
    router_.bind("tcp://127.0.0.1:*");
    dealer_.set(zmq::sockopt::linger, 0);
    dealer_.set(zmq::sockopt::routing_id, "peer-1");
    dealer_.connect(router_.get(zmq::sockopt::last_endpoint));
    self_.set_site("site-a");
    self_.set_role(pb::ROLE_SITE_SERVER);
  }
  void TearDown() override { GlobalLogRateLimiter().Reset(SystemClock(), {}); }

  // The peer sends `header` (refused: wrong protocol version); the server
  // receives and refuses it; the peer reads the ERROR. True when all of
  // that happened.
  bool RefuseOne(const pb::Header& header) {
    if (!SendMessage(dealer_, header).ok()) return false;
    Result<Received> got = ReceiveMessage(router_, true, milliseconds(10000));
    if (!got.ok() || !got->refused) return false;
    RefuseMessage(router_, self_, ++sequence_, got->refused->routing_id,
                  got->refused->header, got->refused->rejection);
    Result<Received> error =
        ReceiveMessage(dealer_, false, milliseconds(10000));
    return error.ok() && error->message &&
           error->message->header.type() == pb::ERROR &&
           error->message->header.error().code() == pb::ERROR_VERSION;
  }

  ManualClock clock_;
  zmq::context_t context_{1};
  zmq::socket_t router_{context_, zmq::socket_type::router};
  zmq::socket_t dealer_{context_, zmq::socket_type::dealer};
  pb::Endpoint self_;
  uint64_t sequence_ = 0;
};

TEST_F(RefuseLogTest, AFloodOfRefusalsWritesAFewLinesAndACount) {
  // A PULL from a future protocol version, its sender's site name trying
  // to forge a line of its own.
  pb::Endpoint sender;
  sender.set_site("evil\nFAKE 12:00:00.000 I site-a/server: forged");
  sender.set_role(pb::ROLE_WORKER);
  sender.set_id(3);
  pb::Header header = MakeHeader(pb::PULL, sender, 1);
  header.set_protocol_version(kProtocolVersion + 98);

  constexpr int kFlood = 10000;
  ::testing::internal::CaptureStderr();
  int answered = 0;
  for (int i = 0; i < kFlood; ++i) {
    header.set_sequence(i + 1);
    answered += RefuseOne(header);
  }
  // The window ends; the next refusal of the kind brings the count.
  clock_.AdvanceSeconds(10);
  header.set_sequence(kFlood + 1);
  answered += RefuseOne(header);
  const std::string log = ::testing::internal::GetCapturedStderr();

  EXPECT_EQ(answered, kFlood + 1);  // every refusal answered, logged or not
  const std::vector<std::string> lines = Lines(log);
  ASSERT_EQ(lines.size(), 7u) << log;
  const std::string described =
      "rejected PULL from \"evil\\nFAKE 12:00:00.000 I site-a/server: "
      "forged\"/worker#3 seq ";
  for (int i = 0; i < 5; ++i) {
    EXPECT_TRUE(Contains(lines[i], described + std::to_string(i + 1) +
                                       ": ERROR_VERSION: protocol version"))
        << lines[i];
    EXPECT_TRUE(Contains(lines[i], " E ")) << lines[i];
  }
  EXPECT_TRUE(Contains(lines[5],
                       ": … 9,995 more like this in the last 10 s: rejected "
                       "PULL from evil\\nFAKE 12:00:00.000 I site-a/server: "
                       "forged: ERROR_VERSION"))
      << lines[5];
  EXPECT_TRUE(Contains(lines[6], described + "10001: ERROR_VERSION"))
      << lines[6];
  for (const std::string& line : lines) {
    EXPECT_NE(line.rfind("FAKE", 0), 0u) << "forged: " << line;
  }
}

TEST_F(RefuseLogTest, APeerMakingUpSiteNamesIsLimitedInTotal) {
  pb::Header header = MakeHeader(pb::PULL, pb::Endpoint(), 1);
  header.set_protocol_version(kProtocolVersion + 98);
  constexpr int kFlood = 2000;
  ::testing::internal::CaptureStderr();
  int answered = 0;
  for (int i = 0; i < kFlood; ++i) {
    header.mutable_sender()->set_site("site-" + std::to_string(i));
    answered += RefuseOne(header);
  }
  clock_.AdvanceSeconds(10);
  MLOG(INFO) << "later";
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(answered, kFlood);
  const std::vector<std::string> lines = Lines(log);
  // The total budget (100 per window), its count, and the later line.
  ASSERT_EQ(lines.size(), 102u) << log.substr(0, 2000);
  EXPECT_TRUE(Contains(lines[100],
                       "… 1,900 more rate-limited lines of any kind in the "
                       "last 10 s (at most 100 per 10 s)"))
      << lines[100];
  EXPECT_TRUE(Contains(lines[101], "later")) << lines[101];
}

}  // namespace
}  // namespace meridian
