// The inter-site side of a site server: its mirror socket, the channels to
// its peer sites, and Gaia's approximate synchronous parallel on top of
// them (significance filter, mirror clocks with the DS bound, selective
// barrier, hub relays), plus the DENSE and MODEL_AVERAGING baselines.
//
// Faults (job.fault): every peer has its own accumulator of changes not yet
// sent to it (ParameterStore accumulators, bounded by the model) and a
// channel that delivers each message exactly once across reconnects
// (mirror_delivery.h). A peer silent for peer_timeout_s is unreachable:
// nothing new is created for it (its changes wait in its accumulator), and
// under PARTITION_CONTINUE the DS bound ignores it until it is back and has
// caught up; a site that finds itself more than DS clocks behind the
// reachable peers (after a freeze or a restart) jumps its clock forward
// (ClockFloor).
//
// The engine is a few parts with one job each (the peer table, the mirror
// socket, the outbox and Gaia's sender, SkewScout's travel, the outer
// rounds, the inbox, the saved state): sync_engine.cc lists them.
#ifndef MERIDIAN_SYNC_SYNC_ENGINE_H_
#define MERIDIAN_SYNC_SYNC_ENGINE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "meridian/checkpoint.pb.h"
#include "meridian/core/clock.h"
#include "meridian/job.pb.h"
#include "meridian/ps/param_store.h"
#include "meridian/report.pb.h"
#include "meridian/sync/skew_control.h"
#include "meridian/core/status.h"
#include "durable/checkpoint.h"
#include "report/fault_events.h"

namespace meridian {

struct SyncEngineOptions {
  const pb::JobConfig* job = nullptr;  // validated; outlives the engine
  int site_index = 0;                  // a site that runs a server
  ParameterStore* store = nullptr;     // the site's model; not owned
  zmq::context_t* context = nullptr;   // not owned
  // Endpoint of the mirror socket; empty: the site's mirror_address.
  std::string mirror_bind;
  // With security.curve on: the site's secret key file; empty: as
  // SecretKeyPath (security.h) finds it ($MERIDIAN_SECRET_KEY, key_dir).
  std::string secret_key_file;
  Clock* clock = SystemClock();
  const WallClock* wall_clock = SystemWallClock();  // fault events' time
  // SkewScout (sync.skewscout.enabled): a peer's travelled model to score
  // on this site's held-out sample, off the event loop. Returns false when
  // it cannot take one now (one is being scored): the travel is dropped
  // and counted. The answer comes back through OnTravelScored.
  std::function<bool(const std::string& peer, uint64_t travel_id, int64_t clock,
                     std::vector<float> model)>
      score_travelled;
};

// Driven by the site server's event-loop thread only: not thread-safe.
class SyncEngine {
 public:
  // Binds the mirror socket and adds the store's accumulators. Call before
  // training starts.
  static Result<std::unique_ptr<SyncEngine>> Create(SyncEngineOptions options);
  ~SyncEngine();
  SyncEngine(const SyncEngine&) = delete;
  SyncEngine& operator=(const SyncEngine&) = delete;

  // The endpoint peers connect to (port resolved).
  const std::string& mirror_endpoint() const;
  // Peers that have not introduced themselves (MIRROR_HELLO) yet, each as
  // "name (endpoint this site connects to)".
  std::vector<std::string> silent_peers() const;

  // Overrides where to reach peers' mirror sockets (default: their
  // mirror_address in the job file). Unknown sites are an error.
  Status SetPeerEndpoints(const std::map<std::string, std::string>& endpoints);

  // Connects to every peer and introduces this site. Call when training
  // starts.
  Status Connect();

  // Event-loop integration: appends this engine's sockets (always the same
  // number, in the same order) to `items`, and after zmq::poll handles the
  // readable ones (given the same items, starting at this engine's first).
  void AddPollItems(std::vector<zmq::pollitem_t>* items);
  void HandleReadable(std::span<const zmq::pollitem_t> items);

  // The site's clock advanced to `clock` (called once per clock, in
  // order): runs the filter, sends updates and the clock, and (SkewScout)
  // sends the model to travel every travel_period clocks.
  void OnLocalClock(int64_t clock);

  // SkewScout: the scores of a model `peer` sent (score_travelled) —
  // this site's own model and the travelled one on the same held-out
  // samples — go back to it.
  void OnTravelScored(const std::string& peer, uint64_t travel_id,
                      int64_t clock, const TravelScores& scores);

  // Whether a worker may read `ranges` of the model now (empty: all of
  // it): the DS bound holds, no averaging round is open, and no parameter
  // in the ranges was announced by a peer whose values are still on the
  // way (the selective barrier: reads of other parameters go on).
  bool ReadsAllowed(int64_t local_clock,
                    std::span<const KeyRange> ranges = {}) const;
  // Time accounting of held replies (reported as blocked_s).
  void NoteHeld(double seconds);
  // What holds reads at `local_clock`, for a log line: the DS bound's
  // clock and each peer's clock, liveness and channel positions (e.g.
  // "DS 3, bounding clock 36; b: clock 36, counted, heard 0.1 s ago, in
  // 41 applied, out 44 sent / 40 applied").
  std::string DescribeWait(int64_t local_clock) const;

  // A peer said its job is over (its final flush arrived): the site
  // should finish too.
  bool peer_finished() const;
  const std::string& finished_peer() const;

  // End of the job: sends everything still unsent (losslessly) in the order
  // the topology needs and waits for every peer's final flush, applying
  // what arrives, and for the peers to acknowledge this site's: as long
  // as each peer is reachable and its link delivers (the bound is in
  // final_flush.h: 60 s + the flush's bytes / the link's measured rate,
  // and longer while it still makes progress). `poll`: one turn of the
  // site's event loop, which must poll this engine's sockets
  // (AddPollItems, HandleReadable) and may serve others meanwhile (status
  // requests); empty: the engine polls its own sockets. Returns whether
  // the exchange with every peer is complete (flush_complete()). A site
  // resumed from a checkpoint taken after an incomplete flush calls it
  // again after Connect(): its final flushes go out again from the
  // checkpoint's channels, and its peers' arrive.
  bool Finish(const std::function<Status()>& poll = {});
  // Whether the final exchange with every peer is complete: each peer's
  // final flush arrived and acknowledged ours (also as a checkpoint
  // restored it).
  bool flush_complete() const;
  // While Finish runs: the bytes of this site's final flushes the peers
  // have not acknowledged, and the peers it still waits for.
  struct FlushProgress {
    bool active = false;
    uint64_t bytes_left = 0;
    uint32_t peers_left = 0;
  };
  FlushProgress flush_progress() const;

  double theta() const;
  // SkewScout's knob in effect: θ, the top-k density, or the agreed
  // averaging period (clocks); nullopt without SkewScout.
  std::optional<double> skew_knob() const;
  uint64_t bytes_sent() const;
  int64_t slowest_peer_clock() const;
  // The slowest clock the DS bound counts: under PARTITION_CONTINUE the
  // reachable peers' (this site's own clock when none is), else every
  // peer's. A peer's clock c means its changes up to c are applied here.
  int64_t bounding_clock() const;
  // The accumulators (ParameterStore ids) of the peers the DS bound
  // counts: what each of them has not been sent yet (sync.own_changes
  // AS_SENT lets go of a change as it leaves all of them).
  std::vector<size_t> bounding_accumulators() const;
  pb::SyncSummary Summary() const;

  // The clock this site should be at least at: under PARTITION_CONTINUE,
  // DS below the slowest reachable peer (a site that was frozen, cut off
  // or restarted jumps forward instead of staying outside the bound);
  // otherwise 0. The site server raises its clock to it.
  int64_t ClockFloor() const;
  // Peers declared unreachable right now.
  uint32_t unreachable_peers() const;
  // Faults the engine saw (peers unreachable and back, restarted, resends),
  // in order. For the site's summary.
  const FaultEventLog& events() const;

  // ---- checkpoints (site_checkpoint.h) ----------------------------------
  // Called with every numbered message before it is handed to ZeroMQ (the
  // outgoing-update log); empty: no log. A failed call is logged and the
  // message is sent anyway (the crash guarantee then no longer holds for
  // it, which the log says).
  using OutgoingLog = std::function<Status(const pb::LoggedMessage&)>;
  void SetOutgoingLog(OutgoingLog log);
  // This site writes checkpoints: acknowledge messages as durable only
  // when NoteDurable says so. Call before Connect().
  void EnableCheckpoints();
  // The engine's state for a checkpoint; the accumulators travel as the
  // store's arrays, one per peer (Accumulators()).
  void SaveState(pb::SyncCheckpoint* out) const;
  // (peer site, accumulator id) for every peer that has one.
  std::vector<std::pair<std::string, size_t>> Accumulators() const;
  // Before Connect(), after the store's arrays were restored: continues
  // from a checkpoint's `state`, then from the messages `logged` after it
  // (in order). Those are sent again (a peer drops what it has), and the
  // changes they carried are taken back out of their peer's accumulator:
  // they left this site, while the local changes they came from were lost
  // with the crash, so the peers will receive their reversal, and every
  // replica ends without them. Returns how many updates were taken back.
  // `arrays`: the checkpoint's arrays (DILOCO's outer state is there).
  Result<uint64_t> RestoreState(const pb::SyncCheckpoint& state,
                                std::span<const pb::LoggedMessage> logged,
                                const Checkpoint* arrays = nullptr);
  // The engine's own arrays for a checkpoint (DILOCO: "outer/..."), taken
  // with SaveState.
  void AppendArrays(std::vector<NamedArray>* arrays) const;
  // A checkpoint whose state was `saved` (by SaveState) is durable: tells
  // each peer that it may forget what that checkpoint holds.
  void NoteDurable(const pb::SyncCheckpoint& saved);
  // A peer's messages applied since the last durable checkpoint approach
  // what it keeps for a resend (its retention limit): a checkpoint now
  // lets it go on sending.
  bool CheckpointWanted() const;

  // Per peer site (the cross-site link directions as this site sees
  // them): bytes handed to the channel towards it, bytes (header + payload
  // frames) of the mirror messages received from it once it is known, and
  // its last announced clock. For the metrics endpoint.
  struct PeerCounters {
    std::string site;
    uint64_t bytes_sent = 0;
    uint64_t bytes_received = 0;
    uint64_t messages_received = 0;
    int64_t clock = 0;
    bool connected = false;       // it introduced itself (MIRROR_HELLO)
    bool reachable = true;        // heard within peer_timeout_s
    uint64_t retained_bytes = 0;  // kept for a resend
    uint64_t backlog_bytes = 0;   // sent, not yet acknowledged
  };
  std::vector<PeerCounters> peer_counters() const;

 private:
  class Impl;
  explicit SyncEngine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace meridian

#endif  // MERIDIAN_SYNC_SYNC_ENGINE_H_
