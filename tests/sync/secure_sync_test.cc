// Live site servers (threads of this process, real ZeroMQ sockets on
// loopback) with CURVE on: two sites sync every update exactly once over
// encrypted links; a peer with a key the job does not list is refused (its
// updates never reach the model) while the site keeps serving; a site
// without its keys refuses to start, saying how to fix it.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <thread>
#include <zmq.hpp>

#include "meridian/compression/compression.h"
#include "meridian/config/config.h"
#include "meridian/net/message.h"
#include "meridian/train/model.h"
#include "meridian/net/security.h"
#include "meridian/site/site_server.h"
#include "meridian/sync/sync.h"
#include "meridian/net/transport.h"
#include "testing/live_sites.h"
#include "testing/mirror_messages.h"
#include "testing/site_control.h"
#include "testing/stderr_capture.h"
#include "testing/test_data.h"
#include "testing/status_matchers.h"

namespace meridian {
namespace {

using std::chrono::milliseconds;
constexpr milliseconds kTimeout(20000);
constexpr int kCommits = 20;

class SecureSyncTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    data_dir_ = new std::string(testing::MakeTempDir("secure-data"));
    testing::SyntheticDataOptions options;
    options.train_samples = 200;
    options.test_samples = 50;
    ASSERT_OK(testing::WriteSyntheticIdx(*data_dir_, options));
  }

  void SetUp() override {
    ::unsetenv(kSecretKeyEnv);
    key_dir_ = testing::MakeTempDir("secure-keys");
    for (const char* name : {"a", "b"}) {
      Result<CurveKeyPair> pair = GenerateCurveKeyPair();
      ASSERT_OK(pair);
      ASSERT_OK(WriteCurveKeyFiles(key_dir_, name, *pair));
      keys_[name] = *pair;
    }
  }

  // Two sites a and b, one worker each, GAIA with CURVE and their keys.
  pb::JobConfig Job() {
    pb::JobConfig job = testing::SmallJob(*data_dir_, 1, /*hidden=*/8);
    job.clear_site();
    for (const char* name : {"a", "b"}) {
      pb::SiteConfig* site = job.add_site();
      site->set_name(name);
      site->add_workers()->set_count(1);
      site->set_curve_public_key(keys_[name].public_key);
    }
    job.mutable_security()->set_key_dir(key_dir_);
    job.set_time_budget_s(120);
    job.mutable_server()->set_eval_period_s(30);
    pb::SyncConfig* sync = job.mutable_sync();
    sync->set_kind(pb::GAIA);
    sync->set_threshold(0.3);
    sync->set_max_clock_skew(2);
    sync->mutable_compression()->set_value_coding(pb::VALUE_INT8);
    sync->mutable_compression()->set_block_size(16);
    sync->mutable_compression()->set_zstd_level(1);
    EXPECT_TRUE(ValidateJobConfig(job).empty())
        << FormatConfigIssues("job", ValidateJobConfig(job));
    return job;
  }

  static Result<std::unique_ptr<SiteServer>> Server(const pb::JobConfig& job,
                                                    const std::string& site) {
    SiteServerOptions options;
    options.job = job;
    options.site = site;
    options.bind = "tcp://127.0.0.1:*";
    options.mirror_bind = "tcp://127.0.0.1:*";
    options.control_token = testing::kTestControlToken;
    return SiteServer::Create(std::move(options));
  }

  static std::string* data_dir_;
  std::string key_dir_;
  std::map<std::string, CurveKeyPair> keys_;
};

std::string* SecureSyncTest::data_dir_ = nullptr;

pb::Endpoint Launcher() {
  pb::Endpoint self;
  self.set_role(pb::ROLE_LAUNCHER);
  return self;
}

TEST_F(SecureSyncTest, TwoSitesSyncEveryUpdateOnceOverCurve) {
  const pb::JobConfig job = Job();
  Result<testing::LiveSitesRun> run =
      testing::RunLiveSites(job, kCommits, /*seed_base=*/2000, kTimeout);
  ASSERT_OK(run);
  for (size_t s = 0; s < run->servers.size(); ++s) {
    const SiteServer& server = *run->servers[s];
    EXPECT_TRUE(server.summary().sync().flushed())
        << job.site(s).name() << " missed a final flush";
    EXPECT_EQ(server.summary().sync().rejected(), 0);
    EXPECT_GT(server.summary().sync().entries_received(), 0);
    std::string first;
    EXPECT_EQ(testing::CountMismatches(server.Snapshot(), run->expected, 1e-4,
                                       &first),
              0u)
        << job.site(s).name() << ":\n"
        << first;
  }
}

// A hand-written peer of site a's mirror socket, claiming to be site b.
class MirrorPeer {
 public:
  MirrorPeer(zmq::context_t& context, const std::string& endpoint,
             const CurveKeyPair& own, const std::string& server_key)
      : socket_(context, zmq::socket_type::dealer) {
    socket_.set(zmq::sockopt::linger, 0);
    EXPECT_OK(MakeCurveClient(socket_, own, server_key));
    socket_.connect(endpoint);
  }

  void Send(pb::Header header, std::vector<zmq::message_t> frames = {}) {
    pb::Endpoint sender;
    sender.set_site("b");
    sender.set_role(pb::ROLE_SITE_SERVER);
    header.set_protocol_version(kProtocolVersion);
    *header.mutable_sender() = sender;
    // Numbered 1, 2, 3 ... on the channel; MIRROR_HELLO is not
    // (src/sync/mirror_delivery.h).
    header.set_sequence(header.type() == pb::MIRROR_HELLO ? 0 : ++sequence_);
    ASSERT_OK(SendMessage(socket_, header, std::move(frames)));
  }

  void Hello(const ModelLayout& layout) {
    pb::Header hello;
    hello.set_type(pb::MIRROR_HELLO);
    LayoutToSpecs(layout, hello.mutable_mirror_hello()->mutable_layout());
    hello.mutable_mirror_hello()->set_incarnation(1);
    hello.mutable_mirror_hello()->set_first_sequence(1);
    Send(hello);
  }

  // Clock 1's update: +`value` on the first 3 elements of fc0.bias.
  void Update(const ModelLayout& layout, float value) {
    pb::Header header;
    std::vector<zmq::message_t> frames;
    ASSERT_OK(testing::MakeBiasUpdate(layout, 1, "b", value, &header, &frames));
    Send(header, std::move(frames));
  }

  void Clock(int64_t clock, bool final) {
    pb::Header header;
    header.set_type(pb::MIRROR_CLOCK);
    header.set_clock(clock);
    header.mutable_mirror_clock()->set_clock(clock);
    header.mutable_mirror_clock()->set_final(final);
    Send(header);
  }

  bool ReplyWithin(milliseconds timeout) {
    Result<Received> reply = ReceiveMessage(socket_, false, timeout);
    return reply.ok() && !reply->timed_out();
  }

 private:
  zmq::socket_t socket_;
  uint64_t sequence_ = 0;
};

TEST_F(SecureSyncTest, PeerWithAnUnlistedKeyIsRefusedAndTheModelUntouched) {
  const pb::JobConfig job = Job();
  Result<std::unique_ptr<SiteServer>> created = Server(job, "a");
  ASSERT_OK(created);
  std::unique_ptr<SiteServer> server = std::move(*created);
  const std::vector<float> initial = server->Snapshot();
  Status run_status;
  std::thread thread([&] { run_status = server->Run(); });
  Result<std::unique_ptr<Model>> model = MakeModel(job.model(), 784, 10);
  ASSERT_OK(model);
  const ModelLayout& layout = (*model)->layout();

  zmq::context_t context;
  // Site b's mirror socket as site a reaches it: a CURVE server with b's
  // keys, admitting a.
  Result<std::unique_ptr<ZapHandler>> zap = ZapHandler::Start(
      context, {{keys_["a"].public_key, "a"}}, "test's site b");
  ASSERT_OK(zap);
  zmq::socket_t b_mirror(context, zmq::socket_type::router);
  b_mirror.set(zmq::sockopt::linger, 0);
  ASSERT_OK(MakeCurveServer(b_mirror, keys_["b"]));
  b_mirror.bind("tcp://127.0.0.1:*");
  {
    pb::Header request;
    request.set_type(pb::SET_PEERS);
    request.set_control_token(testing::kTestControlToken);
    pb::Peer* entry = request.mutable_peers()->add_peer();
    entry->set_site("b");
    entry->set_endpoint(b_mirror.get(zmq::sockopt::last_endpoint));
    RpcClient control(context, server->endpoint(), Launcher());
    Result<Envelope> reply = control.Call(request, {}, kTimeout);
    ASSERT_OK(reply);
  }
  testing::StderrCapture capture;
  {
    // An impostor: claims to be b, holds a key the job does not list.
    Result<CurveKeyPair> stranger = GenerateCurveKeyPair();
    ASSERT_OK(stranger);
    MirrorPeer impostor(context, server->mirror_endpoint(), *stranger,
                        keys_["a"].public_key);
    impostor.Hello(layout);
    impostor.Update(layout, 1.0f);
    impostor.Clock(1, /*final=*/true);
    // The refusal is the event to wait for (the site's event loop may not
    // run for seconds on a busy machine); no reply came meanwhile.
    EXPECT_TRUE(capture.WaitFor("refused a CURVE connection from 127.0.0.1"))
        << capture.Text();
    EXPECT_FALSE(impostor.ReplyWithin(milliseconds(500)));
    EXPECT_EQ(server->Snapshot(), initial);
  }
  capture.Stop();

  // The real b (a listed key) still gets through: the site kept serving.
  MirrorPeer peer(context, server->mirror_endpoint(), keys_["b"],
                  keys_["a"].public_key);
  peer.Hello(layout);
  peer.Update(layout, 1.0f);
  const TensorInfo* bias = layout.Find("fc0.bias");
  std::vector<float> now = server->Snapshot();
  testing::WaitUntil([&] {
    now = server->Snapshot();
    return now != initial;
  });
  ASSERT_NE(now, initial) << "the listed peer's update was not applied";
  for (size_t i = 0; i < now.size(); ++i) {
    const bool touched = i >= bias->offset && i < bias->offset + 3;
    if (touched) {
      EXPECT_GT(now[i], initial[i]) << i;
    } else {
      EXPECT_EQ(now[i], initial[i]) << i;
    }
  }
  // a's worker joins (training starts), then b ends its job (final
  // flush): site a finishes too.
  pb::Endpoint worker;
  worker.set_site("a");
  worker.set_role(pb::ROLE_WORKER);
  worker.set_id(0);
  RpcClient client(context, server->endpoint(), worker);
  pb::Header hello;
  hello.set_type(pb::HELLO);
  hello.mutable_hello()->set_worker_index(0);
  LayoutToSpecs(layout, hello.mutable_hello()->mutable_layout());
  Result<Envelope> welcome = client.Call(hello, {}, kTimeout);
  ASSERT_OK(welcome);
  EXPECT_EQ(welcome->header.type(), pb::WELCOME);
  // b's mirror socket acknowledges what a sends, as a real peer does, so
  // a's final flush completes.
  std::optional<pb::Header> first_from_a;
  {
    testing::AckingPeer b(&b_mirror, "b");
    peer.Clock(1, /*final=*/true);
    thread.join();
    first_from_a = b.first();
  }
  EXPECT_OK(run_status);
  EXPECT_TRUE(server->summary().stopped_by_peer());
  EXPECT_TRUE(server->summary().sync().flushed());
  // a's own messages reached b's (CURVE) mirror socket, its HELLO first.
  ASSERT_TRUE(first_from_a) << "nothing from site a";
  EXPECT_EQ(first_from_a->type(), pb::MIRROR_HELLO);
  EXPECT_EQ(first_from_a->sender().site(), "a");
  EXPECT_EQ((*zap)->admitted(), 1u);
  EXPECT_EQ(server->summary().sync().rejected(), 0);
}

TEST_F(SecureSyncTest, ListedPeerCannotSpeakForAnotherSite) {
  // Three sites: c holds a listed key but claims to be b.
  pb::JobConfig job = Job();
  Result<CurveKeyPair> c_keys = GenerateCurveKeyPair();
  ASSERT_OK(c_keys);
  pb::SiteConfig* c = job.add_site();
  c->set_name("c");
  c->add_workers()->set_count(1);
  c->set_curve_public_key(c_keys->public_key);
  ASSERT_TRUE(ValidateJobConfig(job).empty());
  Result<std::unique_ptr<SiteServer>> created = Server(job, "a");
  ASSERT_OK(created);
  std::unique_ptr<SiteServer> server = std::move(*created);
  const std::vector<float> initial = server->Snapshot();
  Status run_status;
  std::thread thread([&] { run_status = server->Run(); });
  Result<std::unique_ptr<Model>> model = MakeModel(job.model(), 784, 10);
  ASSERT_OK(model);
  const ModelLayout& layout = (*model)->layout();

  zmq::context_t context;
  ::testing::internal::CaptureStderr();
  {
    MirrorPeer impostor(context, server->mirror_endpoint(), *c_keys,
                        keys_["a"].public_key);  // sends as "b"
    impostor.Hello(layout);
    impostor.Update(layout, 1.0f);
    // Refused with an ERROR reply; nothing applied.
    EXPECT_TRUE(impostor.ReplyWithin(kTimeout));
    // The update is refused too: both messages were handled.
    EXPECT_TRUE(impostor.ReplyWithin(kTimeout));
    EXPECT_EQ(server->Snapshot(), initial);
  }
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("authenticated as site 'c' sent a message as site 'b'"),
            std::string::npos)
      << log;
  pb::Header shutdown;
  shutdown.set_type(pb::SHUTDOWN);
  shutdown.set_control_token(testing::kTestControlToken);
  shutdown.mutable_shutdown()->set_reason("test over");
  RpcClient control(context, server->endpoint(), Launcher());
  EXPECT_OK(control.Call(shutdown, {}, kTimeout));
  thread.join();
  EXPECT_OK(run_status);
  EXPECT_EQ(server->Snapshot(), initial);
}

TEST_F(SecureSyncTest, SiteWithoutItsKeysRefusesToStart) {
  pb::JobConfig job = Job();
  // No key file for a under this directory.
  job.mutable_security()->set_key_dir(testing::MakeTempDir("empty-keys"));
  Result<std::unique_ptr<SiteServer>> no_file = Server(job, "a");
  ASSERT_FALSE(no_file.ok());
  EXPECT_NE(no_file.status().message().find("a.key"), std::string::npos)
      << no_file.status();
  // No keys in the job at all: the error says how to make them.
  job.mutable_site(0)->clear_curve_public_key();
  job.mutable_site(1)->clear_curve_public_key();
  Result<std::unique_ptr<SiteServer>> no_keys = Server(job, "a");
  ASSERT_FALSE(no_keys.ok());
  EXPECT_NE(no_keys.status().message().find("meridian keygen"),
            std::string::npos)
      << no_keys.status();
  // CURVE off: the site runs in plaintext (and says so in its log).
  job.mutable_security()->set_curve(false);
  ::testing::internal::CaptureStderr();
  Result<std::unique_ptr<SiteServer>> plain = Server(job, "a");
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_OK(plain);
  EXPECT_NE(log.find("cross-site links are plaintext"), std::string::npos)
      << log;
}

}  // namespace
}  // namespace meridian
