// Live site servers (threads of this process, real ZeroMQ sockets on
// loopback) synchronising with each other while scripted workers commit
// known updates. After the final flush every site's model must equal the
// initial model plus the sum of every update any site applied: nothing
// lost, nothing applied twice — in a full mesh and through hubs, with a
// lossy (int8) pipeline whose residuals wait in the accumulators.
#include <gtest/gtest.h>

#include <random>
#include <thread>
#include <zmq.hpp>

#include "meridian/config/config.h"
#include "meridian/net/message.h"
#include "meridian/train/model.h"
#include "meridian/site/site_server.h"
#include "meridian/sync/sync.h"
#include "meridian/net/transport.h"
#include "testing/live_sites.h"
#include "testing/raw_zmtp.h"
#include "testing/test_data.h"
#include "testing/status_matchers.h"

namespace meridian {
namespace {

using std::chrono::milliseconds;
constexpr milliseconds kTimeout(20000);
constexpr int kCommits = 25;

struct Topology {
  std::string name;
  int sites;
  pb::TopologyKind kind;
};

void PrintTo(const Topology& topology, std::ostream* os) {
  *os << topology.name;
}

class SyncConservationTest : public ::testing::TestWithParam<Topology> {
 protected:
  static void SetUpTestSuite() {
    data_dir_ = new std::string(testing::MakeTempDir("sync-data"));
    testing::SyntheticDataOptions options;
    options.train_samples = 200;
    options.test_samples = 50;
    ASSERT_OK(testing::WriteSyntheticIdx(*data_dir_, options));
  }

  pb::JobConfig Job(const Topology& topology) {
    pb::JobConfig job = testing::SmallJob(*data_dir_, 1, /*hidden=*/8);
    job.clear_site();
    const std::string names = "abcd";
    for (int s = 0; s < topology.sites; ++s) {
      pb::SiteConfig* site = job.add_site();
      site->set_name(std::string(1, names[s]));
      site->add_workers()->set_count(1);
    }
    job.set_time_budget_s(120);
    job.mutable_server()->set_eval_period_s(30);
    // Plaintext (the same over CURVE: secure_sync_test.cc).
    job.mutable_security()->set_curve(false);
    pb::SyncConfig* sync = job.mutable_sync();
    sync->set_kind(pb::GAIA);
    sync->set_threshold(0.3);  // most changes wait, some go
    sync->set_max_clock_skew(2);
    sync->mutable_compression()->set_value_coding(pb::VALUE_INT8);
    sync->mutable_compression()->set_block_size(16);
    sync->mutable_compression()->set_zstd_level(1);
    sync->set_topology(topology.kind);
    if (topology.kind == pb::STAR) sync->set_hub("b");
    if (topology.kind == pb::GROUPS) {
      // std::string, not const char*: GCC 12 warns (-Wrestrict, falsely)
      // on the inlined const char* overload.
      pb::SiteGroup* g1 = sync->add_group();
      g1->set_hub("a");
      g1->add_site(std::string("b"));
      pb::SiteGroup* g2 = sync->add_group();
      g2->set_hub("c");
      g2->add_site(std::string("d"));
    }
    EXPECT_TRUE(ValidateJobConfig(job).empty())
        << FormatConfigIssues("job", ValidateJobConfig(job));
    return job;
  }

  static std::string* data_dir_;
};

std::string* SyncConservationTest::data_dir_ = nullptr;

TEST_P(SyncConservationTest, EverySiteEndsWithEveryUpdateOnce) {
  const pb::JobConfig job = Job(GetParam());
  // The MEAN apply rule (the default) divides every update by all workers of
  // the job once sites sync, wherever the update entered.
  ASSERT_EQ(job.server().apply_rule(), pb::MEAN);
  Result<testing::LiveSitesRun> run =
      testing::RunLiveSites(job, kCommits, /*seed_base=*/1000, kTimeout);
  ASSERT_OK(run);
  EXPECT_EQ(testing::EveryUpdateOnceProblems(job, *run), "");
  uint64_t sent = 0;
  for (const auto& server : run->servers) {
    sent += static_cast<uint64_t>(server->summary().sync().entries_sent());
  }
  EXPECT_GT(sent, 0u);
}

// SkewScout: models travel between the sites every other clock and are
// scored on the receivers' held-out samples; the travels are counted as
// sent bytes, answered, and fed to each site's controller — and nothing of
// a travelled model reaches a replica: every site still ends with exactly
// the initial model plus every update once.
TEST_F(SyncConservationTest, TravelledModelsAreScoredAndNeverApplied) {
  pb::JobConfig job = Job(Topology{"Mesh3", 3, pb::FULL_MESH});
  pb::SkewScoutConfig* scout = job.mutable_sync()->mutable_skewscout();
  scout->set_enabled(true);
  scout->set_travel_period(2);
  scout->set_holdout_samples(40);
  ASSERT_TRUE(ValidateJobConfig(job).empty())
      << FormatConfigIssues("job", ValidateJobConfig(job));
  Result<testing::LiveSitesRun> run =
      testing::RunLiveSites(job, kCommits, /*seed_base=*/2000, kTimeout);
  ASSERT_OK(run);
  EXPECT_EQ(testing::EveryUpdateOnceProblems(job, *run), "");
  const double model_bytes =
      static_cast<double>(run->expected.size()) * sizeof(float);
  uint64_t answered = 0, scored = 0;
  for (size_t s = 0; s < run->servers.size(); ++s) {
    const std::string& name = job.site(s).name();
    const pb::SyncSummary& sync = run->servers[s]->summary().sync();
    const pb::SkewScoutSummary& travel = sync.skewscout();
    EXPECT_GT(travel.travels_sent(), 0u) << name;
    // Every travel carries the whole model, int8-coded by default (a byte
    // per value plus a scale per 256), and is part of what was sent.
    EXPECT_GE(travel.travel_bytes(), 0.2 * travel.travels_sent() * model_bytes)
        << name;
    EXPECT_LE(travel.travel_bytes(), 0.4 * travel.travels_sent() * model_bytes)
        << name;
    EXPECT_GE(sync.bytes_sent(), travel.travel_bytes()) << name;
    EXPECT_EQ(travel.decisions_size(), travel.results_received()) << name;
    for (const pb::SkewDecisionRecord& decision : travel.decisions()) {
      EXPECT_EQ(decision.samples(), 40u) << name;
      EXPECT_GE(decision.own_accuracy(), 0) << name;
      EXPECT_LE(decision.own_accuracy(), 1) << name;
      EXPECT_NEAR(decision.estimate(),
                  decision.own_accuracy() - decision.travelled_accuracy(),
                  1e-12)
          << name;
      EXPECT_LE(decision.discordant(), decision.samples()) << name;
      EXPECT_GE(decision.theta_after(), 0.001) << name;
      EXPECT_LE(decision.theta_after(), 0.5) << name;
      // The period doubles while the estimate is low, from 2 up to 8 × 2.
      EXPECT_GE(decision.travel_period(), 2u) << name;
      EXPECT_LE(decision.travel_period(), 16u) << name;
    }
    answered += travel.results_received();
    scored += travel.travels_scored();
  }
  EXPECT_GT(answered, 0u);
  EXPECT_GE(scored, answered);
}

// SkewScout on top-k sync (threshold 0, TOP_K selection): the controller
// moves the density, within its bounds, and every update still arrives
// exactly once (what top-k leaves behind waits in the accumulators and
// goes with the final flush).
TEST_F(SyncConservationTest, TopKSyncHasTheDensityAsItsKnob) {
  pb::JobConfig job = Job(Topology{"Mesh3", 3, pb::FULL_MESH});
  pb::SyncConfig* sync = job.mutable_sync();
  sync->set_threshold(0);
  sync->mutable_compression()->set_selection(pb::TOP_K);
  sync->mutable_compression()->set_top_k_fraction(0.01);
  pb::SkewScoutConfig* scout = sync->mutable_skewscout();
  scout->set_enabled(true);
  scout->set_travel_period(2);
  scout->set_holdout_samples(40);
  scout->set_min_density(0.005);
  scout->set_max_density(0.08);
  ASSERT_TRUE(ValidateJobConfig(job).empty())
      << FormatConfigIssues("job", ValidateJobConfig(job));
  Result<testing::LiveSitesRun> run =
      testing::RunLiveSites(job, kCommits, /*seed_base=*/3000, kTimeout);
  ASSERT_OK(run);
  EXPECT_EQ(testing::EveryUpdateOnceProblems(job, *run), "");
  uint64_t decisions = 0;
  for (size_t s = 0; s < run->servers.size(); ++s) {
    const std::string& name = job.site(s).name();
    const pb::SyncSummary& summary = run->servers[s]->summary().sync();
    const pb::SkewScoutSummary& travel = summary.skewscout();
    EXPECT_EQ(travel.knob(), "top_k_fraction") << name;
    EXPECT_GE(travel.final_theta(), 0.005) << name;
    EXPECT_LE(travel.final_theta(), 0.08) << name;
    for (const pb::SkewDecisionRecord& decision : travel.decisions()) {
      EXPECT_GE(decision.theta_after(), 0.005) << name;
      EXPECT_LE(decision.theta_after(), 0.08) << name;
      // Denser on a tightening, sparser on a loosening.
      if (decision.action() == "tighten") {
        EXPECT_GT(decision.theta_after(), decision.theta_before()) << name;
      } else if (decision.action() == "loosen") {
        EXPECT_LT(decision.theta_after(), decision.theta_before()) << name;
      }
    }
    decisions += travel.decisions_size();
  }
  EXPECT_GT(decisions, 0u);
}

// sync.send_period_s: significant changes also go out between clocks (here
// on every turn of a site's event loop). Through hubs, a member's update
// is forwarded to the other hubs as soon as it arrives instead of at the
// hub's next clock; every update still arrives exactly once.
TEST_F(SyncConservationTest, ChangesSentBetweenClocksArriveOnce) {
  pb::JobConfig job = Job(Topology{"Groups4", 4, pb::GROUPS});
  job.mutable_sync()->set_send_period_s(0.001);
  ASSERT_TRUE(ValidateJobConfig(job).empty())
      << FormatConfigIssues("job", ValidateJobConfig(job));
  testing::LiveSitesOptions options;
  options.commits = kCommits;
  options.seed_base = 4000;
  options.timeout = kTimeout;
  // Paced, so that the event loops turn between the commits.
  options.commit_interval = milliseconds(20);
  Result<testing::LiveSitesRun> run = testing::RunLiveSites(job, options);
  ASSERT_OK(run);
  EXPECT_EQ(testing::EveryUpdateOnceProblems(job, *run), "");
  double between = 0, all = 0;
  for (const auto& server : run->servers) {
    between += server->summary().sync().updates_sent_between_clocks();
    all += server->summary().sync().updates_sent();
  }
  EXPECT_GT(between, 0);
  EXPECT_LE(between, all);
}

// Strangers at every mirror socket while the sites sync: four endless
// multipart messages each (in 1 KiB and in empty frames) and 50
// connections that drip a byte every 100 ms. The fronts hold each stranger
// at its credit, the peers' traffic passes, and every site still ends
// with every update once.
TEST_F(SyncConservationTest, StrangersAtTheMirrorSocketsDoNotStopTheSync) {
  const pb::JobConfig job = Job(Topology{"Mesh3", 3, pb::FULL_MESH});
  std::vector<std::unique_ptr<testing::Intruders>> intruders;
  testing::LiveSitesOptions options;
  options.commits = kCommits;
  options.seed_base = 5000;
  options.timeout = kTimeout;
  options.commit_interval = milliseconds(20);
  options.on_listening = [&](const std::vector<std::string>& mirrors) {
    for (const std::string& mirror : mirrors) {
      intruders.push_back(std::make_unique<testing::Intruders>(
          mirror, /*endless=*/4, /*drips=*/50));
    }
  };
  Result<testing::LiveSitesRun> run = testing::RunLiveSites(job, options);
  ASSERT_OK(run);
  EXPECT_EQ(testing::EveryUpdateOnceProblems(job, *run), "");
  for (const auto& intruder : intruders) {
    EXPECT_EQ(intruder->endless(), 4u);
    // Something went in, and no more than the kernel's buffers beyond the
    // front's credit (libzmq alone reads such a message without end).
    EXPECT_GT(intruder->max_stream_bytes(), 64u << 10);
    EXPECT_LT(intruder->max_stream_bytes(), 32u << 20);
  }
}

INSTANTIATE_TEST_SUITE_P(Topologies, SyncConservationTest,
                         ::testing::Values(Topology{"Mesh3", 3, pb::FULL_MESH},
                                           Topology{"Star3", 3, pb::STAR},
                                           Topology{"Groups4", 4, pb::GROUPS}),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace meridian
