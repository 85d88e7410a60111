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

#include "meridian/config.h"
#include "meridian/message.h"
#include "meridian/model.h"
#include "meridian/site_server.h"
#include "meridian/sync.h"
#include "meridian/transport.h"
#include "testing/scripted_worker.h"
#include "testing/test_data.h"

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
    ASSERT_TRUE(testing::WriteSyntheticIdx(*data_dir_, options).ok());
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
      pb::SiteGroup* g1 = sync->add_group();
      g1->set_hub("a");
      g1->add_site("b");
      pb::SiteGroup* g2 = sync->add_group();
      g2->set_hub("c");
      g2->add_site("d");
    }
    EXPECT_TRUE(ValidateJobConfig(job).empty())
        << FormatConfigIssues("job", ValidateJobConfig(job));
    return job;
  }

  static std::string* data_dir_;
};

std::string* SyncConservationTest::data_dir_ = nullptr;


TEST_P(SyncConservationTest, EverySiteEndsWithEveryUpdateOnce) {
  const Topology topology = GetParam();
  const pb::JobConfig job = Job(topology);
  std::vector<std::unique_ptr<SiteServer>> servers;
  for (const pb::SiteConfig& site : job.site()) {
    SiteServerOptions options;
    options.job = job;
    options.site = site.name();
    options.bind = "tcp://127.0.0.1:*";
    options.mirror_bind = "tcp://127.0.0.1:*";
    Result<std::unique_ptr<SiteServer>> server =
        SiteServer::Create(std::move(options));
    ASSERT_TRUE(server.ok()) << server.status();
    servers.push_back(std::move(*server));
  }
  std::vector<Status> run_status(servers.size());
  std::vector<std::thread> threads;
  for (size_t s = 0; s < servers.size(); ++s) {
    threads.emplace_back([&, s] { run_status[s] = servers[s]->Run(); });
  }
  // What the launcher does: tell each site where its peers listen.
  zmq::context_t context;
  for (size_t s = 0; s < servers.size(); ++s) {
    pb::Header request;
    request.set_type(pb::SET_PEERS);
    for (int p : RoleOf(job, static_cast<int>(s)).Peers()) {
      pb::Peer* peer = request.mutable_peers()->add_peer();
      peer->set_site(job.site(p).name());
      peer->set_endpoint(servers[p]->mirror_endpoint());
    }
    pb::Endpoint launcher;
    launcher.set_role(pb::ROLE_LAUNCHER);
    RpcClient control(context, servers[s]->endpoint(), launcher);
    Result<Envelope> reply = control.Call(request, {}, kTimeout);
    ASSERT_TRUE(reply.ok()) << reply.status();
    ASSERT_EQ(reply->header.type(), pb::STATUS_REPLY)
        << reply->header.error().message();
  }
  Result<std::unique_ptr<Model>> model = MakeModel(job.model(), 784, 10);
  ASSERT_TRUE(model.ok());
  const ModelLayout& layout = (*model)->layout();
  std::vector<std::vector<double>> sums(servers.size());
  std::vector<Status> worker_status(servers.size());
  std::vector<std::thread> workers;
  for (size_t s = 0; s < servers.size(); ++s) {
    workers.emplace_back([&, s] {
      worker_status[s] =
          testing::RunScriptedWorker(context, servers[s]->endpoint(),
                                     job.site(s).name(), layout, kCommits,
                                     1000 + s, &sums[s], kTimeout);
    });
  }
  for (std::thread& t : workers) t.join();
  for (std::thread& t : threads) t.join();
  for (size_t s = 0; s < servers.size(); ++s) {
    ASSERT_TRUE(worker_status[s].ok()) << worker_status[s];
    ASSERT_TRUE(run_status[s].ok()) << run_status[s];
    ASSERT_TRUE(servers[s]->summary().sync().flushed())
        << job.site(s).name() << " missed a final flush";
  }

  std::vector<float> initial(layout.num_elements());
  (*model)->Initialize(job.seed(), initial);
  std::vector<double> expected(initial.begin(), initial.end());
  // The MEAN apply rule (the default) divides every update by all workers of
  // the job once sites sync, wherever the update entered.
  ASSERT_EQ(job.server().apply_rule(), pb::MEAN);
  const double contributing = TotalWorkerCount(job);
  for (const auto& sum : sums) {
    for (size_t i = 0; i < expected.size(); ++i) {
      expected[i] += sum[i] / contributing;
    }
  }
  uint64_t sent = 0;
  for (size_t s = 0; s < servers.size(); ++s) {
    const std::vector<float> final_model = servers[s]->Snapshot();
    ASSERT_EQ(final_model.size(), expected.size());
    size_t wrong = 0;
    for (size_t i = 0; i < expected.size(); ++i) {
      if (std::abs(final_model[i] - expected[i]) > 1e-4) {
        if (wrong++ < 3) {
          ADD_FAILURE() << job.site(s).name() << " element " << i << ": "
                        << final_model[i] << " != " << expected[i];
        }
      }
    }
    EXPECT_EQ(wrong, 0u) << job.site(s).name();
    sent += static_cast<uint64_t>(servers[s]->summary().sync().entries_sent());
  }
  EXPECT_GT(sent, 0u);
}

INSTANTIATE_TEST_SUITE_P(Topologies, SyncConservationTest,
                         ::testing::Values(Topology{"Mesh3", 3, pb::FULL_MESH},
                                           Topology{"Star3", 3, pb::STAR},
                                           Topology{"Groups4", 4, pb::GROUPS}),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace meridian
