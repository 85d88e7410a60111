#include "launch/endpoints_file.h"

#include <utility>

#include "meridian/core/log.h"
#include "meridian/report/report.h"

namespace meridian {

EndpointsFile::EndpointsFile(std::string path, const std::string& job_name)
    : path_(std::move(path)) {
  endpoints_.set_job(job_name);
}

void EndpointsFile::Set(const std::string& name, const std::string& role,
                        const std::string& site, const std::string& address,
                        const std::string& state) {
  pb::ProcessEndpoint* entry = Find(name);
  if (entry == nullptr) {
    if (address.empty()) return;  // no metrics: nothing to list
    entry = endpoints_.add_process();
    entry->set_name(name);
    entry->set_role(role);
    entry->set_site(site);
  }
  if (!address.empty()) {
    entry->set_metrics_address(address);
    entry->set_metrics_url("http://" + address + "/metrics");
  }
  entry->set_state(state);
}

void EndpointsFile::SetControlAddress(const std::string& name,
                                      const std::string& address) {
  for (pb::ProcessEndpoint& entry : *endpoints_.mutable_process()) {
    if (entry.name() == name) entry.set_control_address(address);
  }
}

void EndpointsFile::SetState(const std::string& name,
                             const std::string& state) {
  for (pb::ProcessEndpoint& entry : *endpoints_.mutable_process()) {
    if (entry.name() == name) entry.set_state(state);
  }
}

void EndpointsFile::Write() {
  Status written = WriteJsonFile(endpoints_, path_);
  if (!written.ok()) MLOG(WARNING) << written;
}

// The last entry of that name (names are unique).
pb::ProcessEndpoint* EndpointsFile::Find(const std::string& name) {
  pb::ProcessEndpoint* found = nullptr;
  for (pb::ProcessEndpoint& entry : *endpoints_.mutable_process()) {
    if (entry.name() == name) found = &entry;
  }
  return found;
}

}  // namespace meridian
