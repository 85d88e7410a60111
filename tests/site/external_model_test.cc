// A live site server (real ZeroMQ sockets on loopback, in a thread of this
// process) serving a model it does not implement (model.kind EXTERNAL):
// its layout and initial values from a safetensors file, its evaluation by
// an evaluator speaking the protocol over the worker endpoint.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <cstring>
#include <limits>
#include <thread>
#include <zmq.hpp>

#include "meridian/config/config.h"
#include "meridian/net/message.h"
#include "meridian/net/transport.h"
#include "meridian/site/site_server.h"
#include "meridian/train/safetensors.h"
#include "testing/site_control.h"
#include "testing/status_matchers.h"
#include "testing/test_data.h"
#include "testing/text.h"

namespace meridian {
namespace {

using ::meridian::testing::StatusIs;
using ::testing::HasSubstr;
using std::chrono::milliseconds;
constexpr milliseconds kTimeout(20000);

std::vector<std::byte> Bytes(const void* data, size_t size) {
  std::vector<std::byte> out(size);
  std::memcpy(out.data(), data, size);
  return out;
}

// The user's model as its weights file holds it: a float32 weight, a
// bfloat16 bias, a float32 scalar, and an int64 step counter that stays
// with the workers.
struct UserModel {
  std::vector<float> weight = {0.5f, -1.25f, 2.0f, 0.0f, 3.5f, -0.75f};
  // 1.0, -2.0, 0.5, 3.0 in bfloat16 (the upper halves of the floats).
  std::vector<uint16_t> bias = {0x3f80, 0xc000, 0x3f00, 0x4040};
  float scale = 0.25f;
  int64_t steps = 17;

  Status Write(const std::string& path) const {
    const auto w = Bytes(weight.data(), weight.size() * 4);
    const auto b = Bytes(bias.data(), bias.size() * 2);
    const auto s = Bytes(&scale, 4);
    const auto n = Bytes(&steps, 8);
    const std::vector<TensorToWrite> tensors = {
        {"fc.weight", ElementType::kF32, {2, 3}, w},
        {"fc.bias", ElementType::kBF16, {4}, b},
        {"scale", ElementType::kF32, {}, s},
        {"bn.num_batches_tracked", ElementType::kI64, {}, n},
    };
    return WriteSafetensors(path, tensors, {{"format", "pt"}});
  }
  ModelLayout Layout() const {
    ModelLayout layout;
    EXPECT_OK(layout.Add("fc.weight", {2, 3}));
    EXPECT_OK(layout.Add("fc.bias", {4}, ElementType::kBF16));
    EXPECT_OK(layout.Add("scale", {}));
    return layout;
  }
  std::vector<float> Values() const {
    std::vector<float> values = weight;
    for (float b : {1.0f, -2.0f, 0.5f, 3.0f}) values.push_back(b);
    values.push_back(scale);
    return values;
  }
};

pb::Endpoint Sender(pb::Role role, uint32_t id = 0) {
  pb::Endpoint self;
  self.set_site("site-a");
  self.set_role(role);
  self.set_id(id);
  return self;
}

pb::Header Hello(const ModelLayout& layout, uint32_t index = 0) {
  pb::Header hello;
  hello.set_type(pb::HELLO);
  hello.mutable_hello()->set_worker_index(index);
  hello.mutable_hello()->set_incarnation(42);
  LayoutToSpecs(layout, hello.mutable_hello()->mutable_layout());
  return hello;
}

pb::Header EvalResultHeader(uint64_t task_id,
                  std::vector<std::pair<std::string, double>> metrics) {
  pb::Header header;
  header.set_type(pb::EVAL_RESULT);
  pb::EvalResult* result = header.mutable_eval_result();
  result->set_task_id(task_id);
  result->set_samples(1000);
  for (const auto& [name, value] : metrics) {
    pb::MetricValue* metric = result->add_metrics();
    metric->set_name(name);
    metric->set_value(value);
  }
  return header;
}

std::vector<float> FloatsOf(const Envelope& message) {
  std::vector<float> out;
  for (const zmq::message_t& frame : message.payload) {
    const size_t n = frame.size() / sizeof(float);
    const size_t start = out.size();
    out.resize(start + n);
    std::memcpy(out.data() + start, frame.data(), frame.size());
  }
  return out;
}

class ExternalModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir("external-model");
    weights_ = dir_ + "/initial.safetensors";
    ASSERT_OK(model_.Write(weights_));
    job_ = testing::SmallJob(dir_, /*workers=*/1);
    pb::ModelConfig* model = job_.mutable_model();
    model->Clear();
    model->set_kind(pb::EXTERNAL);
    model->set_weights(weights_);
    pb::MetricConfig* accuracy = model->add_metrics();
    accuracy->set_name("accuracy");
    pb::MetricConfig* loss = model->add_metrics();
    loss->set_name("loss");
    loss->set_higher_is_better(false);
    job_.set_target_accuracy(0);
    job_.set_time_budget_s(300);
    job_.mutable_server()->set_eval_period_s(0.2);
  }

  Status StartServer() {
    SiteServerOptions options;
    options.job = job_;
    options.site = "site-a";
    options.bind = "tcp://127.0.0.1:*";
    options.control_token = testing::kTestControlToken;
    options.out_dir = dir_;
    Result<std::unique_ptr<SiteServer>> server =
        SiteServer::Create(std::move(options));
    if (!server.ok()) return server.status();
    server_ = std::move(*server);
    thread_ = std::thread([this] { run_status_ = server_->Run(); });
    return Status::Ok();
  }

  // Joins worker 0 (training starts) and returns the WELCOME.
  Envelope JoinWorker() {
    worker_ = std::make_unique<RpcClient>(context_, server_->endpoint(),
                                          Sender(pb::ROLE_WORKER));
    Result<Envelope> welcome =
        worker_->Call(Hello(model_.Layout()), {}, kTimeout);
    EXPECT_OK(welcome);
    EXPECT_EQ(welcome->header.type(), pb::WELCOME);
    return std::move(welcome).value();
  }

  RpcClient* Evaluator() {
    if (!evaluator_) {
      evaluator_ = std::make_unique<RpcClient>(
          context_, server_->endpoint(), Sender(pb::ROLE_EVALUATOR));
    }
    return evaluator_.get();
  }

  // Ends the job; an evaluator still connected answers its tasks (the
  // final evaluation) with `final_metrics` until it is told to stop.
  void Finish(std::optional<uint64_t> pending_task = std::nullopt,
              std::vector<std::pair<std::string, double>> final_metrics = {
                  {"accuracy", 0.9}, {"loss", 0.3}}) {
    pb::Header shutdown;
    shutdown.set_type(pb::SHUTDOWN);
    shutdown.set_control_token(testing::kTestControlToken);
    shutdown.mutable_shutdown()->set_reason("test over");
    RpcClient control(context_, server_->endpoint(), Sender(pb::ROLE_CLIENT));
    EXPECT_OK(control.Call(shutdown, {}, kTimeout));
    if (worker_) {
      pb::Header bye;
      bye.set_type(pb::BYE);
      bye.mutable_bye();
      (void)worker_->Call(bye, {}, kTimeout);
    }
    uint64_t task = pending_task.value_or(0);
    while (evaluator_ && pending_task) {
      Result<Envelope> next =
          evaluator_->Call(EvalResultHeader(task, final_metrics), {}, kTimeout);
      ASSERT_OK(next);
      ASSERT_EQ(next->header.type(), pb::EVAL_TASK)
          << DescribeHeader(next->header);
      if (next->header.eval_task().stop()) break;
      task = next->header.eval_task().task_id();
    }
    thread_.join();
    EXPECT_OK(run_status_);
  }

  void TearDown() override {
    if (thread_.joinable()) Finish();
  }

  UserModel model_;
  std::string dir_;
  std::string weights_;
  pb::JobConfig job_;
  zmq::context_t context_;
  std::unique_ptr<SiteServer> server_;
  std::thread thread_;
  Status run_status_;
  std::unique_ptr<RpcClient> worker_;
  std::unique_ptr<RpcClient> evaluator_;
};

TEST_F(ExternalModelTest, ServesTheWeightsFilesFloatTensorsBitIdentical) {
  ASSERT_OK(StartServer());
  const Envelope welcome = JoinWorker();
  // The layout is the file's floating-point tensors in data order; the
  // integer step counter is not in it.
  Result<ModelLayout> layout = LayoutFromSpecs(welcome.header.welcome().layout());
  ASSERT_OK(layout);
  EXPECT_TRUE(*layout == model_.Layout()) << layout->DebugString();
  EXPECT_EQ(FloatsOf(welcome), model_.Values());
}

TEST_F(ExternalModelTest, AWorkerWhoseModelDiffersIsRefusedNamingTheTensor) {
  ASSERT_OK(StartServer());
  RpcClient worker(context_, server_->endpoint(), Sender(pb::ROLE_WORKER));
  ModelLayout wrong_shape;
  ASSERT_OK(wrong_shape.Add("fc.weight", {3, 2}));
  ASSERT_OK(wrong_shape.Add("fc.bias", {4}, ElementType::kBF16));
  ASSERT_OK(wrong_shape.Add("scale", {}));
  Result<Envelope> reply = worker.Call(Hello(wrong_shape), {}, kTimeout);
  ASSERT_OK(reply);
  ASSERT_EQ(reply->header.type(), pb::ERROR);
  EXPECT_EQ(reply->header.error().code(), pb::ERROR_LAYOUT_MISMATCH);
  EXPECT_THAT(reply->header.error().message(),
              HasSubstr("'fc.weight': [3,2] F32 in the worker's model, [2,3] "
                        "F32 in the site's model"));

  ModelLayout wrong_type;
  ASSERT_OK(wrong_type.Add("fc.weight", {2, 3}));
  ASSERT_OK(wrong_type.Add("fc.bias", {4}));  // F32, the file says BF16
  ASSERT_OK(wrong_type.Add("scale", {}));
  reply = worker.Call(Hello(wrong_type), {}, kTimeout);
  ASSERT_OK(reply);
  ASSERT_EQ(reply->header.type(), pb::ERROR);
  EXPECT_THAT(reply->header.error().message(),
              HasSubstr("'fc.bias': [4] F32 in the worker's model, [4] BF16"));

  // The model is untouched: a worker with the right model gets the file's.
  EXPECT_EQ(FloatsOf(JoinWorker()), model_.Values());
}

TEST_F(ExternalModelTest, TheEvaluatorsMetricsMakeTheCurveAndTheFinalPoint) {
  ASSERT_OK(StartServer());
  JoinWorker();
  RpcClient* evaluator = Evaluator();
  Result<Envelope> task = evaluator->Call(Hello(model_.Layout()), {}, kTimeout);
  ASSERT_OK(task);
  ASSERT_EQ(task->header.type(), pb::EVAL_TASK)
      << DescribeHeader(task->header) << ": " << task->header.error().message();
  EXPECT_EQ(task->header.eval_task().split(), pb::VALIDATION);
  EXPECT_EQ(FloatsOf(*task), model_.Values());
  // Two curve points, then the job ends and the final point comes.
  task = evaluator->Call(
      EvalResultHeader(task->header.eval_task().task_id(), {{"accuracy", 0.5}, {"loss", 1.5}}),
      {}, kTimeout);
  ASSERT_OK(task);
  ASSERT_EQ(task->header.type(), pb::EVAL_TASK);
  task = evaluator->Call(
      EvalResultHeader(task->header.eval_task().task_id(), {{"accuracy", 0.6}, {"loss", 1.2}}),
      {}, kTimeout);
  ASSERT_OK(task);
  ASSERT_EQ(task->header.type(), pb::EVAL_TASK);
  Finish(task->header.eval_task().task_id());

  const pb::SiteSummary& summary = server_->summary();
  ASSERT_GE(summary.timeline_size(), 3);
  EXPECT_DOUBLE_EQ(summary.timeline(0).metric(), 0.5);
  EXPECT_DOUBLE_EQ(summary.timeline(0).accuracy(), 0.5);
  EXPECT_DOUBLE_EQ(summary.timeline(0).loss(), 1.5);
  ASSERT_EQ(summary.timeline(0).metrics_size(), 2);
  EXPECT_EQ(summary.timeline(0).metrics(1).name(), "loss");
  EXPECT_DOUBLE_EQ(summary.final_metric(), 0.9);
  EXPECT_FALSE(summary.has_no_curve_reason());

  // The final model, by name and in each tensor's own type.
  Result<TensorFile> file = ReadSafetensors(dir_ + "/model-site-a.safetensors");
  ASSERT_OK(file);
  ASSERT_EQ(file->tensors.size(), 3u);
  EXPECT_EQ(file->Find("fc.bias")->type, ElementType::kBF16);
}

TEST_F(ExternalModelTest, BadResultsAreRefusedNamingTheMetricAndTheJobGoesOn) {
  ASSERT_OK(StartServer());
  JoinWorker();
  RpcClient* evaluator = Evaluator();
  Result<Envelope> task = evaluator->Call(Hello(model_.Layout()), {}, kTimeout);
  ASSERT_OK(task);
  ASSERT_EQ(task->header.type(), pb::EVAL_TASK);

  Result<Envelope> reply = evaluator->Call(
      EvalResultHeader(task->header.eval_task().task_id(),
             {{"accuracy", std::numeric_limits<double>::quiet_NaN()}}),
      {}, kTimeout);
  ASSERT_OK(reply);
  ASSERT_EQ(reply->header.type(), pb::ERROR);
  EXPECT_EQ(reply->header.error().code(), pb::ERROR_NON_FINITE);
  EXPECT_THAT(reply->header.error().message(), HasSubstr("'accuracy' is NaN"));

  // The next task (asked for with task id 0), answered with a metric the
  // job does not name.
  task = evaluator->Call(EvalResultHeader(0, {}), {}, kTimeout);
  ASSERT_OK(task);
  ASSERT_EQ(task->header.type(), pb::EVAL_TASK);
  reply = evaluator->Call(
      EvalResultHeader(task->header.eval_task().task_id(), {{"perplexity", 12.0}}), {},
      kTimeout);
  ASSERT_OK(reply);
  ASSERT_EQ(reply->header.type(), pb::ERROR);
  EXPECT_EQ(reply->header.error().code(), pb::ERROR_MALFORMED);
  EXPECT_THAT(reply->header.error().message(),
              HasSubstr("metric 'perplexity' is not one the job names"));

  // A good result still makes a point.
  task = evaluator->Call(EvalResultHeader(0, {}), {}, kTimeout);
  ASSERT_OK(task);
  Finish(task->header.eval_task().task_id());
  EXPECT_GE(server_->summary().timeline_size(), 1);
}

TEST_F(ExternalModelTest, ASiteWithoutAnEvaluatorTrainsAndSaysWhyItHasNoCurve) {
  ASSERT_OK(StartServer());
  JoinWorker();
  Finish();
  const pb::SiteSummary& summary = server_->summary();
  EXPECT_EQ(summary.timeline_size(), 0);
  EXPECT_THAT(summary.no_curve_reason(), HasSubstr("no evaluator joined"));
  // The job's data { } names no files here: no histogram, and no failure.
  EXPECT_EQ(summary.label_histogram_size(), 0);
}

TEST_F(ExternalModelTest, TheJobsDataGivesTheSummaryItsLabelHistogram) {
  // The programs' data (meridian.data splits it as the built-in workers
  // do): the site describes its share, here the classes {0, 1, 2} alone.
  testing::SyntheticDataOptions options;
  options.train_samples = 300;
  options.test_samples = 50;
  ASSERT_OK(testing::WriteSyntheticIdx(dir_, options));
  pb::PartitionConfig* partition =
      job_.mutable_data()->mutable_site_partition();
  partition->set_kind(pb::LABEL_SUBSET);
  pb::ClassList* classes = partition->add_classes();
  for (uint32_t label : {0, 1, 2}) classes->add_label(label);
  job_.mutable_data()->set_train_limit(200);
  ASSERT_OK(StartServer());
  JoinWorker();
  Finish();
  const pb::SiteSummary& summary = server_->summary();
  ASSERT_EQ(summary.label_histogram_size(), 10);
  uint64_t total = 0;
  for (int label = 0; label < 10; ++label) {
    EXPECT_EQ(summary.label_histogram(label) > 0, label < 3) << label;
    total += summary.label_histogram(label);
  }
  EXPECT_LE(total, 200u);  // train_limit
  EXPECT_THAT(summary.partition(), HasSubstr("LABEL_SUBSET"));
}

TEST_F(ExternalModelTest, ABuiltInSiteRefusesAnEvaluator) {
  // (The evaluator role is for models the server does not implement.)
  job_ = testing::SmallJob(dir_, 1);
  testing::SyntheticDataOptions data;
  data.train_samples = 100;
  data.test_samples = 20;
  ASSERT_OK(testing::WriteSyntheticIdx(dir_, data));
  ASSERT_OK(StartServer());
  RpcClient evaluator(context_, server_->endpoint(),
                      Sender(pb::ROLE_EVALUATOR));
  Result<Envelope> reply = evaluator.Call(Hello(ModelLayout()), {}, kTimeout);
  ASSERT_OK(reply);
  ASSERT_EQ(reply->header.type(), pb::ERROR);
  EXPECT_THAT(reply->header.error().message(),
              HasSubstr("evaluates its built-in model itself"));
  pb::Header shutdown;
  shutdown.set_type(pb::SHUTDOWN);
  shutdown.set_control_token(testing::kTestControlToken);
  shutdown.mutable_shutdown();
  RpcClient control(context_, server_->endpoint(), Sender(pb::ROLE_CLIENT));
  EXPECT_OK(control.Call(shutdown, {}, kTimeout));
  thread_.join();
}

TEST_F(ExternalModelTest, MissingTruncatedOrCorruptWeightsAreRefusedByName) {
  SiteServerOptions options;
  options.site = "site-a";
  options.bind = "tcp://127.0.0.1:*";

  job_.mutable_model()->set_weights(dir_ + "/missing.safetensors");
  options.job = job_;
  EXPECT_THAT(SiteServer::Create(options),
              StatusIs(StatusCode::kNotFound, HasSubstr("missing.safetensors")));

  const std::string truncated = dir_ + "/truncated.safetensors";
  {
    std::string bytes = testing::ReadFile(weights_);
    std::ofstream(truncated, std::ios::binary)
        << bytes.substr(0, bytes.size() - 5);
  }
  job_.mutable_model()->set_weights(truncated);
  options.job = job_;
  EXPECT_THAT(SiteServer::Create(options),
              StatusIs(StatusCode::kDataLoss,
                       ::testing::AllOf(HasSubstr("truncated.safetensors"),
                                        HasSubstr("truncated"))));

  const std::string integers = dir_ + "/integers.safetensors";
  const int64_t steps = 3;
  const auto bytes = Bytes(&steps, 8);
  const std::vector<TensorToWrite> only_steps = {
      {"steps", ElementType::kI64, {}, bytes}};
  ASSERT_OK(WriteSafetensors(integers, only_steps, {}));
  job_.mutable_model()->set_weights(integers);
  options.job = job_;
  EXPECT_THAT(SiteServer::Create(options),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("no floating-point tensor")));
}

}  // namespace
}  // namespace meridian
