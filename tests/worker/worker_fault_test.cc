// Faults between workers and their site server, with real processes and
// real sockets: a worker killed and restarted, a worker stopped while a
// barrier holds the others, the site server stopped, and commits sent
// twice. Each test checks the conservation rule: every update is applied
// once, or reported as dropped.
//
// Time is shortened through the job's fault { } settings; every wait is for
// a condition with a generous deadline.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "meridian/config/config.h"
#include "meridian/net/message.h"
#include "meridian/train/model.h"
#include "meridian/report/report.h"
#include "meridian/site/site_server.h"
#include "meridian/net/transport.h"
#include "meridian/core/process.h"
#include "testing/site_control.h"
#include "testing/test_data.h"
#include "testing/status_matchers.h"

namespace meridian {
namespace {

using std::chrono::milliseconds;
using testing::QueryStatus;
using testing::ReadFile;
using testing::RequestShutdown;
using testing::WaitFor;

constexpr milliseconds kCallTimeout(10000);
// Deadlines of conditions: generous, for a loaded 2-core machine.
constexpr milliseconds kLong(90000);

// The commits a worker process says it was answered, from its last log
// line "leaving (...) after N steps and M commits"; -1 when absent.
int LoggedCommits(const std::string& log) {
  static const std::regex leaving(
      R"(leaving \(.*\) after (\d+) steps and (\d+) commits)");
  int commits = -1;
  for (auto it = std::sregex_iterator(log.begin(), log.end(), leaving);
       it != std::sregex_iterator(); ++it) {
    commits = std::stoi((*it)[2]);
  }
  return commits;
}

int CountEvents(const pb::SiteSummary& summary, pb::FaultKind kind,
                const std::string& subject) {
  int n = 0;
  for (const pb::FaultEvent& event : summary.events()) {
    n += event.kind() == kind && event.subject() == subject;
  }
  return n;
}

const pb::FaultEvent* FindEvent(const pb::SiteSummary& summary,
                                pb::FaultKind kind,
                                const std::string& subject) {
  for (const pb::FaultEvent& event : summary.events()) {
    if (event.kind() == kind && event.subject() == subject) return &event;
  }
  return nullptr;
}

std::string DescribeEvents(const pb::SiteSummary& summary) {
  std::string out;
  for (const pb::FaultEvent& event : summary.events()) {
    out += pb::FaultKind_Name(event.kind()) + " " + event.subject() + " " +
           std::to_string(event.duration_s()) + " s: " + event.detail() + "\n";
  }
  return out;
}

// The conservation rule at a site whose every worker process ended
// normally: each commit a worker was answered was applied exactly once,
// and nothing else was.
void ExpectEveryCommitAppliedOnce(const pb::SiteSummary& summary) {
  uint64_t answered = 0, applied = 0;
  for (const pb::WorkerSummary& worker : summary.workers()) {
    EXPECT_EQ(worker.commits_applied(), worker.commits())
        << "worker " << worker.site() << "/" << worker.index();
    answered += worker.commits();
    applied += worker.commits_applied();
  }
  EXPECT_EQ(summary.commits(), answered);
  EXPECT_EQ(summary.commits(), applied);
}

class WorkerFaultTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    data_dir_ = new std::string(testing::MakeTempDir("worker-fault-data"));
    testing::SyntheticDataOptions options;
    options.train_samples = 2000;
    options.test_samples = 200;
    ASSERT_OK(testing::WriteSyntheticIdx(*data_dir_, options));
  }

  void TearDown() override {
    if (server_thread_.joinable()) {
      (void)RequestShutdown(context_, endpoint_, "test over", kCallTimeout);
      server_thread_.join();
    }
    workers_.clear();  // kills and reaps what is left
  }

  // `workers` workers of 10 ms steps committing every 5 steps; faults
  // detected within seconds.
  pb::JobConfig Job(uint32_t workers, pb::PolicyKind policy) {
    pb::JobConfig job = testing::SmallJob(*data_dir_, workers, /*hidden=*/8);
    job.mutable_site(0)->mutable_workers(0)->set_step_time_s(0.01);
    job.mutable_policy()->set_kind(policy);
    job.mutable_policy()->set_local_steps(5);
    job.set_time_budget_s(600);  // the tests end the job with SHUTDOWN
    job.mutable_server()->set_eval_period_s(1);
    job.mutable_server()->set_join_timeout_s(60);
    pb::FaultConfig* fault = job.mutable_fault();
    fault->set_heartbeat_interval_s(0.2);
    fault->set_server_timeout_s(1.5);
    fault->set_worker_timeout_s(6);
    fault->set_worker_give_up_s(120);
    return job;
  }

  std::string WriteJob(const pb::JobConfig& job) {
    EXPECT_TRUE(ValidateJobConfig(job).empty());
    dir_ = testing::MakeTempDir("worker-fault");
    const std::string path = dir_ + "/job.pbtxt";
    EXPECT_OK(testing::WriteJobFile(job, path));
    return path;
  }

  // A site server in a thread of this process.
  void StartServer(const pb::JobConfig& job) {
    job_ = job;
    job_path_ = WriteJob(job);
    SiteServerOptions options;
    options.job = job;
    options.site = "site-a";
    options.bind = "tcp://127.0.0.1:*";
    options.out_dir = dir_;
    options.control_token = testing::kTestControlToken;
    Result<std::unique_ptr<SiteServer>> server =
        SiteServer::Create(std::move(options));
    ASSERT_OK(server);
    server_ = std::move(*server);
    endpoint_ = server_->endpoint();
    server_thread_ = std::thread([this] { run_status_ = server_->Run(); });
  }

  std::string WorkerLog(uint32_t index, int incarnation = 0) const {
    return dir_ + "/worker-" + std::to_string(index) + "-" +
           std::to_string(incarnation) + ".log";
  }

  ChildProcess* StartWorker(uint32_t index, int incarnation = 0) {
    Result<ChildProcess> child =
        testing::SpawnWorker(MERIDIAN_BINARY, job_path_, "site-a", index,
                             endpoint_, WorkerLog(index, incarnation));
    EXPECT_OK(child);
    if (!child.ok()) return nullptr;
    workers_.push_back(std::make_unique<ChildProcess>(std::move(*child)));
    return workers_.back().get();
  }

  pb::SiteStatus Status() {
    Result<pb::SiteStatus> status =
        QueryStatus(context_, endpoint_, kCallTimeout);
    EXPECT_OK(status);
    return status.ok() ? *status : pb::SiteStatus();
  }

  // Waits until the site has applied `more` commits beyond now.
  bool AwaitProgress(uint64_t more) {
    const uint64_t from = Status().commits();
    return WaitFor([&] { return Status().commits() >= from + more; }, kLong);
  }

  // Ends the job and waits for the server and every live worker process;
  // they must all end normally.
  void FinishJob(const std::vector<ChildProcess*>& live) {
    ASSERT_OK(RequestShutdown(context_, endpoint_, "test done", kCallTimeout));
    for (ChildProcess* worker : live) {
      ASSERT_TRUE(WaitFor([&] { return worker->Poll(); }, kLong))
          << worker->name() << " did not exit:\n"
          << worker->LogTail(20);
      EXPECT_TRUE(worker->succeeded())
          << worker->name() << " " << worker->DescribeExit() << ":\n"
          << worker->LogTail(20);
    }
    server_thread_.join();
    ASSERT_OK(run_status_);
  }

  static std::string* data_dir_;
  zmq::context_t context_;
  pb::JobConfig job_;
  std::string dir_;
  std::string job_path_;
  std::unique_ptr<SiteServer> server_;
  std::string endpoint_;
  std::thread server_thread_;
  meridian::Status run_status_;
  std::vector<std::unique_ptr<ChildProcess>> workers_;
};

std::string* WorkerFaultTest::data_dir_ = nullptr;

// ---------------------------------------------------------------------------
// kill -9 of a worker, and a new process for its index.

class WorkerKillTest : public WorkerFaultTest,
                       public ::testing::WithParamInterface<pb::PolicyKind> {};

TEST_P(WorkerKillTest, SiteTrainsOnAndARestartedWorkerIsAdmitted) {
  const pb::JobConfig job = Job(3, GetParam());
  StartServer(job);
  std::vector<ChildProcess*> processes;
  for (uint32_t i = 0; i < 3; ++i) processes.push_back(StartWorker(i));
  ASSERT_TRUE(AwaitProgress(30)) << "the site does not train";

  processes[1]->Signal(SIGKILL);
  const auto killed = std::chrono::steady_clock::now();
  ASSERT_TRUE(WaitFor([&] { return Status().workers_dead() == 1; }, kLong))
      << "worker 1 was never declared dead";
  const double detected_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed)
          .count();
  const double timeout_s = job.fault().worker_timeout_s();
  // Not before its timeout (less the last heartbeat interval), and not
  // much after it.
  EXPECT_GE(detected_s, timeout_s - job.fault().heartbeat_interval_s() - 0.1);
  EXPECT_LE(detected_s, timeout_s + 10);
  // The others train on without it (under BSP the barrier no longer waits
  // for it).
  ASSERT_TRUE(AwaitProgress(20)) << "the site stopped with a dead worker";

  ChildProcess* restarted = StartWorker(1, /*incarnation=*/1);
  ASSERT_TRUE(WaitFor([&] { return Status().workers_dead() == 0; }, kLong))
      << "the restarted worker was not admitted:\n"
      << restarted->LogTail(20);
  // It trains: its own commits are answered.
  ASSERT_TRUE(WaitFor(
      [&] {
        return ReadFile(WorkerLog(1, 1)).find("joined; plan") !=
               std::string::npos;
      },
      kLong));
  ASSERT_TRUE(AwaitProgress(30));
  FinishJob({processes[0], processes[2], restarted});

  const pb::SiteSummary& summary = server_->summary();
  SCOPED_TRACE(DescribeEvents(summary));
  EXPECT_EQ(CountEvents(summary, pb::WORKER_DEAD, "site-a/1"), 1);
  EXPECT_EQ(CountEvents(summary, pb::WORKER_RESTARTED, "site-a/1"), 1);
  EXPECT_EQ(CountEvents(summary, pb::WORKER_DEAD, "site-a/0"), 0);
  EXPECT_EQ(CountEvents(summary, pb::WORKER_DEAD, "site-a/2"), 0);
  const pb::FaultEvent* dead = FindEvent(summary, pb::WORKER_DEAD, "site-a/1");
  ASSERT_NE(dead, nullptr);
  EXPECT_GT(dead->duration_s(), 0) << "dead -> back was not recorded";
  EXPECT_GT(dead->unix_s(), 1.6e9);
  ASSERT_EQ(summary.workers_size(), 3);
  EXPECT_EQ(summary.workers(1).incarnations(), 2u);
  const int restarted_commits = LoggedCommits(ReadFile(WorkerLog(1, 1)));
  EXPECT_GT(restarted_commits, 0) << "the restarted worker did not train";

  // Conservation. The workers that ended normally: every commit they were
  // answered applied once. The killed process: every commit it sent that
  // reached the site was applied once; only its last one may have been
  // applied without an answer (its report of answered commits travels
  // with the next commit).
  uint64_t applied = 0;
  for (int i = 0; i < 3; ++i) {
    const pb::WorkerSummary& worker = summary.workers(i);
    applied += worker.commits_applied();
    if (i == 1) {
      EXPECT_GE(worker.commits_applied(), worker.commits());
      EXPECT_LE(worker.commits_applied(), worker.commits() + 1);
    } else {
      EXPECT_EQ(worker.commits_applied(), worker.commits()) << "worker " << i;
    }
  }
  EXPECT_EQ(summary.commits(), applied);
  EXPECT_EQ(summary.duplicate_commits(), 0u);
  EXPECT_EQ(summary.rejected(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Policies, WorkerKillTest,
                         ::testing::Values(pb::ASYNC, pb::BSP),
                         [](const auto& info) {
                           return pb::PolicyKind_Name(info.param);
                         });

// ---------------------------------------------------------------------------
// A BSP barrier holds worker 0's reply while worker 1 is stopped: for
// several times server_timeout_s, until worker 1 is declared dead. Worker 0
// is not lost meanwhile (the server's heartbeats keep it waiting), and
// worker 1, continued, comes back as the same process.

TEST_F(WorkerFaultTest, HeldWorkerWaitsThroughABarrierOnAStoppedWorker) {
  const pb::JobConfig job = Job(2, pb::BSP);
  StartServer(job);
  ChildProcess* w0 = StartWorker(0);
  ChildProcess* w1 = StartWorker(1);
  ASSERT_TRUE(AwaitProgress(20));

  w1->Signal(SIGSTOP);
  const auto stopped = std::chrono::steady_clock::now();
  ASSERT_TRUE(WaitFor([&] { return Status().workers_dead() == 1; }, kLong));
  const double held_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - stopped)
          .count();
  EXPECT_GE(held_s, 3 * job.fault().server_timeout_s());
  // Worker 0 goes on alone.
  ASSERT_TRUE(AwaitProgress(10)) << "the barrier still waits for a dead worker";

  w1->Signal(SIGCONT);
  ASSERT_TRUE(WaitFor([&] { return Status().workers_dead() == 0; }, kLong))
      << "the continued worker did not come back:\n"
      << w1->LogTail(20);
  ASSERT_TRUE(AwaitProgress(10));
  FinishJob({w0, w1});

  const pb::SiteSummary& summary = server_->summary();
  SCOPED_TRACE(DescribeEvents(summary));
  EXPECT_EQ(CountEvents(summary, pb::WORKER_DEAD, "site-a/1"), 1);
  EXPECT_EQ(CountEvents(summary, pb::WORKER_REJOINED, "site-a/1"), 1);
  // The held worker never lost its server: no event, no rejoin.
  EXPECT_EQ(CountEvents(summary, pb::WORKER_DEAD, "site-a/0"), 0);
  EXPECT_EQ(ReadFile(WorkerLog(0)).find("joining again"), std::string::npos)
      << ReadFile(WorkerLog(0));
  ASSERT_EQ(summary.workers_size(), 2);
  EXPECT_EQ(summary.workers(1).incarnations(), 1u);
  ExpectEveryCommitAppliedOnce(summary);
}

// ---------------------------------------------------------------------------
// The site server itself is stopped (SIGSTOP) for several times
// server_timeout_s — longer than worker_timeout_s too. Its workers rejoin
// once it continues; it declares none of them dead for its own stall; the
// job ends normally with every commit applied exactly once.

TEST_F(WorkerFaultTest, StoppedSiteServerGetsItsWorkersBack) {
  pb::JobConfig job = Job(3, pb::ASYNC);
  job.mutable_fault()->set_server_timeout_s(1);
  job.mutable_fault()->set_worker_timeout_s(3);
  job_path_ = WriteJob(job);
  Result<testing::SiteProcess> site = testing::SpawnSite(
      MERIDIAN_BINARY, job_path_, "site-a", dir_, dir_ + "/site.log", kLong);
  ASSERT_OK(site);
  endpoint_ = site->endpoint;
  std::vector<ChildProcess*> processes;
  for (uint32_t i = 0; i < 3; ++i) processes.push_back(StartWorker(i));
  ASSERT_TRUE(AwaitProgress(30));

  site->process.Signal(SIGSTOP);
  const auto stopped = std::chrono::steady_clock::now();
  // Every worker notices (each commits every ~60 ms, so each waits for an
  // answer soon), and the stop outlasts the site's own worker timeout.
  const double stop_s = job.fault().worker_timeout_s() + 2;
  const bool noticed = WaitFor(
      [&] {
        for (uint32_t i = 0; i < 3; ++i) {
          if (ReadFile(WorkerLog(i)).find("site server gone") ==
              std::string::npos) {
            return false;
          }
        }
        return std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                             stopped)
                   .count() >= stop_s;
      },
      kLong);
  site->process.Signal(SIGCONT);
  ASSERT_TRUE(noticed) << "the workers did not notice the stopped server";

  ASSERT_TRUE(AwaitProgress(30)) << "training did not resume:\n"
                                 << site->process.LogTail(30);
  for (uint32_t i = 0; i < 3; ++i) {
    EXPECT_NE(ReadFile(WorkerLog(i)).find("rejoined the site server"),
              std::string::npos)
        << "worker " << i << ":\n"
        << ReadFile(WorkerLog(i));
  }
  ASSERT_OK(RequestShutdown(context_, endpoint_, "test done", kCallTimeout));
  for (ChildProcess* worker : processes) {
    ASSERT_TRUE(WaitFor([&] { return worker->Poll(); }, kLong));
    EXPECT_TRUE(worker->succeeded()) << worker->DescribeExit() << "\n"
                                     << worker->LogTail(20);
  }
  ASSERT_TRUE(WaitFor([&] { return site->process.Poll(); }, kLong));
  EXPECT_TRUE(site->process.succeeded()) << site->process.LogTail(30);

  pb::SiteSummary summary;
  ASSERT_OK(ReadJsonFile(dir_ + "/site-site-a.json", &summary));
  SCOPED_TRACE(DescribeEvents(summary));
  for (const std::string worker : {"site-a/0", "site-a/1", "site-a/2"}) {
    EXPECT_EQ(CountEvents(summary, pb::WORKER_DEAD, worker), 0)
        << "the server's own stall was taken for " << worker << "'s death";
  }
  EXPECT_NE(site->process.LogTail(400).find("did not run for"),
            std::string::npos);
  // Conservation: what each worker process was answered (its BYE, and its
  // own last log line) is what the site applied.
  ExpectEveryCommitAppliedOnce(summary);
  for (uint32_t i = 0; i < 3; ++i) {
    EXPECT_EQ(LoggedCommits(ReadFile(WorkerLog(i))),
              static_cast<int>(summary.workers(i).commits()))
        << "worker " << i;
  }
}

// ---------------------------------------------------------------------------
// Commit ids, by hand: a commit sent twice moves the model once.

class CommitIdTest : public WorkerFaultTest {
 protected:
  void SetUp() override {
    StartServer(Job(1, pb::ASYNC));
    Result<std::unique_ptr<Model>> model = MakeModel(job_.model(), 784, 10);
    ASSERT_OK(model);
    model_ = std::move(*model);
    initial_.resize(model_->layout().num_elements());
    model_->Initialize(job_.seed(), initial_);
  }

  static pb::Endpoint Worker0() {
    pb::Endpoint self;
    self.set_site("site-a");
    self.set_role(pb::ROLE_WORKER);
    self.set_id(0);
    return self;
  }

  pb::Header Hello(uint64_t incarnation) {
    pb::Header hello;
    hello.set_type(pb::HELLO);
    hello.mutable_hello()->set_worker_index(0);
    hello.mutable_hello()->set_incarnation(incarnation);
    LayoutToSpecs(model_->layout(), hello.mutable_hello()->mutable_layout());
    return hello;
  }

  // A whole-model commit of `value` everywhere, with `commit_id`.
  Result<Envelope> Commit(RpcClient* client, uint64_t commit_id, float value,
                          uint64_t base_version) {
    pb::Header header;
    header.set_type(pb::COMMIT);
    AddLayoutSlices(model_->layout(), &header);
    header.mutable_commit()->set_base_version(base_version);
    header.mutable_commit()->set_local_steps(1);
    header.mutable_commit()->set_commit_id(commit_id);
    std::vector<zmq::message_t> frames;
    for (const TensorInfo& tensor : model_->layout().tensors()) {
      frames.push_back(CopyFloatFrame(std::vector<float>(tensor.size, value)));
    }
    return client->Call(header, std::move(frames), kCallTimeout);
  }

  // Every element moved by exactly `total` from the initial model.
  void ExpectModelMovedBy(const Envelope& reply, float total) {
    std::vector<float> values;
    for (const zmq::message_t& frame : reply.payload) {
      const float* data = static_cast<const float*>(frame.data());
      values.insert(values.end(), data, data + frame.size() / sizeof(float));
    }
    ASSERT_EQ(values.size(), initial_.size());
    for (size_t i = 0; i < values.size(); ++i) {
      ASSERT_NEAR(values[i], initial_[i] + total, 1e-5) << "element " << i;
    }
  }

  std::unique_ptr<Model> model_;
  std::vector<float> initial_;
};

TEST_F(CommitIdTest, ACommitSentTwiceIsAppliedOnce) {
  RpcClient first(context_, endpoint_, Worker0());
  Result<Envelope> welcome = first.Call(Hello(77), {}, kCallTimeout);
  ASSERT_OK(welcome);
  ASSERT_EQ(welcome->header.type(), pb::WELCOME);
  EXPECT_EQ(welcome->header.welcome().last_commit_id(), 0u);

  Result<Envelope> reply = Commit(&first, 1, 0.25f, 0);
  ASSERT_OK(reply);
  ASSERT_EQ(reply->header.type(), pb::MODEL);
  EXPECT_EQ(reply->header.model().version(), 1u);
  // The same commit id again (a new request on the same connection): it
  // is answered with the model, which does not move.
  reply = Commit(&first, 1, 0.25f, 0);
  ASSERT_OK(reply);
  ASSERT_EQ(reply->header.type(), pb::MODEL) << reply->header.error().message();
  EXPECT_EQ(reply->header.model().version(), 1u);
  ExpectModelMovedBy(*reply, 0.25f);
  reply = Commit(&first, 2, 0.25f, 1);
  ASSERT_OK(reply);
  EXPECT_EQ(reply->header.model().version(), 2u);

  // The same process over a new connection (a lost reply, a reconnect):
  // WELCOME says what was applied; commit 2 sent again is not applied; the
  // old connection is not the worker's any more.
  RpcClient second(context_, endpoint_, Worker0());
  welcome = second.Call(Hello(77), {}, kCallTimeout);
  ASSERT_OK(welcome);
  ASSERT_EQ(welcome->header.type(), pb::WELCOME);
  EXPECT_EQ(welcome->header.welcome().last_commit_id(), 2u);
  reply = Commit(&second, 2, 0.25f, 2);
  ASSERT_OK(reply);
  EXPECT_EQ(reply->header.model().version(), 2u);
  reply = Commit(&first, 3, 0.25f, 2);
  ASSERT_OK(reply);
  ASSERT_EQ(reply->header.type(), pb::ERROR);
  EXPECT_EQ(reply->header.error().code(), pb::ERROR_UNKNOWN_SENDER);
  reply = Commit(&second, 3, 0.25f, 2);
  ASSERT_OK(reply);
  EXPECT_EQ(reply->header.model().version(), 3u);
  ExpectModelMovedBy(*reply, 0.75f);

  // A restarted process (another incarnation) takes the slot: its ids
  // start again at 1, and the old process may not come back.
  RpcClient third(context_, endpoint_, Worker0());
  welcome = third.Call(Hello(78), {}, kCallTimeout);
  ASSERT_OK(welcome);
  ASSERT_EQ(welcome->header.type(), pb::WELCOME);
  EXPECT_EQ(welcome->header.welcome().last_commit_id(), 0u);
  reply = Commit(&third, 1, 0.25f, 3);
  ASSERT_OK(reply);
  EXPECT_EQ(reply->header.model().version(), 4u);
  ExpectModelMovedBy(*reply, 1.0f);
  RpcClient fourth(context_, endpoint_, Worker0());
  Result<Envelope> refused = fourth.Call(Hello(77), {}, kCallTimeout);
  ASSERT_OK(refused);
  ASSERT_EQ(refused->header.type(), pb::ERROR);
  EXPECT_EQ(refused->header.error().code(), pb::ERROR_UNEXPECTED);

  pb::Header bye;
  bye.set_type(pb::BYE);
  bye.mutable_bye()->mutable_stats()->set_commits(1);
  ASSERT_OK(third.Call(bye, {}, kCallTimeout));
  server_thread_.join();  // its only worker left
  ASSERT_OK(run_status_);
  const pb::SiteSummary& summary = server_->summary();
  EXPECT_EQ(summary.commits(), 4u);
  EXPECT_EQ(summary.model_version(), 4u);
  EXPECT_EQ(summary.duplicate_commits(), 2u);
  ASSERT_EQ(summary.workers_size(), 1);
  EXPECT_EQ(summary.workers(0).commits_applied(), 4u);
  EXPECT_EQ(summary.workers(0).incarnations(), 2u);
  EXPECT_EQ(CountEvents(summary, pb::WORKER_RESTARTED, "site-a/0"), 1);
  // Refused: the old connection's commit and the replaced process's HELLO;
  // neither touched the model.
  EXPECT_EQ(summary.rejected(), 2u);
}

// A worker the site has not seen yet joins while training runs (the join
// timeout started training with fault.min_workers), and a silent client is
// declared dead while the others train.
TEST_F(WorkerFaultTest, LateJoinerIsAdmittedAndSilentWorkerDeclaredDead) {
  pb::JobConfig job = Job(3, pb::BSP);
  job.mutable_server()->set_join_timeout_s(5);
  job.mutable_fault()->set_min_workers(1);
  job.mutable_fault()->set_worker_timeout_s(3);
  StartServer(job);
  ChildProcess* w0 = StartWorker(0);
  ASSERT_TRUE(AwaitProgress(10)) << "training did not start with 1 of 3";
  ChildProcess* w2 = StartWorker(2);
  ASSERT_TRUE(WaitFor(
      [&] {
        return ReadFile(WorkerLog(2)).find("joined; plan") != std::string::npos;
      },
      kLong));
  // Worker 1 joins by hand and then says nothing: declared dead; the BSP
  // barrier goes on with 0 and 2.
  RpcClient silent(context_, endpoint_, [] {
    pb::Endpoint self;
    self.set_site("site-a");
    self.set_role(pb::ROLE_WORKER);
    self.set_id(1);
    return self;
  }());
  pb::Header hello;
  hello.set_type(pb::HELLO);
  hello.mutable_hello()->set_worker_index(1);
  hello.mutable_hello()->set_incarnation(5);
  std::unique_ptr<Model> model = *MakeModel(job.model(), 784, 10);
  LayoutToSpecs(model->layout(), hello.mutable_hello()->mutable_layout());
  // Under BSP it is let in at the next round boundary.
  Result<Envelope> welcome = silent.Call(hello, {}, kCallTimeout);
  ASSERT_OK(welcome);
  ASSERT_EQ(welcome->header.type(), pb::WELCOME);
  ASSERT_TRUE(WaitFor([&] { return Status().workers_dead() == 1; }, kLong));
  ASSERT_TRUE(AwaitProgress(10)) << "the barrier waits for a dead worker";
  FinishJob({w0, w2});

  const pb::SiteSummary& summary = server_->summary();
  SCOPED_TRACE(DescribeEvents(summary));
  EXPECT_EQ(CountEvents(summary, pb::WORKER_JOINED_LATE, "site-a/2"), 1);
  EXPECT_EQ(CountEvents(summary, pb::WORKER_JOINED_LATE, "site-a/1"), 1);
  EXPECT_EQ(CountEvents(summary, pb::WORKER_DEAD, "site-a/1"), 1);
  EXPECT_EQ(CountEvents(summary, pb::WORKER_DEAD, "site-a/0"), 0);
  EXPECT_EQ(summary.workers(1).commits_applied(), 0u);
  ExpectEveryCommitAppliedOnce(summary);
}

}  // namespace
}  // namespace meridian
