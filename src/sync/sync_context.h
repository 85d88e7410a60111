// What every part of one site's sync engine reads and none of them
// changes: the job, this site and its place in the sync topology, the
// store, the ZeroMQ context and the clocks.
//
// Ownership and threads: built once by SyncEngine::Create and owned by the
// engine; its parts keep a const reference and read it on the site
// server's event-loop thread. Size: fixed (the job is referenced, not
// copied).
#ifndef MERIDIAN_SYNC_SYNC_CONTEXT_H_
#define MERIDIAN_SYNC_SYNC_CONTEXT_H_

#include <cstdint>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "meridian/core/clock.h"
#include "meridian/job.pb.h"
#include "meridian/ps/param_store.h"
#include "meridian/sync/sync.h"
#include "meridian/wire.pb.h"
#include "sync/sync_engine.h"

namespace meridian {

struct SyncContext {
  explicit SyncContext(const SyncEngineOptions& options);
  SyncContext(const SyncContext&) = delete;
  SyncContext& operator=(const SyncContext&) = delete;

  double Now() const { return clock->NowSeconds(); }
  double UnixNow() const { return wall_clock->UnixSeconds(); }

  // Whether peers have accumulators of unsent changes (not so when whole
  // models or outer gradients are exchanged: DILOCO, MODEL_AVERAGING).
  bool UsesAccumulators() const;
  bool IsMember(int site) const;
  bool IsHub(int site) const;
  // A hub's member: it gets its share of the group's sum with each clock
  // announcement rather than at a local clock.
  bool IsHubMember(int site) const {
    return role.kind == SyncRole::Kind::kHub && IsMember(site);
  }

  // Sites this one syncs with, by name, in role order; and as a list for
  // messages ("nobody" when none).
  std::vector<std::string> PeerNames() const;
  std::string PeerList() const;
  std::string RoleName() const;

  const pb::JobConfig& job;  // validated; outlives the engine
  const pb::SyncConfig& sync;
  const pb::FaultConfig& fault;
  const int site_index;
  const std::string name;
  ParameterStore* const store;  // the site's model; not owned
  zmq::context_t* const zmq;    // not owned
  Clock* const clock;
  const WallClock* const wall_clock;  // fault events' and updates' time
  const SyncRole role;
  const pb::Endpoint self;
  // This run of the site server (its channels' routing ids and hellos).
  const uint64_t incarnation;
};

}  // namespace meridian

#endif  // MERIDIAN_SYNC_SYNC_CONTEXT_H_
