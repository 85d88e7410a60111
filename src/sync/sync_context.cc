#include "sync/sync_context.h"

#include <algorithm>
#include <random>

#include "sync/outer_steps.h"

namespace meridian {
namespace {

uint64_t NewIncarnation() {
  std::random_device device;
  std::mt19937_64 rng((uint64_t{device()} << 32) ^ device());
  uint64_t incarnation = 0;
  while (incarnation == 0) incarnation = rng();
  return incarnation;
}

pb::Endpoint SiteServerEndpoint(const std::string& name) {
  pb::Endpoint self;
  self.set_site(name);
  self.set_role(pb::ROLE_SITE_SERVER);
  return self;
}

}  // namespace

SyncContext::SyncContext(const SyncEngineOptions& options)
    : job(*options.job),
      sync(job.sync()),
      fault(job.fault()),
      site_index(options.site_index),
      name(job.site(site_index).name()),
      store(options.store),
      zmq(options.context),
      clock(options.clock),
      wall_clock(options.wall_clock),
      role(RoleOf(job, site_index)),
      self(SiteServerEndpoint(name)),
      incarnation(NewIncarnation()) {}

bool SyncContext::UsesAccumulators() const {
  return !HasOuterRounds(sync.kind());
}

bool SyncContext::IsMember(int site) const {
  return std::find(role.members.begin(), role.members.end(), site) !=
         role.members.end();
}

bool SyncContext::IsHub(int site) const {
  return std::find(role.hubs.begin(), role.hubs.end(), site) != role.hubs.end();
}

std::vector<std::string> SyncContext::PeerNames() const {
  std::vector<std::string> names;
  for (int peer : role.Peers()) names.push_back(job.site(peer).name());
  return names;
}

std::string SyncContext::PeerList() const {
  std::string out;
  for (const std::string& peer : PeerNames()) {
    out += (out.empty() ? "" : ", ") + peer;
  }
  return out.empty() ? "nobody" : out;
}

std::string SyncContext::RoleName() const {
  switch (role.kind) {
    case SyncRole::Kind::kMesh:
      return "mesh node";
    case SyncRole::Kind::kHub:
      return "hub";
    case SyncRole::Kind::kMember:
      return "member of hub '" + job.site(role.hub).name() + "'";
  }
  return "?";
}

}  // namespace meridian
