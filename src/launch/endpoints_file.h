// OUT/endpoints.json (pb::RunEndpoints) of `meridian run`: where each site
// server and wanem serves its metrics (wanem also its control), and the
// state the launcher last saw each in ("running", "restarting (attempt 2 of
// 10)", "finished", "failed: ..."). `meridian top --run OUT` reads it on
// every refresh. Workers serve no metrics and are not listed.
//
// Ownership and threads: owned by the launcher's JobRun (the supervisor
// updates states through it) and used by the thread that called RunJob
// alone; not thread-safe.
// Size: one entry per site server and wanem, keyed by the child's name.
#ifndef MERIDIAN_LAUNCH_ENDPOINTS_FILE_H_
#define MERIDIAN_LAUNCH_ENDPOINTS_FILE_H_

#include <string>

#include "meridian/report.pb.h"

namespace meridian {

class EndpointsFile {
 public:
  EndpointsFile(std::string path, const std::string& job_name);
  EndpointsFile(const EndpointsFile&) = delete;
  EndpointsFile& operator=(const EndpointsFile&) = delete;

  // Records where child `name` serves its metrics and its state; "" address:
  // keep the one known (a child without one is not listed). Not written.
  void Set(const std::string& name, const std::string& role,
           const std::string& site, const std::string& address,
           const std::string& state);
  // The control endpoint of a listed child (wanem). Not written.
  void SetControlAddress(const std::string& name, const std::string& address);
  // Only the state of a listed child. Not written.
  void SetState(const std::string& name, const std::string& state);
  // The file, atomically; a failure is logged.
  void Write();

 private:
  pb::ProcessEndpoint* Find(const std::string& name);

  const std::string path_;
  pb::RunEndpoints endpoints_;
};

}  // namespace meridian

#endif  // MERIDIAN_LAUNCH_ENDPOINTS_FILE_H_
