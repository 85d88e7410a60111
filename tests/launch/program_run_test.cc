// Worker and evaluator programs under `meridian run` and `meridian site
// --with-workers`, with real processes: a program gets its place in the job
// (MERIDIAN_*) in the job file's directory and runs to the end; a program
// that exits at once is restarted with backoff until the restart limit
// fails the job, naming it and its exit status; a program that hangs
// before joining meets the site's join timeout and min_workers rule; a
// killed child of `--with-workers` is restarted and does not fail the
// site. The programs are small shell scripts (the built-in worker, started
// as a program from the variables alone, does the training), and for an
// external model a PyTorch worker and evaluator on the Python package
// (ExternalModelTest). Slow tier.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "launch/run_test_util.h"
#include "meridian/job.pb.h"
#include "meridian/report.pb.h"
#include "meridian/report/report.h"
#include "testing/processes.h"
#include "testing/status_matchers.h"
#include "testing/test_data.h"
#include "testing/text.h"

namespace meridian {
namespace {

using ::meridian::testing::BackgroundCommand;
using ::meridian::testing::CommandResult;
using ::meridian::testing::Contains;
using ::meridian::testing::EventsOf;
using ::meridian::testing::FindProcesses;
using ::meridian::testing::Pids;
using ::meridian::testing::ReadFile;
using ::meridian::testing::RunCommand;
using ::meridian::testing::WaitFor;

// A worker program: records its place in the job (in its working
// directory), then runs the built-in worker ($1) from the MERIDIAN_*
// variables alone.
constexpr char kWorkerScript[] =
    "env | grep '^MERIDIAN_' | sort > \"env-worker-$MERIDIAN_WORKER_INDEX\"\n"
    "pwd >> \"env-worker-$MERIDIAN_WORKER_INDEX\"\n"
    "exec \"$1\" worker\n";
// A program that never joins (it stops on SIGTERM).
constexpr char kHang[] = "while :; do sleep 0.1; done";

// The MERIDIAN_* lines a program recorded, by name; "PWD" its directory.
std::map<std::string, std::string> Recorded(const std::string& path) {
  std::map<std::string, std::string> out;
  std::istringstream lines(ReadFile(path));
  std::string line;
  while (std::getline(lines, line)) {
    const size_t equals = line.find('=');
    if (equals == std::string::npos) {
      out["PWD"] = line;
    } else {
      out[line.substr(0, equals)] = line.substr(equals + 1);
    }
  }
  return out;
}

const pb::WorkerSummary* WorkerOf(const pb::RunReport& report, uint32_t i) {
  for (const pb::SiteSummary& site : report.sites()) {
    for (const pb::WorkerSummary& worker : site.workers()) {
      if (worker.index() == i) return &worker;
    }
  }
  return nullptr;
}

// A TCP port nobody listens on now (for a job run by `meridian site`
// alone, whose workers connect to the job's address).
int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0) {
    port = ntohs(address.sin_port);
  }
  ::close(fd);
  return port;
}

class ProgramRunTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    data_dir_ = new std::string(testing::MakeTempDir("programs-data"));
    testing::SyntheticDataOptions options;
    options.train_samples = 2000;
    options.test_samples = 300;
    ASSERT_OK(testing::WriteSyntheticIdx(*data_dir_, options));
  }

  void SetUp() override {
    dir_ = testing::MakeTempDir("programs");
    path_ = dir_ + "/job.pbtxt";
    out_ = dir_ + "/out";
    std::ofstream(dir_ + "/worker.sh") << kWorkerScript;
  }

  void TearDown() override {
    // Nothing of the run outlives it (every program's command line names
    // dir_).
    EXPECT_TRUE(WaitFor([&] { return FindProcesses(dir_).empty(); },
                        std::chrono::seconds(30)))
        << "orphaned children";
    testing::KillProcesses(dir_);
  }

  // One site, no workers yet, training until the time budget; quick
  // restarts.
  pb::JobConfig Job(double budget_s) {
    pb::JobConfig job = testing::SmallJob(*data_dir_, 1);
    job.mutable_site(0)->clear_workers();
    job.set_time_budget_s(budget_s);
    job.mutable_fault()->set_restart_backoff_s(0.2);
    return job;
  }

  // A group of `count` workers running `command`.
  static pb::WorkerGroup* AddGroup(pb::JobConfig* job, uint32_t count,
                                   const std::vector<std::string>& command) {
    pb::WorkerGroup* group = job->mutable_site(0)->add_workers();
    group->set_count(count);
    for (const std::string& arg : command) group->add_command(arg);
    return group;
  }

  void WriteJob(const pb::JobConfig& job) {
    ASSERT_OK(testing::WriteJobFile(job, path_));
  }

  CommandResult Run(const std::string& environment = "") {
    return RunCommand(environment + " " + MERIDIAN_BINARY + " run " + path_ +
                      " --out " + out_);
  }

  pb::RunReport ReadReport() {
    pb::RunReport report;
    EXPECT_OK(ReadJsonFile(out_ + "/report.json", &report));
    return report;
  }

  static std::string* data_dir_;
  std::string dir_;   // the job file's directory; named by every program
  std::string path_;  // the job file
  std::string out_;   // the run's output directory
};

std::string* ProgramRunTest::data_dir_ = nullptr;

TEST_F(ProgramRunTest, ProgramsLearnTheirPlaceAndRunToTheEnd) {
  pb::JobConfig job = Job(4);
  // Worker 0: a script next to the job file ("sh" from PATH, the script
  // relative to the job file's directory). Worker 1: the built-in worker
  // as an explicit command, from the variables alone.
  AddGroup(&job, 1, {"sh", "worker.sh", MERIDIAN_BINARY, dir_});
  AddGroup(&job, 1, {MERIDIAN_BINARY, "worker"})->set_step_time_s(0.01);
  WriteJob(job);
  // Stale variables of the launcher's environment do not reach them.
  const CommandResult result =
      Run("MERIDIAN_WEIGHTS=/stale MERIDIAN_CONTROL_TOKEN=secret "
          "MERIDIAN_WORKER_INDEX=9");
  ASSERT_EQ(result.exit_code, 0) << result.output;

  const auto worker = Recorded(dir_ + "/env-worker-0");
  EXPECT_EQ(worker.at("PWD"), dir_);
  const std::map<std::string, std::string> expected = {
      {"MERIDIAN_ROLE", "worker"},    {"MERIDIAN_JOB", path_},
      {"MERIDIAN_SITE", "site-a"},    {"MERIDIAN_SITE_INDEX", "0"},
      {"MERIDIAN_SITE_COUNT", "1"},   {"MERIDIAN_WORKER_INDEX", "0"},
      {"MERIDIAN_WORKER_COUNT", "2"}, {"MERIDIAN_STEP_TIME_S", "0"},
      {"MERIDIAN_SEED", "3"},         {"MERIDIAN_OUT", out_}};
  for (const auto& [name, value] : expected) {
    ASSERT_EQ(worker.count(name), 1u) << name;
    EXPECT_EQ(worker.at(name), value) << name;
  }
  EXPECT_EQ(worker.at("MERIDIAN_CONNECT").rfind("tcp://127.0.0.1:", 0), 0u);
  for (const char* absent :
       {"MERIDIAN_WEIGHTS", "MERIDIAN_CONTROL_TOKEN", "MERIDIAN_SECRET_KEY"}) {
    EXPECT_EQ(worker.count(absent), 0u) << absent;
  }

  // Both trained to the end, each as its own worker.
  const pb::RunReport report = ReadReport();
  EXPECT_EQ(report.outcome().rfind("time budget", 0), 0u) << report.outcome();
  for (uint32_t i : {0u, 1u}) {
    const pb::WorkerSummary* summary = WorkerOf(report, i);
    ASSERT_NE(summary, nullptr) << i;
    EXPECT_GT(summary->commits_applied(), 0u) << i;
    EXPECT_EQ(summary->incarnations(), 1u) << i;
  }
  EXPECT_TRUE(report.events().empty());
  EXPECT_TRUE(
      Contains(ReadFile(out_ + "/logs/worker-site-a-1.log"), "joined; plan"));
}

TEST_F(ProgramRunTest, ProgramThatExitsAtOnceFailsPastTheRestartLimit) {
  pb::JobConfig job = Job(60);
  AddGroup(&job, 1,
           {"sh", "-c", "echo cannot load the model >&2; exit 3", dir_});
  AddGroup(&job, 1, {});  // a built-in worker, waiting for training
  job.mutable_fault()->set_max_restarts(2);
  WriteJob(job);
  const CommandResult result = Run();
  EXPECT_FALSE(result.crashed);
  ASSERT_EQ(result.exit_code, 1) << result.output;
  const std::string name =
      "worker 0 of site 'site-a' (sh -c 'echo cannot load the model >&2; "
      "exit 3' " +
      dir_ + ")";
  EXPECT_TRUE(Contains(result.output,
                       name + " exited with status 3 (not restarted: it was "
                              "restarted 2 times already, the limit"))
      << result.output;
  EXPECT_TRUE(Contains(result.output, "cannot load the model"))
      << result.output;  // its log's tail

  const pb::RunReport report = ReadReport();
  EXPECT_EQ(report.outcome().rfind("failed: " + name, 0), 0u)
      << report.outcome();
  const auto failed = EventsOf(report, pb::PROCESS_FAILED, "site-a/0");
  const auto restarted = EventsOf(report, pb::PROCESS_RESTARTED, "site-a/0");
  ASSERT_EQ(failed.size(), 3u);
  ASSERT_EQ(restarted.size(), 2u);
  EXPECT_EQ(failed[0].detail(), "exited with status 3");
  EXPECT_GE(restarted[1].duration_s(), 0.4);  // the doubled backoff
  const std::string log = ReadFile(out_ + "/logs/worker-site-a-0.log");
  EXPECT_TRUE(Contains(log, "===== meridian run: restart 2 of 2 of " + name))
      << log;
  // The site stopped in order and the model was never touched.
  ASSERT_EQ(report.sites_size(), 1);
  const pb::WorkerSummary* bad = WorkerOf(report, 0);
  EXPECT_TRUE(bad == nullptr || bad->commits_applied() == 0);
  EXPECT_EQ(report.sites(0).commits(), 0u);
}

TEST_F(ProgramRunTest, HangingProgramIsLeftOutByTheMinWorkersRule) {
  pb::JobConfig job = Job(3);
  AddGroup(&job, 1, {});  // the built-in worker
  AddGroup(&job, 1, {"sh", "-c", kHang, dir_});
  job.mutable_server()->set_join_timeout_s(3);
  WriteJob(job);
  const CommandResult result = Run();
  ASSERT_EQ(result.exit_code, 0) << result.output;
  // The site trains without it once the join timeout passed ...
  const std::string site_log = ReadFile(out_ + "/logs/site-site-a.log");
  EXPECT_TRUE(Contains(site_log,
                       "1 of 2 workers joined within 3 s; training without "
                       "[site-a/1] (they may join late)"))
      << site_log;
  // ... and, as it never said goodbye, it gets SIGTERM in the stop.
  EXPECT_TRUE(Contains(result.output,
                       "SIGTERM to workers still running: worker 1 of site "
                       "'site-a' (sh -c"))
      << result.output;
  const pb::RunReport report = ReadReport();
  EXPECT_EQ(report.outcome().rfind("time budget", 0), 0u) << report.outcome();
  EXPECT_TRUE(EventsOf(report, pb::PROCESS_FAILED, "site-a/1").empty());
  const pb::WorkerSummary* trained = WorkerOf(report, 0);
  ASSERT_NE(trained, nullptr);
  EXPECT_GT(trained->commits_applied(), 0u);
}

TEST_F(ProgramRunTest, OnlyWorkerHangsAndTheSiteSaysWhoDidNotJoin) {
  pb::JobConfig job = Job(60);
  AddGroup(&job, 1, {"sh", "-c", kHang, dir_});
  job.mutable_server()->set_join_timeout_s(3);
  job.mutable_fault()->set_max_restarts(0);
  WriteJob(job);
  const CommandResult result = Run();
  EXPECT_FALSE(result.crashed);
  ASSERT_EQ(result.exit_code, 1) << result.output;
  EXPECT_TRUE(Contains(result.output,
                       "site server 'site-a' exited with status 1 (not "
                       "restarted: fault.max_restarts is 0)"))
      << result.output;
  EXPECT_TRUE(Contains(result.output,
                       "workers [site-a/0] of site server 'site-a' did not "
                       "join within 3 s (0 joined, at least 1 needed: "
                       "fault.min_workers)"))
      << result.output;
}

TEST_F(ProgramRunTest, ResumeStartsTheProgramsAgainInTheirPlace) {
  pb::JobConfig job = Job(20);
  AddGroup(&job, 1, {"sh", "worker.sh", MERIDIAN_BINARY, dir_});
  job.mutable_fault()->set_checkpoint_period_s(1);
  WriteJob(job);
  {
    testing::BackgroundRun run(path_ + " --out " + out_);
    ASSERT_TRUE(WaitFor(
        [&] {
          return Contains(ReadFile(out_ + "/logs/worker-site-a-0.log"),
                          "joined; plan") &&
                 std::filesystem::exists(out_ + "/checkpoints/site-a") &&
                 !std::filesystem::is_empty(out_ + "/checkpoints/site-a");
        },
        std::chrono::seconds(120)))
        << "the program never trained to a checkpoint";
    // The launcher and the site server at once (the worker dies with its
    // launcher).
    for (pid_t pid : FindProcesses(dir_)) ::kill(pid, SIGKILL);
    run.Wait();
  }
  std::filesystem::remove(dir_ + "/env-worker-0");
  const CommandResult resumed =
      RunCommand(std::string(MERIDIAN_BINARY) + " run --resume " + out_);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  const auto worker = Recorded(dir_ + "/env-worker-0");
  EXPECT_EQ(worker.at("MERIDIAN_JOB"), path_);
  EXPECT_EQ(worker.at("MERIDIAN_OUT"), out_);
  EXPECT_EQ(worker.at("PWD"), dir_);
  const pb::RunReport report = ReadReport();
  EXPECT_EQ(EventsOf(report, pb::JOB_RESUMED, "job").size(), 1u);
}

// ---- an external model: Python programs
// ---------------------------------------

// The user's model: a linear classifier of two features (is x0 > 0?),
// trained by meridian.Session. `train.py --write-weights` writes the
// initial weights every site reads.
constexpr char kTrainPy[] = R"(import os
import sys

import meridian
import torch
from torch import nn


def record(path):  # this process's place in the job, and its directory
    with open(path, "w") as f:
        for name in sorted(os.environ):
            if name.startswith("MERIDIAN_"):
                f.write("%s=%s\n" % (name, os.environ[name]))
        f.write(os.getcwd() + "\n")


def net():
    torch.manual_seed(0)
    return nn.Linear(2, 2)


def data(n, seed):
    x = torch.randn(n, 2, generator=torch.Generator().manual_seed(seed))
    return x, (x[:, 0] > 0).long()


if __name__ == "__main__":
    torch.set_num_threads(1)
    if "--write-weights" in sys.argv:
        meridian.save_initial_weights(net(), "initial.safetensors")
        sys.exit(0)
    record("env-worker-" + os.environ["MERIDIAN_WORKER_INDEX"])
    model = net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = data(256, 1 + int(os.environ["MERIDIAN_WORKER_INDEX"]))
    batches = [(x[i:i + 32], y[i:i + 32]) for i in range(0, 256, 32)]
    with meridian.Session(model, optimizer) as session:
        for bx, by in session.batches(batches):
            loss = nn.functional.cross_entropy(model(bx), by)
            optimizer.zero_grad()
            loss.backward()
            session.step(loss)
)";
// Its evaluator: accuracy and loss on held-out points.
constexpr char kEvaluatePy[] = R"(import os

import meridian
import torch
from torch import nn

from train import data, net, record

torch.set_num_threads(1)
record("env-evaluator-" + os.environ["MERIDIAN_SITE"])
x, y = data(500, 99)


def score(model):
    with torch.no_grad():
        logits = model(x)
    return ({"accuracy": (logits.argmax(1) == y).float().mean().item(),
             "loss": nn.functional.cross_entropy(logits, y).item()}, len(y))


meridian.Evaluator(net()).serve(validation=score, training_sample=score)
)";

class ExternalModelTest : public ProgramRunTest {
 protected:
  // Debian's python3 (with PyTorch) and the package meridian.
  static std::string Python() {
    return std::string("PYTHONPATH=") + MERIDIAN_PYTHON_PATH +
           " OMP_NUM_THREADS=1 ";
  }

  void SetUp() override {
    ProgramRunTest::SetUp();
    std::ofstream(dir_ + "/train.py") << kTrainPy;
    std::ofstream(dir_ + "/evaluate.py") << kEvaluatePy;
    const CommandResult written =
        RunCommand("cd " + dir_ + " && " + Python() + MERIDIAN_PYTHON3 +
                   " train.py --write-weights");
    ASSERT_EQ(written.exit_code, 0) << written.output;
  }

  // One site of the external model: `workers` Python workers and the
  // evaluator, every program named with dir_ (the orphan check).
  pb::JobConfig ExternalJob(uint32_t workers, double budget_s) {
    pb::JobConfig job = Job(budget_s);
    job.clear_data();
    pb::ModelConfig* model = job.mutable_model();
    model->Clear();
    model->set_kind(pb::EXTERNAL);
    model->set_weights("initial.safetensors");
    model->add_metrics()->set_name("accuracy");
    pb::MetricConfig* loss = model->add_metrics();
    loss->set_name("loss");
    loss->set_higher_is_better(false);
    job.mutable_server()->set_eval_period_s(1);
    job.mutable_policy()->set_local_steps(4);
    AddGroup(&job, workers, {MERIDIAN_PYTHON3, "train.py", dir_})
        ->set_step_time_s(0.01);
    for (const std::string& arg :
         {std::string(MERIDIAN_PYTHON3), std::string("evaluate.py"), dir_}) {
      job.mutable_evaluator()->add_command(arg);
    }
    return job;
  }
};

TEST_F(ExternalModelTest, PythonWorkersAndEvaluatorTrainItUnderRun) {
  WriteJob(ExternalJob(2, 8));
  const CommandResult result = Run(Python());
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_TRUE(Contains(result.output, "2 workers, 1 evaluators"))
      << result.output;

  const std::string weights = dir_ + "/initial.safetensors";
  const auto worker = Recorded(dir_ + "/env-worker-1");
  EXPECT_EQ(worker.at("MERIDIAN_ROLE"), "worker");
  EXPECT_EQ(worker.at("MERIDIAN_WORKER_INDEX"), "1");
  EXPECT_EQ(worker.at("MERIDIAN_WORKER_COUNT"), "2");
  EXPECT_EQ(worker.at("MERIDIAN_WEIGHTS"), weights);
  EXPECT_EQ(worker.at("MERIDIAN_STEP_TIME_S"), "0.01");
  EXPECT_EQ(worker.at("PWD"), dir_);
  const auto evaluator = Recorded(dir_ + "/env-evaluator-site-a");
  EXPECT_EQ(evaluator.at("MERIDIAN_ROLE"), "evaluator");
  EXPECT_EQ(evaluator.at("MERIDIAN_JOB"), path_);
  EXPECT_EQ(evaluator.at("MERIDIAN_SITE"), "site-a");
  EXPECT_EQ(evaluator.at("MERIDIAN_WEIGHTS"), weights);
  EXPECT_EQ(evaluator.at("MERIDIAN_CONNECT"), worker.at("MERIDIAN_CONNECT"));
  EXPECT_EQ(evaluator.at("MERIDIAN_OUT"), out_);
  EXPECT_EQ(evaluator.count("MERIDIAN_WORKER_INDEX"), 0u);
  EXPECT_EQ(evaluator.at("PWD"), dir_);

  // Both workers trained the site's replica, and the evaluator scored it.
  const pb::RunReport report = ReadReport();
  EXPECT_EQ(report.outcome().rfind("time budget", 0), 0u) << report.outcome();
  EXPECT_EQ(report.metric(), "accuracy");
  for (uint32_t i : {0u, 1u}) {
    const pb::WorkerSummary* summary = WorkerOf(report, i);
    ASSERT_NE(summary, nullptr) << i;
    EXPECT_GT(summary->commits_applied(), 0u) << i;
  }
  EXPECT_GT(report.final_metric(), 0.8) << "x0 > 0 is linearly separable";
  EXPECT_TRUE(report.events().empty());
  EXPECT_TRUE(std::filesystem::exists(out_ + "/logs/evaluator-site-a.log"));
}

TEST_F(ExternalModelTest, PythonProgramsUnderSiteWithWorkers) {
  pb::JobConfig job = ExternalJob(1, 5);
  job.mutable_site(0)->set_address("tcp://127.0.0.1:" +
                                   std::to_string(FreePort()));
  WriteJob(job);
  const CommandResult result =
      RunCommand(Python() + MERIDIAN_BINARY + " site --config " + path_ +
                 " --site site-a --with-workers --metrics none --out " + out_);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const auto evaluator = Recorded(dir_ + "/env-evaluator-site-a");
  EXPECT_EQ(evaluator.at("MERIDIAN_ROLE"), "evaluator");
  EXPECT_EQ(evaluator.at("MERIDIAN_CONNECT"), job.site(0).address());
  EXPECT_EQ(evaluator.at("MERIDIAN_OUT"), out_);
  const auto worker = Recorded(dir_ + "/env-worker-0");
  EXPECT_EQ(worker.at("MERIDIAN_CONNECT"), job.site(0).address());
  pb::SiteSummary summary;
  ASSERT_OK(ReadJsonFile(out_ + "/site-site-a.json", &summary));
  ASSERT_EQ(summary.workers_size(), 1);
  EXPECT_GT(summary.workers(0).commits_applied(), 0u);
  EXPECT_GT(summary.final_metric(), 0.8) << "the evaluator's final point";
  EXPECT_FALSE(Contains(result.output, "restarting it")) << result.output;
  EXPECT_TRUE(std::filesystem::exists(out_ + "/logs/evaluator-site-a.log"));
}

// ---- `meridian site --with-workers` -----------------------------------------

class SiteWithWorkersTest : public ProgramRunTest {
 protected:
  // The job on a fixed free port: its workers connect to the address.
  pb::JobConfig SiteJob(double budget_s) {
    pb::JobConfig job = Job(budget_s);
    job.mutable_site(0)->set_address("tcp://127.0.0.1:" +
                                     std::to_string(FreePort()));
    return job;
  }

  std::string SiteCommand() const {
    return std::string(MERIDIAN_BINARY) + " site --config " + path_ +
           " --site site-a --with-workers --metrics none --out " + out_;
  }
};

TEST_F(SiteWithWorkersTest, KilledWorkerIsRestartedAndTheSiteSucceeds) {
  pb::JobConfig job = SiteJob(12);
  AddGroup(&job, 2, {});
  WriteJob(job);
  BackgroundCommand site(SiteCommand());
  const std::string log = out_ + "/logs/worker-site-a-1.log";
  ASSERT_TRUE(WaitFor([&] { return Contains(ReadFile(log), "joined; plan"); },
                      std::chrono::seconds(120)))
      << "worker 1 never joined";
  const std::vector<pid_t> first =
      Pids("--site site-a --index 1", {dir_, " worker "});
  ASSERT_EQ(first.size(), 1u);
  ::kill(first[0], SIGKILL);
  EXPECT_TRUE(WaitFor(
      [&] {
        const std::vector<pid_t> now =
            Pids("--site site-a --index 1", {dir_, " worker "});
        return now.size() == 1 && now[0] != first[0];
      },
      std::chrono::seconds(60)))
      << "worker 1 was not restarted";
  const CommandResult& result = site.Wait();
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_TRUE(Contains(result.output,
                       "worker 1 of site 'site-a' killed by signal 9 (Killed) "
                       "(restarting it in 0.2 s: restart 1 of 10)"))
      << result.output;
  EXPECT_TRUE(Contains(ReadFile(log),
                       "===== meridian site: restart 1 of 10 of worker 1 of "
                       "site 'site-a'"));
  pb::SiteSummary summary;
  ASSERT_OK(ReadJsonFile(out_ + "/site-site-a.json", &summary));
  ASSERT_EQ(summary.workers_size(), 2);
  EXPECT_EQ(summary.workers(1).incarnations(), 2u);
}

TEST_F(SiteWithWorkersTest, ProgramPastTheRestartLimitStopsTheSite) {
  pb::JobConfig job = SiteJob(60);
  AddGroup(&job, 1, {"sh", "-c", "exit 4", dir_});
  job.mutable_fault()->set_max_restarts(1);
  WriteJob(job);
  const CommandResult result = RunCommand(SiteCommand());
  EXPECT_FALSE(result.crashed);
  ASSERT_EQ(result.exit_code, 1) << result.output;
  EXPECT_TRUE(Contains(result.output,
                       "worker 0 of site 'site-a' (sh -c 'exit 4' " + dir_ +
                           ") exited with status 4 (not restarted: it was "
                           "restarted 1 times already, the limit "
                           "(fault.max_restarts))"))
      << result.output;
  // The site finished in order (its summary) instead of waiting 60 s.
  EXPECT_TRUE(std::filesystem::exists(out_ + "/site-site-a.json"));
}

}  // namespace
}  // namespace meridian
