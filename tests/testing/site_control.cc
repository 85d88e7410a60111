#include "testing/site_control.h"

#include <fstream>
#include <iterator>
#include <sstream>
#include <thread>
#include <vector>

#include "meridian/net/message.h"
#include "meridian/net/security.h"
#include "meridian/net/transport.h"

namespace meridian::testing {
namespace {

pb::Endpoint TestClient() {
  pb::Endpoint self;
  self.set_role(pb::ROLE_CLIENT);
  return self;
}

}  // namespace

Result<pb::SiteStatus> QueryStatus(zmq::context_t& context,
                                   const std::string& endpoint,
                                   std::chrono::milliseconds timeout) {
  RpcClient client(context, endpoint, TestClient());
  pb::Header request;
  request.set_type(pb::STATUS_REQUEST);
  MERIDIAN_ASSIGN_OR_RETURN(Envelope reply, client.Call(request, {}, timeout));
  if (reply.header.type() != pb::STATUS_REPLY) {
    return FailedPreconditionError("expected STATUS_REPLY, got " +
                                   DescribeHeader(reply.header));
  }
  return reply.header.status();
}

Status RequestShutdown(zmq::context_t& context, const std::string& endpoint,
                       const std::string& reason,
                       std::chrono::milliseconds timeout) {
  RpcClient client(context, endpoint, TestClient());
  pb::Header request;
  request.set_type(pb::SHUTDOWN);
  request.set_control_token(kTestControlToken);
  request.mutable_shutdown()->set_reason(reason);
  MERIDIAN_ASSIGN_OR_RETURN(Envelope reply, client.Call(request, {}, timeout));
  if (reply.header.type() != pb::STATUS_REPLY) {
    return FailedPreconditionError("SHUTDOWN answered with " +
                                   DescribeHeader(reply.header));
  }
  return Status::Ok();
}

bool WaitFor(const std::function<bool()>& condition,
             std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    if (condition()) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

Result<ChildProcess> SpawnWorker(const std::string& binary,
                                 const std::string& job_path,
                                 const std::string& site, uint32_t index,
                                 const std::string& endpoint,
                                 const std::string& log_path) {
  return ChildProcess::Spawn(
      site + "/w" + std::to_string(index),
      {binary, "worker", "--config", job_path, "--site", site, "--index",
       std::to_string(index), "--connect", endpoint},
      log_path);
}

Result<SiteProcess> SpawnSite(const std::string& binary,
                              const std::string& job_path,
                              const std::string& site,
                              const std::string& out_dir,
                              const std::string& log_path,
                              std::chrono::milliseconds timeout) {
  const std::string token_file = out_dir + "/control-" + site + ".token";
  MERIDIAN_RETURN_IF_ERROR(
      WriteControlTokenFile(token_file, kTestControlToken));
  MERIDIAN_ASSIGN_OR_RETURN(
      ChildProcess process,
      ChildProcess::Spawn(site + "/server",
                          {binary, "site", "--config", job_path, "--site", site,
                           "--bind", "tcp://127.0.0.1:*", "--out", out_dir,
                           "--ready-fd", std::to_string(kReadyFd), "--metrics",
                           "none", "--control-token-file", token_file},
                          log_path));
  // "ready <worker endpoint> [<mirror endpoint>] [metrics=...]"
  MERIDIAN_ASSIGN_OR_RETURN(std::string line, process.ReadReadyLine(timeout));
  std::istringstream words(line);
  std::string ready, endpoint;
  words >> ready >> endpoint;
  if (ready != "ready" || endpoint.empty()) {
    return InternalError("unexpected ready line '" + line + "'");
  }
  return SiteProcess{std::move(process), endpoint};
}


}  // namespace meridian::testing
