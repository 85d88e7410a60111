// Talking to a running site server from a test: its status, a shutdown,
// waiting for a condition, and starting the meridian binary's roles as
// child processes (ChildProcess kills and reaps them when it goes away).
#ifndef MERIDIAN_TESTS_TESTING_SITE_CONTROL_H_
#define MERIDIAN_TESTS_TESTING_SITE_CONTROL_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <zmq.hpp>

#include "meridian/report.pb.h"
#include "meridian/core/status.h"
#include "meridian/core/process.h"
#include "testing/text.h"  // ReadFile, for the callers of these

namespace meridian::testing {

// The site server's STATUS_REPLY (a fresh connection per call, so that a
// server that does not answer leaves nothing owed behind).
Result<pb::SiteStatus> QueryStatus(zmq::context_t& context,
                                   const std::string& endpoint,
                                   std::chrono::milliseconds timeout);

// The control token of the site servers tests start (in process:
// SiteServerOptions::control_token; SpawnSite passes it in a file).
inline constexpr char kTestControlToken[] =
    "meridianTestControlToken0123456789abcdef";

// Asks the site server to finish the job (SHUTDOWN with kTestControlToken).
Status RequestShutdown(zmq::context_t& context, const std::string& endpoint,
                       const std::string& reason,
                       std::chrono::milliseconds timeout);

// Calls `condition` every 50 ms until it returns true (then true) or
// `timeout` passes (then false). For waiting on processes: no fixed sleeps.
bool WaitFor(const std::function<bool()>& condition,
             std::chrono::milliseconds timeout);

// `binary worker --config JOB --site SITE --index INDEX --connect ENDPOINT`
// with stdout and stderr appended to `log_path`.
Result<ChildProcess> SpawnWorker(const std::string& binary,
                                 const std::string& job_path,
                                 const std::string& site, uint32_t index,
                                 const std::string& endpoint,
                                 const std::string& log_path);

// `binary site` for `site` of JOB on a free loopback port, summary in
// `out_dir`; returns once it listens, with the endpoint workers connect to.
struct SiteProcess {
  ChildProcess process;
  std::string endpoint;
};
Result<SiteProcess> SpawnSite(const std::string& binary,
                              const std::string& job_path,
                              const std::string& site,
                              const std::string& out_dir,
                              const std::string& log_path,
                              std::chrono::milliseconds timeout);

}  // namespace meridian::testing

#endif  // MERIDIAN_TESTS_TESTING_SITE_CONTROL_H_
