#include "launch/wanem_control.h"

#include <algorithm>
#include <utility>

#include "meridian/core/log.h"
#include "meridian/wan/presets.h"

namespace meridian {

WanemControl::WanemControl(const pb::JobConfig& job, RunManifestFile* manifest,
                           const Stopwatch* wall)
    : job_(job), manifest_(manifest), wall_(wall) {}

void WanemControl::Connect(const std::string& endpoint) {
  client_ = std::make_unique<wan::ControlClient>(endpoint, kControlTimeout);
  poll_client_ =
      std::make_unique<wan::ControlClient>(endpoint, kCounterPollTimeout);
  manifest_->StartWanIncarnation();
  routes_added_.assign(routes_.size(), false);
  next_poll_s_ = wall_->ElapsedSeconds() + kWanPollPeriodS;
}

Result<std::string> WanemControl::Route(int from, int to,
                                        const std::string& target) {
  const int a = std::min(from, to);
  const int b = std::max(from, to);
  return AddRoute(job_.site(a).name() + "-" + job_.site(b).name(),
                  job_.site(from).name(), target);
}

Result<std::string> WanemControl::RouteWorker(int site, uint32_t index,
                                              const std::string& target) {
  const std::string end = wan::WorkerLinkEnd(job_.site(site).name(), index);
  return AddRoute(end + "-" + job_.site(site).name(), end, target);
}

Result<std::string> WanemControl::AddRoute(std::string link,
                                           std::string from_end,
                                           const std::string& target) {
  if (!client_) return target;
  const std::string prefix = "tcp://";
  if (target.rfind(prefix, 0) != 0) {
    return InvalidArgumentError("cannot route '" + target +
                                "' through wanem: only tcp:// endpoints");
  }
  RouteRecord route;
  route.link = std::move(link);
  route.from_site = std::move(from_end);
  route.forward = target.substr(prefix.size());
  MERIDIAN_ASSIGN_OR_RETURN(route.listen,
                            client_->AddRoute(route.link, route.from_site,
                                              "127.0.0.1:0", route.forward));
  routes_.push_back(route);
  routes_added_.push_back(true);
  return prefix + route.listen;
}

Status WanemControl::ReAddRoutes() {
  for (size_t r = 0; r < routes_.size(); ++r) {
    if (routes_added_[r]) continue;
    const RouteRecord& route = routes_[r];
    Result<std::string> bound = client_->AddRoute(route.link, route.from_site,
                                                  route.listen, route.forward);
    if (!bound.ok()) {
      return UnavailableError(
          "route " + route.listen + " -> " + route.forward + " of link " +
          route.link + " could not be re-added: " + bound.status().message());
    }
    routes_added_[r] = true;
  }
  return Status::Ok();
}

void WanemControl::Poll() {
  if (!client_ || wall_->ElapsedSeconds() < next_poll_s_) return;
  next_poll_s_ = wall_->ElapsedSeconds() + kWanPollPeriodS;
  ReadCounters(*poll_client_, /*final=*/false);
}

void WanemControl::ReadFinal() {
  if (client_) ReadCounters(*client_, /*final=*/true);
}

void WanemControl::Ended() {
  client_.reset();
  poll_client_.reset();
  manifest_->EndWanIncarnation();
}

void WanemControl::ReadCounters(wan::ControlClient& client, bool final) {
  if (!manifest_->has_wan_incarnation()) return;
  Result<pb::WanControlReply> status = client.GetStatus();
  if (!status.ok()) {
    if (final) {
      MLOG(ERROR) << "cannot read wanem's final counters: " << status.status();
    }
    return;
  }
  manifest_->RecordWanCounters(wan::LinkTrafficFromReply(*status), final);
}

}  // namespace meridian
