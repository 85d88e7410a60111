// The worker endpoint under CURVE (site.worker_curve_public_key): a live
// site server (a thread of this process, real ZeroMQ sockets on loopback)
// admits `meridian worker` processes holding the workers' key, which join
// and train; a plaintext client and a client with another key get no
// answer at all and leave the model untouched; a worker with the wrong key
// file fails before it connects; the job file's worker key is validated
// with line and column; `meridian run` refuses a worker key without
// security.key_dir.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <optional>
#include <thread>
#include <zmq.hpp>

#include "meridian/config/config.h"
#include "meridian/net/message.h"
#include "meridian/train/model.h"
#include "meridian/report/report.h"
#include "meridian/net/security.h"
#include "meridian/site/site_server.h"
#include "meridian/net/transport.h"
#include "meridian/core/process.h"
#include "testing/processes.h"
#include "testing/site_control.h"
#include "testing/test_data.h"
#include "testing/status_matchers.h"
#include "testing/stderr_capture.h"
#include "testing/text.h"

namespace meridian {
namespace {

using ::meridian::testing::Contains;

using std::chrono::milliseconds;
constexpr milliseconds kLong(60000);
// How long a refused client waits for an answer that must not come.
constexpr milliseconds kNoAnswer(1500);
constexpr char kSite[] = "site-a";


// Sets (or, with nullptr, unsets) an environment variable for a scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value != nullptr) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

CurveKeyPair NewPair() {
  Result<CurveKeyPair> pair = GenerateCurveKeyPair();
  EXPECT_OK(pair);
  return pair.ok() ? *pair : CurveKeyPair();
}

pb::Endpoint Client() {
  pb::Endpoint self;
  self.set_role(pb::ROLE_CLIENT);
  return self;
}

class WorkerCurveTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    data_dir_ = new std::string(testing::MakeTempDir("worker-curve-data"));
    testing::SyntheticDataOptions options;
    options.train_samples = 200;
    options.test_samples = 50;
    ASSERT_OK(testing::WriteSyntheticIdx(*data_dir_, options));
  }

  void SetUp() override {
    ::unsetenv(kSecretKeyEnv);
    ASSERT_TRUE(CurveAvailable());
    dir_ = testing::MakeTempDir("worker-curve");
    key_dir_ = dir_ + "/keys";
    site_keys_ = NewPair();
    worker_keys_ = NewPair();
    // What `meridian keygen --site site-a --out keys` and `... --out
    // keys/workers` write.
    ASSERT_OK(WriteCurveKeyFiles(key_dir_, kSite, site_keys_));
    ASSERT_OK(WriteCurveKeyFiles(key_dir_ + "/workers", kSite, worker_keys_));
  }

  void TearDown() override {
    if (server_thread_.joinable()) {
      stop_.store(true);
      server_thread_.join();
    }
  }

  // One site with CURVE on its worker endpoint.
  pb::JobConfig Job(uint32_t workers) const {
    pb::JobConfig job = testing::SmallJob(*data_dir_, workers, /*hidden=*/8);
    job.mutable_site(0)->set_curve_public_key(site_keys_.public_key);
    job.mutable_site(0)->set_worker_curve_public_key(worker_keys_.public_key);
    job.mutable_security()->set_key_dir(key_dir_);
    EXPECT_TRUE(ValidateJobConfig(job).empty())
        << FormatConfigIssues("job", ValidateJobConfig(job));
    return job;
  }

  // Creates the site server (its key from <key_dir>/site-a.key) and runs it
  // in server_thread_.
  void StartServer(const pb::JobConfig& job) {
    SiteServerOptions options;
    options.job = job;
    options.site = kSite;
    options.bind = "tcp://127.0.0.1:*";
    options.out_dir = dir_;
    options.control_token = testing::kTestControlToken;
    options.stop_requested = &stop_;
    Result<std::unique_ptr<SiteServer>> server =
        SiteServer::Create(std::move(options));
    ASSERT_OK(server);
    server_ = std::move(*server);
    initial_ = server_->Snapshot();
    server_thread_ = std::thread([this] {
      run_status_ = server_->Run();
      done_.store(true);
    });
  }

  // Waits for Run() to return.
  void AwaitServer() {
    ASSERT_TRUE(testing::WaitFor([&] { return done_.load(); }, kLong))
        << "the site server did not finish";
    server_thread_.join();
  }

  // A client of the worker endpoint: plaintext, or CURVE with `own` and
  // the site's public key.
  std::unique_ptr<RpcClient> MakeClient(
      const std::optional<CurveKeyPair>& own) {
    auto client =
        std::make_unique<RpcClient>(context_, server_->endpoint(), Client());
    if (own) {
      EXPECT_OK(client
                      ->SetCurve(own->public_key, own->secret_key,
                                 site_keys_.public_key));
    }
    return client;
  }

  // Expects no answer at all to a HELLO (worker 0) and a STATUS_REQUEST.
  void ExpectNoAnswer(RpcClient& client) {
    Result<std::unique_ptr<Model>> model = MakeModel(Job(1).model(), 784, 10);
    ASSERT_OK(model);
    pb::Header hello;
    hello.set_type(pb::HELLO);
    hello.mutable_hello()->set_worker_index(0);
    hello.mutable_hello()->set_incarnation(7);
    LayoutToSpecs((*model)->layout(), hello.mutable_hello()->mutable_layout());
    Result<Envelope> welcome = client.Call(hello, {}, kNoAnswer);
    ASSERT_FALSE(welcome.ok()) << DescribeHeader(welcome->header);
    EXPECT_EQ(welcome.status().code(), StatusCode::kDeadlineExceeded)
        << welcome.status();
    pb::Header status;
    status.set_type(pb::STATUS_REQUEST);
    Result<Envelope> reply = client.Call(status, {}, kNoAnswer);
    ASSERT_FALSE(reply.ok()) << DescribeHeader(reply->header);
    EXPECT_EQ(reply.status().code(), StatusCode::kDeadlineExceeded)
        << reply.status();
  }

  // Ends the job over a connection with the workers' key: the positive
  // control of the refusals (the same endpoint answers the right key).
  void ShutdownWithWorkerKey() {
    std::unique_ptr<RpcClient> client = MakeClient(worker_keys_);
    pb::Header request;
    request.set_type(pb::SHUTDOWN);
    request.set_control_token(testing::kTestControlToken);
    request.mutable_shutdown()->set_reason("test done");
    Result<Envelope> reply = client->Call(request, {}, kLong);
    ASSERT_OK(reply);
    EXPECT_EQ(reply->header.type(), pb::STATUS_REPLY);
  }

  std::string WorkerKeyFile() const {
    return key_dir_ + "/workers/" + kSite + ".key";
  }

  std::vector<std::string> WorkerArgv(const std::string& job_path,
                                      uint32_t index) const {
    return {MERIDIAN_BINARY, "worker",
            "--config",      job_path,
            "--site",        kSite,
            "--index",       std::to_string(index),
            "--connect",     server_->endpoint()};
  }

  static std::string* data_dir_;
  std::string dir_;
  std::string key_dir_;
  CurveKeyPair site_keys_;
  CurveKeyPair worker_keys_;
  zmq::context_t context_;
  std::unique_ptr<SiteServer> server_;
  std::vector<float> initial_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> done_{false};
  Status run_status_;
  std::thread server_thread_;
};

std::string* WorkerCurveTest::data_dir_ = nullptr;

// (a) Two `meridian worker` processes with the workers' key, one from
// --secret-key and one from $MERIDIAN_SECRET_KEY, join and train.
TEST_F(WorkerCurveTest, WorkersWithTheKeyJoinAndTrain) {
  pb::JobConfig job = Job(2);
  job.set_time_budget_s(3);
  const std::string job_path = dir_ + "/job.pbtxt";
  ASSERT_OK(testing::WriteJobFile(job, job_path));
  StartServer(job);
  ASSERT_NE(server_, nullptr);

  std::vector<std::string> argv = WorkerArgv(job_path, 0);
  argv.insert(argv.end(), {"--secret-key", WorkerKeyFile()});
  Result<ChildProcess> flag_worker =
      ChildProcess::Spawn("w0", argv, dir_ + "/worker-0.log");
  ASSERT_OK(flag_worker);
  std::optional<Result<ChildProcess>> env_worker;
  {
    // The server read its own key already; only the child sees this.
    ScopedEnv env(kSecretKeyEnv, WorkerKeyFile().c_str());
    env_worker.emplace(ChildProcess::Spawn("w1", WorkerArgv(job_path, 1),
                                           dir_ + "/worker-1.log"));
  }
  ASSERT_TRUE(env_worker->ok()) << env_worker->status();

  AwaitServer();
  ASSERT_OK(run_status_);
  EXPECT_GT(server_->summary().commits(), 0u);
  EXPECT_NE(server_->Snapshot(), initial_);
  for (ChildProcess* worker : {&*flag_worker, &**env_worker}) {
    ASSERT_TRUE(testing::WaitFor([&] { return worker->Poll(); }, kLong))
        << worker->name() << " did not exit:\n"
        << worker->LogTail(20);
    EXPECT_TRUE(worker->succeeded())
        << worker->name() << " " << worker->DescribeExit() << ":\n"
        << worker->LogTail(20);
  }
  EXPECT_TRUE(Contains(testing::ReadFile(dir_ + "/worker-0.log"),
                       "CURVE to site 'site-a'"));
}

// (b) A plaintext client gets no answer, and nothing it sends reaches the
// model.
TEST_F(WorkerCurveTest, PlaintextClientGetsNothing) {
  StartServer(Job(1));
  ASSERT_NE(server_, nullptr);
  std::unique_ptr<RpcClient> plaintext = MakeClient(std::nullopt);
  ExpectNoAnswer(*plaintext);
  EXPECT_EQ(server_->Snapshot(), initial_);
  ShutdownWithWorkerKey();
  AwaitServer();
  EXPECT_OK(run_status_);
  EXPECT_EQ(server_->summary().commits(), 0u);
  EXPECT_EQ(server_->Snapshot(), initial_);
}

// (c) A CURVE client with a key the job does not list is refused by the
// ZAP handler (logged with its key); the model stays untouched.
TEST_F(WorkerCurveTest, ClientWithAnotherKeyIsRefused) {
  StartServer(Job(1));
  ASSERT_NE(server_, nullptr);
  const CurveKeyPair stranger = NewPair();
  testing::StderrCapture capture;
  {
    std::unique_ptr<RpcClient> client = MakeClient(stranger);
    ExpectNoAnswer(*client);
    // Not even the site's own key pair is a worker.
    std::unique_ptr<RpcClient> site_key = MakeClient(site_keys_);
    ExpectNoAnswer(*site_key);
    // Both refusals are logged (by the ZAP thread, whenever it runs).
    EXPECT_TRUE(capture.WaitFor(stranger.public_key)) << capture.Text();
    EXPECT_TRUE(capture.WaitFor(site_keys_.public_key)) << capture.Text();
  }
  EXPECT_EQ(server_->Snapshot(), initial_);
  ShutdownWithWorkerKey();
  AwaitServer();
  const std::string log = capture.Stop();
  EXPECT_OK(run_status_);
  EXPECT_TRUE(Contains(log,
                       "worker socket of site 'site-a': refused a "
                       "CURVE connection"))
      << log;
  EXPECT_TRUE(Contains(log, stranger.public_key)) << log;
  EXPECT_TRUE(Contains(log, "admitted 'site-a/workers'")) << log;
  EXPECT_EQ(server_->summary().commits(), 0u);
  EXPECT_EQ(server_->Snapshot(), initial_);
}

// A worker whose key file is not the workers' key fails before it
// connects, saying whose key it holds; one without any key says how to
// provide one.
TEST_F(WorkerCurveTest, WorkerWithTheWrongKeyFailsClearly) {
  pb::JobConfig job = Job(1);
  job.clear_security();  // no key_dir: the default path does not apply
  const std::string job_path = dir_ + "/job.pbtxt";
  ASSERT_OK(testing::WriteJobFile(job, job_path));
  const std::string site_key = key_dir_ + "/" + kSite + ".key";
  testing::CommandResult wrong = testing::RunCommand(
      std::string(MERIDIAN_BINARY) + " worker --config " + job_path +
      " --site site-a --index 0 --connect tcp://127.0.0.1:1 --secret-key " +
      site_key + " 2>&1");
  EXPECT_NE(wrong.exit_code, 0) << wrong.output;
  EXPECT_TRUE(Contains(wrong.output, "site server's own key")) << wrong.output;
  EXPECT_TRUE(Contains(wrong.output, worker_keys_.public_key)) << wrong.output;
  EXPECT_FALSE(Contains(wrong.output, site_keys_.secret_key));

  testing::CommandResult none = testing::RunCommand(
      std::string(MERIDIAN_BINARY) + " worker --config " + job_path +
      " --site site-a --index 0 --connect tcp://127.0.0.1:1 2>&1");
  EXPECT_NE(none.exit_code, 0) << none.output;
  EXPECT_TRUE(Contains(none.output, "--secret-key")) << none.output;
  EXPECT_TRUE(Contains(none.output, "workers/site-a.key")) << none.output;
}

TEST(WorkerCurveKeysTest, KeyPathPrefersFlagThenEnvironmentThenKeyDir) {
  ScopedEnv clear(kSecretKeyEnv, nullptr);
  pb::JobConfig job;
  job.add_site()->set_name("us");
  EXPECT_FALSE(WorkerSecretKeyPath(job, "us", "").ok());
  job.mutable_security()->set_key_dir("keys");
  EXPECT_EQ(*WorkerSecretKeyPath(job, "us", ""), "keys/workers/us.key");
  {
    ScopedEnv env(kSecretKeyEnv, "/env.key");
    EXPECT_EQ(*WorkerSecretKeyPath(job, "us", ""), "/env.key");
    EXPECT_EQ(*WorkerSecretKeyPath(job, "us", "/flag.key"), "/flag.key");
  }
}

// (d) The job file: the worker key is Z85, needs the site's own key and
// CURVE on, sits on a site with a server, and is nobody else's key.
TEST(WorkerCurveConfigTest, WorkerKeyIsValidatedWithLineAndColumn) {
  const std::string site_key = NewPair().public_key;
  const std::string worker_key = NewPair().public_key;
  auto parse = [](const std::string& text) {
    std::vector<ConfigIssue> issues;
    EXPECT_FALSE(ParseJobConfig(text, "job.pbtxt", &issues).ok());
    return issues;
  };
  // Not Z85: pointed at the field.
  std::vector<ConfigIssue> issues = parse(
      "site {\n"
      "  name: \"a\" workers { count: 1 }\n"
      "  curve_public_key: \"" +
      site_key +
      "\"\n"
      "  worker_curve_public_key: \"abc\"\n"
      "}\n");
  ASSERT_EQ(issues.size(), 1u);
  EXPECT_EQ(issues[0].field, "site[0].worker_curve_public_key");
  EXPECT_EQ(issues[0].line, 4);
  EXPECT_EQ(issues[0].column, 3);
  EXPECT_TRUE(Contains(issues[0].message, "Z85")) << issues[0].message;

  // Without the site's own key.
  issues = parse(
      "site {\n"
      "  name: \"a\" workers { count: 1 }\n"
      "  worker_curve_public_key: \"" +
      worker_key + "\"\n}\n");
  ASSERT_EQ(issues.size(), 1u);
  EXPECT_EQ(issues[0].line, 3);
  EXPECT_TRUE(Contains(issues[0].message, "curve_public_key"))
      << issues[0].message;

  // With CURVE off.
  issues = parse(
      "site {\n"
      "  name: \"a\" workers { count: 1 }\n"
      "  curve_public_key: \"" +
      site_key + "\"\n  worker_curve_public_key: \"" + worker_key +
      "\"\n}\n"
      "security { curve: false }\n");
  ASSERT_EQ(issues.size(), 1u);
  EXPECT_EQ(issues[0].field, "site[0].worker_curve_public_key");
  EXPECT_EQ(issues[0].line, 4);
  EXPECT_TRUE(Contains(issues[0].message, "curve: true")) << issues[0].message;

  // The site's own key as the workers' key.
  issues = parse(
      "site {\n"
      "  name: \"a\" workers { count: 1 }\n"
      "  curve_public_key: \"" +
      site_key + "\"\n  worker_curve_public_key: \"" + site_key + "\"\n}\n");
  ASSERT_EQ(issues.size(), 1u);
  EXPECT_EQ(issues[0].line, 4);
  EXPECT_TRUE(Contains(issues[0].message, "site 'a'")) << issues[0].message;

  // On a site without a server of its own.
  issues = parse(
      "site {\n"
      "  name: \"a\" workers { count: 1 }\n"
      "  curve_public_key: \"" +
      site_key +
      "\"\n}\n"
      "site {\n"
      "  name: \"b\" workers { count: 1 } server_site: \"a\"\n"
      "  worker_curve_public_key: \"" +
      worker_key + "\"\n}\n");
  ASSERT_EQ(issues.size(), 1u) << FormatConfigIssues("job.pbtxt", issues);
  EXPECT_EQ(issues[0].field, "site[1].worker_curve_public_key");
  EXPECT_EQ(issues[0].line, 7);
  EXPECT_TRUE(Contains(issues[0].message, "serving site")) << issues[0].message;

  // And the valid form parses.
  std::vector<ConfigIssue> none;
  Result<pb::JobConfig> valid = ParseJobConfig(
      "site {\n"
      "  name: \"a\" workers { count: 1 }\n"
      "  curve_public_key: \"" +
          site_key + "\"\n  worker_curve_public_key: \"" + worker_key +
          "\"\n}\n",
      "job.pbtxt", &none);
  EXPECT_OK(valid);
}

// `meridian run` of a job with worker keys in <key_dir>/workers/ just
// works: the workers join over CURVE and train, and the launcher's status
// requests get through with the workers' key.
TEST_F(WorkerCurveTest, RunWithWorkerKeysTrains) {
  pb::JobConfig job = Job(1);
  job.set_time_budget_s(3);
  const std::string job_path = dir_ + "/job.pbtxt";
  ASSERT_OK(testing::WriteJobFile(job, job_path));
  testing::CommandResult run =
      testing::RunCommand(std::string(MERIDIAN_BINARY) + " run " + job_path +
                          " --out " + dir_ + "/out 2>&1");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  pb::RunReport report;
  ASSERT_OK(ReadJsonFile(dir_ + "/out/report.json", &report));
  ASSERT_EQ(report.sites_size(), 1);
  EXPECT_GT(report.sites(0).commits(), 0u);
  EXPECT_TRUE(
      Contains(testing::ReadFile(dir_ + "/out/logs/worker-site-a-0.log"),
               "CURVE to site 'site-a'"));
}

// `meridian run` reads worker keys from <key_dir>/workers/ only: a worker
// key without security.key_dir is refused before anything starts.
TEST(WorkerCurveConfigTest, RunRefusesAWorkerKeyWithoutKeyDir) {
  const std::string dir = testing::MakeTempDir("worker-curve-run");
  pb::JobConfig job = testing::SmallJob(dir + "/no-data", 1);
  job.mutable_site(0)->set_curve_public_key(NewPair().public_key);
  job.mutable_site(0)->set_worker_curve_public_key(NewPair().public_key);
  ASSERT_TRUE(ValidateJobConfig(job).empty());
  const std::string job_path = dir + "/job.pbtxt";
  ASSERT_OK(testing::WriteJobFile(job, job_path));
  testing::CommandResult run =
      testing::RunCommand(std::string(MERIDIAN_BINARY) + " run " + job_path +
                          " --out " + dir + "/out 2>&1");
  EXPECT_NE(run.exit_code, 0) << run.output;
  EXPECT_TRUE(Contains(run.output, "worker_curve_public_key")) << run.output;
  EXPECT_TRUE(Contains(run.output, "key_dir")) << run.output;
}

}  // namespace
}  // namespace meridian
