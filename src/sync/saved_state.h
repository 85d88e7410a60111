// The sync engine's part of a site checkpoint (site_checkpoint.h): what
// each part of the engine saves (counters, events, SkewScout, the outer
// rounds, and per peer its channels' positions and retained messages), the
// restart from it and from the outgoing-update log written after it, and
// the durability it tells the peers about.
//
// After a crash the messages logged after the checkpoint are sent again (a
// peer drops what it has), and the changes they carried are taken back out
// of their peer's accumulator: they left this site, while the local
// changes they came from were lost with the crash, so the peers will
// receive their reversal, and every replica ends without them.
//
// Ownership and threads: owned by the SyncEngine; refers to its parts
// (not owned, they outlive it); called on the event loop, between two of
// its turns (not thread-safe). Size: fixed; a checkpoint holds at most
// every channel's retention.
#ifndef MERIDIAN_SYNC_SAVED_STATE_H_
#define MERIDIAN_SYNC_SAVED_STATE_H_

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "durable/checkpoint.h"
#include "meridian/checkpoint.pb.h"
#include "sync/inbox.h"
#include "sync/mirror_socket.h"
#include "sync/outbox.h"
#include "sync/outer_rounds.h"
#include "sync/peer_table.h"
#include "sync/read_gate.h"
#include "sync/skewscout_travel.h"
#include "sync/sync_context.h"

namespace meridian {

// The engine's parts a checkpoint covers (not owned). `outer` is null when
// the sync kind has no outer rounds.
struct SyncParts {
  PeerTable* peers = nullptr;
  MirrorSocket* mirror = nullptr;
  Outbox* outbox = nullptr;
  Inbox* inbox = nullptr;
  ReadGate* gate = nullptr;
  SkewScoutTravel* skew = nullptr;
  OuterRounds* outer = nullptr;
};

class SavedState {
 public:
  SavedState(const SyncContext& context, SyncParts parts)
      : context_(context), parts_(parts) {}
  SavedState(const SavedState&) = delete;
  SavedState& operator=(const SavedState&) = delete;

  // See SyncEngine: SaveState, RestoreState, AppendArrays, Accumulators,
  // NoteDurable, CheckpointWanted.
  void Save(pb::SyncCheckpoint* out) const;
  Result<uint64_t> Restore(const pb::SyncCheckpoint& state,
                           std::span<const pb::LoggedMessage> logged,
                           const Checkpoint* arrays);
  void AppendArrays(std::vector<NamedArray>* arrays) const;
  std::vector<std::pair<std::string, size_t>> Accumulators() const;
  void NoteDurable(const pb::SyncCheckpoint& saved);
  bool CheckpointWanted() const;

 private:
  void SavePeer(const Peer& peer, pb::PeerCheckpoint* saved) const;
  Status RestorePeer(const pb::PeerCheckpoint& saved);
  // The outgoing log's messages after the checkpoint, in order: back into
  // their channels, their clocks and outer gradients into the state, their
  // updates out of the accumulators. Returns how many updates were taken
  // back.
  Result<uint64_t> Replay(std::span<const pb::LoggedMessage> logged);
  // Bytes the site applied from `peer` after its message `sequence` (what
  // a checkpoint holding messages up to `sequence` does not hold). The
  // engine does not keep per-message sizes: it counts everything applied
  // since as after, erring towards an earlier checkpoint.
  static uint64_t BytesAppliedAfter(const Peer& peer, uint64_t sequence);

  const SyncContext& context_;
  const SyncParts parts_;
};

}  // namespace meridian

#endif  // MERIDIAN_SYNC_SAVED_STATE_H_
