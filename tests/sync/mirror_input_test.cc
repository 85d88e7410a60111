// A live site server's mirror socket fed bad messages by a hand-written
// peer: an unknown site, skipped and backwards clocks, a model of another
// shape, undecodable payloads. Each is refused with an ERROR naming the
// problem, and the model stays untouched.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <zmq.hpp>

#include "meridian/compression/compression.h"
#include "meridian/config/config.h"
#include "meridian/net/message.h"
#include "meridian/metrics/metrics.h"
#include "meridian/train/model.h"
#include "meridian/site/site_server.h"
#include "meridian/net/transport.h"
#include "testing/mirror_messages.h"
#include "testing/site_control.h"
#include "testing/test_data.h"
#include "testing/status_matchers.h"

namespace meridian {
namespace {

using std::chrono::milliseconds;
constexpr milliseconds kTimeout(10000);

class MirrorInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    data_dir_ = testing::MakeTempDir("mirror-data");
    testing::SyntheticDataOptions options;
    options.train_samples = 100;
    options.test_samples = 20;
    ASSERT_OK(testing::WriteSyntheticIdx(data_dir_, options));
    job_ = testing::SmallJob(data_dir_, 1, /*hidden=*/4);
    // Site b's mirror socket, where site a sends once it trains: a socket
    // that is there (never read), so that a's channel to b delivers and
    // closes at once instead of lingering on a port where nobody listens.
    b_mirror_ = std::make_unique<zmq::socket_t>(sink_context_,
                                                zmq::socket_type::router);
    b_mirror_->set(zmq::sockopt::linger, 0);
    b_mirror_->bind("tcp://127.0.0.1:*");
    pb::SiteConfig* b = job_.add_site();
    b->set_name("b");
    b->set_mirror_address(b_mirror_->get(zmq::sockopt::last_endpoint));
    b->add_workers()->set_count(1);
    job_.mutable_server()->set_eval_period_s(30);
    job_.set_time_budget_s(60);
    // Plaintext: the test is the peer (CURVE: secure_sync_test.cc).
    job_.mutable_security()->set_curve(false);
    ConfigureJob(&job_);
    ASSERT_TRUE(ValidateJobConfig(job_).empty());
    StartSite();
    Result<std::unique_ptr<Model>> model = MakeModel(job_.model(), 784, 10);
    ASSERT_OK(model);
    layout_ = (*model)->layout();
    initial_ = server_->Snapshot();
  }

  // Starts site a of job_ on its own thread (its metrics endpoint too
  // with `metrics`) and connects this peer's channel to it.
  void StartSite(bool metrics = false) {
    SiteServerOptions options;
    options.job = job_;
    options.site = "site-a";
    options.bind = "tcp://127.0.0.1:*";
    options.mirror_bind = "tcp://127.0.0.1:*";
    options.control_token = testing::kTestControlToken;
    if (metrics) options.metrics_address = "127.0.0.1:0";
    Result<std::unique_ptr<SiteServer>> server =
        SiteServer::Create(std::move(options));
    ASSERT_OK(server);
    server_ = std::move(*server);
    run_done_ = false;
    thread_ = std::thread([this] {
      run_status_ = server_->Run();
      run_done_ = true;
    });
    sequence_ = 0;
    peer_ = std::make_unique<zmq::socket_t>(context_, zmq::socket_type::dealer);
    peer_->set(zmq::sockopt::linger, 0);
    peer_->connect(server_->mirror_endpoint());
  }

  // What a derived fixture changes in the job before the site starts.
  virtual void ConfigureJob(pb::JobConfig*) {}

  void TearDown() override {
    if (!thread_.joinable()) return;  // the test already stopped it
    pb::Header shutdown;
    shutdown.set_type(pb::SHUTDOWN);
    shutdown.set_control_token(testing::kTestControlToken);
    pb::Endpoint client;
    client.set_role(pb::ROLE_CLIENT);
    RpcClient control(context_, server_->endpoint(), client);
    EXPECT_OK(control.Call(shutdown, {}, kTimeout));
    thread_.join();
    EXPECT_OK(run_status_);
  }

  // A message of this hand-written peer: numbered 1, 2, 3 ... on its
  // channel, except the unnumbered MIRROR_HELLO (mirror_delivery.h).
  pb::Header From(pb::MessageType type, const std::string& site) {
    pb::Endpoint sender;
    sender.set_site(site);
    sender.set_role(pb::ROLE_SITE_SERVER);
    return MakeHeader(type, sender, type == pb::MIRROR_HELLO ? 0 : ++sequence_);
  }

  void Send(const pb::Header& header, std::vector<zmq::message_t> frames = {}) {
    ASSERT_OK(SendMessage(*peer_, header, std::move(frames)));
  }

  // Sends and expects an ERROR with `code` back.
  void ExpectRefused(const pb::Header& header, pb::ErrorCode code,
                     const std::string& mention,
                     std::vector<zmq::message_t> frames = {}) {
    Send(header, std::move(frames));
    Result<Received> reply = NextError();
    ASSERT_TRUE(reply.ok() && reply->message) << "no reply";
    ASSERT_EQ(reply->message->header.type(), pb::ERROR);
    EXPECT_EQ(reply->message->header.error().code(), code)
        << reply->message->header.error().message();
    EXPECT_NE(reply->message->header.error().message().find(mention),
              std::string::npos)
        << reply->message->header.error().message();
  }

  // Sends b's final clock (`clock`) and waits (kTimeout) until the site
  // acknowledges it; whether it did.
  bool SendFinalAndAwaitItsAck(int64_t clock = 1) {
    pb::Header final_clock = Clock("b", clock);
    final_clock.mutable_mirror_clock()->set_final(true);
    const uint64_t final_sequence = final_clock.sequence();
    Send(final_clock);
    const auto deadline = std::chrono::steady_clock::now() + kTimeout;
    while (std::chrono::steady_clock::now() < deadline) {
      Result<Received> reply = ReceiveMessage(*peer_, false, milliseconds(100));
      if (reply.ok() && reply->message &&
          reply->message->header.type() == pb::MIRROR_ACK &&
          reply->message->header.mirror_ack().applied_sequence() >=
              final_sequence) {
        return true;
      }
    }
    return false;
  }

  // The next reply that is not an acknowledgement (the site acknowledges
  // what it applies; those are not what these tests look for).
  Result<Received> NextError() {
    while (true) {
      Result<Received> reply = ReceiveMessage(*peer_, false, kTimeout);
      if (!reply.ok() || !reply->message ||
          reply->message->header.type() != pb::MIRROR_ACK) {
        return reply;
      }
    }
  }

  void Hello(const std::string& site, const ModelLayout& layout) {
    pb::Header hello = From(pb::MIRROR_HELLO, site);
    LayoutToSpecs(layout, hello.mutable_mirror_hello()->mutable_layout());
    hello.mutable_mirror_hello()->set_incarnation(1);
    hello.mutable_mirror_hello()->set_first_sequence(1);
    Send(hello);
  }

  pb::Header Clock(const std::string& site, int64_t clock) {
    pb::Header header = From(pb::MIRROR_CLOCK, site);
    header.set_clock(clock);
    header.mutable_mirror_clock()->set_clock(clock);
    return header;
  }

  // A MIRROR_UPDATE adding `value` to the first 3 elements of fc0.bias.
  pb::Header Update(const std::string& site, int64_t clock, float value,
                    std::vector<zmq::message_t>* frames) {
    pb::Header header = From(pb::MIRROR_UPDATE, site);
    EXPECT_OK(testing::MakeBiasUpdate(layout_, clock, site, value, &header, frames));
    return header;
  }

  void ExpectModelUntouched() { EXPECT_EQ(server_->Snapshot(), initial_); }

  // Worker `index`'s HELLO with the model's layout.
  pb::Header WorkerHello(uint32_t index) const {
    pb::Header hello;
    hello.set_type(pb::HELLO);
    hello.mutable_hello()->set_worker_index(index);
    LayoutToSpecs(layout_, hello.mutable_hello()->mutable_layout());
    return hello;
  }

  // A worker's COMMIT from version 0 of `value` in every element, its
  // frames into `update`.
  pb::Header CommitOf(float value, std::vector<zmq::message_t>* update) {
    pb::Header commit;
    commit.set_type(pb::COMMIT);
    AddLayoutSlices(layout_, &commit);
    commit.mutable_commit()->set_base_version(0);
    for (const TensorInfo& tensor : layout_.tensors()) {
      update->push_back(
          CopyFloatFrame(std::vector<float>(tensor.size, value)));
    }
    return commit;
  }

  // The sum of the samples of metric `name` on the site's metrics
  // endpoint (-1 when it cannot be read).
  double MetricValue(const std::string& name) {
    Result<std::string> text = FetchMetricsText(server_->metrics_address(), 5);
    if (!text.ok()) return -1;
    Result<std::vector<MetricSample>> samples = ParseMetricsText(*text);
    if (!samples.ok()) return -1;
    double sum = 0;
    for (const MetricSample& sample : *samples) {
      if (sample.name == name) sum += sample.value;
    }
    return sum;
  }
  // Worker answers the site holds (0 when they cannot be read).
  double HeldReplies() {
    return std::max(0.0, MetricValue("meridian_site_held_replies"));
  }
  // b sends its final clock `clock` (its mirror socket must be served, e.g.
  // by an AckingPeer); `worker`, the site's only one, leaves: the site
  // flushes, finishes, and ends with the replica `expected`.
  void FinishWithBAtClock(int64_t clock, RpcClient* worker,
                          const std::vector<float>& expected) {
    EXPECT_TRUE(SendFinalAndAwaitItsAck(clock));
    pb::Header bye;
    bye.set_type(pb::BYE);
    bye.mutable_bye();
    (void)worker->Call(bye, {}, kTimeout);
    thread_.join();
    EXPECT_OK(run_status_);
    EXPECT_TRUE(server_->summary().sync().flushed());
    EXPECT_EQ(server_->Snapshot(), expected);
  }
  // Waits until the replica is `expected` (true) or kTimeout passes.
  bool AwaitReplica(const std::vector<float>& expected) {
    const auto deadline = std::chrono::steady_clock::now() + kTimeout;
    while (server_->Snapshot() != expected &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(milliseconds(10));
    }
    return server_->Snapshot() == expected;
  }
  // Waits until metric `name` is `value` (true) or kTimeout passes.
  bool AwaitMetric(const std::string& name, double value) {
    const auto deadline = std::chrono::steady_clock::now() + kTimeout;
    while (MetricValue(name) != value &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(milliseconds(10));
    }
    return MetricValue(name) == value;
  }

  std::string data_dir_;
  // Declared before server_: they outlive it.
  zmq::context_t sink_context_;
  std::unique_ptr<zmq::socket_t> b_mirror_;
  pb::JobConfig job_;
  std::unique_ptr<SiteServer> server_;
  std::thread thread_;
  Status run_status_;
  std::atomic<bool> run_done_{false};  // Run returned
  ModelLayout layout_;
  std::vector<float> initial_;
  zmq::context_t context_;
  std::unique_ptr<zmq::socket_t> peer_;
  uint64_t sequence_ = 0;
};

// The same site under DiLoCo (outer rounds every 4 clocks): a peer's outer
// gradient must name a round that starts at its clock, lie within two
// periods of this site's clock, and come once per round; else it is
// refused, and the model is never touched (no round can close: this site
// has not trained).
// Under DILOCO and MODEL_AVERAGING (the same rounds, sync kind as the
// parameter) a peer may send only outer gradients of rounds this site can
// take.
class MirrorInputOuterRoundsTest
    : public MirrorInputTest,
      public ::testing::WithParamInterface<pb::SyncKind> {
 protected:
  void ConfigureJob(pb::JobConfig* job) override {
    job->mutable_sync()->set_kind(GetParam());
    job->mutable_sync()->set_averaging_period(4);
  }

  pb::Header OuterGradient(int64_t round, std::vector<zmq::message_t>* frames) {
    pb::Header header = Update("b", 1, 0.5f, frames);
    header.mutable_mirror_update()->set_average(true);
    header.mutable_mirror_update()->set_outer_round(round);
    return header;
  }
};

TEST_P(MirrorInputOuterRoundsTest, OuterGradientsOutsideTheRoundsAreRefused) {
  Hello("b", layout_);
  std::vector<zmq::message_t> frames;
  // A plain update, as Gaia sends, is not applied either.
  pb::Header header = Update("b", 1, 0.5f, &frames);
  ExpectRefused(header, pb::ERROR_MALFORMED, "no round starts",
                std::move(frames));
  frames.clear();
  header = OuterGradient(3, &frames);
  ExpectRefused(header, pb::ERROR_MALFORMED, "no round starts",
                std::move(frames));
  frames.clear();
  header = OuterGradient(400, &frames);
  ExpectRefused(header, pb::ERROR_STALE, "ahead", std::move(frames));
  frames.clear();
  header = OuterGradient(4, &frames);
  Send(header, std::move(frames));  // accepted: waits for this site's Δ
  frames.clear();
  header = OuterGradient(4, &frames);
  ExpectRefused(header, pb::ERROR_STALE, "second", std::move(frames));
  ExpectModelUntouched();
}

INSTANTIATE_TEST_SUITE_P(Kinds, MirrorInputOuterRoundsTest,
                         ::testing::Values(pb::DILOCO, pb::MODEL_AVERAGING),
                         [](const auto& info) {
                           return pb::SyncKind_Name(info.param);
                         });

// FedAvg under SkewScout: rounds follow the agreed schedule (the first at
// the job's period) and every outer gradient carries a proposed period
// within the bounds; anything else is refused and the model untouched.
class MirrorInputAdaptiveRoundsTest : public MirrorInputOuterRoundsTest {
 protected:
  void ConfigureJob(pb::JobConfig* job) override {
    MirrorInputOuterRoundsTest::ConfigureJob(job);
    pb::SkewScoutConfig* scout = job->mutable_sync()->mutable_skewscout();
    scout->set_enabled(true);
    scout->set_min_averaging_period(2);
    scout->set_max_averaging_period(16);
  }
};

TEST_P(MirrorInputAdaptiveRoundsTest, RoundsOffTheScheduleOrBoundsAreRefused) {
  Hello("b", layout_);
  std::vector<zmq::message_t> frames;
  pb::Header header = OuterGradient(8, &frames);  // the next round is at 4
  header.mutable_mirror_update()->set_next_period(4);
  ExpectRefused(header, pb::ERROR_MALFORMED, "agreed next round is at clock 4",
                std::move(frames));
  frames.clear();
  header = OuterGradient(4, &frames);  // no proposal
  ExpectRefused(header, pb::ERROR_MALFORMED, "period of 0 clocks",
                std::move(frames));
  frames.clear();
  header = OuterGradient(4, &frames);
  header.mutable_mirror_update()->set_next_period(17);
  ExpectRefused(header, pb::ERROR_MALFORMED, "outside [2, 16]",
                std::move(frames));
  frames.clear();
  header = OuterGradient(4, &frames);
  header.mutable_mirror_update()->set_next_period(8);
  Send(header, std::move(frames));  // accepted: waits for this site's Δ
  frames.clear();
  header = OuterGradient(4, &frames);
  header.mutable_mirror_update()->set_next_period(8);
  ExpectRefused(header, pb::ERROR_STALE, "second", std::move(frames));
  ExpectModelUntouched();
}

INSTANTIATE_TEST_SUITE_P(Kinds, MirrorInputAdaptiveRoundsTest,
                         ::testing::Values(pb::DILOCO, pb::MODEL_AVERAGING),
                         [](const auto& info) {
                           return pb::SyncKind_Name(info.param);
                         });

TEST_F(MirrorInputTest, UpdateFromAnUnknownSiteIsRefused) {
  Hello("site-z", layout_);  // refused: answered with an error
  Result<Received> hello_reply = NextError();
  ASSERT_TRUE(hello_reply.ok() && hello_reply->message);
  EXPECT_EQ(hello_reply->message->header.error().code(),
            pb::ERROR_UNKNOWN_SENDER);
  std::vector<zmq::message_t> frames;
  const pb::Header update = Update("site-z", 1, 1.0f, &frames);
  ExpectRefused(update, pb::ERROR_UNKNOWN_SENDER, "site-z", std::move(frames));
  ExpectModelUntouched();
}

TEST_F(MirrorInputTest, UpdateBeforeHelloIsRefused) {
  std::vector<zmq::message_t> frames;
  const pb::Header update = Update("b", 1, 1.0f, &frames);
  // The site logs the answer before it sends it.
  ::testing::internal::CaptureStderr();
  ExpectRefused(update, pb::ERROR_UNKNOWN_SENDER, "MIRROR_HELLO",
                std::move(frames));
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("with ERROR_UNKNOWN_SENDER: site 'b' must introduce "
                     "itself (MIRROR_HELLO)"),
            std::string::npos)
      << log;
  ExpectModelUntouched();
}

TEST_F(MirrorInputTest, ShapeMismatchBetweenSitesIsRefused) {
  ModelLayout other;
  ASSERT_OK(other.Add("fc0.weight", {5, 784}));
  pb::Header hello = From(pb::MIRROR_HELLO, "b");
  LayoutToSpecs(other, hello.mutable_mirror_hello()->mutable_layout());
  ExpectRefused(hello, pb::ERROR_LAYOUT_MISMATCH, "fc0.weight[5,784]");
  // Not introduced, so its updates are refused too.
  std::vector<zmq::message_t> frames;
  const pb::Header update = Update("b", 1, 1.0f, &frames);
  ExpectRefused(update, pb::ERROR_UNKNOWN_SENDER, "MIRROR_HELLO",
                std::move(frames));
  ExpectModelUntouched();
}

// SkewScout's messages from a peer of a job without it: a travelled model
// is not scored (nor, whatever it holds, applied), an answer to a travel
// this site never sent is refused.
TEST_F(MirrorInputTest, TravelsAreRefusedWithoutSkewScout) {
  Hello("b", layout_);
  std::vector<zmq::message_t> frames;
  pb::Header travel = Update("b", 1, 5.0f, &frames);
  travel.set_type(pb::MIRROR_TRAVEL);
  travel.mutable_mirror_travel()->set_travel_id(7);
  ExpectRefused(travel, pb::ERROR_UNEXPECTED, "does not score travelled",
                std::move(frames));
  pb::Header result = From(pb::MIRROR_TRAVEL_RESULT, "b");
  result.mutable_mirror_travel_result()->set_travel_id(7);
  result.mutable_mirror_travel_result()->set_own_accuracy(0.9);
  ExpectRefused(result, pb::ERROR_UNEXPECTED, "sent no model to travel");
  ExpectModelUntouched();
}

// Clocks go up; they may jump (a site that was cut off catches up in one
// step), never repeat or go back.
TEST_F(MirrorInputTest, RepeatedAndBackwardsClocksAreRefused) {
  Hello("b", layout_);
  Send(Clock("b", 1));
  Send(Clock("b", 3));  // a jump: accepted
  ExpectRefused(Clock("b", 3), pb::ERROR_STALE, "repeats");
  ExpectRefused(Clock("b", 2), pb::ERROR_STALE, "backwards");
  // An update tagged for a clock that is not the next one.
  std::vector<zmq::message_t> frames;
  const pb::Header late = Update("b", 1, 1.0f, &frames);
  ExpectRefused(late, pb::ERROR_STALE, "expected 4", std::move(frames));
  ExpectModelUntouched();
}

TEST_F(MirrorInputTest, CorruptPayloadLeavesTheModelUntouched) {
  Hello("b", layout_);
  std::vector<zmq::message_t> frames;
  const pb::Header update = Update("b", 1, 1.0f, &frames);
  // Flip a byte in the middle of the encoded buffer.
  static_cast<char*>(frames[0].data())[frames[0].size() / 2] ^= 0x5a;
  ExpectRefused(update, pb::ERROR_MALFORMED, "fc0.bias", std::move(frames));
  // A slice that says it is longer than the encoded one.
  std::vector<zmq::message_t> frames2;
  pb::Header wrong_length = Update("b", 1, 1.0f, &frames2);
  wrong_length.mutable_slices(0)->set_offset(1);
  wrong_length.mutable_slices(0)->set_length(3);
  ExpectRefused(wrong_length, pb::ERROR_MALFORMED, "fc0.bias",
                std::move(frames2));
  ExpectModelUntouched();
}

TEST_F(MirrorInputTest, AValidUpdateIsApplied) {
  Hello("b", layout_);
  std::vector<zmq::message_t> frames;
  const pb::Header update = Update("b", 1, 0.25f, &frames);
  Send(update, std::move(frames));
  const TensorInfo* bias = layout_.Find("fc0.bias");
  std::vector<float> expected = initial_;
  for (int i = 0; i < 3; ++i) expected[bias->offset + i] += 0.25f;
  EXPECT_TRUE(AwaitReplica(expected));
}

}  // namespace
}  // namespace meridian

namespace meridian {
namespace {

pb::Endpoint WorkerOf(uint32_t index) {
  pb::Endpoint self;
  self.set_site("site-a");
  self.set_role(pb::ROLE_WORKER);
  self.set_id(index);
  return self;
}

// The selective barrier: after a peer announces the indices of a large
// update, reads of those parameters wait for its values; reads of anything
// else go on.
TEST_F(MirrorInputTest, SelectiveBarrierBlocksOnlyTheAnnouncedParameters) {
  // This fixture's site serves one worker; restart it with two.
  TearDown();
  job_.mutable_site(0)->mutable_workers(0)->set_count(2);
  StartSite(/*metrics=*/true);  // to see the held replies
  ASSERT_FALSE(server_->metrics_address().empty());
  Hello("b", layout_);

  // Peer b announces a change to fc0.bias[0..2].
  std::vector<zmq::message_t> frames;
  pb::Header indices = Update("b", 1, 0.0f, &frames);
  indices.set_type(pb::MIRROR_INDICES);
  Send(indices, std::move(frames));

  RpcClient w0(context_, server_->endpoint(), WorkerOf(0));
  RpcClient w1(context_, server_->endpoint(), WorkerOf(1));
  Result<Envelope> welcome1 = DeadlineExceededError("not answered");
  std::thread join1([&] { welcome1 = w1.Call(WorkerHello(1), {}, kTimeout); });
  Result<Envelope> welcome0 = w0.Call(WorkerHello(0), {}, kTimeout);
  join1.join();
  ASSERT_OK(welcome0);
  ASSERT_OK(welcome1);
  // The site reads its mirror socket once training starts, and nothing
  // orders that against the workers' requests: wait until it has taken
  // b's MIRROR_HELLO and MIRROR_INDICES (on a loaded machine the commit
  // below could otherwise come first and be answered at once).
  ASSERT_TRUE(AwaitMetric("meridian_sync_messages_received_total", 2));

  // Worker 0 commits: its reply is the whole model, which includes the
  // announced parameters, so it waits.
  Result<Envelope> commit_reply = DeadlineExceededError("not answered");
  std::atomic<bool> commit_answered{false};
  std::thread committer([&] {
    std::vector<zmq::message_t> update;
    const pb::Header commit = CommitOf(0.0f, &update);
    commit_reply = w0.Call(commit, std::move(update), kTimeout);
    commit_answered = true;
  });
  auto pull = [&](const std::string& tensor, uint64_t length) {
    pb::Header request;
    request.set_type(pb::PULL);
    pb::TensorSlice* range = request.mutable_pull()->add_ranges();
    range->set_tensor(tensor);
    range->set_offset(0);
    range->set_length(length);
    return request;
  };
  // Worker 1 reads another tensor: answered while the values are still
  // missing (a held read would only be answered after they arrive below,
  // and this call would time out), with the commit reply still held.
  Result<Envelope> other = w1.Call(
      pull("fc1.weight", layout_.Find("fc1.weight")->size), {}, kTimeout);
  ASSERT_OK(other);
  ASSERT_EQ(other->header.type(), pb::MODEL);
  ASSERT_EQ(other->header.slices_size(), 1);
  EXPECT_EQ(other->header.slices(0).tensor(), "fc1.weight");
  EXPECT_FALSE(commit_answered);
  // ... but a read of the announced bias waits too.
  Result<Envelope> bias = DeadlineExceededError("not answered");
  std::atomic<bool> bias_answered{false};
  std::thread reader([&] {
    bias = w1.Call(pull("fc0.bias", 4), {}, kTimeout);
    bias_answered = true;
  });
  // Wait until the site holds both answers (its metrics count them), or
  // one of them came.
  const auto deadline = std::chrono::steady_clock::now() + kTimeout;
  while (HeldReplies() < 2 && !commit_answered && !bias_answered &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  EXPECT_FALSE(commit_answered) << "the commit reply was not held";
  EXPECT_FALSE(bias_answered) << "the bias read was not held";

  // The values arrive: both reads go on and see them.
  std::vector<zmq::message_t> values;
  const pb::Header update = Update("b", 1, 0.5f, &values);
  Send(update, std::move(values));
  committer.join();
  reader.join();
  ASSERT_OK(commit_reply);
  EXPECT_EQ(commit_reply->header.type(), pb::MODEL);
  ASSERT_OK(bias);
  ASSERT_EQ(bias->header.type(), pb::MODEL);
  const float* got = static_cast<const float*>(bias->payload[0].data());
  const TensorInfo* b = layout_.Find("fc0.bias");
  EXPECT_FLOAT_EQ(got[0], initial_[b->offset] + 0.5f);
  EXPECT_FLOAT_EQ(got[3], initial_[b->offset + 3]);
  // Peer b ends its job (final flush, nothing more): the site finishes
  // too, and b's mirror socket acknowledges the site's own final flush.
  testing::AckingPeer b_mirror(b_mirror_.get(), "b");
  // The workers leave only once the site has taken b's final (it
  // acknowledges it); before, "every worker left" could end the job first.
  EXPECT_TRUE(SendFinalAndAwaitItsAck())
      << "the site never acknowledged b's final clock";
  for (RpcClient* client : {&w0, &w1}) {
    pb::Header bye;
    bye.set_type(pb::BYE);
    bye.mutable_bye();
    (void)client->Call(bye, {}, kTimeout);
  }
  thread_.join();
  EXPECT_OK(run_status_);
  EXPECT_TRUE(server_->summary().stopped_by_peer());
  EXPECT_TRUE(server_->summary().sync().flushed());
}

// sync.own_changes WITH_PEERS: the site's own worker's commit reaches the
// site's replica only once peer b has announced the clock it belongs to
// (b's changes of that clock are then in too); before, neither the
// worker's reply nor the replica has it.
class MirrorInputHeldOwnChangesTest : public MirrorInputTest {
 protected:
  void ConfigureJob(pb::JobConfig* job) override {
    job->mutable_sync()->set_kind(pb::DENSE);
    job->mutable_sync()->set_max_clock_skew(4);
    job->mutable_sync()->set_own_changes(pb::OWN_CHANGES_WITH_PEERS);
  }
};

TEST_F(MirrorInputHeldOwnChangesTest, OwnChangesWaitForThePeersClock) {
  Hello("b", layout_);
  RpcClient worker(context_, server_->endpoint(), WorkerOf(0));
  ASSERT_OK(worker.Call(WorkerHello(0), {}, kTimeout));

  // One commit of the only worker (the site's clock 1): 0.5 everywhere,
  // which the MEAN rule over the job's two workers makes 0.25.
  std::vector<zmq::message_t> update;
  const pb::Header commit = CommitOf(0.5f, &update);
  Result<Envelope> reply = worker.Call(commit, std::move(update), kTimeout);
  ASSERT_OK(reply);
  ASSERT_EQ(reply->header.type(), pb::MODEL);
  // Applied (answered) but held: the reply and the replica are as before.
  const float* got = static_cast<const float*>(reply->payload[0].data());
  EXPECT_FLOAT_EQ(got[0], initial_[0]);
  ExpectModelUntouched();

  // b announces clock 1: the held change reaches the replica.
  Send(Clock("b", 1));
  std::vector<float> expected = initial_;
  for (float& value : expected) value += 0.25f;
  EXPECT_TRUE(AwaitReplica(expected));

  // b ends its job; the worker leaves: the site flushes and finishes.
  testing::AckingPeer b_mirror(b_mirror_.get(), "b");
  FinishWithBAtClock(2, &worker, expected);
}

// sync.own_changes AS_SENT: of the site's own change, only what the
// significance filter has sent to b reaches the replica (at b's clock);
// what it holds back stays out of the replica, as it stays out of b's.
class MirrorInputOwnChangesAsSentTest : public MirrorInputTest {
 protected:
  void ConfigureJob(pb::JobConfig* job) override {
    pb::SyncConfig* sync = job->mutable_sync();
    sync->set_kind(pb::GAIA);
    sync->set_threshold_mode(pb::ABSOLUTE);
    sync->set_threshold(0.3);
    sync->set_max_clock_skew(4);
    sync->set_own_changes(pb::OWN_CHANGES_AS_SENT);
    sync->mutable_compression()->set_value_coding(pb::VALUE_FP32);
  }
};

TEST_F(MirrorInputOwnChangesAsSentTest, OnlyWhatWasSentReachesTheReplica) {
  TearDown();
  StartSite(/*metrics=*/true);  // to see the held clocks
  ASSERT_FALSE(server_->metrics_address().empty());
  const std::string held_clocks = "meridian_sync_own_changes_held_clocks";
  Hello("b", layout_);
  testing::AckingPeer b_mirror(b_mirror_.get(), "b");
  RpcClient worker(context_, server_->endpoint(), WorkerOf(0));
  ASSERT_OK(worker.Call(WorkerHello(0), {}, kTimeout));

  // Clock 1: 0.5 everywhere, 0.25 after the MEAN over the job's two
  // workers: below θ 0.3, so nothing is sent. Its (empty) share queues
  // for b's clock 1, and b's clock 1 lets it go: the replica stays as it
  // was (WITH_PEERS would add the 0.25 now).
  std::vector<zmq::message_t> update;
  pb::Header commit = CommitOf(0.5f, &update);
  ASSERT_OK(worker.Call(commit, std::move(update), kTimeout));
  ASSERT_TRUE(AwaitMetric(held_clocks, 1));
  Send(Clock("b", 1));
  ASSERT_TRUE(AwaitMetric(held_clocks, 0));
  ExpectModelUntouched();

  // Clock 2: another 0.25, 0.5 unsent: above θ, all of it goes to b, and
  // reaches the replica with b's clock 2, not before.
  update.clear();
  commit = CommitOf(0.5f, &update);
  ASSERT_OK(worker.Call(commit, std::move(update), kTimeout));
  ASSERT_TRUE(AwaitMetric(held_clocks, 1));
  ExpectModelUntouched();
  Send(Clock("b", 2));
  std::vector<float> expected = initial_;
  for (float& value : expected) value += 0.5f;
  EXPECT_TRUE(AwaitReplica(expected));

  FinishWithBAtClock(3, &worker, expected);
}

// After the exchange: the site's flush with b is complete here (it has b's
// final, and b acknowledged the site's), but b has not said its own is
// complete there — it may not have the site's acknowledgement of its final
// (lost as the site's process ended; or b resumed). The site stays and
// keeps talking to b, and ends as soon as b says its flush is complete.
TEST_F(MirrorInputTest, AFlushedSiteStaysUntilThePeerSaysItsFlushIsComplete) {
  // Liveness longer than the test: only b's word ends the stay.
  TearDown();
  job_.mutable_fault()->set_peer_timeout_s(120);
  StartSite();
  Hello("b", layout_);
  testing::AckingPeer b_mirror(b_mirror_.get(), "b", /*says_flushed=*/false);
  RpcClient worker(context_, server_->endpoint(), WorkerOf(0));
  ASSERT_OK(worker.Call(WorkerHello(0), {}, kTimeout));

  ASSERT_TRUE(SendFinalAndAwaitItsAck())
      << "the site never acknowledged b's final clock";
  pb::Header bye;
  bye.set_type(pb::BYE);
  bye.mutable_bye();
  (void)worker.Call(bye, {}, kTimeout);

  // The site's final went out and b acknowledged it: the exchange is
  // complete here. The site stays: its heartbeats keep coming.
  const auto stay_deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (b_mirror.heartbeats_after_final() < 2 && !run_done_ &&
         std::chrono::steady_clock::now() < stay_deadline) {
    std::this_thread::sleep_for(milliseconds(20));
  }
  EXPECT_GE(b_mirror.heartbeats_after_final(), 2);
  EXPECT_FALSE(run_done_) << "the site ended before b said it was done";

  // b says so: the site ends (long before FinalFlush::kLingerS, 60 s).
  b_mirror.SayFlushed();
  const auto end_deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!run_done_ && std::chrono::steady_clock::now() < end_deadline) {
    std::this_thread::sleep_for(milliseconds(20));
  }
  EXPECT_TRUE(run_done_) << "the site did not end when b said it was done";
  thread_.join();
  EXPECT_OK(run_status_);
  EXPECT_TRUE(server_->summary().sync().flushed());
}

}  // namespace
}  // namespace meridian
