#include <algorithm>

#include "meridian/config/config.h"
#include "meridian/sync/sync.h"

namespace meridian {
namespace {

int SiteIndex(const pb::JobConfig& config, const std::string& name) {
  Result<int> index = FindSite(config, name);
  return index.ok() ? *index : -1;
}

// Sites that run a server, i.e. take part in the sync.
std::vector<int> SyncSites(const pb::JobConfig& config) {
  std::vector<int> sites;
  for (int s = 0; s < config.site_size(); ++s) {
    if (HasServer(config.site(s))) sites.push_back(s);
  }
  return sites;
}

// (hub, members) of every group under STAR or GROUPS.
std::vector<std::pair<int, std::vector<int>>> Groups(
    const pb::JobConfig& config) {
  std::vector<std::pair<int, std::vector<int>>> groups;
  const pb::SyncConfig& sync = config.sync();
  if (sync.topology() == pb::STAR) {
    const int hub = SiteIndex(config, sync.hub());
    std::vector<int> members;
    for (int s : SyncSites(config)) {
      if (s != hub) members.push_back(s);
    }
    groups.emplace_back(hub, std::move(members));
  } else if (sync.topology() == pb::GROUPS) {
    for (const pb::SiteGroup& group : sync.group()) {
      std::vector<int> members;
      for (const std::string& site : group.site()) {
        members.push_back(SiteIndex(config, site));
      }
      groups.emplace_back(SiteIndex(config, group.hub()), std::move(members));
    }
  }
  return groups;
}

}  // namespace

std::vector<int> SyncRole::Peers() const {
  switch (kind) {
    case Kind::kMesh:
      return mesh;
    case Kind::kMember:
      return {hub};
    case Kind::kHub: {
      std::vector<int> peers = members;
      peers.insert(peers.end(), hubs.begin(), hubs.end());
      return peers;
    }
  }
  return {};
}

SyncRole RoleOf(const pb::JobConfig& config, int site_index) {
  SyncRole role;
  if (config.sync().topology() == pb::FULL_MESH ||
      config.sync().topology() == pb::TOPOLOGY_KIND_UNSPECIFIED) {
    for (int s : SyncSites(config)) {
      if (s != site_index) role.mesh.push_back(s);
    }
    return role;
  }
  const auto groups = Groups(config);
  for (const auto& [hub, members] : groups) {
    if (hub == site_index) {
      role.kind = SyncRole::Kind::kHub;
      role.members = members;
      for (const auto& [other_hub, unused] : groups) {
        if (other_hub != hub) role.hubs.push_back(other_hub);
      }
      return role;
    }
    if (std::find(members.begin(), members.end(), site_index) !=
        members.end()) {
      role.kind = SyncRole::Kind::kMember;
      role.hub = hub;
      return role;
    }
  }
  return role;  // not in any group (rejected by validation)
}

uint64_t MessagesPerClock(const pb::JobConfig& config) {
  // Each exchange is an update and a clock.
  constexpr uint64_t kPerExchange = 2;
  uint64_t messages = 0;
  for (int s : SyncSites(config)) {
    const SyncRole role = RoleOf(config, s);
    messages += kPerExchange * role.Peers().size();
  }
  return messages;
}

}  // namespace meridian
