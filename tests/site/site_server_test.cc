// A live site server (real ZeroMQ sockets on loopback, running in a thread
// of this process) fed well-formed and malformed messages.
#include "meridian/site/site_server.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <thread>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "meridian/config/config.h"
#include "meridian/core/log.h"
#include "meridian/net/message.h"
#include "meridian/train/model.h"
#include "meridian/net/transport.h"
#include "testing/raw_zmtp.h"
#include "testing/site_control.h"
#include "testing/test_data.h"
#include "testing/status_matchers.h"

namespace meridian {
namespace {

using std::chrono::milliseconds;
constexpr milliseconds kTimeout(10000);

class SiteServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    data_dir_ = new std::string(testing::MakeTempDir("site-server-data"));
    testing::SyntheticDataOptions options;
    options.train_samples = 500;
    options.test_samples = 100;
    ASSERT_OK(testing::WriteSyntheticIdx(*data_dir_, options));
  }

  // Starts a server for `workers` workers under `policy`.
  void StartServer(uint32_t workers, pb::PolicyKind policy = pb::ASYNC) {
    job_ = testing::SmallJob(*data_dir_, workers, /*hidden=*/8);
    job_.mutable_policy()->set_kind(policy);
    job_.set_time_budget_s(120);
    job_.mutable_server()->set_eval_period_s(5);
    job_.mutable_server()->mutable_limits()->MergeFrom(limits_);
    ASSERT_TRUE(ValidateJobConfig(job_).empty());
    SiteServerOptions options;
    options.job = job_;
    options.site = "site-a";
    options.bind = "tcp://127.0.0.1:*";
    options.control_token = testing::kTestControlToken;
    options.out_dir = testing::MakeTempDir("site-server-out");
    out_dir_ = options.out_dir;
    Result<std::unique_ptr<SiteServer>> server =
        SiteServer::Create(std::move(options));
    ASSERT_OK(server);
    server_ = std::move(*server);
    endpoint_ = server_->endpoint();
    thread_ = std::thread([this] { run_status_ = server_->Run(); });
    Result<std::unique_ptr<Model>> model = MakeModel(job_.model(), 784, 10);
    ASSERT_OK(model);
    model_ = std::move(*model);
    initial_.resize(model_->layout().num_elements());
    model_->Initialize(job_.seed(), initial_);
  }

  void TearDown() override {
    if (!thread_.joinable()) return;
    pb::Header shutdown;
    shutdown.set_type(pb::SHUTDOWN);
    shutdown.set_control_token(testing::kTestControlToken);
    shutdown.mutable_shutdown()->set_reason("test over");
    RpcClient control(context_, endpoint_, ClientEndpoint());
    EXPECT_OK(control.Call(shutdown, {}, kTimeout));
    for (auto& client : workers_) {
      pb::Header bye;
      bye.set_type(pb::BYE);
      bye.mutable_bye();
      (void)client->Call(bye, {}, kTimeout);
    }
    thread_.join();
    EXPECT_OK(run_status_);
  }

  static pb::Endpoint ClientEndpoint() {
    pb::Endpoint self;
    self.set_site("site-a");
    self.set_role(pb::ROLE_CLIENT);
    return self;
  }

  static pb::Endpoint WorkerEndpoint(uint32_t index) {
    pb::Endpoint self;
    self.set_site("site-a");
    self.set_role(pb::ROLE_WORKER);
    self.set_id(index);
    return self;
  }

  RpcClient* NewWorkerClient(uint32_t index) {
    workers_.push_back(std::make_unique<RpcClient>(context_, endpoint_,
                                                   WorkerEndpoint(index)));
    return workers_.back().get();
  }

  pb::Header Hello(uint32_t index) {
    pb::Header hello;
    hello.set_type(pb::HELLO);
    hello.mutable_hello()->set_worker_index(index);
    LayoutToSpecs(model_->layout(), hello.mutable_hello()->mutable_layout());
    return hello;
  }

  // Joins worker 0 and returns its client after checking the WELCOME.
  RpcClient* JoinOneWorker() {
    RpcClient* client = NewWorkerClient(0);
    Result<Envelope> welcome = client->Call(Hello(0), {}, kTimeout);
    EXPECT_OK(welcome);
    if (!welcome.ok()) return client;
    EXPECT_EQ(welcome->header.type(), pb::WELCOME);
    EXPECT_EQ(ModelValues(*welcome), initial_);
    return client;
  }

  // A whole-model COMMIT whose every element is `value`.
  pb::Header CommitHeader(uint64_t base_version = 0) {
    pb::Header header;
    header.set_type(pb::COMMIT);
    AddLayoutSlices(model_->layout(), &header);
    header.mutable_commit()->set_base_version(base_version);
    header.mutable_commit()->set_local_steps(1);
    return header;
  }

  std::vector<zmq::message_t> UpdateFrames(float value) {
    std::vector<zmq::message_t> frames;
    for (const TensorInfo& tensor : model_->layout().tensors()) {
      std::vector<float> values(tensor.size, value);
      frames.push_back(CopyFloatFrame(values));
    }
    return frames;
  }

  std::vector<float> ModelValues(const Envelope& reply) {
    std::vector<float> values;
    for (const zmq::message_t& frame : reply.payload) {
      const float* data = static_cast<const float*>(frame.data());
      values.insert(values.end(), data, data + frame.size() / sizeof(float));
    }
    return values;
  }

  // PULLs the model; checks it is MODEL.
  Envelope Pull(RpcClient* client) {
    pb::Header pull;
    pull.set_type(pb::PULL);
    pull.mutable_pull();
    Result<Envelope> reply = client->Call(pull, {}, kTimeout);
    EXPECT_OK(reply);
    EXPECT_EQ(reply->header.type(), pb::MODEL);
    return std::move(*reply);
  }

  void ExpectError(const Result<Envelope>& reply, pb::ErrorCode code) {
    ASSERT_OK(reply);
    ASSERT_EQ(reply->header.type(), pb::ERROR)
        << "expected an ERROR reply, got " << DescribeHeader(reply->header);
    EXPECT_EQ(reply->header.error().code(), code)
        << pb::ErrorCode_Name(reply->header.error().code()) << ": "
        << reply->header.error().message();
    EXPECT_FALSE(reply->header.error().message().empty());
  }

  // Sends raw frames from a fresh DEALER and returns the decoded reply.
  Envelope SendRaw(std::vector<zmq::message_t> frames) {
    zmq::socket_t socket(context_, zmq::socket_type::dealer);
    socket.set(zmq::sockopt::linger, 0);
    socket.connect(endpoint_);
    zmq::send_multipart(socket, frames);
    Result<Received> received = ReceiveMessage(socket, false, kTimeout);
    EXPECT_OK(received);
    EXPECT_TRUE(received->message.has_value()) << "no valid reply";
    return received->message ? std::move(*received->message) : Envelope{};
  }

  static zmq::message_t HeaderFrame(const pb::Header& header) {
    std::string bytes;
    header.SerializeToString(&bytes);
    return zmq::message_t(bytes.data(), bytes.size());
  }

  // The model is exactly the initial one: nothing was applied.
  void ExpectModelUntouched(RpcClient* client) {
    Envelope model = Pull(client);
    EXPECT_EQ(model.header.model().version(), 0u);
    EXPECT_EQ(ModelValues(model), initial_);
  }

  static std::string* data_dir_;
  pb::JobConfig job_;
  pb::EndpointLimits limits_;  // set before StartServer
  std::string out_dir_;
  zmq::context_t context_;
  std::unique_ptr<SiteServer> server_;
  std::string endpoint_;
  std::thread thread_;
  Status run_status_;
  std::unique_ptr<Model> model_;
  std::vector<float> initial_;
  std::vector<std::unique_ptr<RpcClient>> workers_;
};

std::string* SiteServerTest::data_dir_ = nullptr;

TEST_F(SiteServerTest, ValidCommitIsAppliedAndAnswered) {
  StartServer(1);
  RpcClient* worker = JoinOneWorker();
  Result<Envelope> reply =
      worker->Call(CommitHeader(), UpdateFrames(0.5f), kTimeout);
  ASSERT_OK(reply);
  ASSERT_EQ(reply->header.type(), pb::MODEL);
  EXPECT_EQ(reply->header.model().version(), 1u);
  const std::vector<float> values = ModelValues(*reply);
  ASSERT_EQ(values.size(), initial_.size());
  for (size_t i = 0; i < values.size(); ++i) {
    // MEAN over one worker: w += u.
    ASSERT_FLOAT_EQ(values[i], initial_[i] + 0.5f) << "element " << i;
  }
}

// A sparse commit: rows 1 and 3 of the first tensor as CODEC_ROWS, the
// other tensors whole; it asks for rows 2 and 3 of the first tensor in the
// answer, which carries exactly those, current, and the others whole.
TEST_F(SiteServerTest, RowCommitsApplyTheirRowsAndRowReadsAnswerWithRows) {
  StartServer(1);
  RpcClient* worker = JoinOneWorker();
  const TensorInfo& first = model_->layout().tensors()[0];  // fc0.weight
  const uint64_t length = RowLength(first);
  ASSERT_GT(first.shape[0], 4u);
  pb::Header header;
  header.set_type(pb::COMMIT);
  header.mutable_commit()->set_local_steps(1);
  header.mutable_commit()->set_commit_id(1);
  std::vector<zmq::message_t> frames;
  const std::vector<uint32_t> rows = {1, 3};
  zmq::message_t rows_frame(RowsPayloadBytes(rows.size(), length));
  float* values = AddRowsSlice(
      first, rows,
      std::span<std::byte>(static_cast<std::byte*>(rows_frame.data()),
                           rows_frame.size()),
      &header);
  std::vector<float> update(rows.size() * length, 0.25f);
  std::memcpy(values, update.data(), update.size() * sizeof(float));
  frames.push_back(std::move(rows_frame));
  for (size_t t = 1; t < model_->layout().tensors().size(); ++t) {
    const TensorInfo& tensor = model_->layout().tensors()[t];
    AddTensorSlice(tensor, &header);
    frames.push_back(CopyFloatFrame(std::vector<float>(tensor.size, 0.5f)));
  }
  pb::RowRead* read = header.mutable_commit()->add_reads();
  read->set_tensor(first.name);
  read->add_rows(2);
  read->add_rows(3);
  Result<Envelope> reply = worker->Call(header, std::move(frames), kTimeout);
  ASSERT_OK(reply);
  ASSERT_EQ(reply->header.type(), pb::MODEL) << DescribeHeader(reply->header);
  ASSERT_EQ(reply->header.slices_size(),
            static_cast<int>(model_->layout().tensors().size()));
  EXPECT_EQ(reply->header.slices(0).codec(), pb::CODEC_ROWS);
  Parsed<DecodedRows> decoded = DecodeRows(reply->header.slices(0), first,
                                           BytesOf(reply->payload[0]));
  ASSERT_TRUE(decoded.ok()) << decoded.rejection().reason;
  const DecodedRows& answer = *decoded;
  EXPECT_EQ(answer.rows, (std::vector<uint32_t>{2, 3}));
  for (uint64_t k = 0; k < length; ++k) {
    // Row 2 unchanged, row 3 moved by its update (MEAN over one worker).
    EXPECT_FLOAT_EQ(answer.values[k], initial_[first.offset + 2 * length + k]);
    EXPECT_FLOAT_EQ(answer.values[length + k],
                    initial_[first.offset + 3 * length + k] + 0.25f);
  }
  for (int t = 1; t < reply->header.slices_size(); ++t) {
    EXPECT_EQ(reply->header.slices(t).codec(), pb::CODEC_RAW);
    const TensorInfo& tensor = model_->layout().tensors()[t];
    const float* whole = static_cast<const float*>(reply->payload[t].data());
    EXPECT_FLOAT_EQ(whole[0], initial_[tensor.offset] + 0.5f);
  }
  // The whole model, as a PULL sees it: rows 1 and 3 moved, row 0 not.
  const std::vector<float> model = ModelValues(Pull(worker));
  EXPECT_FLOAT_EQ(model[first.offset + length],
                  initial_[first.offset + length] + 0.25f);
  EXPECT_FLOAT_EQ(model[first.offset], initial_[first.offset]);

  // Reads of rows out of range or a tensor twice refuse the commit.
  for (const auto& [tensor, row] :
       std::vector<std::pair<std::string, uint32_t>>{
           {first.name, static_cast<uint32_t>(first.shape[0])},
           {"no-such-tensor", 0}}) {
    pb::Header bad = CommitHeader(2);
    bad.mutable_commit()->set_commit_id(2);
    pb::RowRead* r = bad.mutable_commit()->add_reads();
    r->set_tensor(tensor);
    r->add_rows(row);
    Result<Envelope> refused = worker->Call(bad, UpdateFrames(0.0f), kTimeout);
    ASSERT_OK(refused);
    EXPECT_EQ(refused->header.type(), pb::ERROR) << tensor;
  }
}

TEST_F(SiteServerTest, GarbageHeaderIsRejected) {
  StartServer(1);
  RpcClient* worker = JoinOneWorker();
  std::vector<zmq::message_t> frames;
  frames.emplace_back(std::string("\xff\xff\xff\xff garbage"));
  Envelope reply = SendRaw(std::move(frames));
  EXPECT_EQ(reply.header.type(), pb::ERROR);
  EXPECT_EQ(reply.header.error().code(), pb::ERROR_MALFORMED);
  ExpectModelUntouched(worker);
}

TEST_F(SiteServerTest, WrongProtocolVersionIsRejected) {
  StartServer(1);
  RpcClient* worker = JoinOneWorker();
  pb::Header header = CommitHeader();
  header.set_protocol_version(kProtocolVersion + 1);
  *header.mutable_sender() = WorkerEndpoint(0);
  std::vector<zmq::message_t> frames;
  frames.push_back(HeaderFrame(header));
  for (auto& frame : UpdateFrames(1.0f)) frames.push_back(std::move(frame));
  Envelope reply = SendRaw(std::move(frames));
  EXPECT_EQ(reply.header.type(), pb::ERROR);
  EXPECT_EQ(reply.header.error().code(), pb::ERROR_VERSION);
  ExpectModelUntouched(worker);
}

TEST_F(SiteServerTest, TruncatedMessageIsRejected) {
  StartServer(1);
  RpcClient* worker = JoinOneWorker();
  std::vector<zmq::message_t> frames = UpdateFrames(1.0f);
  frames.pop_back();  // the last tensor's payload never arrives
  ExpectError(worker->Call(CommitHeader(), std::move(frames), kTimeout),
              pb::ERROR_SIZE_MISMATCH);
  // A payload frame cut short of what its slice announces.
  std::vector<zmq::message_t> short_frames = UpdateFrames(1.0f);
  short_frames[0] =
      zmq::message_t(short_frames[0].data(), short_frames[0].size() - 3);
  ExpectError(worker->Call(CommitHeader(), std::move(short_frames), kTimeout),
              pb::ERROR_SIZE_MISMATCH);
  ExpectModelUntouched(worker);
}

TEST_F(SiteServerTest, SizesThatDisagreeWithTheHeaderAreRejected) {
  StartServer(1);
  RpcClient* worker = JoinOneWorker();
  // Header and frame agree on bytes, but not with the element count.
  pb::Header header = CommitHeader();
  header.mutable_slices(0)->set_length(header.slices(0).length() - 1);
  ExpectError(worker->Call(header, UpdateFrames(1.0f), kTimeout),
              pb::ERROR_SIZE_MISMATCH);
  ExpectModelUntouched(worker);
}

TEST_F(SiteServerTest, KeyRangesOutsideTheModelAreRejected) {
  StartServer(1);
  RpcClient* worker = JoinOneWorker();
  // A slice that starts inside the tensor and runs past its end.
  pb::Header header = CommitHeader();
  header.mutable_slices(1)->set_offset(4);
  ExpectError(worker->Call(header, UpdateFrames(1.0f), kTimeout),
              pb::ERROR_OUT_OF_RANGE);
  // An offset chosen to overflow offset + length.
  header = CommitHeader();
  header.mutable_slices(1)->set_offset(std::numeric_limits<uint64_t>::max() -
                                       2);
  ExpectError(worker->Call(header, UpdateFrames(1.0f), kTimeout),
              pb::ERROR_OUT_OF_RANGE);
  // A tensor the model does not have.
  header = CommitHeader();
  header.mutable_slices(0)->set_tensor("fc9.weight");
  ExpectError(worker->Call(header, UpdateFrames(1.0f), kTimeout),
              pb::ERROR_OUT_OF_RANGE);
  ExpectModelUntouched(worker);
}

TEST_F(SiteServerTest, NonFiniteUpdatesAreRejected) {
  StartServer(1);
  RpcClient* worker = JoinOneWorker();
  for (float bad : {std::numeric_limits<float>::quiet_NaN(),
                    std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    std::vector<zmq::message_t> frames = UpdateFrames(0.25f);
    float* values = static_cast<float*>(frames[2].data());
    values[3] = bad;
    Result<Envelope> reply =
        worker->Call(CommitHeader(), std::move(frames), kTimeout);
    ExpectError(reply, pb::ERROR_NON_FINITE);
    EXPECT_NE(reply->header.error().message().find("element 3"),
              std::string::npos)
        << reply->header.error().message();
  }
  ExpectModelUntouched(worker);
}

TEST_F(SiteServerTest, CommitFromTheFutureIsRejected) {
  StartServer(1);
  RpcClient* worker = JoinOneWorker();
  ExpectError(worker->Call(CommitHeader(/*base_version=*/7), UpdateFrames(1.0f),
                           kTimeout),
              pb::ERROR_STALE);
  ExpectModelUntouched(worker);
}

TEST_F(SiteServerTest, UnknownSendersAreRejected) {
  StartServer(1);
  RpcClient* worker = JoinOneWorker();
  // A worker index the site does not have, on its own connection.
  RpcClient intruder(context_, endpoint_, WorkerEndpoint(5));
  ExpectError(intruder.Call(CommitHeader(), UpdateFrames(1.0f), kTimeout),
              pb::ERROR_UNKNOWN_SENDER);
  // A valid index from a connection that never joined.
  RpcClient impostor(context_, endpoint_, WorkerEndpoint(0));
  ExpectError(impostor.Call(CommitHeader(), UpdateFrames(1.0f), kTimeout),
              pb::ERROR_UNKNOWN_SENDER);
  ExpectModelUntouched(worker);
}

TEST_F(SiteServerTest, ReplayedRequestsAreRejected) {
  StartServer(1);
  // A worker speaking the protocol by hand, so that it can pick its
  // sequence numbers.
  zmq::socket_t socket(context_, zmq::socket_type::dealer);
  socket.set(zmq::sockopt::linger, 0);
  socket.connect(endpoint_);
  auto call = [&](pb::Header header, uint64_t sequence,
                  std::vector<zmq::message_t> payload) {
    header.set_protocol_version(kProtocolVersion);
    *header.mutable_sender() = WorkerEndpoint(0);
    header.set_sequence(sequence);
    EXPECT_OK(SendMessage(socket, header, std::move(payload)));
    Result<Received> received = ReceiveMessage(socket, false, kTimeout);
    EXPECT_TRUE(received.ok() && received->message.has_value());
    return std::move(*received->message);
  };
  EXPECT_EQ(call(Hello(0), 1, {}).header.type(), pb::WELCOME);
  Envelope first = call(CommitHeader(), 5, UpdateFrames(0.5f));
  EXPECT_EQ(first.header.type(), pb::MODEL);
  EXPECT_EQ(first.header.model().version(), 1u);
  // The same request again, and an older one: refused, not applied twice.
  for (uint64_t sequence : {5, 4}) {
    Envelope replay = call(CommitHeader(1), sequence, UpdateFrames(0.5f));
    ASSERT_EQ(replay.header.type(), pb::ERROR);
    EXPECT_EQ(replay.header.error().code(), pb::ERROR_STALE);
    EXPECT_EQ(replay.header.error().rejected_sequence(), sequence);
  }
  Envelope next = call(CommitHeader(1), 6, UpdateFrames(0.5f));
  EXPECT_EQ(next.header.type(), pb::MODEL);
  EXPECT_EQ(next.header.model().version(), 2u);
  pb::Header bye;
  bye.set_type(pb::BYE);
  bye.mutable_bye();
  EXPECT_EQ(call(bye, 7, {}).header.type(), pb::BYE);
  // Its only worker left: the site finishes on its own.
  thread_.join();
  EXPECT_OK(run_status_);
  EXPECT_EQ(server_->summary().commits(), 2u);
}

TEST_F(SiteServerTest, LayoutMismatchIsRefusedAtJoin) {
  StartServer(1);
  RpcClient* worker = NewWorkerClient(0);
  pb::Header hello = Hello(0);
  hello.mutable_hello()->mutable_layout(0)->set_shape(0, 9);
  ExpectError(worker->Call(hello, {}, kTimeout), pb::ERROR_LAYOUT_MISMATCH);
  // The same worker can still join with the right model.
  Result<Envelope> welcome = worker->Call(Hello(0), {}, kTimeout);
  ASSERT_OK(welcome);
  EXPECT_EQ(welcome->header.type(), pb::WELCOME);
}

TEST_F(SiteServerTest, KeepsServingAndCountsRejections) {
  StartServer(1);
  RpcClient* worker = JoinOneWorker();
  for (int i = 0; i < 3; ++i) {
    std::vector<zmq::message_t> frames;
    frames.emplace_back(std::string("junk"));
    SendRaw(std::move(frames));
  }
  Result<Envelope> reply =
      worker->Call(CommitHeader(), UpdateFrames(0.5f), kTimeout);
  ASSERT_OK(reply);
  EXPECT_EQ(reply->header.type(), pb::MODEL);
  RpcClient control(context_, endpoint_, ClientEndpoint());
  pb::Header status;
  status.set_type(pb::STATUS_REQUEST);
  Result<Envelope> status_reply = control.Call(status, {}, kTimeout);
  ASSERT_OK(status_reply);
  ASSERT_EQ(status_reply->header.type(), pb::STATUS_REPLY);
  EXPECT_EQ(status_reply->header.status().rejected(), 3u);
  EXPECT_EQ(status_reply->header.status().commits(), 1u);
  EXPECT_EQ(status_reply->header.status().model_version(), 1u);
}

TEST_F(SiteServerTest, BspHoldsRepliesUntilEveryWorkerCommitted) {
  StartServer(2, pb::BSP);
  RpcClient* w0 = NewWorkerClient(0);
  RpcClient* w1 = NewWorkerClient(1);
  // The start barrier: WELCOMEs come once both joined.
  Result<Envelope> welcome1 = DeadlineExceededError("not answered");
  std::thread join1([&] { welcome1 = w1->Call(Hello(1), {}, kTimeout); });
  Result<Envelope> welcome0 = w0->Call(Hello(0), {}, kTimeout);
  join1.join();
  ASSERT_OK(welcome0);
  ASSERT_OK(welcome1);
  ASSERT_EQ(welcome0->header.type(), pb::WELCOME);

  // Worker 0 commits alone: no answer while worker 1 has not committed.
  Result<Envelope> reply0 = DeadlineExceededError("not answered");
  std::thread commit0(
      [&] { reply0 = w0->Call(CommitHeader(), UpdateFrames(1.0f), kTimeout); });
  RpcClient control(context_, endpoint_, ClientEndpoint());
  pb::Header status;
  status.set_type(pb::STATUS_REQUEST);
  // Wait until the server holds that commit (it counts it on arrival).
  const auto deadline = std::chrono::steady_clock::now() + kTimeout;
  Result<Envelope> before = control.Call(status, {}, kTimeout);
  while (before.ok() && before->header.status().commits() == 0 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(10));
    before = control.Call(status, {}, kTimeout);
  }
  ASSERT_OK(before);
  EXPECT_EQ(before->header.status().model_version(), 0u)
      << "the barrier must not apply before every worker committed";

  Result<Envelope> reply1 =
      w1->Call(CommitHeader(), UpdateFrames(3.0f), kTimeout);
  commit0.join();
  ASSERT_OK(reply0);
  ASSERT_OK(reply1);
  ASSERT_EQ(reply0->header.type(), pb::MODEL);
  ASSERT_EQ(reply1->header.type(), pb::MODEL);
  EXPECT_EQ(reply0->header.model().version(), 1u);
  EXPECT_EQ(reply1->header.model().version(), 1u);
  const std::vector<float> values = ModelValues(*reply1);
  for (size_t i = 0; i < values.size(); ++i) {
    // One aggregated apply: w += (1 + 3) / 2.
    ASSERT_FLOAT_EQ(values[i], initial_[i] + 2.0f) << "element " << i;
  }
  EXPECT_EQ(reply0->header.clock(), 1);
}

TEST_F(SiteServerTest, ShutdownStopsWorkersAndWritesTheSummary) {
  StartServer(1);
  RpcClient* worker = JoinOneWorker();
  ASSERT_OK(worker->Call(CommitHeader(), UpdateFrames(0.5f), kTimeout));
  RpcClient control(context_, endpoint_, ClientEndpoint());
  pb::Header shutdown;
  shutdown.set_type(pb::SHUTDOWN);
  shutdown.set_control_token(testing::kTestControlToken);
  shutdown.mutable_shutdown()->set_reason("operator");
  ASSERT_OK(control.Call(shutdown, {}, kTimeout));
  // The next commit is still applied (nothing lost), then the worker is
  // told to stop.
  Result<Envelope> reply =
      worker->Call(CommitHeader(1), UpdateFrames(0.5f), kTimeout);
  ASSERT_OK(reply);
  ASSERT_EQ(reply->header.type(), pb::MODEL);
  EXPECT_TRUE(reply->header.model().stop());
  EXPECT_EQ(reply->header.model().version(), 2u);
  pb::Header bye;
  bye.set_type(pb::BYE);
  bye.mutable_bye()->mutable_stats()->set_steps(2);
  bye.mutable_bye()->mutable_stats()->set_commits(2);
  ASSERT_OK(worker->Call(bye, {}, kTimeout));
  workers_.clear();
  thread_.join();
  ASSERT_OK(run_status_);
  const pb::SiteSummary& summary = server_->summary();
  EXPECT_EQ(summary.commits(), 2u);
  EXPECT_EQ(summary.model_version(), 2u);
  EXPECT_NE(summary.stop_reason().find("operator"), std::string::npos);
  ASSERT_EQ(summary.workers_size(), 1);
  EXPECT_EQ(summary.workers(0).steps(), 2u);
  EXPECT_GE(summary.timeline_size(), 1);
  EXPECT_TRUE(std::filesystem::exists(out_dir_ + "/site-site-a.json"));
}

// ---- what one peer may cost the server (issue 13) --------------------------

TEST_F(SiteServerTest, ControlMessagesNeedTheJobsToken) {
  StartServer(1);
  RpcClient* worker = JoinOneWorker();
  RpcClient anyone(context_, endpoint_, ClientEndpoint());
  pb::Header shutdown;
  shutdown.set_type(pb::SHUTDOWN);
  shutdown.mutable_shutdown()->set_reason("hostile");
  ExpectError(anyone.Call(shutdown, {}, kTimeout), pb::ERROR_UNAUTHORIZED);
  // A wrong token of the right length is no better, nor is a worker.
  shutdown.set_control_token("meridianTestControlToken0123456789abcdeF");
  ExpectError(anyone.Call(shutdown, {}, kTimeout), pb::ERROR_UNAUTHORIZED);
  shutdown.clear_control_token();
  ExpectError(worker->Call(shutdown, {}, kTimeout), pb::ERROR_UNAUTHORIZED);
  pb::Header peers;
  peers.set_type(pb::SET_PEERS);
  peers.mutable_peers()->add_peer()->set_site("site-b");
  ExpectError(anyone.Call(peers, {}, kTimeout), pb::ERROR_UNAUTHORIZED);
  // Nothing was done: the job goes on.
  Result<Envelope> reply =
      worker->Call(CommitHeader(), UpdateFrames(0.5f), kTimeout);
  ASSERT_OK(reply);
  ASSERT_EQ(reply->header.type(), pb::MODEL);
  EXPECT_FALSE(reply->header.model().stop());
  Result<pb::SiteStatus> status =
      testing::QueryStatus(context_, endpoint_, kTimeout);
  ASSERT_OK(status);
  EXPECT_FALSE(status->finished());
}

TEST_F(SiteServerTest, APullForManyCopiesOfTheModelIsRefused) {
  StartServer(1);
  RpcClient* worker = JoinOneWorker();
  // 4000 ranges over the same tensor: a few hundred KB of request for a
  // reply of 4000 models. Refused, and the server serves on.
  const TensorInfo& tensor = model_->layout().tensors()[0];
  pb::Header pull;
  pull.set_type(pb::PULL);
  for (int i = 0; i < 4000; ++i) {
    pb::TensorSlice* range = pull.mutable_pull()->add_ranges();
    range->set_tensor(tensor.name);
    range->set_offset(0);
    range->set_length(tensor.size);
  }
  Result<Envelope> reply = worker->Call(pull, {}, kTimeout);
  ExpectError(reply, pb::ERROR_LIMIT);
  EXPECT_NE(reply->header.error().message().find("max_reply_floats"),
            std::string::npos);
  // As many floats as the model has are fine, overlapping or not.
  pb::Header fits;
  fits.set_type(pb::PULL);
  for (int i = 0; i < 2; ++i) {
    pb::TensorSlice* range = fits.mutable_pull()->add_ranges();
    range->set_tensor(tensor.name);
    range->set_length(tensor.size / 2);
  }
  Result<Envelope> model = worker->Call(fits, {}, kTimeout);
  ASSERT_OK(model);
  EXPECT_EQ(model->header.type(), pb::MODEL);
  EXPECT_EQ(model->payload.size(), 2u);
  ExpectModelUntouched(worker);
}

TEST_F(SiteServerTest, AWildSequenceNumberDoesNotLockAWorkerOut) {
  StartServer(1);
  zmq::socket_t socket(context_, zmq::socket_type::dealer);
  socket.set(zmq::sockopt::linger, 0);
  socket.connect(endpoint_);
  auto call = [&](pb::Header header, uint64_t sequence) {
    header.set_protocol_version(kProtocolVersion);
    *header.mutable_sender() = WorkerEndpoint(0);
    header.set_sequence(sequence);
    EXPECT_OK(SendMessage(socket, header));
    Result<Received> received = ReceiveMessage(socket, false, kTimeout);
    EXPECT_TRUE(received.ok() && received->message.has_value());
    return std::move(*received->message);
  };
  pb::Header pull;
  pull.set_type(pb::PULL);
  pull.mutable_pull();
  EXPECT_EQ(call(Hello(0), 1).header.type(), pb::WELCOME);
  for (uint64_t wild : {std::numeric_limits<uint64_t>::max(),
                        uint64_t{2} + (uint64_t{1} << 20)}) {
    Envelope refused = call(pull, wild);
    ASSERT_EQ(refused.header.type(), pb::ERROR);
    EXPECT_EQ(refused.header.error().code(), pb::ERROR_STALE);
  }
  // The window did not move: the worker's next number is still good.
  EXPECT_EQ(call(pull, 2).header.type(), pb::MODEL);
  EXPECT_EQ(call(pull, 2 + (uint64_t{1} << 20)).header.type(), pb::MODEL);
}

TEST_F(SiteServerTest, AFrameLargerThanTheLimitDropsOnlyItsConnection) {
  StartServer(1);
  RpcClient* worker = JoinOneWorker();
  // 4 MiB announced where the largest valid frame is 1 MiB (the header
  // limit; this model's tensors are smaller): ZeroMQ drops the connection.
  {
    zmq::socket_t hostile(context_, zmq::socket_type::dealer);
    hostile.set(zmq::sockopt::linger, 0);
    hostile.connect(endpoint_);
    std::vector<zmq::message_t> frames;
    frames.emplace_back(size_t{4} << 20);
    std::memset(frames.back().data(), 0x41, frames.back().size());
    zmq::send_multipart(hostile, frames);
    Result<Received> received =
        ReceiveMessage(hostile, false, std::chrono::milliseconds(1000));
    ASSERT_OK(received);
    EXPECT_TRUE(received->timed_out()) << "the oversized frame was answered";
  }
  ExpectModelUntouched(worker);
  Result<pb::SiteStatus> status =
      testing::QueryStatus(context_, endpoint_, kTimeout);
  ASSERT_OK(status);
  EXPECT_EQ(status->rejected(), 0u);  // never reached the server's code
}

TEST_F(SiteServerTest, AWorkerThatStopsReadingIsDroppedAndTheOthersServed) {
  StartServer(2);
  // Worker 1 speaks by hand and never reads: a small receive buffer so
  // that the server's queue for it fills soon.
  zmq::socket_t deaf(context_, zmq::socket_type::dealer);
  deaf.set(zmq::sockopt::linger, 0);
  deaf.set(zmq::sockopt::rcvbuf, 4096);
  deaf.set(zmq::sockopt::rcvhwm, 1);
  deaf.connect(endpoint_);
  uint64_t sequence = 0;
  auto send = [&](pb::Header header) {
    header.set_protocol_version(kProtocolVersion);
    *header.mutable_sender() = WorkerEndpoint(1);
    header.set_sequence(++sequence);
    return TrySendMessage(deaf, header).ok();
  };
  ASSERT_TRUE(send(Hello(1)));
  RpcClient* worker = NewWorkerClient(0);
  Result<Envelope> welcome = worker->Call(Hello(0), {}, kTimeout);
  ASSERT_OK(welcome);
  ASSERT_EQ(welcome->header.type(), pb::WELCOME);
  // The deaf worker asks for the model over and over; worker 0 keeps
  // committing and must be answered all along.
  pb::Header pull;
  pull.set_type(pb::PULL);
  pull.mutable_pull();
  uint64_t version = welcome->header.welcome().model_version();
  bool dropped = false;
  for (int round = 0; round < 2000 && !dropped; ++round) {
    for (int i = 0; i < 10; ++i) (void)send(pull);
    Result<Envelope> reply =
        worker->Call(CommitHeader(version), UpdateFrames(1e-6f), kTimeout);
    ASSERT_OK(reply) << "round " << round << ": " << reply.status();
    ASSERT_EQ(reply->header.type(), pb::MODEL) << DescribeHeader(reply->header);
    version = reply->header.model().version();
    if (round % 20 == 19) {
      Result<pb::SiteStatus> status =
          testing::QueryStatus(context_, endpoint_, kTimeout);
      ASSERT_OK(status);
      dropped = status->workers_dead() == 1;
    }
  }
  EXPECT_TRUE(dropped) << "the deaf worker was never declared dead";
}

// The process's resident memory.
uint64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  uint64_t pages = 0;
  uint64_t resident = 0;
  statm >> pages >> resident;
  return resident * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
}

// A stranger streams one message that never ends into the worker endpoint
// (raw ZMTP, 1 KiB frames, as fast as the kernel takes them): the front
// stops reading it at its credit, so the server does not grow with it
// (without the front, ZeroMQ kept every frame), and the joined worker's
// commits are applied and answered all along.
TEST_F(SiteServerTest, AnEndlessMessageDoesNotGrowTheServer) {
  StartServer(1);
  RpcClient* worker = JoinOneWorker();
  ASSERT_OK(worker->Call(CommitHeader(0), UpdateFrames(1e-6f), kTimeout));
  const uint64_t before = ResidentBytes();
  const int hostile = testing::ConnectRawTcp(endpoint_);
  ASSERT_GE(hostile, 0);
  ASSERT_TRUE(testing::ZmtpHandshake(hostile));
  constexpr uint64_t kAttempt = uint64_t{256} << 20;
  const uint64_t sent =
      testing::SendEndlessMessage(hostile, 1024, kAttempt, [] {});
  EXPECT_LT(sent, kAttempt) << "the server read the whole endless message";
  // The front holds at most the stranger's credit of it.
  const EndpointBounds bounds =
      EndpointBounds::FromConfig(job_.server().limits(), model_->layout());
  Result<pb::SiteStatus> status =
      testing::QueryStatus(context_, endpoint_, kTimeout);
  ASSERT_OK(status);
  ASSERT_TRUE(status->has_front());
  EXPECT_GT(status->front().held_bytes(), 0u);
  EXPECT_LE(status->front().held_bytes(),
            bounds.untrusted_connection_bytes + 4096);
  EXPECT_GE(status->front().connections(), 2u);
  for (int i = 0; i < 20; ++i) {
    Result<Envelope> reply =
        worker->Call(CommitHeader(0), UpdateFrames(1e-6f), kTimeout);
    ASSERT_OK(reply) << "commit " << i;
    EXPECT_EQ(reply->header.type(), pb::MODEL) << DescribeHeader(reply->header);
  }
  const uint64_t after = ResidentBytes();
  EXPECT_LT(after, before + (uint64_t{32} << 20))
      << "grew by " << (after - before) << " bytes while " << sent
      << " bytes of a message that never ends were sent";
  ::close(hostile);
}

// Connections that have not joined pipeline far more requests than the
// server lets wait: the excess is refused with ERROR_BUSY (nothing done),
// and the joined worker is served all along, never refused so. (With the
// front's message budget out of the way: it would pace the flood first.)
TEST_F(SiteServerTest, AnonymousFloodIsAnsweredBusyAndTheJoinedWorkerServed) {
  limits_.set_untrusted_messages_per_s(1e9);
  StartServer(1);
  RpcClient* worker = JoinOneWorker();
  constexpr int kConnections = 64;
  constexpr int kRequestsEach = 32;  // 2,048 in all; 256 may wait
  std::vector<zmq::socket_t> flood;
  for (int c = 0; c < kConnections; ++c) {
    flood.emplace_back(context_, zmq::socket_type::dealer);
    flood.back().set(zmq::sockopt::linger, 0);
    flood.back().connect(endpoint_);
  }
  uint64_t sequence = 0;
  for (zmq::socket_t& socket : flood) {
    for (int i = 0; i < kRequestsEach; ++i) {
      pb::Header status = MakeHeader(pb::STATUS_REQUEST, ClientEndpoint(),
                                     ++sequence);
      ASSERT_OK(TrySendMessage(socket, status));
    }
  }
  for (int i = 0; i < 20; ++i) {
    Envelope model = Pull(worker);
    ASSERT_EQ(model.header.type(), pb::MODEL) << "pull " << i;
  }
  // Replies to connections that do not read may be dropped; read until both
  // an answer and an ERROR_BUSY came (either may come first).
  std::vector<zmq::pollitem_t> items;
  for (zmq::socket_t& socket : flood) {
    items.push_back({socket.handle(), 0, ZMQ_POLLIN, 0});
  }
  std::string busy;
  int status_replies = 0;
  const auto deadline = std::chrono::steady_clock::now() + kTimeout * 3;
  while ((busy.empty() || status_replies == 0) &&
         std::chrono::steady_clock::now() < deadline) {
    zmq::poll(items.data(), items.size(), milliseconds(100));
    for (size_t c = 0; c < items.size(); ++c) {
      if (!(items[c].revents & ZMQ_POLLIN)) continue;
      Result<Received> received =
          ReceiveMessage(flood[c], false, milliseconds(0));
      ASSERT_OK(received);
      ASSERT_TRUE(received->message.has_value());
      const pb::Header& reply = received->message->header;
      if (reply.type() == pb::STATUS_REPLY) {
        ++status_replies;
        continue;
      }
      ASSERT_EQ(reply.type(), pb::ERROR) << DescribeHeader(reply);
      ASSERT_EQ(reply.error().code(), pb::ERROR_BUSY)
          << reply.error().message();
      if (busy.empty()) busy = reply.error().message();
    }
  }
  EXPECT_THAT(busy, ::testing::HasSubstr("have not joined"))
      << status_replies << " status replies and no ERROR_BUSY";
  EXPECT_GT(status_replies, 0);
  // The worker is still served after the flood.
  EXPECT_EQ(Pull(worker).header.type(), pb::MODEL);
}

// The front paces what connections that have not joined send
// (server.limits.untrusted_messages_per_s): a flood waits for the budget,
// is answered in turn, and the joined worker is served all along.
TEST_F(SiteServerTest, AnonymousFloodWaitsForTheFrontsBudget) {
  limits_.set_untrusted_messages_per_s(200);
  StartServer(1);
  RpcClient* worker = JoinOneWorker();
  std::vector<zmq::socket_t> flood;
  uint64_t sequence = 0;
  for (int c = 0; c < 16; ++c) {
    flood.emplace_back(context_, zmq::socket_type::dealer);
    flood.back().set(zmq::sockopt::linger, 0);
    flood.back().connect(endpoint_);
    for (int i = 0; i < 32; ++i) {
      pb::Header status = MakeHeader(pb::STATUS_REQUEST, ClientEndpoint(),
                                     ++sequence);
      ASSERT_OK(TrySendMessage(flood.back(), status));
    }
  }
  for (int i = 0; i < 20; ++i) {
    Envelope model = Pull(worker);
    ASSERT_EQ(model.header.type(), pb::MODEL) << "pull " << i;
  }
  // The flood is answered, at the budget's pace (an ERROR_BUSY is an
  // answer too: a site loop stalled by a loaded machine may see its intake
  // fill even at this pace).
  Result<Received> first = ReceiveMessage(flood.back(), false, kTimeout);
  ASSERT_OK(first);
  ASSERT_TRUE(first->message.has_value()) << "no answer to the flood";
  const pb::Header& answer = first->message->header;
  EXPECT_TRUE(answer.type() == pb::STATUS_REPLY ||
              (answer.type() == pb::ERROR &&
               answer.error().code() == pb::ERROR_BUSY))
      << DescribeHeader(answer);
  Result<pb::SiteStatus> status =
      testing::QueryStatus(context_, endpoint_, kTimeout);
  ASSERT_OK(status);
  EXPECT_GT(status->front().budget_waits(), 0u);
  EXPECT_EQ(Pull(worker).header.type(), pb::MODEL);
}

TEST_F(SiteServerTest, ASiteWhoseWorkersAllLeftBeforeTrainingFinishes) {
  StartServer(2);
  // Both workers join and leave while WELCOME still waits for the other:
  // nobody is left to wait for.
  std::vector<zmq::socket_t> sockets;
  for (uint32_t index = 0; index < 2; ++index) {
    zmq::socket_t& socket =
        sockets.emplace_back(context_, zmq::socket_type::dealer);
    socket.set(zmq::sockopt::linger, 0);
    socket.connect(endpoint_);
    pb::Header hello = Hello(index);
    hello.set_protocol_version(kProtocolVersion);
    *hello.mutable_sender() = WorkerEndpoint(index);
    hello.set_sequence(1);
    hello.mutable_hello()->set_incarnation(100 + index);
    ASSERT_OK(SendMessage(socket, hello));
    pb::Header bye = MakeHeader(pb::BYE, WorkerEndpoint(index), 2);
    bye.mutable_bye();
    ASSERT_OK(SendMessage(socket, bye));
  }
  // The second HELLO completes the site, so worker 1 may get its WELCOME
  // before its BYE is read; either way the site finishes, well before its
  // join timeout.
  thread_.join();
  EXPECT_OK(run_status_);
  EXPECT_EQ(server_->summary().commits(), 0u);
}

// Every policy refuses the same bad commits before it sees them: one based
// on a model version the site never had, one from a worker the site does
// not know, one whose slices do not match the model's shape. The model is
// untouched and the next good commit is applied.
class PolicyBadInputTest
    : public SiteServerTest,
      public ::testing::WithParamInterface<pb::PolicyKind> {};

TEST_P(PolicyBadInputTest, BadCommitsAreRefusedAndTheModelIsUntouched) {
  StartServer(1, GetParam());
  RpcClient* worker = JoinOneWorker();
  ExpectError(worker->Call(CommitHeader(/*base_version=*/7), UpdateFrames(1.0f),
                           kTimeout),
              pb::ERROR_STALE);
  RpcClient intruder(context_, endpoint_, WorkerEndpoint(3));
  ExpectError(intruder.Call(CommitHeader(), UpdateFrames(1.0f), kTimeout),
              pb::ERROR_UNKNOWN_SENDER);
  pb::Header wrong_shape = CommitHeader();
  wrong_shape.mutable_slices(0)->set_length(wrong_shape.slices(0).length() - 1);
  ExpectError(worker->Call(wrong_shape, UpdateFrames(1.0f), kTimeout),
              pb::ERROR_SIZE_MISMATCH);
  ExpectModelUntouched(worker);
  Result<Envelope> reply =
      worker->Call(CommitHeader(), UpdateFrames(0.5f), kTimeout);
  ASSERT_OK(reply);
  ASSERT_EQ(reply->header.type(), pb::MODEL);
  EXPECT_EQ(reply->header.model().version(), 1u);
}

INSTANTIATE_TEST_SUITE_P(Policies, PolicyBadInputTest,
                         ::testing::Values(pb::ASYNC, pb::BSP, pb::SSP,
                                           pb::FIXED_ADACOMM, pb::ADACOMM,
                                           pb::ADSP),
                         [](const auto& info) {
                           return pb::PolicyKind_Name(info.param);
                         });

}  // namespace
}  // namespace meridian
