// Site servers syncing through a real `meridian wanem` process while the
// test breaks the WAN under them: a partition of one site from the others
// (under each partition policy) and forced resets of a link's TCP
// connections, which lose whatever they carried. Scripted workers commit
// known updates; after the final flush every site must hold the initial
// model plus every update exactly once — nothing lost with a broken
// connection, nothing applied twice after a resend.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <thread>

#include "meridian/config/config.h"
#include "meridian/site/site_server.h"
#include "testing/live_sites.h"
#include "testing/test_data.h"
#include "testing/status_matchers.h"

namespace meridian {
namespace {

using std::chrono::milliseconds;

class SyncFaultTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    data_dir_ = new std::string(testing::MakeTempDir("sync-fault-data"));
    testing::SyntheticDataOptions options;
    options.train_samples = 200;
    options.test_samples = 50;
    ASSERT_OK(testing::WriteSyntheticIdx(*data_dir_, options));
  }

  // Three sites in a full mesh, one scripted worker each; faults detected
  // within about a second.
  pb::JobConfig Job(pb::PartitionPolicy policy) {
    pb::JobConfig job = testing::SmallJob(*data_dir_, 1, /*hidden=*/8);
    job.clear_site();
    for (const char* name : {"a", "b", "c"}) {
      pb::SiteConfig* site = job.add_site();
      site->set_name(name);
      site->add_workers()->set_count(1);
    }
    job.set_time_budget_s(300);
    job.mutable_server()->set_eval_period_s(30);
    job.mutable_security()->set_curve(false);
    pb::SyncConfig* sync = job.mutable_sync();
    sync->set_kind(pb::GAIA);
    sync->set_threshold(0.3);
    sync->set_max_clock_skew(3);
    sync->mutable_compression()->set_value_coding(pb::VALUE_INT8);
    sync->mutable_compression()->set_block_size(16);
    // 50 ms each way: messages are always on the way when a link breaks.
    job.mutable_wan()->mutable_default_link()->set_latency("50ms");
    pb::FaultConfig* fault = job.mutable_fault();
    fault->set_heartbeat_interval_s(0.2);
    fault->set_peer_timeout_s(1.0);
    fault->set_worker_timeout_s(60);  // the scripted workers are not at fault
    fault->set_server_timeout_s(60);
    fault->set_partition_policy(policy);
    fault->set_checkpoint_period_s(0);
    EXPECT_TRUE(ValidateJobConfig(job).empty())
        << FormatConfigIssues("job", ValidateJobConfig(job));
    return job;
  }

  testing::LiveSitesOptions Options() {
    testing::LiveSitesOptions options;
    options.commits = 120;
    options.seed_base = 3000;
    options.timeout = milliseconds(120000);
    options.commit_interval = milliseconds(40);  // about 5 s of training
    options.through_wanem = true;
    options.meridian_binary = MERIDIAN_BINARY;
    options.work_dir = testing::MakeTempDir("sync-fault");
    return options;
  }

  // Every site flushed and holds every update once.
  void ExpectEveryUpdateOnce(const pb::JobConfig& job,
                             const testing::LiveSitesRun& run) {
    EXPECT_EQ(testing::EveryUpdateOnceProblems(job, run), "");
  }

  static bool HasEvent(const pb::SiteSummary& summary, pb::FaultKind kind) {
    for (const pb::FaultEvent& event : summary.events()) {
      if (event.kind() == kind) return true;
    }
    return false;
  }

  static std::string* data_dir_;
};

std::string* SyncFaultTest::data_dir_ = nullptr;

// After 0.8 s of training, site c is cut off from a and b for `cut`
// (the emulator holds the bytes), then healed.
std::function<void(wan::ControlClient*)> PartitionCFor(milliseconds cut) {
  return [cut](wan::ControlClient* wanem) {
    std::this_thread::sleep_for(milliseconds(800));
    ASSERT_OK(wanem->Partition("a-c"));
    ASSERT_OK(wanem->Partition("b-c"));
    std::this_thread::sleep_for(cut);
    ASSERT_OK(wanem->Heal("a-c"));
    ASSERT_OK(wanem->Heal("b-c"));
  };
}

// Site c is cut off from a and b for 2.5 s (the emulator holds the bytes,
// as a real partition would lose them in TCP buffers); a and b go on
// (PARTITION_CONTINUE), c too, and after the heal every change crosses
// once.
TEST_F(SyncFaultTest, PartitionContinueAndHealKeepsEveryUpdateOnce) {
  const pb::JobConfig job = Job(pb::PARTITION_CONTINUE);
  testing::LiveSitesOptions options = Options();
  options.during = PartitionCFor(milliseconds(2500));
  Result<testing::LiveSitesRun> run = testing::RunLiveSites(job, options);
  ASSERT_OK(run);
  ExpectEveryUpdateOnce(job, *run);
  // Everyone noticed, and saw c (or a and b) come back.
  for (const auto& server : run->servers) {
    EXPECT_TRUE(HasEvent(server->summary(), pb::PEER_UNREACHABLE))
        << server->summary().name();
    EXPECT_TRUE(HasEvent(server->summary(), pb::PEER_REACHABLE))
        << server->summary().name();
    EXPECT_GT(server->summary().sync().unreachable_s(), 0)
        << server->summary().name();
  }
}

// The same under PARTITION_BLOCK: the DS bound holds the sites' workers
// until c is back, and a site whose workers are held for seconds says why
// in its log; nothing is lost either.
TEST_F(SyncFaultTest, PartitionBlockAndHealKeepsEveryUpdateOnce) {
  const pb::JobConfig job = Job(pb::PARTITION_BLOCK);
  testing::LiveSitesOptions options = Options();
  // Longer than a hold before the site explains it (5 s, then 1 s on).
  options.during = PartitionCFor(milliseconds(7500));
  ::testing::internal::CaptureStderr();
  Result<testing::LiveSitesRun> run = testing::RunLiveSites(job, options);
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_OK(run);
  ExpectEveryUpdateOnce(job, *run);
  double held = 0;
  for (const auto& server : run->servers) {
    held += server->summary().sync().blocked_s();
  }
  EXPECT_GT(held, 0) << "the DS bound never held a worker during the cut";
  // e.g. "1 worker(s) held by the sync for up to 6.0 s: local clock 12,
  // DS 3, bounding clock 8; b: clock 14, counted, ...; c: clock 8,
  // counted, unreachable, ..."
  const size_t line = log.find("held by the sync for up to");
  ASSERT_NE(line, std::string::npos) << log;
  const std::string held_line = log.substr(line, log.find('\n', line) - line);
  EXPECT_NE(held_line.find("DS 3, bounding clock"), std::string::npos)
      << held_line;
  EXPECT_NE(held_line.find("counted, unreachable"), std::string::npos)
      << held_line;
}

// Every connection of two links is closed again and again while updates
// flow: what they carried is lost, the receivers notice the gaps and ask
// for it again, and the duplicates a resend brings are dropped.
TEST_F(SyncFaultTest, ResetConnectionsLoseNothingAndDuplicateNothing) {
  const pb::JobConfig job = Job(pb::PARTITION_CONTINUE);
  testing::LiveSitesOptions options = Options();
  options.during = [](wan::ControlClient* wanem) {
    for (int i = 0; i < 8; ++i) {
      std::this_thread::sleep_for(milliseconds(400));
      ASSERT_OK(wanem->Reset("a-b"));
      ASSERT_OK(wanem->Reset(i % 2 == 0 ? "a-c" : "b-c"));
    }
  };
  Result<testing::LiveSitesRun> run = testing::RunLiveSites(job, options);
  ASSERT_OK(run);
  ExpectEveryUpdateOnce(job, *run);
  double resent = 0;
  for (const auto& server : run->servers) {
    resent += server->summary().sync().resent();
  }
  EXPECT_GT(resent, 0) << "no reset ever lost a message: the test is weak";
}

// A link slowed at run time (not in the job file: its budget still says
// 100 Mbit/s) raises the bandwidth-adaptive threshold of the sites that
// send over it, from what the link delivers; nothing is lost meanwhile.
TEST_F(SyncFaultTest, ALinkSlowedAtRunTimeRaisesTheThreshold) {
  pb::JobConfig job = Job(pb::PARTITION_CONTINUE);
  job.mutable_sync()->set_threshold(0.01);  // much to send
  job.mutable_sync()->set_adaptive_threshold(true);
  job.mutable_sync()->set_adaptive_step(0.01);
  job.mutable_sync()->set_adaptive_max(0.5);
  job.mutable_wan()->mutable_default_link()->set_bandwidth("100mbit");
  // A 64 kbit/s link delivers its 16 KiB window in 2 s: silence for less
  // than that is not a dead peer.
  job.mutable_fault()->set_peer_timeout_s(10);
  testing::LiveSitesOptions options = Options();
  options.during = [](wan::ControlClient* wanem) {
    std::this_thread::sleep_for(milliseconds(500));
    pb::LinkDirectionConfig slow;
    slow.set_bandwidth("64kbit");
    ASSERT_OK(wanem->Set("a-b", pb::BOTH, slow));
  };
  Result<testing::LiveSitesRun> run = testing::RunLiveSites(job, options);
  ASSERT_OK(run);
  ExpectEveryUpdateOnce(job, *run);
  for (int s : {0, 1}) {
    EXPECT_GT(run->servers[s]->summary().sync().final_theta(), 0.05)
        << job.site(s).name() << " sends over the slowed link";
  }
}

}  // namespace
}  // namespace meridian
