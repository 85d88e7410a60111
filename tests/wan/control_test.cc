// The control endpoint: a REP server in front of an emulator, the client,
// the codec, and bad requests.
#include <gtest/gtest.h>

#include <zmq.hpp>

#include "meridian/wan/control.h"
#include "wan/emulator.h"
#include "wan/wan_test_util.h"
#include "testing/status_matchers.h"

namespace meridian::wan {
namespace {

using testing::Connect;
using testing::Listener;
using testing::RecvBytes;
using testing::SendAll;

class ControlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    EmulatorOptions options;
    DirectionModel model;
    model.bandwidth_bps = 0;
    options.links.push_back(LinkModel{"a", "b", model, model});
    options.links.push_back(LinkModel{"a", "c", model, model});
    auto emulator = Emulator::Create(std::move(options));
    ASSERT_OK(emulator);
    emulator_ = std::move(*emulator);
    auto server = ControlServer::Start(emulator_.get(), "tcp://127.0.0.1:0");
    ASSERT_OK(server);
    server_ = std::move(*server);
    client_ = std::make_unique<ControlClient>(server_->endpoint());
  }

  std::unique_ptr<Emulator> emulator_;
  std::unique_ptr<ControlServer> server_;
  std::unique_ptr<ControlClient> client_;
};

TEST_F(ControlTest, StatusListsEveryLinkWithItsModel) {
  EXPECT_NE(server_->endpoint().find("tcp://127.0.0.1:"), std::string::npos);
  EXPECT_EQ(server_->endpoint().find(":0"), std::string::npos)
      << "the bound port, not 0";
  auto reply = client_->GetStatus();
  ASSERT_OK(reply);
  ASSERT_EQ(reply->links_size(), 2);
  EXPECT_EQ(reply->links(0).link(), "a-b");
  EXPECT_EQ(reply->links(1).link(), "a-c");
  EXPECT_EQ(reply->links(0).a_to_b().from_site(), "a");
  EXPECT_EQ(reply->links(0).a_to_b().to_site(), "b");
  EXPECT_EQ(reply->links(0).b_to_a().from_site(), "b");
  EXPECT_GE(reply->uptime_s(), 0.0);
  const std::string table = FormatLinkStates(*reply);
  EXPECT_NE(table.find("a-c"), std::string::npos);
  EXPECT_NE(table.find("b->a"), std::string::npos);
}

TEST_F(ControlTest, SetPartitionHealAndAddRoute) {
  pb::LinkDirectionConfig change;
  change.set_bandwidth("20mbit");
  change.set_latency("15ms");
  ASSERT_OK(client_->Set("a-b", pb::B_TO_A, change));
  auto reply = client_->GetStatus();
  ASSERT_OK(reply);
  EXPECT_DOUBLE_EQ(reply->links(0).b_to_a().bandwidth_bps(), 20e6);
  EXPECT_DOUBLE_EQ(reply->links(0).b_to_a().latency_s(), 0.015);
  EXPECT_DOUBLE_EQ(reply->links(0).a_to_b().bandwidth_bps(), 0);

  ASSERT_OK(client_->Partition("a-c"));
  EXPECT_TRUE(client_->GetStatus()->links(1).partitioned());
  ASSERT_OK(client_->Heal("a-c"));
  EXPECT_FALSE(client_->GetStatus()->links(1).partitioned());

  Listener server;
  auto listen = client_->AddRoute("a-c", "c", "127.0.0.1:0", server.address());
  ASSERT_OK(listen);
  EXPECT_EQ(listen->find("127.0.0.1:"), 0u);
  const int client = Connect(*listen);
  const int peer = server.Accept();
  ASSERT_GE(peer, 0);
  ASSERT_TRUE(SendAll(client, "through"));
  EXPECT_EQ(RecvBytes(peer, 7), "through");
  auto status = client_->GetStatus();
  ASSERT_EQ(status->links(1).routes_size(), 1);
  EXPECT_EQ(status->links(1).routes(0).listen(), *listen);
  EXPECT_EQ(status->links(1).routes(0).from_site(), "c");
  ::close(client);
  ::close(peer);
}

TEST_F(ControlTest, RefusalsSayWhy) {
  Status unknown = client_->Partition("x-y");
  EXPECT_FALSE(unknown.ok());
  EXPECT_NE(unknown.message().find("no link 'x-y'"), std::string::npos)
      << unknown;
  EXPECT_FALSE(client_->Heal("b-a").ok()) << "names are a-b, not b-a";

  pb::LinkDirectionConfig bad;
  bad.set_latency("40");
  Status refused = client_->Set("a-b", pb::BOTH, bad);
  EXPECT_NE(refused.message().find("set.change.latency"), std::string::npos)
      << refused;
  EXPECT_FALSE(client_->Set("a-b", pb::BOTH, {}).ok()) << "nothing to change";

  auto route = client_->AddRoute("a-b", "z", "127.0.0.1:0", "127.0.0.1:1");
  EXPECT_FALSE(route.ok());
  EXPECT_NE(route.status().message().find("'z'"), std::string::npos);
  EXPECT_FALSE(client_->AddRoute("a-b", "a", "127.0.0.1", "127.0.0.1:1").ok());

  // Old or missing protocol versions.
  pb::WanControlRequest request = MakeStatusRequest();
  request.set_protocol_version(2);
  auto reply = client_->Call(request);
  ASSERT_OK(reply);
  EXPECT_FALSE(reply->ok());
  EXPECT_NE(reply->error().find("protocol_version"), std::string::npos);
  // No command at all.
  pb::WanControlRequest empty;
  reply = client_->Call(empty);
  ASSERT_OK(reply);
  EXPECT_FALSE(reply->ok());
  // The server is still serving.
  EXPECT_OK(client_->GetStatus());
}

TEST_F(ControlTest, GarbageAndMultipartRequestsGetAnErrorReply) {
  zmq::context_t context;
  zmq::socket_t socket(context, ZMQ_REQ);
  socket.set(zmq::sockopt::linger, 0);
  socket.set(zmq::sockopt::rcvtimeo, 5000);
  socket.connect(server_->endpoint());
  const std::string garbage = "\xff\xff\xff not a protobuf";
  socket.send(zmq::buffer(garbage));
  zmq::message_t answer;
  ASSERT_TRUE(socket.recv(answer));
  pb::WanControlReply reply;
  ASSERT_TRUE(reply.ParseFromArray(answer.data(), answer.size()));
  EXPECT_FALSE(reply.ok());
  EXPECT_NE(reply.error().find("not a WanControlRequest"), std::string::npos)
      << reply.error();

  const std::string status = MakeStatusRequest().SerializeAsString();
  socket.send(zmq::buffer(status), zmq::send_flags::sndmore);
  socket.send(zmq::buffer(status));
  ASSERT_TRUE(socket.recv(answer));
  ASSERT_TRUE(reply.ParseFromArray(answer.data(), answer.size()));
  EXPECT_FALSE(reply.ok());
  EXPECT_NE(reply.error().find("one frame"), std::string::npos);
  EXPECT_OK(client_->GetStatus());
  EXPECT_GE(server_->requests_served(), 3u);
}

TEST_F(ControlTest, ClientTimesOutOnADeadEndpointAndRecovers) {
  ControlClient dead("tcp://127.0.0.1:" + std::to_string(testing::DeadPort()),
                     std::chrono::milliseconds(200));
  auto reply = dead.GetStatus();
  EXPECT_FALSE(reply.ok());
  EXPECT_EQ(reply.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_FALSE(dead.GetStatus().ok()) << "usable again after a timeout";
}

TEST(ControlCodecTest, DecodesAndValidates) {
  const std::string bytes =
      MakeAddRouteRequest("a-b", "a", "127.0.0.1:0", "10.0.0.2:7100")
          .SerializeAsString();
  auto request = DecodeControlRequest(
      {reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()});
  ASSERT_OK(request);
  EXPECT_EQ(request->add_route().forward(), "10.0.0.2:7100");

  EXPECT_FALSE(DecodeControlRequest({}).ok()) << "no version, no command";
  const uint8_t junk[] = {0x0a, 0xff, 0xff};
  EXPECT_FALSE(DecodeControlRequest(junk).ok());

  EXPECT_FALSE(ValidateControlRequest(MakePartitionRequest("")).ok());
  EXPECT_FALSE(
      ValidateControlRequest(MakeAddRouteRequest("a-b", "a", "x", "y:1")).ok());
  EXPECT_FALSE(ValidateControlRequest(
                   MakeAddRouteRequest("a-b", "a", "127.0.0.1:0", "y:0"))
                   .ok())
      << "forward needs a real port";

  auto set = MakeSetRequest("a-b", "a-to-b", "10mbit", "", "2ms", "normal");
  ASSERT_OK(set);
  EXPECT_EQ(set->set().direction(), pb::A_TO_B);
  EXPECT_FALSE(set->set().change().has_latency());
  EXPECT_EQ(set->set().change().jitter_distribution(), pb::JITTER_NORMAL);
  EXPECT_FALSE(MakeSetRequest("a-b", "sideways", "10mbit", "", "").ok());
  EXPECT_FALSE(MakeSetRequest("a-b", "", "", "", "").ok()) << "no change";
  EXPECT_FALSE(MakeSetRequest("a-b", "", "-1mbit", "", "").ok());
  EXPECT_FALSE(MakeSetRequest("a-b", "", "", "", "", "pareto").ok());
}

TEST(ControlCodecTest, TrafficRowsAndReportEntries) {
  pb::WanControlReply reply;
  pb::WanLinkState* link = reply.add_links();
  link->set_link("a-b");
  link->mutable_a_to_b()->set_from_site("a");
  link->mutable_a_to_b()->set_to_site("b");
  link->mutable_a_to_b()->set_bytes(1234);
  link->mutable_a_to_b()->set_messages(5);
  link->mutable_b_to_a()->set_from_site("b");
  link->mutable_b_to_a()->set_to_site("a");
  const std::string rows = TrafficCsvRows(1.5, reply);
  EXPECT_EQ(rows,
            "1.500,a-b,a,b,1234,5,0,0,0.000000,0\n"
            "1.500,a-b,b,a,0,0,0,0,0.000000,0\n");
  const auto traffic = LinkTrafficFromReply(reply);
  ASSERT_EQ(traffic.size(), 2u);
  EXPECT_EQ(traffic[0].bytes(), 1234);
  EXPECT_EQ(traffic[0].messages(), 5);
  EXPECT_EQ(traffic[1].from_site(), "b");
}

TEST(ControlServerTest, BindFailureIsAClearError) {
  EmulatorOptions options;
  auto emulator = Emulator::Create(std::move(options));
  ASSERT_OK(emulator);
  auto first = ControlServer::Start(emulator->get(), "tcp://127.0.0.1:0");
  ASSERT_OK(first);
  auto second = ControlServer::Start(emulator->get(), (*first)->endpoint());
  EXPECT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find("cannot bind"), std::string::npos);
  EXPECT_FALSE(ControlServer::Start(emulator->get(), "bogus://x").ok());
}

}  // namespace
}  // namespace meridian::wan
