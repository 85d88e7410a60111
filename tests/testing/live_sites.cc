#include "testing/live_sites.h"

#include <google/protobuf/text_format.h>
#include <signal.h>

#include <cmath>
#include <fstream>
#include <optional>
#include <thread>
#include <zmq.hpp>

#include "meridian/config/config.h"
#include "meridian/train/model.h"
#include "meridian/sync/sync.h"
#include "meridian/net/transport.h"
#include "meridian/core/process.h"
#include "testing/scripted_worker.h"
#include "testing/site_control.h"

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
  MERIDIAN_ASSIGN_OR_RETURN(Envelope reply, control.Call(request, {}, timeout));
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
  LiveSitesOptions options;
  options.commits = commits;
  options.seed_base = seed_base;
  options.timeout = timeout;
  return RunLiveSites(job, options);
}

namespace {

// A `meridian wanem` child with every link of `job` and no routes yet.
Result<ChildProcess> StartWanem(const pb::JobConfig& job,
                                const LiveSitesOptions& options,
                                std::string* control) {
  const std::string config = options.work_dir + "/wanem-job.pbtxt";
  std::string text;
  if (!google::protobuf::TextFormat::PrintToString(job, &text)) {
    return InternalError("cannot print the job");
  }
  std::ofstream(config) << text;
  MERIDIAN_ASSIGN_OR_RETURN(
      ChildProcess wanem,
      ChildProcess::Spawn(
          "wanem",
          {options.meridian_binary, "wanem", "--config", config,
           "--dynamic-routes", "--control", "tcp://127.0.0.1:0", "--ready-fd",
           std::to_string(kReadyFd), "--metrics", "none"},
          options.work_dir + "/wanem.log"));
  MERIDIAN_ASSIGN_OR_RETURN(std::string line,
                            wanem.ReadReadyLine(std::chrono::seconds(60)));
  if (line.rfind("ready ", 0) != 0) {
    return UnavailableError("wanem said '" + line + "'");
  }
  *control = line.substr(6);
  return wanem;
}

// Where site `from` reaches `target` (site `to`'s mirror endpoint):
// through a wanem route when there is one.
Result<std::string> Route(const pb::JobConfig& job, wan::ControlClient* wanem,
                          int from, int to, const std::string& target) {
  if (wanem == nullptr) return target;
  const int a = std::min(from, to);
  const int b = std::max(from, to);
  MERIDIAN_ASSIGN_OR_RETURN(
      std::string listen,
      wanem->AddRoute(job.site(a).name() + "-" + job.site(b).name(),
                      job.site(from).name(), "127.0.0.1:0",
                      target.substr(std::string("tcp://").size())));
  return "tcp://" + listen;
}

}  // namespace

Result<LiveSitesRun> RunLiveSites(const pb::JobConfig& job,
                                  const LiveSitesOptions& options) {
  const std::chrono::milliseconds timeout = options.timeout;
  std::optional<ChildProcess> wanem_process;
  std::unique_ptr<wan::ControlClient> wanem;
  if (options.through_wanem) {
    std::string control;
    MERIDIAN_ASSIGN_OR_RETURN(ChildProcess child,
                              StartWanem(job, options, &control));
    wanem_process.emplace(std::move(child));
    wanem = std::make_unique<wan::ControlClient>(control);
  }
  LiveSitesRun run;
  for (const pb::SiteConfig& site : job.site()) {
    SiteServerOptions server_options;
    server_options.job = job;
    server_options.site = site.name();
    server_options.bind = "tcp://127.0.0.1:*";
    server_options.mirror_bind = "tcp://127.0.0.1:*";
    server_options.control_token = kTestControlToken;
    MERIDIAN_ASSIGN_OR_RETURN(std::unique_ptr<SiteServer> server,
                              SiteServer::Create(std::move(server_options)));
    run.servers.push_back(std::move(server));
  }
  const size_t sites = run.servers.size();
  if (options.on_listening) {
    std::vector<std::string> mirrors;
    for (const auto& server : run.servers) {
      mirrors.push_back(server->mirror_endpoint());
    }
    options.on_listening(mirrors);
  }
  // Threads: one per server (its Run), one scripted worker per site, and
  // the fault script. Each writes only its own slot of run_status,
  // worker_status and sums, read after the joins, so nothing is shared
  // under a lock.
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
    request.set_control_token(kTestControlToken);
    for (int p : RoleOf(job, static_cast<int>(s)).Peers()) {
      Result<std::string> endpoint =
          Route(job, wanem.get(), static_cast<int>(s), p,
                run.servers[p]->mirror_endpoint());
      if (!endpoint.ok()) {
        status = endpoint.status();
        break;
      }
      pb::Peer* peer = request.mutable_peers()->add_peer();
      peer->set_site(job.site(p).name());
      peer->set_endpoint(*endpoint);
    }
    if (!status.ok()) break;
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
            options.commits, options.seed_base + s, &sums[s], timeout,
            options.commit_interval);
      });
    }
    if (options.during) options.during(wanem.get());
    for (std::thread& t : workers) t.join();
    for (const Status& worker : worker_status) {
      if (status.ok()) status = worker;
    }
  } else {
    // Nothing will train: stop every server so its thread ends.
    pb::Header shutdown;
    shutdown.set_type(pb::SHUTDOWN);
    shutdown.set_control_token(kTestControlToken);
    shutdown.mutable_shutdown()->set_reason("test set-up failed");
    for (const auto& server : run.servers) {
      Call(context, *server, shutdown, timeout).IgnoreError();
    }
  }
  for (std::thread& t : threads) t.join();
  if (wanem_process) wanem_process->Signal(SIGTERM);
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
  if (model.size() != expected.size())
    return std::max(model.size(), expected.size());
  size_t wrong = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    if (std::abs(model[i] - expected[i]) <= tolerance) continue;
    if (wrong++ < 3 && first != nullptr) {
      *first += "element " + std::to_string(i) + ": " +
                std::to_string(model[i]) +
                " != " + std::to_string(expected[i]) + "\n";
    }
  }
  return wrong;
}

std::string EveryUpdateOnceProblems(const pb::JobConfig& job,
                                    const LiveSitesRun& run) {
  std::string problems;
  for (size_t s = 0; s < run.servers.size(); ++s) {
    const SiteServer& server = *run.servers[s];
    const std::string& name = job.site(static_cast<int>(s)).name();
    if (!server.summary().sync().flushed()) {
      problems += name + " missed a final flush\n";
    }
    std::string first;
    const size_t mismatches =
        CountMismatches(server.Snapshot(), run.expected, 1e-4, &first);
    if (mismatches > 0) {
      problems += name + ": " + std::to_string(mismatches) +
                  " elements differ from every update once:\n" + first;
    }
  }
  return problems;
}

}  // namespace meridian::testing
