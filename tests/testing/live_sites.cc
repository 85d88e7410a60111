#include "testing/live_sites.h"

#include <cmath>
#include <thread>
#include <zmq.hpp>

#include "meridian/config.h"
#include "meridian/model.h"
#include "meridian/sync.h"
#include "meridian/transport.h"
#include "testing/scripted_worker.h"

namespace meridian::testing {
namespace {

pb::Endpoint Launcher() {
  pb::Endpoint self;
  self.set_role(pb::ROLE_LAUNCHER);
  return self;
}

Status Call(zmq::context_t& context, const SiteServer& server,
            const pb::Header& request, std::chrono::milliseconds timeout) {
  RpcClient control(context, server.endpoint(), Launcher());
  MERIDIAN_ASSIGN_OR_RETURN(Envelope reply,
                            control.Call(request, {}, timeout));
  if (reply.header.type() != pb::STATUS_REPLY) {
    return FailedPreconditionError(DescribeHeader(reply.header) + ": " +
                                   reply.header.error().message());
  }
  return Status::Ok();
}

}  // namespace

Result<LiveSitesRun> RunLiveSites(const pb::JobConfig& job, int commits,
                                  uint64_t seed_base,
                                  std::chrono::milliseconds timeout) {
  LiveSitesRun run;
  for (const pb::SiteConfig& site : job.site()) {
    SiteServerOptions options;
    options.job = job;
    options.site = site.name();
    options.bind = "tcp://127.0.0.1:*";
    options.mirror_bind = "tcp://127.0.0.1:*";
    MERIDIAN_ASSIGN_OR_RETURN(std::unique_ptr<SiteServer> server,
                              SiteServer::Create(std::move(options)));
    run.servers.push_back(std::move(server));
  }
  const size_t sites = run.servers.size();
  std::vector<Status> run_status(sites);
  std::vector<std::thread> threads;
  for (size_t s = 0; s < sites; ++s) {
    threads.emplace_back([&, s] { run_status[s] = run.servers[s]->Run(); });
  }
  zmq::context_t context;
  Status status;
  for (size_t s = 0; s < sites && status.ok(); ++s) {
    pb::Header request;
    request.set_type(pb::SET_PEERS);
    for (int p : RoleOf(job, static_cast<int>(s)).Peers()) {
      pb::Peer* peer = request.mutable_peers()->add_peer();
      peer->set_site(job.site(p).name());
      peer->set_endpoint(run.servers[p]->mirror_endpoint());
    }
    status = Call(context, *run.servers[s], request, timeout)
                 .WithContext("introducing the peers of " + job.site(s).name());
  }
  Result<std::unique_ptr<Model>> model = MakeModel(job.model(), 784, 10);
  if (status.ok() && !model.ok()) status = model.status();
  std::vector<std::vector<double>> sums(sites);
  if (status.ok()) {
    const ModelLayout& layout = (*model)->layout();
    std::vector<Status> worker_status(sites);
    std::vector<std::thread> workers;
    for (size_t s = 0; s < sites; ++s) {
      workers.emplace_back([&, s] {
        worker_status[s] = RunScriptedWorker(
            context, run.servers[s]->endpoint(), job.site(s).name(), layout,
            commits, seed_base + s, &sums[s], timeout);
      });
    }
    for (std::thread& t : workers) t.join();
    for (const Status& worker : worker_status) {
      if (status.ok()) status = worker;
    }
  } else {
    // Nothing will train: stop every server so its thread ends.
    pb::Header shutdown;
    shutdown.set_type(pb::SHUTDOWN);
    shutdown.mutable_shutdown()->set_reason("test set-up failed");
    for (const auto& server : run.servers) {
      Call(context, *server, shutdown, timeout).IgnoreError();
    }
  }
  for (std::thread& t : threads) t.join();
  MERIDIAN_RETURN_IF_ERROR(status);
  for (const Status& server : run_status) MERIDIAN_RETURN_IF_ERROR(server);

  std::vector<float> initial((*model)->layout().num_elements());
  (*model)->Initialize(job.seed(), initial);
  run.expected.assign(initial.begin(), initial.end());
  const double contributing = TotalWorkerCount(job);
  for (const std::vector<double>& sum : sums) {
    for (size_t i = 0; i < run.expected.size(); ++i) {
      run.expected[i] += sum[i] / contributing;
    }
  }
  return run;
}

size_t CountMismatches(const std::vector<float>& model,
                       const std::vector<double>& expected, double tolerance,
                       std::string* first) {
  if (model.size() != expected.size()) return std::max(model.size(), expected.size());
  size_t wrong = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    if (std::abs(model[i] - expected[i]) <= tolerance) continue;
    if (wrong++ < 3 && first != nullptr) {
      *first += "element " + std::to_string(i) + ": " +
                std::to_string(model[i]) + " != " +
                std::to_string(expected[i]) + "\n";
    }
  }
  return wrong;
}

}  // namespace meridian::testing
